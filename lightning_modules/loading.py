"""A RankingModule from a checkpoint of this pipeline or, without one, from the run config (the untrained backbone).

One loader for every job that reads a fine-tuned ranker: evaluate.py, the analyses, full-collection retrieval and
the indexes that re-open their checkpoint."""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from core.checkpoints import check_same_ranker, read_checkpoint
from core.errors import InputError
from lightning_modules.module import RankingModule

__all__ = ["load_module", "module_from_checkpoint", "module_from_state"]


def module_from_state(ckpt: dict, path: str | os.PathLike, key: str, measures: list[str] | None) -> RankingModule:
    """The RankingModule a read checkpoint describes (ranker and optimiser configs from its `hyper_parameters`),
    loaded with its `state_dict`; `key`: the config key that named `path`, for the error."""
    hp = ckpt["hyper_parameters"]
    module = RankingModule(hp["model"], hp.get("optim", {}), measures)
    missing, unexpected = module.load_state_dict(ckpt["state_dict"], strict=False)
    if missing or unexpected:
        raise InputError(key, f"'{path}' does not match ranker '{hp['model'].get('name')}' (missing {missing[:3]}, unexpected {unexpected[:3]})")
    module.rerank_depth = ckpt.get("rerank_depth")  # the re-ranking depth its validation chose (eval.rerank_depths)
    return module


def module_from_checkpoint(path: str | os.PathLike, key: str = "ckpt", measures: list[str] | None = None, device=None) -> RankingModule:
    """The RankingModule of the checkpoint at `path`, in eval mode (on `device` when given)."""
    ckpt = read_checkpoint(str(path), key)
    module = module_from_state(ckpt, path, key, measures or ckpt["hyper_parameters"].get("measures"))
    del ckpt
    module.eval()
    if device is not None:
        module.to(device)
    return module


def load_module(cfg: DictConfig, model_from_cli: bool) -> RankingModule:
    """The RankingModule of `cfg.ckpt` (its ranker config wins over `cfg.model`, which it replaces), or of
    `cfg.model` untrained (the backbone as pre-trained) when no checkpoint is given. `model_from_cli`: the command
    line picked the model, so the checkpoint must hold that ranker."""
    if not cfg.ckpt:
        return RankingModule(OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.optim), list(cfg.eval.measures))
    ckpt = read_checkpoint(cfg.ckpt, "ckpt")
    if model_from_cli:
        check_same_ranker(ckpt, cfg, "ckpt", cfg.ckpt)
    cfg.model = ckpt["hyper_parameters"]["model"]
    return module_from_state(ckpt, cfg.ckpt, "ckpt", list(cfg.eval.measures))
