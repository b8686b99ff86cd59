"""analyses/random_rerank.py against closed forms: for a query with r relevant among n candidates, a random order
has E[P@k] = r / n (k <= n) and E[recall@k] = k / n; and the same seed gives the same numbers."""
import pytest

from analyses.random_rerank import random_rerank


def test_random_order_matches_the_closed_form_expectations():
    candidates = {"q1": [f"d{i}" for i in range(10)], "q2": [f"e{i}" for i in range(4)]}
    qrels = {"q1": {"d0": 1, "d3": 2, "d7": 1, "x": 1}, "q2": {"e1": 1}}  # x: relevant but not a candidate
    got = random_rerank(candidates, qrels, ["P_5", "recall_5", "P_20"], permutations=1500, seed=1)
    # q1: 3 of 10 candidates relevant (4 relevant in all); q2: 1 of 4, all 4 always within the top 5
    assert got["P_5"]["mean"] == pytest.approx((3 / 10 + 1 / 5) / 2, abs=0.01)
    assert got["recall_5"]["mean"] == pytest.approx((3 / 4 * 5 / 10 + 1.0) / 2, abs=0.01)
    assert got["P_20"] == {"mean": pytest.approx((3 / 20 + 1 / 20) / 2, abs=1e-12), "std": pytest.approx(0.0, abs=1e-12)}
    assert random_rerank(candidates, qrels, ["P_5"], 50, seed=7) == random_rerank(candidates, qrels, ["P_5"], 50, seed=7)
