"""The W&B logger of a run: readable names and groups, and a run that survives W&B being unreachable.

Dashboard layout (what `wandb_init_args` sets):
- name: `logger.run_name`, else the output folder's name (`eval-<folder>` for evaluate.py); grids set
  `<row>-<train>-<eval>-<replicate>`.
- group: `logger.group`, else `<model>-<data>` (e.g. `colbert-squad`), so runs of one ranker on one collection sit
  together; grids group by grid name.
- job_type: `train`, `head` (stage=head), `eval`, `analysis` (analyses/, named `<analysis>-<output folder>`) or
  `grid-table` (a grid's results table), to filter the runs table.
- tags: the ranker, the collection, the head when there is one, plus `logger.tags`.

Faults: the run is created when the logger is built (not lazily inside the Trainer), so a W&B server that cannot
be reached or a `wandb/` folder that cannot be written is met before training starts. Training then continues with
a warning: first offline into `<output_dir>/wandb` (sync later with `wandb sync <dir>/offline-run-*`), else
offline into a fresh temporary folder, else the CSV logger, else no logger.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, WandbLogger

from core.errors import InputError
from core.progress import times


def key_configured() -> bool:
    """Return whether a W&B API key is set up (`WANDB_API_KEY`, or api.wandb.ai in ~/.netrc).

    Decides `logger.mode=auto`: online with a key, offline without one.
    """
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def wandb_init_args(cfg: DictConfig, name: str, job: str | None = None) -> dict:
    """Return the W&B run's project, entity, name, group, job type and tags (the dashboard layout above).

    `name` is the run name when `logger.run_name` is unset; `job` the job type, else from the run: `eval` for a
    name starting `eval-`, `head` for stage=head, else `train`.
    """
    lc = cfg.logger
    job = job or ("eval" if name.startswith("eval-") else ("head" if cfg.get("stage") == "head" else "train"))
    model, data = cfg.model.name, cfg.data.get("source", "data")
    head = cfg.get("head", {}).get("name", "none") if cfg.get("head") is not None else "none"
    tags = [model, data] + ([head] if head != "none" else []) + [t for t in lc.tags if t not in (model, data, head)]
    return dict(
        project=lc.project,
        entity=lc.entity,
        name=lc.run_name or name,
        group=lc.group or f"{model}-{data}",
        job_type=job,
        tags=tags,
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _try(args: dict, save_dir: Path, mode: str, config: dict):
    """Return a WandbLogger whose run is already initialised (so failures happen here), or the exception."""
    import wandb  # lazy: heavy, only W&B logging needs it

    try:
        (save_dir / "wandb").mkdir(parents=True, exist_ok=True)
        # quiet: wandb's start and end banners (version, run history, summary) repeat what the run prints; it still
        # says where the run is saved and how to view it, and every warning
        logger = WandbLogger(
            **args, save_dir=str(save_dir), mode=mode, config=config, settings=wandb.Settings(quiet=True)
        )
        # Lightning passes `anonymous` to wandb.init always (None when not asked for); wandb ignores the
        # setting (0.31 here) and warns whenever it is passed at all. Not passing it changes nothing else.
        getattr(logger, "_wandb_init", {}).pop("anonymous", None)
        logger.experiment  # noqa: B018  wandb.init on rank 0 (a dummy elsewhere)
        return logger
    except Exception as e:  # wandb raises CommError, UsageError, OSError, ... depending on what broke
        if getattr(wandb, "run", None) is not None:
            wandb.finish(exit_code=1)
        return e


def wandb_logger(cfg: DictConfig, name: str, job: str | None = None):
    """Build the W&B logger of a run, falling back when W&B cannot be used (see Faults above).

    Tries the configured mode (`auto`: online with a key, else offline) into `<output_dir>/wandb`, then offline there
    (unless that was the mode tried), then offline into a fresh temporary folder, then the CSV logger; each fallback
    warns. Returns the logger, or False
    when none could be built (training goes on without a logger).
    """
    mode = cfg.logger.mode
    if mode == "auto":
        mode = os.environ.get("WANDB_MODE") or ("online" if key_configured() else "offline")
    args, config, out = wandb_init_args(cfg, name, job), OmegaConf.to_container(cfg), Path(cfg.output_dir)
    first = _try(args, out, mode, config)
    if not isinstance(first, Exception):
        return first
    attempts = ([out] if mode != "offline" else []) + [Path(tempfile.mkdtemp(prefix="isorank-wandb-"))]
    for save_dir in attempts:
        logger = _try(args, save_dir, "offline", config)
        if not isinstance(logger, Exception):
            warnings.warn(
                f"W&B {mode} run failed ({_first_line(first)}); logging offline to {save_dir / 'wandb'} instead: "
                f"sync it later with `wandb sync {save_dir / 'wandb'}/offline-run-*`",
                stacklevel=2,
            )
            return logger
    try:
        logger = CSVLogger(save_dir=str(out), name="csv")
        Path(logger.log_dir).mkdir(parents=True, exist_ok=True)
        warnings.warn(
            f"W&B unavailable ({_first_line(first)}), offline too; logging to CSV in {logger.log_dir}", stacklevel=2
        )
        return logger
    except Exception as e:
        warnings.warn(
            f"W&B unavailable ({_first_line(first)}) and CSV logging failed ({_first_line(e)}); "
            "training without a logger",
            stacklevel=2,
        )
        return False


def finish_wandb() -> None:
    """Finish this process's W&B run, if one is open (its files complete when the job returns).

    Finished at exit instead, wandb ignores `quiet` and prints its sync hint and log folder again, after the run's
    last line; the start of the run says where it is.
    """
    wandb = sys.modules.get("wandb")  # never imported here only to find no run
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


def log_results_table(logger, rows: dict[str, dict], key: str = "test/results", extra: dict | None = None) -> bool:
    """Log a run's test results as the W&B table `key` and the summary key `results`; return whether it was logged.

    One row per label of `rows` (e.g. "before training" and "after training", or "Ft" and "Ft -> glow", the isotropy
    paper's rows), one column per measure, the values of `metrics.json`; the same under the summary key `results`
    (`results.<row>.<measure>` columns in the runs table). `extra` goes into the summary as it is: values that are not
    measures of a row (`best_step`, the step of the tested checkpoint, a column of the runs table beside the
    results), and `phase_summary()`: the seconds of the job's long phases. False, and nothing logged, unless
    `logger` is W&B. Logged after the results files are written, so a
    W&B failure here is a warning, not a lost run.
    """
    if not logger or not hasattr(logger, "log_table"):
        return False
    columns: list[str] = []
    for values in rows.values():
        columns += [k for k in values if k not in columns and isinstance(values[k], (int, float))]
    data = [
        [label, *[None if values.get(c) is None else float(values[c]) for c in columns]]
        for label, values in rows.items()
    ]
    try:
        logger.log_table(key=key, columns=["run", *columns], data=data)
        # a value a row lacks (no ATS of the raw vectors, say) is an empty cell in the table, and no summary key
        logger.experiment.summary.update(
            {
                "results": {
                    label: {c: v for c, v in zip(columns, line[1:]) if v is not None} for label, line in zip(rows, data)
                }
            }
        )
        more = {**(extra or {}), **phase_summary()}  # and the times of the job's long phases
        if more:
            logger.experiment.summary.update(more)
    except Exception as e:  # noqa: BLE001 - the results are on disk already
        warnings.warn(
            f"could not log the results table to W&B ({_first_line(e)}); metrics.json holds them", stacklevel=2
        )
        return False
    return True


def phase_summary() -> dict:
    """Return {"phase_s": {phase: seconds}}: this process' long phases so far (core/progress.py); {} when none.

    The phases that printed their line (`QUIET_S` or longer: a store, index or token cache built, an encoding, the
    isotropy protocol), keyed without their sizes, for the W&B run summary beside the results.
    """
    spent = times()
    return {"phase_s": {k: round(v, 1) for k, v in spent.items()}} if spent else {}


def head_rows(before: dict, after: dict, head: str) -> dict[str, dict]:
    """Return the rows of a test with an isotropy head: "Ft" and "Ft -> <head>".

    The `*_raw` isotropy values of the head run are the Ft row's, so they are not repeated as columns.
    """
    return {"Ft": before, f"Ft -> {head}": {k: v for k, v in after.items() if not k.endswith("_raw")}}


def build_logger(cfg: DictConfig, name: str, job: str | None = None):
    """Build the configured logger (`job`: the W&B job type, else from the run: train, head or eval).

    False for `logger.name=none`; a CSVLogger for `csv`; `wandb_logger` for `wandb`.

    Raises
    ------
    InputError
        For any other `logger.name`.
    """
    lc = cfg.logger
    out = Path(cfg.output_dir)
    if lc.name == "none":
        return False
    if lc.name == "csv":
        return CSVLogger(save_dir=str(out), name="csv")
    if lc.name == "wandb":
        return wandb_logger(cfg, name, job)
    raise InputError("logger.name", f"unknown logger '{lc.name}'; expected wandb, csv or none")
