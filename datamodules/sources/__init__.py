"""Data source registry: `data.source` in YAML picks one. Each source is `build(cfg, seed) -> IRDataset`."""
from pipeline.registry import Registry

SOURCES: Registry = Registry("data source")

from datamodules.sources import beir, classic, ir_datasets_source, squad, synthetic, tsv  # noqa: E402,F401


def load_dataset(cfg, seed: int):
    """Build and validate the dataset of `cfg`; with `data.num_folds` set, its judged queries re-split into
    cross-validation folds (datamodules/folds.py)."""
    from datamodules.folds import apply_folds, check_fold_config

    num_folds = check_fold_config(cfg)
    ds = SOURCES.get(cfg.source, "data.source").build(cfg, seed)
    ds.validate()
    if num_folds is not None:
        ds = apply_folds(ds, num_folds, int(cfg.fold), int(cfg.fold_seed), source=cfg.source)
    return ds
