"""bench/bench_gpu.py's comparison of two metrics.json files (the GPU check's verdict), against hand-worked values."""

import math

from bench.bench_gpu import check_bf16, compare, flat_numbers


def test_flat_numbers_dots_nested_keys_and_drops_non_numbers():
    m = {"ndcg_cut_10": 0.5, "best_step": 3, "before_head": {"iw": 0.25, "ok": True, "name": "x"}, "flag": False}
    assert flat_numbers(m) == {"ndcg_cut_10": 0.5, "best_step": 3.0, "before_head.iw": 0.25}


def test_compare_reports_the_largest_shared_difference_and_non_finite_keys():
    a = {"ndcg_cut_10": 0.50, "P_20": 0.30, "best_step": 0, "before_head": {"iw": 0.70}, "mats": math.nan, "only_a": 1}
    b = {"ndcg_cut_10": 0.52, "P_20": 0.27, "best_step": 9, "before_head": {"iw": 0.70}, "mats": 0.1}
    c = compare(a, b)
    assert c["keys"] == 4  # ndcg_cut_10, P_20, before_head.iw, mats; best_step is a step, not a measure
    assert c["worst_key"] == "P_20" and math.isclose(c["max_abs_diff"], 0.03)
    assert c["not_finite"] == ["mats"] and c["ndcg_cut_10"] == [0.50, 0.52]


def test_check_bf16_names_every_metric_that_overflowed():
    m = {"ndcg_cut_10": 0.4, "P_20": math.inf, "before_head": {"iw": math.nan, "avgcos": 0.1}, "best_step": 20}
    assert check_bf16(m) == {"ndcg_cut_10": 0.4, "not_finite": ["P_20", "before_head.iw"]}
    assert check_bf16({"ndcg_cut_10": 0.4, "iw": 0.9})["not_finite"] == []
