"""Shared command-line wrapper: compose the config, run, and turn input errors into one line and exit code 2."""
from __future__ import annotations

import os
import sys
from typing import Callable

from pipeline.errors import InputError


def main(argv: list[str], job: Callable) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from pipeline.config import compose, parse_args

    try:
        cfg = compose(argv)
        choices, overrides = parse_args(argv)
        model_from_cli = "model" in choices or any(o.startswith("model.") for o in overrides)
        job(cfg, model_from_cli)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
