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


def test_a_sample_seed_without_a_sample_is_refused(tmp_path):
    """`data.eval_sample_seed` draws the sample of `data.max_eval_queries`; with that null every judged query is
    tested, which no seed changes (the split's own `scored_queries`), so the seed alone is refused at composition."""
    import pytest

    from core.errors import InputError
    from pipeline.config import compose

    dm = synthetic_data(tmp_path, 1, num_test_queries=12, data_seed=5)
    split = dm.dataset.split("test")
    assert split.scored_queries(None, 1, 7) == split.scored_queries(None, 1, 8) == split.scored_queries(None, 2, None)
    with pytest.raises(InputError, match=r"data.eval_sample_seed': is 7 but data.max_eval_queries is null") as e:
        compose(["data.eval_sample_seed=7"])
    assert "\n" not in str(e.value)
    assert compose(["data.eval_sample_seed=7", "data.max_eval_queries=3"]).data.eval_sample_seed == 7
