"""What a user sees: the default run, a BM25 evaluation, a ColBERT re-ranking and a dense evaluation print the
project's own lines and nothing else (issue 49).

Each job runs once at a tiny size (tiny random BERT, a few batches) as a process of its own, and every line of its
stdout and stderr must be one of the project's (`is_project_line`) or on the short allow-list (`ALLOWED`). A library
message that comes back (a filter of pipeline/quiet.py lost, a new library version's notice) fails the test with
the line. The project's own warnings must each be printed once and name the config key that changes what they say.
"""

from __future__ import annotations

import re
import warnings

import pytest
from conftest import SMALL_SYNTHETIC, finetune_steps, job_args, run_script, small_run

pytestmark = pytest.mark.slow

# The project's own lines. To accept a new kind of line the project prints, add its pattern here.
PROJECT_LINES = (
    r"(warning|error|stopped): \S.*",  # its one-line messages (pipeline/cli.py)
    r"\S.* \.\.\. done in \d+(\.\d+)? s",  # a phase's progress line: `<phase> ... done in 12.3 s`
    r"test metrics",  # the results table (pipeline/stages.py print_table): its title,
    r"[┏┃┡│└].*[┓┃┩│┘]",  # its rows and rules
    r"[a-zA-Z_@]\w*\t-?\d+(\.\d+)?",  # a `measure<TAB>value` line (retrieval's results)
)
PROJECT_LINE = re.compile("|".join(f"(?:{p})" for p in PROJECT_LINES))

# Library lines a user acts on, kept on purpose (docs/logging.md#library-messages): where the W&B run is and how to
# look at it or sync it. wandb prints them with `quiet=True` (callbacks/loggers.py).
ALLOWED = re.compile(
    r"wandb: (W&B syncing is set to `offline`|Run data is saved locally in |View this run in the terminal with)"
)

# tiny: a 60-passage collection, a few queries (the jobs' fixed costs are most of their seconds)
TINY = ("triples", 16), ("eval_queries", 4), ("depth", 10), ("probe_queries", 4), ("probe_docs", 8)


def tiny_run(*extra: str, logger: bool = False) -> list[str]:
    """small_run at the sizes above, on SMALL_SYNTHETIC's collection; `extra` overrides follow."""
    return small_run(*SMALL_SYNTHETIC, *extra, logger=logger, **dict(TINY))


CONFIG_KEY = re.compile(r"\b(data|model|trainer|eval|optim|logger|retrieval|head|analysis)\.\w+")


def is_project_line(line: str) -> bool:
    """Whether `line` is one the project prints itself (or blank)."""
    text = line.strip()
    return not text or PROJECT_LINE.fullmatch(text) is not None


def foreign_lines(proc) -> list[str]:
    """The lines of a finished run's stdout and stderr that are neither the project's nor allowed."""
    lines = (proc.stdout + proc.stderr).splitlines()
    return [line for line in lines if not is_project_line(line) and not ALLOWED.match(line.strip())]


def check_quiet(proc) -> list[str]:
    """Assert the run printed nothing foreign and each warning once, naming a config key; return its warnings."""
    assert foreign_lines(proc) == [], "\n".join(foreign_lines(proc))
    said = [line.strip() for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(said) == len(set(said)), said
    for line in said:
        assert CONFIG_KEY.search(line), f"names no config key: {line}"
    return said


def offline_wandb(tmp_path) -> dict:
    """The default logger as a user without an API key has it: W&B offline, its files under `tmp_path`."""
    return {
        "WANDB_MODE": "offline",
        "HOME": str(tmp_path),
        "WANDB_DIR": str(tmp_path),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
    }


def test_the_predicate_accepts_the_projects_lines_and_refuses_the_libraries():
    project = [
        "warning: data.max_train_triples=40: training on 40 of the 596 training triples (a seeded sample)",
        "error: config key 'data.nmu_docs' is unknown",
        "stopped: interrupted by SIGTERM at step 3; resume with ckpt_path=x/last.ckpt",
        "bm25 index ... done in 12.3 s",
        "encoding the collection ... done in 4 s",
        "                      test metrics                      ",
        "┏━━━━━━━━━━━━━┳━━━━━━━━┓",
        "│ ndcg_cut_10 │ 0.7472 │",
        "ndcg_cut_10\t0.0000",
        "",
    ]
    library = [  # each once seen in these runs (docs/logging.md#library-messages)
        "Seed set to 42",
        "Loading weights: 100%|██████████| 37/37 [00:00<00:00, 3137.10it/s]",
        "\x1b[1mBertModel LOAD REPORT\x1b[0m from: /x/tiny",
        "pooler.dense.weight | UNEXPECTED |  | ",
        "wandb: WARNING The anonymous setting has no effect and will be removed in a future version.",
        "wandb: Tracking run with wandb version 0.31.0",
        "GPU available: False, used: False",
        "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
        "`weights_only` was not set, defaulting to `False`.",
        "/x/fit_loop.py:321: The number of training batches (5) is smaller than the logging interval",
        "`Trainer.fit` stopped: `max_steps=4` reached.",
        "Restoring states from the checkpoint path at /x/best-0.ckpt",
        "  | Name   | Type       | Params | Mode  | FLOPs",
        "Testing ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 3/3 0:00:05 • 0:00:00 1.07it/s",
        "wandb: Run history:",
    ]
    assert [line for line in project if not is_project_line(line)] == []
    assert [line for line in library if is_project_line(line) or ALLOWED.match(line.strip())] == []


def test_library_warnings_are_filtered_only_by_their_own_messages():
    """quiet_libraries drops the listed library warnings and leaves any other warning of the same category."""
    from pipeline.quiet import WARNINGS, filter_warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        filter_warnings()
        for message, category in (
            ("The 'train_dataloader' does not have many workers which may be a bottleneck. Consider ...", UserWarning),
            ("Precision bf16-mixed is not supported by the model summary.  Estimated ...", UserWarning),
            ("torch.distributed.nn.functional.all_gather is deprecated, use x instead.", FutureWarning),
            ("some other library warning", UserWarning),
            ("some other deprecation", FutureWarning),
        ):
            warnings.warn(message, category, stacklevel=1)
    assert [str(w.message) for w in seen] == ["some other library warning", "some other deprecation"]
    assert len(WARNINGS) == len({m for m, _c, _w in WARNINGS})


def test_lightning_info_lines_are_dropped_by_logger_and_message_others_kept():
    """Lines only a GPU or a DDP run prints (not seen on this CPU) included; a resume's line and any other stay."""
    import logging

    from pipeline.quiet import quiet_libraries

    quiet_libraries()
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            kept.append(record.getMessage())

    emitted = {
        "pytorch_lightning.utilities.rank_zero": [
            "You are using a CUDA device ('NVIDIA H200') that has Tensor Cores. To properly utilize them, ...",
            "GPU available: True (cuda), used: True",
            "-" * 100 + "\ndistributed_backend=nccl\nAll distributed processes registered. Starting with 2 processes\n",
            "Restored all states from the checkpoint at /x/last.ckpt",
            "some other Lightning line",
        ],
        "lightning_fabric.utilities.distributed": ["Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2"],
    }
    for name, lines in emitted.items():
        logger, handler = logging.getLogger(name), Keep()
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)
        try:
            for line in lines:
                logger.info(line)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
    assert kept == ["Restored all states from the checkpoint at /x/last.ckpt", "some other Lightning line"]


def test_load_report_of_only_the_unused_pooler_is_dropped_any_other_is_kept():
    from pipeline.quiet import pooler_only_report

    head = "\x1b[1mBertModel LOAD REPORT\x1b[0m from: /x\nKey | Status |  | \n----+----+--+-\n"
    notes = "\nNotes:\n- UNEXPECTED:\tcan be ignored ..."
    pooler = "pooler.dense.weight | UNEXPECTED |  | \npooler.dense.bias   | UNEXPECTED |  | \n"
    assert pooler_only_report(head + pooler + notes)
    assert not pooler_only_report(head + pooler + "encoder.layer.0.attention.self.query.weight | MISSING |  | " + notes)
    assert not pooler_only_report(head + "cls.predictions.bias | UNEXPECTED |  | \n" + notes)
    assert not pooler_only_report("pooler.dense.weight | UNEXPECTED |  | ")  # not a load report


def test_default_run_prints_only_its_own_lines(tmp_path, tiny_bert):
    """The default run (train.py, W&B offline, tested before and after training, its progress on), tiny.

    Not on a terminal, Lightning's loops report as the pipeline's other phases (callbacks/progress.py LoopPhases):
    every phase prints its done line here (ISORANK_PROGRESS_QUIET_S=0), none a Rich bar's last frame."""
    proc = run_script(
        "train.py",
        *tiny_run(f"model.backbone={tiny_bert}", *finetune_steps(2, before_training=True), logger=True),
        "trainer.enable_progress_bar=true",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"output_dir={tmp_path / 'out'}",
        extra_env={**offline_wandb(tmp_path), "ISORANK_PROGRESS_QUIET_S": "0"},
    )
    said = check_quiet(proc)
    done = [line.split(" ... ")[0] for line in proc.stderr.splitlines() if " ... done in " in line]
    assert done.count("testing") == 2 and "training epoch 0" in done and "validation at step 0" in done, done
    assert any(line.startswith("test metrics") for line in map(str.strip, proc.stdout.splitlines()))
    # the probe's rank-deficiency note, with the isotropy paper's protocol on (the default): once, naming its keys
    assert len([s for s in said if "iw_sequence" in s and "eval.probe_queries" in s]) == 1, said


def test_bm25_evaluation_prints_only_its_own_lines(tmp_path):
    proc = run_script(
        "evaluate.py",
        *job_args("evaluate.py", ["model=bm25", *tiny_run(logger=True)]),
        f"data.cache_dir={tmp_path / 'cache'}",
        f"output_dir={tmp_path / 'out'}",
        extra_env=offline_wandb(tmp_path),
    )
    check_quiet(proc)


def test_colbert_reranking_prints_only_its_own_lines(tmp_path, tiny_bert):
    """Without the isotropy paper's protocol the probe's rank-deficiency note is nothing to act on: not printed."""
    proc = run_script(
        "evaluate.py",
        *job_args(
            "evaluate.py", ["model=colbert", f"model.backbone={tiny_bert}", "eval.isotropy_paper=false", *tiny_run()]
        ),
        f"data.cache_dir={tmp_path / 'cache'}",
        f"output_dir={tmp_path / 'out'}",
    )
    said = check_quiet(proc)
    assert not [s for s in said if "iw_sequence" in s]


def test_dense_evaluation_prints_only_its_own_lines(tmp_path, tiny_bert):
    proc = run_script(
        "evaluate.py",
        *job_args("evaluate.py", ["retrieval=dense", "model=repbert", f"model.backbone={tiny_bert}", *tiny_run()]),
        f"data.cache_dir={tmp_path / 'cache'}",
        f"output_dir={tmp_path / 'out'}",
    )
    check_quiet(proc)
