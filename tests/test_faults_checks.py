"""Checks made before anything loads, results and figures published as one set (issue 48, items 5-7;
docs/reliability.md "Faults: checks before loading, figures in the result set").

In-process (`pipeline.cli.main`) on a tiny random BERT and the synthetic source. The cases of these classes that run
the entry scripts as processes are rows of tests/test_bad_input_cases.py (a zero-byte checkpoint writes no cache, an
unknown measure stops train.py at load, a NUL byte in a passage id names the collection line).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
from conftest import job_args
from test_faults_inputs import SMALL, one_line, run_main


def test_validation_selects_by_ndcg10_when_the_measures_leave_it_out(tmp_path, tiny_bert, capsys):
    """`eval.measures=[P_20,mrr_10]`: validation still computes nDCG@10, which chooses the checkpoint; the test
    reports the measures asked for (it failed with `KeyError: 'val/ndcg_cut_10'` after training)."""
    out = tmp_path / "run"
    argv = [
        *SMALL,
        f"model.backbone={tiny_bert}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "eval.measures=[P_20,mrr_10]",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "eval.before_training=false",
        f"output_dir={out}",
    ]
    assert run_main(argv, job="train") == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"P_20", "mrr_10"} <= metrics.keys() and "ndcg_cut_10" not in metrics
    curve = json.loads((out / "validation.json").read_text())
    assert curve["monitor"] == "val/ndcg_cut_10"
    vals = curve["validations"]
    assert len(vals) == 3 and all("val/ndcg_cut_10" in v and "val/P_20" in v for v in vals)
    best = max(vals, key=lambda v: v["val/ndcg_cut_10"])  # the first of equals, as ModelCheckpoint keeps it
    assert curve["best_step"] == metrics["best_step"] == best["step"]


def _writes_refused(monkeypatch, name: str) -> None:
    """Make the result set's write of `name` fail as a full disk does."""
    import metrics.results as results

    real = results.write_json

    def write_json(path, obj):
        if Path(path).name == name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, obj)

    monkeypatch.setattr(results, "write_json", write_json)


def test_a_failed_continuation_keeps_the_earlier_figures(tmp_path, tiny_bert, capsys, monkeypatch):
    """A continued Glow head run stopped by a full disk leaves isotropy_val.png / isotropy_test.png of the earlier
    result (it replaced them with its own); its figures wait in attempts/<n>/ and join the next published set."""
    common = [*SMALL, f"model.backbone={tiny_bert}", f"data.cache_dir={tmp_path / 'cache'}"]
    ft = tmp_path / "ft"
    assert (
        run_main(
            [
                *common,
                "trainer.max_steps=1",
                "eval.before_training=false",
                "eval.start_candidate=false",
                f"output_dir={ft}",
            ],
            job="train",
        )
        == 0
    )
    out = tmp_path / "glow"
    head = [
        *common,
        "stage=head",
        f"ckpt={ft / 'checkpoints' / 'last.ckpt'}",
        "head=glow",
        "head.hidden_units=8",
        "head.hidden_layers=1",
        "head.batch_size=64",
        f"output_dir={out}",
    ]
    assert run_main([*head, "head.epochs=1"], job="train") == 0
    capsys.readouterr()
    figures = ("isotropy_val.png", "isotropy_test.png", "metrics.json", "config.yaml")
    earlier = {n: (out / n).read_bytes() for n in figures}

    last = out / "checkpoints" / "last.ckpt"
    with monkeypatch.context() as m:
        _writes_refused(m, "per_query.json")
        rc = run_main([*head, "head.epochs=2", f"ckpt_path={last}"], job="train")
    line = one_line(capsys, rc, 1, warned=True)
    assert line == f"error: cannot write '{out}' (No space left on device); earlier results in '{out}' unchanged"
    assert {n: (out / n).read_bytes() for n in figures} == earlier
    attempt = out / "attempts" / "1"
    assert {p.name for p in attempt.iterdir()} == {"config.yaml", "isotropy_val.png", "isotropy_test.png"}
    assert "epochs: 2" in (attempt / "config.yaml").read_text()

    assert run_main([*head, "head.epochs=3", f"ckpt_path={last}"], job="train") == 0
    assert all((out / n).read_bytes() != earlier[n] for n in figures)
    assert "epochs: 3" in (out / "config.yaml").read_text()
    assert not (out / "attempts" / "2").exists()  # the published attempt's folder is gone, the failed one stays
    assert attempt.is_dir()


@pytest.mark.parametrize("script", ["train", "evaluate"])
def test_a_bad_checkpoint_stops_before_the_data(tmp_path, capsys, script):
    """The checkpoints' headers are read first, as `--dry-run` reads them: no data read, no cache, no output_dir."""
    bad = tmp_path / "zero.ckpt"
    bad.write_bytes(b"")
    key = "ckpt_path" if script == "train" else "ckpt"
    out, cache = tmp_path / "out", tmp_path / "cache"
    rc = run_main([*SMALL, f"{key}={bad}", f"data.cache_dir={cache}", f"output_dir={out}"], job=script)
    line = one_line(capsys, rc, 2)
    assert (
        line
        == f"error: {key}: cannot read checkpoint '{bad}' (it is empty, 0 bytes); it is truncated or not a torch file"
    )
    assert not out.exists() and not cache.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zero.ckpt"]  # no lock files beside output_dir either


@pytest.mark.parametrize(
    "args,text",
    [
        (
            ["stage=head", "head=whitening", "ckpt={bert_cat}"],
            "error: head: isotropy heads act on bi-encoder representations; 'bert_cat' has neither token nor sequence",
        ),
        (
            ["analysis=vocab_projections", "ckpt={colbert}"],
            "error: config key 'analysis.mlm_head': is null and backbone '{bert}' has no MLM head; fit one with",
        ),
        (
            ["model=repbert", "ckpt={colbert}"],
            "error: ckpt: checkpoint '{colbert}' holds ranker 'colbert' but model.name is 'repbert'",
        ),
    ],
    ids=["head-on-a-cross-encoder", "vocab-without-mlm-head", "ckpt-of-another-ranker"],
)
def test_what_the_headers_tell_is_checked_before_the_data(tmp_path, tiny_bert, capsys, args, text):
    """A check that a checkpoint's or a backbone's header can answer stops the job before its data are read: the
    cache folder stays absent (these were one line, but after BM25 candidates or the document store were cached)."""
    from conftest import fake_checkpoint

    values = {
        "bert": tiny_bert,
        "bert_cat": fake_checkpoint(tmp_path / "bert_cat.ckpt", tiny_bert, "bert_cat"),
        "colbert": fake_checkpoint(tmp_path / "colbert.ckpt", tiny_bert),
    }
    capsys.readouterr()  # building the checkpoints printed transformers' loading report
    cache, out = tmp_path / "cache", tmp_path / "out"
    argv = [*SMALL, *(a.format(**values) for a in args), f"data.cache_dir={cache}", f"output_dir={out}"]
    job = "train" if "stage=head" in args else "evaluate"
    if job == "evaluate" and any(a.startswith("analysis=") for a in args):
        argv = [a for a in argv if not a.startswith("data.max_eval_queries")]
    line = one_line(capsys, run_main(argv, job=job), 2)
    assert line.startswith(text.format(**values)), line
    assert not cache.exists() and not out.exists()


@pytest.mark.parametrize("key", ["ckpt", "head_ckpt", "init_ckpt"])
def test_a_checkpoint_key_naming_a_folder_says_it_is_a_folder(tmp_path, capsys, key):
    """A folder where a checkpoint file is expected is named as a folder (it was "does not exist"), before any data."""
    folder = tmp_path / "run"
    folder.mkdir()
    out, cache = tmp_path / "out", tmp_path / "cache"
    job = "train" if key == "init_ckpt" else "evaluate"
    rc = run_main([*SMALL, f"{key}={folder}", f"data.cache_dir={cache}", f"output_dir={out}"], job=job)
    export = " nor an export folder from train.py stage=export (it has no isorank.json)" if key == "ckpt" else ""
    assert (
        one_line(capsys, rc, 2)
        == f"error: {key}: '{folder}' is a folder, not a checkpoint file{export}; expected a .ckpt file"
    )
    assert not out.exists() and not cache.exists()


def test_the_test_of_the_best_checkpoint_keeps_the_last_checkpoint_named(tmp_path):
    """trainer.test(ckpt_path=best) restores the checkpoint callback's state saved with best-N.ckpt (an empty
    last_model_path): the last.ckpt written since stays named, for a signal or a rank's death during that test."""
    from callbacks.checkpoint import RankingCheckpoint
    from callbacks.rank_watch import kept_checkpoint

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    last = folder / "last.ckpt"
    last.write_bytes(b"x")
    cb = RankingCheckpoint(str(folder), monitor="val/ndcg_cut_10")
    saved_with_best = cb.state_dict()  # as at step 0: nothing written yet
    cb.last_model_path, cb._last_step_written = str(last), 2
    cb.load_state_dict(saved_with_best)
    trainer = type("T", (), {"checkpoint_callback": cb})()
    assert kept_checkpoint(trainer) == f"last.ckpt at step 2 is kept: resume with ckpt_path={last}"
    fresh = RankingCheckpoint(str(folder), monitor="val/ndcg_cut_10")  # a resume: the state's own last.ckpt
    fresh.load_state_dict({**saved_with_best, "last_model_path": str(last)})
    assert fresh.last_model_path == str(last)


def test_a_dangling_symbolic_link_on_the_output_path_is_named_as_one(tmp_path):
    """mkdir says "File exists" of a link whose target is gone; the probe says what it is, before anything is made."""
    from core.io import WriteFault, check_writable

    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    for target in (link, link / "run" / "out"):
        with pytest.raises(WriteFault) as e:
            check_writable(target, "output_dir")
        assert str(e.value) == (
            f"output_dir: cannot write '{link}' (it is a symbolic link to '{tmp_path / 'gone'}', which does not "
            "exist); create the link's target or choose another folder; nothing was loaded or written"
        )
        assert e.value.code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]
    check_writable(tmp_path / "fine" / "out", "output_dir")  # an ordinary path still passes


@pytest.mark.parametrize("where", ["the folder itself", "a folder above it"])
@pytest.mark.parametrize("key", ["output_dir", "data.cache_dir"])
def test_a_file_where_a_folder_is_expected_is_named_as_one(tmp_path, where, key):
    """The fourth fault trial's G3: mkdir said "File exists" of a regular file given as data.cache_dir, as if a folder
    were there; the probe says what it is, for every path it probes, and makes nothing."""
    from core.io import WriteFault, check_writable

    afile = tmp_path / "cachefile"
    afile.write_text("a file\n")
    target = afile if where == "the folder itself" else afile / "run" / "out"
    with pytest.raises(WriteFault) as e:
        check_writable(target, key)
    assert str(e.value) == (
        f"{key}: cannot write '{afile}' (it is a file, not a folder); move it away or choose another folder; "
        "nothing was loaded or written"
    )
    assert e.value.code == 2
    assert afile.read_text() == "a file\n" and sorted(p.name for p in tmp_path.iterdir()) == ["cachefile"]


@pytest.mark.parametrize("what", ["a file", "a foreign folder", "a dangling link"])
def test_an_index_dir_that_would_be_refused_is_refused_before_anything_loads(tmp_path, what):
    """retrieval.index_dir naming a file or a folder that is not an index: the job's first checks refuse it (it was
    found only when the encoded index was written), with the writer's own words; an index folder passes."""
    from omegaconf import OmegaConf

    from core.errors import InputError
    from pipeline.stages import check_outputs

    target = tmp_path / "idx"
    if what == "a file":
        target.write_text("a collection\n")
    elif what == "a dangling link":  # fifth fault trial D1: refused only after the encoding, "Not a directory"
        target.symlink_to(tmp_path / "nowhere" / "idx")
    else:
        target.mkdir()
        (target / "notes.txt").write_text("mine\n")
    cfg = OmegaConf.create(
        {
            "output_dir": str(tmp_path / "out"),
            "data": {"cache_dir": str(tmp_path / "cache")},
            "retrieval": {"name": "dense", "index_dir": str(target)},
        }
    )
    expected = (
        r"is a symbolic link to '.*', which does not exist"
        if what == "a dangling link"
        else r"exists and is not an index directory \(no manifest.json\); refusing"
    )
    with pytest.raises(InputError, match=expected):
        check_outputs(cfg)
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text("{}")
    check_outputs(OmegaConf.merge(cfg, {"retrieval": {"index_dir": str(index)}}))


INPUTS = {
    "random_rerank-run": (["analysis=random_rerank", "analysis.run={path}"], "analysis.run", "a TREC run"),
    "vocab-mlm_head": (
        ["analysis=vocab_projections", "analysis.mlm_head={path}"],
        "analysis.mlm_head",
        "a head written by python evaluate.py analysis=fit_mlm_head",
    ),
    "ats-compare": (["analysis=ats", "analysis.compare.other={path}"], "analysis.compare.other", None),
}
# an empty file is a file: what it holds is for the analysis to read; an empty checkpoint is refused by its header
CASES = [
    (name, fault) for name, (_, _, what) in INPUTS.items() for fault in ("folder", "missing", "empty")[: 3 - bool(what)]
]


@pytest.mark.parametrize("name,fault", CASES, ids=[f"{n}-{f}" for n, f in CASES])
@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_an_input_path_a_schema_declares_is_checked_before_anything_loads(tmp_path, capsys, name, fault, dry):
    """Third fault trial K1, K2: `analysis.run=<a folder>` said "does not exist"; `analysis.compare.other=<a zero-byte
    file>` passed --dry-run and failed only after the data and the first ranker loaded, in other words than ckpt='s.
    Every path a schema declares (core/inputs.py) is checked by the job's first checks, at --dry-run too: one line,
    exit code 2, nothing written."""
    from pipeline.cli import main
    from pipeline.run import EVALUATE

    args, key, what = INPUTS[name]
    path = tmp_path / "input"
    if fault == "folder":
        path.mkdir()
    elif fault == "empty":
        path.write_bytes(b"")
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = [*SMALL, f"data.cache_dir={cache}", f"output_dir={out}"]
    argv += [a.format(path=path) for a in args]
    argv = job_args("evaluate.py", [a for a in argv if not a.startswith("data.max_eval_queries")])
    argv += ["--dry-run"] if dry else []
    line = one_line(capsys, main(argv, EVALUATE), 2)
    where = f"error: config key '{key}': "
    expected = {
        ("folder", True): f"{where}'{path}' is a folder, not a file; expected {what}",
        ("folder", False): f"{where}'{path}' is a folder, not a checkpoint file; expected a .ckpt file",
        ("missing", True): f"{where}'{path}' does not exist (resolved to {path}); expected {what}",
        ("missing", False): f"{where}checkpoint '{path}' does not exist",
        ("empty", False): f"{where}cannot read checkpoint '{path}' (it is empty, 0 bytes); it is truncated or not a "
        "torch file",
    }[fault, what is not None]
    assert line == expected
    assert not out.exists() and not cache.exists()


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_tk_glove_embeddings_path_is_checked_before_the_data(tmp_path, capsys, dry):
    """Seventh fault trial K5: `train.py model=tk model.embeddings=<missing file>` read the training data (its
    max_train_triples warning) before it named the file. The key is a declared input (core/inputs.py, `backbone` a
    keyword, not a path), checked with the job's first checks."""
    from pipeline.cli import main
    from pipeline.run import TRAIN

    path, out, cache = tmp_path / "glove.txt", tmp_path / "out", tmp_path / "cache"
    argv = [*SMALL, "model=tk", f"model.embeddings={path}", f"data.cache_dir={cache}", f"output_dir={out}"]
    argv += ["--dry-run"] if dry else []
    assert one_line(capsys, main(argv, TRAIN), 2) == (
        f"error: config key 'model.embeddings': '{path}' does not exist (resolved to {path}); expected a GloVe-format "
        "file (token v1 ... vd) or backbone"
    )
    assert not out.exists() and not cache.exists()
    base = argv[:-1] if dry else argv
    assert main([*base, "model.embeddings=backbone", "--dry-run"], TRAIN) == 0


@pytest.mark.parametrize("what", ["file", "dangling link"])
def test_a_cache_family_folder_that_is_a_file_is_refused_before_anything_loads(tmp_path, capsys, what):
    """Third fault trial C3: `<cache>/bm25` a file was found when BM25 first wrote there, after the data loaded, with
    "expected a writable data.cache_dir" (the cache folder was writable). Every family's folder is checked first."""
    from core.io import CACHE_FOLDERS

    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    for name in CACHE_FOLDERS:
        for q in cache.iterdir():
            q.unlink()
        if what == "file":
            (cache / name).write_text("x")
        else:
            (cache / name).symlink_to(tmp_path / "gone")
        line = one_line(capsys, run_main([*SMALL, "model=bm25", f"data.cache_dir={cache}", f"output_dir={out}"]), 2)
        shown = (
            "a file, not a folder"
            if what == "file"
            else f"a symbolic link to '{tmp_path / 'gone'}', which does not exist"
        )
        assert line == (
            f"error: data.cache_dir: cannot write '{cache / name}' (it is {shown}; the {name} cache is kept in that "
            "folder); move it away or choose another data.cache_dir; nothing was loaded or written"
        )
        assert not out.exists() and [q.name for q in cache.iterdir()] == [name]


def test_every_cache_family_folder_is_listed():
    """CACHE_FOLDERS names every `<cache_dir>/<family>` folder the code writes (read from the sources)."""
    import re

    from core.io import CACHE_FOLDERS

    repo = Path(__file__).resolve().parents[1]
    named = set()
    for path in repo.glob("*/**/*.py"):
        if path.parts[len(repo.parts)] in ("tests", "bench"):
            continue
        named |= set(re.findall(r"""\(\s*(?:cfg\.(?:data\.)?)?cache_dir\s*\)\s*/\s*"(\w+)\"""", path.read_text()))
    assert named == set(CACHE_FOLDERS), named ^ set(CACHE_FOLDERS)


@pytest.mark.slow
def test_a_resume_from_another_runs_folder_keeps_its_best_so_far(tmp_path, tiny_bert, capsys, recwarn):
    """Third fault trial G3: `ckpt_path=<run A>/last.ckpt output_dir=<B>` printed Lightning's raw "The dirpath has
    changed" and dropped A's best score, so B's first validation became the best however it scored. B now carries
    A's best (score and file), says so in one warning, and selects and tests what A resumed in place does."""
    a, b = tmp_path / "a", tmp_path / "b"
    common = [
        *SMALL,
        f"model.backbone={tiny_bert}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "trainer.val_check_interval=1",
        "eval.before_training=false",
    ]
    assert run_main([*common, "trainer.max_steps=2", f"output_dir={a}"], job="train") == 0
    capsys.readouterr()
    last = a / "checkpoints" / "last.ckpt"
    assert run_main([*common, "trainer.max_steps=4", f"ckpt_path={last}", f"output_dir={b}"], job="train") == 0
    said = [str(w.message) for w in recwarn]
    ours = [m for m in said if "another run's folder" in m]
    assert len(ours) == 1 and ours[0].startswith(
        f"ckpt_path is a checkpoint of another run's folder ({a / 'checkpoints'}): this run goes on in "
        f"{b / 'checkpoints'}; its best so far, {a / 'checkpoints'}/best-"
    ), said
    assert not any("dirpath has changed" in m for m in said) and "dirpath has changed" not in capsys.readouterr().err
    assert run_main([*common, "trainer.max_steps=4", f"ckpt_path={last}", f"output_dir={a}"], job="train") == 0
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    va, vb = (json.loads((d / "validation.json").read_text())["validations"] for d in (a, b))
    assert [v["step"] for v in vb] == [0, 1, 2, 3, 4] and vb == va  # step 0: the start candidate
    assert mb["best_step"] == ma["best_step"] and mb["ndcg_cut_10"] == ma["ndcg_cut_10"]


@pytest.mark.parametrize("missing", ["test_qrels", "test_queries", "test_run"])
def test_a_missing_data_file_is_refused_before_the_cache_is_written(tmp_path, capsys, missing):
    """Fourth fault trial K3: a missing test qrels file was refused after the collection's digest memo had been
    written into data.cache_dir. The tsv source finds every file the job reads before it writes anything."""
    from test_run_checks import tsv

    args = [a for a in tsv(tmp_path) if not a.startswith(f"data.{missing}=")]
    gone = tmp_path / "gone.txt"
    rc = run_main([*args, "model=bm25", f"data.{missing}={gone}", f"output_dir={tmp_path / 'out'}"])
    line = one_line(capsys, rc, 2)
    assert line.startswith(f"error: data.{missing}: path '{gone}' does not exist"), line
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_a_beir_folder_without_the_test_qrels_is_refused_before_the_store_is_built(tmp_path, capsys):
    """The BEIR source built the corpus's document store (and its digest memo) and only then said the test split "has
    no judged query", naming no file. The test qrels are found first; the line names the file and what qrels/ holds."""
    from test_sources import _beir

    folder = tmp_path / "beir"
    _beir(folder, with_dev=False)
    (folder / "qrels" / "test.tsv").unlink()
    argv = ["model=bm25", "data=beir", f"data.path={folder}", "logger=none", f"data.cache_dir={tmp_path / 'cache'}"]
    assert one_line(capsys, run_main([*argv, f"output_dir={tmp_path / 'out'}"], job="evaluate"), 2) == (
        f"error: config key 'data.test_split': is 'test', but '{folder}/qrels/test.tsv' does not exist (qrels/ holds "
        "['train.tsv']); expected the qrels of the split evaluated"
    )
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name,expected",
    [
        ("queries.jsonl", "one JSON object a line"),
        ("qrels/test.tsv", "lines of 3 tab-separated columns (query-id, corpus-id, score)"),
    ],
)
def test_an_empty_beir_file_is_refused_before_the_store_is_built(tmp_path, capsys, name, expected):
    """Issue 48's E4 through the BEIR door: queries.jsonl and the qrels are read after the corpus's store is built,
    so an empty one was refused only after a cache was written. Now first, with its reader's own message."""
    from test_sources import _beir

    folder = tmp_path / "beir"
    _beir(folder, with_dev=False)
    (folder / name).write_text("\n")
    argv = ["model=bm25", "data=beir", f"data.path={folder}", "logger=none", f"data.cache_dir={tmp_path / 'cache'}"]
    line = one_line(capsys, run_main([*argv, f"output_dir={tmp_path / 'out'}"], job="evaluate"), 2)
    assert line == f"error: {folder / name}: is empty; expected {expected}"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_a_resume_with_other_model_settings_is_one_line_before_the_data(tmp_path, tiny_bert, capsys):
    """Fourth fault trial K4: `ckpt_path=` a ColBERT checkpoint with `model.compress_dim=16` set now failed in
    Lightning's strict load with a traceback (after the data, leaving an attempt folder). The checkpoint's model
    settings are compared with the run's first: one line naming what differs; runtime keys may differ."""
    from conftest import fake_checkpoint

    out, cache = tmp_path / "out", tmp_path / "cache"
    bert = tiny_bert
    ckpt = fake_checkpoint(tmp_path / "colbert.ckpt", bert)
    capsys.readouterr()
    base = [*SMALL, f"model.backbone={bert}", f"ckpt_path={ckpt}", f"data.cache_dir={cache}", f"output_dir={out}"]
    line = one_line(capsys, run_main([*base, "model.compress_dim=16"], job="train"), 2)
    assert line == (
        f"error: ckpt_path: '{ckpt}' was trained with model.compress_dim=null (this run: 16); a resume continues the "
        "same model: drop those overrides, or start a new output_dir from its weights with init_ckpt="
    )
    assert not out.exists() and not cache.exists()
    from pipeline.cli import main
    from pipeline.run import TRAIN

    for runtime in ("model.attn_implementation=eager", "model.length_buckets=1", f"model.backbone={bert}/."):
        assert main([*base, runtime, "--dry-run"], TRAIN) == 0, capsys.readouterr().err


@pytest.mark.parametrize("accelerator,dry", [("cpu", True), ("cpu", False), ("auto", False)])
def test_fp16_on_the_cpu_is_refused_not_swapped_for_bf16(tmp_path, capsys, monkeypatch, accelerator, dry):
    """Fourth fault trial K9: `trainer.precision=16-mixed` on the CPU ran as bf16-mixed (Lightning's swap, its own
    warning) with 16-mixed in config.yaml. Refused before anything loads: from the config for accelerator=cpu
    (--dry-run too), on this machine for auto (a dry run composed on a login node passes)."""
    import torch

    from pipeline.cli import main
    from pipeline.run import EVALUATE

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    argv = [*SMALL, "model=repbert", "trainer.precision=16-mixed", f"trainer.accelerator={accelerator}"]
    argv = job_args("evaluate.py", argv)
    argv += [f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={out}", *(["--dry-run"] if dry else [])]
    assert one_line(capsys, main(argv, EVALUATE), 2) == (
        "error: config key 'trainer.precision': is 16-mixed, but fp16 needs a CUDA device and this run is on the CPU "
        "(Lightning would run bf16-mixed instead); use bf16-mixed or 32-true on the CPU"
    )
    assert not out.exists()
    assert main([a for a in argv if "accelerator" not in a] + ["trainer.accelerator=auto", "--dry-run"], EVALUATE) == 0


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["trainer.accelerator=gpu"],
            "config key 'trainer.accelerator': names cuda, but this machine has no CUDA device "
            "(torch.cuda.is_available() is False); use trainer.accelerator=cpu or auto",
        ),
        (
            ["trainer.accelerator=cuda", "trainer.devices=[0,1]"],
            "config key 'trainer.devices': needs 2 cuda device(s), but this machine has 1; use at most "
            "trainer.devices=1",
        ),
        (
            ["retrieval=dense", "retrieval.device=cuda"],
            "config key 'retrieval.device': names cuda, but this machine has no CUDA device (torch.cuda.is_available() "
            "is False); use cpu (or null), or run on a machine that has one",
        ),
        (
            ["retrieval=dense", "retrieval.device=cuda:1"],
            "config key 'retrieval.device': is 'cuda:1', but this machine has 1 cuda device(s)",
        ),
        (
            ["retrieval=dense", "retrieval.device=cuda", "retrieval.devices=2"],
            "config key 'retrieval.device': is 'cuda' with 2 processes (GPUs 0..1), but this machine has 1 cuda "
            "device(s)",
        ),
    ],
)
def test_a_device_this_machine_lacks_is_refused_before_anything_loads(tmp_path, capsys, monkeypatch, args, line):
    """Seventh fault trial K1: `evaluate.py retrieval=dense retrieval.device=cuda` on a CPU machine loaded the
    checkpoint and data, then stopped in PyTorch's `AssertionError: Torch not compiled with CUDA enabled`;
    `trainer.accelerator=gpu` in Lightning's `MisconfigurationException` (each a traceback). Refused by the job's
    machine checks (core/devices.py), before anything is written; a --dry-run (a login node) passes."""
    import torch

    from pipeline.cli import main
    from pipeline.run import EVALUATE

    gpus = 1 if any(a.endswith(("[0,1]", "cuda:1", "devices=2")) for a in args) else 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    out = tmp_path / "out"
    argv = job_args("evaluate.py", [*SMALL, "model=repbert", *args, f"data.cache_dir={tmp_path / 'cache'}"])
    argv.append(f"output_dir={out}")
    assert one_line(capsys, main(argv, EVALUATE), 2) == f"error: {line}"
    assert not out.exists() and not (tmp_path / "cache").exists()
    assert main([*argv, "--dry-run"], EVALUATE) == 0, capsys.readouterr().err


def test_fp16_dense_retrieval_off_cuda_is_refused_from_the_config(tmp_path, capsys):
    """fp16 encoding needs CUDA: `retrieval.precision=fp16` with a CPU device was refused only in the encoding, after
    the checkpoint loaded. Now from the config (--dry-run too)."""
    from pipeline.cli import main
    from pipeline.run import EVALUATE

    argv = [*SMALL, "model=repbert", "retrieval=dense", "retrieval.precision=fp16", f"output_dir={tmp_path / 'o'}"]
    assert one_line(capsys, main([*argv, "--dry-run"], EVALUATE), 2) == (
        "error: config key 'retrieval.precision': is fp16 with retrieval.device=null: fp16 needs a CUDA device; use "
        "bf16 or fp32, or retrieval.device=cuda"
    )


@pytest.mark.parametrize("args", [["stage=head", "head=whitening", "ckpt={export}"], ["ckpt_path={export}"]])
def test_an_export_folder_where_a_checkpoint_file_is_needed_is_named_so(tmp_path, capsys, args):
    """Fourth fault trial K13: stage=head ckpt=<an export folder> said the folder "has no isorank.json" (it has one).
    A job that does not read export folders says it is one and asks for the .ckpt it came from."""
    export = tmp_path / "exported"
    export.mkdir()
    (export / "isorank.json").write_text("{}")
    out = tmp_path / "out"
    argv = [*SMALL, *(a.format(export=export) for a in args), f"data.cache_dir={tmp_path / 'c'}", f"output_dir={out}"]
    key = "ckpt" if "stage=head" in args else "ckpt_path"
    assert one_line(capsys, run_main(argv, job="train"), 2) == (
        f"error: {key}: '{export}' is an export folder (train.py stage=export), which this job does not read; give "
        "the .ckpt file it was exported from"
    )
    assert not out.exists()


def test_only_global_rank_zero_refuses_an_output_dir_with_checkpoints(tmp_path, monkeypatch):
    """Fourth fault trial R4: `train.py stage=head head=whitening` under DDP failed with no fault: the closed-form head
    is saved before Lightning starts rank 1, which runs the script again and refused rank 0's own checkpoint. Only
    global rank 0 (before anything is written) refuses; a resume (ckpt_path) never does."""
    from omegaconf import OmegaConf

    from core.errors import InputError
    from pipeline.stages import refuse_other_checkpoints

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "head.ckpt").write_bytes(b"x")
    cfg = OmegaConf.create({"output_dir": str(tmp_path), "ckpt_path": None})
    from core.ranks import RANK_VARIABLES

    for var in RANK_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(InputError, match="already holds checkpoints"):
        refuse_other_checkpoints(cfg)
    refuse_other_checkpoints(OmegaConf.merge(cfg, {"ckpt_path": "last.ckpt"}))
    monkeypatch.setenv("LOCAL_RANK", "1")
    refuse_other_checkpoints(cfg)  # a rank Lightning started: rank 0 has checked already


def test_a_file_in_place_of_the_checkpoints_folder_is_refused_before_anything_loads(tmp_path, capsys):
    """Fifth fault trial K2: `<output_dir>/checkpoints` a regular file was found at the first checkpoint write, after
    the model, the data and two steps, as "File exists" of best-0.ckpt. The job's first checks name it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoints").write_text("")
    rc = run_main([*SMALL, f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={out}"], job="train")
    assert one_line(capsys, rc, 2) == (
        f"error: output_dir: cannot write '{out / 'checkpoints'}' (it is a file, not a folder; the run's checkpoints "
        "are written there); move it away or choose another output_dir; nothing was loaded or written"
    )
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"] and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("job,args", [("train", []), ("evaluate", [])])
def test_a_missing_local_backbone_is_refused_before_anything_is_written(tmp_path, capsys, job, args):
    """Fifth fault trial K7 (and K1 in a grid): `model.backbone=<a missing folder>` was found when the backbone
    loaded, after the BM25 index and runs were written into data.cache_dir. The job's first checks find it."""
    gone = tmp_path / "nobert"
    cache, out = tmp_path / "cache", tmp_path / "out"
    rc = run_main([*SMALL, *args, f"model.backbone={gone}", f"data.cache_dir={cache}", f"output_dir={out}"], job=job)
    assert one_line(capsys, rc, 2) == (
        f"error: model.backbone: local path '{gone}' does not exist; expected an HF id, a local model dir or 'minilm'"
    )
    assert not cache.exists() and not out.exists()


def test_a_grid_row_with_a_missing_backbone_stops_before_any_cell_runs(tmp_path, capsys):
    """Fifth fault trial K1: the bm25 cell ran to the end, then the colbert row's missing backbone stopped the grid."""
    from test_faults_grid import grid_main
    from test_grid import BM25_ROWS, tiny_grid

    gone = tmp_path / "nobert"
    rows = {**BM25_ROWS, "colbert": ["model=colbert", f"model.backbone={gone}"]}
    gfile = tiny_grid(tmp_path, "g", "bm25", rows)
    capsys.readouterr()
    code, out = grid_main(f"grid={gfile}")
    err = capsys.readouterr().err
    assert code == 2 and "local path" in err and str(gone) in err, out + err
    assert not (tmp_path / "grids" / "g" / "bm25").exists()


def test_an_analysis_measure_is_checked_when_the_config_is_composed(capsys):
    """Sixth fault trial K7: `analysis=lexical_enrichment analysis.measure=ndcg_cut10` was refused after the ranker
    loaded and the BM25 and single-token caches were written (at the default 1,000 optimisation steps, not within
    300 s). It is checked at compose, as eval.measures is: one line, --dry-run included."""
    from pipeline.cli import main
    from pipeline.run import EVALUATE

    rc = main(["analysis=lexical_enrichment", "analysis.measure=ndcg_cut10", "model=repbert", "--dry-run"], EVALUATE)
    line = one_line(capsys, rc, 2)
    assert line.startswith("error: config key 'analysis.measure': unknown measure 'ndcg_cut10'; expected one of"), line


@pytest.mark.parametrize("rank", [0, 1])
def test_a_copied_run_folder_names_its_own_last_checkpoint_when_a_rank_dies(tmp_path, recwarn, monkeypatch, rank):
    """Seventh fault trial R3: a DDP resume inside a copied run folder (`cp -a a b`, `ckpt_path=b/.../last.ckpt`)
    whose rank 1 died before a new last.ckpt said "no resumable checkpoint (last.ckpt) was written by this run",
    though the copy's own last.ckpt was there to resume from (Lightning drops its path when the folder moved); the
    resume's warning was printed by every rank. The copy's own last.ckpt is named, the warning said by rank 0 only."""
    from types import SimpleNamespace

    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    from callbacks.checkpoint import RankingCheckpoint
    from callbacks.rank_watch import kept_checkpoint

    a, b = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"
    for d in (a, b):
        d.mkdir(parents=True)
        for name in ("best-2.ckpt", "last.ckpt"):
            (d / name).write_bytes(b"x")
    saved = RankingCheckpoint(str(a))
    saved.best_model_path, saved.best_model_score = str(a / "best-2.ckpt"), torch.tensor(0.5)
    saved.best_k_models = {str(a / "best-2.ckpt"): torch.tensor(0.5)}
    saved.last_model_path = str(a / "last.ckpt")
    state = saved.state_dict()
    monkeypatch.setattr(rank_zero_only, "rank", rank)
    resumed = RankingCheckpoint(str(b))
    resumed.load_state_dict(state)
    assert resumed.best_model_path == str(b / "best-2.ckpt") and resumed.last_model_path == str(b / "last.ckpt")
    trainer = SimpleNamespace(checkpoint_callback=resumed)
    assert kept_checkpoint(trainer) == f"'{b / 'last.ckpt'}' is kept: resume with ckpt_path={b / 'last.ckpt'}"
    said = [str(w.message) for w in recwarn if "copy of" in str(w.message)]
    want = (
        f"this run folder is a copy of {a.parent}: the run goes on here with the copy's checkpoints; its best so "
        f"far, {b / 'best-2.ckpt'} (val/ndcg_cut_10 0.5000), stays the one to beat and is tested from there unless "
        "a later validation beats it"
    )
    assert said == [want][: rank == 0]
    fresh = RankingCheckpoint(str(tmp_path / "new"))  # a new folder holds no last.ckpt of its own: none is named
    fresh.load_state_dict(state)
    assert kept_checkpoint(SimpleNamespace(checkpoint_callback=fresh)).startswith("no resumable checkpoint")


MODEL_KEY_JOBS = {
    "evaluate": ["ckpt={ckpt}"],
    "head": ["stage=head", "head=whitening", "ckpt={ckpt}"],
    "analysis": ["analysis=whitebox", "ckpt={ckpt}"],
    "retrieval": ["retrieval=dense", "ckpt={ckpt}"],
    "export": ["stage=export", "ckpt={ckpt}"],
}


def test_a_head_key_beside_a_head_checkpoint_that_would_not_apply_is_refused(tmp_path, tiny_bert, capsys):
    """The same class for `head`: evaluate.py head_ckpt= applies the head its checkpoint records, so `head=nice`
    beside a whitening head, or `head.eps=0.001` beside one fitted with 1e-6, was silently not applied. Refused
    before anything is written (--dry-run too); the recorded values, or the keys left alone, pass."""
    from conftest import fake_checkpoint

    from pipeline.cli import main
    from pipeline.config import compose
    from pipeline.run import EVALUATE, train

    ckpt = fake_checkpoint(tmp_path / "colbert.ckpt", tiny_bert)
    white, cache = tmp_path / "white", tmp_path / "cache"
    train(
        compose(
            [*SMALL, "stage=head", "head=whitening", f"ckpt={ckpt}", f"data.cache_dir={cache}", f"output_dir={white}"]
        )
    )
    head_ckpt = white / "checkpoints" / "head.ckpt"
    capsys.readouterr()
    out = tmp_path / "out"
    argv = job_args("evaluate.py", [*SMALL, f"head_ckpt={head_ckpt}", f"data.cache_dir={cache}", f"output_dir={out}"])
    for dry in ([], ["--dry-run"]):
        line = one_line(capsys, main([*argv, "head=nice", *dry], EVALUATE), 2)
        assert line == (
            "error: config key 'head': is nice, but head_ckpt= holds head 'whitening', which evaluate.py applies; "
            "drop head= (the checkpoint's head is applied)"
        )
        line = one_line(capsys, main([*argv, "head=whitening", "head.eps=0.001", *dry], EVALUATE), 2)
        assert line == (
            "error: config key 'head.eps': is 0.001, but evaluate.py applies the head as head_ckpt= records it "
            "(eps=1.0e-06); drop the override, or train a head with it: `python train.py stage=head head=whitening "
            "head.eps=0.001 ckpt=...`"
        )
        assert not out.exists()
    for fine in ([], ["head=whitening"], ["head=whitening", "head.eps=1e-6"]):
        assert main([*argv, *fine, "--dry-run"], EVALUATE) == 0, capsys.readouterr().err


@pytest.mark.parametrize("job", list(MODEL_KEY_JOBS))
def test_a_model_key_a_checkpoint_job_would_not_apply_is_refused(tmp_path, tiny_bert, capsys, job):
    """Seventh fault trial C5: `train.py stage=head ckpt=... model.doc_max_len=24` fitted the head on the ranker the
    checkpoint records (doc_max_len 180) without a word, and its config.yaml said 24; evaluate.py ignored it too. Every
    job that builds its ranker from a checkpoint refuses a `model` key set to another value than the checkpoint's,
    before anything is written (--dry-run too); the checkpoint's own value, or the key left alone, passes."""
    from conftest import fake_checkpoint

    from pipeline.cli import main
    from pipeline.run import EVALUATE, TRAIN

    ckpt = fake_checkpoint(tmp_path / "colbert.ckpt", tiny_bert)
    capsys.readouterr()
    script = TRAIN if job in ("head", "export") else EVALUATE
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = [*SMALL, *(a.format(ckpt=ckpt) for a in MODEL_KEY_JOBS[job]), f"data.cache_dir={cache}", f"output_dir={out}"]
    argv = job_args("train.py" if script is TRAIN else "evaluate.py", argv)
    for dry in ([], ["--dry-run"]):
        line = one_line(capsys, main([*argv, "model.doc_max_len=24", *dry], script), 2)
        assert line.startswith("error: config key 'model.doc_max_len': is 24, but job ") and line.endswith(
            f"builds the ranker as ckpt= records it (doc_max_len=180) and does not apply it; drop the override, or "
            f"fine-tune with it: `python train.py init_ckpt={ckpt} model.doc_max_len=24`"
        ), line
        assert not out.exists() and not cache.exists()
    for fine in ("model.doc_max_len=180", f"model.backbone={tiny_bert}/.", "model.attn_implementation=eager"):
        assert main([*argv, fine, "--dry-run"], script) == 0, capsys.readouterr().err


def test_runtime_model_keys_apply_over_the_checkpoints(tmp_path, tiny_bert):
    """A runtime key (how the ranker runs: attention, length buckets) set beside `ckpt=` builds the checkpoint's
    ranker with it, and config.yaml's model says so; left alone, the checkpoint's own value stays."""
    from conftest import fake_checkpoint

    from models.loading import load_configured
    from pipeline.config import compose

    ckpt = fake_checkpoint(tmp_path / "colbert.ckpt", tiny_bert)
    cfg = compose([*SMALL, f"ckpt={ckpt}", "model.attn_implementation=eager", "model.length_buckets=1"])
    loaded = load_configured(cfg)
    assert loaded.ranker.encoder.config._attn_implementation == "eager"
    assert cfg.model.attn_implementation == "eager" and cfg.model.length_buckets == 1
    cfg = compose([*SMALL, f"ckpt={ckpt}"])
    load_configured(cfg)
    assert cfg.model.attn_implementation == "sdpa" and cfg.model.length_buckets == "auto"  # the run's defaults


@pytest.mark.parametrize(
    "analysis,switch,applied",
    [
        ("whitebox", "data.passage_words=20", False),
        ("whitebox", "data.rotate_eval=true", False),
        ("vocab_projections", "data.rotate_eval=true", False),
        ("ats", "data.passage_words=20", False),
        ("ats", "data.rotate_eval=true", True),
    ],
)
def test_an_analysis_refuses_the_data_switches_it_does_not_apply(tmp_path, capsys, analysis, switch, applied):
    """Review of issue 48's job-ignored keys (second fresh trial's C4, for analyses): `analysis=whitebox
    data.passage_words=20` read whole documents and said nothing. Each analysis declares the evaluation switches it
    applies (`applies_data`: ATS rotates its passages as evaluation does); another set is refused at --dry-run."""
    from pipeline.cli import main
    from pipeline.run import EVALUATE

    argv = [*SMALL, f"analysis={analysis}", switch, f"output_dir={tmp_path / 'o'}"]
    argv = job_args("evaluate.py", [a for a in argv if not a.startswith("data.max_eval_queries")]) + ["--dry-run"]
    rc = main(argv, EVALUATE)
    if applied:
        assert rc == 0, capsys.readouterr().err
        return
    key, value = switch.split("=")
    line = one_line(capsys, rc, 2)
    assert line.startswith(f"error: config key '{key}': is {value}, but analysis {analysis} does not apply it: "), line
    assert line.endswith("; leave it at " + ("null" if "words" in key else "false")), line


@pytest.mark.parametrize("where", ["output_dir", "above", "inside"])
def test_a_shared_index_dir_in_the_results_place_is_refused(tmp_path, capsys, where):
    """Eighth fault trial K9b: `retrieval.index_dir` equal to output_dir: the index's whole-folder replace took the
    earlier results with it when the job stopped before its own results were published. The retrieve job refuses an
    index_dir that is, holds or lies inside output_dir, at --dry-run too."""
    from pipeline.cli import main
    from pipeline.run import EVALUATE

    out = tmp_path / "o"
    index = {"output_dir": out, "above": tmp_path, "inside": out / "idx"}[where]
    argv = [*SMALL, "model=repbert", "retrieval=dense", f"retrieval.index_dir={index}", f"output_dir={out}"]
    argv = job_args("evaluate.py", argv)
    for dry in ([], ["--dry-run"]):
        said = {"output_dir": "is output_dir", "above": "holds output_dir", "inside": "lies inside output_dir"}[where]
        assert one_line(capsys, main([*argv, *dry], EVALUATE), 2) == (
            f"error: config key 'retrieval.index_dir': '{index}' {said} ('{out}'); a shared index is saved by "
            "replacing its folder whole, so it must lie outside the run's results: choose another folder, or leave it "
            "null to keep the index with the results (<output_dir>/index)"
        )
        assert not out.exists()


def test_a_shared_index_is_saved_after_the_results(tmp_path, tiny_bert, capsys, monkeypatch):
    """Eighth fault trial O1: a dense retrieval with a shared `retrieval.index_dir`, stopped while its results were
    written, had already replaced the shared index: the earlier results stood beside another checkpoint's index. The
    index is saved after the results are published; a job that fails before leaves the earlier index as it was."""
    from conftest import fake_checkpoint

    import retrieval.retrieve as retrieve

    ckpt = fake_checkpoint(tmp_path / "repbert.ckpt", tiny_bert, name="repbert")
    out, index = tmp_path / "out", tmp_path / "shared-index"
    argv = [*SMALL, "retrieval=dense", "retrieval.k=10", f"ckpt={ckpt}", f"retrieval.index_dir={index}"]
    argv += [f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={out}"]
    assert run_main(argv) == 0
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in [index, *index.iterdir()]}
    results = (out / "metrics.json").read_bytes()
    capsys.readouterr()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "run.trec"))

    monkeypatch.setattr(retrieve, "write_result_dir", full_disk)
    assert run_main([*argv, "retrieval.k=5"]) == 1
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in [index, *index.iterdir()]} == before
    assert (out / "metrics.json").read_bytes() == results


@pytest.mark.parametrize("at", ["fsync", "replace"])
def test_a_signal_inside_the_write_probe_leaves_no_probe_file(tmp_path, monkeypatch, at):
    """Eighth fault trial S1: SIGINT while check_writable probed an existing output_dir left `.write-probe-*` there
    (its removal ran for an OSError only; a signal raises a BaseException) and moved the folder's mtime. Whatever
    ends the probe, the folder is as it was, and a folder the probe made is gone."""
    import core.io as io

    class Signalled(BaseException):
        pass

    def stop(*args, **kwargs):
        raise Signalled

    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    times = (out.stat().st_atime_ns, out.stat().st_mtime_ns)
    monkeypatch.setattr(io.os, at, stop)
    with pytest.raises(Signalled):
        io.check_writable(out, "output_dir")
    assert out.stat().st_mtime_ns == times[1]  # before listing it, which moves its atime
    assert [p.name for p in out.iterdir()] == ["metrics.json"]
    with pytest.raises(Signalled):
        io.check_writable(tmp_path / "new" / "deeper", "output_dir")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "args,key,line",
    [
        (
            ["analysis=answer_positions"],
            "data.source",
            "is '{source}', which has no answer spans, but analysis answer_positions reads them; use a source with "
            "answers (squad, synthetic, ir_datasets with answer strings)",
        ),
        (
            ["data.answer_bias_keep_first=0.5"],
            "data.answer_bias_keep_first",
            "is 0.5, but data source '{source}' has no answer spans; a position-biased split needs a source with "
            "answers (squad, synthetic, ir_datasets with answer strings)",
        ),
    ],
)
@pytest.mark.parametrize("source", ["tsv", "beir", "cranfield"])
def test_what_needs_answer_spans_is_refused_for_a_source_without_them(tmp_path, capsys, args, key, line, source):
    """`analysis=answer_positions` or a position-biased split over a source that never has answer spans (TSV, BEIR,
    the classic collections) built the collection's store and then said the dataset had none. Each source declares
    whether it has them (`DataConfig.answers`; ir_datasets: known after loading); the config is refused at once."""
    from pipeline.cli import main
    from pipeline.run import EVALUATE

    argv = [f"data={source}", *args, "logger=none", f"output_dir={tmp_path / 'o'}", "--dry-run"]
    assert one_line(capsys, main(argv, EVALUATE), 2) == f"error: config key '{key}': {line.format(source=source)}"


def test_a_validation_interval_past_the_last_step_is_refused(tmp_path, capsys):
    """Ninth fault trial K3: `train.py trainer.max_steps=2 trainer.val_check_interval=5` (or the default 30) never
    validated the trained weights; the test used the starting model, with a warning that read as if validations had
    lost. The finetune job refuses it from the config; a resume, no validation or no start candidate pass."""
    from pipeline.cli import main
    from pipeline.run import TRAIN

    argv = [*SMALL, "trainer.max_steps=2", "trainer.val_check_interval=5", f"output_dir={tmp_path / 'o'}", "--dry-run"]
    assert one_line(capsys, main(argv, TRAIN), 2) == (
        "error: config key 'trainer.val_check_interval': is 5 training batches, but trainer.max_steps=2 trains 2: no "
        "validation would run after fine-tuning starts, and the test would use the starting model (its step-0 "
        "validation the only one); set trainer.val_check_interval <= 2"
    )
    assert one_line(capsys, main([*argv, "trainer.accumulate_grad_batches=2"], TRAIN), 2).startswith(
        "error: config key 'trainer.val_check_interval': is 5 training batches, but trainer.max_steps=2 trains 2 x "
        "trainer.accumulate_grad_batches 2 = 4: "
    )
    for fine in ("trainer.accumulate_grad_batches=3", "trainer.limit_val_batches=0", "eval.start_candidate=false"):
        assert main([*argv, fine], TRAIN) == 0, capsys.readouterr().err
