"""Grids of experiments: `python experiments.py grid=NAME [key=value ...]` runs `configs/grid/NAME.yaml`.

A grid file (see configs/grid/squad_3seeds.yaml; its schema and checks: grid/spec.py):

    name: squad_3seeds            # folder and W&B group (default: the file name)
    baseline: colbert             # the row the table compares against
    rows:                         # one row per method: overrides for train.py
      colbert: [model=colbert]
      repbert: [model=repbert]
      bm25: [model=bm25]          # not trainable (its declared capabilities): evaluate.py on each cell's data
      colbert_backbone: [model=colbert]   # listed in `untrained`: the backbone at step 0, evaluated as it is
      colbert_white: [model=colbert, head=whitening]   # a head row: see "Head rows" below
    train_data: [squad]           # data options to train on; an entry may also be {label: [overrides]}
    eval_data: [squad]            # data options to test on (default: train_data)
    seeds: [1, 2, 3]              # and/or folds: 5 (k-fold cross-validation, data.num_folds / data.fold)
    common: [trainer.max_steps=50]  # overrides for every cell
    measures: [ndcg_cut_10, P_20] # table columns (default: eval.measures); among eval.measures,
                                  # or iw / avgcos (untested)
    test: t_test_one_tailed       # t_test_one_tailed | t_test_two_tailed | wilcoxon | wilcoxon_one_tailed
    paired_by: query              # query (per-query values, mean over runs first) | replicate (per seed/fold means)
    launcher: subprocess          # subprocess (train.py / evaluate.py per cell) | inprocess
    output_root: outputs/grids
    untrained: [colbert_backbone]           # optional: rows evaluated as they are (evaluate.py, no checkpoint)
    train_on: {colbert_ft: [squad]}         # optional: rows that train only on these train_data labels (default: all)
    compare_to: {colbert_ft: colbert}       # optional: the row a row's table cells compare with (default: baseline)
    delta_eval: [original, rotated]         # optional: two eval_data labels; adds the Tables 3-4 block (see tables.py)

Transfer rows: a row override `init_ckpt=@<row>/<train>` starts each of the row's training cells from the best
checkpoint of that row's cell on that training data, same replicate (weights only: `train.py init_ckpt=`); those
cells are planned after it and report "blocked" until it has finished (configs/grid/squad_transfer.yaml).

Cells: one training run per (row, training data, seed or fold), into `<output_root>/<name>/<row>/<train>/<rep>`
(`rep` = seed<s>, fold<f>, or seed<s>-fold<f> with several seeds and folds), with the overrides
`common + data + row + command line`, then `seed=`, `data.num_folds=`/`data.fold=`, `output_dir=`,
`logger.group=<name>`, `logger.run_name=<row>-<train>-<eval>-<rep>`. For every evaluation data other than the
training data, evaluate.py runs on the cell's best checkpoint into `<cell>/eval-<data>` (the evaluation data's own
test split, no folds); evaluation on the training data is the training run's test.

Head rows: a row with `head=<whitening|nice|glow>` puts a post-hoc isotropy head on the ranker of its base row, the
row with the same overrides without `head...` (which must exist; it is run first). Its training cell is
`train.py stage=head ckpt=<the base cell's best checkpoint>`, its evaluation cells `evaluate.py
head_ckpt=<its best head>`, so "Ft" and "Ft -> head" share one fine-tuned model per seed (isotropy paper Tables 1-3).

Resumable: a cell whose `metrics.json` and `per_query.json` exist is skipped (pipeline/run.py writes them atomically
when the run is over; `cell.json` keeps the overrides it started with, and a started cell whose overrides differ from
what the grid plans now, other than logging ones, stops the run instead of being reused), a training cell with a
`checkpoints/last.ckpt` but no results (killed mid-way) resumes from it (exact resume; a run already at max_steps only
repeats its test), any other cell runs from scratch. Delete a cell's folder to recompute it from scratch. Several grid
processes may run one grid at once (one per GPU, say): a process claims each cell with the lock file `.<cell>.grid.lock`
beside it while it runs it, and skips (status busy) the cells another process holds, so no cell runs twice and no
process deletes another's checkpoints. With the subprocess launcher each cell's output goes to `train.log` /
`evaluate.log` in its folder, and a cell ends with its grid process, whatever kills it (SIGTERM from the kernel:
core/signals.py `end_with_parent`), so a rerun finds it stopped and resumes it. Every cell's config is composed and
checked before anything runs. An input error in a cell (exit code 2) stops the grid; another failure is reported,
the other cells go on, and the grid exits 1. A cell with missing pieces (`Cell.fault`: a folder that vanished or is a
file, a last.ckpt whose best checkpoint is gone or that is unreadable, one result file without the other) is reported
in one `warning: grid ...` line and rerun or skipped; a cell whose folder vanishes while it runs is rerun once
(docs/reliability.md, "Faults: grids and resumes ...").

At the end, all cells' `metrics.json` and `per_query.json` go into `<name>/results.json` and `<name>/results.csv`
(long format, per query; qid `all` = the run's mean), and grid/tables.py renders `<name>/table.md` (against another
baseline given on the command line, `baseline=<row>`: `<name>/table-<row>.md`; printed,
and logged as a wandb.Table into a `<name>-table` run of the group when the cells log to W&B).

Command-line `key=value`: grid keys (`seeds=[1,2]`, `test=wilcoxon`, `output_root=...`, `action=...`) override the grid
file; any other key is a pipeline override appended to every cell (`trainer.max_steps=10`). `action=run` (default) runs
and tabulates, `action=table` only collects and tabulates what is finished, `action=list` prints every cell and its
state, `action=export` / `action=import` with `cells_file=F` carry finished cells to and from another machine or sitting
(grid/cells.py). `only=["*/fold0"]` (globs on the cell labels printed by `action=list`) runs just those cells,
e.g. one fold of every row first; the table takes whatever is finished.

`paired_by: query` pairs and averages by query id, so a query id must name the same query in every run: true for
files on disk and for folds; for `synthetic` over several seeds set `data.data_seed` (else each seed draws its own
collection).
"""

from __future__ import annotations

import csv
import functools
import io
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from callbacks.checkpoint import lost_best
from callbacks.loggers import finish_wandb
from callbacks.preemption import Signalled
from core.checkpoints import read_header
from core.errors import InputError
from core.io import WriteFault, atomic_open, check_cache_folders, check_writable, result_set, write_json
from core.precision import warn_emulated_bf16
from core.progress import phase
from core.ranks import exit_status
from core.signals import PARENT_VARIABLE, STOP_SIGNALS
from grid.cells import (
    CELL_FILE,
    NEUTRAL,
    RESULT_FILES,
    UnreadableResult,
    claim_cell,
    export_cells,
    import_cells,
    read_json,
    read_results,
    settings,
)
from grid.record import write_record
from grid.spec import INIT_REF, GridSpec, grid_key, load_grid
from grid.tables import RUN_LEVEL, log_wandb_table, write_table
from pipeline import jobs
from pipeline.cli import model_from_cli
from pipeline.config import compose
from pipeline.run import evaluate as evaluate_run
from pipeline.run import train as train_run
from retrieval.first_stage import model_capabilities

__all__ = ["Cell", "GridReport", "GridSpec", "collect", "load_grid", "main", "plan", "run"]

REPO = Path(__file__).resolve().parents[1]
DONE, PARTIAL, TODO = "done", "partial (resumable)", "todo"


def cell_label(row: str, train: str, replicate: str, ev: str | None = None) -> str:
    """Return a cell's label: `row/train/replicate` for a training cell, `.../eval-<ev>` for an evaluation cell.

    The label action=list prints, `only` globs match and cells files carry.
    """
    base = f"{row}/{train}/{replicate}"
    return base if ev is None else f"{base}/eval-{ev}"


@dataclass(frozen=True)
class Cell:
    """One run of a grid: a training cell (row, training data, replicate) or an evaluation cell on other data.

    `argv` holds the overrides it runs with and `dir` its folder; the properties tell its state from the files there.
    """

    kind: str  # "train" | "eval"
    row: str
    train: str
    eval: str
    replicate: str
    seed: int | None
    fold: int | None
    dir: Path
    argv: tuple[str, ...]
    base_dir: Path | None = None  # head rows: the training cell of the base row (its best checkpoint is `ckpt`)
    # `init_ckpt=@row/train` rows: the training cell whose best checkpoint starts this one
    init_dir: Path | None = None
    listed_untrained: bool = False  # its row is in the grid key `untrained`

    @cached_property
    def untrained(self) -> bool:
        """Whether the cell is evaluated as it is, with no training and no checkpoint.

        A row of the grid key `untrained` (the backbone) or a model with nothing to train (BM25). Composed only when
        asked, once `check` has validated every cell.
        """
        return self.listed_untrained or _untrained(self.argv)

    @property
    def label(self) -> str:
        """The cell's label (`cell_label`), as action=list prints it."""
        return cell_label(self.row, self.train, self.replicate, None if self.kind == "train" else self.eval)

    @property
    def done(self) -> bool:
        """Finished: pipeline/run.py writes metrics.json and per_query.json atomically once the run is over."""
        return (self.dir / "metrics.json").is_file() and (self.dir / "per_query.json").is_file()

    @property
    def train_dir(self) -> Path:
        """The folder of the cell's training cell: its own for a training cell, its parent for an evaluation cell."""
        return self.dir if self.kind == "train" else self.dir.parent

    @property
    def uses(self) -> set[Path]:
        """The training cells whose best checkpoint this cell runs from.

        Its own (an evaluation), its base row's (a head row) or its `init_ckpt=@` row's.
        """
        return {self.train_dir if self.kind == "eval" else None, self.base_dir, self.init_dir} - {None}

    @property
    def last_ckpt(self) -> Path:
        """The cell's `checkpoints/last.ckpt`, from which a partial training cell resumes."""
        return self.dir / "checkpoints" / "last.ckpt"

    @property
    def log_name(self) -> str:
        """The file a subprocess launch writes the cell's output to: `train.log` or `evaluate.log`."""
        return f"{Path(cell_script(self)[0]).stem}.log"

    # The resume decision, for run, table and list alike: a done cell is skipped, a partial one resumes from its
    # last.ckpt, a todo one runs from scratch; a started one (done or partial) with other settings stops the run; a
    # cell with missing or broken pieces (`fault`) is rerun from what is valid, or skipped.
    @property
    def state(self) -> str:
        """The cell's state: done | partial (resumable): a training cell killed after a checkpoint | todo.

        A cell with missing or broken pieces says what and what a run does about it: `partial (best checkpoint
        best-0.ckpt missing; will restart)`, `partial (per_query.json missing beside metrics.json; will rerun)`,
        `unusable ('...' is a file, not a folder; will be skipped)`.
        """
        fault = self.fault()
        if fault is not None:
            what, plan = fault
            if plan.startswith("skip"):
                return f"unusable ({what}; will be skipped)"
            return f"partial ({what}; will {plan})"
        if self.done:
            return DONE
        return PARTIAL if self.kind == "train" and self.last_ckpt.is_file() else TODO

    def fault(self) -> tuple[str, str] | None:
        """Return (what is missing or broken, what a run does) for a cell with missing pieces, else None.

        What a run does: `restart` (from scratch, its checkpoints removed), `resume from last.ckpt`, `rerun` (from
        scratch: there is nothing to resume) or `skip: <why>`.
        A folder (or a folder above it) that is a file is skipped; results that are unreadable or one without the
        other are rerun; a training cell's `last.ckpt` that is unreadable, or whose best checkpoint is gone, restarts
        it (resuming would test another model than an uninterrupted run).
        """
        blocked = self.path_fault()
        if blocked is not None:
            return blocked
        for name in (*RESULT_FILES, CELL_FILE):  # a folder where a run writes a file: it could not, nor remove it
            if (self.dir / name).is_dir():
                return f"'{self.dir / name}' is a folder, not a file", "skip: move it away to run the cell"
        results = [name for name in RESULT_FILES if (self.dir / name).is_file()]
        what = ""
        if len(results) == 1:
            missing = next(n for n in RESULT_FILES if n not in results)
            what = f"{missing} missing beside {results[0]}"
        elif results:
            what = _unreadable(self.dir)
            if not what:
                return None  # done
        # a finished cell it runs from whose best checkpoint is lost or unreadable: skipped, as a run says
        named = {self.base_dir: f"its base cell {self.base_dir}", self.init_dir: f"the cell {self.init_dir},"}
        for used in sorted(self.uses):
            if (used / "metrics.json").is_file():
                ckpt, why = _finished_checkpoint(used, named.get(used, "its training cell"))
                if ckpt is None and "; skipped: " in why:
                    lost, plan = why.split("; skipped: ", 1)
                    return lost, f"skip: {plan}"
        # a dangling link counts as a last.ckpt (an unreadable one): the cell is not silently `todo`
        present = self.last_ckpt.is_file() or self.last_ckpt.is_symlink()
        if self.kind != "train" or not present or self.untrained:  # runs from scratch anyway
            return (what, "rerun") if what else None
        header, reason = _header(self.last_ckpt)
        if header is None:
            return "; ".join(filter(None, [what, f"last.ckpt unreadable ({reason})"])), "restart"
        lost = lost_best(header)
        if lost is not None:
            best = Path(lost["path"]).name
            return "; ".join(filter(None, [what, f"best checkpoint {best} missing"])), "restart"
        return (what, "resume from last.ckpt") if what else None

    def path_fault(self) -> tuple[str, str] | None:
        """Return `fault`'s (what, skip) when a file stands where the cell's folder, or a folder above it, should be.

        Nothing can be made under it, the cell's claim lock included: a run skips the cell before claiming it.
        """
        for p in [self.dir, *self.dir.parents][: self.label.count("/") + 2]:  # the cell's folders and the grid's
            if p.exists() and not p.is_dir():
                return f"'{p}' is a file, not a folder", "skip: move it away to run the cell"
        return None

    def other_settings(self) -> str | None:
        """Return what differs when a started cell's overrides in cell.json are not the planned ones, else None.

        Logging overrides (NEUTRAL) are set aside. Cells from before `cell.json` existed are not checked (the grid-level
        warning of _record_spec covers them).
        """
        path = self.dir / CELL_FILE
        if self.state == TODO or not path.is_file():
            return None
        try:
            before = settings(read_json(path)["argv"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return _config_differs(self, f"{CELL_FILE} is unreadable ({type(e).__name__})")
        now = settings(self.argv)
        if before == now:
            return None
        gone = [a for a in before if a not in now]
        new = [a for a in now if a not in before]
        if not gone and not new:
            return "the same overrides in another order (a later one wins)"
        return "; ".join(filter(None, [f"ran with {gone}" if gone else "", f"now {new}" if new else ""]))


@dataclass
class GridReport:
    """What a grid run did: each cell's status, where the results went and the rendered table."""

    spec: GridSpec
    status: dict[str, str] = field(
        default_factory=dict
    )  # cell label -> ran | resumed | skipped | busy | failed | blocked
    results_path: Path | None = None
    table: str = ""

    @property
    def failed(self) -> list[str]:
        """The cells that did not finish: those that failed and those blocked on an unfinished cell (exit code 1)."""
        return [k for k, v in self.status.items() if v in ("failed", "blocked")]

    def having(self, status: str) -> list[str]:
        """Return the labels of the cells with this status."""
        return [k for k, v in self.status.items() if v == status]


# ------------------------------------------------------------------------------------------------ cells


def _is_head_override(ov: str) -> bool:
    key, value = ov.split("=", 1)
    return key.startswith("head.") or (key == "head" and value != "none")


def head_bases(spec: GridSpec) -> dict[str, str]:
    """Head row -> its base row (same overrides without head...); InputError naming the row when there is none."""
    bases = {}
    for row, ov in spec.rows.items():
        if not any(_is_head_override(o) for o in ov):
            continue
        if not any(o.split("=", 1)[0] == "head" for o in ov):
            raise InputError(
                grid_key(spec.source, f"rows.{row}"), "sets head.* keys without head=<whitening|nice|glow>"
            )
        rest = [o for o in ov if not _is_head_override(o) and not o.startswith("head=")]
        base = [
            r for r, o in spec.rows.items() if r != row and o == rest and r not in spec.untrained
        ]  # fine-tuned rows
        if not base:
            raise InputError(
                grid_key(spec.source, f"rows.{row}"),
                f"has a head but no row with its other overrides {rest} to fine-tune first; add one",
            )
        bases[row] = base[0]
    return bases


def plan(spec: GridSpec, extra: list[str] = ()) -> list[Cell]:
    """Return every cell of the grid, in the order they run.

    Replicates outermost (a grid stopped early has every method on the first seeds); within a replicate, head rows
    after the rows they build on.
    """
    cells = []
    bases = head_bases(spec)
    refs = spec.init_references()
    rows = [r for r in spec.rows if r not in bases] + [r for r in spec.rows if r in bases]
    for rep, seed, fold in spec.replicates():
        start = len(cells)
        for train, data_ov in spec.train_data.items():
            for row in rows:
                if not spec.trains_on(row, train):
                    continue
                row_ov = spec.rows[row]
                init_dir = spec.dir / refs[row][0] / refs[row][1] / rep if row in refs else None
                if row in bases:
                    row_ov = [*row_ov, "stage=head"]
                base_dir = spec.dir / bases[row] / train / rep if row in bases else None
                cell_dir = spec.dir / row / train / rep
                grid_set = ([f"seed={seed}"] if seed is not None else []) + [f"logger.group={spec.name}"]
                argv = [*spec.common, *data_ov, *row_ov, *extra, *grid_set]
                if fold is not None:
                    argv += [f"data.num_folds={spec.folds}", f"data.fold={fold}"]
                untrained = row in spec.untrained
                cells.append(
                    Cell(
                        "train",
                        row,
                        train,
                        train,
                        rep,
                        seed,
                        fold,
                        cell_dir,
                        tuple(argv + [f"logger.run_name={row}-{train}-{train}-{rep}", f"output_dir={cell_dir}"]),
                        base_dir,
                        init_dir,
                        untrained,
                    )
                )
                for ev, eval_ov in spec.eval_data.items():
                    if spec.own_test(train, ev):
                        continue
                    ev_dir = cell_dir / f"eval-{ev}"
                    ev_ov = [o for o in row_ov if o != "stage=head" and not o.startswith("init_ckpt=")]
                    ev_argv = [
                        *spec.common,
                        *eval_ov,
                        *ev_ov,
                        *extra,
                        *grid_set,
                        f"logger.run_name={row}-{train}-{ev}-{rep}",
                        f"output_dir={ev_dir}",
                    ]
                    cells.append(
                        Cell(
                            "eval",
                            row,
                            train,
                            ev,
                            rep,
                            seed,
                            fold,
                            ev_dir,
                            tuple(ev_argv),
                            base_dir,
                            listed_untrained=untrained,
                        )
                    )
        cells[start:] = _after_references(cells[start:])
    return cells


def own_test_labels(spec: GridSpec) -> list[str]:
    """Return the labels of the evaluation cells that `spec.own_test` replaces by the training cell's own test.

    Those are the labels evaluation cells would have where `spec.own_test` reads the test from the training cell
    instead (an eval_data label other than the training one): cells files exported before it did still hold them.
    """
    return [
        cell_label(row, train, rep, ev)
        for rep, _, _ in spec.replicates()
        for train in spec.train_data
        for row in spec.rows
        if spec.trains_on(row, train)
        for ev in spec.eval_data
        if ev != train and spec.own_test(train, ev)
    ]


def _after_references(cells: list[Cell]) -> list[Cell]:
    """Return the cells of one replicate in their order, a cell initialised from another's checkpoint after it.

    A cell initialised from another cell's checkpoint (and its evaluation cells) moves after that cell.
    """
    done: set[Path] = set()
    out: list[Cell] = []
    waiting = list(cells)
    while waiting:
        left = []
        for c in waiting:
            if (c.init_dir is None or c.init_dir in done) and (c.kind == "train" or c.train_dir in done):
                out.append(c)
                if c.kind == "train":
                    done.add(c.dir)
            else:
                left.append(c)
        if len(left) == len(waiting):  # a cycle of references: keep their order (those cells report "blocked")
            out += left
            break
        waiting = left
    return out


def _config_key(cell: Cell) -> tuple:
    """Return what a cell's composed config depends on besides its folder and seed (`check` composes each once)."""
    return (cell.kind, cell.row, cell.train, cell.eval, cell.fold is not None)


def check(
    spec: GridSpec, cells: list[Cell]
) -> tuple[DictConfig, set[tuple[str, str]], dict[tuple, tuple[DictConfig, str]]]:
    """Compose every distinct cell config and check the table's measures.

    Return the first cell's config, the (trainer.precision, trainer.accelerator) pairs of all of them and each
    distinct config with the job its script runs (by `_config_key`), for the checks a run makes on this machine
    (`check_cell_folders`). A misspelt key or option stops here, before anything runs.
    """
    first = None
    precisions: set[tuple[str, str]] = set()
    composed: dict[tuple, tuple[DictConfig, str]] = {}
    seen = set()
    for cell in cells:
        key = _config_key(cell)
        if key in seen:
            continue
        seen.add(key)
        try:
            # the job the cell's script will run, with the checkpoint keys run_cell adds: a key that job does not take
            # stops the grid here, not when the cell starts; of the overrides, the cell gets those its job reads
            argv, cfg, job = _planned(cell)
            jobs.check(cfg, job, argv)
        except InputError as e:
            raise InputError(f"grid {spec.name}, cell {cell.label}", str(e)) from e
        composed[key] = (cfg, job)
        if first is None:
            first = cfg
        precisions.add((str(cfg.trainer.precision), str(cfg.trainer.accelerator)))
        if not spec.measures:
            spec.measures = list(cfg.eval.measures)
        missing = [m for m in spec.measures if m not in cfg.eval.measures and m not in RUN_LEVEL]
        if missing:
            raise InputError(
                grid_key(spec.source, "measures"),
                f"{missing} not among eval.measures {list(cfg.eval.measures)} of cell {cell.label}; "
                "add them to eval.measures in common",
            )
    return first, precisions, composed


def check_cell_folders(spec: GridSpec, cells: list[Cell], composed: dict[tuple, tuple[DictConfig, str]]) -> None:
    """Probe what each cell that will run writes and needs of this machine, before the grid writes anything.

    Those are its output_dir and its data.cache_dir (core.io.check_writable, check_cache_folders), which the cell's job
    probes first thing, and `pipeline.jobs.check_machine` (a missing local backbone, fp16 without CUDA); a refusal
    is that job's line under the cell's label, so its "nothing was loaded or written" holds for the grid too. Cells
    that will not run (done, not selected, or skipped for a file where their folder should be) are left out.
    """
    probed: set[str] = set()
    for cell in cells:
        fault = cell.fault()
        if not spec.selected(cell) or (fault is None and cell.done) or (fault and fault[1].startswith("skip")):
            continue
        where = f"grid {spec.name}, cell {cell.label}"
        cfg, job = composed[_config_key(cell)]
        cache = str(cfg.data.cache_dir) if cfg.get("data") is not None and cfg.data.get("cache_dir") else None
        try:
            jobs.check_machine(cfg, job)  # its backbone, its precision on this machine: before any cell runs
        except InputError as e:
            raise InputError(where, str(e)) from e
        try:
            key = "output_dir"
            check_writable(cell.dir, key)
            if cache and cache not in probed:
                key = "data.cache_dir"
                check_writable(cache, key)
                check_cache_folders(cache, key)
                probed.add(cache)
        except WriteFault as e:  # the same fault, named under the cell (exit code as the job's)
            raise WriteFault(e.path, e.reason, e.kept, code=e.code, errno_=e.errno, key=f"{where}: {key}") from e


def _warn_emulated_bf16(precisions: set[tuple[str, str]]) -> None:
    """Say at the grid's start what each bf16 cell's log would say: on this CPU bf16 is emulated (core/precision.py).

    A cell runs on CUDA when its accelerator allows it and this machine has a GPU, else on the CPU.
    """
    for precision, accelerator in sorted(precisions):
        device = "cuda" if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available() else "cpu"
        if precision.startswith("bf16") and warn_emulated_bf16("trainer.precision", precision, device, "32-true"):
            return  # once per grid


def best_checkpoint(train_dir: Path) -> Path | None:
    """best-*.ckpt (by validation NDCG@10), else a whitening head's head.ckpt, else last.ckpt."""
    ck = train_dir / "checkpoints"
    best = sorted(ck.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)
    if best:
        return best[-1]
    for name in ("head.ckpt", "last.ckpt"):
        if (ck / name).is_file():
            return ck / name
    return None


def _stop_if_other_settings(spec: GridSpec, cells: list[Cell]) -> None:
    """Stop the run when started cells have other settings than planned: a grid never mixes them in one table.

    Started cells whose overrides differ from the plan (the grid file or the command line changed) stop the run
    with what differs.
    """
    stale = [(c, d) for c in cells if spec.selected(c) and (d := c.other_settings())]
    if stale:
        c, d = stale[0]
        raise InputError(
            f"grid {spec.name}",
            f"{len(stale)} started cell(s) have other settings than planned now, e.g. {c.label} ({d}); "
            f"delete those cells' folders under {spec.dir} to recompute them, or run with another output_root",
        )


def _launch(script: str, argv: list[str], launcher: str, log_path: Path, label: str = "") -> tuple[int, str]:
    """Run train.py / evaluate.py with `argv`; (exit code, the error line or the log's tail).

    `label`: the cell's, for the progress lines of a subprocess cell (its own output goes to its log).
    """
    if launcher == "inprocess":  # what pipeline/cli.py does, keeping the error message
        rc, err = 0, ""
        try:
            cfg = compose(argv)
            if script == "train.py":
                train_run(cfg)
            else:
                evaluate_run(cfg, model_from_cli(argv))
        except InputError as e:
            rc, err = 2, str(e)
        except WriteFault as e:  # a write the machine refused: its one line, as pipeline/cli.py prints it
            rc, err = e.code, str(e)
        except Exception as e:  # noqa: BLE001 - a failed cell must not stop the other cells
            if (log_path.parent / CELL_FILE).is_file():  # not when its folder vanished: the grid says so in one line
                traceback.print_exc()
            rc, err = 1, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            finish_wandb()
        return rc, err
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # PARENT_VARIABLE: the cell ends (SIGTERM: its last.ckpt, its line) when this process dies, even by SIGKILL
    env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_VARIABLE: str(os.getpid())}
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {sys.executable} {script} {' '.join(argv)}\n")
        log.flush()
        # its own session: a Ctrl-C in the terminal reaches the grid only, which hands it on once (_stop_cell)
        proc = subprocess.Popen(
            [sys.executable, str(REPO / script), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            # a line every ~30 s in a log while the cell runs (core/progress.py); the grid says how it ended
            with phase(f"cell {label or log_path.parent.name}", key="grid cell", done_line=False):
                rc = proc.wait()
        except Signalled as e:
            _stop_cell(proc, e.signum, log)
            raise
    if rc == 0:
        return 0, ""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # removed while the cell ran (its folder, or the log alone)
        return rc, f"exit code {rc}; its log {log_path.name} vanished while it ran, {LOG_LOST}"
    errors = [ln for ln in text.splitlines() if ln.startswith(("error:", "stopped:"))]
    if errors:
        return rc, errors[-1]
    if rc < 0:  # killed by a signal (the OOM killer's SIGKILL): the cell could say nothing; say what is left
        kept = (log_path.parent / "checkpoints" / "last.ckpt").is_file()
        return rc, f"{exit_status(rc)} (its log: {log_path}); " + (
            "its last.ckpt is kept: a rerun of the grid resumes the cell" if kept else "a rerun of the grid reruns it"
        )
    return rc, "\n".join(text.splitlines()[-25:])


CELL_STOP_GRACE_S = 600.0  # how long a signalled cell may take to save and stop before it is killed


def _stop_cell(proc: subprocess.Popen, signum: int, log) -> None:
    """Hand the grid's SIGINT / SIGTERM / SIGHUP on to its running cell and wait until the cell has stopped.

    The cell stops as it would alone: a training cell after its current batch, with a resumable `last.ckpt`; an
    evaluation cell with its earlier results untouched. A second signal, or `CELL_STOP_GRACE_S` without an end,
    kills it (SIGKILL), and the cell is then resumed from its last checkpoint.
    """
    log.write(f"\n[grid] {signal.Signals(signum).name}: handed on to the cell\n")
    log.flush()
    proc.send_signal(signum)
    old = {s: signal.signal(s, lambda *_: proc.kill()) for s in STOP_SIGNALS}
    try:
        proc.wait(timeout=CELL_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _untrained(argv: list[str]) -> bool:
    return not model_capabilities(compose([a for a in argv if not a.startswith(INIT_REF)]).model.name).trainable


LOST_BEST = "the best checkpoint"  # starts the message of a cell blocked on a finished cell's lost best checkpoint
LOG_LOST = "so what it printed is lost"  # ends the message of a failed subprocess cell whose log vanished
_HOW = {"restart": " from scratch", "resume from last.ckpt": " from its last.ckpt"}


def _finished_checkpoint(train_dir: Path, what: str) -> tuple[Path | None, str]:
    """Return (the best checkpoint of the finished training cell `train_dir`, ""), else (None, why `what` blocks).

    A finished cell whose tested best checkpoint is gone (its metrics.json names the step, only last.ckpt is left)
    blocks, with a message starting with `LOST_BEST`: its last.ckpt is another model than the one it tested.
    """
    if not (train_dir / "metrics.json").is_file():
        return None, f"{what} did not finish"
    ckpt = best_checkpoint(train_dir)
    if ckpt is None or ckpt.name == "last.ckpt":
        try:
            step = read_json(train_dir / "metrics.json").get("best_step")
        except (OSError, ValueError, AttributeError):
            step = None
        if isinstance(step, int):
            return None, (
                f"{LOST_BEST} best-{step}.ckpt of {what.rstrip(',')} is missing; skipped: "
                f"delete '{train_dir}' to train it again (or restore the file)"
            )
    if ckpt is None:
        return None, f"no checkpoint in {train_dir / 'checkpoints'}"
    header, reason = _header(ckpt)  # a truncated best checkpoint is as lost as a missing one: one cell skipped
    if header is None:
        return None, (
            f"{LOST_BEST} {ckpt.name} of {what.rstrip(',')} is unreadable ({reason}); skipped: "
            f"delete '{train_dir}' to train it again (or restore the file)"
        )
    return ckpt, ""


def _header(ckpt: Path) -> tuple[dict | None, str]:
    """Return (the checkpoint's header, ""), or (None, why it is unreadable: the reason in brackets, else all).

    Read once per version of the file: every evaluation cell of a training cell asks for its best checkpoint, and a
    cell's state is asked several times per grid command. A file replaced or rewritten since (inode, size, mtime)
    is read again.
    """
    if ckpt.is_symlink() and not ckpt.exists():
        return None, f"a symbolic link to '{os.readlink(ckpt)}', which does not exist"
    try:
        st = ckpt.stat()
    except OSError:
        return _read_header(ckpt, None)
    return _read_header(ckpt, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=1024)
def _read_header(ckpt: Path, version: tuple | None) -> tuple[dict | None, str]:
    """`_header`'s read of `ckpt` as it is at `version` (its stat; None: not memoised in effect, it cannot be read)."""
    try:
        return read_header(str(ckpt), ckpt.name), ""
    except InputError as e:
        msg = str(e).removeprefix(f"{ckpt.name}: ")
        return None, (msg.split("' (", 1)[1].rsplit(")", 1)[0] if "' (" in msg else msg)


def _unreadable(cell_dir: Path) -> str:
    """Say which result file of a finished cell is unreadable, else "".

    metrics.json is parsed; per_query.json (large) only has to end as a JSON object does (a torn write does not).
    """
    try:
        metrics = read_json(cell_dir / "metrics.json")
    except (OSError, ValueError) as e:
        return f"metrics.json unreadable ({type(e).__name__})"
    if not isinstance(metrics, dict):
        return f"metrics.json unreadable (not a JSON object but a {type(metrics).__name__})"
    try:
        with open(cell_dir / "per_query.json", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64))
            tail = f.read().rstrip()
    except OSError as e:
        return f"per_query.json unreadable ({type(e).__name__})"
    return "" if tail.endswith(b"}") else "per_query.json unreadable (cut short)"


# Keys a grid sets when it launches a cell, not in its planned overrides: the checkpoint it resumes from, starts from
# (an init_ckpt=@row/train reference resolved) or evaluates.
_LAUNCH_KEYS = ("output_dir", "ckpt", "ckpt_path", "head_ckpt", "init_ckpt")


def _planned(cell: Cell) -> tuple[list[str], DictConfig, str]:
    """Return the overrides a cell is launched with as planned, their config and the job its script runs for them.

    The checkpoints run_cell adds stand as `PLANNED`; an init_ckpt=@row/train reference is composed quoted (`@` cannot
    start a YAML value); of the overrides, those the job reads (`pipeline.jobs.applied`).
    """
    argv = [f"init_ckpt='{a[len('init_ckpt=') :]}'" if a.startswith(INIT_REF) else a for a in cell.argv]
    script, given = cell_script(cell)  # (whether a row is untrained composes its config too)
    argv = [*argv, *(f"{k}={PLANNED}" for k in given)]
    cfg = compose(argv)
    job = jobs.select(cfg, script)
    kept = jobs.applied(argv, job, cfg)
    return kept, (cfg if kept == argv else compose(kept)), job


def _leaves(node: dict, prefix: str = "") -> dict:
    """Flatten a nested dict to {dotted key: value} (an empty dict is a leaf)."""
    out = {}
    for k, v in node.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_differs(cell: Cell, why: str) -> str | None:
    """Check a cell whose cell.json is unreadable against the config.yaml its run wrote; what differs, else None.

    A run writes its whole resolved config at its start, so the plan composed now must equal it but for the keys the
    grid sets at launch, the NEUTRAL ones and those the cell's job does not read (`pipeline.jobs.unread`: the grid
    does not pass them). Without a readable config.yaml the cell's settings are unknown: it counts as other settings
    (a grid never mixes them in one table) and the user is told to delete it or restore the file.
    """
    try:
        saved = OmegaConf.to_container(OmegaConf.load(cell.dir / "config.yaml"))
    except Exception as e:  # noqa: BLE001 - any reason makes the settings unknown; the line names it
        reason = "missing" if isinstance(e, FileNotFoundError) else f"unreadable ({type(e).__name__})"
        return f"{why} and its config.yaml is {reason}: its settings are unknown"
    _, planned_cfg, job = _planned(cell)
    unread = jobs.reader(job, planned_cfg)
    planned = _leaves(OmegaConf.to_container(planned_cfg))
    saved = _leaves(saved) if isinstance(saved, dict) else {}
    differ = sorted(
        k
        for k in planned.keys() | saved.keys()
        if not k.startswith(NEUTRAL)
        and k not in _LAUNCH_KEYS
        and unread(k) is None
        and planned.get(k, "<unset>") != saved.get(k, "<unset>")
    )
    if not differ:
        return None
    shown = ", ".join(
        f"{k}: ran with {saved.get(k, '<unset>')!r}, now {planned.get(k, '<unset>')!r}" for k in differ[:3]
    )
    return f"{why}; its config.yaml differs from the plan ({shown}{', ...' if len(differ) > 3 else ''})"


def _settings_note(cell: Cell) -> str:
    """` (cell.json unreadable; its config.yaml has the planned settings)` for such a cell, else ""."""
    path = cell.dir / CELL_FILE
    if cell.state == TODO or not path.is_file():
        return ""
    try:
        read_json(path)["argv"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        if _config_differs(cell, "") is None:
            return f" ({CELL_FILE} unreadable ({type(e).__name__}); its config.yaml has the planned settings)"
    return ""


def _rewrite_cell_records(spec: GridSpec, cells: list[Cell], say) -> None:
    """Write cell.json anew for started cells whose cell.json is unreadable but whose config.yaml matches the plan."""
    for c in cells:
        if spec.selected(c) and (note := _settings_note(c)):
            write_json(c.dir / CELL_FILE, {"argv": list(c.argv), "launcher": spec.launcher})
            say(
                f"warning: grid {spec.name}: cell '{c.label}': {note.strip(' ()')}; "
                f"wrote its {CELL_FILE} again from the plan (its recorded wall time is lost)"
            )


def _log_note(cell: Cell) -> str:
    """` (its log train.log is missing)` for a cell started by the subprocess launcher whose log is gone, else ""."""
    try:
        launcher = read_json(cell.dir / CELL_FILE).get("launcher")
    except (OSError, ValueError, AttributeError):
        return ""
    return (
        f" (its log {cell.log_name} is missing)"
        if launcher == "subprocess" and not (cell.dir / cell.log_name).exists()
        else ""
    )


def _clear_remade(cell: Cell, since: float) -> None:
    """Clear what the run that lost its folder (`_vanished`) left there, so that the cell runs from scratch.

    A folder the run made again holds only files written since `since` (the attempt's start): it is removed. Anything
    older (only cell.json was removed, say) stays; only the results are removed, so that the cell is not taken as done.
    """
    if not cell.dir.is_dir():
        return
    try:
        remade = all(p.stat().st_mtime >= since - 2 for p in cell.dir.rglob("*"))
    except OSError:
        remade = False
    if remade:
        shutil.rmtree(cell.dir, ignore_errors=True)
        return
    for name in RESULT_FILES:
        (cell.dir / name).unlink(missing_ok=True)


def _vanished(cell: Cell) -> str | None:
    """Say how a cell's folder went away while it ran (its cell.json, written at its start, is gone), else None."""
    if (cell.dir / CELL_FILE).is_file():
        return None
    if cell.dir.exists() and not cell.dir.is_dir():
        return "its folder was replaced by a file"
    return "its folder vanished"


PLANNED = "planned.ckpt"  # stands for a checkpoint run_cell will pass once the cell it comes from has finished


def cell_script(cell: Cell) -> tuple[str, tuple[str, ...]]:
    """Return the entry script that runs `cell` and the checkpoint keys `run_cell` adds to its arguments."""
    if cell.untrained:  # a BM25 or backbone row: evaluated on each cell's data as it is, no training, no checkpoint
        return "evaluate.py", ()
    if cell.kind == "train":
        return "train.py", ("ckpt",) if cell.base_dir is not None else ()
    return "evaluate.py", ("head_ckpt" if cell.base_dir is not None else "ckpt",)


def run_cell(cell: Cell, spec: GridSpec, on_start=lambda: None) -> tuple[str, str]:
    """Run one unfinished cell; return (status, message).

    Status: ran | resumed | failed | input-error | blocked. `on_start()` is called when it really starts (not for a
    blocked cell).
    """
    argv = list(cell.argv)
    status = "ran"
    script, _ = cell_script(cell)  # an untrained row (BM25, the backbone) takes its argv as it is
    if script == "train.py":
        if cell.base_dir is not None:  # a head on the base row's fine-tuned ranker
            ckpt, why = _finished_checkpoint(cell.base_dir, f"its base cell {cell.base_dir}")
            if ckpt is None:
                return "blocked", why
            argv.append(f"ckpt={ckpt}")
        elif cell.init_dir is not None:  # init_ckpt=@row/train: that cell's best checkpoint
            ckpt, why = _finished_checkpoint(cell.init_dir, f"the cell it is initialised from, {cell.init_dir},")
            if ckpt is None:
                return "blocked", why
            argv = [f"init_ckpt={ckpt}" if a.startswith(INIT_REF) else a for a in argv]
        if cell.state == PARTIAL:
            argv.append(f"ckpt_path={cell.last_ckpt}")
            status = "resumed"
        else:
            for stale in (cell.dir / "checkpoints").glob("*.ckpt"):  # a dead run's best without last: start afresh
                stale.unlink()
    elif not cell.untrained:
        ckpt, why = _finished_checkpoint(cell.train_dir, "its training cell")
        if ckpt is None:
            return "blocked", why
        argv.append(f"{'head_ckpt' if cell.base_dir is not None else 'ckpt'}={ckpt}")
    cfg = compose(argv)
    argv = jobs.applied(argv, jobs.select(cfg, script), cfg)  # the overrides the cell's job reads
    on_start()
    cell.dir.mkdir(parents=True, exist_ok=True)
    write_json(cell.dir / CELL_FILE, {"argv": list(cell.argv), "launcher": spec.launcher})
    rc, err = _launch(script, argv, spec.launcher, cell.dir / f"{Path(script).stem}.log", cell.label)
    if rc == 2:
        return "input-error", err
    if rc != 0 or not cell.done:
        return "failed", err or f"exit code {rc} and no metrics.json"
    return status, ""


def exportable(cells: list[Cell]) -> list[Cell]:
    """Return the finished cells that can travel (action=export).

    No checkpoint travels, so a training cell goes only once every cell that needs its checkpoint (its evaluations, head
    rows on it, rows initialised from it) has finished, and the cells that need it go only with it: imported alone,
    either would leave the other unable to run.
    """
    needs: dict[Path, list[Cell]] = {}  # a training cell's folder -> the cells that use its checkpoint
    for c in cells:
        for d in c.uses:
            needs.setdefault(d, []).append(c)
    held = {c.dir for c in cells if c.kind == "train" and not c.done}
    changed = True
    while changed:  # a held training cell holds what uses it; a training cell with an unfinished user is held
        changed = False
        for c in cells:
            if c.dir in held:
                continue
            if c.uses & held or (c.kind == "train" and any(not u.done or u.dir in held for u in needs.get(c.dir, []))):
                held.add(c.dir)
                changed = True
    return [c for c in cells if c.done and c.dir not in held]


# ------------------------------------------------------------------------------------------------ results


def _cell_wall(cell: Cell) -> float | None:
    try:
        return read_json(cell.dir / CELL_FILE).get("wall_s")
    except (OSError, ValueError, AttributeError):
        return None


def collect(spec: GridSpec, cells: list[Cell], say) -> dict:
    """results.json contents: one entry per (row, train, eval, replicate), eval in eval_data.

    A finished cell whose results cannot be read, or a cell with broken pieces (`Cell.fault`: a result without its
    pair, a folder in a result's place), is entered as missing, with one `say` line naming the file and how to rerun
    that cell (a run does it by itself, or skips it until the folder is moved away).
    """
    by_key = {(c.kind, c.row, c.train, c.eval, c.replicate): c for c in cells}
    entries = []
    unreadable: set[str] = set()
    rerun = (
        "action=run (the same command without action=table) reruns that cell"
        if spec.action == "table"
        else "run the same command again to rerun that cell"
    )
    for rep, seed, fold in spec.replicates():
        for train in spec.train_data:
            for row in spec.rows:
                if not spec.trains_on(row, train):
                    continue
                for ev in spec.eval_data:
                    cell = (
                        by_key[("train", row, train, train, rep)]
                        if spec.own_test(train, ev)
                        else by_key[("eval", row, train, ev, rep)]
                    )
                    entry = {
                        "row": row,
                        "train": train,
                        "eval": ev,
                        "replicate": rep,
                        "seed": seed,
                        "fold": fold,
                        "dir": str(cell.dir),
                        "status": "missing",
                        "metrics": {},
                        "per_query": {},
                    }
                    # a cell with broken pieces, more than one not run: a run says it as it visits the cell
                    fault = None if cell.done or spec.action != "table" else cell.fault()
                    if fault is not None and fault[0] and cell.label not in unreadable:
                        unreadable.add(cell.label)
                        todo = "move it away, then " if fault[1].startswith("skip") else ""
                        say(f"warning: grid {spec.name}: cell '{cell.label}': {fault[0]}; not tabulated: {todo}{rerun}")
                    if cell.done:
                        try:
                            files = read_results(cell.dir, ["metrics.json", "per_query.json"])
                        except UnreadableResult as e:  # not finished, as a missing cell: the others are tabulated
                            if cell.label not in unreadable:
                                unreadable.add(cell.label)
                                say(f"warning: grid {spec.name}: cell '{cell.label}': {e}; not tabulated: {rerun}")
                            entries.append(entry)
                            continue
                        metrics, per_query = files["metrics.json"], files["per_query.json"]
                        entry["wall_s"] = _cell_wall(cell)
                        entry["before_training"] = metrics.pop("before_training", None)
                        entry["before_head"] = metrics.pop("before_head", None)  # head rows: the same model without it
                        entry.update(status="done", metrics=metrics, per_query=per_query)
                    entries.append(entry)
    return {
        "grid": spec.name,
        "source": spec.source,
        "baseline": spec.baseline,
        "test": spec.test,
        "paired_by": spec.paired_by,
        "measures": spec.measures,
        "rows": list(spec.rows),
        "train_data": list(spec.train_data),
        "eval_data": list(spec.eval_data),
        "replicates": [r for r, _, _ in spec.replicates()],
        "seeds": spec.seeds,
        "folds": spec.folds,
        "spec": spec.to_dict(),
        "cells": entries,
        "train_on": spec.train_on,
        "compare_to": spec.compare_to,
        "delta_eval": spec.delta_eval,
        "delta_base": spec.delta_base,
        "paper": spec.paper,
        "paper_note": spec.paper_note,
        "deviations": spec.deviations,
    }


def write_results(results: dict, out_dir: Path, table_path: Path) -> tuple[Path, str]:
    """Write results.json, results.csv and the Markdown table into `out_dir` as one set; (results.json, the table).

    All three are staged and renamed in together (core/io.result_set, results.json last): a refused write or an
    interrupt leaves the earlier three as they were. Other processes of the same grid may publish at once.
    """
    with result_set(out_dir, last="results.json", shared=True) as tmp:
        _write_results(results, tmp)
        text = write_table(results, tmp / table_path.name)
    return out_dir / "results.json", text


def _write_results(results: dict, out_dir: Path) -> None:
    write_json(out_dir / "results.json", results)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["grid", "row", "train", "eval", "replicate", "seed", "fold", "qid", "measure", "value"])
    for c in results["cells"]:
        if c["status"] != "done":
            continue
        head = [results["grid"], c["row"], c["train"], c["eval"], c["replicate"], c["seed"], c["fold"]]
        for m, v in c["metrics"].items():
            if isinstance(v, (int, float)):
                w.writerow([*head, "all", m, repr(float(v))])
        for qid in sorted(c["per_query"]):
            for m, v in c["per_query"][qid].items():
                w.writerow([*head, qid, m, repr(float(v))])
    with atomic_open(out_dir / "results.csv") as f:
        f.write(buf.getvalue())


def _wandb_table(spec: GridSpec, cfg: DictConfig | None, results: dict) -> None:
    """Log the table into a `<name>-table` run of the grid's W&B group, when the cells log to W&B."""
    if cfg is None or cfg.logger.name != "wandb" or os.environ.get("WANDB_MODE") == "disabled":
        return
    try:
        import wandb  # optional and slow to import: only when the cells log to W&B

        lc = cfg.logger
        mode = lc.mode
        if mode == "auto":
            netrc = Path.home() / ".netrc"
            keyed = bool(os.environ.get("WANDB_API_KEY")) or (
                netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")
            )
            mode = os.environ.get("WANDB_MODE") or ("online" if keyed else "offline")
        spec.dir.mkdir(parents=True, exist_ok=True)
        wandb.init(
            project=lc.project,
            entity=lc.entity,
            group=spec.name,
            name=f"{spec.name}-table",
            job_type="grid-table",
            mode=mode,
            dir=str(spec.dir),
            config=spec.to_dict(),
            settings=wandb.Settings(quiet=True),  # as the cells' runs (callbacks/loggers.py)
        )
        try:
            log_wandb_table(results)
        finally:
            wandb.finish()
    except Exception as e:  # noqa: BLE001 - logging must not lose the results
        print(f"warning: could not log the table to W&B ({type(e).__name__}: {e})", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ entry


CELL_KEYS = ("rows", "train_data", "eval_data", "seeds", "folds", "common", "extra_overrides", "train_on")


def _cell_setting(grid: dict, key: str):
    # logging overrides (NEUTRAL) leave finished cells valid, so adding or dropping one is no change to warn about
    value = grid.get(key)
    return settings(value) if key in ("common", "extra_overrides") and isinstance(value, list) else value


def _record_spec(spec: GridSpec, extra: list[str], cells: list[Cell], say) -> None:
    """Write `<grid>/grid.yaml`; warn when finished cells came from other cell settings (rows, data, seeds, ...)."""
    spec.dir.mkdir(parents=True, exist_ok=True)
    path = spec.dir / "grid.yaml"
    now = {**spec.to_dict(), "extra_overrides": list(extra)}
    if path.is_file() and any(c.done for c in cells):
        try:
            old = OmegaConf.to_container(OmegaConf.load(path))
        except Exception:  # noqa: BLE001 - only for a warning
            old = {}
        changed = [k for k in CELL_KEYS if _cell_setting(old, k) != _cell_setting(now, k)]
        if changed:
            say(f"warning: {', '.join(changed)} differ from {path}; finished cells are reused as they are")
    with atomic_open(path) as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(now)))


def _add_wall_time(cell: Cell, seconds: float) -> None:
    """Add a run's wall time to its cell.json (`wall_s`; a resumed cell sums its runs) for the record."""
    path = cell.dir / CELL_FILE
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return
    data["wall_s"] = float(data.get("wall_s", 0.0)) + seconds
    write_json(path, data)


def _write_record(spec: GridSpec, argv: list[str], results: dict, table: str, cells: list[Cell]) -> Path:
    """Write the grid's record, results/<date>-<grid>.md, and return its path.

    The table with the command, commit, machine and the summed wall time of every finished cell of the tabulated
    replicates (training cells too: with eval_data labels of their own, as in the position-bias grid, the table's
    entries are evaluation cells only).
    """
    reps = set(results["replicates"])
    done = [c for c in cells if c.done and c.replicate in reps]
    timed = [w for c in done if (w := _cell_wall(c)) is not None]
    note = f" (sum over {len(timed)} cell runs" + (
        f"; {len(done) - len(timed)} finished cells have no recorded time)" if len(timed) < len(done) else ")"
    )
    body = table.replace(f"## {spec.name}\n", "", 1)
    return write_record(
        spec.name.replace("_", "-"),
        f"Grid `{spec.name}`",
        "python experiments.py " + " ".join(argv),
        body,
        wall_s=sum(timed) if timed else None,
        note=note if timed else "",
    )


def _fmt(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def run(argv: list[str], out=None) -> GridReport:
    """Run (or list / tabulate) a grid; raises InputError on bad input or when a cell stops on one."""
    out = out or sys.stdout
    say = lambda msg: print(msg, file=out, flush=True)  # noqa: E731
    spec, extra = load_grid(argv)
    cells = plan(spec, extra)
    if spec.only and not any(spec.selected(c) for c in cells):  # selects nothing: an error, not a table of [0/n runs]
        labels = [c.label for c in cells]
        raise InputError(
            grid_key(spec.source, "only"),
            f"{spec.only} matches none of the {len(labels)} cells of grid {spec.name}: "
            f"{labels[:6]}{' ...' if len(labels) > 6 else ''} (action=list prints them all)",
        )
    cfg, precisions, composed = check(spec, cells)
    report = GridReport(spec)
    n_train = sum(c.kind == "train" for c in cells)
    say(f"grid {spec.name}: {n_train} training cells, {len(cells) - n_train} evaluation cells -> {spec.dir}")
    if spec.action == "export":
        chosen = [c for c in cells if spec.selected(c)]
        ready = exportable(chosen)
        n = export_cells(spec.name, ready, Path(spec.cells_file))
        held = sum(c.done for c in chosen) - len(ready)
        say(
            f"exported {n} finished cells to {spec.cells_file}"
            + (
                f"; {held} finished cells held back: "
                "they belong to a training cell whose checkpoint other cells still need"
                if held
                else ""
            )
        )
        return report
    if spec.action == "import":
        imported, kept, left_out = import_cells(spec.name, cells, Path(spec.cells_file), own_test_labels(spec))
        report.status.update(
            {label: "imported" for label in imported} | {label: "skipped" for label in kept + left_out}
        )
        say(
            f"imported {len(imported)} cells from {spec.cells_file}"
            + (f"; {len(kept)} already finished here (or running) were kept" if kept else "")
            + (
                f"; {len(left_out)} left out: tests their training cell already ran (e.g. {left_out[0]})"
                if left_out
                else ""
            )
        )
        return report
    if spec.action == "list":
        for c in cells:
            other = c.other_settings()
            report.status[c.label] = (
                c.state + (f" (other settings: {other})" if other else _settings_note(c)) + _log_note(c)
            )
            say(f"  {c.label}: {report.status[c.label]}")
        return report
    if spec.action in ("run", "table", "import"):  # each writes under spec.dir: probed before any cell or table
        check_writable(spec.dir, grid_key(spec.source, "output_root"))
    if spec.action == "run":
        check_cell_folders(spec, cells, composed)  # the cells' own first checks, before grid.yaml or any cell.json
        _stop_if_other_settings(spec, cells)
        _rewrite_cell_records(spec, cells, say)
        _record_spec(spec, extra, cells, say)
        _warn_emulated_bf16(precisions)
        said: set[tuple[str, str]] = set()  # a cell's skip or wait, printed once however many looks wait_s takes
        while True:
            ran, others = _run_pass(spec, cells, report, say, said, first_only=spec.wait_s is not None)
            if spec.wait_s is None or not (ran or others):
                break  # one pass; or nothing ran and no other process holds a cell that could unblock one
            if not ran:
                time.sleep(spec.wait_s)
    for c in cells:  # finished here or before, gone by now (its folder, or the whole output root, removed)
        if report.status.get(c.label) in ("ran", "resumed", "skipped") and not c.done:
            report.status[c.label] = "failed"
            gone = "its results" if c.dir.is_dir() else "its folder"
            say(
                f"warning: grid {spec.name}: cell '{c.label}': {gone} vanished after its run; skipped: "
                "run the same command again to rerun it"
            )
    stale = [c.label for c in cells if c.done and c.other_settings()]
    if stale:
        say(
            f"warning: {len(stale)} finished cell(s) ran with other settings than the grid plans now, "
            f"e.g. {stale[0]} (action=list marks them)"
        )
    results = collect(spec, cells, say)
    report.results_path, report.table = write_results(results, spec.dir, spec.table_path)
    say("")
    say(report.table)
    say(f"results: {spec.dir / 'results.json'}, {spec.dir / 'results.csv'}, table: {spec.table_path}")
    missing = [c for c in results["cells"] if c["status"] != "done"]
    if missing:
        say(f"{len(missing)} of {len(results['cells'])} result cells are not finished")
    _wandb_table(spec, cfg, results)
    if spec.record:
        say(f"record: {_write_record(spec, argv, results, report.table, cells)}")
    if failed := report.having("failed"):
        say(f"failed: {', '.join(failed)}")
    if blocked := report.having("blocked"):  # not failures of their own: a cell they need is unfinished
        say(f"blocked (a cell they need is not finished): {', '.join(blocked)}")
    return report


def _run_pass(
    spec: GridSpec, cells: list[Cell], report: GridReport, say, said: set[tuple[str, str]], first_only: bool
) -> tuple[bool, bool]:
    """Look once over the unfinished cells in plan order, running each that can run.

    `first_only`: just the first, so that the next look starts again from the top and the processes on one grid
    finish the first seeds first. Returns (a cell ran, another process holds a cell this one has not finished).
    """

    def once(cell: Cell, status: str, msg: str) -> None:
        if (cell.label, status) not in said:
            said.add((cell.label, status))
            say(msg)

    others = False
    for i, cell in enumerate(cells, 1):
        if not spec.selected(cell) or report.status.get(cell.label) in ("ran", "resumed", "failed", "skipped"):
            continue
        tag = f"[{i}/{len(cells)}] {cell.kind} {cell.label}"
        blocked = cell.path_fault()  # its claim's lock file would go under that file: skipped before claiming it
        if blocked is not None:
            report.status[cell.label] = "failed"
            once(
                cell,
                "fault",
                f"warning: grid {spec.name}: cell '{cell.label}': {blocked[0]}; skipped: "
                f"{blocked[1].split(': ', 1)[1]}",
            )
            continue
        with claim_cell(cell.dir) as mine:
            if not mine:
                others = True
                report.status[cell.label] = "busy"
                once(cell, "busy", f"{tag}: skipped (another grid process is running it)")
                continue
            fault = cell.fault()
            if fault is None and cell.done:  # checked under the claim: another grid process may have just finished it
                report.status[cell.label] = "skipped"
                once(cell, "skipped", f"{tag}: skipped (metrics.json exists)")
                continue
            warn = f"warning: grid {spec.name}: cell '{cell.label}': "
            if fault is not None:
                what, todo = fault
                if todo.startswith("skip"):
                    report.status[cell.label] = "failed"
                    once(cell, "fault", f"{warn}{what}; skipped: {todo.split(': ', 1)[1]}")
                    continue
                for name in RESULT_FILES:  # a lone or unreadable result: the run writes both again
                    (cell.dir / name).unlink(missing_ok=True)
            fixed = [f"{warn}{fault[0]}; rerunning it{_HOW.get(fault[1], '')}"] if fault is not None else []
            t0 = time.monotonic()

            def start(tag=tag, fixed=fixed) -> None:  # said when it really starts (a blocked cell does not)
                while fixed:
                    say(fixed.pop())
                say(f"{tag}: running")

            for attempt in (1, 2):  # a cell whose folder vanishes while it runs runs once more, from scratch
                since = time.time()
                status, msg = run_cell(cell, spec, on_start=start)
                if status == "blocked" or (gone := _vanished(cell)) is None:
                    break
                status, msg = "failed", f"{gone} while it ran"
                fault = cell.fault()
                if fault is not None and fault[1].startswith("skip"):
                    say(f"{warn}{gone} while it ran: {fault[0]}; skipped: {fault[1].split(': ', 1)[1]}")
                    break
                _clear_remade(cell, since)
                if attempt == 2:
                    say(
                        f"{warn}{gone} again while it reran; skipped: run the same command again once nothing "
                        "removes it"
                    )
                    break
                say(f"{warn}{gone} while it ran; rerunning it from scratch")
            if status == "input-error":
                report.status[cell.label] = "failed"
                raise InputError(f"grid {spec.name}, cell {cell.label}", msg.removeprefix("error: "))
            report.status[cell.label] = status
            if status == "blocked":
                if msg.startswith(LOST_BEST):
                    report.status[cell.label] = "failed"
                    once(cell, "blocked", f"{warn}{msg}")
                else:
                    once(cell, "blocked", f"{tag}: blocked ({msg})")
                continue
            wall = time.monotonic() - t0
            _add_wall_time(cell, wall)
            log = cell.dir / cell.log_name
            if (spec.launcher == "subprocess" and status != "failed") or msg.endswith(LOG_LOST):
                if not log.is_file() and (cell.dir / CELL_FILE).is_file():
                    if status == "failed":
                        say(
                            f"{warn}its log {log.name} vanished while it ran, so its error is lost; skipped: "
                            "run the same command again to rerun it"
                        )
                    else:
                        say(f"{warn}its log {log.name} vanished while it ran; its results are complete and kept")
        say(f"{tag}: {status} in {_fmt(wall)}" + (f" ({msg})" if msg else ""))
        if first_only:
            return True, others
    return False, others


def main(argv: list[str]) -> int:
    """Run a grid from the command line (`experiments.py`) and return the exit code.

    2 on bad input (one `error: ...` line), 130 on Ctrl-C (finished cells are kept), 1 when a cell failed or was
    blocked, else 0.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        report = run(argv)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished cells are kept: run the same command again to resume", file=sys.stderr)
        return 130
    return 1 if report.failed else 0
