"""A grid cell's files, and finished cells that travel as results.

A cell folder holds `cell.json` (the overrides it started with, its wall time), and once its run is over
`metrics.json` and `per_query.json` (run.py writes them atomically): a cell with both is finished.

`action=export cells_file=F` writes every finished cell of a grid to one gzip'd JSON file F: its label, overrides,
wall time, metrics.json, per_query.json and validation.json (no checkpoints, no logs). `action=import cells_file=F`
writes them back into this grid's folders, where they count as finished and the table reads them as if they had run
here. So a grid too long for one machine or one sitting can run a seed (or a fold, or a row) at a time on several,
`only=` or `seeds=` choosing the share, and be tabulated where all shares meet. No checkpoint travels: the grid
exports a training cell only together with every cell that needs its checkpoint (grid/engine.py `exportable`).

Import is strict where a silent mix would change the numbers: the file must be of this grid, and an imported cell
must be one the grid plans with the same overrides (logging ones aside, as for a resumed cell); otherwise the
import stops before writing anything. A cell already finished here is kept as it is (reported, not overwritten).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from core.errors import InputError
from core.io import atomic_open, write_json
from core.lock import claim
from pipeline.config import REPORTING_KEYS

__all__ = [
    "CELL_FILE",
    "NEUTRAL",
    "RESULT_FILES",
    "settings",
    "portable",
    "read_json",
    "claim_cell",
    "export_cells",
    "import_cells",
]

CELL_FILE = "cell.json"  # the overrides a cell was started with
# Overrides that change where and how a run reports, not its numbers: a finished cell stays valid across them.
NEUTRAL = REPORTING_KEYS
RESULT_FILES = ("metrics.json", "per_query.json")  # a cell is finished when both exist
OPTIONAL_FILES = ("validation.json",)
FORMAT = 1


class CellLike(Protocol):
    label: str
    dir: Path
    argv: tuple[str, ...]
    done: bool


def settings(argv: Iterable[str]) -> list[str]:
    """Return the overrides that decide a cell's numbers (NEUTRAL ones dropped), in order."""
    return [a for a in argv if not a.split("=", 1)[0].startswith(NEUTRAL)]


def portable(argv: Iterable[str]) -> list[str]:
    """Return `settings` without the cell's own folder (`output_dir`), which names where it ran, not what."""
    return [a for a in settings(argv) if not a.startswith("output_dir=")]


def read_json(path: Path) -> Any:
    """Return the parsed content of the UTF-8 JSON file `path` (a cell's cell.json or result files)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class UnreadableResult(Exception):
    """A cell's result file (or its cell.json) that exists but cannot be read or parsed: `path` and why."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"'{path}' is unreadable ({reason})")


def read_results(cell_dir: Path, names: Iterable[str]) -> dict[str, Any]:
    """Return {name: parsed content} of the files `names` in a cell's folder; one that fails is an UnreadableResult.

    The error names the file, not the folder: a training cell's folder also holds its checkpoints, which a rerun keeps.
    """
    out = {}
    for name in names:
        try:
            out[name] = read_json(cell_dir / name)
        except (OSError, ValueError) as e:
            raise UnreadableResult(cell_dir / name, str(e) or type(e).__name__) from e
        if not isinstance(out[name], dict):  # valid JSON of another shape (`[]`): no run writes it
            raise UnreadableResult(cell_dir / name, f"not a JSON object but a {type(out[name]).__name__}")
    return out


def claim_cell(cell_dir: Path):
    """Claim a cell for this grid process while it runs or writes it (core.lock.claim).

    The lock file is `.<cell>.grid.lock` beside the cell's folder; the context yields True when this process got it.
    """
    return claim(cell_dir.parent / f".{cell_dir.name}.grid.lock")


def export_cells(grid: str, cells: list[CellLike], path: Path) -> int:
    """Write the finished cells of `cells` to `path` (gzip'd JSON); the number written."""
    entries = []
    for c in cells:
        if not c.done:
            continue
        try:
            info = read_results(c.dir, [CELL_FILE])[CELL_FILE] if (c.dir / CELL_FILE).is_file() else {}
            files = read_results(c.dir, [n for n in RESULT_FILES + OPTIONAL_FILES if (c.dir / n).is_file()])
        except UnreadableResult as e:  # the grid's run rewrites it (a result: the cell reruns; cell.json: rewritten)
            raise InputError(
                f"cell {c.label}", f"{e}; run the grid (action=run) to rerun that cell, then export again"
            ) from e
        entries.append(
            {"label": c.label, "argv": list(info.get("argv", c.argv)), "wall_s": info.get("wall_s"), "files": files}
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        # mtime=0: the same cells give the same bytes
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
            gz.write(json.dumps({"format": FORMAT, "grid": grid, "cells": entries}, sort_keys=True).encode("utf-8"))
    return len(entries)


def _load(path: Path) -> dict:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise InputError("cells_file", f"'{path}' does not exist") from None
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"cells_file '{path}'", f"is not a gzip'd JSON file of grid cells ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("cells"), list):
        raise InputError(f"cells_file '{path}'", f"is not an export of grid cells (format {FORMAT})")
    return doc


def import_cells(
    grid: str, cells: list[CellLike], path: Path, own_tests: Iterable[str] = ()
) -> tuple[list[str], list[str], list[str]]:
    """Write the cells exported to `path` into this grid's cell folders.

    Returns (imported labels, labels already finished here and kept, labels left out). Left out: evaluation cells in
    `own_tests`, which the grid reads from their training cell now (files exported before it did). InputError, before
    anything is written, when the file is of another grid or holds any other cell this grid does not plan or plans with
    other overrides.
    """
    path = Path(path)
    doc = _load(path)
    if doc.get("grid") != grid:
        raise InputError(f"cells_file '{path}'", f"holds cells of grid '{doc.get('grid')}', not of '{grid}'")
    planned = {c.label: c for c in cells}
    own_tests = set(own_tests)
    todo, left_out = [], []
    for entry in doc["cells"]:
        label = entry.get("label")
        if label in own_tests and label not in planned:
            left_out.append(label)
            continue
        cell = planned.get(label)
        if cell is None:
            raise InputError(
                f"cells_file '{path}'",
                f"cell '{label}' is not planned by this grid (its rows, data, seeds or folds differ)",
            )
        ran, now = portable(entry.get("argv", [])), portable(cell.argv)
        if ran != now:
            diff = [a for a in ran if a not in now] or ran
            raise InputError(
                f"cells_file '{path}'", f"cell '{label}' ran with other overrides than this grid plans: {diff}"
            )
        if any(name not in entry.get("files", {}) for name in RESULT_FILES):
            raise InputError(f"cells_file '{path}'", f"cell '{label}' lacks {' or '.join(RESULT_FILES)}")
        todo.append((cell, entry))
    imported, kept = [], []
    for cell, entry in todo:
        with claim_cell(cell.dir) as mine:  # not under a running grid process
            if not mine or cell.done:
                kept.append(cell.label)
                continue
            cell.dir.mkdir(parents=True, exist_ok=True)
            # cell.json with the overrides as planned here (its own output_dir), so a resumed grid sees no other
            # settings
            write_json(
                cell.dir / CELL_FILE,
                {"argv": list(cell.argv), "wall_s": entry.get("wall_s"), "imported_from": str(path)},
            )
            for name in OPTIONAL_FILES + RESULT_FILES:  # the result files last: the cell is finished once both exist
                if name in entry["files"]:
                    write_json(cell.dir / name, entry["files"][name])
            imported.append(cell.label)
    return imported, kept, left_out
