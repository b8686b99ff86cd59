"""Shared command-line wrappers: compose the config, run, and turn input errors into one line and exit code 2.

`--dry-run` (or `--print-config`) anywhere on the command line validates the composed config (every key against
its schema, the checkpoints it names exist) and prints it as YAML, without loading a model or reading data."""
from __future__ import annotations

import os
import sys
import warnings
from typing import Callable

from core.errors import InputError, TrainingStopped


def main(argv: list[str], job: Callable) -> int:
    """`job(cfg, model_from_cli)` on the config composed from `key=value` args; `model_from_cli`: the command line
    picks the model (`model=` or a `model.` key), so a checkpoint's ranker must match it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # pytorch-lightning 2.6 builds torch's deprecated LeafSpec at every step; the warning names no code of ours and
    # would otherwise head every run's log
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
    from callbacks.preemption import Interrupted
    from pipeline.config import compose, to_yaml

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


def check_files(cfg) -> None:
    """`--dry-run`: the checkpoints a run would read exist (the config keys are checked by compose); nothing loaded."""
    from pathlib import Path

    for key in ("ckpt", "ckpt_path", "head_ckpt"):
        if cfg.get(key) and not Path(cfg[key]).is_file():
            raise InputError(key, f"checkpoint '{cfg[key]}' does not exist")


def model_from_cli(argv: list[str]) -> bool:
    """Whether the `key=value` args pick the model (`model=...` or a `model.` key)."""
    from pipeline.config import parse_args

    choices, overrides = parse_args(argv)
    return "model" in choices or any(o.startswith("model.") for o in overrides)


def tool_args(ap, argv: list[str]):
    """(argparse options, `key=value` config args) of a `python -m` tool; an unknown `--option` is an argparse error
    (exit 2), not a config key."""
    opts, rest = ap.parse_known_args(argv)
    bad = [a for a in rest if a.startswith("-")]
    if bad:
        ap.error(f"unrecognised option {bad[0]}")
    return opts, rest


def run_tool(ap, argv: list[str], job: Callable) -> int:
    """A `python -m` tool with `--options` (argparse `ap`) and config overrides: `job(cfg, opts)` under `main`."""
    opts, rest = tool_args(ap, argv)
    return main(rest, lambda cfg, _model_from_cli: job(cfg, opts))
