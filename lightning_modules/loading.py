"""A RankingModule from a checkpoint of this pipeline or, without one, from the run config (the untrained backbone).

One loader for every job that reads a fine-tuned ranker: evaluate.py, the analyses, full-collection retrieval and
the indexes that re-open their checkpoint.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from core.checkpoints import check_same_ranker, read_checkpoint, register_check
from core.errors import InputError
from lightning_modules.module import OptimConfig, RankingModule
from models.heads import HEADS
from models.rankers import RANKERS

__all__ = ["check_hparams", "load_module", "module_from_checkpoint", "module_from_state"]


def _schema(group: str, values: Mapping, path: str, key: str):
    if group == "optim":
        return OptimConfig
    registry = RANKERS if group == "model" else HEADS
    name = values.get("name")
    if name not in registry:
        kind = "ranker" if group == "model" else "head"
        raise InputError(
            key,
            f"checkpoint '{path}' holds {kind} '{name}', which this version does not know; "
            f"expected one of {registry.names()}",
        )
    return registry.get(name).schema


def check_hparams(ckpt: dict, path: str, key: str) -> None:
    """Check a checkpoint's `model`, `optim` and `head` hyper-parameters against this version's schemas.

    This matters for a checkpoint of another version. A key this version does not know stops with one line naming the
    key and the checkpoint (it would change what the checkpoint means); a key it lacks takes this version's default,
    with a warning. Fills the defaults in.
    """
    hp = ckpt["hyper_parameters"]
    for group in ("model", "optim", "head"):
        values = hp.get(group)
        if values is None:
            continue
        if isinstance(values, DictConfig):
            values = OmegaConf.to_container(values)
        if not isinstance(values, Mapping):
            raise InputError(
                key,
                f"checkpoint '{path}': hyper-parameter '{group}' is {type(values).__name__}; "
                "expected a mapping of keys",
            )
        schema = _schema(group, values, path, key)
        if schema is None:
            continue
        known = [f.name for f in fields(schema)]
        unknown = [k for k in values if k not in known]
        if unknown:
            raise InputError(
                key,
                f"checkpoint '{path}' has hyper-parameter '{group}.{unknown[0]}', which this version does not know "
                f"(a checkpoint of another version?); {group} '{schema.__name__}' accepts {sorted(known)}",
            )
        missing = [k for k in known if k not in values]
        if missing:
            defaults = OmegaConf.to_container(OmegaConf.structured(schema))
            warnings.warn(
                f"checkpoint '{path}' has no hyper-parameter {', '.join(f'{group}.{k}' for k in missing)} "
                f"(a checkpoint of another version?); taking the default{'s' if len(missing) > 1 else ''} "
                f"{', '.join(f'{k}={defaults[k]!r}' for k in missing)}",
                stacklevel=2,
            )
            hp[group] = {**{k: defaults[k] for k in missing}, **values}


register_check(check_hparams)


def module_from_state(ckpt: dict, path: str | os.PathLike, key: str, measures: list[str] | None) -> RankingModule:
    """Build the RankingModule a read checkpoint describes, loaded with its `state_dict`.

    The ranker and optimiser configs come from its `hyper_parameters`; `key`: the config key that named `path`, for
    the error.
    """
    hp = ckpt["hyper_parameters"]
    module = RankingModule(hp["model"], hp.get("optim", {}), measures)
    missing, unexpected = module.load_state_dict(ckpt["state_dict"], strict=False)
    if missing or unexpected:
        raise InputError(
            key,
            f"'{path}' does not match ranker '{hp['model'].get('name')}' "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
        )
    module.rerank_depth = ckpt.get("rerank_depth")  # the re-ranking depth its validation chose (eval.rerank_depths)
    return module


def module_from_checkpoint(
    path: str | os.PathLike, key: str = "ckpt", measures: list[str] | None = None, device=None
) -> RankingModule:
    """Load the RankingModule of the checkpoint at `path`, in eval mode (on `device` when given)."""
    ckpt = read_checkpoint(str(path), key)
    module = module_from_state(ckpt, path, key, measures or ckpt["hyper_parameters"].get("measures"))
    del ckpt
    module.eval()
    if device is not None:
        module.to(device)
    return module


def load_module(cfg: DictConfig, model_from_cli: bool) -> RankingModule:
    """Load the RankingModule of `cfg.ckpt`, or build `cfg.model` untrained when no checkpoint is given.

    The checkpoint's ranker config wins over `cfg.model`, which it replaces; without a checkpoint the backbone is as
    pre-trained. `model_from_cli`: the command line picked the model, so the checkpoint must hold that ranker.
    """
    if not cfg.ckpt:
        return RankingModule(
            OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.optim), list(cfg.eval.measures)
        )
    ckpt = read_checkpoint(cfg.ckpt, "ckpt")
    if model_from_cli:
        check_same_ranker(ckpt, cfg, "ckpt", cfg.ckpt)
    cfg.model = ckpt["hyper_parameters"]["model"]
    return module_from_state(ckpt, cfg.ckpt, "ckpt", list(cfg.eval.measures))
