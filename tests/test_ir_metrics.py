"""IR measures (trec_eval semantics) against values computed by hand, RetrievalRun, and TREC run files."""

from __future__ import annotations

from math import log2

import pytest
import torch

from core.errors import InputError
from datamodules.textfiles import read_trec_run
from metrics.ir import RetrievalRun, evaluate_run, rank_documents, truncate_run
from metrics.trec import write_trec_run

# Graded qrels. q4 has no relevant document (left out of the means); q5 is not in the run (scores 0);
# q6 is in the run but none of its retrieved documents is relevant.
QRELS = {
    "q1": {"d1": 2, "d2": 1, "d3": 0, "d4": 1},
    "q2": {"d5": 1, "d6": 3},
    "q3": {"d7": 1},
    "q4": {"d8": 0},
    "q5": {"d9": 1},
    "q6": {"d10": 1},
}

RUN = {
    # d1 and d2 tie at 0.5: trec_eval puts the larger docid first, so d2 is rank 2 and d1 rank 3.
    # Eight unjudged fillers u1..u8 take ranks 4-11 and d4 is rank 12.
    "q1": {"d1": 0.5, "d3": 0.9, "d2": 0.5, **{f"u{i}": 0.45 - 0.05 * i for i in range(1, 9)}, "d4": 0.01},
    # d5 rank 1 (grade 1), x1 rank 2, d6 rank 3 (grade 3).
    "q2": {"d6": 0.5, "x1": 1.0, "d5": 2.0},
    # n1..n9 ranks 1-9; d7 and "n_zz" tie at 0.0 and "n_zz" > "d7", so n_zz is rank 10 and d7 rank 11:
    # a naive cut at 10 that kept insertion order (d7 first) would put d7 in the top 10.
    "q3": {"d7": 0.0, **{f"n{i}": 1.0 - 0.1 * i for i in range(1, 10)}, "n_zz": 0.0},
    "q4": {"d8": 1.0},
    "q6": {"y1": 1.0, "y2": 0.5},
    "q7": {"z1": 1.0},  # no qrels: ignored
}

# ---- the hand computation (gain = grade, discount = log2(rank + 1), ideal DCG over the judged grades)
IDCG_Q1 = 2 / log2(2) + 1 / log2(3) + 1 / log2(4)  # grades 2, 1, 1 (d3's 0 adds nothing)
IDCG_Q2 = 3 / log2(2) + 1 / log2(3)
IDCG_Q3 = 1.0
EXPECTED = {
    "q1": {  # relevant at ranks 2 (d2, grade 1), 3 (d1, grade 2), 12 (d4, grade 1); 3 relevant in all
        "ndcg_cut_10": (1 / log2(3) + 2 / log2(4)) / IDCG_Q1,
        "ndcg_cut_20": (1 / log2(3) + 2 / log2(4) + 1 / log2(13)) / IDCG_Q1,
        "P_10": 2 / 10,
        "P_20": 3 / 20,
        "mrr_10": 1 / 2,
        "recip_rank": 1 / 2,
        "recall_10": 2 / 3,
        "recall_100": 3 / 3,
        "map": (1 / 2 + 2 / 3 + 3 / 12) / 3,
    },
    "q2": {  # relevant at ranks 1 (d5, grade 1) and 3 (d6, grade 3)
        "ndcg_cut_10": (1 / log2(2) + 3 / log2(4)) / IDCG_Q2,
        "ndcg_cut_20": (1 / log2(2) + 3 / log2(4)) / IDCG_Q2,
        "P_10": 2 / 10,
        "P_20": 2 / 20,
        "mrr_10": 1.0,
        "recip_rank": 1.0,
        "recall_10": 1.0,
        "recall_100": 1.0,
        "map": (1 / 1 + 2 / 3) / 2,
    },
    "q3": {  # the only relevant document is at rank 11: outside every cut at 10
        "ndcg_cut_10": 0.0,
        "ndcg_cut_20": (1 / log2(12)) / IDCG_Q3,
        "P_10": 0.0,
        "P_20": 1 / 20,
        "mrr_10": 0.0,
        "recip_rank": 1 / 11,
        "recall_10": 0.0,
        "recall_100": 1.0,
        "map": 1 / 11,
    },
    "q5": dict.fromkeys(
        ["ndcg_cut_10", "ndcg_cut_20", "P_10", "P_20", "mrr_10", "recip_rank", "recall_10", "recall_100", "map"], 0.0
    ),
    "q6": dict.fromkeys(
        ["ndcg_cut_10", "ndcg_cut_20", "P_10", "P_20", "mrr_10", "recip_rank", "recall_10", "recall_100", "map"], 0.0
    ),
}
MEASURES = tuple(EXPECTED["q1"])


def test_evaluate_run_matches_hand_computation():
    means, per_query = evaluate_run(RUN, QRELS, MEASURES)
    assert set(per_query) == {"q1", "q2", "q3", "q5", "q6"}  # q4: no relevant doc; q7: no qrels
    for qid, expected in EXPECTED.items():
        for measure, value in expected.items():
            assert per_query[qid][measure] == pytest.approx(value, abs=1e-12), (qid, measure)
    assert set(means) == set(MEASURES)
    for measure in MEASURES:
        by_hand = sum(EXPECTED[q][measure] for q in EXPECTED) / 5
        assert means[measure] == pytest.approx(by_hand, abs=1e-12), measure
    # Spot checks of the means, written out.
    assert means["P_20"] == pytest.approx((3 / 20 + 2 / 20 + 1 / 20 + 0 + 0) / 5)
    assert means["mrr_10"] == pytest.approx((1 / 2 + 1 + 0 + 0 + 0) / 5)
    assert means["recall_100"] == pytest.approx((1 + 1 + 1 + 0 + 0) / 5)


def test_tie_order_decides_ndcg():
    # Same run with the tie broken the other way (d1 above d2) gives a different nDCG: the tie rule matters.
    run = {"q1": {**RUN["q1"], "d1": 0.5 + 1e-6}}
    _, per_query = evaluate_run(run, {"q1": QRELS["q1"]}, ["ndcg_cut_10"])
    assert per_query["q1"]["ndcg_cut_10"] == pytest.approx((2 / log2(3) + 1 / log2(4)) / IDCG_Q1, abs=1e-12)
    assert per_query["q1"]["ndcg_cut_10"] != pytest.approx(EXPECTED["q1"]["ndcg_cut_10"])


def test_scores_tie_at_float32_resolution_as_in_trec_eval():
    # trec_eval keeps scores as C float: 0.5 + 1e-9 == 0.5 there, so "b" (larger docid) ranks first.
    # The mrr_K cut must see the same order, or mrr_1 would disagree with trec_eval's recip_rank.
    run = {"q": {"a": 0.5 + 1e-9, "b": 0.5}}
    means, _ = evaluate_run(run, {"q": {"a": 1}}, ["recip_rank", "mrr_1", "mrr_2"])
    assert means == {"recip_rank": 0.5, "mrr_1": 0.0, "mrr_2": 0.5}
    assert [d for d, _ in rank_documents(run["q"])] == ["b", "a"]
    assert rank_documents(run["q"])[1] == ("a", 0.5 + 1e-9)  # scores come back unrounded


def test_rank_and_truncate_follow_trec_eval_order():
    assert [d for d, _ in rank_documents(RUN["q1"])][:3] == ["d3", "d2", "d1"]
    assert [d for d, _ in rank_documents(RUN["q3"])][9:] == ["n_zz", "d7"]
    top = truncate_run(RUN, 10)
    assert "d7" not in top["q3"] and "n_zz" in top["q3"]
    assert len(top["q1"]) == 10 and len(top["q2"]) == 3


def test_relevance_level():
    # With -l 2 only grades >= 2 are relevant: q1 has d1 (rank 3), q2 has d6 (rank 3); q3, q5, q6 drop out.
    means, per_query = evaluate_run(RUN, QRELS, ["recip_rank", "P_10"], relevance_level=2)
    assert set(per_query) == {"q1", "q2"}
    assert means["recip_rank"] == pytest.approx(1 / 3)
    assert means["P_10"] == pytest.approx(1 / 10)


def test_evaluate_run_errors():
    with pytest.raises(InputError, match="unknown measure 'ndcg@10'"):
        evaluate_run(RUN, QRELS, ["ndcg@10"])
    with pytest.raises(InputError, match="unknown measure"):
        evaluate_run(RUN, QRELS, ["P_0"])
    with pytest.raises(InputError, match="not finite"):
        evaluate_run({"q1": {"d1": float("nan")}}, QRELS, ["P_10"])
    with pytest.raises(InputError, match="no query has a document with relevance"):
        evaluate_run(RUN, {"q4": {"d8": 0}}, ["P_10"])
    means, per_query = evaluate_run({}, QRELS, ["P_10", "mrr_10"])  # empty run: every query scores 0
    assert means == {"P_10": 0.0, "mrr_10": 0.0} and len(per_query) == 5


# ---------------------------------------------------------------- RetrievalRun
QIDS = ["q1", "q2", "q3"]
DOCIDS = ["a", "b", "c", "d"]


def test_retrieval_run_dedups_and_maps_indices():
    metric = RetrievalRun()
    metric.update(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2]), torch.tensor([0.5, 0.25, 1.0]))
    # A padded DistributedSampler repeats (0, 1) and (1, 2); a copy may differ by float noise -> max kept.
    metric.update(
        torch.tensor([[0, 2], [1, 1]]),
        torch.tensor([[1, 3], [2, 0]]),
        torch.tensor([[0.25, -1.5], [1.0 + 1e-6, 2.0]], dtype=torch.float16),
    )
    qidx, didx, scores = metric.compute()
    assert qidx.tolist() == [0, 0, 1, 1, 2] and didx.tolist() == [0, 1, 0, 2, 3]
    assert scores.dtype == torch.float32
    run = metric.to_run(QIDS, DOCIDS)
    assert run == {
        "q1": {"a": 0.5, "b": 0.25},
        "q2": {"a": 2.0, "c": pytest.approx(1.0, abs=1e-3)},
        "q3": {"d": -1.5},
    }
    qrels = {"q1": {"b": 1}, "q2": {"c": 2}, "q3": {"a": 1}}
    means, per_query = metric.evaluate(QIDS, DOCIDS, qrels, ["recip_rank", "P_10"])
    assert per_query["q1"]["recip_rank"] == 0.5 and per_query["q2"]["recip_rank"] == 0.5
    assert per_query["q3"]["recip_rank"] == 0.0
    assert means == pytest.approx({"recip_rank": 1 / 3, "P_10": 0.2 / 3})
    assert (means, per_query) == evaluate_run(run, qrels, ["recip_rank", "P_10"])


def test_retrieval_run_errors_and_empty():
    metric = RetrievalRun()
    with pytest.raises(ValueError, match="differ in size"):
        metric.update(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="integer"):
        metric.update(torch.tensor([0.0]), torch.tensor([0]), torch.tensor([1.0]))
    with pytest.warns(UserWarning):
        assert RetrievalRun().to_run(QIDS, DOCIDS) == {}
    metric.update(torch.tensor([3]), torch.tensor([0]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="query index 3 is outside the 3 ids"):
        metric.to_run(QIDS, DOCIDS)
    metric.reset()
    metric.update(torch.tensor([0]), torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64))
    assert metric.compute()[2].dtype == torch.float64


def _ddp_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # 5 (query, doc) pairs over 2 ranks, padded to 6: rank 1 repeats pair 0, as DistributedSampler does.
        pairs = [(0, 0, 0.5), (0, 1, 0.25), (1, 2, 1.0), (2, 3, -1.5), (1, 0, 2.0), (0, 0, 0.5)]
        mine = pairs[rank::world]
        metric = RetrievalRun()
        for q, d, s in mine:
            metric.update(torch.tensor([q]), torch.tensor([d]), torch.tensor([s]))
        run = metric.to_run(QIDS, DOCIDS)
        if rank == 0:
            torch.save(run, out_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_retrieval_run_gathers_across_ddp_ranks(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "run.pt"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    assert torch.load(out) == {"q1": {"a": 0.5, "b": 0.25}, "q2": {"a": 2.0, "c": 1.0}, "q3": {"d": -1.5}}


# ---------------------------------------------------------------- TREC run files
def test_trec_run_round_trip(tmp_path):
    run = {
        "q2": {"b": 0.1 + 0.2, "a": 0.1 + 0.2, "c": -3.0, "e": 1e-300},
        "q10": {"x": 7.0},
        "q1": {},
    }
    path = tmp_path / "runs" / "dev.trec"
    write_trec_run(path, run, "colbert-test")
    lines = path.read_text().splitlines()
    assert lines == [
        "q10 Q0 x 1 7.0 colbert-test",
        "q2 Q0 b 1 0.30000000000000004 colbert-test",  # tie with a: larger docid first
        "q2 Q0 a 2 0.30000000000000004 colbert-test",
        "q2 Q0 e 3 1e-300 colbert-test",
        "q2 Q0 c 4 -3.0 colbert-test",
    ]
    assert read_trec_run(path) == {"q2": run["q2"], "q10": run["q10"]}  # exact floats; empty q1 has no lines
    assert [p.name for p in path.parent.iterdir()] == ["dev.trec"]  # no temp file left behind
    qrels = {"q2": {"a": 1, "c": 2}, "q10": {"y": 1}}
    assert evaluate_run(read_trec_run(path), qrels) == evaluate_run(run, qrels)


def test_trec_run_errors(tmp_path):
    path = tmp_path / "bad.trec"
    with pytest.raises(InputError, match="whitespace"):
        write_trec_run(path, {"q1": {"doc 1": 1.0}}, "tag")
    with pytest.raises(InputError, match="whitespace"):
        write_trec_run(path, {"q1": {"d": 1.0}}, "my tag")
    with pytest.raises(InputError, match="not finite"):
        write_trec_run(path, {"q1": {"d": float("inf")}}, "tag")
    assert not path.exists()

    path.write_text("q1 Q0 d1 1 0.5 t\n\nq1 Q0 d2 2 0.25\n")
    with pytest.raises(InputError, match=r"bad.trec:3: expected 6 whitespace-separated columns"):
        read_trec_run(path)
    path.write_text("q1 Q0 d1 1 high t\n")
    with pytest.raises(InputError, match=r"bad.trec:1: score 'high' is not a number"):
        read_trec_run(path)
    path.write_text("q1 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n")
    with pytest.raises(InputError, match="listed twice"):
        read_trec_run(path)
    with pytest.raises(InputError, match="no such TREC run file"):
        read_trec_run(tmp_path / "missing.trec")
