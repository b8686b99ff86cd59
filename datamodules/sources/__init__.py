"""Data source registry: `data.source` in YAML picks one. Each source is `build(cfg, seed) -> IRDataset`."""
from pipeline.registry import Registry

SOURCES: Registry = Registry("data source")

from datamodules.sources import beir, classic, ir_datasets_source, squad, synthetic, tsv  # noqa: E402,F401


def load_dataset(cfg, seed: int):
    ds = SOURCES.get(cfg.source, "data.source").build(cfg, seed)
    ds.validate()
    return ds
