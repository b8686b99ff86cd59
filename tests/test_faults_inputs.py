"""Faults of what a run reads (issue 35, items 3 and 5-9; docs/reliability.md "Faults: caches, limits, selections,
other versions"): corrupted caches, model limits, empty selections, `--dry-run` on bad checkpoint files, the
ir_datasets splits an evaluation reads, checkpoints of other versions, control characters in paths.

Each case asserts the exit code, exactly one line on stderr without "Traceback" (or, for a cache that is rebuilt, the
one warning line), and that an earlier run's files are byte-identical afterwards. In-process (`pipeline.cli.main`),
on a tiny random BERT and the synthetic source."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, small_run

from core.checkpoints import check_finite, read_checkpoint
from core.errors import TrainingStopped

SMALL = small_run(
    "eval.ats_passages=0",
    "eval.isotropy_paper=false",
    "data.batch_size=8",
    triples=16,
    eval_queries=4,
    depth=8,
    probe_queries=4,
    probe_docs=8,
)


# ---- fixtures: one tiny fine-tuned run, its whitening head, and an earlier run's folder that nothing may touch ----
@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_bert) -> dict:
    from pipeline.config import compose
    from pipeline.run import train

    root = tmp_path_factory.mktemp("faults_inputs")
    cache = root / "cache"
    common = [*SMALL, f"model.backbone={tiny_bert}", f"data.cache_dir={cache}"]
    ft = root / "ft"
    train(
        compose(
            [
                *common,
                "trainer.max_steps=1",
                "trainer.val_check_interval=1",
                "eval.before_training=false",
                "eval.start_candidate=false",
                f"output_dir={ft}",
            ]
        )
    )
    white = root / "white"
    train(
        compose(
            [*common, "stage=head", "head=whitening", f"ckpt={ft / 'checkpoints' / 'last.ckpt'}", f"output_dir={white}"]
        )
    )
    return {
        "root": root,
        "common": common,
        "ckpt": ft / "checkpoints" / "last.ckpt",
        "ft": ft,
        "head": white / "checkpoints" / "head.ckpt",
        "cache": cache,
    }


@pytest.fixture
def earlier(work, tmp_path) -> Path:
    """A finished run's folder (a copy of the fine-tuning run's results), used as output_dir by the failing cases."""
    out = tmp_path / "earlier"
    out.mkdir()
    for name in ("metrics.json", "per_query.json", "run.trec", "config.yaml"):
        shutil.copy2(work["ft"] / name, out / name)
    return out


def snapshot(folder: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(capsys, rc: int, expected: int, prefix: str = "error: ", warned: bool = False) -> str:
    """The one line on stderr (`warned`: a run that got as far as loading a model, whose stderr also holds its own
    `warning:` lines and the libraries' progress output: then the one line of `prefix`)."""
    err = capsys.readouterr().err
    assert rc == expected, err
    assert "Traceback" not in err, err
    if warned:
        err = "".join(ln for ln in err.replace("\r", "\n").splitlines(keepends=True) if ln.startswith(prefix))
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(prefix), err
    return err.strip()


def run_main(argv, job="evaluate") -> int:
    from pipeline.cli import main
    from pipeline.run import evaluate, train

    return main(argv, evaluate if job == "evaluate" else lambda c, _: train(c))


def save_variant(src: Path, dst: Path, edit) -> Path:
    ck = torch.load(src, map_location="cpu", weights_only=False)
    edit(ck)
    torch.save(ck, dst)
    return dst


# ---- 3. caches and checkpoints are verified when read --------------------------------------------------------------
def _head_cache(work, tmp_path):
    """A representation cache of the fine-tuned ranker over a few texts, and a function that (re)builds it."""
    from models.heads.cache import RepresentationCache
    from models.loading import load_ranker

    ranker, tokenizer, _ = load_ranker(work["ckpt"])
    texts = ["what is a kernel", "kernel pooling in ranking", "whitening the token vectors", "a flow head"]
    path = tmp_path / "representations" / "c"

    def build():
        return RepresentationCache.build(
            path, ranker, tokenizer, texts[:2], texts[2:], dtype="float32", checkpoint="ck"
        )

    return build, path


@pytest.mark.parametrize("fault", ["nan", "truncated", "wrong_shape", "garbled_manifest"])
def test_head_cache_corrupted_is_rebuilt_with_a_warning(work, tmp_path, fault):
    build, path = _head_cache(work, tmp_path)
    good = np.array(build().vectors())
    vec, man = path / "vectors.bin", path / "manifest.json"
    if fault == "nan":  # the case of the issue: the key matches, the values are NaN
        arr = np.memmap(vec, dtype=np.float32, mode="r+", shape=good.shape)
        arr[1, :] = np.nan
        arr.flush()
        del arr
    elif fault == "truncated":
        vec.write_bytes(vec.read_bytes()[: vec.stat().st_size // 2])
    elif fault == "wrong_shape":
        m = json.loads(man.read_text())
        man.write_text(json.dumps({**m, "dim": m["dim"] * 2}))
    else:
        man.write_text(man.read_text()[:20])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = np.array(build().vectors())
    msgs = [str(w.message) for w in caught if "representation cache" in str(w.message)]
    assert len(msgs) == 1 and "rebuilding it" in msgs[0], msgs
    assert np.isfinite(again).all() and np.array_equal(again, good)


def test_whitening_with_nonfinite_parameters_writes_no_head_ckpt(work, tmp_path, earlier, capsys, monkeypatch):
    """Whitening that ends non-finite (whatever the cause) stops with exit 3 and one line; no head.ckpt is written."""
    from models.heads.whitening import Whitening

    real = Whitening.fit

    def nan_fit(self, acc):
        real(self, acc)
        self.transform.fill_(float("nan"))
        return self

    monkeypatch.setattr(Whitening, "fit", nan_fit)
    out = tmp_path / "white"
    rc = run_main(
        [*work["common"], "stage=head", "head=whitening", f"ckpt={work['ckpt']}", f"output_dir={out}"], "train"
    )
    err = one_line(capsys, rc, 3, "stopped: ", warned=True)
    assert (
        "the fitted whitening head has non-finite parameters (ranker.token_head.transform" in err
        and "was not written" in err
    )
    assert not (out / "checkpoints" / "head.ckpt").exists()


def test_checkpoint_writer_refuses_nonfinite_weights(tmp_path):
    from callbacks.atomic_io import AtomicCheckpointIO

    target = tmp_path / "last.ckpt"
    target.write_bytes(b"the previous checkpoint")
    with pytest.raises(TrainingStopped, match="non-finite parameters"):
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.tensor([1.0, float("inf")])}}, target)
    assert target.read_bytes() == b"the previous checkpoint" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    check_finite({"w": torch.ones(2), "step": torch.tensor(3)}, target, "x")  # finite: nothing raised


@pytest.mark.parametrize("kind", ["head", "ranker"])
def test_loading_a_nonfinite_checkpoint_names_it(work, tmp_path, earlier, capsys, kind):
    before = snapshot(earlier)
    if kind == "head":
        bad = save_variant(
            work["head"],
            tmp_path / "nan_head.ckpt",
            lambda ck: ck["state_dict"]["ranker.token_head.transform"].fill_(float("nan")),
        )
        args = [f"head_ckpt={bad}"]
    else:

        def poison(ck):
            name = next(k for k, v in ck["state_dict"].items() if v.is_floating_point())
            ck["state_dict"][name].view(-1)[0] = float("nan")

        bad = save_variant(work["ckpt"], tmp_path / "nan_ranker.ckpt", poison)
        args = [f"ckpt={bad}"]
    rc = run_main([*work["common"], *args, f"output_dir={earlier}"])
    err = one_line(capsys, rc, 2)
    assert f"checkpoint '{bad}' holds non-finite parameters" in err
    assert snapshot(earlier) == before


@pytest.mark.parametrize("fault", ["truncated", "nan_score", "other_queries"])
def test_bm25_run_cache_corrupted_is_recomputed_with_a_warning(tmp_path, fault):
    from datamodules.bm25 import bm25_run

    docs = {f"d{i}": f"passage {i} about kernels and {'flows' if i % 2 else 'whitening'}" for i in range(8)}
    queries = {"q1": "kernels", "q2": "whitening flows"}
    good = bm25_run(docs, queries, 5, tmp_path, "t")
    (path,) = (tmp_path / "bm25").glob("t-*.json")
    payload = json.loads(path.read_text())
    if fault == "truncated":
        path.write_text(path.read_text()[:40])
    elif fault == "nan_score":
        payload["run"]["q1"][0][1] = float("nan")
        path.write_text(json.dumps(payload))
    else:
        payload["run"].pop("q2")
        path.write_text(json.dumps(payload))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = bm25_run(docs, queries, 5, tmp_path, "t")
    msgs = [str(w.message) for w in caught if "BM25 run cache" in str(w.message)]
    assert len(msgs) == 1 and "recomputing it" in msgs[0], msgs
    assert again == good and json.loads(path.read_text())["run"]["q1"] == [list(x) for x in good["q1"]]


# ---- 5. model limits at config time ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, text",
    [
        (
            ["model=bert_cat", "model.query_max_len=600"],
            "config key 'model.query_max_len': is 600, but the cross-encoder's input [CLS] query [SEP] passage [SEP] "
            "(600 + 180 + 3) is then up to 783 tokens, above the 512 positions",
        ),
        (
            ["model=colbert", "model.doc_max_len=513"],
            "config key 'model.doc_max_len': is 513, but a passage is then up to 513 tokens, above the 512 positions",
        ),
        (
            ["model=tk", "model.query_max_len=600"],
            "config key 'model.query_max_len': is 600, above model.passage_position_offset=500",
        ),
        (["model=dgre", "model.graph_layer=9"], "config key 'model.graph_layer': is 9; the backbone has 6 layers"),
    ],
)
@pytest.mark.parametrize("dry", [False, True])
def test_model_limits_stop_at_config_time(tmp_path, earlier, capsys, args, text, dry):
    before = snapshot(earlier)
    out = tmp_path / "new"
    rc = run_main([*SMALL, *args, f"output_dir={out}", *(["--dry-run"] if dry else [])], "train")
    assert text in one_line(capsys, rc, 2)
    assert not out.exists() and snapshot(earlier) == before


def test_model_limit_read_from_a_local_backbone(tmp_path, capsys):
    from conftest import make_tiny_bert

    bert = make_tiny_bert(tmp_path / "bert")
    conf = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**conf, "max_position_embeddings": 64}))
    capsys.readouterr()  # the model's saving progress
    rc = run_main([*SMALL, f"model.backbone={bert}", "model=repbert", "model.query_max_len=65", "--dry-run"])
    assert "above the 64 positions of backbone" in one_line(capsys, rc, 2)


@pytest.mark.parametrize("from_ckpt", [False, True])
def test_pq_m_must_divide_the_dimension(work, capsys, from_ckpt):
    """The dim from the ranker config (MiniLM: 384) or, with ckpt=, from the checkpoint's header (tiny BERT: 32)."""
    args = ["retrieval=dense", "retrieval.index_type=pq", "retrieval.pq_m=7", "--dry-run"]
    rc = run_main([*SMALL, *args, *([f"ckpt={work['ckpt']}"] if from_ckpt else [])])
    dim = 32 if from_ckpt else 384
    assert (
        f"config key 'retrieval.pq_m': is 7, which does not divide the {dim}-dimensional vectors of ranker 'colbert'"
        in one_line(capsys, rc, 2)
    )


# ---- 6. empty selections -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, text",
    [
        (["only=no_such_row/*"], "key only: ['no_such_row/*'] matches none of the"),
        (["only="], "key only: is empty"),
        (["measures=[]"], "key measures: is empty"),
        (["seeds=[]"], "key seeds: is []"),
    ],
)
def test_grid_selection_of_nothing_is_an_error(tmp_path, capsys, args, text):
    from grid.engine import main

    rc = main(["grid=dgre_cranfield", f"output_root={tmp_path}", *args])
    err = one_line(capsys, rc, 2)
    assert text in err, err
    assert not any(tmp_path.iterdir())
    if args[0].startswith("only=no"):
        assert "'bm25/cranfield/fold0'" in err  # names what exists


def test_eval_measures_empty_is_an_error(tmp_path, capsys):
    rc = run_main([*SMALL, "eval.measures=[]", f"output_dir={tmp_path / 'out'}"])
    assert (
        "config key 'eval.measures': is empty; expected a list of trec_eval measures, e.g. ['ndcg_cut_10'"
        in one_line(capsys, rc, 2)
    )


# ---- 7. --dry-run reads checkpoint headers -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fault, text",
    [
        ("zero", "(it is empty, 0 bytes); it is truncated or not a torch file"),
        ("truncated", "(BadZipFile: File is not a zip file); it is truncated or not a torch file"),
        ("text", "(BadZipFile: File is not a zip file); it is truncated or not a torch file"),
        ("foreign", "is not a checkpoint of this pipeline (no ranker hyper-parameters)"),
        ("storage_missing", "the archive lacks"),
    ],
)
def test_dry_run_reads_checkpoint_headers(work, tmp_path, capsys, fault, text):
    bad = tmp_path / f"{fault}.ckpt"
    blob = work["ckpt"].read_bytes()
    if fault == "zero":
        bad.write_bytes(b"")
    elif fault == "truncated":
        bad.write_bytes(blob[: len(blob) // 2])
    elif fault == "text":
        bad.write_text("not a checkpoint\n")
    elif fault == "foreign":
        torch.save({"weights": torch.zeros(2)}, bad)
    else:  # a zip whose data.pkl is intact but a tensor storage is gone
        import zipfile

        with zipfile.ZipFile(work["ckpt"]) as src, zipfile.ZipFile(bad, "w") as dst:
            dropped = next(n for n in src.namelist() if "/data/" in n)
            for n in src.namelist():
                if n != dropped:
                    dst.writestr(n, src.read(n))
    rc = run_main([*SMALL, f"ckpt={bad}", "--dry-run"])
    err = one_line(capsys, rc, 2)
    assert err.startswith("error: ckpt: ") and text in err, err


def test_dry_run_head_ckpt_must_be_a_head_and_loads_no_tensor(work, capsys, monkeypatch):
    rc = run_main([*SMALL, f"head_ckpt={work['ckpt']}", "--dry-run"])
    assert "is not a head checkpoint (from train.py stage=head)" in one_line(capsys, rc, 2)

    def no_load(*a, **k):
        raise AssertionError("--dry-run loaded a checkpoint")

    monkeypatch.setattr(torch, "load", no_load)
    rc = run_main([*SMALL, f"head_ckpt={work['head']}", f"ckpt={work['ckpt']}", "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0 and out.err == "", out.err


# ---- 8. ir_datasets: an evaluation reads only its test split ------------------------------------------------------
def test_ir_datasets_evaluation_reads_only_test(tmp_path, capsys, monkeypatch):
    from datamodules.sources import ir_datasets_source as src

    looked_up, read = [], []
    real_load = src._load

    def load(dataset_id, key):
        looked_up.append(key)
        return real_load(dataset_id, key)  # a registry look-up: no download

    monkeypatch.setattr(src, "_load", load)
    monkeypatch.setattr(
        src, "_split", lambda dataset_id, key, cfg, answers: read.append(key) or pytest.fail(f"read {key}")
    )
    rc = run_main(["data=ir_datasets", "data.test_id=no-such/dataset", "logger=none", f"output_dir={tmp_path / 'out'}"])
    err = one_line(capsys, rc, 2)
    assert (
        err
        == "error: data.test_id: unknown ir_datasets id 'no-such/dataset'; expected an id from https://ir-datasets.com"
    )
    assert looked_up == ["test_id"] and read == [] and not (tmp_path / "out").exists()


def test_ir_datasets_build_skips_unused_splits(monkeypatch):
    from datamodules.sources import ir_datasets_source as src

    calls = []
    monkeypatch.setattr(src, "_load", lambda dataset_id, key: calls.append(("load", key)) or pytest.fail("stop"))
    cfg = src.IrDatasetsConfig(train_id="a/train", val_id="a/val", test_id="a/test")
    with pytest.raises(pytest.fail.Exception):
        src.build(cfg, 0, splits=("test",))
    assert calls == [("load", "test_id")]


# ---- 9. checkpoints of other versions, control characters --------------------------------------------------------
def test_checkpoint_with_unknown_hparam_key(work, tmp_path, earlier, capsys):
    bad = save_variant(
        work["ckpt"], tmp_path / "newer.ckpt", lambda ck: ck["hyper_parameters"]["model"].update(pooling="max")
    )
    before = snapshot(earlier)
    for extra in ([], ["--dry-run"]):
        rc = run_main([*work["common"], f"ckpt={bad}", f"output_dir={earlier}", *extra])
        err = one_line(capsys, rc, 2)
        assert err.startswith(
            f"error: ckpt: checkpoint '{bad}' has hyper-parameter 'model.pooling', which this version does not know"
        ), err
    assert snapshot(earlier) == before


def test_checkpoint_with_missing_hparam_key_takes_the_default(work, tmp_path):
    from models.loading import load_ranker

    old = save_variant(
        work["ckpt"], tmp_path / "older.ckpt", lambda ck: ck["hyper_parameters"]["model"].pop("length_buckets")
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_ranker(old)
    msgs = [str(w.message) for w in caught if "has no hyper-parameter" in str(w.message)]
    assert msgs == [
        f"checkpoint '{old}' has no hyper-parameter model.length_buckets (a checkpoint of another version?); "
        "taking the default length_buckets='auto'"
    ]
    assert loaded.config.length_buckets == "auto"
    assert read_checkpoint(str(old), "ckpt")["hyper_parameters"]["model"]["length_buckets"] == "auto"


@pytest.mark.parametrize("arg", ["output_dir=outputs/a\nb", "data.cache_dir=.cache\tx", "ckpt=a\rb.ckpt"])
def test_control_characters_in_paths_are_refused(tmp_path, capsys, monkeypatch, arg):
    monkeypatch.chdir(tmp_path)
    rc = run_main([*SMALL, arg])
    err = one_line(capsys, rc, 2)
    key = arg.split("=", 1)[0]
    assert err.startswith(f"error: config key '{key}': is ") and "control character" in err
    assert not any(tmp_path.iterdir())


def test_control_characters_in_grid_arguments_are_refused(tmp_path, capsys):
    from grid.engine import main

    rc = main(["grid=dgre_cranfield", f"output_root={tmp_path}/a\nb"])
    assert "control character" in one_line(capsys, rc, 2)


@pytest.mark.slow
def test_bert_cat_query_max_len_600_subprocess(tmp_path):
    """The issue's case through the real entry script: one line, exit 2, nothing written."""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "model=bert_cat",
            "model.query_max_len=600",
            f"output_dir={tmp_path / 'out'}",
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
