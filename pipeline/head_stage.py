"""`train.py stage=head ckpt=FINETUNED.ckpt head=whitening|nice|glow`: the isotropy paper's post-hoc stage.

1. Rebuild the fine-tuned ranker from `ckpt` and freeze it; read and validate the data (nothing written before).
2. Encode the training queries and passages ONCE into the on-disk representation cache (under
   `data.cache_dir/representations/`, keyed by the checkpoint's weights, the backbone's config.json, the tokenizer,
   lengths, precision, granularity and texts, so whitening, NICE and Glow on the same ranker share it).
3. Fit the head, as its capabilities say (`HeadCapabilities.fit`):
   - closed form (whitening): stream the cache once through float64 moments, fit (Eq. 7-10), no optimiser;
   - by gradient (NICE / Glow): `head.epochs` epochs of maximum likelihood over the cache, validating after every
     epoch and keeping the best epoch by validation NDCG@10 (`checkpoints/best-*.ckpt`) plus `last.ckpt` (resumable
     with `ckpt_path=`: optimiser, epoch, position in the epoch). The validation split is encoded once and kept.
4. Test once with the best head: "Ft -> head" and, from the same backbone pass, "Ft" (no head); write
   `metrics.json` (Ft under `before_head`), `per_query.json`, `run.trec`, the resolved config, as any run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities import rank_zero_warn

from callbacks.checkpoint import lost_best_warning
from callbacks.loggers import build_logger
from callbacks.preemption import interruptible
from core.checkpoints import check_finite, read_checkpoint, read_header
from core.digests import input_digest, memo_folder
from core.errors import InputError
from core.io import atomic_open
from core.precision import warn_emulated_bf16
from datamodules.representations import HeadDataModule, training_texts
from lightning_modules.head_module import HEAD_PREFIXES, HeadModule, check_head_fits
from lightning_modules.loading import module_from_loaded
from models.heads import head_capabilities
from models.heads.cache import RepresentationCache, cache_key
from models.loading import LoadedRanker, load_ranker, runtime_overrides
from models.rankers import ranker_capabilities
from models.rankers.backbone import backbone_digests
from pipeline.stages import (
    MONITOR,
    build_trainer,
    evaluate_module,
    load_data,
    refuse_other_checkpoints,
    report_head_results,
    save_config,
)


def _trainer_for_head(cfg: DictConfig) -> DictConfig:
    """Return the run's config with the trainer schedule of a head: whole epochs, validated after each one."""
    t = OmegaConf.to_container(cfg.trainer)
    t.update(max_steps=-1, max_epochs=int(cfg.head.epochs), val_check_interval=None, check_val_every_n_epoch=1)
    return OmegaConf.merge(cfg, {"trainer": t})


def build_module(cfg: DictConfig) -> HeadModule:
    """Build the HeadModule of `cfg.head` on the fine-tuned ranker of `cfg.ckpt`, the ranker's weights loaded.

    The ranker keeps its own optim settings, with this run's NaN policy; a missing `ckpt`, `head=none` or a head
    checkpoint passed as `ckpt` is a one-line error.
    """
    if not cfg.ckpt:
        raise InputError("ckpt", "stage=head needs ckpt=<checkpoint of the fine-tuned ranker> to put the head on")
    if cfg.head.name == "none":
        raise InputError("head", "stage=head needs head=whitening, head=nice or head=glow")
    header = read_header(cfg.ckpt, "ckpt")  # no tensors: a head checkpoint is refused before anything loads
    if "base_ckpt" in header:
        raise InputError(
            "ckpt",
            f"'{cfg.ckpt}' is a head checkpoint; pass the fine-tuned ranker's checkpoint "
            f"(its base_ckpt is '{header['base_ckpt']}')",
        )
    loaded = load_ranker(cfg.ckpt, key="ckpt", runtime=runtime_overrides(cfg.model))
    hp = loaded.hparams
    cfg.model = hp["model"]  # config.yaml describes the ranker the head is fitted on, as evaluate.py's does
    optim = {**hp.get("optim", {}), "nonfinite": cfg.optim.nonfinite}  # the ranker's optim, this run's NaN policy
    # base_ckpt absolute, so evaluate.py finds the base from any working directory (grids run from elsewhere, for one)
    return HeadModule(
        hp["model"],
        optim,
        list(cfg.eval.measures),
        OmegaConf.to_container(cfg.head),
        str(Path(cfg.ckpt).resolve()),
        ranker=loaded.ranker,
    )


def _checkpoint_id(path: str) -> str:
    return str(Path(path).resolve())


def build_cache(cfg: DictConfig, module: HeadModule, dm: HeadDataModule) -> RepresentationCache:
    """Encode the training queries and passages once with the frozen ranker into the on-disk representation cache.

    Its folder under `data.cache_dir/representations/` is named by the checkpoint's path, granularity and texts, so
    whitening, NICE and Glow on the same ranker share it; its manifest holds all the vectors depend on (the digests of
    the checkpoint file and of the backbone's config.json, from which the ranker is built, both memoised by stat in
    `<cache_dir>/digests/`; the tokenizer, lengths, precision, dtype), and a folder of other inputs is rebuilt with a
    warning. The ranker's own representations, without the head.
    """
    queries, docs = training_texts(dm, cfg.head.max_train_texts, cfg.seed)
    granularity = cfg.head.granularity
    key = cache_key(_checkpoint_id(cfg.ckpt), granularity, queries, docs)
    path = Path(cfg.data.cache_dir) / "representations" / f"{Path(cfg.ckpt).stem}-{granularity}-{key[:16]}"
    memo = memo_folder(cfg.data.cache_dir)
    weights, _ = input_digest(cfg.ckpt, memo)
    # the checkpoint records its backbone's path only: the architecture is read from that folder at every load
    backbone = backbone_digests(module.ranker.cfg.backbone, memo)
    autocast, precision = None, "32"
    if str(cfg.trainer.precision).startswith("bf16"):
        precision = "bf16-autocast"
        warn_emulated_bf16("trainer.precision", cfg.trainer.precision, module.device.type, "32-true")
        autocast = lambda: torch.autocast(module.device.type, dtype=torch.bfloat16)  # noqa: E731
    module.attach(False)  # the ranker's own representations
    try:
        return RepresentationCache.build(
            path,
            module.ranker,
            module.pair_tokenizer,
            queries,
            docs,
            granularity=granularity,
            dtype=cfg.head.cache_dtype,
            checkpoint=_checkpoint_id(cfg.ckpt),
            autocast=autocast,
            precision=precision,
            weights=weights,
            backbone=backbone,
        )
    finally:
        module.attach(True)


def save_head(module: HeadModule, path: Path) -> None:
    """Write a head checkpoint outside Lightning's loop (a closed-form head): the layout of the flows' checkpoints."""
    state = {k: v for k, v in module.state_dict().items() if k.startswith(HEAD_PREFIXES)}
    check_finite(state, path, f"the fitted {module.head_cfg.name} head")  # never a NaN head.ckpt that looks complete
    with atomic_open(path, "wb") as f:
        torch.save(
            {"state_dict": state, "hyper_parameters": dict(module.hparams), "base_ckpt": module.hparams.base_ckpt}, f
        )


def check_head_stage(cfg: DictConfig) -> None:
    """Check from the checkpoints' headers, before any data is read, that the head fits the ranker of `ckpt`."""
    if cfg.ckpt:
        header = read_header(str(cfg.ckpt), "ckpt")
        name = header["hyper_parameters"]["model"]["name"]
        check_head_fits(name, ranker_capabilities(name), str(cfg.head.granularity))
    if cfg.ckpt_path:
        check_head_resume(cfg)


def check_head_resume(cfg: DictConfig) -> None:
    """`ckpt_path` must be a flow head's training checkpoint of the same head on the same base ranker."""
    ck = read_checkpoint(cfg.ckpt_path, "ckpt_path")  # a head's: small, read before the data
    if "base_ckpt" not in ck:
        raise InputError(
            "ckpt_path", f"'{cfg.ckpt_path}' is a fine-tuning checkpoint, not a head checkpoint of stage=head"
        )
    head = ck["hyper_parameters"].get("head", {})
    if head.get("name") != cfg.head.name:
        raise InputError(
            "ckpt_path", f"'{cfg.ckpt_path}' holds head '{head.get('name')}' but head.name is '{cfg.head.name}'"
        )
    if "loops" not in ck:
        raise InputError(
            "ckpt_path",
            f"'{cfg.ckpt_path}' holds no training state to resume ({head.get('name')} is fitted in one pass)",
        )
    if cfg.ckpt and Path(ck["base_ckpt"]).resolve() != Path(cfg.ckpt).resolve():
        raise InputError("ckpt_path", f"'{cfg.ckpt_path}' is a head of '{ck['base_ckpt']}', not of ckpt='{cfg.ckpt}'")
    if lost := lost_best_warning(ck, cfg.ckpt_path, MONITOR):  # RankingCheckpoint forgets it when restored
        rank_zero_warn(lost)


def train_head(cfg: DictConfig) -> dict | None:
    """Run `train.py stage=head` (module doc): fit the isotropy head on the frozen ranker, then test with and without.

    Returns the test results on the global-zero process, None on the others.
    """
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the seed is in config.yaml
    refuse_other_checkpoints(cfg)
    check_head_stage(cfg)  # from the checkpoints' headers, before the data
    dm = load_data(
        cfg, HeadDataModule, fit=True
    )  # read and validated before any weights are loaded or anything is written
    module = build_module(cfg)
    dm.tokenizer = module.pair_tokenizer
    cache = build_cache(cfg, module, dm)
    dm.vectors, dm.head_batch_size = cache.vectors(), int(cfg.head.batch_size)
    cfg = _trainer_for_head(cfg)
    closed_form = head_capabilities(cfg.head.name).fit == "closed_form"
    logger = build_logger(cfg, name=Path(cfg.output_dir).name)
    trainer = build_trainer(cfg, logger, checkpoints=not closed_form)  # one pass: no epochs to keep the best of
    if trainer.is_global_zero:
        save_config(cfg)
    if closed_form:
        module.head.fit_vectors(dm.vectors)
        if trainer.is_global_zero:
            save_head(module, Path(cfg.output_dir) / "checkpoints" / "head.ckpt")
        trainer.test(module, datamodule=dm, verbose=False)
    else:
        # data-dependent init of the flow's input scaling (ActNorm) from a seeded sample of the cache; a resumed run
        # then restores the trained values over it
        rows = np.sort(np.random.default_rng([cfg.seed, 5]).permutation(len(dm.vectors))[:65536])
        module.head.init_from(torch.from_numpy(np.asarray(dm.vectors[rows], dtype=np.float32)))
        with interruptible(trainer):
            trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path, weights_only=False)
            best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
            trainer.test(module, datamodule=dm, ckpt_path=best or None, verbose=False, weights_only=False)
    if not trainer.is_global_zero:
        return None
    return report_head_results(cfg, module, trainer.logger)


def load_with_head(cfg: DictConfig) -> LoadedRanker:
    """Load the ranker of `head_ckpt` with its head attached, on `ckpt` or else the head's recorded `base_ckpt`.

    Sets `cfg.model` and `cfg.head` to the checkpoints' own. A ranker checkpoint passed as `head_ckpt` is a one-line
    error before any weights are loaded.
    """
    if "base_ckpt" not in read_header(cfg.head_ckpt, "head_ckpt"):
        raise InputError(
            "head_ckpt",
            f"'{cfg.head_ckpt}' is not a head checkpoint (from train.py stage=head); pass ranker checkpoints as ckpt=",
        )
    loaded = load_ranker(cfg.head_ckpt, key="head_ckpt", base=cfg.ckpt or None)
    cfg.model, cfg.head = loaded.hparams["model"], loaded.hparams["head"]
    return loaded


def evaluate_with_head(cfg: DictConfig) -> dict | None:
    """Test a ranker with and without its isotropy head: `evaluate.py head_ckpt=HEAD.ckpt [ckpt=BASE.ckpt] data=...`.

    In- or out-of-distribution: the head was fit on its stage's training data, `data` may be any other collection.
    """
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the seed is in config.yaml
    dm = load_data(cfg)  # before any weights: bad data stops the run at once
    module = module_from_loaded(load_with_head(cfg), list(cfg.eval.measures))
    return evaluate_module(cfg, module, dm)
