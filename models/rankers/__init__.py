"""Ranker registry: `model.name` in YAML picks one of these, and each entry declares what its ranker can do."""

from collections.abc import Callable

from omegaconf import OmegaConf

from core.registry import Registry
from models.rankers.capabilities import NO_CAPABILITIES, RankerCapabilities

RANKERS: Registry = Registry("ranker")

# Importing the modules registers them.
from models.rankers import (  # noqa: E402,F401
    bert_cat,
    bert_dot,
    colbert,
    dgre,
    repbert,
    tk,
)


def ranker_capabilities(name: str) -> RankerCapabilities:
    """Return what the ranker registered as `name` declares it can do, from the name alone (nothing is built).

    A name that is no ranker (a first-stage retriever such as `bm25`, composed from the same `model` group), or a ranker
    registered without capabilities, can do none of it, so the caller's own error says what it needs.
    """
    return (RANKERS.get(name).capabilities if name in RANKERS else None) or NO_CAPABILITIES


def rankers_with(can: Callable[[RankerCapabilities], bool]) -> list[str]:
    """Return the names of the registered rankers whose capabilities satisfy `can`, sorted (for error messages)."""
    return [n for n in RANKERS.names() if can(ranker_capabilities(n))]


def ranker_config(model: dict):
    """Turn a `model` dict (from YAML or a checkpoint) into the ranker's dataclass config, checked by its schema."""
    schema = RANKERS.get(model["name"], "model.name").schema
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), model))


def build_ranker(cfg):
    """Build the ranker that `cfg.name` names, from its validated config (an InputError names unknown names)."""
    entry = RANKERS.get(cfg.name, "model.name")
    return entry.build(cfg)
