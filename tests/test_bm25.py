"""BM25 as a ranker (datamodules/bm25.py `bm25_run`, `python evaluate.py model=bm25`): scores equal the float64
formula for every variant parameter set, the CLI writes a trec_eval-consistent run, and real collections land in a sane
range."""

from __future__ import annotations

import json

import pytest
from conftest import job_args, run_script
from test_negatives import DOCS, QUERIES, brute_force_bm25

from datamodules.bm25 import BM25Params, bm25_run
from metrics.ir import evaluate_run


@pytest.mark.parametrize("k1,b", [(1.5, 0.75), (0.9, 0.4), (1.2, 1.0)])
def test_run_scores_equal_formula(k1, b):
    run = bm25_run(DOCS, QUERIES, k=20, params=BM25Params("lucene", k1, b))
    for qid, query in QUERIES.items():
        ref = brute_force_bm25(DOCS, query, k1=k1, b=b)
        got = dict(run[qid])
        assert set(got) == set(ref), qid
        for d, s in ref.items():
            assert got[d] == pytest.approx(s, abs=1e-5), (qid, d)
        scores = [s for _, s in run[qid]]
        assert scores == sorted(scores, reverse=True)


def test_bad_method_is_one_line():
    from core.errors import InputError

    with pytest.raises(InputError, match="bm25.method"):
        BM25Params("bm26")


def _write_tsv(tmp_path):
    (tmp_path / "collection.tsv").write_text("".join(f"{d}\t{t}\n" for d, t in DOCS.items() if d != "d12"))
    qs = {"a": "brown fox", "c": "quantum bits superposition", "f": "fox dog cat"}
    (tmp_path / "queries.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in qs.items()))
    (tmp_path / "qrels.txt").write_text("a 0 d06 2\na 0 d02 1\nc 0 d09 1\nf 0 d08 1\nf 0 d03 0\n")
    args = [f"data.collection={tmp_path / 'collection.tsv'}", "data.train_triples=null"]
    for split in ("train", "val", "test"):
        args += [f"data.{split}_queries={tmp_path / 'queries.tsv'}", f"data.{split}_qrels={tmp_path / 'qrels.txt'}"]
    return ["data=tsv", *args, f"data.cache_dir={tmp_path / 'cache'}"], qs


@pytest.mark.slow
def test_cli_writes_run_metrics_per_query(tmp_path):
    data, qs = _write_tsv(tmp_path)
    out = tmp_path / "bm25"
    args = ["model=bm25", *data, "logger=none", f"output_dir={out}", "model.depth=5", "model.k1=0.9", "model.b=0.4"]
    proc = run_script("evaluate.py", *job_args("evaluate.py", args))  # the test split's files: what BM25 reads
    m = json.loads((out / "metrics.json").read_text())
    assert m["bm25"]["k1"] == 0.9 and m["bm25"]["b"] == 0.4 and m["bm25"]["queries"] == 3
    # run.trec re-read and scored independently gives the same numbers (trec_eval semantics)
    run: dict[str, dict[str, float]] = {}
    for line in (out / "run.trec").read_text().splitlines():
        qid, q0, doc, rank, score, tag = line.split()
        assert q0 == "Q0" and tag == "bm25-lucene"
        run.setdefault(qid, {})[doc] = float(score)
    assert all(len(v) <= 5 for v in run.values()) and set(run) == set(qs)
    qrels = {"a": {"d06": 2, "d02": 1}, "c": {"d09": 1}, "f": {"d08": 1, "d03": 0}}
    # the CLI scores the configured eval.measures (configs/config.yaml); score the same list here
    measures = ["ndcg_cut_10", "ndcg_cut_20", "P_20", "mrr_10", "recall_100"]
    means, per_query = evaluate_run(run, qrels, measures)
    for k, v in means.items():
        assert m[k] == pytest.approx(v, abs=1e-9)
    written = json.loads((out / "per_query.json").read_text())
    assert written.keys() == per_query.keys()
    for q in per_query:
        assert written[q] == pytest.approx(per_query[q], abs=1e-12), q
    assert "ndcg_cut_10" in proc.stdout and f"{m['ndcg_cut_10']:.4f}" in proc.stdout
    assert m["bm25"]["split"] == "test" and m["bm25"]["k"] == 5


@pytest.mark.slow
def test_cli_bad_split_leaves_nothing(tmp_path):
    data, _ = _write_tsv(tmp_path)
    proc = run_script(
        "evaluate.py",
        "model=bm25",
        *data,
        "logger=none",
        f"output_dir={tmp_path / 'o'}",
        "model.split=dev",
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: config key 'model.split':")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "name,lo,hi",
    [
        pytest.param("cranfield", 0.30, 0.45, marks=pytest.mark.data("cranfield")),
        pytest.param("vaswani", 0.35, 0.50, marks=pytest.mark.data("vaswani_npl")),
    ],
)
@pytest.mark.slow
def test_classic_collections_in_published_range(tmp_path, name, lo, hi):
    """All judged queries, as BM25 baselines are usually reported (results/2026-11-22-bm25-baselines.md lists the
    figures)."""
    out = tmp_path / name
    run_script(
        "evaluate.py",
        "model=bm25",
        f"data={name}",
        "logger=none",
        f"output_dir={out}",
        f"data.cache_dir={tmp_path / 'c'}",
        "model.split=all",
    )
    m = json.loads((out / "metrics.json").read_text())
    assert lo < m["ndcg_cut_10"] < hi, m
    assert m["bm25"]["judged_queries"] == {"cranfield": 225, "vaswani": 93}[name]


def test_max_eval_queries_scores_the_rerankers_sample(tmp_path):
    """`data.max_eval_queries` samples the questions of a BM25 run as it does a re-ranker's test split (the run seed,
    `np.random.default_rng([seed, 2])` over the sorted judged queries), so a grid's BM25 row shares its questions; each
    sampled query scores as in the full run, and a sample of a split that has none is refused before any write."""
    import numpy as np

    from core.errors import InputError
    from pipeline.config import compose
    from retrieval.bm25 import run_bm25

    data, _ = _write_tsv(tmp_path)
    base = ["model=bm25", *data, "logger=none", "seed=5", "eval.measures=[ndcg_cut_10,recall_10]"]
    run_bm25(compose([*base, f"output_dir={tmp_path / 'full'}"]), "test", 5)
    run_bm25(compose([*base, "data.max_eval_queries=2", f"output_dir={tmp_path / 'two'}"]), "test", 5)
    full = json.loads((tmp_path / "full" / "per_query.json").read_text())
    two = json.loads((tmp_path / "two" / "per_query.json").read_text())
    judged = sorted(["a", "c", "f"])
    want = sorted(judged[i] for i in np.random.default_rng([5, 2]).permutation(3)[:2])
    assert sorted(two) == want and sorted(full) == judged
    for q in want:
        assert two[q] == full[q], q
    metrics = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert metrics["bm25"]["queries"] == 2
    assert metrics["ndcg_cut_10"] == pytest.approx(np.mean([full[q]["ndcg_cut_10"] for q in want]), abs=1e-12)
    # data.eval_sample_seed overrides the run seed, as for the re-rankers
    run_bm25(
        compose([*base, "data.max_eval_queries=2", "data.eval_sample_seed=0", f"output_dir={tmp_path / 's0'}"]),
        "test",
        5,
    )
    s0 = json.loads((tmp_path / "s0" / "per_query.json").read_text())
    assert sorted(s0) == sorted(judged[i] for i in np.random.default_rng([0, 2]).permutation(3)[:2])
    with pytest.raises(InputError, match="data.max_eval_queries.*model.split=all has no such sample"):
        run_bm25(compose([*base, "data.max_eval_queries=2", f"output_dir={tmp_path / 'all'}"]), "all", 5)
    assert not (tmp_path / "all").exists()
