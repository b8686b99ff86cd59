"""Isotropy heads (models/heads): whitening against Eq. 7-10 in float64 NumPy, flows invertible with
log-dets equal to brute-force Jacobian determinants, maximum-likelihood training lowering held-out NLL, and the
isotropy metrics moving the right way."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from core.errors import InputError
from metrics.isotropy import avg_cos, isotropy_iw
from models.heads import HeadConfig, build_head
from models.heads.flows import GlowConfig, NICEConfig, build_glow, build_nice
from models.heads.whitening import (
    MomentAccumulator,
    Whitening,
    WhiteningConfig,
)


def anisotropic(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """A narrow cone: a large common offset plus correlated, unequal-variance noise (like raw BERT vectors)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=torch.float64) * torch.logspace(0, -2, d, dtype=torch.float64)
    return 5.0 + torch.randn(n, d, generator=g, dtype=torch.float64) @ mix


def test_whitening_streamed_equals_numpy_eq_7_to_10():
    x = anisotropic(500, 12)
    acc = MomentAccumulator(12)
    for chunk in x.split(37):  # streamed in uneven batches, float32 input
        acc.update(chunk.float())
    head = Whitening(12, eps=0.0).fit(acc)
    xn = x.float().double().numpy()
    mu = xn.mean(0)
    cov = (xn - mu).T @ (xn - mu) / (len(xn) - 1)
    lam, u = np.linalg.eigh(cov)
    z_ref = (xn - mu) @ u @ np.diag(lam**-0.5)
    z = head(torch.from_numpy(xn)).numpy()
    # eigenvectors are defined up to sign: compare the Gram matrices (sign-free) and the moments
    np.testing.assert_allclose(z @ z.T, z_ref @ z_ref.T, atol=1e-6)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(12), atol=1e-4)
    np.testing.assert_allclose(head.inverse(torch.from_numpy(z)).numpy(), xn, atol=1e-8)


def test_whitening_eps_floor_keeps_rank_deficient_input_finite():
    x = anisotropic(6, 10)  # 6 vectors in 10 dims: at most 5 non-zero eigenvalues
    acc = MomentAccumulator(10)
    acc.update(x)
    z = Whitening(10, eps=1e-6).fit(acc)(x)
    assert torch.isfinite(z).all()
    with pytest.raises(RuntimeError, match="before fit"):
        Whitening(10)(x)


def test_accumulators_merge_like_one_pass():
    x = anisotropic(100, 5)
    one, a, b = MomentAccumulator(5), MomentAccumulator(5), MomentAccumulator(5)
    one.update(x)
    a.update(x[:30])
    b.update(x[30:])
    a.merge(b)  # what DDP ranks do: add the three sums
    for u, v in zip(one.moments(), a.moments()):
        torch.testing.assert_close(u, v, rtol=0, atol=1e-10)


FLOWS = {
    "nice": lambda d: build_nice(d, couplings=4, hidden_layers=2, hidden_units=16),
    "glow": lambda d: build_glow(d, levels=2, depth=3, hidden_units=16, hidden_layers=1),
}


@pytest.mark.parametrize("name", ["nice", "glow"])
def test_flow_invertible_and_logdet_equals_jacobian(name):
    torch.manual_seed(1)
    head = FLOWS[name](6).double()
    x = anisotropic(8, 6, seed=2)
    head.init_from(x)
    for p in head.parameters():  # move away from the identity-ish init so the test is not trivial
        p.data += 0.1 * torch.randn_like(p)
    z, logdet = head.forward_and_logdet(x)
    torch.testing.assert_close(head.inverse(z), x, rtol=0, atol=1e-4)
    for i in range(3):
        jac = torch.autograd.functional.jacobian(lambda v: head(v[None])[0], x[i])
        assert float(logdet[i].detach()) == pytest.approx(float(torch.linalg.slogdet(jac)[1]), abs=1e-8)
    nll = head.nll(x)
    ref = 0.5 * (z.pow(2).sum(-1) + 6 * np.log(2 * np.pi)) - logdet
    torch.testing.assert_close(nll, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["nice", "glow"])
def test_halves_coupling_equals_zukos_gather_scatter_coupling(name, monkeypatch):
    """The contiguous-halves fast path (views + cat) computes what zuko's mask-indexed coupling computes, values and
    gradients; any other mask (heads trained before the fast path had alternating ones) still takes zuko's path."""
    from functools import partial

    from zuko.transforms import CouplingTransform

    from models.heads.flows import HalvesCouplingTransform

    torch.manual_seed(1)
    head = FLOWS[name](6).double()
    x = anisotropic(8, 6, seed=2)
    head.init_from(x)
    for p in head.parameters():
        p.data += 0.1 * torch.randn_like(p)

    def run():
        head.zero_grad()
        z, logdet = head.forward_and_logdet(x)
        (z.square().sum() + logdet.sum()).backward()
        return z.detach(), logdet.detach(), [p.grad.clone() for p in head.parameters()]

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(
            HalvesCouplingTransform, "forward", lambda self, c=None: CouplingTransform(partial(self.meta, c), self.mask)
        )
        ref = run()
    for u, v in zip([fast[0], fast[1], *fast[2]], [ref[0], ref[1], *ref[2]]):
        torch.testing.assert_close(u, v, rtol=0, atol=1e-12)

    couplings = [t for t in head.modules() if isinstance(t, HalvesCouplingTransform)]
    assert couplings
    # a checkpoint of an older head: masks neither a prefix nor a suffix (it had alternating ones), same sizes
    state = {k: (v.roll(1) if k.endswith(".mask") else v) for k, v in head.state_dict().items()}
    assert sum(k.endswith(".mask") for k in state) == len(couplings)
    head.load_state_dict(state)
    z, logdet = head.forward_and_logdet(x)
    torch.testing.assert_close(head.inverse(z), x, rtol=0, atol=1e-8)
    jac = torch.autograd.functional.jacobian(lambda v: head(v[None])[0], x[0])
    assert float(logdet[0].detach()) == pytest.approx(float(torch.linalg.slogdet(jac)[1]), abs=1e-8)
    assert not torch.allclose(z, fast[0])  # the masks changed: a different (still valid) flow


@pytest.mark.parametrize("name", ["nice", "glow"])
@pytest.mark.slow
def test_training_lowers_heldout_nll_and_raises_isotropy(name):
    torch.manual_seed(0)
    d = 8
    data = anisotropic(2500, d, seed=3).float()  # one distribution: 2000 to train on, 500 held out
    train, held = data[:2000], data[2000:]
    head = FLOWS[name](d)
    head.init_from(train)
    before = float(head.nll(held).mean())
    opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    for _epoch in range(30):
        for batch in train.split(200):
            loss = head.nll(batch).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    after = float(head.nll(held).mean())
    assert np.isfinite(after) and after < before - 1.0, (before, after)
    with torch.no_grad():
        z = head(held)
    assert isotropy_iw(z) > isotropy_iw(held) + 0.3 and abs(avg_cos(z)) < 0.1 < avg_cos(held)


def test_registry_and_config_checks():
    assert build_head(HeadConfig(name="none"), 8) is None
    assert isinstance(build_head(WhiteningConfig(), 8), Whitening)
    assert build_head(NICEConfig(hidden_units=8, hidden_layers=1), 8).dim == 8
    assert build_head(GlowConfig(hidden_units=8, hidden_layers=1), 8).dim == 8
    with pytest.raises(InputError, match="head.granularity"):
        HeadConfig(granularity="pooled")
    with pytest.raises(InputError, match="head.name"):
        build_head(HeadConfig(name="bert-flow"), 8)


@pytest.mark.parametrize("window", [1, 8])
@pytest.mark.parametrize("name,granularity", [("colbert", "token"), ("repbert", "token"), ("repbert", "sequence")])
def test_representation_cache_holds_exactly_the_rankers_vectors(
    tiny_bert, tmp_path, name, granularity, window, monkeypatch
):
    """The cache's rows are the non-padding token vectors (or pooled vectors) of every text, in order, as the
    ranker computes them one text at a time, though it encodes each window of `SORT_WINDOW` batches longest first
    (texts of mixed lengths, windows of one batch and of all); a second build with the same inputs reuses the file."""
    import models.heads.cache as cache_mod
    from lightning_modules.module import RankingModule
    from models.heads.cache import RepresentationCache

    m = RankingModule({"name": name, "backbone": tiny_bert, "query_max_len": 8, "doc_max_len": 16}, {}).eval()
    queries, docs = (
        ["slab", "what is heat transfer", "slab conduction"],
        ["a study", "heat transfer in slabs", "a", "flow of air over wings and the heat it takes", "heat"],
    )
    monkeypatch.setattr(cache_mod, "SORT_WINDOW", window)
    sorted_batches = []  # one entry per window: whether its batches are made longest first
    batches = cache_mod.batches
    monkeypatch.setattr(
        cache_mod, "batches", lambda *a, **k: sorted_batches.append(k.get("sort", True)) or batches(*a, **k)
    )

    def build():  # the same inputs both times
        return RepresentationCache.build(
            tmp_path / "c",
            m.ranker,
            m.pair_tokenizer,
            queries,
            docs,
            granularity=granularity,
            dtype="float32",
            checkpoint="x",
            batch_size=2,
        )

    cache = build()
    assert sorted_batches and all(sorted_batches) and len(sorted_batches) == (2 if window == 8 else 5)
    want = []
    for texts, side in ((queries, m.pair_tokenizer.queries), (docs, m.pair_tokenizer.docs)):
        for t in texts:
            ids, mask = side([t]).values()
            with torch.no_grad():
                enc = m.ranker.token_representations(ids, mask)
                want.append(enc.tokens[enc.mask] if granularity == "token" else m.ranker.pool(enc).sequence)
    want = torch.cat(want).numpy()
    got = np.asarray(cache.vectors())
    assert got.shape == want.shape == (cache.count, cache.dim)
    np.testing.assert_allclose(got, want, atol=1e-5)
    mtime = (tmp_path / "c" / "vectors.bin").stat().st_mtime_ns
    again = build()
    assert (tmp_path / "c" / "vectors.bin").stat().st_mtime_ns == mtime and again.count == cache.count
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_non_finite_representation_names_its_text_and_writes_no_cache(tiny_bert, tmp_path, monkeypatch):
    """Texts are encoded longest first within a window; the stop still names the text (its side and index in the
    texts' order) whose vectors are not finite, and leaves no cache behind."""
    from core.errors import TrainingStopped
    from lightning_modules.module import RankingModule
    from models.heads.cache import RepresentationCache

    m = RankingModule({"name": "colbert", "backbone": tiny_bert, "query_max_len": 8, "doc_max_len": 16}, {}).eval()
    docs = ["a study", "heat transfer in slabs", "a", "flow of air over wings", "heat"]
    bad = m.pair_tokenizer.ids(["wings"], "doc")[0][1]  # a word of doc 3 alone
    represent = m.ranker.token_representations

    def poisoned(ids, mask, **kw):
        enc = represent(ids, mask, **kw)
        enc.tokens[(ids == bad).any(1)] = float("nan")
        return enc

    monkeypatch.setattr(m.ranker, "token_representations", poisoned)
    with pytest.raises(
        TrainingStopped, match=r"non-finite representations \(doc text 3, or beyond the range of float16"
    ):
        RepresentationCache.build(tmp_path / "c", m.ranker, m.pair_tokenizer, ["q"], docs, batch_size=2)
    assert not list(tmp_path.iterdir())


def test_sequence_cache_refused_for_colbert(tiny_bert, tmp_path):
    from lightning_modules.module import RankingModule
    from models.heads.cache import RepresentationCache

    m = RankingModule({"name": "colbert", "backbone": tiny_bert, "query_max_len": 8, "doc_max_len": 16}, {}).eval()
    with pytest.raises(InputError, match="head.granularity"):
        RepresentationCache.build(tmp_path / "c", m.ranker, m.pair_tokenizer, ["q"], ["d"], granularity="sequence")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_head_fitted_in_closed_form_refuses_the_gradient_fits_keys():
    """`train.py stage=head head=whitening head.lr=1e-3` ran, the lr unused: a closed-form head
    (`HeadCapabilities.fit`) is fitted in one pass over the cached vectors (`fit_vectors` takes the vectors alone), so
    the gradient fit's keys away from their defaults are refused at composition; heads fitted by gradient take them."""
    from models.heads import GRADIENT_FIT_KEYS, HEADS, head_capabilities
    from pipeline.config import compose

    assert set(inspect.signature(Whitening.fit_vectors).parameters) == {"self", "vectors", "chunk"}
    values = {"epochs": 3, "lr": 0.001, "batch_size": 64, "val_memory_gib": 0.5}
    fits = {n: head_capabilities(n).fit for n in HEADS.names() if HEADS.get(n).capabilities is not None}
    assert set(fits.values()) == {"closed_form", "gradient"}
    for name, fit in fits.items():
        for key in GRADIENT_FIT_KEYS:
            argv = ["stage=head", "ckpt=a.ckpt", f"head={name}", f"head.{key}={values[key]}"]
            if fit == "gradient":
                assert compose(argv).head[key] == values[key]
                continue
            with pytest.raises(InputError, match=rf"^config key 'head.{key}': is {values[key]} but head '{name}' is"):
                compose(argv)
