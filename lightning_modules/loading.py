"""A RankingModule from a run config: the checkpoint's (`ckpt=`) or the untrained backbone's."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from core.checkpoints import check_same_ranker, read_checkpoint
from core.errors import InputError
from lightning_modules.module import RankingModule


def load_module(cfg: DictConfig, model_from_cli: bool) -> RankingModule:
    """The RankingModule of `cfg.ckpt` (its ranker config wins over `cfg.model`, which it replaces), or of
    `cfg.model` untrained (the backbone as pre-trained) when no checkpoint is given."""
    hparams = {"model": OmegaConf.to_container(cfg.model), "optim": OmegaConf.to_container(cfg.optim)}
    ckpt = None
    if cfg.ckpt:
        ckpt = read_checkpoint(cfg.ckpt, "ckpt")
        if model_from_cli:
            check_same_ranker(ckpt, cfg, "ckpt", cfg.ckpt)
        hparams = ckpt["hyper_parameters"]
        cfg.model = hparams["model"]
    module = RankingModule(hparams["model"], hparams["optim"], list(cfg.eval.measures))
    if ckpt is not None:
        missing, unexpected = module.load_state_dict(ckpt["state_dict"], strict=False)
        if missing or unexpected:
            raise InputError("ckpt", f"'{cfg.ckpt}' does not match ranker '{cfg.model.name}' (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return module