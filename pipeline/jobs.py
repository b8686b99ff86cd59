"""The job table: which job `train.py` or `evaluate.py` runs for a config, what each job takes, and how it is run.

| job | script | selected by | top-level keys it takes |
|---|---|---|---|
| `export` | train.py | `stage=export` | `stage`, `ckpt`, `head_ckpt` |
| `head` | train.py | `stage=head` | `stage`, `ckpt`, `ckpt_path` |
| `finetune` | train.py | `stage=finetune` (the default) | `stage`, `ckpt_path`, `init_ckpt` |
| `retrieve` | evaluate.py | `retrieval` other than `none` | `ckpt` |
| `analysis` | evaluate.py | `analysis` other than `none` | `ckpt` |
| `first_stage` | evaluate.py | a first-stage `model` (`model=bm25`) | none |
| `evaluate_head` | evaluate.py | `head_ckpt` set | `head_ckpt`, `ckpt` |
| `evaluate` | evaluate.py | anything else: the re-ranking test of `ckpt` or of the untrained `model` | `ckpt` |

`TABLE` declares each job (a `Job`): its script, its selection rule (`When`), the dataclass of the top-level keys it
takes (its fields are `pipeline.config.RunConfig`'s), the config groups it reads, what it needs (`Need`) and why it
refuses what a user may think it takes. The function that runs a job registers itself in `JOBS` (a
`core.registry.Registry`) with the `job(name)` decorator (pipeline/run.py): its entry holds the name, that function
(`build(cfg, model_from_cli)`), the keys dataclass (`schema`) and the `Job` (`capabilities`).

Selection (`select`): of the script's jobs, the first in the table's order whose `When` holds; the order is the
precedence (`retrieval=dense head_ckpt=...` selects `retrieve`, which then refuses `head_ckpt`). Check (`check`): a
top-level key of `KEYS`, or an optional group of `OPTIONAL_GROUPS` (off at `none`), that the job does not take and
that is set is one `InputError` naming the key and the job and saying which job, of which script, takes it; then
the job's needs. Both read the config only (no file, no model), so `--dry-run` checks them too (`Script.check`).

Unread keys (`unread`): of the groups every job composes (`data`, `trainer`, `logger`, `optim`, `eval`), a job reads
only those in its `groups`, and of those maybe not every key (`Job.unread`: evaluate.py runs no training loop, so
`trainer.max_steps` and every `optim` key do nothing there; the head stage trains `head.epochs` epochs whatever
`trainer.max_steps` says; the data keys of a split it does not read, `Job.splits` against the source's
`DataConfig.split_keys`: evaluate.py reads the test split, not tsv's `train_triples`). Such a key or group given on the
command line is one `InputError` saying why, rather than a run that silently did not apply it. The command line only: an
experiment YAML serves train.py and evaluate.py alike, and a grid's overrides serve all its cells (it passes each cell
the ones its job reads, `applied`). `model` keys are checked against the checkpoint's ranker instead (`check_files`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from analyses.registry import analysis_options, check_analysis
from core.checkpoints import check_same_ranker, read_header
from core.devices import check_accelerator, check_device
from core.errors import InputError
from core.inputs import check_input_file, declared_inputs
from core.lock import output_dir_lock
from core.precision import check_fp16_device
from core.registry import Registry
from datamodules.config import TRAINING_ONLY, split_keys_unread
from datamodules.sources import data_config
from lightning_modules.module import OptimConfig
from models.loading import recorded_model
from models.rankers.backbone import check_backbone_path
from models.rankers.base import RUNTIME_KEYS
from pipeline.config import (
    FIT_LOOP_KEYS,
    PAPER_PROTOCOL_KEYS,
    REPORTING_KEYS,
    EvalConfig,
    RunConfig,
    TrainerConfig,
    check_validation_schedule,
    head_defaults,
    model_defaults,
    parse_args,
)
from pipeline.stages import TEST_SPLITS, begin_attempt, check_outputs
from retrieval.config import check_index_place
from retrieval.first_stage import FIRST_STAGE, first_stage, model_capabilities

__all__ = [
    "COMPOSED",
    "HEAD_SCHEDULE",
    "JOBS",
    "KEYS",
    "OPTIONAL_GROUPS",
    "SCRIPTS",
    "TABLE",
    "Job",
    "Need",
    "Script",
    "When",
    "applied",
    "check",
    "check_files",
    "check_machine",
    "check_overrides",
    "job",
    "jobs_of",
    "reader",
    "select",
    "unread",
]

SCRIPTS = ("train.py", "evaluate.py")
# the top-level keys that belong to some jobs only (RunConfig's other keys, seed and output_dir, every job takes)
KEYS = ("stage", "ckpt", "ckpt_path", "init_ckpt", "head_ckpt")
# the config groups that are off by default (`name: none`): a job that does not read one refuses it when it is set
OPTIONAL_GROUPS = ("retrieval", "analysis", "head")
# the order in which `check` looks at keys and groups: the one that tells most about the mix-up first
_CHECK_ORDER = ("retrieval", "analysis", "stage", "ckpt", "ckpt_path", "init_ckpt", "head_ckpt", "head")
_DEFAULTS = {f.name: f.default for f in fields(RunConfig) if f.name in KEYS}


# ---- the typed top-level keys of each job (fields of pipeline.config.RunConfig) -----------------------------------
@dataclass
class FinetuneKeys:
    """`train.py` (`stage=finetune`): resume a run (`ckpt_path`) or start from another run's weights (`init_ckpt`)."""

    stage: str = "finetune"
    ckpt_path: str | None = None
    init_ckpt: str | None = None


@dataclass
class HeadKeys:
    """`train.py stage=head`: the fine-tuned ranker (`ckpt`) and a flow head's run to resume (`ckpt_path`)."""

    stage: str = "head"
    ckpt: str | None = None
    ckpt_path: str | None = None


@dataclass
class ExportKeys:
    """`train.py stage=export`: the ranker checkpoint (`ckpt`) or head checkpoint (`head_ckpt`) exported."""

    stage: str = "export"
    ckpt: str | None = None
    head_ckpt: str | None = None


@dataclass
class CheckpointKeys:
    """evaluate.py's re-ranking test, retrieval and analyses: the checkpoint (`ckpt`; none: the untrained model)."""

    ckpt: str | None = None


@dataclass
class HeadEvaluationKeys:
    """`evaluate.py head_ckpt=`: the head checkpoint, and its base ranker (`ckpt`; default: the head's own base)."""

    head_ckpt: str | None = None
    ckpt: str | None = None


@dataclass
class NoKeys:
    """A first-stage `model` (`model=bm25`): it ranks the collection by itself and reads no checkpoint."""


# ---- declarations ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class When:
    """A job's selection rule, besides its script: every condition set here must hold.

    `stage`: `cfg.stage` equals it; `retrieval`, `analysis`: that group is set (not `none`); `first_stage`:
    `model.name` is a first-stage retriever (`retrieval.first_stage.FIRST_STAGE`, a model with nothing to train);
    `head_ckpt`: `head_ckpt` is set. No condition: the job is its script's fallback.
    """

    stage: str | None = None
    retrieval: bool = False
    analysis: bool = False
    first_stage: bool = False
    head_ckpt: bool = False

    def holds(self, cfg: DictConfig) -> bool:
        """Tell whether this rule selects the config `cfg`."""
        facts = _facts(cfg)
        if self.stage is not None and cfg.stage != self.stage:
            return False
        return all(facts[k] for k in ("retrieval", "analysis", "first_stage", "head_ckpt") if getattr(self, k))

    def selects_on(self, item: str) -> bool:
        """Tell whether the key or group `item` is one of this rule's conditions."""
        return self.stage is not None if item == "stage" else bool(getattr(self, item, False))


@dataclass(frozen=True)
class Need:
    """What a job needs of the config, and the one-line error (`where: problem`) when it is not there.

    `any_of`: keys or optional groups one of which must be set; `capability`: a capability of the `model` choice
    (`retrieval.first_stage.model_capabilities`) that must be true. `problem` may name `{model}` and `{head}`.
    """

    where: str
    problem: str
    any_of: tuple[str, ...] = ()
    capability: str | None = None


@dataclass(frozen=True)
class Job:
    """One job of the table: its script, its rule, the top-level keys and the groups it takes, its needs.

    `keys`: the dataclass of the top-level keys it takes (`KEYS` outside it are refused when set); `groups`: the
    config groups it reads (of `OPTIONAL_GROUPS`, the others are refused when set); `shape`: how a message shows it
    (`evaluate.py retrieval={retrieval}`); `command`: the command line to suggest for it; `refuses`: why it takes no
    such key, for the keys a user may expect it to take (else the message names the jobs that take it); `ignores`:
    keys of a group it reads that it does not apply (`data.passage_words`: BM25 scores whole documents), each with
    why: one set away from its default is refused, rather than give the default's numbers silently. `shape`,
    `command`, `refuses`, `ignores` and `Need.problem` may name `{model}`, `{head}`, `{retrieval}`, `{analysis}` and
    `{value}`.
    """

    script: str
    when: When
    keys: type
    groups: tuple[str, ...]
    shape: str
    command: str
    needs: tuple[Need, ...] = ()
    refuses: dict[str, str] = field(default_factory=dict)
    ignores: dict[str, str] = field(default_factory=dict)
    # the job's own checks of the config, beyond the table's (the analysis job: what the chosen analysis applies)
    checks: Callable[[DictConfig], None] | None = None
    # keys (`group.key`) of the groups it reads that it does not read, each with why; a group of `COMPOSED` it does not
    # read at all is left out of `groups` (a reason for it may be given here under the group's name). Set on the
    # command line, either is refused (`check_overrides`)
    unread: dict[str, str] = field(default_factory=dict)
    # more keys it does not read that depend on the config's choices (the analysis job: by the analysis chosen)
    unread_by: Callable[[DictConfig], dict[str, str]] | None = None
    # the data splits it reads (`load_dataset`'s `splits`), from the config: the data keys of the others' files
    # (`DataConfig.split_keys`) it does not read. None: every split
    splits: Callable[[DictConfig], tuple[str, ...] | None] | None = None

    def takes(self, item: str) -> bool:
        """Tell whether this job takes the top-level key or config group `item`."""
        return item in self.groups if item in OPTIONAL_GROUPS else item in {f.name for f in fields(self.keys)}


_READS = ("model", "data", "trainer", "logger", "optim", "eval")  # what a job that trains or tests a ranker reads
_TESTS = ("model", "data", "trainer", "logger", "eval")  # what a job that tests a ranker reads: it trains nothing
# the groups every config composes that a job may not read: the command line's keys of these are checked against what
# the job reads (`check_overrides`); `model` is checked against the checkpoint's ranker (`check_files`)
COMPOSED = ("data", "trainer", "logger", "optim", "eval")
_NO_TRAINING = "evaluate.py trains nothing: the optimiser, its schedule and the loss are train.py's"
_NO_FIT_LOOP = "evaluate.py runs no training loop: of the trainer it reads the device, precision and strategy keys"
_TEST_TRAINER_UNREAD = {f"trainer.{k}": _NO_FIT_LOOP for k in FIT_LOOP_KEYS}
# the data keys that change only what a run trains on (datamodules/config.py), for the jobs that train nothing
_TRAINING_DATA = {f"data.{k}": "it changes only what a run trains on, never a test split" for k in TRAINING_ONLY}
# the eval keys of fine-tuning alone: its test before training and its step-0 validation (pipeline/run.py)
_FIT_EVAL = {f"eval.{k}": "it is fine-tuning's (train.py)" for k in ("before_training", "start_candidate")}
# a full-collection ranking reports its measures alone: the isotropy and ATS protocols and the re-ranking depths are
# the re-ranking test's
_RANKING_EVAL = {
    f"eval.{f.name}": "a full ranking reports eval.measures alone; the other eval keys are the re-ranking test's "
    "(`python evaluate.py ckpt=...`)"
    for f in fields(EvalConfig)
    if f.name != "measures"
}
# the data keys of re-ranking, which a full-collection ranking does not read
_FULL_RANKING_DATA = {
    "data.candidate_depth": "a full ranking retrieves from the whole collection ({depth}); data.candidate_depth is "
    "the re-ranking depth",
    "data.eval_batch_size": "it is the re-ranking test's step size{encodes}",
}
_EXPORT = "export writes the checkpoint's weights and settings as they are: it reads no data and runs nothing"
# the trainer keys the head stage sets itself (pipeline/head_stage.py): head.epochs whole epochs, each validated
HEAD_SCHEDULE = ("max_steps", "max_epochs", "val_check_interval", "check_val_every_n_epoch")
_HEAD_EPOCHS = "the head stage trains head.epochs whole epochs and validates after each; set head.epochs"
# what the head stage encodes of the training data (datamodules/representations.py `training_texts`)
_HEAD_TEXTS = (
    "the head stage encodes the training triples' queries and passages as the collection holds them: whole "
    "documents, not rotated"
)
_HEAD_OPTIM = (
    "the head stage keeps the fine-tuned ranker's optim settings (of this run's it applies optim.nonfinite); the "
    "head's own are head.lr and head.epochs"
)


def _analysis_unread(cfg: DictConfig) -> dict[str, str]:
    """Return the data and eval keys the chosen analysis does not read, as its schema declares (analyses/registry.py).

    The training-only data keys unless it reads the training triples (it declares so and reads the training split:
    `answer_positions` of `split=train`); the training batch always; `data.candidate_depth` unless it cuts candidate
    lists at it or builds triples with BM25 negatives; the eval keys but those it declares.
    """
    opts = analysis_options(cfg)
    kind, name = type(opts), opts.name
    splits = opts.splits_read()
    triples = kind.reads_training_triples and (splits is None or "train" in splits)
    unread = {} if triples else dict(_TRAINING_DATA)
    unread["data.batch_size"] = "it is the training batch; an analysis trains no ranker"
    depth = opts.candidate_depth_unread()
    if depth is not None and not (triples and cfg.data.negatives == "bm25"):
        drawn = " (its triples' negatives are drawn at random: data.negatives)" if triples else ""
        unread["data.candidate_depth"] = depth + drawn
    takes = ", ".join(f"eval.{k}" for k in kind.reads_eval) or "no eval key"
    for f in fields(EvalConfig):
        if f.name not in kind.reads_eval:
            unread[f"eval.{f.name}"] = (
                f"analysis {name} reads {takes}; the others configure the re-ranking test (`python evaluate.py "
                "ckpt=...`), which an analysis does not run"
            )
    return unread


def _ats_unread(cfg: DictConfig) -> dict[str, str]:
    """Return `eval.mats` when the ATS protocol of a ranker's test is off (`eval.ats_passages` 0), else nothing.

    Not at composition: `analysis=ats` reads it whatever `eval.ats_passages` says.
    """
    if cfg.eval.ats_passages:
        return {}
    return {"eval.mats": "eval.ats_passages is 0, which turns the ATS / MATS protocol off"}


# the eval keys of the isotropy protocols (callbacks/isotropy.py): both measure the vectors of separately encoded texts
ISOTROPY_EVAL = ("probe_queries", "probe_docs", "isotropy_paper", *PAPER_PROTOCOL_KEYS, "dump_isotropy")
# the optim keys of in-batch negatives: every other passage of the batch, scored against a query's own encoding
IN_BATCH_OPTIM = ("in_batch_negatives", "in_batch_mask_relevant")


def _tested_ranker(cfg: DictConfig) -> str:
    """Return the `model.name` of the ranker a test job builds: the one `ckpt=` records, else the command line's."""
    path = cfg.get("ckpt")
    if path and Path(str(path)).exists():
        try:
            return str(recorded_model(str(path), "ckpt")["name"])
        except (InputError, KeyError, TypeError):  # a checkpoint the job's own checks refuse, naming the fault
            pass
    return str(cfg.model.name)


def _vectors_unread(ranker: str, trains: bool) -> dict[str, str]:
    """Return the keys that read separately encoded query and passage vectors, where `ranker` encodes none.

    By its declared capability (`RankerCapabilities.encodes_texts` false: a cross-encoder), so that e.g.
    `train.py model=bert_cat eval.probe_queries=8` is refused rather than measuring nothing; `trains`: the optim keys of
    in-batch negatives too (fine-tuning).
    """
    if model_capabilities(ranker).encodes_texts:
        return {}
    why = f"ranker '{ranker}' encodes no query or passage vectors of its own"
    unread = {f"eval.{k}": f"{why}, which the isotropy protocols measure" for k in ISOTROPY_EVAL}
    if trains:
        for k in IN_BATCH_OPTIM:
            unread[f"optim.{k}"] = (
                f"{why}: it scores each triplet's own (query, passage) pairs, with no in-batch negatives"
            )
    return unread


def _hinge_unread(cfg: DictConfig) -> dict[str, str]:
    """Return the in-batch optim keys under `optim.loss=hinge`, which reads each triplet's own negative alone."""
    if cfg.optim.loss != "hinge":
        return {}
    return {
        f"optim.{k}": "optim.loss is 'hinge', which scores each triplet's own negative alone" for k in IN_BATCH_OPTIM
    }


def _test_unread(cfg: DictConfig) -> dict[str, str]:
    """Return `_ats_unread` and the keys of the vectors the tested ranker does not encode (`_vectors_unread`)."""
    return {**_ats_unread(cfg), **_vectors_unread(_tested_ranker(cfg), trains=False)}


def _finetune_unread(cfg: DictConfig) -> dict[str, str]:
    """Return `data.rotation` when training passages are not rotated, `_ats_unread`, `_hinge_unread`, `_vectors_unread`.

    The rotation mode chooses their cut alone: evaluation cuts one per passage whatever it says
    (datamodules/datamodule.py `rotation_draw`). The ranker is the command line's (`init_ckpt=` and `ckpt_path=` must
    record the same: `check_files`).
    """
    unread = {**_ats_unread(cfg), **_hinge_unread(cfg), **_vectors_unread(str(cfg.model.name), trains=True)}
    if not cfg.data.rotate_train:
        unread["data.rotation"] = (
            "it chooses how training passages are cut (Eq. 7) and data.rotate_train is false; evaluation cuts one per "
            "passage either way"
        )
    return unread


def _test_split(cfg: DictConfig) -> tuple[str, ...]:
    return TEST_SPLITS


def _options_splits(group: str) -> Callable[[DictConfig], tuple[str, ...] | None]:
    """Return the splits function of a job whose group's options declare them (`splits_read`: retrieval, model)."""
    return lambda cfg: OmegaConf.to_object(cfg[group]).splits_read()


# In precedence order: of a script's jobs, the first whose rule holds is selected.
# Analyses: one job that defers to analyses/registry.py, not one per analysis: every analysis takes the same
# top-level keys (ckpt, or none for the untrained model) and its own keys are the `analysis` group, which that
# registry's entries already type (each one's schema); one entry per analysis here would repeat the same declaration
# for each and need keeping in step with that registry.
TABLE: dict[str, Job] = {
    "export": Job(
        "train.py",
        When(stage="export"),
        ExportKeys,
        (),
        shape="train.py stage=export",
        command="train.py stage=export ckpt=... output_dir=DIR",
        needs=(
            Need(
                "ckpt", "export needs ckpt=<ranker checkpoint> (or head_ckpt=<head checkpoint>)", ("ckpt", "head_ckpt")
            ),
        ),
        refuses={
            "ckpt_path": "it is for fine-tuning; stage=export exports ckpt= (or head_ckpt=) into output_dir",
            "init_ckpt": "it is for fine-tuning; stage=export exports ckpt= (or head_ckpt=) into output_dir",
            "head": "the head comes from head_ckpt=<head checkpoint>, with its own settings",
        },
        unread={g: _EXPORT for g in COMPOSED},
    ),
    "head": Job(
        "train.py",
        When(stage="head"),
        HeadKeys,
        ("head", *_READS),
        shape="train.py stage=head",
        command="train.py stage=head ckpt=<fine-tuned checkpoint> head={head}",
        needs=(
            Need("ckpt", "stage=head needs ckpt=<checkpoint of the fine-tuned ranker> to put the head on", ("ckpt",)),
            Need("head", "stage=head needs head=whitening, head=nice or head=glow", ("head",)),
        ),
        refuses={
            "init_ckpt": "it initialises fine-tuning (stage=finetune); the head stage takes the fine-tuned ranker "
            "as ckpt=",
        },
        unread_by=_ats_unread,
        unread={
            **{f"trainer.{k}": _HEAD_EPOCHS for k in HEAD_SCHEDULE},
            **{f"optim.{f.name}": _HEAD_OPTIM for f in fields(OptimConfig) if f.name != "nonfinite"},
            **_FIT_EVAL,
            "data.batch_size": "the head stage batches its cached vectors by head.batch_size",
            **{f"data.{k}": _HEAD_TEXTS for k in ("rotate_train", "rotation", "train_passage")},
        },
    ),
    "finetune": Job(
        "train.py",
        When(stage="finetune"),
        FinetuneKeys,
        _READS,
        shape="train.py",
        command="train.py [init_ckpt=...]",
        checks=check_validation_schedule,
        unread_by=_finetune_unread,
        needs=(
            Need(
                "model",
                "'{model}' has nothing to train; evaluate it with `python evaluate.py model={model} data=...`",
                capability="trainable",
            ),
        ),
        refuses={
            "head": "'{value}' is trained after fine-tuning, on the frozen ranker: "
            "`python train.py stage=head ckpt=<fine-tuned checkpoint> head={value}`",
            "ckpt": "to start from a checkpoint's ranker weights set init_ckpt=, to resume a run ckpt_path=; ckpt is "
            "what stage=head, stage=export and evaluate.py read",
        },
    ),
    "retrieve": Job(
        "evaluate.py",
        When(retrieval=True),
        CheckpointKeys,
        ("retrieval", "model", "data", "logger", "eval"),
        shape="evaluate.py retrieval={retrieval}",
        command="evaluate.py retrieval={retrieval} ckpt=...",
        refuses={"head_ckpt": "it indexes a ranker checkpoint (ckpt=), not a head"},
        checks=check_index_place,
        splits=_options_splits("retrieval"),
        ignores={
            "data.passage_words": "the index holds whole documents (cut at model.doc_max_len tokens), not passage "
            "windows; MaxP / FirstP are for re-ranking: `python evaluate.py ckpt=... data.passage_words={value}`",
            "data.rotate_eval": "the index is built from the collection as it is; rotation-debiased evaluation "
            "re-ranks (`python evaluate.py ckpt=... data.rotate_eval=true`)",
        },
        unread={
            "trainer": "retrieval encodes on retrieval.device, with retrieval.devices and retrieval.precision, not "
            "through the trainer",
            "optim": _NO_TRAINING,
            **_TRAINING_DATA,
            **{
                k: why.format(depth="retrieval.k", encodes="; retrieval encodes retrieval.batch_size texts a pass")
                for k, why in _FULL_RANKING_DATA.items()
            },
            **_RANKING_EVAL,
        },
    ),
    "analysis": Job(
        "evaluate.py",
        When(analysis=True),
        CheckpointKeys,
        ("analysis", *_TESTS),
        shape="evaluate.py analysis={analysis}",
        command="evaluate.py analysis={analysis} ...",
        checks=check_analysis,
        unread_by=_analysis_unread,
        splits=lambda cfg: analysis_options(cfg).splits_read(),
        unread={
            "optim": _NO_TRAINING,
            **{
                f"trainer.{f.name}": "an analysis reads trainer.accelerator only (for its device); the rest are "
                "its analysis.* keys"
                for f in fields(TrainerConfig)
                if f.name != "accelerator"
            },
            "data.eval_batch_size": "it is the re-ranking test's step size; an analysis encodes in its own batches "
            "(analysis.batch_size where it has one)",
            "data.pretokenize": "an analysis tokenises its texts itself, once, not through the token cache",
        },
    ),
    "first_stage": Job(
        "evaluate.py",
        When(first_stage=True),
        NoKeys,
        ("model", "data", "logger", "eval"),
        shape="evaluate.py model={model}",
        command="evaluate.py model={model} data=...",
        refuses={"ckpt": "model '{model}' ranks the collection by itself and takes no checkpoint"},
        splits=_options_splits("model"),
        unread={
            **{g: "model '{model}' ranks the collection by itself: nothing is trained" for g in ("trainer", "optim")},
            **_TRAINING_DATA,
            **{k: why.format(depth="model.depth", encodes="") for k, why in _FULL_RANKING_DATA.items()},
            "data.pretokenize": "model '{model}' tokenises with its own analyser, not the rankers' tokenizer",
            **_RANKING_EVAL,
        },
        ignores={
            "data.passage_words": "model '{model}' scores whole documents, not passage windows (MaxP / FirstP are "
            "for neural re-ranking)",
        },
    ),
    "evaluate_head": Job(
        "evaluate.py",
        When(head_ckpt=True),
        HeadEvaluationKeys,
        # `head` is read from head_ckpt, which replaces it; a grid's head row sets it on its evaluations too
        ("head", *_TESTS),
        shape="evaluate.py head_ckpt=...",
        command="evaluate.py head_ckpt=<head checkpoint> data=...",
        unread={"optim": _NO_TRAINING, **_TEST_TRAINER_UNREAD, **_TRAINING_DATA, **_FIT_EVAL},
        unread_by=_ats_unread,
        splits=_test_split,
    ),
    "evaluate": Job(
        "evaluate.py",
        When(),
        CheckpointKeys,
        _TESTS,
        shape="evaluate.py",
        command="evaluate.py ckpt=... data=...",
        refuses={
            "head": "a head is trained by `python train.py stage=head ckpt=... head={value}` and applied with "
            "`python evaluate.py head_ckpt=<its checkpoint>`",
        },
        unread={"optim": _NO_TRAINING, **_TEST_TRAINER_UNREAD, **_TRAINING_DATA, **_FIT_EVAL},
        unread_by=_test_unread,
        splits=_test_split,
    ),
}

JOBS: Registry = Registry("job")


def job(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Return the decorator that registers the function running the job `name` of `TABLE` in `JOBS`.

    The function is called as `run(cfg, model_from_cli)`; the entry's schema is the job's keys dataclass and its
    capabilities the job's declaration.
    """
    spec = TABLE[name]
    return JOBS.register(name, schema=spec.keys, capabilities=spec)


# ---- selection and checks -------------------------------------------------------------------------------------------
def _facts(cfg: DictConfig) -> dict[str, bool]:
    return {
        "retrieval": cfg.retrieval.name != "none",
        "analysis": cfg.analysis.name != "none",
        "first_stage": first_stage(str(cfg.model.name)) is not None,
        "head_ckpt": _is_set(cfg, "head_ckpt"),
    }


def _is_set(cfg: DictConfig, item: str) -> bool:
    if item in OPTIONAL_GROUPS:
        return cfg[item].name != "none"
    return cfg[item] not in (None, "", _DEFAULTS[item])


def _default(node: DictConfig, key: str) -> Any:
    """Return the schema default of `key` in the structured group `node` (its dataclass field's default)."""
    return next(f.default for f in fields(OmegaConf.get_type(node)) if f.name == key)


def _yaml(value: Any) -> str:
    """Show a config value as a command line writes it (`null`, `true`, `50`)."""
    return OmegaConf.to_yaml({"v": value}).split(": ", 1)[1].strip()


def _value(cfg: DictConfig, item: str) -> Any:
    return cfg[item].name if item in OPTIONAL_GROUPS else cfg[item]


def _names(cfg: DictConfig, value: Any = None) -> dict[str, Any]:
    """Return the names a job's strings may show: the config's choices, or a placeholder where one is off."""
    model = str(cfg.model.name)
    return {
        "model": model if first_stage(model) is not None else next(iter(FIRST_STAGE.names()), "NAME"),
        "head": cfg.head.name if cfg.head.name != "none" else "NAME",
        "retrieval": cfg.retrieval.name if cfg.retrieval.name != "none" else "dense",
        "analysis": cfg.analysis.name if cfg.analysis.name != "none" else "NAME",
        "value": value,
    }


def _label(name: str, cfg: DictConfig) -> str:
    return f"job '{name}' ({TABLE[name].shape.format(**_names(cfg))})"


def select(cfg: DictConfig, script: str) -> str:
    """Return the name of the job `script` runs for the composed config `cfg`: its first job whose rule holds.

    Parameters
    ----------
    cfg : DictConfig
        The composed run config (`pipeline.config.compose`).
    script : str
        `train.py` or `evaluate.py`.

    Returns
    -------
    str
        The job's name, a key of `TABLE`.

    Raises
    ------
    InputError
        When no job of `script` fits (each script has a fallback, so only for an unknown script or stage).
    """
    for name, spec in TABLE.items():
        if spec.script == script and spec.when.holds(cfg):
            return name
    raise InputError("stage", f"'{cfg.stage}' is no job of {script}; its jobs: {jobs_of(script)}")


def jobs_of(script: str) -> list[str]:
    """Return the names of the jobs `script` runs, in the table's order."""
    return [name for name, spec in TABLE.items() if spec.script == script]


def _foreign(cfg: DictConfig, name: str, item: str) -> InputError:
    """Return the error for the key or group `item`, set, that the job `name` does not take."""
    spec, value = TABLE[name], _value(cfg, item)
    shown = f"{item}={value}" if item in OPTIONAL_GROUPS or item == "stage" else item
    names = _names(cfg, value)
    reason = spec.refuses.get(item)
    if reason is not None:
        reason = reason.format(**names)
    else:
        takers = [n for n, s in TABLE.items() if s.takes(item)]
        # the job this key would select (`retrieval=dense` selects retrieve): in the same script two jobs were asked
        # for at once; in the other script, and no job of this one takes it, the user ran the wrong script
        target = next((n for n in takers if TABLE[n].when.selects_on(item) and TABLE[n].when.holds(cfg)), None)
        same_script = [n for n in takers if TABLE[n].script == spec.script]
        if target is not None and TABLE[target].script == spec.script:
            reason = f"{shown} is {_label(target, cfg)}: two jobs; run them one at a time"
        elif target is not None and not same_script:
            other = TABLE[target]
            where = f"{value} is a {other.script} stage" if item == "stage" else f"'{value}' runs from {other.script}"
            reason = f"{where}: `python {other.command.format(**names)}`"
        else:
            reason = f"{item} is for " + " or ".join(_label(n, cfg) for n in takers)
    return InputError(f"config key '{item}'", f"{_label(name, cfg)} takes no {shown}; {reason}")


def unread(name: str, key: str, cfg: DictConfig | None = None) -> str | None:
    """Return why the job `name` does not read the config key or group `key` (`trainer.max_steps`, `optim`), else None.

    Only the groups of `COMPOSED` are judged: a group the job does not read (not in its `groups`) or a key of one it
    reads that its `unread` declares. The keys of how a run reports (`pipeline.config.REPORTING_KEYS`: the logger,
    the progress bar, the cache folder) every job takes. With the config `cfg`, also the keys its choices leave
    unread (`Job.unread_by`: the analysis chosen) and the data keys of the splits it does not read (`Job.splits`,
    `DataConfig.split_keys`: `data.train_triples` of the tsv source for evaluate.py, which reads the test split).

    >>> unread("evaluate", "optim.lr").startswith("evaluate.py trains nothing")
    True
    >>> unread("finetune", "optim.lr") is None, unread("evaluate", "trainer.precision") is None
    (True, True)
    """
    return reader(name, cfg)(key)


def reader(name: str, cfg: DictConfig | None = None) -> Callable[[str], str | None]:
    """Return `unread` of the job `name` and the config `cfg` as a function of the key, for many keys.

    The keys its choices leave unread (from the typed data and analysis configs) are worked out once, at the first key
    that needs them, not once a key.
    """
    spec = TABLE[name]
    by_choice: dict[str, str] | None = None

    def why(key: str) -> str | None:
        nonlocal by_choice
        group, _, rest = key.partition(".")
        if group not in COMPOSED or key.startswith(REPORTING_KEYS):  # how it reports: taken by every job
            return None
        if group not in spec.groups:
            return spec.unread.get(group, f"it does not read the {group} group")
        if not rest:
            return None
        sub = f"{group}.{rest.split('.', 1)[0]}"
        if sub in spec.unread or cfg is None:
            return spec.unread.get(sub)
        if by_choice is None:
            by_choice = spec.unread_by(cfg) if spec.unread_by is not None else {}
            if spec.splits is not None:
                by_choice = {**split_keys_unread(data_config(cfg), spec.splits(cfg)), **by_choice}
        return by_choice.get(sub)

    return why


def _override_key(arg: str) -> str:
    return arg.split("=", 1)[0].strip().lstrip("+~")


def applied(argv: Sequence[str], name: str, cfg: DictConfig | None = None) -> list[str]:
    """Return the `key=value` arguments of `argv` that the job `name` reads (`unread` drops the others), in order.

    A grid passes its common and row overrides to every cell: each cell gets those its own job reads.

    >>> applied(["model=colbert", "optim.lr=1e-5", "trainer.max_steps=300", "trainer.precision=bf16-mixed"], "evaluate")
    ['model=colbert', 'trainer.precision=bf16-mixed']
    """
    why = reader(name, cfg)
    return [a for a in argv if why(_override_key(a)) is None]


def check_overrides(cfg: DictConfig, name: str, argv: Sequence[str]) -> None:
    """Refuse a command-line key or group choice (of `argv`) that the job `name` does not read, naming why.

    Raises
    ------
    InputError
        `config key 'optim.lr': job 'evaluate' (evaluate.py) does not read it (evaluate.py trains nothing: ...);
        drop it from the command line`.
    """
    unread_key = reader(name, cfg)
    choices, overrides = parse_args(list(argv))
    for key in [*choices, *(_override_key(o) for o in overrides)]:
        why = unread_key(key)
        if why is not None:
            names = _names(cfg) | {"model": str(cfg.model.name)}
            raise InputError(
                f"config key '{key}'",
                f"{_label(name, cfg)} does not read it ({why.format(**names)}); drop it from the command line",
            )


def check(cfg: DictConfig, name: str, argv: Sequence[str] = ()) -> None:
    """Check that the config fits the job `name`: nothing set that it does not take, everything it needs there.

    Parameters
    ----------
    cfg : DictConfig
        The composed run config.
    name : str
        The job, a key of `TABLE` (as `select` returns it).
    argv : sequence of str
        The command line's `key=value` arguments that `cfg` was composed from: those the job does not read are
        refused (`check_overrides`); empty for a config from elsewhere.

    Raises
    ------
    InputError
        The first key or optional group the job does not take, set (naming it, the job and the jobs that take it);
        else the first command-line key the job does not read; else the first need not met (`Need.where`:
        `Need.problem`).
    """
    spec = TABLE[name]
    for item in _CHECK_ORDER:
        if not spec.takes(item) and _is_set(cfg, item):
            raise _foreign(cfg, name, item)
    check_overrides(cfg, name, argv)
    names = _names(cfg)
    names["model"] = str(cfg.model.name)
    if "trainer" in cfg:
        check_fp16_device(cfg.trainer.precision, cfg.trainer.accelerator, machine=False)
    for key, why in spec.ignores.items():
        group, sub = key.split(".", 1)
        value, default = cfg[group][sub], _default(cfg[group], sub)
        if value != default:
            raise InputError(
                f"config key '{key}'",
                f"is {_yaml(value)}, but {_label(name, cfg)} does not apply it: "
                f"{why.format(**names | {'value': _yaml(value)})}; leave it at {_yaml(default)}",
            )
    if spec.checks is not None:
        spec.checks(cfg)
    for need in spec.needs:
        met = (not need.any_of or any(_is_set(cfg, k) for k in need.any_of)) and (
            need.capability is None or bool(getattr(model_capabilities(str(cfg.model.name)), need.capability))
        )
        if not met:
            raise InputError(need.where, need.problem.format(**names))


def check_files(cfg: DictConfig, model_from_cli: bool = False, name: str | None = None) -> None:
    """Check what the headers of the checkpoints a job will read tell, loading no tensor.

    Each exists and is sound (a torch zip file with our keys and hyper-parameters this version knows:
    core/checkpoints.read_header) and holds what the job `name` takes from it: the ranker `model.name` asks for (for
    `ckpt` when the command line picked the model, for `init_ckpt`, and for fine-tuning's `ckpt_path`, which may not
    be a head's). Every job and `--dry-run` run it before anything is read or written, so a bad checkpoint stops a
    job before its data is read and its caches are built.
    """
    _check_declared_inputs(cfg, name)
    headers = {}
    for key in ("ckpt", "ckpt_path", "head_ckpt", "init_ckpt"):
        path = Path(cfg[key]) if cfg.get(key) else None
        # ckpt= may also be a folder from `train.py stage=export` (evaluate.py reads its isorank.json)
        exported = key == "ckpt" and path is not None and (path / "isorank.json").is_file()
        if path is not None and not exported:
            headers[key] = read_header(str(cfg[key]), key, head=key == "head_ckpt")
    if "ckpt" in headers and model_from_cli and "base_ckpt" not in headers["ckpt"]:
        check_same_ranker(headers["ckpt"], cfg, "ckpt", cfg.ckpt)
    if "init_ckpt" in headers:
        check_same_ranker(headers["init_ckpt"], cfg, "init_ckpt", cfg.init_ckpt)
    _check_model_keys_apply(cfg, headers, name)
    if name == "evaluate_head" and "head_ckpt" in headers:
        _check_head_keys_apply(cfg, headers["head_ckpt"])
    if "ckpt_path" in headers and name == "finetune":
        resumed = headers["ckpt_path"]
        if "base_ckpt" in resumed:
            raise InputError(
                "ckpt_path",
                f"'{cfg.ckpt_path}' is a head checkpoint (from stage=head); "
                f"resume it with stage=head ckpt={resumed['base_ckpt']}",
            )
        check_same_ranker(resumed, cfg, "ckpt_path", cfg.ckpt_path)
        _check_same_model(resumed, cfg)


def same_model_value(key: str, recorded, now) -> bool:
    """Return whether a checkpoint's `model.<key>` and this run's are one setting.

    Equal, or one backbone folder named two ways.

    >>> same_model_value("doc_max_len", 180, 180), same_model_value("doc_max_len", 180, 24)
    (True, False)
    >>> same_model_value("backbone", ".", str(Path(".").resolve()))
    True
    """
    if recorded == now:
        return True
    return (
        key == "backbone" and Path(str(recorded)).exists() and Path(str(recorded)).resolve() == Path(str(now)).resolve()
    )


def _check_model_keys_apply(cfg: DictConfig, headers: dict, name: str | None) -> None:
    """Refuse `model` keys set for a job that takes its ranker's settings from a checkpoint, where they differ.

    evaluate.py / an analysis / retrieval with `ckpt=`, the head stage and export build the ranker the checkpoint
    (or export folder, or head checkpoint) records: a `model.doc_max_len=24` beside it was silently not applied, and
    the head stage's config.yaml even recorded it. A key counts as set when it differs from its ranker's YAML
    (`model_defaults`); one equal to the recorded value (a grid's evaluation cell repeating its row) is no fault.
    Runtime keys (`RUNTIME_KEYS`: how the ranker runs, not what it computes) apply over the recorded ones.
    """
    if name is None or _builds_from_config(cfg, name) or first_stage(str(cfg.model.name)) is not None:
        return
    for key in ("ckpt", "head_ckpt"):
        if not cfg.get(key):
            continue
        header = headers.get(key)
        try:
            recorded = dict(header["hyper_parameters"]["model"]) if header else recorded_model(str(cfg[key]), key)
        except InputError:  # an export folder a job refuses, or a broken one: the job's own checks name it
            return
        break
    else:
        return
    now = OmegaConf.to_container(cfg.model)
    defaults = model_defaults(str(cfg.model.name))
    schema = {f.name: f.default for f in fields(OmegaConf.get_type(cfg.model))}  # keys newer than the checkpoint

    def ignored(k: str) -> bool:
        if k == "name" or k in RUNTIME_KEYS or now[k] == defaults.get(k):
            return False
        return not same_model_value(k, recorded.get(k, schema.get(k)), now[k])

    differ = [k for k in now if ignored(k)]
    if differ:
        k = differ[0]
        more = f" (and {', '.join(f'model.{d}' for d in differ[1:])})" if len(differ) > 1 else ""
        raise InputError(
            f"config key 'model.{k}'",
            f"is {_yaml(now[k])}{more}, but {_label(name, cfg)} builds the ranker as {key}= records it "
            f"({k}={_yaml(recorded.get(k, schema.get(k)))}) and does not apply it; drop the override, or fine-tune "
            f"with it: `python train.py init_ckpt={cfg[key]} model.{k}={_yaml(now[k])}`",
        )


def _check_head_keys_apply(cfg: DictConfig, header: dict) -> None:
    """Refuse `head` keys beside `head_ckpt=` that differ from the head its checkpoint records.

    evaluate.py applies the head the checkpoint holds (its config replaces `cfg.head`): `head=nice` beside a whitening
    head, or `head.granularity=sequence` beside a token-wise one, was not applied. A key counts as set when it
    differs from its head's YAML (`head_defaults`); one equal to the recorded value (a grid's evaluation of a head row
    repeats the row's keys) is no fault.
    """
    if cfg.head.name == "none":
        return
    recorded = dict(header.get("hyper_parameters", {}).get("head") or {})
    now = OmegaConf.to_container(cfg.head)
    if now["name"] != recorded.get("name"):
        raise InputError(
            "config key 'head'",
            f"is {now['name']}, but head_ckpt= holds head '{recorded.get('name')}', which evaluate.py applies; "
            "drop head= (the checkpoint's head is applied)",
        )
    defaults = head_defaults(str(now["name"]))
    differ = [
        k for k in now if k != "name" and now[k] != defaults.get(k) and now[k] != recorded.get(k, defaults.get(k))
    ]
    if differ:
        k = differ[0]
        raise InputError(
            f"config key 'head.{k}'",
            f"is {_yaml(now[k])}, but evaluate.py applies the head as head_ckpt= records it "
            f"({k}={_yaml(recorded.get(k, defaults.get(k)))}); drop the override, or train a head with it: "
            f"`python train.py stage=head head={now['name']} head.{k}={_yaml(now[k])} ckpt=...`",
        )


def _check_declared_inputs(cfg: DictConfig, name: str | None = None) -> None:
    """Check every input path a group's schema declares (core/inputs.py), set in `cfg`.

    A checkpoint by its header, a file by being one. The group's own code reads them later, after the data: checked
    here, a bad one stops the job (and `--dry-run`) before anything loads, in the words every job uses. The `model`
    group's only where the job `name` builds its ranker from it (a checkpoint's ranker is built from its own).
    """
    for group in cfg:
        node = cfg[group]
        if not isinstance(node, DictConfig):
            continue
        if group == "model" and name is not None and not _builds_from_config(cfg, name):
            continue
        for key_name, kind, what, keywords in declared_inputs(OmegaConf.get_type(node)):
            value = node[key_name]
            if not value or value in keywords:
                continue
            where = f"config key '{group}.{key_name}'"
            items = value.items() if kind == "checkpoints" else [(None, value)]
            for label, path in items:
                key = f"config key '{group}.{key_name}.{label}'" if label is not None else where
                if kind == "file":
                    check_input_file(str(path), key, what)
                elif not (Path(str(path)) / "isorank.json").is_file():  # an export folder loads as a checkpoint
                    read_header(str(path), key)


def check_machine(cfg: DictConfig, name: str) -> None:
    """Check what the job `name` needs of this machine before anything loads.

    fp16 needs a CUDA device (`accelerator=auto` decided here), a named GPU (`trainer.accelerator`, `trainer.devices`,
    `retrieval.device`) one this machine has; a job that builds its ranker from `model` needs its
    local `model.backbone` to exist. Not at `--dry-run` (a command checked on a login node, or one naming a backbone
    an earlier step exports); a job and a grid's run (for every cell, before any cell runs) make them.
    """
    if "trainer" in cfg:
        check_fp16_device(cfg.trainer.precision, cfg.trainer.accelerator)
        devices = cfg.trainer.devices
        check_accelerator(cfg.trainer.accelerator, list(devices) if OmegaConf.is_list(devices) else devices)
    if cfg.get("retrieval") is not None and "device" in cfg.retrieval:
        check_device("config key 'retrieval.device'", cfg.retrieval.device, cfg.retrieval.devices)
    if _builds_from_config(cfg, name):
        check_backbone_path(str(cfg.model.backbone))


def _builds_from_config(cfg: DictConfig, name: str) -> bool:
    """Return whether the job `name` builds its ranker from `cfg.model` (its backbone).

    Fine-tuning always (init_ckpt and ckpt_path only replace weights); the jobs of evaluate.py without a checkpoint
    (the untrained model).
    """
    if first_stage(str(cfg.model.name)) is not None or name in ("export", "head", "evaluate_head"):
        return False
    return name == "finetune" or not cfg.get("ckpt")


def _check_same_model(resumed: dict, cfg: DictConfig) -> None:
    """Refuse a resume (`ckpt_path`) whose checkpoint was trained with other `model` settings than `cfg`'s.

    A resume continues one model: another width, cut or backbone would fail in Lightning's strict load with a
    traceback (or, for a cut, go on silently as another model). Runtime keys (`RUNTIME_KEYS`) may differ.
    """
    saved = dict(resumed.get("hyper_parameters", {}).get("model") or {})
    now = OmegaConf.to_container(cfg.model)
    defaults = {f.name: f.default for f in fields(OmegaConf.get_type(cfg.model))}  # keys newer than the checkpoint

    differ = sorted(
        k for k in now if k not in RUNTIME_KEYS and not same_model_value(k, saved.get(k, defaults.get(k)), now.get(k))
    )
    if differ:
        shown = ", ".join(f"model.{k}={_yaml(saved.get(k))} (this run: {_yaml(now.get(k))})" for k in differ[:3])
        raise InputError(
            "ckpt_path",
            f"'{cfg.ckpt_path}' was trained with {shown}{', ...' if len(differ) > 3 else ''}; a resume continues "
            "the same model: drop those overrides, or start a new output_dir from its weights with init_ckpt=",
        )


@dataclass(frozen=True)
class Script:
    """An entry script's jobs (`train.py`, `evaluate.py`): select the config's job, check it, run it.

    Called as `script(cfg, model_from_cli)`, as `pipeline.cli.main` calls a job: it selects and checks the job,
    then runs the job's registered function holding `output_dir`'s lock (core/lock.py: one run per output directory),
    after checking that its output folders can be written (nothing is read or loaded before). The job functions
    register themselves on import of pipeline/run.py, which makes `TRAIN` and `EVALUATE`.
    """

    name: str

    def check(self, cfg: DictConfig, argv: Sequence[str] = ()) -> str:
        """Select the job this script runs for `cfg`, check that the config fits it and return its name.

        `argv`: the command line `cfg` was composed from (its keys the job does not read are refused).
        `pipeline.cli.main` calls it under `--dry-run` too.
        """
        name = select(cfg, self.name)
        check(cfg, name, argv)
        return name

    def __call__(self, cfg: DictConfig, model_from_cli: bool = False, argv: Sequence[str] = ()) -> Any:
        """Run the job of `cfg` (`check`) under `output_dir`'s lock and return what it returns.

        `model_from_cli`: the command line picked the model, so a checkpoint's ranker must match it; `argv`: the
        command line `cfg` was composed from.
        """
        name = self.check(cfg, argv)
        check_files(cfg, model_from_cli, name)  # the checkpoints' headers, before the lock, any data or any cache
        check_machine(cfg, name)
        with output_dir_lock(cfg.output_dir):
            check_outputs(cfg)  # before any data or weights: a folder this job cannot write stops it at once
            begin_attempt(cfg)
            return JOBS.get(name, "job").build(cfg, model_from_cli)
