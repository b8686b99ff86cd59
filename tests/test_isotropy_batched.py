"""The `paper` isotropy protocol measured many test batches at a time: `isotropy_iw_batched` (one batched
eigendecomposition for many sets, isotropy paper Eq. 3) against an independent float64 NumPy formula and the
one-set `isotropy_iw`, and `IsotropyCallback.measure_paper` (batches measured together, repeated queries weighted
by their count) against the per-batch computation on the vectors each batch holds."""

import contextlib
import doctest
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import tiny_ranker_and_data

import metrics.isotropy
from callbacks.isotropy import BatchSets, IsotropyCallback, PaperMeasure, aggregate_batches, paper_batch_values
from metrics.isotropy import gram_matrix, isotropy_iw, isotropy_iw_batched, unit_sum


def iw_numpy(W: np.ndarray, both_signs: bool = False) -> float:
    """Eq. 3 in NumPy, float64: E the eigenvectors of W^T W (uncentred), each one's largest-magnitude component made
    positive (the first on ties), log Z(a) by a hand-written logsumexp; I(W) = min Z / max Z."""
    W = np.asarray(W, dtype=np.float64)
    _, E = np.linalg.eigh(W.T @ W)
    E = E * np.where(E[np.argmax(np.abs(E), axis=0), np.arange(E.shape[1])] < 0, -1.0, 1.0)
    if both_signs:
        E = np.concatenate([E, -E], axis=1)
    P = W @ E
    m = P.max(axis=0)
    log_z = m + np.log(np.exp(P - m).sum(axis=0))
    return float(np.exp(log_z.min() - log_z.max()))


def _random_sets(rng, sizes, d: int) -> list[torch.Tensor]:
    """Unit rows around a common direction, as a ranker's token vectors are (no repeated eigenvalue)."""
    mean = rng.normal(size=d)
    sets = []
    for n in sizes:
        x = rng.normal(size=(n, d)) + 0.4 * mean
        sets.append(torch.tensor(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=torch.float32))
    return sets


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


@pytest.mark.parametrize("sizes", [[7], [3, 40, 12, 1, 25], [200, 5, 64]])
@pytest.mark.parametrize("both_signs", [False, True])
def test_batched_iw_equals_numpy_and_the_one_set_form(sizes, both_signs):
    """Sets of differing n, one alone, n < d (rank-deficient W^T W) and n = 1 included: each value equals the NumPy
    formula and isotropy_iw of that set (1e-10 relative)."""
    rng = np.random.default_rng(len(sizes))
    sets = _random_sets(rng, sizes, d=16)
    got = isotropy_iw_batched(sets, both_signs=both_signs)
    assert got.dtype == torch.float64 and got.shape == (len(sets),)
    for W, value in zip(sets, got.tolist()):
        assert _rel(value, iw_numpy(W.numpy(), both_signs)) <= 1e-10
        assert _rel(value, isotropy_iw(W, both_signs=both_signs)) <= 1e-10
    # the Gram matrices given (as the callback sums them from parts) give the same values
    grams = torch.stack([gram_matrix(W) for W in sets])
    assert torch.equal(isotropy_iw_batched(sets, grams, both_signs=both_signs), got)


@pytest.mark.parametrize("both_signs", [False, True])
def test_fewer_rows_than_dimensions_from_the_dual(both_signs):
    """A set with n < d rows is measured from its n x n dual (`_log_z_dual`): equal to the NumPy formula on the d x d
    Gram matrix (1e-10 relative), also when rows repeat (rank < n) and with counts, next to a set with n > d."""
    rng = np.random.default_rng(5)
    small, big = _random_sets(rng, [6, 50], d=24)
    repeated = torch.cat([small, small[:2]])  # rank 6 from 8 rows
    counts = torch.tensor([1.0, 3.0, 2.0, 1.0, 5.0, 1.0], dtype=torch.float64)
    got = isotropy_iw_batched(
        [small, repeated, small, big], counts=[None, None, counts, None], both_signs=both_signs
    ).tolist()
    refs = [
        iw_numpy(small.numpy(), both_signs),
        iw_numpy(repeated.numpy(), both_signs),
        iw_numpy(small.repeat_interleave(counts.long(), dim=0).numpy(), both_signs),
        iw_numpy(big.numpy(), both_signs),
    ]
    for value, ref in zip(got, refs):
        assert _rel(value, ref) <= 1e-10


def test_counts_weigh_rows_as_repeats():
    """A row given once with count c is c equal rows: I(W) (Z(a) and W^T W), the Gram matrix and avgcos's unit sum
    equal those of the set with the rows repeated."""
    rng = np.random.default_rng(3)
    sets = _random_sets(rng, [9, 30, 4], d=12)
    counts = [torch.tensor(rng.integers(1, 17, size=len(W)), dtype=torch.float64) for W in sets]
    repeated = [W.repeat_interleave(c.long(), dim=0) for W, c in zip(sets, counts)]
    got = isotropy_iw_batched(sets, counts=counts).tolist()
    for W, c, R, value in zip(sets, counts, repeated, got):
        assert _rel(value, iw_numpy(R.numpy())) <= 1e-10
        torch.testing.assert_close(gram_matrix(W, c), gram_matrix(R), rtol=1e-12, atol=1e-12)
        total, n = unit_sum(W, c)
        ref_total, ref_n = unit_sum(R)
        assert n == ref_n and torch.allclose(total, ref_total, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="counts"):
        isotropy_iw_batched(sets[:1], counts=[torch.zeros(len(sets[0]))])
    with pytest.raises(ValueError, match="grams"):
        isotropy_iw_batched(sets, torch.zeros(2, 12, 12, dtype=torch.float64))


def test_docstring_example():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(metrics.isotropy.isotropy_iw_batched, "isotropy_iw_batched", globs=vars(metrics.isotropy)):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0


def _batches(rng, count: int, d: int):
    """Test batches as the protocol sees them: a few distinct queries repeated (mostly one query x 16 pairs) and
    passages; each as (vectors with repeats, BatchSets with each distinct row once and its count)."""
    out = []
    for _ in range(count):
        qs = _random_sets(rng, rng.integers(3, 9, size=int(rng.integers(1, 3))), d)
        ps = _random_sets(rng, rng.integers(5, 30, size=int(rng.integers(1, 17))), d)
        q_counts = rng.integers(1, 16, size=len(qs))
        full_q = torch.cat([q for q, c in zip(qs, q_counts) for _ in range(c)])
        full_p = torch.cat(ps)
        counts = torch.tensor(np.concatenate([np.repeat(q_counts, [len(q) for q in qs]), np.ones(len(full_p))]))
        sets = BatchSets(torch.cat([*qs, full_p]), sum(len(q) for q in qs), counts)
        out.append(({("", "query", ""): full_q, ("", "passage", ""): full_p}, {("", ""): sets}))
    return out


@pytest.mark.parametrize("max_bytes", [1, 200_000, None])
def test_paper_measure_equals_the_per_batch_values(max_bytes):
    """PaperMeasure with the pending batches measured every batch, a few at a time or all at once, each batch's
    distinct rows weighted by their counts: the values of paper_batch_values on each batch's vectors as held
    (1e-10 relative), in the order added."""
    batches = _batches(np.random.default_rng(5), 13, d=24)
    measure = PaperMeasure(max_bytes)
    for k, (_, sets) in enumerate(batches):
        measure.add(10 * k, sets)
    measure.flush()
    assert [k for k, _ in measure.values] == [10 * k for k in range(len(batches))]
    for (_, got), (vectors, _) in zip(measure.values, batches):
        ref = paper_batch_values(vectors)
        assert set(got) == set(ref)
        for key in ref:
            assert _rel(got[key], ref[key]) <= 1e-10, key


@pytest.mark.parametrize("model", ["colbert", "repbert"])
def test_measure_paper_equals_the_per_batch_computation(tmp_path, tiny_bert, model):
    """The callback's output (many batches per eigendecomposition, repeated queries given once with their count)
    equals the per-batch computation: paper_batch_values on each test batch's vectors as dumped (every row as the
    batch holds it), aggregated (1e-10 relative); measuring batch by batch gives the same too."""
    module, dm = tiny_ranker_and_data(tmp_path, tiny_bert, model)
    dm.setup()
    trainer = SimpleNamespace(datamodule=dm, precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext))
    cb = IsotropyCallback(batch_pairs=8, dump_dir=tmp_path / "dump")
    got = cb.measure_paper(trainer, module)
    cb.paper_bytes, cb.dump_dir = 1, None
    one_by_one = cb.measure_paper(trainer, module)

    per_batch = []
    for path in sorted((tmp_path / "dump").glob("*.npz"), key=lambda p: int(p.stem)):
        z = np.load(path)
        kinds = ("", "_sequence") if model == "repbert" else ("",)
        per_batch.append(
            paper_batch_values(
                {("", name, kind): torch.from_numpy(z[name + kind]) for name in ("query", "passage") for kind in kinds}
            )
        )
    ref = aggregate_batches(per_batch)
    ref["isotropy_paper_batches"] = float(len(per_batch))
    assert len(per_batch) == math.ceil(len(dm.eval_splits["test"].pairs) / 8) > 2
    assert set(got) == set(ref) == set(one_by_one)
    assert ("iw_paper_sequence" in got) == (model == "repbert")
    for key, value in ref.items():
        for result in (got, one_by_one):
            assert result[key] == value or _rel(result[key], value) <= 1e-10 or abs(result[key] - value) <= 1e-14, key
