"""White-box ColBERT statistics (analyses/whitebox/) on hand-checked examples and against independent references:
tau_AP and its tie-aware variants (known rankings, a literal walk down the ranking, the expectation over tie orders,
published values of Urbano's implementation), Delta_ES (Eq. 2) on a constructed similarity matrix, the spectral
ratio of rank-1 vs isotropic embeddings, IDF and word segmentation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from analyses.whitebox.idf import bm25_idf, collection_idf
from analyses.whitebox.maxsim import max_sim
from analyses.whitebox.words import Word, query_words
from metrics.delta_es import DeltaES, pair_difference
from metrics.spectral import sample_rows, spectral_ratio
from metrics.tau_ap import (
    break_ties,
    correlation,
    correlations,
    tau_ap,
    tau_ap_a,
    tau_ap_b,
)


# ---- tau_AP ---------------------------------------------------------------------------------------------------
def walk_tau_ap(x, y) -> float:
    """Yilmaz et al.'s definition read literally: sort by y, for each rank i >= 2 count the items above it that x
    also puts above it."""
    order = sorted(range(len(y)), key=lambda k: -y[k])
    total = 0.0
    for i in range(1, len(order)):
        item = order[i]
        total += sum(1 for j in order[:i] if x[j] > x[item]) / i
    return 2.0 * total / (len(order) - 1) - 1.0


def walk_tau_ap_b_directed(x, y) -> float:
    """Urbano & Marrero's tau_AP,b in one direction, a loop over items: items strictly above in y, concordant when
    also strictly above in x; items at the top of y (nothing above) are not counted."""
    terms = []
    for i in range(len(y)):
        above = [j for j in range(len(y)) if y[j] > y[i]]
        if above:
            terms.append(sum(1 for j in above if x[j] > x[i]) / len(above))
    return 2.0 * sum(terms) / len(terms) - 1.0


def expected_over_tie_orders(x, y) -> float:
    """Mean of tau_AP over every way of ordering y's tied items (tau_AP,a's definition, brute force)."""
    groups = {}
    for k, v in enumerate(y):
        groups.setdefault(v, []).append(k)
    keys = sorted(groups, reverse=True)
    vals = []
    for perms in itertools.product(*(itertools.permutations(groups[k]) for k in keys)):
        order = [k for p in perms for k in p]
        broken = np.empty(len(y))
        broken[order] = -np.arange(len(y), dtype=float)
        vals.append(walk_tau_ap(x, broken))
    return float(np.mean(vals))


@pytest.mark.parametrize("fn", [tau_ap, tau_ap_a, tau_ap_b])
def test_identical_and_reversed_rankings(fn):
    x = np.array([5.0, 3.0, 9.0, 1.0, 7.0])
    assert fn(x, x) == pytest.approx(1.0)
    assert fn(x, -x) == pytest.approx(-1.0)
    assert fn(x, 2 * x + 1) == pytest.approx(1.0)  # scores, not values: any increasing map is the same ranking


def test_hand_computed_top_weighting():
    """Reference A > B > C > D. Swapping the top two costs more than swapping the bottom two (Kendall's tau: 2/3
    for both). Top swap, y = B A C D: C(2) = 0 of 1, C(3) = 2 of 2, C(4) = 3 of 3 -> 2/3 (0 + 1 + 1) - 1 = 1/3.
    Bottom swap, y = A B D C: 1/1, 2/2, 2/3 -> 2/3 (8/3) - 1 = 7/9."""
    x = [4.0, 3.0, 2.0, 1.0]
    assert tau_ap(x, [3.0, 4.0, 2.0, 1.0]) == pytest.approx(1 / 3)
    assert tau_ap(x, [4.0, 3.0, 1.0, 2.0]) == pytest.approx(7 / 9)
    # not symmetric: with the roles swapped the walk follows the reference
    assert tau_ap([3.0, 4.0, 2.0, 1.0], x) == pytest.approx(1 / 3)
    assert tau_ap_b(x, [4.0, 3.0, 1.0, 2.0]) == pytest.approx(7 / 9)  # symmetric mean of two equal directions


def test_hand_computed_ties():
    """x: A > B > C; y ties A and B at the top. Orders of the tie: A B C (tau_AP 1) and B A C (rank 2: 0 of 1,
    rank 3: 2 of 2 -> 0): tau_AP,a = 1/2. tau_AP,b: x -> y counts only C (2 of 2 above: 1); y -> x counts B (A is
    tied with it in y: 0 of 1) and C (2 of 2): (0 + 1) / 2 -> 0; mean 1/2."""
    x, y = [3.0, 2.0, 1.0], [1.0, 1.0, 0.0]
    assert tau_ap_a(x, y) == pytest.approx(0.5)
    assert tau_ap_b(x, y) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="without ties"):
        tau_ap(x, y)
    with pytest.raises(ValueError, match="reference"):
        tau_ap_a(y, x)


def test_all_tied():
    x = [3.0, 2.0, 1.0, 0.0]
    assert tau_ap_a(x, [1.0] * 4) == pytest.approx(0.0)  # the mean over all orders of a random ranking
    assert math.isnan(tau_ap_b(x, [1.0] * 4))  # no item has anything above it in y: undefined


# Urbano's R package ircor (the reference implementation, github.com/julian-urbano/ircor), its test data and the
# values its tests expect (4 decimals): tauAP(x, y), tauAP_a(x, y.ties), tauAP_b(x.ties, y.ties).
URBANO = [
    (
        [0.897, 0.372, 0.908, 0.898, 0.661, 0.062, 0.177, 0.384, 0.498, 0.992],
        [0.82, 0.406, 0.817, 0.953, 0.673, 0.073, 0.364, 0.547, 0.589, 0.988],
        [0.9, 0.4, 0.9, 0.9, 0.7, 0.1, 0.2, 0.4, 0.5, 1],
        [0.8, 0.4, 0.8, 1, 0.7, 0.1, 0.4, 0.5, 0.6, 1],
        (0.8519, 0.8333, 0.7454, 0.7321),
    ),
    (
        [0.266, 0.573, 0.202, 0.945, 0.629, 0.206, 0.687, 0.77, 0.718, 0.38],
        [0.263, 0.843, 0.728, 0.928, 0.08, 0.114, 0.467, 0.641, 0.973, 0.644],
        [0.3, 0.6, 0.2, 0.9, 0.6, 0.2, 0.7, 0.8, 0.7, 0.4],
        [0.3, 0.8, 0.7, 0.9, 0.1, 0.1, 0.5, 0.6, 1, 0.6],
        (0.2504, 0.2880, 0.2692, 0.2970),
    ),
    (
        [0.185, 0.573, 0.944, 0.129, 0.468, 0.553, 0.761, 0.405, 0.976, 0.445],
        [0.845, 0.272, 0.275, 0.924, 0.605, 0.334, 0.162, 0.872, 0.018, 0.25],
        [0.2, 0.6, 0.9, 0.1, 0.5, 0.6, 0.8, 0.4, 1, 0.4],
        [0.8, 0.3, 0.3, 0.9, 0.6, 0.3, 0.2, 0.9, 0, 0.2],
        (-0.6971, -0.6680, -0.5558, -0.7047),
    ),
]


@pytest.mark.parametrize("x,y,xt,yt,expected", URBANO)
def test_published_values_of_the_reference_implementation(x, y, xt, yt, expected):
    plain, symmetric, a_ties, b_ties = expected
    assert tau_ap(x, y) == pytest.approx(plain, abs=5e-5)
    assert tau_ap_a(x, y) == pytest.approx(plain, abs=5e-5)
    assert tau_ap_b(x, y) == pytest.approx(symmetric, abs=5e-5)
    assert tau_ap_a(x, yt) == pytest.approx(a_ties, abs=5e-5)
    assert tau_ap_b(xt, yt) == pytest.approx(b_ties, abs=5e-5)
    assert tau_ap_b(yt, xt) == pytest.approx(b_ties, abs=5e-5)


def test_against_direct_formulas_on_random_rankings():
    rng = np.random.default_rng(0)
    for _trial in range(60):
        n = int(rng.integers(2, 40))
        x, y = rng.normal(size=n), rng.normal(size=n)
        assert tau_ap(x, y) == pytest.approx(walk_tau_ap(x, y), abs=1e-12)
        assert tau_ap_b(x, y) == pytest.approx(0.5 * (walk_tau_ap(x, y) + walk_tau_ap(y, x)), abs=1e-12)
        # ties in both (coarse grades), b against the loop
        xt, yt = rng.integers(0, 4, size=n).astype(float), rng.integers(0, 4, size=n).astype(float)
        expected = (
            0.5 * (walk_tau_ap_b_directed(xt, yt) + walk_tau_ap_b_directed(yt, xt))
            if len(set(xt)) > 1 and len(set(yt)) > 1
            else float("nan")
        )
        got = tau_ap_b(xt, yt)
        assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)


def test_tau_ap_a_is_the_expectation_over_tie_orders():
    rng = np.random.default_rng(1)
    for _trial in range(25):
        n = int(rng.integers(2, 8))
        x = rng.permutation(n).astype(float)
        y = rng.integers(0, 3, size=n).astype(float)
        assert tau_ap_a(x, y) == pytest.approx(expected_over_tie_orders(x, y), abs=1e-12)


def position_broken(x) -> list[float]:
    """x's ranking as distinct scores, ties broken by position (the earlier item above): what tau_AP,a's reference
    gets in the analysis (the candidate order), written here without break_ties."""
    order = sorted(range(len(x)), key=lambda k: (-x[k], k))
    out = [0.0] * len(x)
    for r, k in enumerate(order):
        out[k] = float(-r)
    return out


def brute_tau_ap_a(x, y) -> float:
    """tau_AP,a by its definition: the mean of Yilmaz's tau_AP (the literal walk) over every order of y's ties,
    against x with its ties broken by position."""
    return expected_over_tie_orders(position_broken(x), y)


def brute_tau_ap_b(x, y) -> float:
    """tau_AP,b by its definition: the mean of the two directed loops (NaN when either ranking is one tie)."""
    if len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")
    return 0.5 * (walk_tau_ap_b_directed(x, y) + walk_tau_ap_b_directed(y, x))


def test_variants_differ_without_ties_by_hand():
    """x: A > B > C > D, y: B > C > A > D. Walking y: C has B above (x agrees: 1/1), A has B, C above (0/2), D 3/3:
    tau_AP(x, y) = 2/3 (1 + 0 + 1) - 1 = 1/3 = tau_AP,a. Walking x: B has A above (y disagrees: 0/1), C has A, B
    (y agrees on B: 1/2), D 3/3: tau_AP(y, x) = 2/3 (0 + 1/2 + 1) - 1 = 0; tau_AP,b = (1/3 + 0) / 2 = 1/6."""
    x, y = [4.0, 3.0, 2.0, 1.0], [2.0, 4.0, 3.0, 1.0]
    assert correlations(x, y) == {"a": pytest.approx(1 / 3), "b": pytest.approx(1 / 6)}
    assert tau_ap(x, y) == pytest.approx(1 / 3) and tau_ap(y, x) == pytest.approx(0.0)


@pytest.mark.parametrize("ties", ["none", "in y", "in x", "in both"])
def test_both_variants_against_brute_force_definitions(ties):
    """`correlations` (and `correlation` per variant) against the references above on small random lists, float64;
    without ties also against Yilmaz's walk directly."""
    rng = np.random.default_rng(["none", "in y", "in x", "in both"].index(ties))
    for _trial in range(40):
        n = int(rng.integers(2, 8))
        x = rng.integers(0, 3, size=n).astype(float) if ties in ("in x", "in both") else rng.normal(size=n)
        y = rng.integers(0, 3, size=n).astype(float) if ties in ("in y", "in both") else rng.normal(size=n)
        x, y = x.tolist(), y.tolist()
        a, b = brute_tau_ap_a(x, y), brute_tau_ap_b(x, y)
        got = correlations(x, y)
        assert list(got) == ["a", "b"]
        assert got["a"] == pytest.approx(a, abs=1e-12) and correlation(x, y, "a") == pytest.approx(a, abs=1e-12)
        if math.isnan(b):
            assert math.isnan(got["b"]) and math.isnan(correlation(x, y, "b"))
        else:
            assert got["b"] == pytest.approx(b, abs=1e-12) and correlation(x, y, "b") == pytest.approx(b, abs=1e-12)
        if ties == "none":
            assert got["a"] == pytest.approx(walk_tau_ap(x, y), abs=1e-12)
            assert got["b"] == pytest.approx(0.5 * (walk_tau_ap(x, y) + walk_tau_ap(y, x)), abs=1e-12)
    assert all(math.isnan(v) for v in correlations([1.0], [2.0]).values())


def test_variant_a_breaks_reference_ties_by_position():
    x = [2.0, 1.0, 1.0, 0.0]  # a duplicate passage: items 1 and 2 tie in the reference
    assert break_ties(x).tolist() == [0.0, -1.0, -2.0, -3.0]
    y = [3.0, 1.0, 2.0, 0.0]
    assert correlation(x, y, "a") == pytest.approx(tau_ap([3.0, 2.0, 1.0, 0.0], y))
    assert correlation(x, y, "b") == pytest.approx(tau_ap_b(x, y))
    with pytest.raises(ValueError):
        correlation(x, y, "c")


# ---- Eq. 1 pieces and Delta_ES (Eq. 2) ------------------------------------------------------------------------
CAT, DOG, CLS, SEP = 5, 9, 101, 102


def unit(cos: float, axis: int, other: int = 3, dim: int = 5) -> torch.Tensor:
    """A unit vector with cosine `cos` to basis vector e_axis (the rest on e_other)."""
    v = torch.zeros(dim, dtype=torch.float64)
    v[axis], v[other] = cos, math.sqrt(max(0.0, 1 - cos * cos))
    return v


def constructed_candidates():
    """Query [CLS] cat [SEP] = e0, e1, e2. Five passages; the 'cat' row's cosines by construction:
    A: cat 0.8, dog 0.5 -> C* 0.8 exact       B: cat 0.4, dog 0.7 -> 0.7 soft
    C: no cat, dog 0.6 -> 0.6 soft            D: cat 0.9, dog 0.1 -> 0.9 exact
    E: cat and dog the same vector (0.5) -> 0.5, exact (a tie with the same token counts as exact)
    Each passage is [CLS] x y [SEP] with [CLS] = e0 and [SEP] = e2, so the [CLS] and [SEP] rows are 1."""
    q = torch.stack([unit(1, 0), unit(1, 1), unit(1, 2)])
    e = torch.zeros(5, dtype=torch.float64)
    rows = {
        "A": [(CAT, unit(0.8, 1)), (DOG, unit(0.5, 1, 4))],
        "B": [(CAT, unit(0.4, 1)), (DOG, unit(0.7, 1, 4))],
        "C": [(DOG, unit(0.6, 1, 4))],
        "D": [(CAT, unit(0.9, 1)), (DOG, unit(0.1, 1, 4))],
        "E": [(CAT, unit(0.5, 1)), (DOG, unit(0.5, 1))],
    }
    vecs = torch.zeros(5, 4, 5, dtype=torch.float64)
    ids = torch.zeros(5, 4, dtype=torch.long)
    mask = torch.zeros(5, 4, dtype=torch.bool)
    for n, toks in enumerate(rows.values()):
        seq = [(CLS, unit(1, 0))] + toks + [(SEP, unit(1, 2))]
        for j, (tid, v) in enumerate(seq):
            vecs[n, j], ids[n, j], mask[n, j] = v, tid, True
    vecs[2, 3] = e  # C is one token shorter: padding (a zero vector) must not be a match
    return q, torch.tensor([CLS, CAT, SEP]), vecs, mask, ids


def test_max_sim_on_a_constructed_similarity_matrix():
    q, qi, dv, dm, di = constructed_candidates()
    ms = max_sim(q, qi, dv, dm, di)
    assert ms.c_star[1].tolist() == pytest.approx([0.8, 0.7, 0.6, 0.9, 0.5])
    assert ms.exact[1].tolist() == [True, False, False, True, True]
    assert ms.c_star[0].tolist() == pytest.approx([1.0] * 5) and ms.exact[0].all()  # [CLS] matches [CLS]
    assert ms.score.tolist() == pytest.approx([2.8, 2.7, 2.6, 2.9, 2.5])
    assert ms.without([1]).tolist() == pytest.approx([2.0] * 5)


def test_max_sim_against_a_loop_on_random_vectors():
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(6, 7, 8, generator=g), dim=-1)
    qi = torch.tensor([1, 2, 3, 2])
    di = torch.randint(1, 5, (6, 7), generator=g)
    dm = torch.arange(7)[None, :] < torch.tensor([7, 3, 5, 1, 6, 2])[:, None]
    ms = max_sim(q, qi, d, dm, di)
    for i in range(4):
        for n in range(6):
            sims = [(float(q[i] @ d[n, j]), int(di[n, j])) for j in range(7) if dm[n, j]]
            best = max(s for s, _ in sims)
            assert float(ms.c_star[i, n]) == pytest.approx(best, abs=1e-6)
            assert bool(ms.exact[i, n]) == any(s == pytest.approx(best, abs=0) and t == int(qi[i]) for s, t in sims)


def test_delta_es_by_hand():
    """'cat' on the constructed candidates: exact in A, D, E (0.8, 0.9, 0.5), soft in B, C (0.7, 0.6):
    Delta = 0.7333... - 0.65 = 0.08333..."""
    q, qi, dv, dm, di = constructed_candidates()
    ms = max_sim(q, qi, dv, dm, di)
    assert pair_difference(ms.c_star[1], ms.exact[1]) == pytest.approx((0.8 + 0.9 + 0.5) / 3 - (0.7 + 0.6) / 2)
    assert math.isnan(pair_difference(ms.c_star[0], ms.exact[0]))  # [CLS] matches itself everywhere: no soft set
    assert pair_difference([0.9, 0.8, 0.5, 0.3], [True, True, False, False]) == pytest.approx(0.45)


def test_delta_es_aggregation_over_queries_and_subwords():
    acc = DeltaES()
    acc.add(CAT, 0.45)  # cat in query 1
    acc.add(CAT, 0.25)  # cat in query 2
    acc.add(CAT, float("nan"))  # cat in query 3: all candidates matched it exactly: not part of the mean
    acc.add(DOG, 0.1)
    assert acc.value(CAT) == pytest.approx(0.35) and acc.count(CAT) == 2 and acc.undefined[CAT] == 1
    assert acc.word([CAT, DOG]) == pytest.approx(0.45)
    assert acc.word([CAT, CAT]) == pytest.approx(0.70)  # a subword twice in a word counts twice, as Eq. 1 sums it
    assert math.isnan(acc.word([CAT, 77]))  # a subword without a value: no partial sum
    assert math.isnan(acc.value(77))


# ---- spectral ratio -------------------------------------------------------------------------------------------
def test_spectral_ratio_rank_one_and_isotropic():
    rng = np.random.default_rng(0)
    u = rng.normal(size=16)
    assert spectral_ratio(rng.normal(size=(50, 1)) * u[None, :]) == pytest.approx(1.0)  # rank 1, any signs
    iso = rng.normal(size=(40000, 16))
    assert spectral_ratio(iso) == pytest.approx(1 / 16, rel=0.03)
    assert spectral_ratio(np.diag([3.0, 1.0])) == pytest.approx(0.75)
    # few vectors: rank <= n, so the ratio is at least 1/n even for isotropic directions
    assert spectral_ratio(rng.normal(size=(5, 384))) >= 1 / 5


def test_spectral_ratio_matches_svd():
    rng = np.random.default_rng(1)
    for shape in [(7, 30), (30, 7), (12, 12), (1, 5)]:
        m = rng.normal(size=shape) + 0.5
        s = np.linalg.svd(m, compute_uv=False)
        assert spectral_ratio(m) == pytest.approx(s[0] / s.sum(), rel=1e-9)
    assert math.isnan(spectral_ratio(np.zeros((3, 4)))) and math.isnan(spectral_ratio(np.zeros((0, 4))))


def test_occurrence_sample_is_seeded_nested_and_per_subword():
    a = sample_rows(100, 30, seed=3, token_id=7)
    assert len(a) == 30 and len(set(a.tolist())) == 30 and a.max() < 100
    assert sample_rows(100, 30, 3, 7).tolist() == a.tolist()
    assert sample_rows(100, 10, 3, 7).tolist() == a[:10].tolist()  # the equal-size sample is a prefix
    assert sample_rows(100, 30, 4, 7).tolist() != a.tolist()
    assert sorted(sample_rows(5, 30, 3, 7).tolist()) == [0, 1, 2, 3, 4]


# ---- IDF and words --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from models.rankers.backbone import resolve

    return AutoTokenizer.from_pretrained(resolve("minilm"))


def test_idf_by_hand(tokenizer):
    docs = ["The cat sat.", "the Dog and the cat", "Hypertrophy of the heart"]
    idf = collection_idf(tokenizer, docs, batch_size=2)
    assert idf.n_docs == 3
    assert idf.word_df["the"] == 3 and idf.word_df["cat"] == 2 and idf.word_df["hypertrophy"] == 1
    assert idf.word_df["."] == 1 and "dog" in idf.word_df
    assert idf.word("cat") == pytest.approx(math.log(1 + (3 - 2 + 0.5) / (2 + 0.5)))
    assert idf.word("unseen") == pytest.approx(math.log(1 + 3.5 / 0.5))
    assert bm25_idf(3, 3) == pytest.approx(math.log(1 + 0.5 / 3.5))
    pieces = tokenizer.convert_tokens_to_ids(["hyper", "##tro", "##phy"])
    assert all(idf.subword_df[t] == 1 for t in pieces)
    assert idf.subword_df[tokenizer.convert_tokens_to_ids("the")] == 3
    assert idf.subword(tokenizer.convert_tokens_to_ids("cat")) == pytest.approx(idf.word("cat"))


def test_query_words(tokenizer):
    from datamodules.tokenization import PairTokenizer

    texts = ["When did Family Feud come out?", "causes of left ventricular hypertrophy"]
    ids, words = query_words(tokenizer, texts, max_len=32)
    keys = [[w.key for w in ws] for ws in words]
    assert keys == [
        ["when", "did", "family", "feud", "come", "out", "?"],
        ["causes", "of", "left", "ventricular", "hypertrophy"],
    ]
    hyper = words[1][-1]
    assert [tokenizer.convert_ids_to_tokens(t) for t in hyper.subwords] == ["hyper", "##tro", "##phy"]
    assert hyper.positions == [len(ids[1]) - 4, len(ids[1]) - 3, len(ids[1]) - 2]  # before [SEP]
    assert words[0][-1].punctuation and not words[0][0].punctuation
    assert words[1][1].stopword and not words[1][0].stopword
    assert all(i[0] == tokenizer.cls_token_id and i[-1] == tokenizer.sep_token_id for i in ids)
    # the same ids as the ranker's PairTokenizer (which pads)
    q = PairTokenizer(tokenizer, "bi", 32, 180).queries(texts)
    for b, row in enumerate(ids):
        assert q["q_input_ids"][b, : len(row)].tolist() == row and int(q["q_attention_mask"][b].sum()) == len(row)
    # truncation that cuts a word leaves the word out (its remaining rows stay in the query)
    # ([CLS] causes of left vent ##ric [SEP]: 'ventricular' lost ##ular)
    ids_cut, words_cut = query_words(tokenizer, ["causes of left ventricular hypertrophy"], max_len=7)
    assert len(ids_cut[0]) == 7 and [w.key for w in words_cut[0]] == ["causes", "of", "left"]
    assert isinstance(words_cut[0][0], Word)


def test_within_query_correlation_by_hand():
    from analyses.whitebox.aggregate import correlate, within_query

    words = [{"word": w, "idf": i} for w, i in zip("abcd", (1.0, 2.0, 3.0, 4.0))]
    queries = [
        {"words": [{"word": "a", "tau_ap": 0.9}, {"word": "b", "tau_ap": 0.8}, {"word": "c", "tau_ap": 0.7}]},  # r = -1
        {"words": [{"word": "a", "tau_ap": 0.5}, {"word": "b", "tau_ap": 0.6}, {"word": "d", "tau_ap": 0.9}]},
        {
            "words": [{"word": "a", "tau_ap": 0.5}, {"word": "b", "tau_ap": None}, {"word": "c", "tau_ap": 0.1}]
        },  # 2 values
    ]
    second = np.corrcoef([1.0, 2.0, 4.0], [0.5, 0.6, 0.9])[0, 1]
    got = within_query(queries, words, "tau_ap")
    assert got["queries"] == 2 and got["mean_r"] == pytest.approx((-1 + second) / 2)
    assert correlate([1, 2, 3], [2, 4, 7])["pearson_r"] == pytest.approx(np.corrcoef([1, 2, 3], [2, 4, 7])[0, 1])
    assert correlate([1, 2], [2, 4])["pearson_r"] is None and correlate([1, 1, 1], [1, 2, 3])["pearson_r"] is None
    assert correlate([1, 2, 3, None], [1, 2, 4, 5])["n"] == 3
