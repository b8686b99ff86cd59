"""Data sources: `data.source` in YAML picks one (the registry: sources/registry.py; one module per source).

`load_dataset` builds, validates and splits the configured one.
"""

from omegaconf import OmegaConf
from pytorch_lightning.utilities import rank_zero_info

from datamodules.answer_bias import apply_answer_bias, describe
from datamodules.folds import apply_folds, check_fold_config
from datamodules.sources import beir, classic, ir_datasets_source, squad, synthetic, tsv  # noqa: F401 (they register)
from datamodules.sources.ir_datasets_source import folds_given_by_source
from datamodules.sources.registry import SOURCES

__all__ = ["SOURCES", "data_config", "load_dataset", "used_splits"]


def load_dataset(cfg, seed: int, splits: tuple[str, ...] | None = None):
    """Build and validate the dataset of `cfg`, reading only the splits a job uses.

    With `data.num_folds` set, its judged queries are re-split into cross-validation folds (datamodules/folds.py;
    unless the source's own folds were used: ir_datasets fold_ids); with `data.answer_bias_keep_first` set, the
    training split (of the fold) is cut to the position-biased questions (datamodules/answer_bias.py).
    `splits`: the splits the job uses (None: all; `used_splits` makes it from an option such as `analysis.split`).
    Every source's `build` takes it: a source that reads splits from separate files or ids (tsv, beir, ir_datasets)
    reads only those, and the others come back empty; a source whose one file holds every split (SQuAD, the classic
    collections, synthetic) reads that file whole, since its splits are a seeded permutation of all its queries.
    Folds re-split the queries of every split, so with data.num_folds every split is read.
    """
    num_folds = check_fold_config(cfg)
    build = SOURCES.get(cfg.source, "data.source").build
    ds = build(cfg, seed, splits=None if splits is None or num_folds is not None else tuple(splits))
    ds.validate()
    if num_folds is not None and not folds_given_by_source(cfg):
        ds = apply_folds(ds, num_folds, int(cfg.fold), int(cfg.fold_seed), source=cfg.source)
    if cfg.answer_bias_keep_first is not None:
        ds = apply_answer_bias(
            ds, float(cfg.answer_bias_keep_first), float(cfg.answer_bias_late_keep), int(cfg.answer_bias_seed)
        )
        rank_zero_info(describe(ds.answer_bias))
    return ds


def used_splits(*names: str) -> tuple[str, ...] | None:
    """Return the `splits` argument of `load_dataset` for a job that uses the named splits (`all`: every split).

    >>> used_splits("test")
    ('test',)
    >>> used_splits("val", "test", "val")
    ('val', 'test')
    >>> used_splits("all") is None
    True
    """
    return None if "all" in names else tuple(dict.fromkeys(names))


def data_config(cfg):
    """Return the run config's `data` group as the typed schema of its source (a dataclass instance)."""
    schema = SOURCES.get(cfg.data.source, "data.source").schema
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg.data))
