"""I(W) and avgcos against float64 NumPy references written straight from Eq. 3 / Eq. 4 (plain loops)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from metrics.isotropy import AvgCos, IsotropyIW, avg_cos, isotropy_iw


# ---------------------------------------------------------------- references (no torch, no tricks)
def _canonical_eigenvectors(W: np.ndarray) -> list[np.ndarray]:
    """Eigenvectors of W^T W, each flipped so that its largest-|.| component (first on ties) is positive."""
    _, vecs = np.linalg.eigh(W.T @ W)
    out = []
    for j in range(vecs.shape[1]):
        a = vecs[:, j].copy()
        best = 0
        for i in range(len(a)):
            if abs(a[i]) > abs(a[best]):
                best = i
        if a[best] < 0:
            a = -a
        out.append(a)
    return out


def ref_iw(W: np.ndarray, both_signs: bool = False) -> float:
    W = np.asarray(W, dtype=np.float64)
    directions = _canonical_eigenvectors(W)
    if both_signs:
        directions = directions + [-a for a in directions]
    Z = []
    for a in directions:
        z = 0.0
        for w in W:
            z += math.exp(sum(float(w[k]) * float(a[k]) for k in range(len(a))))
        Z.append(z)
    return min(Z) / max(Z)


def ref_avg_cos(W: np.ndarray) -> float:
    rows = [np.asarray(w, dtype=np.float64) for w in W if np.linalg.norm(w) > 0]
    total, pairs = 0.0, 0
    for i, u in enumerate(rows):
        for j, v in enumerate(rows):
            if i != j:
                total += float(u @ v) / (np.linalg.norm(u) * np.linalg.norm(v))
                pairs += 1
    return total / pairs


def _random(n: int, d: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, d, generator=g)


# ---------------------------------------------------------------- functional versions
@pytest.mark.parametrize("seed,n,d,shift", [(0, 60, 5, 0.0), (1, 120, 8, 0.3), (2, 40, 12, -0.5)])
def test_iw_matches_reference(seed, n, d, shift):
    W = _random(n, d, seed) + shift
    assert isotropy_iw(W) == pytest.approx(ref_iw(W.double().numpy()), abs=1e-6, rel=1e-9)
    assert isotropy_iw(W, both_signs=True) == pytest.approx(ref_iw(W.double().numpy(), both_signs=True), abs=1e-6)
    assert isotropy_iw(W, both_signs=True) <= isotropy_iw(W) + 1e-12


def test_iw_accepts_numpy_and_float64():
    W = _random(50, 6, 3).double()
    assert isotropy_iw(W.numpy()) == pytest.approx(isotropy_iw(W), abs=1e-12)
    assert isotropy_iw(W.float()) == pytest.approx(isotropy_iw(W), abs=1e-6)


@pytest.mark.parametrize("seed,n,d", [(0, 30, 4), (1, 80, 16)])
def test_avg_cos_matches_reference(seed, n, d):
    W = _random(n, d, seed) + 0.2
    assert avg_cos(W) == pytest.approx(ref_avg_cos(W.numpy()), abs=1e-6, rel=1e-9)
    cos = torch.nn.functional.normalize(W.double(), dim=1) @ torch.nn.functional.normalize(W.double(), dim=1).T
    full = (cos.sum() - cos.diagonal().sum()) / (n * (n - 1))
    assert avg_cos(W) == pytest.approx(float(full), abs=1e-12)


def test_avg_cos_ignores_zero_vectors():
    W = _random(20, 5, 4)
    W[[3, 11]] = 0.0
    assert avg_cos(W) == pytest.approx(ref_avg_cos(W.numpy()), abs=1e-9)
    assert avg_cos(W) == pytest.approx(avg_cos(W[W.norm(dim=1) > 0]), abs=1e-12)
    assert math.isnan(avg_cos(torch.zeros(3, 4)))
    assert math.isnan(avg_cos(torch.ones(1, 4)))


def test_isotropic_gaussian_is_isotropic():
    W = _random(20000, 16, 5)
    # Finite-sample value is about exp(-2 sqrt(d / n)) = 0.945.
    assert isotropy_iw(W) > 0.9
    assert abs(avg_cos(W)) < 0.01


def test_narrow_cone_is_anisotropic():
    g = torch.Generator().manual_seed(6)
    direction = torch.nn.functional.normalize(torch.randn(16, generator=g), dim=0)
    W = 10 * direction + 0.1 * torch.randn(20000, 16, generator=g)
    assert isotropy_iw(W) < 0.05
    assert avg_cos(W) > 0.99


def test_large_norms_do_not_overflow():
    # Rows +-c_k q_k (q_k orthonormal): E = {q_k}, log Z(q_k) = log(e^c_k + e^-c_k + 2d - 2), so
    # I(W) = exp(log Z_min - log Z_max) ~ exp(c_0 - c_last); e^1000 overflows float64.
    d = 4
    c = np.array([1000.0, 1000.1, 1000.2, 1000.3])
    Q, _ = np.linalg.qr(np.random.default_rng(7).standard_normal((d, d)))
    W = np.concatenate([c[:, None] * Q.T, -c[:, None] * Q.T])
    assert np.allclose(np.linalg.norm(W, axis=1), np.concatenate([c, c]))
    log_z = [ck + math.log1p(math.exp(-2 * ck) + (2 * d - 2) * math.exp(-ck)) for ck in c]
    expected = math.exp(min(log_z) - max(log_z))
    assert isotropy_iw(W) == pytest.approx(expected, rel=1e-6)

    V = torch.nn.functional.normalize(_random(300, 8, 8), dim=1) * 1000
    value = isotropy_iw(V)
    assert math.isfinite(value) and 0.0 <= value <= 1.0
    assert avg_cos(V) == pytest.approx(avg_cos(V.double() / 1000), abs=1e-12)
    assert math.isfinite(avg_cos(V.half()))


def test_bad_input():
    with pytest.raises(ValueError, match="matrix"):
        isotropy_iw(torch.zeros(5))
    with pytest.raises(ValueError, match="at least one row"):
        avg_cos(torch.zeros(0, 3))
    W = _random(5, 3, 9)
    W[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        isotropy_iw(W)


# ---------------------------------------------------------------- torchmetrics classes
def test_metrics_over_chunks_equal_functional():
    W = _random(700, 12, 10) + 0.4
    W[5] = 0.0
    iw, ac = IsotropyIW(), AvgCos()
    for chunk in (W[:100], W[100:101], W[101:450], W[450:]):
        iw.update(chunk)
        ac.update(chunk)
    assert iw.compute().dtype == torch.float64
    assert float(iw.compute()) == pytest.approx(isotropy_iw(W), abs=1e-12)
    assert float(ac.compute()) == pytest.approx(avg_cos(W), abs=1e-12)

    iw.reset()
    ac.reset()
    iw.update(W[:50])
    ac.update(W[:50])
    assert float(iw.compute()) == pytest.approx(isotropy_iw(W[:50]), abs=1e-12)
    assert float(ac.compute()) == pytest.approx(avg_cos(W[:50]), abs=1e-12)


def test_metrics_mask_selects_tokens():
    tokens = _random(6 * 9, 8, 11).reshape(6, 9, 8)
    mask = torch.rand(6, 9, generator=torch.Generator().manual_seed(12)) > 0.3
    tokens[~mask] = 0.0  # padding
    iw, ac = IsotropyIW(), AvgCos()
    iw.update(tokens[:3], mask[:3])
    iw.update(tokens[3:], mask[3:])
    ac.update(tokens[:4], mask[:4])
    ac.update(tokens[4:], mask[4:])
    assert float(iw.compute()) == pytest.approx(isotropy_iw(tokens[mask]), abs=1e-12)
    assert float(ac.compute()) == pytest.approx(avg_cos(tokens[mask]), abs=1e-12)
    with pytest.raises(ValueError, match="mask"):
        iw.update(tokens, mask[:, :4])


def test_iw_max_vectors_keeps_the_first_rows():
    W = _random(100, 6, 13)
    iw = IsotropyIW(max_vectors=70)
    iw.update(W[:40])
    with pytest.warns(UserWarning, match="max_vectors"):
        iw.update(W[40:80])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        iw.update(W[80:])  # warned once per reset
    assert float(iw.compute()) == pytest.approx(isotropy_iw(W[:70]), abs=1e-12)
    iw.reset()
    iw.update(W[:70])
    assert float(iw.compute()) == pytest.approx(isotropy_iw(W[:70]), abs=1e-12)


def test_metrics_before_update_and_dimension_change():
    with pytest.warns(UserWarning):
        assert math.isnan(float(IsotropyIW().compute()))
    with pytest.warns(UserWarning):
        assert math.isnan(float(AvgCos().compute()))
    iw, ac = IsotropyIW(), AvgCos()
    iw.update(torch.randn(4, 3))
    ac.update(torch.randn(4, 3))
    with pytest.raises(ValueError, match="dimension"):
        iw.update(torch.randn(4, 5))
    with pytest.raises(ValueError, match="dimension"):
        ac.update(torch.randn(4, 5))


# ---------------------------------------------------------------- DDP (two gloo processes on CPU)
def _ddp_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        W = _random(300, 8, 14) + 0.3
        shard = W[rank::world]
        iw, ac = IsotropyIW(), AvgCos()
        for chunk in shard.split(37):
            iw.update(chunk)
            ac.update(chunk)
        result = torch.stack([iw.compute(), ac.compute()])
        if rank == 0:
            torch.save(result, out_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_metrics_gather_across_ddp_ranks(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "result.pt"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    iw_value, ac_value = torch.load(out).tolist()
    W = _random(300, 8, 14) + 0.3
    W_gathered = torch.cat([W[0::2], W[1::2]])  # rank order; I(W) and avgcos do not depend on row order
    assert iw_value == pytest.approx(isotropy_iw(W_gathered), abs=1e-12)
    assert iw_value == pytest.approx(isotropy_iw(W), abs=1e-9)
    assert ac_value == pytest.approx(avg_cos(W), abs=1e-12)


def test_probe_texts_come_from_the_split_measured(tmp_path):
    """`test/iw` and `test/avgcos` are measured on the test split's queries and passages, `val/...` on the validation
    split's: the probe of each split holds only that split's texts, and the same ones at every call."""
    from datamodules.datamodule import RankingDataModule
    from datamodules.sources.synthetic import SyntheticConfig

    cfg = SyntheticConfig(
        num_docs=80, num_train_queries=30, num_val_queries=6, num_test_queries=6, num_topics=4, cache_dir=str(tmp_path)
    )
    dm = RankingDataModule(cfg, tokenizer=None, seed=5)
    dm.setup()
    for split in ("val", "test"):
        queries, docs = dm.probe_texts(split)
        s = dm.eval_splits[split]
        assert queries and set(queries) <= set(s.qtexts) and set(docs) <= set(s.dtexts)
        assert (queries, docs) == dm.probe_texts(split)
    assert set(dm.probe_texts("val")[0]).isdisjoint(dm.probe_texts("test")[0])
