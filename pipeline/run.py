"""What `train.py` and `evaluate.py` do, once: build the module, data and trainer from a composed config, run
Lightning, and write `metrics.json`, `per_query.json`, `run.trec` and the resolved `config.yaml` into
`output_dir` (every file written atomically, by global rank 0 only)."""
from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf

from callbacks.atomic_io import AtomicCheckpointIO
from callbacks.ats import ATSCallback
from callbacks.checkpoint import RankingCheckpoint
from callbacks.isotropy import IsotropyCallback
from callbacks.loggers import build_logger, head_rows, log_results_table
from callbacks.preemption import Preemption, interruptible
from core.checkpoints import check_same_ranker, read_checkpoint
from core.errors import InputError
from core.io import atomic_open, write_json
from datamodules.datamodule import RankingDataModule
from datamodules.sources import data_config
from lightning_modules.loading import load_module
from lightning_modules.module import RankingModule
from lightning_modules.rankers import UNTRAINED
from metrics.trec import write_trec_run

MONITOR = "val/ndcg_cut_10"


def build_trainer(cfg: DictConfig, logger, checkpoints: bool) -> pl.Trainer:
    t = OmegaConf.to_container(cfg.trainer)
    callbacks: list = [IsotropyCallback(seed=int(cfg.seed))]
    if cfg.eval.ats_passages > 0:
        callbacks.append(ATSCallback(cfg.eval.ats_passages, cfg.eval.ats_max_occurrences, cfg.seed))
    if checkpoints:
        callbacks += [RankingCheckpoint(str(Path(cfg.output_dir) / "checkpoints"), monitor=MONITOR), Preemption()]
    if logger:
        from pytorch_lightning.callbacks import LearningRateMonitor

        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if t.get("enable_progress_bar"):
        from pytorch_lightning.callbacks import RichProgressBar

        callbacks.append(RichProgressBar())
    if t.get("limit_val_batches") is None:
        t.pop("limit_val_batches", None)
    return pl.Trainer(
        **t, logger=logger, callbacks=callbacks, default_root_dir=cfg.output_dir,
        # Our samplers shard by rank themselves (no padding, resumable); Lightning must not replace them.
        use_distributed_sampler=False, enable_checkpointing=checkpoints, plugins=[AtomicCheckpointIO()],
    )


def init_weights(module: RankingModule, cfg: DictConfig) -> None:
    """`init_ckpt=PATH`: the ranker's weights from another run's checkpoint (transfer learning, position-bias paper
    Table 5: pre-train on one collection, fine-tune on another). Weights only: optimiser, schedule, step and data
    order start afresh. The checkpoint must hold the same ranker with the same shapes (model.name, backbone, ...).
    With `ckpt_path` too (a resumed fine-tuning run), the resumed weights replace these."""
    path = cfg.init_ckpt
    ckpt = read_checkpoint(path, "init_ckpt")
    check_same_ranker(ckpt, cfg, "init_ckpt", path)
    state = {k: v for k, v in ckpt["state_dict"].items() if k.startswith("ranker.")}
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch: another backbone or compress_dim
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e).splitlines()[0])
        raise InputError("init_ckpt", f"'{path}' does not fit model '{cfg.model.name}' as configured ({first})") from e
    missing = [k for k in missing if k.startswith("ranker.")]
    if missing or unexpected:
        raise InputError("init_ckpt", f"'{path}' does not fit model '{cfg.model.name}' as configured (missing {missing[:3]}, unexpected {unexpected[:3]})")
    print(f"init_ckpt: ranker weights from {path} ({len(state)} tensors); optimiser and step start afresh")


def load_data(cfg: DictConfig, module: RankingModule, cls: type = RankingDataModule) -> RankingDataModule:
    """The data module with its data read and validated, before anything is written into `output_dir`: bad data
    stops the run with one line and leaves no partial output (no config.yaml, no wandb/ folder)."""
    dm = cls(data_config(cfg), module.pair_tokenizer, cfg.seed, cfg.eval.probe_queries, cfg.eval.probe_docs)
    dm.setup()
    test = dm.eval_splits["test"]
    if len(test.pairs) == 0:
        # e.g. a fold or fraction that leaves no judged test query, or no BM25 candidate for any of them; without
        # this the run would train and then fail with no test results to write
        raise InputError(f"data '{cfg.data.source}', split 'test'", f"has no (judged query, candidate) pair to score ({len(test.qids)} judged queries with candidates); check the split settings (test_fraction, folds) and data.candidate_depth")
    return dm


def evaluate_untrained(cfg: DictConfig) -> dict:
    """`model=bm25`: full-collection BM25 over the test split, into the same files as any evaluation."""
    from datamodules.bm25 import BM25Params
    from retrieval.bm25 import run_bm25

    if cfg.ckpt:
        raise InputError("ckpt", f"model '{cfg.model.name}' takes no checkpoint")
    m = cfg.model
    after = run_bm25(cfg, "test", int(m.depth), BM25Params(m.method, float(m.k1), float(m.b)))
    save_config(cfg)
    print_table(after)
    # logged like any evaluation (job type eval), so a grid's BM25 row sits on the dashboard beside the trained rows;
    # after the files are written: a logging failure cannot lose the results
    logger = build_logger(cfg, name=f"eval-{Path(cfg.output_dir).name}")
    if logger:
        logger.log_metrics({f"test/{k}": float(v) for k, v in after.items()}, step=0)
        log_results_table(logger, {"test": after})
        logger.save()
        if hasattr(logger, "log_image"):
            logger.experiment.finish()
    return after


def save_config(cfg: DictConfig) -> None:
    with atomic_open(Path(cfg.output_dir) / "config.yaml") as f:
        f.write(OmegaConf.to_yaml(cfg))


def write_results(cfg: DictConfig, module: RankingModule, before: dict | None = None, before_key: str = "before_training") -> dict:
    out = Path(cfg.output_dir)
    test = module.results["test"]
    metrics = {**test["metrics"], **test.get("isotropy", {}), **test.get("ats", {})}
    doc = dict(metrics)
    if before is not None:
        doc[before_key] = before
    # metrics.json last: its presence marks a finished run (experiments.py skips such cells)
    write_json(out / "per_query.json", test["per_query"])
    write_trec_run(out / "run.trec", test["run"], tag=f"{cfg.model.name}")
    write_json(out / "metrics.json", doc)
    return metrics


def print_table(after: dict, before: dict | None = None, before_title: str = "before training", after_title: str = "after") -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="test metrics")
    table.add_column("metric")
    if before is not None:
        table.add_column(before_title, justify="right")
    table.add_column(after_title if before is not None else "value", justify="right")
    for k, v in after.items():
        row = [k] + ([f"{before[k]:.4f}" if k in before else "-"] if before is not None else []) + [f"{v:.4f}"]
        table.add_row(*row)
    Console().print(table)


def _test_results(module: RankingModule) -> dict:
    test = module.results["test"]
    return {**test["metrics"], **test.get("isotropy", {}), **test.get("ats", {})}


def train(cfg: DictConfig) -> dict | None:
    if cfg.stage == "head":
        if cfg.init_ckpt:
            raise InputError("init_ckpt", "initialises fine-tuning (stage=finetune); the head stage takes the fine-tuned ranker as ckpt=")
        from pipeline.head_stage import train_head

        return train_head(cfg)
    if cfg.head.name != "none":
        raise InputError("head", f"'{cfg.head.name}' is trained after fine-tuning, on the frozen ranker: `python train.py stage=head ckpt=<fine-tuned checkpoint> head={cfg.head.name}`")
    if cfg.model.name in UNTRAINED:
        raise InputError("model", f"'{cfg.model.name}' has nothing to train; evaluate it with `python evaluate.py model={cfg.model.name} data=...`")
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.ckpt_path:
        resumed = read_checkpoint(cfg.ckpt_path, "ckpt_path")
        if "base_ckpt" in resumed:
            raise InputError("ckpt_path", f"'{cfg.ckpt_path}' is a head checkpoint (from stage=head); resume it with stage=head ckpt={resumed['base_ckpt']}")
        check_same_ranker(resumed, cfg, "ckpt_path", cfg.ckpt_path)
        del resumed
    elif any((Path(cfg.output_dir) / "checkpoints").glob("*.ckpt")):
        # Two runs' checkpoints in one folder would make "best" and "last" ambiguous.
        raise InputError("output_dir", f"'{cfg.output_dir}' already holds checkpoints; resume with ckpt_path=... or choose another output_dir")
    module = RankingModule(OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.optim), list(cfg.eval.measures))
    if cfg.init_ckpt:
        init_weights(module, cfg)
    dm = load_data(cfg, module)
    logger = build_logger(cfg, name=Path(cfg.output_dir).name)
    trainer = build_trainer(cfg, logger, checkpoints=True)
    if trainer.is_global_zero:
        save_config(cfg)
    before = None
    with interruptible(trainer):
        if cfg.eval.before_training and not cfg.ckpt_path:
            trainer.test(module, datamodule=dm, verbose=False)
            before = _test_results(module)
        # Our checkpoints carry RNG states (numpy arrays), which the weights-only unpickler refuses.
        trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path, weights_only=False)
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        trainer.test(module, datamodule=dm, ckpt_path=best or None, verbose=False, weights_only=False)
    if not trainer.is_global_zero:
        return None
    after = write_results(cfg, module, before)
    log_results_table(trainer.logger, {"before training": before, "after training": after} if before else {"after training": after})
    print_table(after, before)
    return after


def evaluate(cfg: DictConfig, model_from_cli: bool) -> dict | None:
    if cfg.analysis.name != "none":
        from analyses.registry import run_analysis

        return run_analysis(cfg, model_from_cli)
    if cfg.model.name in UNTRAINED:
        return evaluate_untrained(cfg)
    if cfg.head_ckpt:
        from pipeline.head_stage import evaluate_with_head

        return evaluate_with_head(cfg)
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.ckpt and Path(cfg.ckpt).is_dir():  # a folder from `python -m pipeline.export`
        from pipeline.export import load_exported

        module = load_exported(cfg.ckpt, list(cfg.eval.measures))
        if model_from_cli:
            check_same_ranker({"hyper_parameters": module.hparams}, cfg, "ckpt", cfg.ckpt)
        cfg.model = module.hparams["model"]
        if "head" in module.hparams:
            cfg.head = module.hparams["head"]
    else:
        module = load_module(cfg, model_from_cli)
    return evaluate_module(cfg, module)


def evaluate_module(cfg: DictConfig, module: RankingModule) -> dict | None:
    """Test a loaded module on `cfg.data` and write the run's files; a HeadModule's results hold "Ft" (no head)
    under `before_head`."""
    dm = load_data(cfg, module)
    logger = build_logger(cfg, name=f"eval-{Path(cfg.output_dir).name}")
    trainer = build_trainer(cfg, logger, checkpoints=False)
    if trainer.is_global_zero:
        save_config(cfg)
    trainer.test(module, datamodule=dm, verbose=False)
    if not trainer.is_global_zero:
        return None
    if not hasattr(module, "results_without_head"):
        after = write_results(cfg, module)
        log_results_table(trainer.logger, {"test": after})
        print_table(after)
        return after
    before = module.results_without_head()
    after = write_results(cfg, module, before, before_key="before_head")
    log_results_table(trainer.logger, head_rows(before, after, cfg.head.name))
    print_table(after, before, before_title="Ft (no head)", after_title=f"Ft -> {cfg.head.name}")
    return after
