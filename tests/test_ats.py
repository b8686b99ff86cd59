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


# ------------------------------------------------------------------------------ term vectors from every ranker

PASSAGES = [
    "dense retrieval encodes passages into vectors and compares the vectors",
    "the vectors of a passage",
    "retrieval",
]


def _ranker(name: str, tiny_bert: str):
    from lightning_modules.rankers import RANKERS, build_ranker

    schema = RANKERS.get(name, "model.name").schema
    extra = {"heads": 2, "head_dim": 8, "ff_dim": 24} if name == "tk" else {}
    torch.manual_seed(0)
    return build_ranker(schema(backbone=tiny_bert, query_max_len=12, doc_max_len=20, **extra)).eval()


def _pair_tokenizer(ranker):
    from lightning_modules.rankers.tokenization import PairTokenizer

    return PairTokenizer(ranker.tokenizer, ranker.kind, ranker.cfg.query_max_len, ranker.cfg.doc_max_len)


@pytest.mark.parametrize("name", ["tk", "colbert", "repbert", "bert_dot"])
def test_bi_encoder_passage_terms_are_its_token_representations(name, tiny_bert):
    """Each passage alone (no padding): the vectors at its non-special tokens, positions 0..n-1, and its ids."""
    from lightning_modules.rankers.terms import passage_terms

    ranker = _ranker(name, tiny_bert)
    got = passage_terms(ranker, _pair_tokenizer(ranker), PASSAGES, batch_size=2, first_passage=10)
    special = set(ranker.tokenizer.all_special_ids)
    start = 0
    for p, text in enumerate(PASSAGES):
        ids = ranker.tokenizer(text, truncation=True, max_length=20)["input_ids"]
        keep = [i for i, t in enumerate(ids) if t not in special]
        with torch.no_grad():
            enc = ranker.token_representations(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), side="doc")
        n = len(keep)
        sl = slice(start, start + n)
        assert got.terms[sl].tolist() == [ids[i] for i in keep]
        assert got.positions[sl].tolist() == list(range(n))
        assert got.passages[sl].tolist() == [10 + p] * n
        torch.testing.assert_close(got.vectors[sl], enc.tokens[0, keep].float(), atol=1e-5, rtol=1e-5)
        start += n
    assert start == len(got.terms)


def test_bert_cat_passage_terms_are_the_passage_side_of_the_pair(tiny_bert):
    from lightning_modules.rankers.terms import passage_terms

    ranker = _ranker("bert_cat", tiny_bert)
    tok = _pair_tokenizer(ranker)
    queries = ["what are vectors", "retrieval"]
    got = passage_terms(ranker, tok, PASSAGES, queries=queries, batch_size=2)
    special = set(ranker.tokenizer.all_special_ids)
    start = 0
    for p, text in enumerate(PASSAGES):
        pair = tok.pairs([queries[p % 2]], [text])
        ids, types = pair["input_ids"][0].tolist(), pair["token_type_ids"][0].tolist()
        keep = [i for i, (t, s) in enumerate(zip(ids, types)) if s == 1 and t not in special]
        doc_ids = [t for t in ranker.tokenizer(text)["input_ids"] if t not in special]
        with torch.no_grad():
            hidden = ranker.encoder(**pair).last_hidden_state[0]
        n = len(keep)
        assert got.terms[start : start + n].tolist() == doc_ids  # the passage's own terms, none of the query's
        assert got.positions[start : start + n].tolist() == list(range(n))
        torch.testing.assert_close(got.vectors[start : start + n], hidden[keep], atol=1e-5, rtol=1e-5)
        start += n
    assert start == len(got.terms)
    with pytest.raises(ValueError, match="queries"):
        passage_terms(ranker, tok, PASSAGES)
