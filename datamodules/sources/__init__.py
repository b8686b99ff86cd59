"""Data sources: `data.source` in YAML picks one (the registry: sources/registry.py; one module per source).
`load_dataset` builds, validates and splits the configured one.
"""

import inspect

from omegaconf import OmegaConf
from pytorch_lightning.utilities import rank_zero_info

from datamodules.answer_bias import apply_answer_bias, describe
from datamodules.folds import apply_folds, check_fold_config
from datamodules.sources import beir, classic, ir_datasets_source, squad, synthetic, tsv  # noqa: F401 (they register)
from datamodules.sources.ir_datasets_source import folds_given_by_source
from datamodules.sources.registry import SOURCES

__all__ = ["SOURCES", "data_config", "load_dataset"]


def load_dataset(cfg, seed: int, splits: tuple[str, ...] | None = None):
    """Build and validate the dataset of `cfg`; with `data.num_folds` set, its judged queries re-split into
    cross-validation folds (datamodules/folds.py; unless the source's own folds were used: ir_datasets fold_ids); with `data.answer_bias_keep_first` set, the training split (of
    the fold) cut to the position-biased questions (datamodules/answer_bias.py).
    `splits`: the splits the job uses (None: all); a source that reads splits from separate places (ir_datasets)
    reads only those. Folds re-split the queries of every split, so with data.num_folds every split is read.
    """
    num_folds = check_fold_config(cfg)
    build = SOURCES.get(cfg.source, "data.source").build
    if splits is not None and num_folds is None and "splits" in inspect.signature(build).parameters:
        ds = build(cfg, seed, splits=tuple(splits))
    else:
        ds = build(cfg, seed)
    ds.validate()
    if num_folds is not None and not folds_given_by_source(cfg):
        ds = apply_folds(ds, num_folds, int(cfg.fold), int(cfg.fold_seed), source=cfg.source)
    if cfg.answer_bias_keep_first is not None:
        ds = apply_answer_bias(
            ds, float(cfg.answer_bias_keep_first), float(cfg.answer_bias_late_keep), int(cfg.answer_bias_seed)
        )
        rank_zero_info(describe(ds.answer_bias))
    return ds


def data_config(cfg):
    """The run config's `data` group as the typed schema of its source (a dataclass instance)."""
    schema = SOURCES.get(cfg.data.source, "data.source").schema
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg.data))
