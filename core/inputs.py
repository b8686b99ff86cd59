"""Input paths a config schema declares, so that every job checks them before anything loads.

A schema field that names a file to read is declared with `input_path(kind, what)` (dataclass field metadata):

    run: str | None = input_path("file", "a TREC run")                  # analyses/random_rerank.py
    embeddings: str = input_path("file", "...", "backbone", keywords=("backbone",))   # models/rankers/tk.py
    compare: dict[str, str] = input_path("checkpoints", "...", factory=dict)   # {label: checkpoint}

`pipeline.jobs.check_files` walks the composed config's groups for these fields and checks each set one the same
way, at `--dry-run` too, before the output folder is taken or any data or weights load: a checkpoint by its header
(core/checkpoints.read_header: missing, a folder, empty, truncated, foreign), a file by `check_input_file`. So a path
key is never found bad only after the data loaded, and its message is the same whichever job reads it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from core.errors import InputError

INPUT = "input"  # the dataclass field metadata key
KINDS = ("file", "checkpoint", "checkpoints")  # checkpoints: a {label: path} mapping of checkpoints


def input_path(kind: str, what: str, default: Any = None, factory: Any = None, keywords: tuple = ()) -> Any:
    """Return a dataclass field that names an input of `kind` (`KINDS`), described as `what` in errors.

    `keywords`: values of the field that are not paths (TK's `embeddings: backbone`), never checked as files.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")  # a schema author's mistake
    meta = {INPUT: (kind, what, tuple(keywords))}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def declared_inputs(schema: type) -> list[tuple[str, str, str, tuple]]:
    """Return (field name, kind, what, keywords) of every input path `schema` (a dataclass) declares."""
    if not dataclasses.is_dataclass(schema):
        return []
    return [(f.name, *f.metadata[INPUT]) for f in dataclasses.fields(schema) if INPUT in f.metadata]


def check_input_file(path: str | os.PathLike, key: str, what: str) -> Path:
    """Return `path` when it is a readable file; else InputError at `key` saying what it is instead.

    A folder is named as a folder: "does not exist" of a folder that exists sends the user looking for another fault.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(key, f"'{path}' is a folder, not a file; expected {what}")
    if not p.is_file():
        raise InputError(key, f"'{path}' does not exist (resolved to {p.absolute()}); expected {what}")
    try:
        with open(p, "rb"):
            pass
    except OSError as e:
        raise InputError(key, f"cannot read '{path}' ({e.strerror}); expected {what}") from None
    return p
