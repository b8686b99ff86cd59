"""`data.source` in YAML picks one entry; each source registers `build(cfg, seed) -> IRDataset` with its schema."""

from core.registry import Registry

SOURCES: Registry = Registry("data source")
