"""Config composition: `configs/config.yaml` + one YAML per group + an optional experiment + CLI overrides.

    python train.py model=repbert data=squad trainer.max_steps=300 optim.lr=2e-5

`group=option` picks `configs/<group>/<option>.yaml`; `a.b=value` overrides one key (YAML-typed). Precedence:
config.yaml < group YAML < experiment < command line. A model YAML may also hold an `optim:` block, that ranker's
optim defaults (DGRe: its paper's Eq. 25 loss), ranked like the group YAML: above config.yaml's `optim`, below the
experiment's and the command line's. Each group is validated against the dataclass schema of
the entry it names (the ranker for `model`, the source for `data`), so an unknown key, group option or a
wrong-typed value stops the run with one line naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pytorch_lightning.accelerators import AcceleratorRegistry
from pytorch_lightning.strategies import StrategyRegistry

from analyses.registry import load_all
from core.checkpoints import read_header
from core.errors import InputError, check_choice, check_unused
from core.ranges import COUNT, NON_NEGATIVE, SEED, Range, check_range, check_ranges
from datamodules.sources import SOURCES
from lightning_modules.loading import check_optim_hparams  # noqa: F401 - registers the checkpoint hyper-parameter checks
from lightning_modules.module import OptimConfig, check_loss_keys
from metrics.ats import MATS_MODES
from metrics.ir import DEFAULT_MEASURES, check_measures
from models.heads import HEADS, check_fit_keys
from models.rankers.limits import check_model_limits, output_dim
from retrieval.config import schema as retrieval_schema
from retrieval.first_stage import model_entry

__all__ = [
    "ACCELERATORS",
    "CONFIG_DIR",
    "DEVICES",
    "FIT_LOOP_KEYS",
    "GROUPS",
    "MATMUL_PRECISIONS",
    "PIPELINE_TRAINER_KEYS",
    "PRECISIONS",
    "PROFILERS",
    "REPORTING_KEYS",
    "STRATEGIES",
    "EvalConfig",
    "LoggerConfig",
    "RunConfig",
    "TrainerConfig",
    "check_control_characters",
    "check_index_limits",
    "check_rerank_depths",
    "compose",
    "head_defaults",
    "load_yaml",
    "merge_structured",
    "parse_args",
    "to_yaml",
    "translate_error",
]

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("model", "data", "trainer", "logger", "head", "analysis", "retrieval")

# Lightning's own names (from its registries where it has one), so a misspelt value stops the run at load, not
# after the model is loaded
ACCELERATORS = ("auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators()))
STRATEGIES = ("auto", *StrategyRegistry.available_strategies())
PRECISIONS = (
    "32-true",
    "bf16-mixed",
    "bf16-true",
    "16-mixed",
    "16-true",
    "64-true",
    "transformer-engine",
    "transformer-engine-float16",
    "32",
    "16",
    "bf16",
    "64",
)
DEVICES = Range(1, integer=True, also=(-1, "auto"), note="or a non-empty list of device indices, e.g. [0, 1] or 0,1")


# trainer keys the pipeline applies itself (pipeline/stages.py), not passed to `pytorch_lightning.Trainer`
PIPELINE_TRAINER_KEYS = ("float32_matmul_precision", "profiler")
# keys that change where and how a run reports or caches, never what it computes: any job takes them (pipeline/jobs.py
# refuses no such key as unread) and a grid's finished cell stays valid across them (grid/cells.py)
REPORTING_KEYS = (
    "logger",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    "data.cache_dir",
    "data.num_workers",
)
# trainer keys that only a fine-tuning loop applies: its length, its validation schedule, its gradients (a test, an
# analysis and retrieval run none of them: pipeline/jobs.py refuses them there; its logging interval is a reporting key)
FIT_LOOP_KEYS = (
    "max_steps",
    "max_epochs",
    "val_check_interval",
    "check_val_every_n_epoch",
    "limit_val_batches",
    "num_sanity_val_steps",
    "accumulate_grad_batches",
    "gradient_clip_val",
)
MATMUL_PRECISIONS = ("auto", "highest", "high", "medium")
PROFILERS = ("simple", "advanced", "pytorch")


@dataclass
class TrainerConfig:
    """Passed to `pytorch_lightning.Trainer` (same names), but `PIPELINE_TRAINER_KEYS`, which the pipeline applies."""

    accelerator: str = "auto"
    devices: Any = 1  # int, "auto" or a list of device ids
    strategy: str = "auto"  # e.g. ddp; DDP on CPU uses gloo
    num_nodes: int = 1
    precision: str = "32-true"  # "bf16-mixed" on AMX CPUs and recent GPUs
    max_steps: int = -1
    max_epochs: int | None = 1
    val_check_interval: Any = None  # int steps or float fraction of an epoch
    check_val_every_n_epoch: int | None = 1
    limit_val_batches: Any = None
    log_every_n_steps: int = 10
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    num_sanity_val_steps: int = 0
    enable_progress_bar: bool = True
    enable_model_summary: bool = False  # Lightning's layer table, Lightning's output rather than the run's
    deterministic: bool = False
    # torch.set_float32_matmul_precision for the run: auto = "high" (TF32 tensor cores for fp32 matrix products) when
    # the trainer runs on CUDA, PyTorch's own ("highest") elsewhere; or highest | high | medium, as torch defines them
    float32_matmul_precision: str = "auto"
    # Where a step's time goes (Lightning's profilers), written to `<attempt>/profile/<stage>-profile.txt`: null
    # (off), simple (each hook's mean and total time: the data loader's wait, training_step, backward, optimiser
    # step, callbacks), advanced (cProfile per hook: slows the run) or pytorch (operators' CPU and CUDA times of
    # steps 3-5, by the host's time)
    profiler: str | None = None

    def __post_init__(self):
        check_choice("trainer.accelerator", self.accelerator, ACCELERATORS)
        check_choice("trainer.float32_matmul_precision", self.float32_matmul_precision, MATMUL_PRECISIONS)
        if self.profiler is not None:
            check_choice("trainer.profiler", self.profiler, PROFILERS)
        check_choice("trainer.strategy", self.strategy, STRATEGIES)
        check_choice("trainer.precision", self.precision, PRECISIONS)
        devices = self.devices
        if isinstance(devices, str) and re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)+,?\s*", devices):
            devices = [int(d) for d in devices.split(",") if d.strip()]  # Lightning's "0,1": device indices
        if isinstance(devices, list):
            ok = bool(devices) and all(d in Range(0, integer=True) for d in devices)
        else:
            ok = devices is not None and devices in DEVICES
        if not ok:
            raise InputError("config key 'trainer.devices'", f"is {devices!r}; expected {DEVICES}")
        check_ranges(
            "trainer",
            self,
            num_nodes=COUNT,
            accumulate_grad_batches=COUNT,
            log_every_n_steps=COUNT,
            check_val_every_n_epoch=COUNT,
            gradient_clip_val=NON_NEGATIVE,
            # max_steps 0 is allowed: nothing is trained, the run tests the starting model
            max_steps=Range(0, also=(-1,), note="-1: no limit"),
            max_epochs=Range(1, also=(-1,), note="-1: no limit"),
            val_check_interval=(
                Range(1, integer=True, note="steps"),
                Range(0, 1, lo_open=True, note="a fraction of an epoch"),
            ),
            limit_val_batches=(Range(0, integer=True, note="batches"), Range(0, 1, note="a fraction")),
            num_sanity_val_steps=Range(0, also=(-1,), note="-1: all"),
        )


@dataclass
class LoggerConfig:
    """The `logger` group: where a run's metrics go (W&B, a CSV file, or nowhere) and how its W&B run is named."""

    name: str = "wandb"  # wandb | csv | none
    project: str = "isorank"
    entity: str | None = None
    group: str | None = None
    run_name: str | None = None
    # auto: online when WANDB_API_KEY is set (or `wandb login` was run), offline otherwise
    mode: str = "auto"
    tags: list[str] = field(default_factory=list)

    def __post_init__(self):
        check_choice("logger.name", self.name, ("wandb", "csv", "none"))
        check_choice("logger.mode", self.mode, ("auto", "online", "offline", "disabled"))


@dataclass
class EvalConfig:
    """The `eval` keys: the measures every test reports, the isotropy and ATS protocols, and the re-ranking depths."""

    measures: list[str] = field(default_factory=lambda: list(DEFAULT_MEASURES))
    before_training: bool = True  # test once before fine-tuning too, for the before/after table
    start_candidate: bool = True  # validate at step 0 too: the starting model is a candidate for the best checkpoint
    probe_queries: int = 32  # `probe` isotropy protocol: a fixed probe set for the I(W) and avgcos training curves
    probe_docs: int = 64
    isotropy_paper: bool = True  # the `paper` isotropy protocol at test (iw_paper*, avgcos_paper*); false skips it
    isotropy_batch_pairs: int = 16  # `paper` isotropy protocol (test metrics iw_paper*): pairs per test batch
    # `paper` protocol over a seeded uniform sample of this many test batches, the same for every model and run seed
    # (null: all of them, the paper's reading); the mean's standard error is iw_paper_std / sqrt(isotropy_paper_batches)
    isotropy_max_batches: int | None = None
    isotropy_sample_seed: int = 0
    dump_isotropy: bool = False  # write each test batch's scored vectors to <output_dir>/isotropy_batches/<k>.npz
    ats_passages: int = 128  # ATS / MATS (callbacks/ats.py) over this many passages of the split; 0 = off
    ats_max_occurrences: int = 100  # seeded cap on the occurrences per term
    # MATS (Eq. 9, metrics/ats.py), here and in analysis=ats: "paper" = as printed, 1/(max da - 1) times the sum of
    # the max da drops ATS(0) - ATS(i); "mean" = the plain mean of those drops (a factor (max da - 1)/max da lower)
    mats: str = "paper"
    # Re-ranking depths to choose from on validation (metrics/rerank_depth.py; position-bias paper section 3: "The
    # re-ranking depth for each model instance is tuned on the best mean nDCG@10 of the validation set, as part of an
    # early stopping strategy", up to 100 on SQuAD): every validation keeps the depth with the best nDCG@10, and the
    # test re-ranks the first-stage top d chosen at the tested checkpoint's validation (metrics.json `rerank_depth`).
    # Each split is scored once at data.candidate_depth, which must be at least the largest depth. null: no choice,
    # every candidate is re-ranked.
    rerank_depths: list[int] | None = None

    def __post_init__(self):
        if not self.measures:  # an empty selection is an error, never "the defaults"
            raise InputError(
                "config key 'eval.measures'",
                f"is empty; expected a list of trec_eval measures, e.g. {list(DEFAULT_MEASURES)}",
            )
        check_measures(self.measures, "config key 'eval.measures'")  # at load, not after the model is built
        check_ranges(
            "eval",
            self,
            probe_queries=COUNT,
            probe_docs=COUNT,
            isotropy_batch_pairs=Range(1, note="the isotropy paper's is 16"),
            isotropy_max_batches=Range(1, note="or null: every test batch"),
            isotropy_sample_seed=SEED,
            ats_passages=Range(0, note="0 = off"),
            ats_max_occurrences=Range(2, note="pairs need two"),
        )
        if self.rerank_depths is not None:
            depths = list(self.rerank_depths)
            if (
                not depths
                or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in depths)
                or len(set(depths)) != len(depths)
            ):
                raise InputError(
                    "config key 'eval.rerank_depths'",
                    f"is {depths!r}; expected a non-empty list of distinct depths >= 1 (e.g. [10, 20, 50, 100]), "
                    "or null",
                )
        if self.dump_isotropy and not self.isotropy_paper:
            raise InputError(
                "config key 'eval.dump_isotropy'",
                "is true but eval.isotropy_paper is false: the dump is the `paper` protocol's test batches",
            )
        # keys of a protocol switched off, set away from their defaults, would be silently unused by every job
        if not self.isotropy_paper:
            why = "eval.isotropy_paper is false, which turns the `paper` protocol off"
            check_unused("eval", self, PAPER_PROTOCOL_KEYS, why, "set eval.isotropy_paper=true")
        if not self.ats_passages:
            why = "eval.ats_passages is 0, which turns the ATS protocol off"
            check_unused("eval", self, ("ats_max_occurrences",), why, "set eval.ats_passages > 0")
        check_choice("eval.mats", self.mats, MATS_MODES)


# the `paper` isotropy protocol's settings (callbacks/isotropy.py `measure_paper`), read only with eval.isotropy_paper
PAPER_PROTOCOL_KEYS = ("isotropy_batch_pairs", "isotropy_max_batches", "isotropy_sample_seed")


def _group_schemas():
    return SOURCES, OptimConfig


@dataclass
class RunConfig:
    """The top-level keys of a run: the groups, the seed, the output folder, the checkpoints to read and the stage.

    `model`, `data`, `optim`, `head`, `analysis` and `retrieval` are validated against their own schemas (the
    ranker's, the source's, OptimConfig, the head's, the analysis's, the retrieval's); `compose` puts each there as
    the structured node of its schema. They are `Any` here so that a job may replace one with a checkpoint's (e.g.
    `cfg.model = hparams["model"]`, another ranker's keys). Which job takes which of the checkpoint keys and `stage`:
    the job table, pipeline/jobs.py.
    """

    model: Any = None
    data: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    optim: Any = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 42
    output_dir: str = "outputs/default"
    ckpt_path: str | None = None  # train.py: resume this run (optimiser, schedule, step, data order)
    # evaluate.py: the checkpoint to evaluate; train.py stage=head: the fine-tuned ranker; stage=export: the one
    # exported
    ckpt: str | None = None
    # evaluate.py: an isotropy head (from stage=head) to apply on top of `ckpt`; stage=export: the head exported
    head_ckpt: str | None = None
    # train.py: finetune (the ranker) | head (post-hoc isotropy head on a frozen ranker) | export (ckpt= or head_ckpt=
    # as a Hugging Face folder into output_dir, pipeline/export.py)
    stage: str = "finetune"
    experiment: str | None = None
    init_ckpt: str | None = None  # train.py: ranker weights from this checkpoint, optimiser and step fresh (transfer)
    head: Any = None
    analysis: Any = None
    retrieval: Any = None

    def __post_init__(self):
        check_choice("stage", self.stage, ("finetune", "head", "export"))
        check_range("seed", self.seed, SEED)


def load_yaml(path: Path, where: str) -> DictConfig:
    """Read a YAML file that must hold a mapping of keys (a config group option, config.yaml, a grid file).

    Parameters
    ----------
    path : Path
        The YAML file.
    where : str
        What the file is, for the message when it holds no mapping (e.g. `model=repbert`, `grid=squad_3seeds`).

    Returns
    -------
    DictConfig
        The file's keys.

    Raises
    ------
    InputError
        When the file is not valid YAML (the parser's line and column in the message) or holds no mapping.
    """
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError carries line/column in its message
        raise InputError(str(path), f"is not valid YAML ({' '.join(str(e).split())})") from e
    if not isinstance(cfg, DictConfig):
        raise InputError(str(path), f"{where}: expected a mapping of keys")
    return cfg


def _option(group: str, option: str) -> DictConfig:
    path = CONFIG_DIR / group / f"{option}.yaml"
    if not path.exists():
        options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
        raise InputError(f"config group '{group}'", f"no option '{option}'; expected one of {options}")
    return load_yaml(path, f"{group}={option}")


def model_defaults(name: str) -> dict:
    """Return the keys of `configs/model/<name>.yaml` over its ranker's schema defaults, with nothing above them.

    What a `model` key is when the command line leaves it: a job tells a key the user set from a default this way.
    """
    picked = _option("model", name)
    picked.pop("optim", None)  # the ranker's optim defaults (merged into `optim`)
    return OmegaConf.to_container(merge_structured(model_entry(name).schema, picked, prefix="model."))


def head_defaults(name: str) -> dict:
    """Return the keys of `configs/head/<name>.yaml` over its head's schema defaults: a `head` key the user left."""
    schema = HEADS.get(name, "head.name").schema
    return OmegaConf.to_container(merge_structured(schema, _option("head", name), prefix="head."))


def _config_key(key: str) -> str:
    return f"config key '{key}'"


def _failed_key(e: OmegaConfBaseException, prefix: str) -> str:
    key = getattr(e, "full_key", None) or getattr(e, "key", None) or "?"
    return f"{prefix}{key}" if prefix and not str(key).startswith(prefix) else str(key)


def translate_error(
    e: OmegaConfBaseException, prefix: str = "", where: Callable[[str], str] = _config_key
) -> InputError:
    """Return OmegaConf's error as one line, an InputError naming the key that failed.

    Parameters
    ----------
    e : OmegaConfBaseException
        The error of a merge or of a conversion to objects (a wrong type, an unknown key, a missing interpolation).
    prefix : str
        The key path of the merged node inside the whole config (e.g. `model.`), put in front of the failed key.
    where : Callable[[str], str]
        Names the failed key's place from its path (default: `config key '<key>'`).

    Returns
    -------
    InputError
        `where(key)` and the problem: `unknown key`, or the first line of OmegaConf's message.
    """
    msg = str(e).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not" in msg:
        return InputError(where(_failed_key(e, prefix)), "unknown key")
    return InputError(where(_failed_key(e, prefix)), msg)


def merge_structured(
    schema: type,
    *layers: DictConfig,
    prefix: str,
    where: Callable[[str], str] = _config_key,
    unknown: Callable[[str], InputError] | None = None,
) -> DictConfig:
    """Merge `layers` in order onto `schema`, each value checked against its field's type.

    The run config's groups are merged with it, and grid/spec.py's grid files.

    Parameters
    ----------
    schema : type
        A dataclass: its fields are the keys the layers may set.
    *layers : DictConfig
        The layers, lowest precedence first (e.g. group YAML, experiment, command line).
    prefix : str
        The key path of the merged node inside the whole config (e.g. `model.`; "" at the top).
    where : Callable[[str], str]
        Names a failed key's place from its path (default: `config key '<key>'`).
    unknown : Callable[[str], InputError] or None
        The error for a key the schema lacks, from its path (default: one naming the schema and its keys).

    Returns
    -------
    DictConfig
        The merged structured node; its schema's `__post_init__` checks run when it is made an object.

    Raises
    ------
    InputError
        On a key the schema lacks or a value of the wrong type, naming the key.
    """
    node = OmegaConf.structured(schema)
    for layer in layers:
        try:
            node = OmegaConf.merge(node, layer)
        except OmegaConfBaseException as e:
            known = sorted(OmegaConf.structured(schema).keys())
            err = translate_error(e, prefix, where)
            if "unknown key" in err.problem:
                err = (
                    unknown(_failed_key(e, prefix))
                    if unknown
                    else InputError(
                        err.where,
                        f"unknown key; {prefix.rstrip('.')} '{getattr(schema, '__name__', schema)}' accepts {known}",
                    )
                )
            raise err from e
    return node


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_control_characters(key: str, value: str) -> None:
    """Refuse a path or name `value` (of config key `key`) that holds a control character.

    Paths and names with a control character (a newline in output_dir, pasted from a wrapped line) are refused:
    YAML would fold the newline into a space and the run would write into another path than the one typed.
    """
    m = _CONTROL.search(value)
    if m:
        raise InputError(
            f"config key '{key}'",
            f"is {value!r}: it holds the control character {m.group()!r} at position {m.start()}; "
            "paths and names may not hold control characters",
        )


def _check_strings(node: Any, prefix: str = "") -> None:
    """Every string of a composed config (from the command line, a group YAML or an experiment)."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node)
    if isinstance(node, dict):
        for k, v in node.items():
            _check_strings(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _check_strings(v, f"{prefix}[{i}]")
    elif isinstance(node, str):
        check_control_characters(prefix, node)


def parse_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split `key=value` args into group choices (`model=repbert`, `experiment=...`) and key overrides (`a.b=value`).

    An argument without `=`, or one holding a control character, is a one-line error.
    """
    choices, overrides = {}, []
    for arg in argv:
        if "=" in arg:
            check_control_characters(arg.split("=", 1)[0], arg.split("=", 1)[1])
        if "=" not in arg:
            raise InputError(f"argument '{arg}'", "expected key=value (e.g. model=repbert or trainer.max_steps=100)")
        key, value = arg.split("=", 1)
        if key in GROUPS or key == "experiment":
            choices[key] = value
        else:
            overrides.append(arg)
    return choices, overrides


def compose(argv: list[str]) -> DictConfig:
    """Compose and validate the run config of the `key=value` args (module doc: the layers and their precedence).

    Every group is checked against its schema, then the cross-group limits (rerank depths, model limits, index
    limits) before anything is read or written; a problem is an InputError naming the key.

    Parameters
    ----------
    argv : list[str]
        The `group=option` and `key=value` arguments.

    Returns
    -------
    DictConfig
        The typed config: the structured node of `RunConfig`, each group in it the structured node of the schema it
        was validated against (`cfg.trainer` a `TrainerConfig`, `cfg.model` its ranker's config, ...), so that a
        wrong-typed value or an unknown key assigned later fails as it would on the command line. `model`, `data`,
        `optim`, `head`, `analysis` and `retrieval` may be replaced whole (`cfg.model = <a checkpoint's dict>`).

    Raises
    ------
    InputError
        On an unknown group option or key, a wrong type or value, or a cross-group limit, naming the key.
    """
    sources, optim_schema = _group_schemas()
    choices, overrides = parse_args(argv)
    base = load_yaml(CONFIG_DIR / "config.yaml", "config.yaml")
    defaults = dict(base.pop("defaults", {}))
    exp_name = choices.get("experiment")
    exp = OmegaConf.create()
    if exp_name:
        exp = _option("experiment", exp_name)
        defaults.update(dict(exp.pop("defaults", {})))
    defaults.update({k: v for k, v in choices.items() if k != "experiment"})
    try:
        cli = OmegaConf.from_dotlist(overrides)
    except Exception as e:
        raise InputError("command line", f"cannot parse overrides {overrides}: {e}") from e

    def layers(group: str) -> list[DictConfig]:
        return [node.get(group, OmegaConf.create()) for node in (base, exp, cli)]

    groups: dict[str, DictConfig] = {}
    model_optim = OmegaConf.create()
    checked: dict[str, object] = {}  # each group's typed object, its schema's checks run
    for group in GROUPS:
        option = defaults.get(group)
        if option is None:
            raise InputError("configs/config.yaml", f"defaults has no option for group '{group}'")
        picked = _option(group, str(option))
        if group == "model" and "optim" in picked:
            model_optim = picked.pop("optim")  # the ranker's optim defaults, merged into `optim` below
        stack = [picked, *layers(group)]
        raw = OmegaConf.merge(*[OmegaConf.create(OmegaConf.to_container(s)) for s in stack])
        if group == "model":
            schema = model_entry(str(raw.get("name"))).schema  # a ranker or a first-stage retriever
        elif group == "data":
            schema = sources.get(str(raw.get("source")), "data.source").schema
        elif group == "head":
            schema = HEADS.get(str(raw.get("name")), "head.name").schema
        elif group == "analysis":
            schema = load_all().get(str(raw.get("name")), "analysis.name").schema
        elif group == "retrieval":
            schema = retrieval_schema(str(raw.get("name")))
        else:
            schema = {"trainer": TrainerConfig, "logger": LoggerConfig}[group]
        groups[group] = merge_structured(schema, *stack, prefix=f"{group}.")
        checked[group] = OmegaConf.to_object(groups[group])  # runs the schema's __post_init__ checks (choices)
    check_fit_keys(checked["head"])

    rest = [OmegaConf.masked_copy(n, [k for k in n if k not in GROUPS]) for n in (base, exp, cli)]
    top = merge_structured(
        RunConfig, *[OmegaConf.masked_copy(n, [k for k in n if k not in ("optim",)]) for n in rest], prefix=""
    )
    base_optim, *later_optim = [n.get("optim", OmegaConf.create()) for n in rest]
    optim = merge_structured(optim_schema, base_optim, model_optim, *later_optim, prefix="optim.")
    check_loss_keys(OmegaConf.to_object(optim))
    OmegaConf.to_object(top)  # RunConfig.__post_init__: stage
    cfg = top  # typed: RunConfig's node, each group the node of its own schema (the keys keep RunConfig's order)
    for group in GROUPS:
        cfg[group] = groups[group]
    cfg.optim = optim
    cfg.experiment = exp_name
    check_rerank_depths(cfg)
    _check_strings(cfg)
    check_model_limits(checked["model"])  # before anything is read or written
    check_index_limits(cfg)
    return cfg


def check_index_limits(cfg: DictConfig) -> None:
    """Check that `retrieval.pq_m` divides the vectors' width, when that is known at config time.

    The width comes from the ranker config of the command line, or (ckpt=) from the checkpoint's hyper-parameters,
    read from its header without its tensors.
    """
    r = cfg.retrieval
    if r.name != "dense" or r.get("index_type") not in ("pq", "ivfpq") or not r.get("pq_m"):
        return
    model = cfg.model
    if cfg.get("ckpt") and Path(cfg.ckpt).is_file():
        model = read_header(str(cfg.ckpt), "ckpt")["hyper_parameters"]["model"]
    schema = model_entry(str(model["name"])).schema
    if schema is None:
        return
    dim = output_dim(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), model)))
    if dim is not None and dim % int(r.pq_m):
        divisors = [m for m in range(1, dim + 1) if dim % m == 0]
        raise InputError(
            "config key 'retrieval.pq_m'",
            f"is {r.pq_m}, which does not divide the {dim}-dimensional vectors of "
            f"ranker '{model['name']}'; expected a divisor of {dim}, e.g. {divisors[-6:]}",
        )


def check_rerank_depths(cfg: DictConfig) -> None:
    """eval.rerank_depths cut runs scored at data.candidate_depth: a larger depth would silently equal it."""
    depths, candidates = cfg.eval.rerank_depths, cfg.data.get("candidate_depth")
    if depths and candidates is not None and max(depths) > candidates:
        raise InputError(
            "config key 'eval.rerank_depths'",
            f"lists depth {max(depths)} but data.candidate_depth is {candidates}: "
            "every split is scored once at data.candidate_depth and cut to each depth; "
            f"set data.candidate_depth={max(depths)}",
        )


def check_validation_schedule(cfg: DictConfig) -> None:
    """Refuse a fine-tuning whose validations would all fall after its last step (the `finetune` job's check).

    An integer `trainer.val_check_interval` counts training batches: above `max_steps` x `accumulate_grad_batches`
    no validation runs once training starts, so the step-0 validation of the starting model (eval.start_candidate)
    stays the best and the test uses the starting weights, as if fine-tuning had lost. Not checked when validation is
    off (`limit_val_batches=0`), the run is bounded by epochs, or the starting model is no candidate.
    """
    t = cfg.trainer
    every, steps, accumulate = t.val_check_interval, int(t.max_steps), int(t.accumulate_grad_batches)
    if not isinstance(every, int) or isinstance(every, bool) or steps <= 0 or t.limit_val_batches == 0:
        return
    if cfg.get("ckpt_path"):  # a resume: its best so far was chosen by validations before it
        return
    if cfg.eval.start_candidate and every > steps * accumulate:
        batches = f"{steps} x trainer.accumulate_grad_batches {accumulate} = " if accumulate > 1 else ""
        raise InputError(
            "config key 'trainer.val_check_interval'",
            f"is {every} training batches, but trainer.max_steps={steps} trains {batches}{steps * accumulate}: no "
            "validation would run after fine-tuning starts, and the test would use the starting model (its step-0 "
            f"validation the only one); set trainer.val_check_interval <= {steps * accumulate}",
        )


def to_yaml(cfg: DictConfig) -> str:
    """Return the composed config as YAML, as `--dry-run` prints it."""
    return OmegaConf.to_yaml(cfg)
