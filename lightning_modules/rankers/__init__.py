"""Ranker registry: `model.name` in YAML picks one of these."""

from core.registry import Registry

RANKERS: Registry = Registry("ranker")

# Importing the modules registers them.
from lightning_modules.rankers import (  # noqa: E402,F401
    bert_cat,
    bert_dot,
    bm25,
    colbert,
    dgre,
    repbert,
    tk,
)

# Entries that are no nn.Module: evaluate.py runs them directly, train.py refuses them, grids do not train them.
UNTRAINED = ("bm25",)


def build_ranker(cfg):
    """Build the ranker that `cfg.name` names, from its validated config (an InputError names unknown names)."""
    entry = RANKERS.get(cfg.name, "model.name")
    return entry.build(cfg)
