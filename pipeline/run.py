"""What `train.py` and `evaluate.py` do, once: build the module, data and trainer, run, and write the results.

From a composed config: build the module, data and trainer, run Lightning, and write `metrics.json`, `per_query.json`,
`run.trec` and the resolved `config.yaml` into `output_dir` (every file written atomically, by global rank 0 only).

Jobs by config (every one `key=value` overrides, validated by the schemas of pipeline/config.py), selected and
checked by the job table of pipeline/jobs.py; each function below registers itself there with `@job(name)`:

- `train.py`: `finetune` (`stage=finetune`, the default): fine-tune; `head` (`stage=head`): an isotropy head on the
  frozen ranker (pipeline/head_stage.py); `export` (`stage=export ckpt=... output_dir=DIR`): the ranker (and head,
  with `head_ckpt=`) as a Hugging Face folder (pipeline/export.py).
- `evaluate.py`: `retrieve` (`retrieval=dense`): full ranking with a faiss index (retrieval/retrieve.py); `analysis`
  (`analysis=NAME`): an analysis (analyses/registry.py); `first_stage` (a first-stage `model`, `model=bm25`,
  retrieval/first_stage.py): its full-collection run over `model.split`; `evaluate_head` (`head_ckpt=`): the test
  metrics with and without an isotropy head; `evaluate`: the test metrics of `ckpt=` (re-ranking), or of the
  untrained `model`.

`TRAIN` and `EVALUATE` (`pipeline.jobs.Script`) run them for train.py and evaluate.py; `train` and `evaluate` are
the same as functions.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities import rank_zero_warn

from analyses.registry import run_analysis
from callbacks.checkpoint import lost_best, lost_best_warning
from callbacks.loggers import build_logger, log_results_table
from callbacks.preemption import interruptible
from core.checkpoints import check_same_ranker, read_checkpoint, read_header
from lightning_modules.loading import load_module
from lightning_modules.module import RankingModule
from metrics.results import print_table
from models.loading import load_ranker_weights
from pipeline.export import export
from pipeline.head_stage import evaluate_with_head, train_head
from pipeline.jobs import Script, job
from pipeline.stages import (
    MONITOR,
    build_trainer,
    evaluate_module,
    load_data,
    refuse_other_checkpoints,
    save_config,
    set_rerank_depths,
    test_results,
    write_results,
)
from retrieval.first_stage import first_stage
from retrieval.retrieve import retrieve


def init_weights(module: RankingModule, cfg: DictConfig) -> None:
    """Load the ranker's weights from another run's checkpoint (`init_ckpt=PATH`) into `module`.

    Transfer learning (position-bias paper Table 5: pre-train on one collection, fine-tune on another). Weights only:
    optimiser, schedule, step and data order start afresh. The checkpoint must hold the same ranker with the same shapes
    (model.name, backbone, ...). With `ckpt_path` too (a resumed fine-tuning run), the resumed weights replace these.
    """
    path = cfg.init_ckpt
    ckpt = read_checkpoint(path, "init_ckpt")
    check_same_ranker(ckpt, cfg, "init_ckpt", path)
    mismatch = f"'{path}' does not fit model '{cfg.model.name}' as configured"
    n = load_ranker_weights(module.ranker, ckpt["state_dict"], mismatch, "init_ckpt")
    print(f"init_ckpt: ranker weights from {path} ({n} tensors); optimiser and step start afresh")


@job("first_stage")
def evaluate_first_stage(cfg: DictConfig, model_from_cli: bool = False) -> dict:
    """Run a first-stage `model` (`model=bm25`): its full-collection run, into the same files as any evaluation.

    The model's `retrieval.first_stage.FIRST_STAGE` entry runs it; its run covers `model.split` (default test).
    """
    retriever = first_stage(cfg.model.name)
    after = retriever.build(cfg)  # config.yaml with the results
    print_table({"value": after}, title=f"{cfg.model.get('split', 'test')} metrics")
    log_evaluation(cfg, after)
    return after


def log_evaluation(cfg: DictConfig, after: dict) -> None:
    """Log a job's measures (`test/<measure>` at step 0 and the results table) to the configured logger, if any.

    As any evaluation (job type eval), so that a grid's BM25 row or a full-ranking run sits on the dashboard beside
    the re-ranking tests; called after the files are written: a logging failure cannot lose the results.
    """
    logger = build_logger(cfg, name=f"eval-{Path(cfg.output_dir).name}")
    if logger:
        measures = {k: float(v) for k, v in after.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        logger.log_metrics({f"test/{k}": v for k, v in measures.items()}, step=0)
        log_results_table(logger, {"test": measures})
        logger.save()
        if hasattr(logger, "log_image"):
            logger.experiment.finish()


@job("export")
def export_stage(cfg: DictConfig, model_from_cli: bool = False) -> Path:
    """Export a checkpoint as a Hugging Face folder: `train.py stage=export ckpt=<ranker checkpoint> output_dir=DIR`.

    Or `head_ckpt=<head checkpoint>`: the Hugging Face folder of pipeline/export.py, written into `output_dir` (which
    must be new or empty).
    """
    out = export(cfg, cfg.output_dir)
    print(f"exported to {out}")
    return out


@job("retrieve")
def evaluate_retrieval(cfg: DictConfig, model_from_cli: bool) -> dict:
    """Run `retrieval=dense`: full ranking over the collection (retrieval/retrieve.py).

    The resolved config.yaml is written with its results; the measures go to the configured logger too.
    """
    after = retrieve(cfg, model_from_cli)  # None on a rank > 0 of a split encoding: rank 0 writes the results
    if after is not None:
        log_evaluation(cfg, after)
    return after


def train(cfg: DictConfig) -> dict | Path | None:
    """Run train.py's job for `cfg` (`TRAIN`: pipeline/jobs.py selects and checks it), holding `output_dir`'s lock."""
    return TRAIN(cfg, False)


@job("head")
def stage_head(cfg: DictConfig, model_from_cli: bool = False) -> dict | None:
    """Run `train.py stage=head`: an isotropy head on the frozen fine-tuned ranker (pipeline/head_stage.py)."""
    return train_head(cfg)


@job("finetune")
def finetune(cfg: DictConfig, model_from_cli: bool = False) -> dict | None:
    """Run `train.py` (`stage=finetune`): fine-tune `model`, test before and after, and write the results.

    Returns the test metrics on the global-zero process, None on the others.
    """
    refuse_other_checkpoints(cfg)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the seed is in config.yaml
    dm = load_data(
        cfg, fit=True
    )  # before any weights: bad data stops the run at once (reading it draws no global random numbers)
    start_step = 0
    if cfg.ckpt_path:  # its header was checked before the data (pipeline/jobs.check_files)
        # the header (no tensor read) holds the step and the best checkpoint's path; Lightning loads the whole file
        # once more to resume, so it is read in full here only when the best is lost (the warning quotes its score)
        resumed = read_header(cfg.ckpt_path, "ckpt_path")
        start_step = int(resumed.get("global_step", 0))
        if lost_best(resumed) is not None:
            full = read_checkpoint(cfg.ckpt_path, "ckpt_path")
            rank_zero_warn(lost_best_warning(full, cfg.ckpt_path, MONITOR))  # RankingCheckpoint forgets it on restore
            del full
    module = RankingModule(
        OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.optim), list(cfg.eval.measures)
    )
    if cfg.init_ckpt:
        init_weights(module, cfg)
    set_rerank_depths(module, cfg)
    dm.tokenizer = module.pair_tokenizer
    if 0 <= cfg.trainer.max_steps <= start_step:  # Lightning would stop at once without a word
        rank_zero_warn(
            f"nothing will be trained: trainer.max_steps={cfg.trainer.max_steps}"
            + (
                f" and ckpt_path is already at step {start_step}; raise trainer.max_steps to train on"
                if cfg.ckpt_path
                else ""
            )
        )
    steps, every = cfg.trainer.max_steps, cfg.trainer.log_every_n_steps
    if cfg.logger.name != "none" and not cfg.ckpt_path and 0 < steps < every:
        # in place of Lightning's warning about short epochs (pipeline/quiet.py): its step count runs across epochs,
        # so only a run shorter than the interval logs no training scalar
        rank_zero_warn(
            f"trainer.log_every_n_steps={every} is more than the {steps} steps of trainer.max_steps: no train/ scalar "
            f"will be logged; set trainer.log_every_n_steps={steps} or less to log them"
        )
    logger = build_logger(cfg, name=Path(cfg.output_dir).name)
    trainer = build_trainer(cfg, logger, checkpoints=True)
    if trainer.is_global_zero:
        save_config(cfg)
    with interruptible(trainer):
        if cfg.eval.before_training and not cfg.ckpt_path:
            trainer.test(module, datamodule=dm, verbose=False)
            # saved in every checkpoint from here on, so that a resumed run's metrics.json holds it too
            trainer.checkpoint_callback.before_training = test_results(module)
        if (
            cfg.eval.start_candidate and not cfg.ckpt_path and cfg.trainer.limit_val_batches != 0
        ):  # 0: no validation, no candidate
            start = trainer.validate(module, datamodule=dm, verbose=False)[0][MONITOR]
            trainer.checkpoint_callback.add_start_candidate(trainer, start)
        # Our checkpoints carry RNG states (numpy arrays), which the weights-only unpickler refuses.
        trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path, weights_only=False)
        before = trainer.checkpoint_callback.before_training  # resumed: restored from ckpt_path
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if best and best == trainer.checkpoint_callback.start_model_path:
            rank_zero_warn(
                f"no validation beat the model before fine-tuning ({MONITOR} at step 0 stays the best): "
                f"the test uses the starting weights, {Path(best).name} (eval.start_candidate=false tests the best "
                f"fine-tuned checkpoint instead)"
            )
        curve = trainer.checkpoint_callback.curve()
        trainer.test(module, datamodule=dm, ckpt_path=best or None, verbose=False, weights_only=False)
    if not trainer.is_global_zero:
        return None
    after = write_results(cfg, module, before, curve=curve)
    log_results_table(
        trainer.logger,
        {"before training": before, "after training": after} if before else {"after training": after},
        extra={"best_step": curve["best_step"]} if curve is not None else None,
    )
    print_table({"before training": before, "after": after} if before else {"value": after})
    return after


def evaluate(cfg: DictConfig, model_from_cli: bool = False) -> dict | None:
    """Run evaluate.py's job for `cfg` (`EVALUATE`: pipeline/jobs.py selects and checks it), holding the lock.

    `model_from_cli`: the command line picked the model, so a checkpoint's ranker must match it.
    """
    return EVALUATE(cfg, model_from_cli)


@job("analysis")
def analysis(cfg: DictConfig, model_from_cli: bool = False) -> dict:
    """Run `evaluate.py analysis=NAME`: the analysis registered as NAME (analyses/registry.py)."""
    return run_analysis(cfg, model_from_cli)


@job("evaluate_head")
def evaluate_head(cfg: DictConfig, model_from_cli: bool = False) -> dict | None:
    """Run `evaluate.py head_ckpt=HEAD.ckpt [ckpt=BASE.ckpt]`: the test metrics with and without the head."""
    return evaluate_with_head(cfg)


@job("evaluate")
def evaluate_checkpoint(cfg: DictConfig, model_from_cli: bool = False) -> dict | None:
    """Run `evaluate.py [ckpt=...]`: the re-ranking test of `ckpt` (or of the untrained `model`), written as any run.

    Returns the test metrics on the global-zero process, None on the others.
    """
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the seed is in config.yaml
    dm = load_data(cfg)  # before any weights: bad data stops the run at once
    module = load_module(cfg, model_from_cli)  # a checkpoint, a folder of `train.py stage=export`, or untrained
    return evaluate_module(cfg, module, dm)


# after every @job above: these run the job table's entries
TRAIN = Script("train.py")
EVALUATE = Script("evaluate.py")
