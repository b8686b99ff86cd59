"""Where an analysis puts its results: files in `output_dir` and the configured logger.

Files go into `output_dir` as a set (`analysis_set`: staged, then renamed in with the JSON last, so a JSON means a
finished analysis and the figures beside it are that analysis' figures); the configured logger gets scalars, and on
W&B also tables and images.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from callbacks.loggers import build_logger, phase_summary
from core.io import result_set, save_figure, write_json

__all__ = ["analysis_set", "log_analysis", "placed", "save_figure", "write_result"]


def write_result(out: str | Path, json_name: str, result: dict) -> Path:
    """Write `result` atomically as `out/json_name` and return the path.

    Call it last, after the figures, so that a JSON means a finished analysis.
    """
    path = Path(out) / json_name
    write_json(path, result)
    return path


@contextmanager
def analysis_set(out: str | Path, json_name: str) -> Iterator[Path]:
    """Stage one analysis' files and rename them into `out` as a set, the JSON last.

    `with analysis_set(out, "x.json") as stage:` write the figures and the JSON into `stage`, a hidden folder inside
    `out`. On success they replace the earlier files of the same names (core.io.result_set: the earlier JSON goes
    first, the new one comes last, SIGINT / SIGTERM held meanwhile). On an error or an interrupt nothing in `out`
    changes, so a folder never holds a JSON beside the figures of another run.
    """
    with result_set(out, last=json_name) as stage:
        yield stage


def placed(out: str | Path, paths: list[Path]) -> list[Path]:
    """Return where files written into an `analysis_set` stage lie in `out` once the set is renamed in."""
    return [Path(out) / Path(p).name for p in paths]


def log_analysis(
    cfg,
    name: str,
    scalars: dict[str, float] | None = None,
    tables: dict[str, tuple[list[str], list[list]]] | None = None,
    images: dict[str, str | Path] | None = None,
    summary: dict | None = None,
) -> None:
    """Log an analysis' results to the configured logger, as one run named after the analysis and output folder.

    Scalars go to any logger; `tables` ({key: (columns, rows)}), `images` ({key: png path}) and `summary` only where
    the logger is W&B. Nothing with logger=none.
    """
    # one run per analysis and output folder, filtered on the dashboard by job type "analysis"
    folder = Path(cfg.output_dir).name
    logger = build_logger(cfg, name if name.endswith(folder) else f"{name}-{folder}", job="analysis")
    if not logger:
        return
    if scalars:
        # one value per analysis run: step 0, the x of every panel (no training steps here)
        logger.log_metrics({k: float(v) for k, v in scalars.items()}, step=0)
    is_wandb = hasattr(logger, "log_image")
    if is_wandb:
        for key, (columns, rows) in (tables or {}).items():
            logger.log_table(key=key, columns=list(columns), data=[list(r) for r in rows])
        for key, png in (images or {}).items():
            logger.log_image(key, [str(png)])
        more = {**(summary or {}), **phase_summary()}  # and the times of the analysis' long phases
        if more:
            logger.experiment.summary.update(more)
    logger.save()
    if is_wandb:
        logger.experiment.finish()
