"""Shared command-line wrappers: compose the config, run, and turn every way a job can stop into one line.

Each way a job can stop becomes one line on stderr and an exit code: bad input 2 (`error: ...`), a write the machine
refused 1 (`error: cannot write ...`; 2 when the probe at the start finds a path the user cannot use), SIGINT 130
and SIGTERM 143 (`stopped: interrupted by ...`), a training-policy stop 3, another rank's death 1 (`stopped: rank 0
died (...); <what was kept>`, core/ranks.py). No traceback for any of them.

`--dry-run` (or `--print-config`) anywhere on the command line validates the composed config (every key against
its schema; for train.py and evaluate.py, that its keys fit the job the job table selects, pipeline/jobs.py; the
checkpoints it names exist) and prints it as YAML, without loading a model or reading data.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from callbacks.loggers import finish_wandb
from callbacks.preemption import (
    EXIT_CODES,
    Interrupted,
    Signalled,
    raise_on_signals,
    received_signal,
    restore_signals,
)
from core.errors import InputError, TrainingStopped
from core.io import PUBLISHED, WriteFault, as_write_fault, path_in_traceback
from core.lock import global_rank_zero
from core.ranks import RankDied, as_rank_death, stop_watching
from pipeline.config import compose, parse_args, to_yaml
from pipeline.jobs import Script, check_files
from pipeline.quiet import quiet_libraries


def main(argv: list[str], job: Callable) -> int:
    """Run `job(cfg, model_from_cli)` on the config composed from `key=value` args and return the exit code.

    `model_from_cli`: the command line picks the model (`model=` or a `model.` key), so a checkpoint's ranker must
    match it. `job` is an entry script's `pipeline.jobs.Script` (train.py's `TRAIN`, evaluate.py's `EVALUATE`) or any
    such callable; a Script also checks, under `--dry-run` too, that the config fits the job it selects and that
    `argv` sets no key that job does not read.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    quiet_libraries()  # the libraries' messages a user cannot act on (pipeline/quiet.py)
    format_warnings()
    dry = [a for a in argv if a in DRY_RUN]
    argv = [a for a in argv if a not in DRY_RUN]
    handlers, cfg = {}, None
    try:
        handlers = raise_on_signals()  # in place of the entry script's early handlers (core/signals.py)
        cfg = compose(argv)
        if dry:
            # the keys fit the job (pipeline/jobs.py), before any checkpoint header is read
            name = job.check(cfg, argv) if isinstance(job, Script) else None
            check_files(cfg, model_from_cli(argv), name)
            print(to_yaml(cfg), end="")
            return 0
        job(cfg, model_from_cli(argv), argv) if isinstance(job, Script) else job(cfg, model_from_cli(argv))
        finish_wandb()  # quietly, now, rather than with wandb's footer at exit (callbacks/loggers.py)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        if global_rank_zero():  # DDP ranks stop together (callbacks/preemption.py) with the same line: rank 0 says it
            print(f"stopped: {e}", file=sys.stderr)
        return e.code
    except (Signalled, KeyboardInterrupt) as e:
        return _interrupted(getattr(e, "signum", signal.SIGINT), cfg)
    except RankDied as e:  # another rank's death (core/ranks.py); training names its checkpoint (interruptible)
        if (signum := received_signal()) is not None:
            return _interrupted(signum, cfg)
        dead = as_rank_death(e)
        kept = dead if dead.kept else dead.keeping(_what_is_kept(cfg))
        print(f"stopped: {kept}", file=sys.stderr)
        return e.code
    except TrainingStopped as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 3
    except WriteFault as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except (OSError, RuntimeError) as e:
        dead = as_rank_death(e)  # a collective that failed because another rank died
        if dead is not None and (signum := received_signal()) is not None:
            return _interrupted(signum, cfg)
        if dead is not None:
            print(f"stopped: {dead.keeping(_what_is_kept(cfg))}", file=sys.stderr)
            return dead.code
        line = fault_line(e, cfg)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1
    finally:
        # a watchdog of ranks still running (the job stopped on its own error) raises nothing now; the ranks this
        # process started end before the command returns (stopped with it, or seeing it gone)
        stop_watching(wait_s=RANKS_END_S)
        restore_signals(handlers)
    return 0


RANKS_END_S = 10.0  # how long a stopped job waits for the ranks it started to end


def _interrupted(signum: int, cfg) -> int:
    """Say how SIGINT / SIGTERM stopped this job (rank 0 only: under DDP the signal reaches every rank, one line)."""
    if global_rank_zero():
        print(f"stopped: {interrupt_line(signum, cfg)}", file=sys.stderr)
    return EXIT_CODES[signum]


def _output_dir(cfg) -> Path | None:
    return Path(cfg.output_dir) if cfg is not None and cfg.get("output_dir") else None


def _results_state(cfg) -> str:
    out = _output_dir(cfg)
    if out is None:
        return "nothing was written"
    if out.resolve() in PUBLISHED:
        return f"its results in '{out}' are complete"
    if (out / "metrics.json").is_file() or _analysis_results(out):
        return f"earlier results in '{out}' unchanged"
    return f"no result was written to '{out}'"


def _what_is_kept(cfg) -> str:
    """Return `_results_state` and, for the checkpoints in output_dir, `; checkpoints/head.ckpt is kept`.

    For a job stopped without a training loop to name its checkpoints: a rank's death in the head stage's test after
    the closed-form head was saved.
    """
    out = _output_dir(cfg)
    kept = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt")) if out is not None else []
    if not kept:
        return _results_state(cfg)
    names = ", ".join(f"checkpoints/{k}" for k in kept)
    return f"{_results_state(cfg)}; {names} {'is' if len(kept) == 1 else 'are'} kept (delete '{out}' to start again)"


def _analysis_results(out: Path) -> bool:
    """Tell whether `out` holds an analysis's finished JSON (analyses/outputs.py writes it last), e.g. whitebox.json."""
    try:
        return any(
            p.suffix == ".json" and not p.name.startswith(".") and p.name != "validation.json" for p in out.iterdir()
        )
    except OSError:
        return False


def interrupt_line(signum: int, cfg) -> str:
    """Return the one line of a job stopped by SIGINT / SIGTERM outside a training loop."""
    return f"interrupted by {signal.Signals(signum).name}; {_results_state(cfg)}"


def fault_line(e: BaseException, cfg) -> str | None:
    """Return one line for an OSError that no writer turned into a WriteFault, else None.

    An OSError (or torch.save's report of one); None for any other error, which keeps its traceback.
    """
    fault = as_write_fault(e, getattr(e, "filename", None) or path_in_traceback(e) or "?", _results_state(cfg))
    if fault is None:
        return None
    if fault.path == "?":
        return f"{fault.reason} ({type(e).__name__}); {fault.kept}"
    return str(fault)


DRY_RUN = ("--dry-run", "--print-config")
_ROOT = Path(__file__).resolve().parent.parent
_library_format = warnings.formatwarning


def format_warnings() -> None:
    """Print warnings as this project's entry scripts do: ours as `warning: ...`, a library's with its file:line."""
    warnings.formatwarning = _format_warning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """Format our own warnings as one line, `warning: ...`, as errors print `error: ...`.

    The file:line and source line of Python's format stay for warnings raised by libraries, where they help to find
    the cause.
    """
    try:
        ours = Path(filename).resolve().is_relative_to(_ROOT) and "site-packages" not in Path(filename).parts
    except (OSError, ValueError):
        ours = False
    if ours and issubclass(category, UserWarning):
        return f"warning: {message}\n"
    return _library_format(message, category, filename, lineno, line)


def model_from_cli(argv: list[str]) -> bool:
    """Whether the `key=value` args pick the model (`model=...` or a `model.` key)."""
    choices, overrides = parse_args(argv)
    return "model" in choices or any(o.startswith("model.") for o in overrides)
