"""DGRe (models/rankers/dgre/): each equation against an independent float64 NumPy reference written as
explicit loops (masking Eq. 7-10, GGNN Eq. 11, attention Eq. 12, decomposition Eq. 14-15, distances Eq. 18-21, MINE
Eq. 22-24), then the ranker on a tiny random BERT: what it reads from the backbone, padding, gradients, the
module's loss, and a short training run through train.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import yaml

from core.errors import InputError
from datamodules.tokenization import PairTokenizer
from models.rankers import build_ranker
from models.rankers.dgre import DGReConfig
from models.rankers.dgre.decomposition import Decomposition
from models.rankers.dgre.ggnn import GGNN, RefinementAttention
from models.rankers.dgre.losses import cosine_distance, distance_loss
from models.rankers.dgre.masking import (
    adaptive_scores,
    disentangled_graph,
    heuristic_mask,
    infinity_normalise,
    modified_softmax,
    segments,
)
from models.rankers.dgre.mi import MINE, MutualInformation, marginal_pairs
from tests.conftest import REPO, run_script

QUERIES = ["what is heat transfer", "slab", "boundary layer flow at high speed"]
DOCS = ["heat transfer in slabs of metal", "a study of boundary layers", "flow of air over wings at speed and more"]


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


# ------------------------------------------------------------------------------------------------ Eq. 7-10

# One sequence laid out as [CLS] q q [SEP] d d d [SEP] pad: query words 1-2, document words 4-6.
QUERY = torch.tensor([[0, 1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
DOC = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0, 0]], dtype=torch.bool)
REAL = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0]])


def ref_mask(query: np.ndarray, doc: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Eq. 7 by loops: 1 for (query word, document word) and (document word, query word), 1 on the diagonal of
    real tokens, 0 otherwise."""
    n = len(real)
    m = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if (query[i] and doc[j]) or (doc[i] and query[j]) or (i == j and real[i]):
                m[i, j] = 1
    return m


def test_segments_follow_the_sep_tokens_of_the_tokenised_pair(tiny_bert):
    ranker = build_ranker(DGReConfig(backbone=tiny_bert, query_max_len=8, doc_max_len=16))
    tok = PairTokenizer(ranker.tokenizer, "cross", 8, 16)
    batch = tok.pairs(QUERIES, DOCS)
    query, doc = segments(batch["input_ids"], batch["attention_mask"], ranker.tokenizer.sep_token_id)
    for i, (q, d) in enumerate(zip(QUERIES, DOCS)):
        q_ids = ranker.tokenizer(q, add_special_tokens=False)["input_ids"][:8]
        d_ids = ranker.tokenizer(d, add_special_tokens=False)["input_ids"]
        ids = batch["input_ids"][i]
        assert ids[query[i]].tolist() == q_ids
        assert ids[doc[i]].tolist() == d_ids[: len(ids[doc[i]])] and doc[i].sum() > 0
        # query words start right after [CLS]; the document right after the first [SEP]
        assert query[i].nonzero().min() == 1 and doc[i].nonzero().min() == len(q_ids) + 2


def test_heuristic_mask_is_eq7():
    got = heuristic_mask(QUERY, DOC, REAL)[0].numpy().astype(float)
    np.testing.assert_array_equal(got, ref_mask(QUERY[0].numpy(), DOC[0].numpy(), REAL[0].numpy()))
    # query-query and doc-doc entries off the diagonal are zero; [CLS]/[SEP] keep only their self-loop
    assert got[1, 2] == 0 and got[4, 5] == 0 and got[0].sum() == 1 and got[3].sum() == 1 and got[8].sum() == 0


def test_adaptive_mask_zeroes_negative_scores_and_masked_entries():
    torch.manual_seed(0)
    s = torch.randn(1, 9, 9, dtype=torch.float64)
    g = adaptive_scores(s, heuristic_mask(QUERY, DOC, REAL))[0].numpy()
    m = ref_mask(QUERY[0].numpy(), DOC[0].numpy(), REAL[0].numpy())
    sn = s[0].numpy()
    for i in range(9):
        for j in range(9):
            want = sn[i, j] if (m[i, j] == 1 and sn[i, j] > 0) else 0.0  # Eq. 8: ReLU on the entries of M
            assert g[i, j] == want
    assert (g == 0).sum() > (m == 0).sum()  # some kept entries were negative and are filtered too


@pytest.mark.parametrize("norm", ["entry", "row", "induced"])
def test_infinity_norm_readings(norm):
    g = np.abs(np.random.default_rng(1).normal(size=(2, 4, 4)))
    g[1] = 0.0  # a matrix of zeros stays zero
    got = infinity_normalise(torch.tensor(g), norm).numpy()
    want = np.zeros_like(g)
    for b in range(2):
        for i in range(4):
            scale = {"entry": g[b].max(), "row": g[b, i].max(), "induced": max(g[b, r].sum() for r in range(4))}[norm]
            want[b, i] = g[b, i] / scale if scale > 0 else 0.0
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_modified_softmax_eq9_sums_to_one_over_nonzero_entries():
    x = np.array([[0.0, 0.5, 0.0, 1.0, 1e-9], [0.0, 0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0, 0.0]])
    got = modified_softmax(torch.tensor(x)).numpy()
    for r in range(3):
        w = [math.expm1(v) if v != 0 else 0.0 for v in x[r]]
        total = sum(w)
        want = [v / total if total else 0.0 for v in w]
        np.testing.assert_allclose(got[r], want, rtol=1e-12, atol=0)
        assert np.all(got[r][x[r] == 0] == 0)
        if total:
            assert got[r][x[r] != 0].sum() == pytest.approx(1.0, abs=1e-12)
    assert got[0, 4] > 0  # a tiny positive relation is kept (expm1, not exp(x) - 1 which rounds it to 0)


def test_disentangled_graph_three_maskings_against_loops():
    torch.manual_seed(3)
    s = torch.randn(1, 9, 9, dtype=torch.float64) * 2
    sn, m = s[0].numpy(), ref_mask(QUERY[0].numpy(), DOC[0].numpy(), REAL[0].numpy())
    real = REAL[0].numpy().astype(bool)
    # adaptive (Eq. 8-10), entry-wise infinite norm
    g = np.where((m == 1) & (sn > 0), sn, 0.0)
    g = g / np.abs(g).max()
    want = np.zeros_like(g)
    for i in range(9):
        w = np.array([math.expm1(v) if v != 0 else 0.0 for v in g[i]])
        want[i] = w / w.sum() if w.sum() else 0.0
    got = disentangled_graph(s, QUERY, DOC, REAL, "adaptive", "entry")[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # heuristic: softmax over the entries of M only
    got = disentangled_graph(s, QUERY, DOC, REAL, "heuristic")[0].numpy()
    for i in range(9):
        keep = m[i] == 1
        row = np.zeros(9)
        if keep.any():
            e = np.exp(sn[i][keep] - sn[i][keep].max())
            row[keep] = e / e.sum()
        np.testing.assert_allclose(got[i], row, rtol=0, atol=1e-12)
    # none: softmax over every real token (rows of padding empty)
    got = disentangled_graph(s, QUERY, DOC, REAL, "none")[0].numpy()
    for i in range(9):
        row = np.zeros(9)
        if real[i]:
            e = np.exp(sn[i][real] - sn[i][real].max())
            row[real] = e / e.sum()
        np.testing.assert_allclose(got[i], row, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------ Eq. 11-15


def ref_gru(x: np.ndarray, h: np.ndarray, cell: torch.nn.GRUCell) -> np.ndarray:
    """A GRU update written out (PyTorch's gate layout r, z, n)."""
    w_ih, w_hh = np_(cell.weight_ih), np_(cell.weight_hh)
    b_ih, b_hh = np_(cell.bias_ih), np_(cell.bias_hh)
    d = h.shape[0]
    gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
    r = sig(gi[:d] + gh[:d])
    z = sig(gi[d : 2 * d] + gh[d : 2 * d])
    n = np.tanh(gi[2 * d :] + r * gh[2 * d :])
    return (1 - z) * n + z * h


@pytest.mark.parametrize("mode", ["concat", "message"])
def test_ggnn_step_equals_a_hand_written_gru_update(mode):
    torch.manual_seed(0)
    d, n = 3, 4
    ggnn = GGNN(d, steps=2, input=mode).double()
    h0 = torch.randn(1, n, d, dtype=torch.float64)
    # a tiny graph: node 0 <-> 2 (0.7 / 0.3 with a self-loop), node 1 isolated (no neighbours), node 3 -> 0, 1
    a = torch.tensor([[[0.7, 0, 0.3, 0], [0, 0, 0, 0], [0.5, 0, 0.5, 0], [0.25, 0.75, 0, 0]]], dtype=torch.float64)
    h, an = np_(h0[0]), np_(a[0])
    for _ in range(2):
        new = []
        for i in range(n):
            message = sum(an[i, j] * h[j] for j in range(n))
            x = np.concatenate([h[i], message]) if mode == "concat" else message
            new.append(ref_gru(x, h[i], ggnn.gru))
        h = np.stack(new)
        if _ == 0:
            np.testing.assert_allclose(np_(ggnn.step(h0, a)[0]), h, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np_(ggnn(h0, a)[0]), h, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scale", [None, False, True], ids=["default", "printed", "scaled"])
def test_refinement_attention_eq12(scale):
    """Eq. 12 as printed by default (no 1/sqrt(d)); scale=True divides the logits by sqrt(d)."""
    torch.manual_seed(1)
    att = (RefinementAttention(4) if scale is None else RefinementAttention(4, scale=scale)).double()
    h = torch.randn(1, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    got = np_(att(h, mask)[0])
    wa, wb, hn = np_(att.w_a.weight), np_(att.w_b.weight), np_(h[0])
    div = 2.0 if scale else 1.0  # sqrt(4) = 2
    for i in range(4):
        logits = np.array([(wa @ hn[i]) @ (wb @ hn[j]) / div for j in range(4)])  # padding excluded
        p = np.exp(logits - logits.max())
        p /= p.sum()
        np.testing.assert_allclose(got[i], sum(p[j] * hn[j] for j in range(4)), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "norm,scale",
    [(None, None), ("sum", False), ("mean", False), ("sum", True), ("mean", True)],
    ids=["default", "printed", "mean", "scaled", "mean-scaled"],
)
def test_decomposition_eq14_15(norm, scale):
    """Eq. 14-15 as printed by default: Z_dr = sigmoid((W_1 Z_q)(W_2 Z_d)^T) Z_d, a sum over the document words with
    raw dot products; norm=mean divides by the n document words, scale=True the logits by sqrt(d)."""
    torch.manual_seed(2)
    dec = (Decomposition(4) if norm is None else Decomposition(4, norm=norm, scale=scale)).double()
    z = torch.randn(1, 9, 4, dtype=torch.float64)
    out = dec(z, QUERY, DOC)
    w1, w2, zn = np_(dec.w_1.weight), np_(dec.w_2.weight), np_(z[0])
    qi, di = np.flatnonzero(QUERY[0].numpy()), np.flatnonzero(DOC[0].numpy())
    for i in qi:
        p = np.array([sig((w1 @ zn[i]) @ (w2 @ zn[j]) / (2.0 if scale else 1.0)) for j in di])  # sqrt(4) = 2
        div = len(di) if norm == "mean" else 1
        np.testing.assert_allclose(
            np_(out.related[0, i]), sum(p[k] * zn[j] for k, j in enumerate(di)) / div, atol=1e-12
        )
        np.testing.assert_allclose(
            np_(out.unrelated[0, i]), sum((1 - p[k]) * zn[j] for k, j in enumerate(di)) / div, atol=1e-12
        )
        np.testing.assert_allclose(np_(out.query[0, i]), zn[i], atol=0)
    others = [i for i in range(9) if i not in qi]
    assert not out.related[0, others].any() and not out.unrelated[0, others].any()


# ------------------------------------------------------------------------------------------------ Eq. 18-24


def test_cosine_distance_eq18():
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    b = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    # cos = 0 and 1/sqrt(2): same label 1 - cos, different labels 1 + cos
    np.testing.assert_allclose(cosine_distance(a, b, torch.tensor([True, True])).numpy(), [1.0, 1 - 2**-0.5], atol=1e-7)
    np.testing.assert_allclose(cosine_distance(a, b, False).numpy(), [1.0, 1 + 2**-0.5], atol=1e-7)


def test_triangle_distance_on_a_small_example():
    """One triplet, 2-d vectors with known cosines: query words (1, 0); relevant document words (1, 1) (cos 1/sqrt 2);
    the pair with the non-relevant document has query words (0, 1) and document words (0, -3) (cos -1);
    [CLS] of the two pairs (1, 0) and (-1, 0) (cos -1); pooled Z_dr (3, 4) and (4, 3) (cos 24/25)."""
    qp, dp = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    qn, dn = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, -3.0]])
    cls_p, cls_n = torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, 0.0]])
    rel_p, rel_n = torch.tensor([[3.0, 4.0]]), torch.tensor([[4.0, 3.0]])
    point = 0.5 * ((1 - 2**-0.5) + (1 + -1.0))  # l = 1 for d+, l = 0 for d-
    pair = (1 + -1.0) + (1 + 24 / 25)  # both layers, different labels
    args = ((qp, dp, qn, dn), [cls_p, rel_p], [cls_n, rel_n])
    assert distance_loss("point", *args).item() == pytest.approx(point, abs=1e-6)
    assert distance_loss("pair", *args).item() == pytest.approx(pair, abs=1e-6)
    assert distance_loss("triangle", *args).item() == pytest.approx(point + pair, abs=1e-6)
    assert distance_loss("none", *args) is None


def test_mine_donsker_varadhan_estimate():
    torch.manual_seed(4)
    mine = MINE(3, 2, hidden=5).double()
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 2, 4])
    layers = [m for m in mine.net if isinstance(m, torch.nn.Linear)]

    def t(xv, yv):
        v = np.concatenate([xv, yv])
        for k, lin in enumerate(layers):
            v = np_(lin.weight) @ v + (np_(lin.bias) if lin.bias is not None else 0.0)
            if k < len(layers) - 1:
                v = np.maximum(v, 0)
        return float(v[0])

    xn, yn = np_(x), np_(y)
    joint = np.mean([t(xn[i], yn[i]) for i in range(6)])
    marginal = np.log(np.mean([np.exp(t(xn[i], yn[perm[i]])) for i in range(6)]))
    assert mine(x, y, perm).item() == pytest.approx(joint - marginal, abs=1e-5)  # float32 logsumexp


def test_mi_surrogate_gives_the_encoder_the_gradient_of_l_mi():
    """Through the gradient reversal, the inputs receive d(L_ru + L_qu - L_qr)/d input (the encoder minimises L_mi)
    while every statistics network receives d(-I_phi)/d phi (each tightens its own bound)."""
    torch.manual_seed(5)
    mi = MutualInformation(3, hidden=4).double()
    q, r, u = (torch.randn(5, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    perm = torch.tensor([2, 0, 4, 1, 3])
    surrogate, est = mi(q, r, u, perm)
    surrogate.backward()
    got_inputs = [t.grad.clone() for t in (q, r, u)]
    got_params = {n: p.grad.clone() for n, p in mi.named_parameters()}
    for t in (q, r, u):
        t.grad = None
    mi.zero_grad()
    ru = mi.related_unrelated(r, u, perm)
    qu = mi.query_unrelated(q, u, perm)
    qr = mi.query_related(q, r, perm)
    assert est["mi"].item() == pytest.approx((ru + qu - qr).item(), abs=1e-12)
    (ru + qu - qr).backward(retain_graph=True)
    for g, t in zip(got_inputs, (q, r, u)):
        torch.testing.assert_close(g, t.grad, atol=1e-12, rtol=0)
    mi.zero_grad()
    (-(ru + qu + qr)).backward(inputs=list(mi.parameters()))
    for n, p in mi.named_parameters():
        torch.testing.assert_close(got_params[n], p.grad, atol=1e-12, rtol=0)


def test_marginal_pairs_permute_the_valid_rows_uniformly():
    """The fixed-size pairing (no host sync): valid rows first in order, their partners a permutation of them, every
    permutation about equally often (6 orders of 3 rows over 3,000 draws, each within 5 sigma of 500)."""
    torch.manual_seed(11)
    valid = torch.tensor([False, True, False, True, True, False])
    counts = {}
    for _ in range(3000):
        rows, partners, kept = marginal_pairs(valid)
        assert rows[:3].tolist() == [1, 3, 4] and kept.tolist() == [True] * 3 + [False] * 3
        key = tuple(partners[:3].tolist())
        counts[key] = counts.get(key, 0) + 1
    assert sorted(counts) == sorted(itertools.permutations([1, 3, 4]))
    sigma = (3000 * (1 / 6) * (5 / 6)) ** 0.5
    assert all(abs(c - 500) < 5 * sigma for c in counts.values()), counts


def test_mi_of_valid_rows_equals_mi_of_those_rows_alone():
    """Rows weighed by `valid` give the estimates and gradients of the valid rows taken out (the old boolean-mask
    path), paired as marginal_pairs drew them."""
    torch.manual_seed(6)
    mi = MutualInformation(3, hidden=4).double()
    valid = torch.tensor([True, False, True, True, False, True, False])
    q, r, u = (torch.randn(7, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    torch.manual_seed(9)
    surrogate, est = mi(q, r, u, valid=valid)
    surrogate.backward()
    got = [t.grad.clone() for t in (q, r, u)]
    torch.manual_seed(9)
    rows, partners, _ = marginal_pairs(valid)
    idx = valid.nonzero().squeeze(1)
    perm = torch.tensor([idx.tolist().index(p) for p in partners[:4].tolist()])  # partners as compact positions
    for t in (q, r, u):
        t.grad = None
    ref_surrogate, ref = mi(q[idx], r[idx], u[idx], perm)
    ref_surrogate.backward()
    for k in ("mi", "mi_ru", "mi_qu", "mi_qr"):
        assert est[k].item() == pytest.approx(ref[k].item(), abs=1e-6)
    for g, t in zip(got, (q, r, u)):
        torch.testing.assert_close(g, t.grad, atol=1e-6, rtol=0)
        assert not g[~valid].any()


@pytest.mark.parametrize("n_valid", [0, 1])
def test_mi_of_fewer_than_two_rows_is_zero_with_finite_gradients(n_valid):
    mi = MutualInformation(3, hidden=4)
    valid = torch.zeros(5, dtype=torch.bool)
    valid[:n_valid] = True
    q, r, u = (torch.randn(5, 3, requires_grad=True) for _ in range(3))
    surrogate, est = mi(q, r, u, valid=valid)
    surrogate.backward()
    assert surrogate.item() == 0.0 and all(v.item() == 0.0 for v in est.values())
    assert all(torch.isfinite(p.grad).all() for p in mi.parameters() if p.grad is not None)
    assert all(torch.isfinite(t.grad).all() for t in (q, r, u))


# ------------------------------------------------------------------------------------------------ the ranker


def make(tiny_bert, **kw):
    torch.manual_seed(0)
    return build_ranker(DGReConfig(backbone=tiny_bert, query_max_len=8, doc_max_len=16, **kw))


def test_attention_scores_are_the_graph_layers_attention_logits(tiny_bert):
    """S averaged per head from the layer's own W_Q, W_K: per head, softmax of these logits over the real tokens is
    exactly the attention the backbone computed (eager attention's output_attentions)."""
    from einops import rearrange

    r = make(tiny_bert).eval()
    batch = PairTokenizer(r.tokenizer, "cross", 8, 16).pairs(QUERIES, DOCS)
    r.encoder.set_attn_implementation("eager")
    with torch.no_grad():
        out = r.encoder(**batch, output_attentions=True, output_hidden_states=True)
        att = r.encoder.encoder.layer[-1].attention.self
        hidden = out.hidden_states[-2]
        q = rearrange(att.query(hidden), "b l (h d) -> b h l d", h=att.num_attention_heads)
        k = rearrange(att.key(hidden), "b l (h d) -> b h l d", h=att.num_attention_heads)
        per_head = torch.einsum("bhid,bhjd->bhij", q, k) / att.attention_head_size**0.5
        keys = batch["attention_mask"].bool()[:, None, None, :]
        torch.testing.assert_close(
            per_head.masked_fill(~keys, float("-inf")).softmax(-1), out.attentions[-1], atol=1e-6, rtol=0
        )
        torch.testing.assert_close(r.attention_scores(hidden), per_head.mean(1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("masking", ["none", "heuristic", "adaptive"])
def test_score_of_a_pair_does_not_depend_on_padding(tiny_bert, masking):
    r = make(tiny_bert, masking=masking).eval()
    tok = PairTokenizer(r.tokenizer, "cross", 8, 16)
    with torch.no_grad():
        together = r.score(tok.pairs(QUERIES, DOCS))
        alone = torch.cat([r.score(tok.pairs([q], [d])) for q, d in zip(QUERIES, DOCS)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kw",
    [
        {"masking": "adaptive", "distance": "triangle", "mi": True},
        {"masking": "heuristic", "distance": "point", "mi": False},
        {"masking": "none", "distance": "pair", "mi": True, "ggnn_input": "message", "refined_pool": "cls"},
        {"masking": "adaptive", "distance": "none", "mi": False, "inf_norm": "induced", "decomposition_norm": "sum"},
    ],
    ids=["full", "heuristic-point", "none-pair-message", "adaptive-plain"],
)
def test_gradients_reach_every_parameter(tiny_bert, kw):
    r = make(tiny_bert, **kw).train()
    batch = PairTokenizer(r.tokenizer, "cross", 8, 16).triplets(QUERIES, DOCS, DOCS[1:] + DOCS[:1])
    out = r.score_triplets(batch)
    assert set(out.aux_losses) == ({"distance"} if kw["distance"] != "none" else set()) | (
        {"mi"} if kw["mi"] else set()
    )
    loss = torch.relu(1 - r.hinge_scores(out.pos) + r.hinge_scores(out.neg)).mean() + sum(out.aux_losses.values())
    r.zero_grad(set_to_none=True)
    loss.backward()
    without = {n for n, p in r.named_parameters() if p.grad is None or not bool(p.grad.any())}
    assert without == set()
    assert all(torch.isfinite(p.grad).all() for p in r.parameters())
    assert not any(n.startswith("mutual_information") for n, _ in r.named_parameters()) or kw["mi"]


def test_module_loss_is_eq25_plus_lambda_times_the_auxiliary_terms(tiny_bert):
    """RankingModule with optim.loss=hinge, margin 1: mean max(0, 1 - sigmoid(g+) + sigmoid(g-)) (Eq. 17, 25) plus
    lambda x (C_triangle + MINE surrogate), lambda = 0.5 here."""
    from lightning_modules.module import RankingModule

    m = RankingModule(
        {
            "name": "dgre",
            "backbone": tiny_bert,
            "query_max_len": 8,
            "doc_max_len": 16,
            "aux_lambda": 0.5,
            "dropout": 0.0,
        },
        {"loss": "hinge", "margin": 1.0},
    )
    m.eval()  # no dropout: two forwards give the same numbers
    logged = {}
    m.log = lambda name, value, **k: logged.__setitem__(name, float(value.detach()))
    batch = m.pair_tokenizer.triplets(QUERIES, DOCS, DOCS[1:] + DOCS[:1])
    torch.manual_seed(7)  # the MINE permutation
    loss = m.training_step(batch, 0).item()
    torch.manual_seed(7)
    out = m.ranker.forward(batch)
    g = np_(out.logits)
    hinge = np.mean([max(0.0, 1 - sig(g[i]) + sig(g[3 + i])) for i in range(3)])
    aux, _ = m.ranker.auxiliary_losses(out)
    assert set(aux) == {"distance", "mi"}
    assert logged["train/ranking_loss"] == pytest.approx(hinge, abs=1e-6)
    assert loss == pytest.approx(hinge + sum(v.item() for v in aux.values()), abs=1e-6)
    assert logged["train/distance_loss"] == pytest.approx(0.5 * logged["train/triangle"], abs=1e-6)
    assert {"train/mi", "train/mi_ru", "train/mi_qu", "train/mi_qr", "train/mi_loss"} <= set(logged)


def test_dgre_layers_train_at_their_own_learning_rate(tiny_bert):
    from lightning_modules.module import RankingModule

    m = RankingModule({"name": "dgre", "backbone": tiny_bert, "layers_lr_scale": 5.0}, {"lr": 1e-5})
    groups = m.optimizer_groups()
    lrs = {g.get("name"): g["lr"] for g in groups}
    assert lrs[None] == 1e-5 and lrs["dgre_layers/decay"] == pytest.approx(5e-5)
    layer_params = {id(p) for g in groups if g.get("name", "").startswith("dgre_layers") for p in g["params"]}
    assert layer_params == {id(p) for n, p in m.ranker.named_parameters() if not n.startswith("encoder.")}


# ------------------------------------------------------------------------------------------------ printed vs tuned

# The switches whose defaults are the printed equations, and the values of configs/model/dgre_tuned.yaml (the grids
# behind results/2026-11-23-dgre-cranfield-cacm.md).
PRINTED = {"attention_scale": False, "decomposition_norm": "sum", "activation": "none", "dropout": 0.0}
TUNED = {"attention_scale": True, "decomposition_norm": "mean", "activation": "relu", "dropout": 0.1}
# Every other DGRe key, the same in both files.
SHARED = {
    "masking": "adaptive",
    "inf_norm": "entry",
    "graph_layer": -1,
    "ggnn_steps": 2,
    "ggnn_input": "concat",
    "refined_pool": "mean",
    "distance": "triangle",
    "mi": True,
    "mi_hidden": 128,
    "aux_lambda": 0.01,
    "hinge_on": "probability",
    "layers_lr": None,
    "layers_lr_scale": 5.0,
}


def ref_eq12_to_16(
    r,
    h: np.ndarray,
    real: np.ndarray,
    query: np.ndarray,
    doc: np.ndarray,
    cls: np.ndarray,
    attention_scale: bool,
    decomposition_norm: str,
    activation: str,
):
    """Float64 loops from the GGNN output h^T [B, L, d] to g (one sequence at a time), with r's weights:
    Z^l = softmax((W_a h)(W_b h)^T) h over the real tokens (Eq. 12), Z_dr = sigmoid((W_1 Z_q)(W_2 Z_d)^T) Z_d (Eq. 14),
    g = w_2 act(W_1 [mean_q Z_dr, mean Z^l, E^L(0)] + b_1) + b_2 (Eq. 16); each switch as named."""
    wa, wb = np_(r.refine.w_a.weight), np_(r.refine.w_b.weight)
    w1, w2 = np_(r.decomposition.w_1.weight), np_(r.decomposition.w_2.weight)
    p1, p2 = r.predict[1], r.predict[3]
    act = {"none": lambda x: x, "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh}[activation]
    scale = 1 / math.sqrt(h.shape[-1]) if attention_scale else 1.0
    zs, related, logits = [], [], []
    for b in range(h.shape[0]):
        ri, qi, di = np.flatnonzero(real[b]), np.flatnonzero(query[b]), np.flatnonzero(doc[b])
        z = np.zeros_like(h[b])
        for i in ri:
            a = np.array([(wa @ h[b, i]) @ (wb @ h[b, j]) * scale for j in ri])
            p = np.exp(a - a.max())
            p /= p.sum()
            z[i] = sum(p[k] * h[b, j] for k, j in enumerate(ri))
        dr = []
        for i in qi:
            zdr = sum(sig((w1 @ z[i]) @ (w2 @ z[j]) * scale) * z[j] for j in di)
            dr.append(zdr / len(di) if decomposition_norm == "mean" else zdr)
        x = np.concatenate([np.mean(dr, 0), z[ri].mean(0), cls[b]])
        hidden = act(np_(p1.weight) @ x + np_(p1.bias))
        logits.append(np_(p2.weight)[0] @ hidden + np_(p2.bias)[0])
        zs.append(z)
        related.append(np.mean(dr, 0))
    return np.array(zs), np.array(related), np.array(logits)


def forward_with_ggnn_output(r, batch):
    """The ranker's forward in float64 (eval: no dropout) and the GGNN's output h^T it computed."""
    captured = {}
    handle = r.ggnn.register_forward_hook(lambda mod, args, out: captured.setdefault("h", out))
    try:
        with torch.no_grad():
            out = r.forward(batch)
    finally:
        handle.remove()
    return out, np_(captured["h"])


def test_the_defaults_are_the_printed_equations():
    cfg = DGReConfig()
    assert {k: getattr(cfg, k) for k in PRINTED} == PRINTED
    assert {k: getattr(cfg, k) for k in SHARED} == SHARED


@pytest.mark.parametrize(
    "switches",
    [
        {},
        {"attention_scale": True},
        {"decomposition_norm": "mean"},
        {"activation": "relu"},
        {"activation": "tanh"},
        {k: v for k, v in TUNED.items() if k != "dropout"},
    ],
    ids=["printed", "attention_scale", "decomposition_norm=mean", "activation=relu", "activation=tanh", "tuned"],
)
def test_ranker_computes_eq12_to_16_as_printed_and_each_switch_as_named(tiny_bert, switches):
    """The ranker with the default config (`{}`) against float64 loops of Eq. 12, 14-15 and 16 as printed, from the
    GGNN output it computed; each switch against the same loops with that switch, and different from the printed
    result on the same weights (the tiny BERT's d = 32: the scale is 1/sqrt(32))."""
    r = make(tiny_bert, **switches).double().eval()
    batch = PairTokenizer(r.tokenizer, "cross", 8, 16).pairs(QUERIES, DOCS)
    out, h = forward_with_ggnn_output(r, batch)
    masks = (np_(batch["attention_mask"]) > 0, out.query_mask.numpy(), out.doc_mask.numpy())
    cfg = {k: switches.get(k, PRINTED[k]) for k in ("attention_scale", "decomposition_norm", "activation")}
    z, related, logits = ref_eq12_to_16(r, h, *masks, np_(out.cls), **cfg)
    real = masks[0]
    np.testing.assert_allclose(np_(out.refined)[real], z[real], rtol=0, atol=1e-10)
    np.testing.assert_allclose(np_(out.related), related, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np_(out.logits), logits, rtol=1e-10, atol=1e-10)
    if switches:
        _, _, printed = ref_eq12_to_16(r, h, *masks, np_(out.cls), **{k: PRINTED[k] for k in cfg})
        assert not np.allclose(printed, logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_eq16_dropout_is_off_as_printed_and_on_when_set(tiny_bert, dropout):
    """The default (printed) prediction layer has no dropout: in training mode it gives the eval-mode numbers;
    dropout=0.1 (tuned) drops inputs of W_1 in training mode."""
    r = make(tiny_bert) if dropout == 0.0 else make(tiny_bert, dropout=dropout)
    assert r.predict[0].p == dropout
    x = torch.randn(64, 3 * r.hidden_size)
    torch.manual_seed(3)
    trained, evaluated = r.predict.train()(x), r.predict.eval()(x)
    assert torch.equal(trained, evaluated) == (dropout == 0.0)


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("option", ["dgre", "dgre_tuned"])
def test_yaml_holds_every_schema_key_and_composes(option):
    from dataclasses import fields

    from pipeline.config import compose

    raw = yaml.safe_load((REPO / "configs" / "model" / f"{option}.yaml").read_text())
    assert set(raw) - {"optim"} == {f.name for f in fields(DGReConfig)} and raw["name"] == "dgre"
    assert raw["optim"] == {"loss": "hinge", "margin": 1.0}  # Eq. 25
    cfg = compose([f"model={option}", "model.masking=heuristic", "model.distance=pair", "model.mi=false"])
    assert (cfg.model.name, cfg.model.masking, cfg.model.distance, cfg.model.mi) == ("dgre", "heuristic", "pair", False)


def test_model_dgre_is_the_printed_equations_and_dgre_tuned_our_settings():
    """configs/model/dgre.yaml: every DGRe key at its schema default (the printed equations); dgre_tuned.yaml: the
    same file but the four switches at the values of the grids behind results/2026-11-23-dgre-cranfield-cacm.md."""
    from dataclasses import fields

    from models.rankers.base import RankerConfig
    from pipeline.config import compose

    own = {f.name for f in fields(DGReConfig)} - {f.name for f in fields(RankerConfig)}
    printed, tuned = compose(["model=dgre"]).model, compose(["model=dgre_tuned"]).model
    assert {k: printed[k] for k in own} == {k: getattr(DGReConfig(), k) for k in own} == {**SHARED, **PRINTED}
    assert {k: tuned[k] for k in own} == {**SHARED, **TUNED}
    assert {k: v for k, v in tuned.items() if k not in TUNED} == {k: v for k, v in printed.items() if k not in TUNED}


def test_train_py_dry_run_shows_the_printed_dgre(capsys):
    """`python train.py model=dgre --dry-run`, in process (train.py is pipeline.cli.main around the training job)."""
    from pipeline.cli import main

    assert main(["model=dgre", "--dry-run"], lambda cfg, _: pytest.fail("--dry-run must not train")) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["model"]["name"] == "dgre" and {k: cfg["model"][k] for k in PRINTED} == PRINTED
    assert (cfg["optim"]["loss"], cfg["optim"]["margin"], cfg["model"]["hinge_on"]) == ("hinge", 1.0, "probability")


@pytest.mark.parametrize(
    "argv,loss",
    [
        (["model=dgre"], ("hinge", 1.0)),
        (["model=dgre_tuned"], ("hinge", 1.0)),
        (["model=dgre", "optim.loss=ce"], ("ce", 1.0)),
        (["model=dgre", "optim.margin=0.5"], ("hinge", 0.5)),
        (["model=bert_cat"], ("ce", 1.0)),
        ([], ("ce", 1.0)),
    ],
)
def test_model_dgre_trains_with_eq25_unless_the_command_line_says_otherwise(argv, loss):
    """Eq. 25 (margin loss 1 on sigmoid outputs) is model=dgre's default through its YAML's `optim` block; the
    command line overrides it; every other ranker keeps configs/config.yaml's `optim.loss: ce`."""
    from pipeline.config import compose

    optim = compose(argv).optim
    assert (optim.loss, optim.margin) == loss


@pytest.mark.parametrize(
    "grid,switches", [("dgre_cranfield", TUNED), ("dgre_cacm", TUNED), ("dgre_cranfield_literal", PRINTED)]
)
def test_grids_train_dgre_rows_with_their_settings(grid, switches):
    """The grids behind results/2026-11-23-dgre-cranfield-cacm.md train every DGRe row with the tuned settings
    (model=dgre_tuned), as they did when model=dgre meant them; dgre_cranfield_literal with the printed equations.
    Every cell keeps Eq. 25 (hinge, margin 1, on sigmoid outputs)."""
    from grid.engine import plan
    from grid.spec import load_grid
    from pipeline.config import compose

    spec, extra = load_grid([f"grid={grid}"])
    cells = [c for c in plan(spec, extra) if c.fold == 0]
    dgre = [c for c in cells if c.row.startswith("dgre")]
    assert len(dgre) == (7 if grid != "dgre_cranfield_literal" else 4)
    for cell in dgre:
        cfg = compose(list(cell.argv))
        assert cfg.model.name == "dgre" and {k: cfg.model[k] for k in switches} == switches, cell.label
        assert (cfg.optim.loss, cfg.optim.margin, cfg.model.hinge_on) == ("hinge", 1.0, "probability"), cell.label


@pytest.mark.parametrize(
    "argv,key",
    [
        (["model=dgre", "model.masking=soft"], "model.masking"),
        (["model=dgre", "model.distance=triangles"], "model.distance"),
        (["model=dgre", "model.inf_norm=max"], "model.inf_norm"),
        (["model=dgre", "model.ggnn_steps=-1"], "model.ggnn_steps"),
        (["model=dgre", "model.aux_lambda=-0.1"], "model.aux_lambda"),
        (["model=dgre", "model.mi=maybe"], "model.mi"),
    ],
)
def test_bad_settings_are_input_errors(argv, key):
    from pipeline.config import compose

    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        compose(argv)


def test_graph_layer_out_of_range_is_input_error(tiny_bert):
    with pytest.raises(InputError, match="model.graph_layer"):
        make(tiny_bert, graph_layer=2)  # the tiny BERT has layers 0 and 1


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_train_py_runs_dgre_without_nan(tiny_bert, tmp_path):
    import json

    out = tmp_path / "run"
    run_script(
        "train.py",
        "model=dgre",
        f"model.backbone={tiny_bert}",
        "model.query_max_len=8",
        "model.doc_max_len=24",
        "optim.loss=hinge",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.log_every_n_steps=1",
        "data.batch_size=4",
        "data.eval_batch_size=16",
        "data.max_eval_queries=8",
        "data.candidate_depth=10",
        "data.max_train_triples=32",
        "trainer.accelerator=cpu",
        "logger=csv",
        "eval.before_training=false",
        "trainer.enable_progress_bar=false",
        f"output_dir={out}",
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert all(math.isfinite(v) for v in metrics.values())
    import csv

    rows = list(csv.DictReader(open(next((out / "csv").glob("version_*/metrics.csv")))))
    logged = {k for row in rows for k, v in row.items() if v}
    assert {"train/loss", "train/ranking_loss", "train/distance_loss", "train/mi_loss", "train/triangle"} <= logged
    assert all(math.isfinite(float(row["train/loss"])) for row in rows if row.get("train/loss"))
