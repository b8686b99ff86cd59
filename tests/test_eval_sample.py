"""`data.max_eval_queries` / `data.eval_sample_seed`: which judged queries an evaluation split keeps."""

from conftest import synthetic_data


def _test_qids(tmp_path, seed: int, **over) -> list[str]:
    sizes = dict(num_train_queries=20, num_val_queries=6, num_test_queries=40, num_topics=6)
    dm = synthetic_data(tmp_path, seed, **sizes, data_seed=5, **over)
    return dm.eval_splits["test"].qids


def test_eval_sample_follows_the_run_seed_unless_fixed(tmp_path):
    every = _test_qids(tmp_path, 1)
    assert len(every) == 40
    per_seed = [_test_qids(tmp_path, s, max_eval_queries=10) for s in (1, 2, 3)]
    for q in per_seed:
        assert len(q) == 10 and len(set(q)) == 10 and set(q) <= set(every) and q == sorted(q)
    # null: each seed its own sample (two of three samples of 10 from 40 coincide with probability ~4e-9)
    assert len({tuple(q) for q in per_seed}) == 3
    assert per_seed[0] == _test_qids(tmp_path, 1, max_eval_queries=10)  # and it repeats with the seed
    fixed = [_test_qids(tmp_path, s, max_eval_queries=10, eval_sample_seed=7) for s in (1, 2, 3)]
    assert fixed[0] == fixed[1] == fixed[2] and len(fixed[0]) == 10 and set(fixed[0]) <= set(every)
    assert fixed[0] != _test_qids(tmp_path, 1, max_eval_queries=10, eval_sample_seed=8)
