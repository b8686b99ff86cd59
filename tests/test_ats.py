"""ATS / MATS (position-bias paper Eq. 8-9) against a brute-force double loop, and on encoders with and without
positional information."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from callbacks.metrics.ats import AverageTermSimilarity, average_term_similarity, mats_from_curve


def brute_force_ats(vectors, terms, positions, passages):
    """Eq. 8 literally: for every term, every pair of its occurrences in different passages, in float64."""
    x = np.asarray(vectors, dtype=np.float64)
    sums: dict[tuple[int, int], list[float]] = {}
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            if terms[i] != terms[j] or passages[i] == passages[j]:
                continue
            c = x[i] @ x[j] / (np.linalg.norm(x[i]) * np.linalg.norm(x[j]))
            sums.setdefault((int(terms[i]), abs(int(positions[i]) - int(positions[j]))), []).append(c)
    max_d = max(d for _, d in sums)
    ats = np.full(max_d + 1, np.nan)
    for d in range(max_d + 1):
        per_term = [np.mean(v) for (t, dd), v in sums.items() if dd == d]
        if per_term:
            ats[d] = np.mean(per_term)
    drops = [ats[0] - ats[i] for i in range(1, max_d + 1) if not np.isnan(ats[i])]
    return ats, float(np.mean(drops))


def hand_made_set(seed=0, passages=12, length=15, vocab=6, dim=5):
    rng = np.random.default_rng(seed)
    terms, positions, pids = [], [], []
    for p in range(passages):
        n = rng.integers(length // 2, length + 1)
        terms += rng.integers(0, vocab, n).tolist()
        positions += list(range(n))
        pids += [p] * n
    vectors = rng.normal(size=(len(terms), dim))
    return vectors, np.array(terms), np.array(positions), np.array(pids)


def test_ats_equals_brute_force_double_loop():
    vectors, terms, positions, passages = hand_made_set()
    ref, ref_mats = brute_force_ats(vectors, terms, positions, passages)
    got = average_term_similarity(torch.tensor(vectors, dtype=torch.float64), terms, positions, passages, max_occurrences=None)
    assert len(got.ats) >= len(ref)
    np.testing.assert_allclose(got.ats[: len(ref)], ref, atol=1e-6, equal_nan=True)
    assert np.isnan(got.ats[len(ref):]).all()
    assert abs(got.mats - ref_mats) < 1e-6
    # a cap above every term's count changes nothing (each term in one bucket, padded)
    capped = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=10_000)
    np.testing.assert_allclose(capped.ats, got.ats, atol=1e-12, equal_nan=True)


def test_pairs_inside_one_passage_are_not_counted():
    # term 0 twice in passage 0 (delta 3) and once in passage 1 at position 0
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    r = average_term_similarity(v, [0, 0, 0], [0, 3, 0], [0, 0, 1], max_occurrences=None)
    assert r.pairs.tolist() == [1, 0, 0, 1]  # (0@0, 0@0') at delta 0 and (3, 0') at delta 3; not (0, 3) in passage 0
    assert r.ats[0] == pytest.approx(1 / math.sqrt(2))
    assert r.ats[3] == pytest.approx(1 / math.sqrt(2))


def test_input_order_and_rank_split_do_not_change_the_sampled_result():
    vectors, terms, positions, passages = hand_made_set(seed=1, passages=40)
    a = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=8, seed=3)
    perm = np.random.default_rng(0).permutation(len(terms))
    b = average_term_similarity(torch.tensor(vectors[perm]), terms[perm], positions[perm], passages[perm], max_occurrences=8, seed=3)
    np.testing.assert_array_equal(a.ats, b.ats)
    assert a.occurrences == 6 * 8  # six terms, each capped at 8
    # the metric class, fed in two "shards", equals the function on the union
    m = AverageTermSimilarity(max_occurrences=8, seed=3)
    half = len(terms) // 2
    for sl in (slice(0, half), slice(half, None)):
        m.update(torch.tensor(vectors[sl]), torch.tensor(terms[sl]), torch.tensor(positions[sl]), torch.tensor(passages[sl]))
    np.testing.assert_allclose(m.compute().ats, a.ats, atol=1e-6, equal_nan=True)  # float32 states


def test_the_cap_is_a_seeded_sample():
    vectors, terms, positions, passages = hand_made_set(seed=2, passages=60)
    one = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=5, seed=0)
    again = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=5, seed=0)
    other = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=5, seed=1)
    np.testing.assert_array_equal(one.ats, again.ats)
    assert not np.array_equal(np.nan_to_num(one.ats), np.nan_to_num(other.ats))


def sinusoids(positions: np.ndarray, dim: int) -> np.ndarray:
    """Vaswani et al.'s positional encodings (as TK adds them)."""
    i = np.arange(dim // 2)
    angle = positions[:, None] / (10000 ** (2 * i / dim))[None, :]
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)


def test_mats_of_bag_of_words_is_zero_and_positive_with_positions():
    """A bag-of-words encoder (term vector + the mean of its passage's term vectors) has no position: MATS ~ 0.
    Adding sinusoidal position embeddings makes same-term vectors at nearby positions more alike: MATS > 0."""
    rng = np.random.default_rng(7)
    dim, vocab = 64, 50
    emb = rng.normal(size=(vocab, dim))
    vecs, terms, positions, passages = [], [], [], []
    for p in range(300):
        n = 40
        t = rng.zipf(1.3, n) % vocab
        context = emb[t].mean(0)
        vecs.append(emb[t] + context)
        terms += t.tolist()
        positions += list(range(n))
        passages += [p] * n
    bow = np.concatenate(vecs)
    terms, positions, passages = np.array(terms), np.array(positions), np.array(passages)
    scale = np.linalg.norm(emb, axis=1).mean() / math.sqrt(dim / 2)  # sinusoids as long as the term vectors
    with_pos = bow + scale * sinusoids(positions, dim)
    free = average_term_similarity(torch.tensor(bow), terms, positions, passages, max_occurrences=200, seed=0)
    biased = average_term_similarity(torch.tensor(with_pos), terms, positions, passages, max_occurrences=200, seed=0)
    assert abs(free.mats) < 0.01
    assert biased.mats > 0.1
    assert biased.ats[0] > biased.ats[1] > biased.ats[10]  # similarity falls with the positional delta


def test_mats_from_curve_and_bad_input():
    assert mats_from_curve(np.array([1.0, 0.5, np.nan, 0.0])) == pytest.approx((0.75, 0.25))
    assert math.isnan(mats_from_curve(np.array([np.nan, 0.5]))[0])
    with pytest.raises(ValueError, match="max_occurrences"):
        average_term_similarity(torch.zeros(2, 2), [0, 0], [0, 1], [0, 1], max_occurrences=1)
    with pytest.raises(ValueError, match=r"vectors \[N, d\]"):
        average_term_similarity(torch.zeros(3, 2), [0, 0], [0, 1], [0, 1])
