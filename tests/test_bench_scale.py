"""bench/synthetic_msmarco.py (the MS MARCO-shaped files) and bench/bench_scale.py (stage runner, probe, a full run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import msmarco_shaped_config

from bench import bench_scale
from bench import synthetic_msmarco as sm

SPEC = sm.Spec(passages=700, seed=3, val_queries=20, test_queries=60, other_queries=15, vocab=3000)


def read_tsv(path: Path) -> list[list[str]]:
    lines = path.read_text(encoding="ascii").split("\n")
    assert lines[-1] == "", f"{path} does not end with a newline"
    return [line.split("\t") for line in lines[:-1]]


def read_qrels(path: Path) -> list[tuple[str, str]]:
    rows = [line.split(" ") for line in path.read_text().splitlines()]
    assert all(len(r) == 4 and r[1] == "0" and r[3] == "1" for r in rows)
    return [(r[0], r[2]) for r in rows]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("scale-data")
    folder, manifest, reused = sm.ensure(data_dir, SPEC, log=lambda *a: None)
    assert not reused
    return data_dir, folder, manifest


def test_files_shapes_and_references(generated):
    _, folder, manifest = generated
    f = sm.files(folder)
    coll = read_tsv(f["collection"])
    assert [r[0] for r in coll] == [str(i) for i in range(SPEC.passages)]  # pid<TAB>text, pids 0..N-1
    assert all(len(r) == 2 and r[1] == r[1].strip() and r[1] for r in coll)
    lengths = np.array([len(r[1].split(" ")) for r in coll])
    assert lengths.min() >= 8 and lengths.max() <= 200 and 45 < lengths.mean() < 67  # ~56 words, varying
    assert lengths.std() > 10
    words = {pid: set(text.split(" ")) for pid, text in coll}
    assert all(w.isalpha() and w.islower() and len(w) >= 2 for ws in list(words.values())[:50] for w in ws)

    counts = SPEC.counts()
    assert counts["train"] == round(0.057 * SPEC.passages)
    relevant, all_qids = {}, set()
    for s in sm.QUERY_SETS:
        queries = read_tsv(f[f"queries.{s}"])
        assert len(queries) == counts[s] == manifest["queries"][s]
        qids = [q for q, _ in queries]
        assert not all_qids & set(qids), f"query ids of {s} also in another set"
        all_qids |= set(qids)
        qrels = read_qrels(f[f"qrels.{s}"])
        assert sorted(q for q, _ in qrels) == sorted(qids)  # one relevant passage per query
        rel = dict(qrels)
        for qid, text in queries:
            pid = rel[qid]
            assert pid in words, f"qrels name unknown passage {pid}"
            q_words = text.split(" ")
            assert len(q_words) == SPEC.query_words
            assert set(q_words) <= words[pid], f"query {qid} has words not in its relevant passage {pid}"
            relevant[qid] = pid
    train_qids = {q for q, _ in read_tsv(f["queries.train"])}

    triples = read_tsv(f["triples"])
    assert len(triples) == round(SPEC.triples_per_passage * SPEC.passages) == manifest["triples"]
    assert all(len(t) == 3 for t in triples)
    for qid, pos, neg in triples:
        assert qid in train_qids and pos == relevant[qid] and neg in words and neg != pos
    assert len({t[0] for t in triples}) > 0.9 * counts["train"]  # spread over the train queries


def test_pipeline_reads_the_files(generated, tmp_path):
    """The files are a valid `data=tsv` dataset: the tsv source loads and validates them, triples included."""
    from datamodules.sources import load_dataset

    _, folder, _ = generated
    ds = load_dataset(msmarco_shaped_config(folder, tmp_path), seed=0)
    assert len(ds.docs) == SPEC.passages and len(ds.split("train").triples) == round(4.5 * SPEC.passages)
    assert len(ds.split("test").queries) == SPEC.test_queries


def test_reused_and_reproducible(generated, tmp_path):
    data_dir, folder, manifest = generated
    again, m2, reused = sm.ensure(data_dir, SPEC, log=lambda *a: None)
    assert reused and again == folder and m2 == manifest
    other, _, reused = sm.ensure(tmp_path, SPEC, log=lambda *a: None)  # the same settings elsewhere: the same bytes
    assert not reused
    for k, p in sm.files(folder).items():
        assert (other / p.name).read_bytes() == p.read_bytes(), k
    seed4, _, _ = sm.ensure(tmp_path, sm.Spec(**{**SPEC.__dict__, "seed": 4}), log=lambda *a: None)
    assert (
        seed4.name != folder.name
        and (seed4 / "collection.tsv").read_bytes() != sm.files(folder)["collection"].read_bytes()
    )


def test_more_queries_than_passages(tmp_path):
    """A collection smaller than the query sets: relevant passages repeat, every reference stays valid."""
    spec = sm.Spec(passages=40, seed=1, val_queries=5, test_queries=80, other_queries=5, vocab=500)
    folder, manifest, _ = sm.ensure(tmp_path, spec, log=lambda *a: None)
    f = sm.files(folder)
    words = {pid: set(text.split(" ")) for pid, text in read_tsv(f["collection"])}
    queries = dict(read_tsv(f["queries.test"]))
    qrels = read_qrels(f["qrels.test"])
    assert len(qrels) == 80 and all(set(queries[q].split(" ")) <= words[p] for q, p in qrels)
    assert all(neg != pos and neg in words for _, pos, neg in read_tsv(f["triples"]))


def test_vectorised_helpers():
    rng = np.random.default_rng(0)
    cols = [rng.integers(0, 10**9, 500), np.zeros(500, dtype=np.int64), np.array([0, 9, 10, 99, 100] * 100)]
    buf, lens = sm.int_rows(cols, b"\t \n")
    want = "".join(f"{a}\t{b} {c}\n" for a, b, c in zip(*cols))
    assert buf.tobytes().decode() == want and lens.sum() == len(want)
    z = sm.Zipf(5000, 1.0)
    u = rng.random(200_000)
    assert np.array_equal(z.draw(u), np.searchsorted(z.cdf, u))
    w = sm.Words(["ab", "cde", "f"])
    out = w.lines(np.array([7, 12]), np.array([0, 1, 2, 2]), np.array([3, 1]))
    assert out.tobytes() == b"7\tab cde f\n12\tf\n"


def test_probe_measures_a_stage_and_a_failure_goes_on(tmp_path, capsys):
    """The runner's peak RSS comes from the probe's VmHWM at exit; a failing command is recorded, not raised."""
    args = bench_scale.Options(work_dir=tmp_path, out=tmp_path / "scale.json")
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(bench_scale.PROBE)
    result = {"records": []}
    runner = bench_scale.Runner(args, result, probe)
    big = runner.run("demo", "alloc", 10, [sys.executable, "-c", "b = bytearray(300 * 2**20); print(len(b))"], tmp_path)
    assert big["ok"] and big["rss_source"] == "VmHWM at exit" and big["processes"] == 1
    assert 0.3 < big["peak_rss_gb"] < 2.0
    small = runner.run("demo", "alloc", 20, [sys.executable, "-c", "pass"], tmp_path)
    assert small["growth"]["vs_size"] == 10 and small["growth"]["rss_bytes_per_passage"] < 0
    bad = runner.run("demo", "fail", 10, [sys.executable, "-c", "import sys; sys.exit('broken on purpose')"], tmp_path)
    assert not bad["ok"] and bad["returncode"] == 1 and "broken on purpose" in bad["error"]
    out = capsys.readouterr().out
    assert "FAILED" in out and "broken on purpose" in out
    saved = json.loads((tmp_path / "scale.json").read_text())
    assert [r["run"] for r in saved["records"]] == ["alloc", "alloc", "fail"]


def test_options_errors():
    with pytest.raises(SystemExit) as e:
        bench_scale.main(["stages=store,nope"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        bench_scale.main(["sizes=1"])
    assert e.value.code == 2


# the stages in three groups (each builds what it needs in its own work folder), so that no test runs for minutes
STAGE_GROUPS = {
    "store-bm25": ("store,bm25", [("store", "build"), ("store", "reuse"), ("bm25", "build"), ("bm25", "reuse")]),
    "train": ("train,train_ddp", [("train", "cold"), ("train_ddp", "2proc")]),
    "dense-encode": ("dense,encode", [("dense", "flat"), ("encode", "minilm")]),
    "isotropy": ("isotropy", [("isotropy", r) for r in ("prep", "on", "off", "ratio")]),
}


@pytest.mark.slow
@pytest.mark.parametrize("group", list(STAGE_GROUPS))
def test_full_run_at_2k_passages(tmp_path, group):
    """Every stage at 2,000 passages with small settings: each completes and the JSON holds its figures."""
    stages, want = STAGE_GROUPS[group]
    out = tmp_path / "scale.json"
    result = bench_scale.main(
        [
            "sizes=2000",
            f"stages={stages}",
            f"data_dir={tmp_path / 'data'}",
            f"work_dir={tmp_path / 'work'}",
            f"out={out}",
            "val_queries=20",
            "test_queries=100",
            "other_queries=20",
            "bm25_depth=100",
            "train_eval_queries=4",
            "train_candidate_depth=10",
            "train_warm=false",
            "dense_chunk=512",
            "dense_search_queries=5",
            "dense_k=10",
            "encode_passages=32",
            "isotropy_backbone=tiny",
            "isotropy_queries=8",
            "isotropy_depth=10",
            "stage_timeout=600",
        ]
    )
    saved = json.loads(out.read_text())
    assert saved["records"] == result["records"] and not saved["failed"], saved["failed"]
    recs = {(r["stage"], r["run"]): r for r in saved["records"]}
    assert sorted(recs) == sorted([("data", "generate"), *want])
    for key, r in recs.items():
        assert r["ok"], (key, r.get("error"))
        if key != ("isotropy", "ratio"):
            assert r["wall_s"] > 0 and 0 < r["peak_rss_gb"] < 20 and r["rss_source"] == "VmHWM at exit", key
    if group == "store-bm25":
        assert recs["store", "build"]["result"]["docs"] == 2000
        assert recs["bm25", "build"]["result"]["queries"] == 100 and recs["bm25", "build"]["result"]["mrr_10"] > 0.5
        assert recs["bm25", "reuse"]["result"]["queries"] == 20
    elif group == "train":
        assert 0 < recs["train", "cold"]["first_step_s"] < recs["train", "cold"]["wall_s"]
        ranks = recs["train_ddp", "2proc"]["ranks"]
        assert sorted(r["rank"] for r in ranks) == [0, 1] and len({r["pid"] for r in ranks}) == 2
        assert all(0 < r["peak_rss_gb"] and 0 < r["first_step_s"] for r in ranks)
    elif group == "dense-encode":
        assert recs["dense", "flat"]["result"]["vectors"] == 2000 and recs["dense", "flat"]["result"]["dim"] == 384
        assert recs["encode", "minilm"]["result"]["passages_per_s"] > 0
    else:
        assert (
            recs["isotropy", "on"]["result"]["isotropy_paper_batches"]
            and not recs["isotropy", "off"]["result"]["isotropy_paper_batches"]
        )
        assert recs["isotropy", "ratio"]["ratio"] > 0
