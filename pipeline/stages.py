"""The steps every run shares (train.py, evaluate.py, the head stage).

Read the data before anything is written, build the Lightning trainer with this pipeline's callbacks, test a module, and
write its result directory and resolved config into `output_dir` (atomically, by global rank 0 only).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import LearningRateMonitor
from pytorch_lightning.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler
from pytorch_lightning.utilities import rank_zero_warn

from callbacks.atomic_io import AtomicCheckpointIO
from callbacks.ats import ATSCallback
from callbacks.checkpoint import RankingCheckpoint
from callbacks.isotropy import IsotropyCallback
from callbacks.loggers import build_logger, head_rows, log_results_table
from callbacks.preemption import Preemption, no_broadcast_in_sigterm
from callbacks.progress import LoopPhases, RankingProgressBar
from callbacks.rank_watch import RankWatchCallback
from core.errors import InputError
from core.io import OUTPUT_FOLDERS, AtomicDir, atomic_open, check_cache_folders, check_subfolders, check_writable
from core.precision import set_matmul_precision, warn_emulated_bf16
from core.progress import on_terminal
from core.ranks import global_rank_zero
from datamodules.bm25 import no_candidates_warning, stemmer_name
from datamodules.config import empty_split
from datamodules.datamodule import RankingDataModule
from datamodules.sources import data_config
from lightning_modules.module import RankingModule
from metrics.rerank_depth import SELECT_BY
from metrics.results import print_table, write_result_dir
from models.rankers.backbone import tokenizer_record
from pipeline.config import PIPELINE_TRAINER_KEYS

MONITOR = f"val/{SELECT_BY}"  # the checkpoint with the best validation nDCG@10 is the one tested


def build_trainer(cfg: DictConfig, logger, checkpoints: bool) -> pl.Trainer:
    """Build the Lightning trainer of `cfg.trainer` with this pipeline's callbacks and atomic checkpoint writes.

    Callbacks: isotropy (with the `paper` protocol when `eval.isotropy_paper`), ATS when `eval.ats_passages` > 0,
    the learning-rate monitor with a logger, the progress bar; with `checkpoints`, RankingCheckpoint (monitoring
    `val/ndcg_cut_10`) and preemption handling.
    """
    t = OmegaConf.to_container(cfg.trainer)
    own = {k: t.pop(k) for k in PIPELINE_TRAINER_KEYS if k in t}  # applied below, not Lightning's
    # files written while the job runs go to its attempt folder: published with its results, or left there
    dump = attempt_dir(cfg) / "isotropy_batches" if cfg.eval.dump_isotropy else None
    callbacks: list = [
        IsotropyCallback(
            seed=int(cfg.seed),
            batch_pairs=int(cfg.eval.isotropy_batch_pairs) if cfg.eval.isotropy_paper else 0,
            dump_dir=dump,
            max_batches=cfg.eval.isotropy_max_batches,
            sample_seed=int(cfg.eval.isotropy_sample_seed),
            figure_dir=attempt_dir(cfg),
        ),
        RankWatchCallback(),  # under DDP: another rank's death ends this one with one line (core/ranks.py)
    ]
    if cfg.eval.ats_passages > 0:
        callbacks.append(ATSCallback(cfg.eval.ats_passages, cfg.eval.ats_max_occurrences, cfg.seed, mats=cfg.eval.mats))
    if checkpoints:
        callbacks += [RankingCheckpoint(str(Path(cfg.output_dir) / "checkpoints"), monitor=MONITOR), Preemption()]
    if logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if t.get("enable_progress_bar"):
        if on_terminal():
            callbacks.append(RankingProgressBar())
        else:  # a log: the loops report as phases, one line each (a Rich bar there is silent until it ends)
            t["enable_progress_bar"] = False
            callbacks.append(LoopPhases())
    if t.get("limit_val_batches") is None:
        t.pop("limit_val_batches", None)
    trainer = pl.Trainer(
        **t,
        logger=logger,
        callbacks=callbacks,
        profiler=build_profiler(own.get("profiler"), attempt_dir(cfg) / "profile"),
        default_root_dir=cfg.output_dir,
        # Our samplers shard by rank themselves (no padding, resumable); Lightning must not replace them.
        use_distributed_sampler=False,
        enable_checkpointing=checkpoints,
        plugins=[AtomicCheckpointIO()],
    )
    no_broadcast_in_sigterm(trainer)  # a SIGTERM under DDP must not hang the ranks (callbacks/preemption.py)
    # before fit or test set the device up, where Lightning hints at this setting on CUDA
    set_matmul_precision(own.get("float32_matmul_precision", "auto"), trainer.strategy.root_device.type)
    if str(t["precision"]).startswith("bf16") and trainer.is_global_zero:
        warn_emulated_bf16("trainer.precision", t["precision"], trainer.strategy.root_device.type, "32-true")
    return trainer


def build_profiler(kind: str | None, folder: Path):
    """Lightning's profiler of `trainer.profiler` writing `<stage>-profile[-<rank>].txt` into `folder`, or None.

    Each report is a file of the run (not the console's end), one per stage (fit, test) and rank; the PyTorch
    profiler's table only: its Chrome traces run to hundreds of megabytes.
    """
    if kind is None:
        return None
    if kind == "simple":
        return SimpleProfiler(dirpath=folder, filename="profile")
    if kind == "advanced":
        return AdvancedProfiler(dirpath=folder, filename="profile", line_count_restriction=40)
    # sorted by the host's time (Lightning offers no sort by self time; the table has that column too), the hooks'
    # record_functions first; on a GPU, CUDA's columns say what the device did meanwhile; Lightning's schedule: steps
    # 3-5 of each stage
    return PyTorchProfiler(
        dirpath=folder,
        filename="profile",
        export_to_chrome=False,
        row_limit=40,
        sort_by_key="cpu_time_total",
        record_module_names=False,
    )


# the splits a re-ranking test reads (of the data, besides the documents): its test split alone
TEST_SPLITS = ("test",)


def load_data(cfg: DictConfig, cls: type = RankingDataModule, fit: bool = False) -> RankingDataModule:
    """Return the data module with its data read and validated, before any weights are loaded or anything written.

    Nothing is written into `output_dir` yet: bad data stops the run at once with one line and leaves no partial output
    (no config.yaml, no wandb/ folder). Reading needs no tokenizer; the loaders do: set `dm.tokenizer =
    module.pair_tokenizer` once the module is built. `fit`: the run trains, so the training and validation splits must
    not be empty either.
    """
    dm = cls(data_config(cfg), None, cfg.seed, cfg.eval.probe_queries, cfg.eval.probe_docs)
    dm.splits = None if fit else TEST_SPLITS
    dm.setup()
    # e.g. a fold or fraction that leaves no judged query, or no BM25 candidate for any of them; without this the run
    # would fail later, inside Lightning, or (test) train and then have no test results to write
    test = dm.eval_splits["test"]
    if len(test.pairs) == 0:
        raise empty_split(
            dm.cfg,
            "test",
            f"has no (judged query, candidate) pair to score ({len(test.qids)} judged queries with candidates)",
        )
    if fit and not dm.triples:
        raise empty_split(
            dm.cfg,
            "train",
            f"has no training triple to train on ({len(dm.dataset.split('train').qrels)} judged queries)",
        )
    val = dm.eval_splits["val"]
    if fit and len(val.pairs) == 0:  # validation picks the checkpoint that is tested
        raise empty_split(
            dm.cfg,
            "val",
            f"has no (judged query, candidate) pair to validate on ({len(val.qids)} judged queries with candidates)",
        )
    for name, split in dm.eval_splits.items():
        scored = set(split.pairs[:, 0].tolist())
        empty = [q for i, q in enumerate(split.qids) if i not in scored and any(g > 0 for g in split.qrels[q].values())]
        if empty:
            where = f"data '{cfg.data.source}', split '{name}'"
            if dm.dataset.split(name).candidates is not None:  # a given run (data.<split>_run), not BM25
                rank_zero_warn(no_candidates_warning(where, empty, why="the given run ranks no document for it"))
            else:
                rank_zero_warn(no_candidates_warning(where, empty))
    return dm


def check_outputs(cfg: DictConfig) -> None:
    """Check, before any data or model is loaded, that the job's output folders are writable.

    output_dir and data.cache_dir (and retrieval.index_dir) take a probe file (core.io.check_writable), so a folder
    the job cannot write stops it at once with one line.
    """
    if not global_rank_zero():
        return
    check_writable(cfg.output_dir, "output_dir")
    check_subfolders(cfg.output_dir, OUTPUT_FOLDERS, "output_dir")
    cache = cfg.data.get("cache_dir") if cfg.get("data") is not None else None
    if cache:
        check_writable(cache, "data.cache_dir")
        check_cache_folders(cache)
    index_dir = (
        cfg.retrieval.get("index_dir") if cfg.get("retrieval") is not None and cfg.retrieval.name != "none" else None
    )
    if index_dir:
        check_writable(Path(index_dir).parent, "retrieval.index_dir")
        AtomicDir(index_dir).check()  # a file or a foreign folder there: refused now, not after the encoding


def refuse_other_checkpoints(cfg: DictConfig) -> None:
    """Refuse an output_dir that holds checkpoints when this run does not resume them (`ckpt_path`).

    Two runs' checkpoints in one folder would make "best" and "last" ambiguous. Checked by global rank 0 only: a DDP
    rank that Lightning starts later runs the script again, and would find rank 0's own first checkpoint (the head
    stage's closed-form head is saved before the other ranks are started).
    """
    if global_rank_zero() and not cfg.ckpt_path and any((Path(cfg.output_dir) / "checkpoints").glob("*.ckpt")):
        raise InputError(
            "output_dir",
            f"'{cfg.output_dir}' already holds checkpoints; resume a run with ckpt_path=<its last.ckpt>, or choose "
            "another output_dir (or delete that one to start again)",
        )


# output folder (resolved) -> the folder of this job's attempt (`attempt_dir`)
_ATTEMPT: dict[Path, Path] = {}


def begin_attempt(cfg: DictConfig) -> None:
    """Forget an earlier job's attempt folder for `output_dir` in this process (a grid runs many jobs in one)."""
    _ATTEMPT.pop(Path(cfg.output_dir).resolve(), None)


def attempt_dir(cfg: DictConfig) -> Path:
    """Return the folder where this job writes its files until its results are published as one set.

    `output_dir` itself when it holds no result of an earlier attempt (no config.yaml, no metrics.json); otherwise
    `attempts/<n>/`, so that the earlier config.yaml, results and figures stay as they were until `write_results`
    publishes the new set (a continued run that dies leaves them unchanged, its own config and figures in
    `attempts/<n>/` as the record of the attempt). Decided once per job.
    """
    out = Path(cfg.output_dir)
    key = out.resolve()
    if key not in _ATTEMPT:
        if not (out / "config.yaml").exists() and not (out / "metrics.json").exists():
            _ATTEMPT[key] = out
        else:
            n = 1 + max((int(d.name) for d in (out / "attempts").glob("*") if d.name.isdigit()), default=0)
            _ATTEMPT[key] = out / "attempts" / str(n)
    return _ATTEMPT[key]


def save_config(cfg: DictConfig) -> Path:
    """Write the resolved config at a job's start into its `attempt_dir` and return its path."""
    path = attempt_dir(cfg) / "config.yaml"
    with atomic_open(path) as f:
        f.write(OmegaConf.to_yaml(cfg))
    return path


def result_config(cfg: DictConfig) -> dict:
    """write_result_dir's keywords that put `cfg` and the attempt's own files into the result set.

    config.yaml is written anew; an attempt folder's figures and folders (the isotropy figures, the isotropy dump)
    join the set and leave the attempt folder, which is removed once empty.
    """
    out = Path(cfg.output_dir)
    attempt = _ATTEMPT.pop(out.resolve(), out)
    kw: dict = {"config": OmegaConf.to_yaml(cfg)}
    if attempt.resolve() == out.resolve() or not attempt.is_dir():
        return kw
    own = [p for p in sorted(attempt.iterdir()) if p.name != "config.yaml" and not p.name.startswith(".")]
    kw["files"] = {p.name: p for p in own if p.is_file()}
    kw["folders"] = {p.name: partial(os.replace, p) for p in own if p.is_dir()}
    kw["retire"] = (attempt / "config.yaml", *kw["files"].values())
    return kw


def write_results(
    cfg: DictConfig,
    module: RankingModule,
    before: dict | None = None,
    before_key: str = "before_training",
    curve: dict | None = None,
) -> dict:
    """Write the test results of `module` into `output_dir` (metrics/results.py) and return its metrics.

    `before`: a run's results before training or without a head, kept in metrics.json under `before_key`; `curve`: a
    fine-tuning run's validations (RankingCheckpoint.curve), written as validation.json, with the tested checkpoint's
    step as `best_step`.
    """
    test = module.results["test"]
    metrics = test_results(module)
    doc = dict(metrics)
    if before is not None:
        doc[before_key] = before
    if curve is not None:
        doc["best_step"] = curve["best_step"]
    write_result_dir(
        cfg.output_dir,
        doc,
        test["per_query"],
        test["run"],
        tag=f"{cfg.model.name}",
        extra={"validation.json": curve} if curve is not None else None,
        # the BM25 stemmer made the candidates and negatives unless the data gave them; recorded either way
        versions={
            "tokenizer": tokenizer_record(cfg.model.backbone, module.ranker.tokenizer),
            "stemmer": stemmer_name(),
        },
        **result_config(cfg),
    )
    return metrics


def test_results(module: RankingModule) -> dict:
    """Return the module's test metrics: the ranking measures, the isotropy measures and ATS / MATS, in one dict."""
    test = module.results["test"]
    return {**test["metrics"], **test.get("isotropy", {}), **test.get("ats", {})}


def set_rerank_depths(module: RankingModule, cfg: DictConfig) -> None:
    """Set `eval.rerank_depths` on the module.

    Validation chooses the re-ranking depth among them, a test applies the chosen one (metrics/rerank_depth.py);
    null: every candidate is re-ranked.
    """
    depths = cfg.eval.get("rerank_depths")
    module.rerank_depths = tuple(int(d) for d in depths) if depths else None


def evaluate_module(cfg: DictConfig, module: RankingModule, dm: RankingDataModule) -> dict | None:
    """Test a loaded module on the data `dm` read by load_data and write the run's files.

    A HeadModule's results hold "Ft" (no head) under `before_head`. Returns the test metrics on the global-zero
    process, None on the others.
    """
    dm.tokenizer = module.pair_tokenizer
    set_rerank_depths(module, cfg)
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
        print_table({"value": after})
        return after
    return report_head_results(cfg, module, trainer.logger)


def report_head_results(cfg: DictConfig, module, logger) -> dict:
    """Report a HeadModule's test results into `output_dir`, the logger and the console; return "Ft -> head".

    "Ft" (the ranker without the head) under `before_head`, "Ft -> head" as the run's metrics.
    """
    before = module.results_without_head()
    after = write_results(cfg, module, before, before_key="before_head")
    log_results_table(logger, head_rows(before, after, cfg.head.name))
    print_table({"Ft (no head)": before, f"Ft -> {cfg.head.name}": after})
    return after
