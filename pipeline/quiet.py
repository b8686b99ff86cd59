"""Library noise: the known messages of libraries that a user of this pipeline cannot act on, silenced at their source.

The one place for such filters (docs/logging.md#library-messages lists every known message, what the project does
about it and why). A message the pipeline can act on is acted on where it arises, not filtered here: checkpoints are
saved with `weights_only=False` (callbacks/checkpoint.py), seeds are set without Lightning's "Seed set to" line,
Lightning's unused `anonymous` W&B setting is dropped and W&B runs quietly (callbacks/loggers.py), fp32 matrix
products use TF32 on CUDA (`trainer.float32_matmul_precision`, core/precision.py), DataLoaders get workers on GPUs
(`data.num_workers`, datamodules/datamodule.py).

Every filter is narrow: a Python warning by its message and category, a log record by the logger that emits it and
its message, or the library's own switch for its progress bars. Anything else a library says still reaches the user,
and tests/test_quiet_output.py fails when a new message appears in the runs it makes.

`quiet_libraries()` is called by each entry point before the job runs (pipeline/cli.py for train.py and
evaluate.py, on every DDP rank, since each rank runs the entry script; experiments.py for its in-process cells).
"""

from __future__ import annotations

import logging
import re
import warnings

# Python warnings raised inside libraries: (message regex, category, why it cannot be acted on)
WARNINGS = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        "pytorch-lightning 2.6 builds torch's deprecated LeafSpec at every step; no code of ours is involved",
    ),
    (
        r"torch\.distributed\.nn\.functional\.all_gather is deprecated",
        FutureWarning,
        "Lightning's all_gather(sync_grads=True), which gathers in-batch negatives across DDP ranks, calls it; the "
        "replacement torch names is a private module (torch.distributed._functional_collectives)",
    ),
    (
        r"It is recommended to use `self\.log\('(val|test)/[^']*', \.\.\., sync_dist=True\)`",
        UserWarning,
        "under DDP the pipeline's val/ and test/ values are computed from runs and states gathered over every rank, "
        "the same on each (sync_dist=False on purpose: lightning_modules/module.py, callbacks/isotropy.py, ats.py)",
    ),
    (
        r"The '\w+' does not have many workers which may be a bottleneck",
        UserWarning,
        "data.num_workers decides: null gives one worker per spare core on a GPU and none on a CPU, where the model "
        "uses the cores the workers would take; the head stage's cached representations need none",
    ),
    (
        r"Precision bf16-mixed is not supported by the model summary",
        UserWarning,
        "bf16-mixed keeps fp32 weights, so the 32-bit size the summary then assumes is the right one",
    ),
    (
        r"The number of training batches \(\d+\) is smaller than the logging interval",
        UserWarning,
        "Lightning counts logging steps across epochs (max_steps runs), so a short epoch loses no train/ scalar; "
        "pipeline/run.py warns, naming trainer.log_every_n_steps, when the whole run has fewer steps than it",
    ),
)

# Log records: logger name -> (message regex, why). Lightning's rank-zero helpers log through whichever of these
# module loggers was set last (each package replaces lightning_utilities' `log`), so its lines are listed under all.
_LIGHTNING_INFO = (
    (r"(GPU|TPU|HPU) available: ", "Lightning's device inventory; the run's device is trainer.accelerator's"),
    (r"💡 Tip: .*litlogger", "an advertisement for a logger this project does not use"),
    (r"`Trainer\.fit` stopped: `max_(steps|epochs)=", "the normal end of training, at trainer.max_steps"),
    (
        r"(Restoring states from|Loaded model weights from) the checkpoint",
        "the test of the best checkpoint loading it; metrics.json names its step (best_step). A resumed run's "
        "'Restored all states from the checkpoint' still shows",
    ),
    (
        r"distributed_backend=\w+\nAll distributed processes registered",
        "the DDP ranks' start-up (trainer.devices x trainer.num_nodes ranks); a rank that fails to start says so",
    ),
    (
        r"You are using a CUDA device .* that has Tensor Cores",
        "trainer.float32_matmul_precision=auto sets 'high' on CUDA; Lightning hints only when another value "
        "(highest) was chosen on purpose",
    ),
)
LOG_RECORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "pytorch_lightning.utilities.rank_zero": _LIGHTNING_INFO,
    "lightning_fabric.utilities.rank_zero": _LIGHTNING_INFO,
    "lightning_utilities.core.rank_zero": _LIGHTNING_INFO,
    # printed by every rank as it joins the process group
    "lightning_fabric.utilities.distributed": (
        (r"Initializing distributed: GLOBAL_RANK: ", "each DDP rank's start-up, the same on every run"),
    ),
}


class _Drop(logging.Filter):
    """Drop the records whose message matches one of `patterns`, or for which `predicate` holds."""

    def __init__(self, patterns: tuple[str, ...] = (), predicate=None):
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        self.predicate = predicate

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is the library's to report
            return True
        if self.pattern is not None and self.pattern.search(text):
            return False
        return not (self.predicate is not None and self.predicate(text))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROW = re.compile(r"^(\S+)\s*\|\s*([A-Z_]+)\s*\|")


def pooler_only_report(text: str) -> bool:
    """Whether `text` is transformers' load report saying only that BERT's pooler weights were not used.

    Every backbone is loaded without its pooler (`add_pooling_layer=False`, models/rankers/backbone.py: no ranker
    reads it), so a checkpoint that has one always reports `pooler.*` as UNEXPECTED. A report with any other row (a
    missing or mismatched weight) is kept.
    """
    text = _ANSI.sub("", text)
    if "LOAD REPORT" not in text:
        return False
    rows = [m.groups() for m in map(_ROW.match, text.splitlines()) if m and m.group(1) != "Key"]
    return bool(rows) and all(key.startswith("pooler.") and status == "UNEXPECTED" for key, status in rows)


def filter_warnings() -> None:
    """Add the filters of `WARNINGS` to Python's warning filters (again: no duplicate entry)."""
    for message, category, _why in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def quiet_libraries() -> None:
    """Install every filter above; a second call adds nothing."""
    filter_warnings()
    for name, entries in LOG_RECORDS.items():
        _add_once(logging.getLogger(name), _Drop(tuple(p for p, _why in entries)))
    # transformers 5 logs its load report through its own logger, as a warning
    _add_once(logging.getLogger("transformers.modeling_utils"), _Drop(predicate=pooler_only_report))
    try:
        from transformers.utils import logging as hf_logging  # lazy: heavy; a job without a backbone may not need it
    except ImportError:
        return
    previous = hf_logging.set_tqdm_hook(None)
    hf_logging.set_tqdm_hook(previous if getattr(previous, "quiet", False) else _quiet_bars(previous, hf_logging))


def _add_once(logger: logging.Logger, drop: _Drop) -> None:
    if not any(isinstance(f, _Drop) for f in logger.filters):
        logger.addFilter(drop)


# transformers' bars of a step that takes a moment for this project's backbones (1-100 MB); a model download keeps
# huggingface_hub's bar, and the phases that take long have the pipeline's own progress
QUIET_BARS = ("Loading weights", "Writing model shards")


def _quiet_bars(previous, hf_logging):
    """Return a transformers tqdm hook that gives `QUIET_BARS` an empty bar and every other bar to `previous`."""

    def hook(factory, args, kwargs):
        if kwargs.get("desc") in QUIET_BARS:
            return hf_logging.EmptyTqdm(*args, **kwargs)
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    hook.quiet = True
    return hook
