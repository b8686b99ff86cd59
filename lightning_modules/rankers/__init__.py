"""Ranker registry: `model.name` in YAML picks one of these."""
from pipeline.registry import Registry

RANKERS: Registry = Registry("ranker")

# Importing the modules registers them.
from lightning_modules.rankers import bert_cat, bert_dot, colbert, repbert  # noqa: E402,F401


def build_ranker(cfg):
    entry = RANKERS.get(cfg.name, "model.name")
    return entry.build(cfg)
