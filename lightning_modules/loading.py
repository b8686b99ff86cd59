"""A RankingModule around `models.loading.load_ranker`: the ranker of a checkpoint, export folder or run config.

The jobs that evaluate through Lightning's test loop (evaluate.py, the export) wrap the loaded ranker in the
LightningModule here; analyses and retrieval take the plain ranker from `load_ranker` itself.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from core.checkpoints import register_check
from lightning_modules.head_module import HeadModule
from lightning_modules.module import OptimConfig, RankingModule
from models.loading import LoadedRanker, check_group, load_configured

__all__ = ["check_optim_hparams", "load_module", "module_from_loaded"]


def check_optim_hparams(ckpt: dict, path: str, key: str) -> None:
    """Check a checkpoint's `optim` hyper-parameters against this version's `OptimConfig` (`check_group`).

    `models.loading.check_hparams` checks `model` and `head`; both run on every checkpoint read.
    """
    check_group(ckpt["hyper_parameters"], "optim", OptimConfig, path, key)


register_check(check_optim_hparams)


def module_from_loaded(loaded: LoadedRanker, measures: list[str] | None = None) -> RankingModule:
    """Wrap a loaded ranker in its LightningModule: a HeadModule when it carries a head, else a RankingModule.

    The HeadModule scores with and without the head from one backbone pass ("Ft" and "Ft -> head").
    """
    hp = loaded.hparams
    if loaded.head is not None:
        base = loaded.base_path or loaded.path or ""
        module = HeadModule(
            hp["model"], hp.get("optim", {}), measures, hp["head"], base, ranker=loaded.ranker, head_module=loaded.head
        )
    else:
        module = RankingModule(hp["model"], hp.get("optim", {}), measures, ranker=loaded.ranker)
    module.rerank_depth = loaded.rerank_depth  # the re-ranking depth its validation chose (eval.rerank_depths)
    return module


def load_module(cfg: DictConfig, model_from_cli: bool) -> RankingModule:
    """Load the module of `cfg.ckpt` (checkpoint or export folder), or build `cfg.model` untrained without one.

    `models.loading.load_configured` loads the ranker (the checkpoint's ranker and head configs replace `cfg.model`
    and `cfg.head`); without a checkpoint it trains with the run's `optim`.
    """
    loaded = load_configured(cfg, model_from_cli)
    if not cfg.ckpt:
        loaded.hparams["optim"] = OmegaConf.to_container(cfg.optim)
    return module_from_loaded(loaded, list(cfg.eval.measures))
