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
    assert got["P_20"] == {
        "mean": pytest.approx((3 / 20 + 1 / 20) / 2, abs=1e-12),
        "std": pytest.approx(0.0, abs=1e-12),
    }
    assert random_rerank(candidates, qrels, ["P_5"], 50, seed=7) == random_rerank(
        candidates, qrels, ["P_5"], 50, seed=7
    )


def test_evaluate_entry_on_a_bm25_run(tmp_path, capsys):
    """`python evaluate.py analysis=random_rerank analysis.run=...` (configs/analysis/random_rerank.yaml): the
    numbers of `random_rerank` on the run's candidates and the split's qrels, printed and written to
    random_rerank.json; a run of another split or a missing file is a one-line error that writes nothing."""
    import json
    import re

    from datamodules.sources import data_config, load_dataset
    from datamodules.textfiles import read_trec_run
    from pipeline.cli import main
    from pipeline.config import compose
    from pipeline.run import evaluate

    common = ["logger=none", "data=synthetic", f"data.cache_dir={tmp_path / 'c'}"]
    assert main(["model=bm25", "model.depth=10", *common, f"output_dir={tmp_path / 'bm25'}"], evaluate) == 0
    trec = tmp_path / "bm25" / "run.trec"
    out = tmp_path / "rr"
    args = ["analysis=random_rerank", f"analysis.run={trec}", "analysis.permutations=20", "analysis.seed=3", *common]
    capsys.readouterr()
    assert main([*args, f"output_dir={out}"], evaluate) == 0
    saved = json.loads((out / "random_rerank.json").read_text())
    run = read_trec_run(trec)
    cfg = compose(args)
    qrels = load_dataset(data_config(cfg), cfg.seed).split("test").qrels
    want = random_rerank({q: sorted(d) for q, d in run.items()}, qrels, list(cfg.eval.measures), 20, seed=3)
    assert saved["random_order"].keys() == want.keys() and saved["queries"] == len(run) and saved["split"] == "test"
    for m, v in want.items():
        assert saved["random_order"][m] == pytest.approx(v), m
    # printed as every job prints its measures: a row per measure, the mean and std over the permutations
    printed = capsys.readouterr().out
    for m, v in want.items():
        assert re.search(rf"│ {m} +│ +{v['mean']:.4f} │ +{v['std']:.4f} │", printed), (m, printed)

    assert main([*args, "analysis.split=train", f"output_dir={tmp_path / 'x'}"], evaluate) == 2
    assert "has no qrels in split train" in capsys.readouterr().err
    assert main([*args, f"analysis.run={tmp_path / 'no.trec'}", f"output_dir={tmp_path / 'x'}"], evaluate) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "analysis.run" in err and "does not exist" in err
    assert not (tmp_path / "x").exists()
