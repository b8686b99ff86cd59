"""Where an analysis puts its results: files in `output_dir` (figures first, the JSON last and atomically, so a
JSON means a finished analysis) and the configured logger (scalars; on W&B also tables and images).
"""

from __future__ import annotations

from pathlib import Path

from callbacks.loggers import build_logger
from core.io import save_figure, write_json

__all__ = ["log_analysis", "save_figure", "write_result"]


def write_result(out: str | Path, json_name: str, result: dict) -> Path:
    path = Path(out) / json_name
    write_json(path, result)
    return path


def log_analysis(
    cfg,
    name: str,
    scalars: dict[str, float] | None = None,
    tables: dict[str, tuple[list[str], list[list]]] | None = None,
    images: dict[str, str | Path] | None = None,
    summary: dict | None = None,
) -> None:
    """Scalars to any logger; `tables` ({key: (columns, rows)}), `images` ({key: png path}) and `summary` only where
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
        if summary:
            logger.experiment.summary.update(summary)
    logger.save()
    if is_wandb:
        logger.experiment.finish()
