"""The grid file of `python experiments.py grid=NAME [key=value ...]` as one typed schema, `GridSpec`.

The grid file (configs/grid/NAME.yaml, run by grid/engine.py) as one typed schema, `GridSpec`: its fields are the
grid keys. `load_grid` merges the file and the command line's grid keys onto it as an OmegaConf structured config
(pipeline.config's `merge_structured`, as for the run configs), so a key it does not know or a value of the wrong type
stops the load; `GridSpec.__post_init__` checks choices, ranges and the references between keys. Every action (run,
table, list) loads through here, and every message names the grid file and the key path:
`grid file configs/grid/x.yaml, key rows.colbert: ...`.

Keys with a shorthand are typed `Any` and normalised by `__post_init__`: rows / train_data / eval_data are a mapping
{label: overrides} or a list of labels and one-key mappings; overrides are a list or one space-separated string;
seeds, measures and only take one value for a list of one. A null (or empty) key means its default.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import InputError
from datamodules.config import TRAINING_ONLY
from metrics.significance import TESTS, UNPAIRED
from pipeline.config import CONFIG_DIR, check_control_characters, load_yaml, merge_structured, translate_error

__all__ = ["GRID_DIR", "GRID_KEYS", "INIT_REF", "GridSpec", "grid_key", "load_grid"]

GRID_DIR = CONFIG_DIR / "grid"
# set by the grid for every cell
RESERVED = ("seed", "output_dir", "ckpt_path", "ckpt", "logger.group", "logger.run_name")
INIT_REF = "init_ckpt=@"  # a row's `init_ckpt=@<row>/<train>`: that cell's best checkpoint starts the row's cells
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
# key -> (what its value names, the values it takes)
CHOICES = {
    "test": ("significance test", tuple(TESTS)),
    "paired_by": ("pairing", ("query", "replicate")),
    "launcher": ("launcher", ("subprocess", "inprocess")),
    "action": ("action", ("run", "table", "list", "export", "import")),
}


def grid_key(source: str | os.PathLike, key: str) -> str:
    """Where an InputError about a grid key is."""
    return f"grid file {source}, key {key}"


@dataclass
class GridSpec:
    """A grid: the grid file's keys, command-line grid keys merged in.

    After `__post_init__` rows, train_data and eval_data are {label: [overrides]}, seeds a list (None: the config's
    seed), and the other keys are filled in.
    """

    name: str | None = None  # folder and W&B group (load_grid: the file's name when unset)
    baseline: str | None = None  # required: the row the table compares against
    rows: Any = None  # required: one row per method, {label: overrides} for train.py
    train_data: Any = None  # required: {label: overrides}; a label without `data=` picks the data option of its name
    eval_data: Any = None  # like train_data (default: train_data); a label of both has the same overrides
    seeds: Any = None  # a list of integers, or one
    folds: int | None = None  # k-fold cross-validation (data.num_folds / data.fold per cell), >= 3
    common: Any = None  # overrides for every cell
    measures: Any = None  # table columns (default: eval.measures): among eval.measures, or run-level (iw, avgcos, mats)
    test: str | None = "t_test_one_tailed"  # a significance test of metrics.significance.TESTS
    paired_by: str | None = "query"  # query (per-query values, mean over runs first) | replicate (per seed/fold means)
    launcher: str | None = "subprocess"  # subprocess (train.py / evaluate.py per cell) | inprocess
    output_root: str | None = "outputs/grids"
    action: str | None = "run"  # run | table | list | export | import (finished cells to / from cells_file)
    cells_file: str | None = None  # action=export / import: a gzip'd JSON file of finished cells (grid/cells.py)
    untrained: Any = None  # rows evaluated as they are, never trained: the backbone (0 steps) beside its fine-tuned row
    train_on: dict[str, Any] | None = None  # row -> the train_data labels it trains on (default: all)
    compare_to: dict[str, str] | None = None  # row -> the row its table cells compare with (default: baseline)
    delta_eval: list[str] | None = None  # two eval_data labels: the position-bias paper's Table 3-4 layout
    # the Δ of the delta_eval block: `second` is the position-bias paper's (Tables 3-4, "the relative difference
    # between the original and debiased evaluation", printed relative to the debiased value: (0.395 - 0.432) / 0.395 is
    # its -9.4 %), `first` relative to the first evaluation data (the records before 2026-11-28)
    delta_base: str = "second"
    only: Any = None  # run only the cells whose label matches one of these globs
    record: bool = False  # also write the table as a dated record, results/<date>-<name>.md (grid/record.py)
    # action=run beside other grid processes: instead of leaving when only their cells are left, look again every
    # wait_s seconds and take the first runnable cell in plan order, until every selected cell is finished
    wait_s: float | None = None
    # the paper's figures, shown under our rows: {eval_data label: {row: {measure: value}}}
    paper: dict[str, Any] | None = None
    paper_note: str | None = None  # whose figures `paper` holds (paper, table, data set, backbone)
    # Where the grid does not follow the paper's printed setting (backbone, steps or epochs this CPU cannot afford, a
    # setting the paper does not print, ...), one sentence each: a grid that claims a paper's setting names every
    # departure from it, and its table and record print the list under the table's header (grid/tables.py).
    deviations: list[str] | None = None

    # not grid keys: set by load_grid
    source = ""  # the grid file
    file_baseline = ""  # the grid file's own baseline (`baseline=` on the command line may name another)
    file_test: tuple[str, str] | None = None  # the grid file's own (test, paired_by)

    def __post_init__(self):
        """Normalises the keys; InputError(key path, problem) on a bad one (load_grid puts the grid file in front)."""
        for key in ("baseline", "rows", "train_data"):
            if getattr(self, key) is None:
                raise InputError(key, "is missing")
        for f in fields(self):  # null or "": the default
            if f.default is not None and not getattr(self, f.name):
                setattr(self, f.name, f.default)
        self.name = _label(self.name, "name")
        self.rows = _labelled(self.rows, "rows", None)
        if self.baseline not in self.rows:
            raise InputError("baseline", f"'{self.baseline}' is not a row; rows are {list(self.rows)}")
        self.train_data = _labelled(self.train_data, "train_data", "data")
        self.eval_data = (
            dict(self.train_data) if self.eval_data is None else _labelled(self.eval_data, "eval_data", "data")
        )
        for label, ov in self.eval_data.items():
            if label in self.train_data and ov != self.train_data[label]:
                raise InputError(
                    "eval_data",
                    f"'{label}' has other overrides than in train_data; use another label for a different setting",
                )
        if self.action in ("export", "import") and not self.cells_file:
            raise InputError("cells_file", f"is missing; action={self.action} needs the path of the cells file")
        self.seeds = _seeds(self.seeds)
        if self.folds is not None and self.folds < 3:
            raise InputError("folds", f"is {self.folds}; expected an integer >= 3 (data.num_folds) or null")
        self.common = _overrides(self.common, "common")
        self.check_fold_overrides(
            [*self.common, *(o for d in (self.rows, self.train_data, self.eval_data) for v in d.values() for o in v)]
        )
        if self.measures is not None and not self.measures:  # an empty selection is an error, never "the defaults"
            raise InputError(
                "measures",
                "is empty; expected a list of measure names among the cells' eval.measures, "
                "or null (leave it out) for all of them",
            )
        self.measures = _strings(self.measures, "measures", "a list of measure names")
        for key, (what, allowed) in CHOICES.items():
            if getattr(self, key) not in allowed:
                raise InputError(key, f"unknown {what} '{getattr(self, key)}'; expected one of {list(allowed)}")
        if self.test in UNPAIRED and self.paired_by != "replicate":
            raise InputError(
                "paired_by",
                f"is '{self.paired_by}'; the test '{self.test}' compares the runs' means (one per seed or fold), "
                "so expected paired_by: replicate",
            )
        if self.wait_s is not None and not self.wait_s > 0:
            raise InputError(
                "wait_s", f"is {self.wait_s}; expected seconds > 0 between looks at the other processes' cells, or null"
            )
        if self.only is not None and not self.only:
            raise InputError(
                "only",
                'is empty; expected cell-label globs, e.g. ["*/fold0"] or ["bert_cat/*"] '
                "(leave it out for every cell; action=list prints the labels)",
            )
        self.only = _strings(self.only, "only", 'cell-label globs, e.g. ["*/fold0"] or ["bert_cat/*"]')
        self.train_on = {row: self._train_labels(row, labels) for row, labels in (self.train_on or {}).items()}
        self.untrained = _strings(self.untrained, "untrained", "a list of row labels")
        for row in self.untrained:
            if row not in self.rows:
                raise InputError("untrained", f"'{row}' is not a row; rows are {list(self.rows)}")
            if any(o.startswith(("head=", "head.", INIT_REF, "stage=")) for o in self.rows[row]):
                raise InputError(
                    f"rows.{row}", "is listed in `untrained` (evaluated as it is) but sets a head, stage or init_ckpt"
                )
        self.compare_to = dict(self.compare_to or {})
        for row, other in self.compare_to.items():
            if row not in self.rows or other not in self.rows:
                raise InputError(
                    f"compare_to.{row}", f"'{row}: {other}' names a row that does not exist; rows are {list(self.rows)}"
                )
        self.delta_eval = list(self.delta_eval or [])
        if self.delta_eval and (len(self.delta_eval) != 2 or any(e not in self.eval_data for e in self.delta_eval)):
            raise InputError(
                "delta_eval", f"is {self.delta_eval!r}; expected two eval_data labels of {list(self.eval_data)}"
            )
        if self.delta_base not in ("first", "second"):
            raise InputError(
                "delta_base",
                f"is {self.delta_base!r}; expected second (the paper's Delta, relative to the second "
                "evaluation data) or first",
            )
        self.paper = self._paper_figures(self.paper or {})
        self.deviations = _strings(
            self.deviations, "deviations", "a list of sentences, one per departure from the paper's setting"
        )
        self.init_references()

    def _paper_figures(self, paper: dict) -> dict[str, dict[str, dict[str, float]]]:
        for ev, rows in paper.items():
            train, _, label = ev.rpartition("/")  # "<eval>" for every training data, "<train>/<eval>" for one
            if label not in self.eval_data or (train and train not in self.train_data) or not isinstance(rows, dict):
                raise InputError(
                    f"paper.{ev}",
                    f"expected an eval_data label of {list(self.eval_data)} "
                    "(or <train_data label>/<eval_data label>) mapping rows to {measure: value}",
                )
            for row, figures in rows.items():
                if row not in self.rows or not isinstance(figures, dict):
                    raise InputError(
                        f"paper.{ev}.{row}", f"expected a row of {list(self.rows)} mapping measures to numbers"
                    )
                for m, v in figures.items():
                    if (
                        (self.measures and m not in self.measures)
                        or isinstance(v, bool)
                        or not isinstance(v, (int, float))
                    ):
                        raise InputError(
                            f"paper.{ev}.{row}.{m}",
                            f"is {v!r}; expected a number for a table measure {self.measures or ''}",
                        )
        return {ev: {row: {m: float(v) for m, v in f.items()} for row, f in rows.items()} for ev, rows in paper.items()}

    def _train_labels(self, row: str, labels: Any) -> list[str]:
        labels = [labels] if isinstance(labels, str) else labels
        if row not in self.rows:
            raise InputError(f"train_on.{row}", f"'{row}' is not a row; rows are {list(self.rows)}")
        if not isinstance(labels, list) or not labels or any(lb not in self.train_data for lb in labels):
            raise InputError(
                f"train_on.{row}",
                f"is {labels!r}; expected a non-empty list of train_data labels {list(self.train_data)}",
            )
        return list(labels)

    def check_fold_overrides(self, ovs: list[str]) -> None:
        """With folds, the grid sets data.num_folds and data.fold per cell: no override may."""
        for ov in ovs if self.folds else []:
            if ov.split("=", 1)[0] in ("data.num_folds", "data.fold"):
                raise InputError(
                    "folds", f"is {self.folds}: the grid sets data.num_folds and data.fold per cell; remove '{ov}'"
                )

    def init_references(self) -> dict[str, tuple[str, str]]:
        """Return each row's `init_ckpt=@row/train` reference: row -> (row, train).

        That cell's best checkpoint initialises the row's training cells (same replicate). InputError when the
        referenced row or training data does not exist, or when the referenced row does not train on it.
        """
        refs = {}
        for row, ov in self.rows.items():
            for o in ov:
                if not o.startswith(INIT_REF):
                    continue
                target = o[len(INIT_REF) :].split("/")
                if len(target) != 2 or target[0] not in self.rows or target[1] not in self.train_data:
                    raise InputError(
                        f"rows.{row}",
                        f"'{o}': expected init_ckpt=@<row>/<train_data> with a row of {list(self.rows)} "
                        f"and training data of {list(self.train_data)}",
                    )
                if target[0] == row or not self.trains_on(target[0], target[1]):
                    raise InputError(
                        f"rows.{row}", f"'{o}': row '{target[0]}' does not train on '{target[1]}' (or refers to itself)"
                    )
                refs[row] = (target[0], target[1])
        return refs

    def trains_on(self, row: str, train: str) -> bool:
        """Tell whether `row` trains on the training data `train` (grid key `train_on`; default: on every one)."""
        return train in self.train_on.get(row, self.train_data)

    def own_test(self, train: str, ev: str) -> bool:
        """Tell whether testing on `ev` is what the training cells on `train` already do at their end.

        The same label, or data overrides that differ only in keys that change the training split
        (datamodules.config.TRAINING_ONLY, e.g. the position-bias grid's `original` test of its `debiased` training,
        which adds data.rotate_train=true). Such a test is read from the training cell instead of running evaluate.py on
        the same checkpoint again. (A label of both has the same overrides in both: __post_init__ checks it.)
        """

        def test_settings(overrides: list[str]) -> dict[str, str]:
            pairs = (o.partition("=")[::2] for o in overrides)  # a later override of a key wins, as in the run
            return {k: v for k, v in pairs if not (k.startswith("data.") and k[len("data.") :] in TRAINING_ONLY)}

        return test_settings(self.train_data[train]) == test_settings(self.eval_data[ev])

    def selected(self, cell) -> bool:
        """Whether `only` selects the cell (a grid.engine.Cell)."""
        return not self.only or any(fnmatch.fnmatchcase(cell.label, p) for p in self.only)

    @property
    def dir(self) -> Path:
        """The grid's folder, `<output_root>/<name>`, holding its cells, results and tables."""
        return Path(self.output_root) / self.name

    @property
    def table_path(self) -> Path:
        """The path of the grid's Markdown table, named after the baseline, test and pairing when they differ.

        `table.md` against the file's baseline with its test; `table-<row>.md` against another (`baseline=<row>`),
        `table[-<row>]-<test>-<paired_by>.md` with another test or pairing, so the Table 3 / 4 / 5 layouts of one grid
        and the views of another test sit side by side instead of overwriting each other.
        """
        stem = "table"
        if self.file_baseline and self.baseline != self.file_baseline:
            stem += f"-{self.baseline}"
        if self.file_test and (self.test, self.paired_by) != self.file_test:
            stem += f"-{self.test}-{self.paired_by}"
        return self.dir / f"{stem}.md"

    def replicates(self) -> list[tuple[str, int | None, int | None]]:
        """[(replicate id, seed or None, fold or None)]."""
        out = []
        for seed in self.seeds:
            for fold in range(self.folds) if self.folds else [None]:
                parts = []
                if seed is not None and (fold is None or len(self.seeds) > 1):
                    parts.append(f"seed{seed}")
                if fold is not None:
                    parts.append(f"fold{fold}")
                out.append(("-".join(parts) or "run", seed, fold))
        return out

    def to_dict(self) -> dict:
        """Return the grid keys as a dict (for grid.yaml, results.json and W&B), without those of one invocation.

        Left out: action, only, record, cells_file and wait_s.
        """
        return {k: getattr(self, k) for k in GRID_KEYS if k not in ("action", "only", "record", "cells_file", "wait_s")}


GRID_KEYS = tuple(f.name for f in fields(GridSpec))


def _overrides(value: Any, where: str) -> list[str]:
    """Pipeline overrides (a list, or one space-separated string) that the grid may pass on to a cell."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(where, f"is {value!r}; expected a list of overrides like [model=repbert, optim.lr=2e-5]")
    for v in value:
        if "=" not in v:
            raise InputError(where, f"override '{v}' is not key=value")
        key = v.split("=", 1)[0]
        if key in RESERVED:
            raise InputError(where, f"override '{v}': '{key}' is set by the grid for every cell")
    return list(value)


def _label(label: Any, where: str) -> str:
    label = str(label)
    if not _LABEL.match(label):
        raise InputError(where, f"label '{label}' must be letters, digits and _ . + - (it names a folder)")
    return label


def _labelled(value: Any, where: str, group: str | None) -> dict[str, list[str]]:
    """Return {label: overrides} from a mapping, or a list of option names / one-key mappings.

    For data, a label with no `data=` override picks the data option of that name.
    """
    if isinstance(value, dict):
        items = [(where, label, ov) for label, ov in value.items()]
    elif isinstance(value, list):
        items = []
        for i, v in enumerate(value):
            if isinstance(v, dict) and len(v) == 1:
                items.append((f"{where}[{i}]", *next(iter(v.items()))))
            elif isinstance(v, str):
                items.append((f"{where}[{i}]", v, None))
            else:
                raise InputError(f"{where}[{i}]", f"is {v!r}; expected an option name or {{label: [overrides]}}")
    else:
        raise InputError(where, f"is {value!r}; expected a list or a mapping")
    out: dict[str, list[str]] = {}
    for at, label, ov in items:
        label = _label(label, at)
        if label in out:
            raise InputError(at, f"label '{label}' appears twice")
        ov = _overrides(ov, f"{where}.{label}")
        if group and not any(o.split("=", 1)[0] == group for o in ov):
            ov = [f"{group}={label}"] + ov
        out[label] = ov
    if not out:
        raise InputError(where, "is empty")
    return out


def _seeds(value: Any) -> list[int | None]:
    seeds = [None] if value is None else [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(s is None or (isinstance(s, int) and not isinstance(s, bool)) for s in seeds)
    ):
        raise InputError("seeds", f"is {value!r}; expected a list of integer seeds, e.g. [1, 2, 3]")
    if len(set(seeds)) != len(seeds):
        raise InputError("seeds", f"{seeds} repeats a seed")
    return seeds


def _strings(value: Any, where: str, expected: str) -> list[str]:
    """Return `value` as a list of non-empty strings; it may be a list or one string (None or empty: [])."""
    value = [] if not value else [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InputError(where, f"is {value!r}; expected {expected}")
    return list(value)


# ------------------------------------------------------------------------------------------------ loading


def _grid_path(value: str) -> Path:
    if value.endswith((".yaml", ".yml")) or "/" in value or os.sep in value:
        path = Path(value)
        if not path.is_file():
            raise InputError("grid", f"grid file '{value}' does not exist")
        return path
    path = GRID_DIR / f"{value}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in GRID_DIR.glob("*.yaml"))
        raise InputError(
            "grid", f"no grid '{value}' in {GRID_DIR}; expected one of {options} or a path to a .yaml file"
        )
    return path


def load_grid(argv: list[str]) -> tuple[GridSpec, list[str]]:
    """Load the grid of `grid=NAME [key=value ...]`: return (spec, extra pipeline overrides).

    Grid keys on the command line override the file's, any other key is a pipeline override appended to every cell.
    """
    grid, grid_over, extra, only_cli = None, [], [], None
    for arg in argv:
        if "=" not in arg:
            raise InputError(f"argument '{arg}'", "expected key=value (e.g. grid=squad_3seeds or seeds=[1,2])")
        key, value = arg.split("=", 1)
        check_control_characters(key, value)
        if key == "grid":
            grid = value
        elif key == "only":  # globs are not YAML ('*' starts an alias): read `only=a/*,*/fold0` or `only=[...]` as text
            only_cli = [p.strip().strip("'\"") for p in value.strip().strip("[]").split(",") if p.strip()]
        elif key in GRID_KEYS:
            grid_over.append(arg)
        else:
            extra.append(arg)
    if not grid:
        options = sorted(p.stem for p in GRID_DIR.glob("*.yaml"))
        raise InputError(
            "grid", f"missing; usage: python experiments.py grid=NAME [key=value ...], NAME one of {options}"
        )
    path = _grid_path(grid)
    file = load_yaml(path, f"grid={grid}")
    try:
        cli = OmegaConf.from_dotlist(grid_over)
    except Exception as e:
        raise InputError("command line", f"cannot parse grid overrides {grid_over}: {e}") from e
    if only_cli is not None:
        cli.only = only_cli
    extra = _overrides(extra, "command line")
    where = partial(grid_key, path)

    def unknown(key: str) -> InputError:
        return InputError(f"grid file {path}", f"unknown grid key '{key}'; a grid accepts {list(GRID_KEYS)}")

    node = merge_structured(GridSpec, file, cli, prefix="", where=where, unknown=unknown)
    try:
        if not node.name:
            node.name = path.stem
        spec = OmegaConf.to_object(node)
        spec.check_fold_overrides(extra)
        spec.source, spec.file_baseline = str(path), str(file.get("baseline"))  # file_baseline names table.md
        spec.file_test = (file.get("test", GridSpec.test), file.get("paired_by", GridSpec.paired_by))
    except InputError as e:  # from __post_init__, which names the key only
        raise InputError(where(e.where), e.problem) from e
    except OmegaConfBaseException as e:  # e.g. an interpolation to a key that does not exist
        raise translate_error(e, where=where) from e
    return spec, extra
