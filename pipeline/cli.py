"""Shared command-line wrappers: compose the config, run, and turn input errors into one line and exit code 2.

`--dry-run` (or `--print-config`) anywhere on the command line validates the composed config (every key against
its schema, the checkpoints it names exist) and prints it as YAML, without loading a model or reading data."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Callable

from callbacks.preemption import Interrupted
from core.errors import InputError, TrainingStopped
from pipeline.config import compose, parse_args, to_yaml


def main(argv: list[str], job: Callable) -> int:
    """`job(cfg, model_from_cli)` on the config composed from `key=value` args; `model_from_cli`: the command line
    picks the model (`model=` or a `model.` key), so a checkpoint's ranker must match it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # pytorch-lightning 2.6 builds torch's deprecated LeafSpec at every step; the warning names no code of ours and
    # would otherwise head every run's log
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
    warnings.formatwarning = _format_warning
    dry = [a for a in argv if a in DRY_RUN]
    argv = [a for a in argv if a not in DRY_RUN]
    try:
        cfg = compose(argv)
        if dry:
            check_files(cfg)
            print(to_yaml(cfg), end="")
            return 0
        job(cfg, model_from_cli(argv))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"stopped: {e}", file=sys.stderr)
        return e.code
    except TrainingStopped as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 3
    return 0


DRY_RUN = ("--dry-run", "--print-config")
_ROOT = Path(__file__).resolve().parent.parent
_library_format = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """Our own warnings as one line, `warning: ...`, as errors print `error: ...`; the file:line and source line of
    Python's format stay for warnings raised by libraries, where they help to find the cause."""
    try:
        ours = Path(filename).resolve().is_relative_to(_ROOT) and "site-packages" not in Path(filename).parts
    except (OSError, ValueError):
        ours = False
    if ours and issubclass(category, UserWarning):
        return f"warning: {message}\n"
    return _library_format(message, category, filename, lineno, line)


def check_files(cfg) -> None:
    """`--dry-run`: the checkpoints a run would read exist (the config keys are checked by compose); nothing loaded."""
    for key in ("ckpt", "ckpt_path", "head_ckpt"):
        path = Path(cfg[key]) if cfg.get(key) else None
        # ckpt= may also be a folder from `train.py stage=export` (evaluate.py reads its isorank.json)
        exported = key == "ckpt" and path is not None and (path / "isorank.json").is_file()
        if path is not None and not path.is_file() and not exported:
            raise InputError(key, f"checkpoint '{cfg[key]}' does not exist")


def model_from_cli(argv: list[str]) -> bool:
    """Whether the `key=value` args pick the model (`model=...` or a `model.` key)."""
    choices, overrides = parse_args(argv)
    return "model" in choices or any(o.startswith("model.") for o in overrides)

