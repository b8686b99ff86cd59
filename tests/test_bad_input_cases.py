"""Bad input through the real entry scripts, one table row per case (issue 22; the table in docs/reliability.md).

Every case runs train.py, evaluate.py or experiments.py in a subprocess, as a user would, and must end with exit code
2, exactly one `error:` line naming the key or file and what was expected, no traceback, and nothing new in the
test's folder (no output_dir, no config.yaml, no lock files beside it). No case builds a model: input is checked
first, which is the point. Finer unit-level checks of each message live in test_data_bad_input.py,
test_config.py, test_faults.py and test_lock.py; this table checks the whole way from command line to exit code.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SMALL_SYNTHETIC, fake_checkpoint, run_script

pytestmark = pytest.mark.slow  # 48 Python start-ups of the pipeline, ~5 s each: about 4 min on 2 CPU cores

COLLECTION = "d1\tthe cat sat on the mat\nd2\tdogs bark at night\nd3\ta cat and a dog\nd4\tbirds sing\n"
QUERIES = "q1\tcat\nq2\tdogs\n"
QRELS = "q1 0 d1 1\nq2 0 d2 1\n"
GOOD = {"collection.tsv": COLLECTION, "queries.tsv": QUERIES, "qrels.txt": QRELS}

# every split reads the same three files unless a case points one key elsewhere (later overrides win)
TSV = (
    ["data=tsv", "data.collection={tmp}/collection.tsv", "data.train_triples=null"]
    + [
        f"data.{split}_{key}={{tmp}}/{name}"
        for split in ("train", "val", "test")
        for key, name in (("queries", "queries.tsv"), ("qrels", "qrels.txt"))
    ]
    + [f"data.{split}_run=null" for split in ("train", "val", "test")]
)
# what evaluate.py reads of them: the test split's (it refuses the other splits' keys, pipeline/jobs.py)
TSV_TEST = [a for a in TSV if not a.startswith(("data.train_", "data.val_"))]
# before each case's own arguments, keys that every job takes (how a run reports, where it writes: the jobs refuse a
# key they do not read, pipeline/jobs.py); experiments.py takes grid keys instead
COMMON = [
    "logger=none",
    "trainer.enable_progress_bar=false",
    "output_dir={out}",
    "data.cache_dir={cache}",
]


def files(extra: dict[str, str | bytes] | None = None, good: bool = True) -> Callable[[Path], None]:
    """Setup writing the good TSV files (unless good=False), then `extra` ({relative path: text or bytes}) over them."""

    def setup(tmp: Path) -> None:
        for name, content in {**(GOOD if good else {}), **(extra or {})}.items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))

    return setup


SQUAD_NO_ANSWERS = json.dumps(
    {
        "version": "1.1",
        "data": [
            {
                "title": "t",
                "paragraphs": [{"context": "Paris is in France.", "qas": [{"id": "a", "question": "Where is Paris?"}]}],
            }
        ],
    }
)
GRID_UNKNOWN_KEY = "name: g\nbaseline: bm25\nrows:\n  bm25: [model=bm25]\ntrain_data: [synthetic]\nseedz: [1, 2]\n"


@dataclass
class Case:
    id: str
    script: str  # train.py | evaluate.py | experiments.py
    argv: list[str]  # placeholders: {tmp} the test's folder, {out} its output_dir, {ckpt} a ColBERT checkpoint, {cache}
    expect: str  # what the one error line must contain (placeholders as argv, {pid} this process)
    setup: Callable[[Path], None] | None = None  # writes the bad (and good) files into {tmp}
    code: int = 2
    hold_lock: bool = False  # this process holds output_dir's lock while the case runs
    xfail: str | None = None  # why the case does not yet get its one line (strict: fixing it must remove this)


CASES = [
    # ---- data files: FILE:LINE and what was expected
    Case(
        "duplicate-doc-id",
        "train.py",
        TSV,
        "collection.tsv:2: duplicate passage id 'd1' (first at line 1); expected unique ids",
        files({"collection.tsv": "d1\tthe cat\nd1\tthe cat again\nd2\tdogs\n"}),
    ),
    Case(
        "duplicate-query-id",
        "evaluate.py",
        ["model=bm25", *TSV_TEST],
        "queries.tsv:3: duplicate query id 'q1'",
        files({"queries.tsv": "q1\tcat\nq2\tdogs\nq1\tcats\n"}),
    ),
    Case(
        "qrels-grade-not-integer",
        "train.py",
        TSV,
        "qrels.txt:2: relevance 'high' is not an integer",
        files({"qrels.txt": "q1 0 d1 1\nq2 0 d2 high\n"}),
    ),
    Case(
        "invalid-utf8",
        "evaluate.py",
        ["model=bm25", *TSV_TEST],
        "queries.tsv:2: is not valid UTF-8",
        files({"queries.tsv": b"q1\tcat\nq2\tdo\xffgs\n"}),
    ),
    Case(
        "one-column-line",
        "train.py",
        TSV,
        "collection.tsv:2: expected 2 tab-separated columns (passage id, passage text), got 1",
        files({"collection.tsv": "d1\tthe cat\nd2 dogs bark\n"}),
    ),
    Case(
        "empty-passage-text",
        "evaluate.py",
        ["model=bm25", *TSV_TEST],
        "collection.tsv:3: empty passage text for id 'd3'",
        files({"collection.tsv": "d1\tthe cat\nd2\tdogs\nd3\t \n"}),
    ),
    Case(
        "triples-two-columns",
        "train.py",
        [*TSV, "data.train_triples={tmp}/triples.tsv"],
        "triples.tsv:2: expected 3 tab-separated columns",
        files({"triples.tsv": "q1\td1\td2\nq2\td2\n"}),
    ),
    Case(
        "run-score-not-a-number",
        "train.py",
        [*TSV, "data.val_run={tmp}/val_run.txt"],
        "val_run.txt:1: score 'high' is not a number",
        files({"val_run.txt": "q1 Q0 d1 1 high bm25\n"}),
    ),
    Case(
        "qrels-unknown-query",
        "train.py",
        TSV,
        "qrels.txt:2: qrels of split train name query 'q9' which is not among the queries",
        files({"qrels.txt": "q1 0 d1 1\nq9 0 d2 1\n"}),
    ),
    Case(
        "squad-without-answers",
        "evaluate.py",
        ["model=bm25", "data=squad", "data.path={tmp}/squad.json"],
        "missing key 'answers'; expected the SQuAD v1.1 format",
        files({"squad.json": SQUAD_NO_ANSWERS}, good=False),
    ),
    # ---- missing or empty files, empty splits
    Case(
        "missing-data-file",
        "train.py",
        [*TSV, "data.test_qrels={tmp}/no_such_qrels.txt"],
        "data.test_qrels: path '{tmp}/no_such_qrels.txt' does not exist",
        files(),
    ),
    Case(
        "data-file-is-a-folder",
        "evaluate.py",
        ["model=bm25", *TSV_TEST, "data.collection={tmp}"],
        "data.collection: path '{tmp}' is a directory",
        files(),
    ),
    Case(
        "missing-data-folder",
        "train.py",
        ["data=cranfield", "data.path={tmp}/no_cranfield"],
        "data.path: path '{tmp}/no_cranfield' does not exist",
    ),
    Case(
        "empty-collection",
        "train.py",
        TSV,
        "collection.tsv: is empty; expected lines of 2 tab-separated columns",
        files({"collection.tsv": ""}),
    ),
    Case(
        "empty-queries-file",
        "evaluate.py",
        ["model=bm25", *TSV_TEST, "data.test_queries={tmp}/test_queries.tsv"],
        "test_queries.tsv: is empty; expected lines of 2 tab-separated columns (query id, query text)",
        files({"test_queries.tsv": "\n\n"}),
    ),
    Case(
        "empty-qrels",
        "train.py",
        TSV,
        "qrels.txt: is empty; expected lines of 4 whitespace-separated columns",
        files({"qrels.txt": ""}),
    ),
    Case(
        "empty-train-split",
        "train.py",
        [*TSV, "data.train_qrels={tmp}/train_qrels.txt"],
        "split 'train': has no training triple",
        files({"train_qrels.txt": "q1 0 d1 0\nq2 0 d2 0\n"}),
    ),
    # the val run ranks only q2, which val does not judge: no (judged query, candidate) pair
    Case(
        "empty-val-split",
        "train.py",
        [*TSV, "data.val_qrels={tmp}/val_qrels.txt", "data.val_run={tmp}/val_run.txt"],
        "split 'val': has no (judged query, candidate) pair",
        files({"val_qrels.txt": "q1 0 d1 1\n", "val_run.txt": "q2 Q0 d2 1 1.0 x\n"}),
    ),
    Case(
        "empty-test-split-synthetic",
        "train.py",
        [*SMALL_SYNTHETIC, "data.num_test_queries=0"],
        "data 'synthetic', split 'test': has no (judged query, candidate) pair to score",
    ),
    # ---- config keys: the key, the value and what is allowed
    Case(
        "unknown-config-key",
        "train.py",
        [*TSV, "data.colection={tmp}/collection.tsv"],
        "config key 'data.colection': unknown key",
        files(),
    ),
    Case(
        "unknown-group-option",
        "evaluate.py",
        ["model=colbertt"],
        "config group 'model': no option 'colbertt'; expected one of",
    ),
    Case("argument-without-equals", "train.py", ["--fast"], "argument '--fast': expected key=value"),
    Case(
        "wrong-type",
        "train.py",
        ["data.batch_size=sixteen"],
        "config key 'data.batch_size': Value 'sixteen' of type 'str' could not be converted to Integer",
    ),
    Case(
        "bool-for-an-int",
        "train.py",
        ["trainer.max_steps=true"],
        "config key 'trainer.max_steps': Value 'True' of type 'bool' could not be converted to Integer",
    ),
    Case(
        "devices-0",
        "evaluate.py",
        ["trainer.devices=0"],
        "config key 'trainer.devices': is 0; expected an integer >= 1, or -1, or 'auto'",
    ),
    Case(
        "max-steps-negative",
        "train.py",
        ["model=repbert", "trainer.max_steps=-5"],
        "config key 'trainer.max_steps': is -5; expected >= 0, or -1",
    ),
    Case("lr-negative", "train.py", ["model=tk", "optim.lr=-1"], "config key 'optim.lr': is -1.0; expected > 0"),
    Case("lr-nan", "train.py", ["optim.lr=nan"], "config key 'optim.lr': is nan; expected > 0"),
    Case(
        "batch-size-0",
        "train.py",
        [*TSV, "data.batch_size=0"],
        "config key 'data.batch_size': is 0; expected >= 1",
        files(),
    ),
    Case(
        "isotropy-batch-pairs-0",
        "evaluate.py",
        ["eval.isotropy_batch_pairs=0"],
        "config key 'eval.isotropy_batch_pairs': is 0; expected >= 1",
    ),
    Case(
        "doc-max-len-0",
        "train.py",
        ["model=repbert", "model.doc_max_len=0"],
        "config key 'model.doc_max_len': is 0; expected >= 1",
    ),
    Case(
        "dump-isotropy-without-paper",
        "evaluate.py",
        ["eval.dump_isotropy=true", "eval.isotropy_paper=false"],
        "config key 'eval.dump_isotropy': is true but eval.isotropy_paper is false",
    ),
    # ---- checkpoints
    Case(
        "missing-resume-checkpoint",
        "train.py",
        [*TSV, "ckpt_path={tmp}/no_such.ckpt"],
        "ckpt_path: checkpoint '{tmp}/no_such.ckpt' does not exist",
        files(),
    ),
    Case(
        "corrupt-checkpoint",
        "evaluate.py",
        [*TSV_TEST, "ckpt={tmp}/random.ckpt"],
        "ckpt: cannot read checkpoint '{tmp}/random.ckpt'",
        files({"random.ckpt": random.Random(0).randbytes(4096)}),
    ),
    Case(
        "zero-byte-checkpoint",  # read before the data: no BM25 candidates cached for a job that cannot run
        "evaluate.py",
        [*TSV_TEST, "ckpt={tmp}/zero.ckpt"],
        "ckpt: cannot read checkpoint '{tmp}/zero.ckpt' (it is empty, 0 bytes); it is truncated or not a torch file",
        files({"zero.ckpt": b""}),
    ),
    Case(
        "unknown-measure",  # at load, before the model: the names evaluate_run knows
        "train.py",
        [*TSV, "eval.measures=[P_20,ndcg@10]"],
        "config key 'eval.measures': unknown measure 'ndcg@10'; expected one of",
    ),
    Case(
        "nul-in-passage-id",  # the collection line that holds it, not the qrels line whose id then matches nothing
        "train.py",
        TSV,
        "collection.tsv:2: passage id 'd2\\x00' holds the non-printable character U+0000 at position 2; "
        "expected an id of printable characters",
        files({"collection.tsv": COLLECTION.replace("d2\t", "d2\x00\t")}),
    ),
    Case(
        "space-in-passage-id",  # eighth fault trial E3: found when run.trec was written, naming the run, not the line
        "evaluate.py",
        [*TSV_TEST, "model=bm25"],
        "collection.tsv:2: passage id 'd 2' holds a space at position 1; expected an id without whitespace (TREC run "
        "and qrels files separate their fields by whitespace)",
        files({"collection.tsv": COLLECTION.replace("d2\t", "d 2\t")}),
    ),
    Case(
        "checkpoint-of-another-ranker",
        "evaluate.py",
        [*TSV_TEST, "model=bert_cat", "ckpt={ckpt}"],
        "ckpt: checkpoint '{ckpt}' holds ranker 'colbert' but model.name is 'bert_cat'",
        files(),
    ),
    Case(
        "ranker-checkpoint-as-head",
        "evaluate.py",
        [*TSV_TEST, "head_ckpt={ckpt}"],
        "head_ckpt: '{ckpt}' is not a head checkpoint",
        files(),
    ),
    # ---- jobs that belong to another script or stage
    Case(
        "head-without-stage-head",
        "train.py",
        ["head=whitening"],
        "config key 'head': job 'finetune' (train.py) takes no head=whitening; 'whitening' is trained after "
        "fine-tuning",
    ),
    Case(
        "stage-head-without-head",
        "train.py",
        ["stage=head", "ckpt={ckpt}"],
        "head: stage=head needs head=whitening, head=nice or head=glow",
    ),
    Case(
        "retrieval-via-train",
        "train.py",
        ["retrieval=dense"],
        "config key 'retrieval': job 'finetune' (train.py) takes no retrieval=dense; 'dense' runs from evaluate.py",
    ),
    Case(
        "analysis-via-train",
        "train.py",
        ["analysis=ats"],
        "config key 'analysis': job 'finetune' (train.py) takes no analysis=ats; 'ats' runs from evaluate.py",
    ),
    Case("bm25-via-train", "train.py", ["model=bm25"], "model: 'bm25' has nothing to train"),
    Case(
        "bm25-with-checkpoint",
        "evaluate.py",
        ["model=bm25", "ckpt={ckpt}"],
        "config key 'ckpt': job 'first_stage' (evaluate.py model=bm25) takes no ckpt; model 'bm25' ranks the "
        "collection by itself and takes no checkpoint",
    ),
    Case(
        "export-via-evaluate",
        "evaluate.py",
        ["stage=export", "ckpt={ckpt}"],
        "config key 'stage': job 'evaluate' (evaluate.py) takes no stage=export; export is a train.py stage",
    ),
    Case(
        "export-into-non-empty-folder",
        "train.py",
        ["stage=export", "ckpt={ckpt}"],
        "output_dir: '{out}' exists and is not empty",
        files({"out/notes.txt": "someone's notes\n"}, good=False),
    ),
    # ---- output directory
    Case(
        "output-dir-locked",
        "evaluate.py",
        ["model=bm25", *SMALL_SYNTHETIC],
        "output_dir: '{out}' is in use by another run (pid {pid} on ",
        hold_lock=True,
    ),
    Case(
        "output-dir-is-a-file",
        "evaluate.py",
        ["model=bm25", *SMALL_SYNTHETIC, "output_dir={tmp}/afile"],
        "output_dir: '{tmp}/afile' exists and is not a folder",
        files({"afile": "not a folder\n"}, good=False),
    ),
    # ---- grids
    Case(
        "unknown-grid",
        "experiments.py",
        ["grid=no_such_grid", "output_root={tmp}/grids"],
        "grid: no grid 'no_such_grid' in",
    ),
    Case(
        "grid-file-unknown-key",
        "experiments.py",
        ["grid={tmp}/grid.yaml", "output_root={tmp}/grids"],
        "grid file {tmp}/grid.yaml: unknown grid key 'seedz'",
        files({"grid.yaml": GRID_UNKNOWN_KEY}, good=False),
    ),
]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `folder` (hidden ones included): relative path -> (size, mtime)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def run_case(case: Case, tmp: Path, ckpt: Path, cache: Path):
    """Set the case up in `tmp`, run it; (process, its `error:` lines, what changed in `tmp`, the placeholders)."""
    from core.lock import output_dir_lock

    values = {"tmp": str(tmp), "out": str(tmp / "out"), "ckpt": str(ckpt), "cache": str(cache), "pid": str(os.getpid())}
    if case.setup:
        case.setup(tmp)
    before = snapshot(tmp)
    common = [] if case.script == "experiments.py" else COMMON
    argv = [a.format(**values) for a in [*common, *case.argv]]
    if case.hold_lock:
        with output_dir_lock(values["out"]):  # as a live run would: flock held, pid file written
            proc = run_script(case.script, *argv, check=False, timeout=300)
    else:
        proc = run_script(case.script, *argv, check=False, timeout=300)
    after = snapshot(tmp)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    return proc, errors, changed, values


@pytest.fixture(scope="module")
def colbert_ckpt(tmp_path_factory, tiny_bert) -> Path:
    """A ColBERT checkpoint on the tiny BERT, as train.py saves one (no training needed to be read)."""
    return fake_checkpoint(tmp_path_factory.mktemp("ckpt") / "colbert.ckpt", tiny_bert)


@pytest.fixture(scope="module")
def bm25_cache(tmp_path_factory) -> Path:
    """data.cache_dir, outside the compared folder: a data error found in the queries or qrels comes after the
    collection's document store (a valid, content-addressed cache, reused by the next run) was built. A bad
    checkpoint writes no cache at all: its header is read first (tests/test_faults_checks.py)."""
    return tmp_path_factory.mktemp("cache")


def test_at_least_30_distinct_cases():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
        for c in CASES
    ],
)
def test_bad_input_case(case, tmp_path, colbert_ckpt, bm25_cache):
    proc, errors, changed, values = run_case(case, tmp_path, colbert_ckpt, bm25_cache)
    assert proc.returncode == case.code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert case.expect.format(**values) in errors[0], errors[0]
    assert changed == [], f"written or changed: {changed}"
