"""bench/bench_peers.py (`python -m bench.bench_peers key=value ...`): the FLOP count it divides by, one alternation
round of our driver end to end, and the quality guard's data export, run files and evaluation (the peers themselves are
not tested here, but for the optimiser PyLate's driver steps, where its venv exists: the venvs are not part of CI)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from bench import bench_peers
from bench.bench_peers import TOOLS
from bench.peers.common import scores_by_query


def test_forward_flops_by_hand():
    cfg = {"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2}
    # per layer and token: Q, K, V, O (4 x 4x4) and the feed-forward (4x8, 8x4): 2 flops per multiply-add;
    # attention: QK^T and AV, L x L x d multiply-adds each
    per_layer = 3 * 2 * (4 * 16 + 2 * 32) + 2 * 2 * 3 * 3 * 4
    assert bench_peers.forward_flops(cfg, 3) == 2 * per_layer


def test_minilm_triplet_costs_about_25_gflop():
    cfg = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6}  # all-MiniLM-L6-v2
    # one 32-token and two 180-token forwards: linear 6 * 2 * 392 * 1769472 = 8.32e9, attention
    # 6 * 4 * 384 * (32^2 + 2 * 180^2) = 0.61e9; training = 3 x forward
    assert bench_peers.unit_flops(cfg, "colbert_train", 100) / 1e9 == pytest.approx(26.79, abs=0.01)


def test_unknown_tool_is_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench_peers.parse_args(["tools=ours,colbertv9"])
    assert e.value.code == 2 and "colbertv9" in capsys.readouterr().err
    for bad in (["--tools", "ours"], ["toolz=ours"], ["steps=many"]):  # `--options` are gone; keys are checked
        with pytest.raises(SystemExit) as e:
            bench_peers.parse_args(bad)
        assert e.value.code == 2
    args = bench_peers.parse_args(["tools=ours", "tasks=quality", "precision=fp32", "quality_untrained="])
    assert args.tools == ["ours"] and args.tasks == ["quality"] and args.quality_untrained == []


@pytest.mark.slow  # two driver processes (~30 s on the shared 2-core machine)
def test_one_round_of_ours(tiny_bert, tmp_path, capsys):
    out = tmp_path / "peers.json"
    res = bench_peers.main(
        [
            "tools=ours",
            "tasks=colbert_train,rerank",
            f"backbone={tiny_bert}",
            "steps=1",
            "warmup=0",
            "rounds=1",
            "rerank_queries=1",
            "candidates=3",
            "matmul_n=64",
            "batch=2",
            f"out={out}",
        ]
    )
    saved = json.loads(out.read_text())
    for task in ("colbert_train", "rerank"):
        s = saved["summary"][task]["bf16"]["ours"]
        assert s["rate"] > 0 and s["peak_rss_mib"] > 0, s
        assert s["rate"] == pytest.approx(res["summary"][task]["bf16"]["ours"]["rate"])
    train = saved["runs"]["colbert_train"]["bf16"]["ours"][0]
    assert train["units"] == 2 and len(train["times"]) == 1
    assert "| colbert_train | bf16 |" in capsys.readouterr().out


# ---- the quality guard (--tasks quality) --------------------------------------------------------------------------
def _lists():
    # two queries over three passages; candidates in BM25 order, as quality_eval_lists writes them
    return {
        "qids": ["q1", "q2"],
        "queries": ["who?", "what?"],
        "doc_ids": ["d0", "d1", "d2"],
        "docs": ["a", "b", "c"],
        "candidates": [[0, 1, 2], [2, 0]],
        "qrels": {"q1": {"d1": 1}, "q2": {"d2": 1}},
    }


def test_quality_batches_are_a_seeded_slice_of_the_triples():
    triples = [(f"q{i}", f"p{i}", f"n{i}") for i in range(10)]
    queries = {f"q{i}": f"Q{i}" for i in range(10)}
    docs = {**{f"p{i}": f"P{i}" for i in range(10)}, **{f"n{i}": f"N{i}" for i in range(10)}}
    a = bench_peers.quality_batches(triples, queries, docs, steps=2, batch=3, seed=5)
    assert a == bench_peers.quality_batches(triples, queries, docs, steps=2, batch=3, seed=5)
    assert [len(b[0]) for b in a] == [3, 3]
    used = [q for b in a for q in b[0]]
    assert len(set(used)) == 6  # six distinct triples, no repeats across batches
    for qs, ps, ns in a:  # each row is one triple's query, positive and negative
        for q, p, n in zip(qs, ps, ns):
            assert p == "P" + q[1:] and n == "N" + q[1:]
    assert a != bench_peers.quality_batches(triples, queries, docs, steps=2, batch=3, seed=6)
    with pytest.raises(ValueError, match="training split has 10"):
        bench_peers.quality_batches(triples, queries, docs, steps=4, batch=3, seed=5)


def test_quality_eval_lists_keep_each_querys_candidates_in_order():
    import numpy as np

    from datamodules.datamodule import EvalSplit

    split = EvalSplit(
        ["q1", "q2"],
        ["d0", "d1", "d2"],
        np.array([[0, 0], [0, 1], [0, 2], [1, 2], [1, 0]]),
        {"q1": {"d1": 1}, "q2": {"d2": 1}},
        ["who?", "what?"],
        ["a", "b", "c"],
    )
    assert bench_peers.quality_eval_lists(split) == _lists()
    split.unit_doc = np.array([0, 1, 2])
    with pytest.raises(ValueError, match="passage windows"):
        bench_peers.quality_eval_lists(split)


def test_quality_run_file_is_scored_by_our_evaluator(tmp_path):
    lists = _lists()
    # q1: relevant d1 ranked 2nd -> NDCG@10 = 1 / log2(3), RR 1/2; q2: relevant d2 ranked 1st -> 1, 1
    run = bench_peers.scores_to_run({"q1": [0.9, 0.5, 0.1], "q2": [0.7, 0.2]}, lists)
    assert run == {"q1": {"d0": 0.9, "d1": 0.5, "d2": 0.1}, "q2": {"d2": 0.7, "d0": 0.2}}
    means, per_query = bench_peers.evaluate_quality(run, lists, tmp_path / "x.run", "x")
    assert per_query == pytest.approx({"q1": 1 / np.log2(3), "q2": 1.0})
    assert means["ndcg_cut_10"] == pytest.approx((1 / np.log2(3) + 1) / 2)
    assert means["mrr_10"] == pytest.approx(0.75)
    lines = (tmp_path / "x.run").read_text().splitlines()
    assert lines[0].split() == ["q1", "Q0", "d0", "1", "0.9", "x"] and len(lines) == 5
    # the BM25 reference row: the lists' own order (q1: d1 second, q2: d2 first)
    bm25, _ = bench_peers.evaluate_quality(bench_peers.bm25_order_run(lists), lists, tmp_path / "b.run", "bm25")
    assert bm25["ndcg_cut_10"] == pytest.approx(means["ndcg_cut_10"])


def test_paired_p_against_scipy():
    from scipy import stats

    ours = {"a": 0.9, "b": 0.5, "c": 0.7, "d": 0.2}
    other = {"a": 0.6, "b": 0.5, "c": 0.1, "d": 0.3}
    want = stats.ttest_rel([0.9, 0.5, 0.7, 0.2], [0.6, 0.5, 0.1, 0.3]).pvalue
    assert bench_peers.paired_p(ours, other) == pytest.approx(want)


def test_quality_untrained_tools_are_checked():
    assert bench_peers.parse_args(["tasks=quality", "quality_untrained="]).quality_untrained == []
    assert bench_peers.parse_args(["tasks=quality", "quality_untrained=ours"]).quality_untrained == ["ours"]
    with pytest.raises(SystemExit):
        bench_peers.parse_args(["tasks=quality", "quality_untrained=ours,colbertv9"])


def test_quality_scores_must_cover_exactly_the_candidates():
    lists = _lists()
    with pytest.raises(ValueError, match="query q2: 1 scores for 2 candidates"):
        bench_peers.scores_to_run({"q1": [0.9, 0.5, 0.1], "q2": [0.7]}, lists)
    with pytest.raises(ValueError, match="query q2: 0 scores"):
        bench_peers.scores_to_run({"q1": [0.9, 0.5, 0.1]}, lists)
    with pytest.raises(ValueError, match="not in the lists"):
        bench_peers.scores_to_run({"q1": [0.9, 0.5, 0.1], "q2": [0.7, 0.2], "q3": [1.0]}, lists)


def test_drivers_scores_by_query_restores_the_lists_order():
    lists = _lists()
    # a peer's rerank answers sorted by score, keyed by candidate index
    got = scores_by_query(lists, [{2: 0.9, 0: 0.5, 1: 0.1}, {0: 0.3, 2: 0.2}])
    assert got == {"q1": [0.5, 0.1, 0.9], "q2": [0.2, 0.3]}
    with pytest.raises(ValueError, match="query q2: no score for 1"):
        scores_by_query(lists, [{2: 0.9, 0: 0.5, 1: 0.1}, {0: 0.3}])


@pytest.mark.slow  # two driver processes on a tiny BERT (~30 s on the shared 2-core machine)
def test_quality_task_of_ours_matches_rerank_texts(tiny_bert, tmp_path, monkeypatch):
    from lightning_modules.module import RankingModule

    lists = _lists()
    batches = [(["who?", "what?"], ["b", "c"], ["a", "a"])]
    monkeypatch.setattr(
        bench_peers, "quality_data", lambda args: {"source": "test", "triplets": batches, "eval": lists}
    )
    args = bench_peers.parse_args(
        [
            "tools=ours",
            "tasks=quality",
            "quality_steps=1",
            "batch=2",
            "precision=fp32",
            f"backbone={tiny_bert}",
            "quality_ours_compress_dim=0",
        ]
    )
    q = bench_peers.run_quality(args, ["ours"], {"ours": sys.executable}, tiny_bert, tmp_path)
    names = [r["name"] for r in q["rows"]]
    assert names == ["BM25 (candidate order)", "ours, 0 steps (untrained)", "ours, 1 steps"], q["rows"]
    assert len(q["rows"][2]["losses"]) == 1 and "error" not in q["rows"][1]
    assert "p_vs_ours" in q["rows"][1] and "p_vs_ours" not in q["rows"][2]
    # the untrained row's run file holds what the module's own re-ranking call gives for each candidate list
    from datamodules.textfiles import read_trec_run

    run = read_trec_run(tmp_path / "ours-0steps.run")
    module = RankingModule(
        model=dict(
            name="colbert",
            backbone=tiny_bert,
            query_max_len=bench_peers.QUERY_MAX_LEN,
            doc_max_len=bench_peers.DOC_MAX_LEN,
        ),
        optim=dict(lr=args.lr),
    ).eval()
    for qid, text, cands in zip(lists["qids"], lists["queries"], lists["candidates"]):
        want = module.rerank_texts(text, [lists["docs"][j] for j in cands]).tolist()
        got = [run[qid][lists["doc_ids"][j]] for j in cands]
        assert got == pytest.approx(want, abs=1e-5)
    trained = read_trec_run(tmp_path / "ours-1steps.run")
    assert trained["q1"] != run["q1"]  # one optimiser step moved the scores


def test_meter_counts_the_measured_driver_subprocess_as_its_own_cpu():
    """bench_peers.py meters each tool's driver, a subprocess: the driver's CPU is the measured work, so it must count
    as this process's (children waited for), not as "other processes" (which flags a measurement as contended)."""
    import os
    import subprocess

    from bench.bench_speed import _cpu_jiffies

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\n"
    _, own0 = _cpu_jiffies()
    subprocess.run([sys.executable, "-c", burn], check=True)
    _, own1 = _cpu_jiffies()
    assert (own1 - own0) / os.sysconf("SC_CLK_TCK") >= 0.5


@pytest.mark.skipif(not Path(TOOLS["pylate"][1]).exists(), reason="no PyLate venv (bench/requirements-pylate.txt)")
def test_pylate_steps_the_optimiser_its_trainer_builds():
    """PyLate's trainer is an HF Trainer: fused AdamW (torch >= 2.8) with weight decay 0 by default; a plain
    torch.optim.AdamW (a loop over parameters on the CPU, weight decay 0.01) would make PyLate slower than its users
    see it. Checked in PyLate's own venv, against transformers' TrainingArguments there."""
    code = (
        "import torch, transformers\n"
        "from bench.peers.pylate_driver import trainer_optimizer\n"
        "opt, name = trainer_optimizer(torch.nn.Linear(3, 2), 2e-5)\n"
        "g = opt.param_groups[0]\n"
        "print(type(opt).__name__, g['fused'], g['weight_decay'], g['lr'], len(g['params']))\n"
    )
    out = subprocess.run([TOOLS["pylate"][1], "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["AdamW", "True", "0.0", "2e-05", "2"]
