"""The rankers an analysis reads: `ckpt=`'s (or the untrained `model`), and optionally its untrained backbone.

One place for what the white-box, vocabulary and lexical-enrichment analyses share: the ranker is checked from the
config its source records before any weights are built, loaded with `models.loading.load_ranker`, and put on the
analysis device (a GPU when `trainer.accelerator` allows one).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from models.loading import LoadedRanker, load_configured, load_ranker, recorded_model

__all__ = ["analysed_model_config", "analysed_rankers", "analysis_device"]


def analysis_device(cfg) -> str:
    """Return "cuda" when a GPU is there and `trainer.accelerator` allows one (auto / gpu / cuda), else "cpu"."""
    use_gpu = torch.cuda.is_available() and str(cfg.trainer.accelerator) in ("auto", "gpu", "cuda")
    return "cuda" if use_gpu else "cpu"


def analysed_model_config(cfg) -> dict:
    """Return the `model` config of the analysed ranker: the one `ckpt` records, else the run's `model`."""
    if cfg.ckpt:
        return recorded_model(cfg.ckpt, "ckpt")
    return OmegaConf.to_container(cfg.model) if isinstance(cfg.model, DictConfig) else dict(cfg.model)


def analysed_rankers(
    cfg,
    model_from_cli: bool,
    *,
    trained_label: str = "trained",
    with_backbone: bool = False,
    check: Callable[[dict], None] | None = None,
    backbone: Callable[[dict], dict] | None = None,
) -> dict[str, LoadedRanker]:
    """Return label -> the loaded ranker, in eval mode on the analysis device.

    Parameters
    ----------
    cfg : DictConfig
        The run config: `ckpt` (a checkpoint or export folder, or none: the untrained `model`), `model`, `trainer`.
    model_from_cli : bool
        The command line picked the model, so `ckpt` must hold that ranker.
    trained_label : str
        The label of `ckpt`'s ranker ("untrained" when there is no `ckpt`).
    with_backbone : bool
        With a `ckpt`, add "backbone": the untrained ranker of the same config, the pre-trained starting point.
    check : Callable[[dict], None] or None
        Raises InputError for a `model` config the analysis cannot read; runs before any weights are built.
    backbone : Callable[[dict], dict] or None
        Adjusts the backbone's `model` config (the white-box analysis drops ColBERT's compression layer).

    Returns
    -------
    dict[str, LoadedRanker]
        In that order: the analysed ranker, then the backbone.
    """
    model = analysed_model_config(cfg)
    if check is not None:
        check(model)
    loaded = load_configured(cfg, model_from_cli)
    models = {(trained_label if cfg.ckpt else "untrained"): loaded}
    if with_backbone and cfg.ckpt:
        models["backbone"] = load_ranker(model=backbone(dict(model)) if backbone else dict(model))
    device = analysis_device(cfg)
    for m in models.values():
        m.ranker.eval()
        m.to(device)
    return models
