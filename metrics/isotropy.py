"""Isotropy of a set of representation vectors: I(W) (Mu et al.) and the average cosine similarity.

Both follow section 3.2 of "Isotropic Representation Can Improve Dense Retrieval" (shared/papers/
isotropic-representation-dense-retrieval.txt). W is an (n, d) matrix whose rows w_i are the vectors.

I(W), Eq. 3 (Mu et al., "All-but-the-Top")::

    I(W) = min_{a in E} Z(a) / max_{a in E} Z(a),    Z(a) = sum_i exp(w_i . a),

with E the eigenvectors of W^T W. Conventions taken here:

- **No centring.** W is used raw, as in the paper and in Mu et al. (centring is part of their
  post-processing, not of the measure). A non-zero mean is a large part of what I(W) detects.
- **Eigenvector signs.** An eigenvector is only defined up to sign and Z(a) != Z(-a) in general; the paper and
  Mu et al. use the eigenvectors as their eigensolver returns them, which differs between LAPACK builds,
  CPU and GPU. We take the eigenvectors of ``torch.linalg.eigh`` and fix each one's sign so that its
  largest-magnitude component is positive (the ``svd_flip`` convention of scikit-learn). That is one of the
  answers an eigensolver may return, so it is the paper's measure, but reproducible across devices.
  ``both_signs=True`` is the sign-free alternative: min/max over the 2d directions {a, -a}; it is never
  larger than the one-sign value.
- With a repeated eigenvalue (e.g. exactly symmetric toy data) the eigenvectors inside that eigenspace are
  arbitrary and so is I(W); real representation sets do not hit this.
- **Numerics.** Everything runs in float64 and in log space: log Z(a) = logsumexp_i(w_i . a), and
  I(W) = exp(min log Z - max log Z), so vectors with norms in the thousands neither overflow nor give NaN
  (I(W) simply underflows to 0.0 when the ratio is below ~1e-308). Rows are processed in chunks, so the
  float64 copy of W is never materialised in full.
- **Finite samples.** The directions E come from the sample itself, so even i.i.d. standard Gaussian rows
  give I(W) < 1: the extreme eigenvalues of W^T W / n are about (1 +- sqrt(d/n))^2, and I(W) is about
  exp(-2 sqrt(d/n)) (0.94 for n=20000, d=16; about 0.3 for n=2000, d=768). Compare I(W) only between sets
  of the same n and d.
- Zero rows are kept (each adds exp(0) = 1 to every Z(a)); drop padding before calling, e.g. ``W[mask]``,
  or pass ``mask`` to the metric's ``update``.

avgcos, Eq. 4: the mean cosine similarity over the n(n-1) ordered pairs i != j (the diagonal excluded).
The paper writes 2/(n(n-1)) * sum_{i != j}; read with the sum over unordered pairs i < j this is the same
mean, and taken literally over ordered pairs it would not be an average (it reaches 2), so we compute the
mean. It needs no n x n matrix: with u_i = w_i / ||w_i||,

    sum_{i != j} cos(w_i, w_j) = ||sum_i u_i||^2 - n,    avgcos = (||sum_i u_i||^2 - n) / (n (n - 1)).

Zero vectors have no direction, so their cosine is undefined: they are left out, and n counts only the
non-zero rows. With fewer than two non-zero rows avgcos is NaN.

The paper reports each metric averaged over the test batches; the metric classes here compute it once
over all the vectors they accumulated. For the per-batch variant, call the functional versions per batch
and average (e.g. with ``torchmetrics.MeanMetric``); ``isotropy_iw_batched`` measures many batches' sets at once
(one batched eigendecomposition), with the same values.

Metric classes (``IsotropyIW``, ``AvgCos``) keep states that torchmetrics reduces across processes with no
special code: under DDP ``compute()`` sees every rank's vectors. As with any torchmetrics state that
starts empty, every rank must call ``update`` at least once before a synced ``compute`` (a
DistributedSampler guarantees it: it gives each rank the same number of batches).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

__all__ = [
    "isotropy_iw",
    "isotropy_iw_batched",
    "avg_cos",
    "gram_matrix",
    "unit_sum",
    "avg_cos_from_unit_sum",
    "one_thread",
    "IsotropyIW",
    "AvgCos",
]

# Rows per float64 chunk: 16384 x 1024 x 8 bytes = 128 MiB at most.
_CHUNK_ROWS = 16384


def _as_matrix(W, name: str = "W") -> Tensor:
    W = torch.as_tensor(W)
    if W.ndim != 2:
        raise ValueError(f"{name}: expected an (n, d) matrix of row vectors, got shape {tuple(W.shape)}")
    if W.shape[0] == 0 or W.shape[1] == 0:
        raise ValueError(f"{name}: needs at least one row and one column, got shape {tuple(W.shape)}")
    if W.is_complex():
        raise ValueError(f"{name}: expected real vectors, got dtype {W.dtype}")
    return W


def _check_counts(counts, W: Tensor, name: str = "counts") -> Tensor | None:
    if counts is None:
        return None
    counts = torch.as_tensor(counts, device=W.device).to(torch.float64)
    if tuple(counts.shape) != (W.shape[0],):
        raise ValueError(f"{name}: expected one count per row of W, shape ({W.shape[0]},), got {tuple(counts.shape)}")
    if not bool((counts > 0).all()):
        raise ValueError(f"{name}: counts must be positive")
    return counts


def _chunks(W: Tensor, counts: Tensor | None = None):
    """(float64 chunk of W's rows, its rows' counts or None)."""
    for start in range(0, W.shape[0], _CHUNK_ROWS):
        chunk = W[start : start + _CHUNK_ROWS].to(torch.float64)
        # a NaN or infinity makes the sum non-finite; a finite sum is one pass with no [n, d] mask (isfinite was ~10 %
        # of the `paper` protocol's time), and only a non-finite one (which overflow could also give) is checked row
        # by row
        if not math.isfinite(float(chunk.sum())) and not bool(torch.isfinite(chunk).all()):
            raise ValueError("W: contains NaN or infinite values")
        yield chunk, None if counts is None else counts[start : start + _CHUNK_ROWS]


def _canonical_signs(E: Tensor) -> Tensor:
    """Fix the sign of each eigenvector column of E, in place.

    Each column of E ([d, k], or a batch [..., d, k]) is flipped so that its largest-magnitude entry (the first one,
    on ties) is positive.
    """
    rows = E.abs().argmax(dim=-2, keepdim=True)
    signs = torch.sign(E.gather(-2, rows))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return E.mul_(signs)


@contextmanager
def one_thread():
    """Run torch's CPU ops on one thread inside the block.

    A d x d eigendecomposition (d <= 1024) gains little from threads, and when the cores are shared (DDP ranks,
    dataloader workers, other jobs) LAPACK's threads wait on each other: measured 0.6-5 s for d = 384 with 2 threads on
    a loaded 2-core machine against 0.05 s with one (values equal to 2e-15). A batched eigh on the CPU is the same
    LAPACK call per matrix in a loop, and it fares the same: for batches of 1, 3 and 48 matrices (d = 384, 768) on this
    2-core machine, 2 threads were 2.4x faster while it was idle but 6-50x slower (0.7-29 s against 0.1-0.8 s a matrix)
    under a load of 5 other processes. To use several cores, run independent single-threaded parts in threads instead
    (the `paper` protocol does so).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def gram_matrix(W, counts=None) -> Tensor:
    """Return W^T W, float64 (d, d).

    The Gram matrix of stacked sets is the sum of theirs, which is how the `paper` protocol gets the
    queries-and-passages set's from the two it measures anyway. `counts` (n,): row i stands for counts[i] equal rows
    (sum_i counts_i w_i w_i^T), so a set that repeats rows (a query repeated in a test batch) is given once per distinct
    row.
    """
    W = _as_matrix(W)
    counts = _check_counts(counts, W)
    gram = torch.zeros(W.shape[1], W.shape[1], dtype=torch.float64, device=W.device)
    for chunk, c in _chunks(W, counts):
        gram += (chunk if c is None else chunk * c[:, None]).T @ chunk
    return gram


def _directions(grams: Tensor, both_signs: bool) -> Tensor:
    """Return the eigenvectors of each of the [..., d, d] Gram matrices as columns.

    Signs follow the convention above; one (batched) eigh where the matrices are, single-threaded on the CPU
    (`one_thread`).
    """
    with one_thread() if grams.device.type == "cpu" else nullcontext():
        _, E = torch.linalg.eigh(grams.to(torch.float64))
    E = _canonical_signs(E)
    return torch.cat([E, -E], dim=-1) if both_signs else E


def _log_z(W: Tensor, E: Tensor, counts: Tensor | None) -> Tensor:
    """Log Z(a) = logsumexp_i(w_i . a + log counts_i) for every column a of E, float64, W chunk by chunk."""
    E = E.to(W.device)
    log_z = None
    for chunk, c in _chunks(W, counts):
        proj = chunk @ E
        part = torch.logsumexp(proj if c is None else proj + c.log()[:, None], dim=0)
        log_z = part if log_z is None else torch.logaddexp(log_z, part)
    return log_z


def eigen_directions(W, *, both_signs: bool = False, gram: Tensor | None = None) -> Tensor:
    """Return the directions E of Eq. 3 as columns, float64.

    They are the eigenvectors of W^T W with the sign convention above (`gram`: W^T W when the caller has it
    already, e.g. summed from parts).
    """
    W = _as_matrix(W)
    if gram is None:
        gram = gram_matrix(W)
    elif tuple(gram.shape) != (W.shape[1], W.shape[1]):
        raise ValueError(
            f"gram: expected shape {(W.shape[1], W.shape[1])} for W of shape {tuple(W.shape)}, got {tuple(gram.shape)}"
        )
    return _directions(gram, both_signs)


def log_partition(W, *, both_signs: bool = False, gram: Tensor | None = None) -> Tensor:
    """Log Z(a) for every a in E (float64, one entry per direction), computed with logsumexp."""
    W = _as_matrix(W)
    return _log_z(W, eigen_directions(W, both_signs=both_signs, gram=gram), None)


def isotropy_iw(W, *, both_signs: bool = False, gram: Tensor | None = None) -> float:
    """Compute I(W) of Eq. 3 for the rows of W (n, d), in [0, 1]; 1 is isotropic.

    See the module docstring. `gram`: W^T W (float64) when the caller has it already; the result is the same.
    """
    log_z = log_partition(W, both_signs=both_signs, gram=gram)
    return float(torch.exp(log_z.min() - log_z.max()))


def isotropy_iw_batched(
    sets: Sequence, grams: Tensor | None = None, *, counts: Sequence | None = None, both_signs: bool = False
) -> Tensor:
    """I(W) of Eq. 3 for each of B sets of rows at once: float64 [B], equal to ``isotropy_iw`` of each set.

    The directions E of all B sets come from ONE batched eigendecomposition of their stacked Gram matrices, where
    those are (on a GPU the whole batch at once; on the CPU LAPACK runs per matrix either way, single-threaded:
    `one_thread`), then log Z(a) = logsumexp per set on the set's device. A set with fewer rows than dimensions
    takes its directions from its n x n dual instead (`_log_z_dual`; the same values, a fraction of the cost: a test
    batch's query set is one question's 32 token vectors). This is how the `paper` protocol measures thousands of
    test batches.

    `sets`: B (n_b, d) matrices, n_b >= 1 and may differ (n_b < d is allowed: W^T W is then rank-deficient).
    `grams`: [B, d, d] float64, each set's W^T W (with its counts) when the caller has them already, e.g. summed from
    parts (`gram_matrix`); the result is the same. `counts`: per set None or (n_b,) positive row counts, row i
    standing for counts[i] equal rows (Z(a) = sum_i counts_i exp(w_i . a)): a set with repeated rows is given once
    per distinct row. `both_signs` as in ``isotropy_iw``.

    >>> w = torch.tensor([[3.0, 4.0]])  # E = {w / |w|, its orthogonal}: Z = exp(5) and exp(0)
    >>> W = torch.tensor([[1.0, 0.0], [0.5, 2.0], [-1.0, 0.25]])
    >>> iw = isotropy_iw_batched([w, W])
    >>> round(float(iw[0]), 6), round(float(iw[0]) / math.exp(-5), 12), abs(float(iw[1]) - isotropy_iw(W)) < 1e-15
    (0.006738, 1.0, True)
    """
    if len(sets) == 0:
        raise ValueError("sets: expected at least one set")
    sets = [_as_matrix(W, f"sets[{b}]") for b, W in enumerate(sets)]
    d = sets[0].shape[1]
    if any(W.shape[1] != d for W in sets):
        raise ValueError(f"sets: every set needs the same dimension, got {sorted({W.shape[1] for W in sets})}")
    counts = [None] * len(sets) if counts is None else list(counts)
    if len(counts) != len(sets):
        raise ValueError(f"counts: expected one entry per set ({len(sets)}), got {len(counts)}")
    counts = [_check_counts(c, W, f"counts[{b}]") for b, (W, c) in enumerate(zip(sets, counts))]
    if grams is None:
        grams = torch.stack([gram_matrix(W, c) for W, c in zip(sets, counts)])
    elif tuple(grams.shape) != (len(sets), d, d):
        raise ValueError(
            f"grams: expected shape {(len(sets), d, d)} for {len(sets)} sets of dimension {d}, got {tuple(grams.shape)}"
        )
    # a set with fewer rows than dimensions (a test batch's query: one question, 32 tokens) has at most n non-zero
    # eigenvalues: its directions come from the n x n dual (`_log_z_dual`), the rest from one batched d x d eigh
    dual = [W.shape[0] < d for W in sets]
    primal = [b for b, small in enumerate(dual) if not small]
    E = dict(zip(primal, _directions(grams[primal], both_signs))) if primal else {}
    log_z = torch.stack(
        [
            (_log_z_dual(W, c, both_signs) if dual[b] else _log_z(W, E[b], c)).to(grams.device)
            for b, (W, c) in enumerate(zip(sets, counts))
        ]
    )
    return torch.exp(log_z.amin(dim=1) - log_z.amax(dim=1))


def _log_z_dual(W: Tensor, counts: Tensor | None, both_signs: bool) -> Tensor:
    """Compute log Z(a) for the d eigenvectors a of W^T W from the n x n dual, float64.

    With counts c the Gram matrix is W^T C W, and the dual is the n x n matrix C^1/2 W W^T C^1/2 (n < d): an
    eigenvector u with eigenvalue l > 0 gives a = W^T C^1/2 u / sqrt(l) (the same directions a d x d eigh
    returns, to rounding; signs as `_canonical_signs`), and each of the other directions is orthogonal to every row,
    so its w_i . a = 0 and Z(a) = sum_i c_i (a d x d eigh gives those w_i . a at rounding level, ~1e-16).
    """
    W = W.to(torch.float64)
    if not math.isfinite(float(W.sum())):
        raise ValueError("W: contains NaN or infinite values")
    c = torch.ones(W.shape[0], dtype=torch.float64, device=W.device) if counts is None else counts.to(torch.float64)
    root = c.sqrt()
    Wc = W * root[:, None]
    with one_thread() if W.device.type == "cpu" else nullcontext():
        lam, U = torch.linalg.eigh(Wc @ Wc.T)
    keep = lam > lam.amax().clamp_min(0) * W.shape[0] * 1e-13  # the numerically non-zero ones
    A = _canonical_signs((Wc.T @ U[:, keep]) / lam[keep].sqrt())  # [d, r] unit directions
    if both_signs:
        A = torch.cat([A, -A], dim=1)
    log_c = c.log()[:, None]
    parts = [torch.logsumexp(W @ A + log_c, dim=0)]
    null = W.shape[1] - int(keep.sum())
    if null:
        parts.append(torch.logsumexp(c.log(), dim=0).expand(null * (2 if both_signs else 1)))
    return torch.cat(parts)


def unit_sum(W, counts=None) -> tuple[Tensor, int]:
    """Return (sum of the unit vectors of the non-zero rows, float64 (d,); number of non-zero rows).

    `counts` as in `gram_matrix`: row i counts counts[i] times (the number is then the sum of the non-zero rows'
    counts).
    """
    counts = _check_counts(counts, W)
    total = torch.zeros(W.shape[1], dtype=torch.float64, device=W.device)
    count = 0
    for chunk, c in _chunks(W, counts):
        norms = torch.linalg.vector_norm(chunk, dim=1)
        nonzero = norms > 0
        # sum_i c_i w_i / ||w_i|| as one vector-matrix product (zero rows weigh 0): no copy of the rows
        weights = torch.where(nonzero, (1.0 if c is None else c) / norms, 0.0)
        total += weights @ chunk
        count += int(nonzero.sum()) if c is None else int(round(float(c[nonzero].sum())))
    return total, count


def avg_cos_from_unit_sum(total: Tensor, count: int) -> float:
    """Avgcos of Eq. 4 from `unit_sum(W)`; sums and counts of disjoint row sets add up to their union's."""
    if count < 2:
        return math.nan
    total = total.to(torch.float64)
    return float((total @ total - count) / (count * (count - 1)))


def avg_cos(W) -> float:
    """Avgcos of Eq. 4: mean cosine over all ordered pairs i != j of non-zero rows of W (n, d), float64."""
    W = _as_matrix(W)
    return avg_cos_from_unit_sum(*unit_sum(W))


def _rows(vectors: Tensor, mask: Tensor | None) -> Tensor:
    """[..., d] vectors (and an optional [...] bool mask of the rows to keep) -> (k, d)."""
    vectors = torch.as_tensor(vectors)
    if vectors.ndim < 1:
        raise ValueError("vectors: expected shape [..., d]")
    if mask is not None:
        mask = torch.as_tensor(mask, device=vectors.device)
        if tuple(mask.shape) != tuple(vectors.shape[:-1]):
            raise ValueError(f"mask: shape {tuple(mask.shape)} does not match vectors {tuple(vectors.shape)}[:-1]")
        return vectors[mask.bool()]
    return vectors.reshape(-1, vectors.shape[-1])


class IsotropyIW(Metric):
    """I(W) over every vector passed to ``update`` (across all processes under DDP).

    I(W) needs every w_i (Z(a) sums over all of them), so the vectors themselves are the state
    (``dist_reduce_fx="cat"``). ``max_vectors`` caps what each process keeps: the first ``max_vectors``
    rows it sees after a ``reset()``; later rows are dropped with a warning. Under DDP ``compute`` then sees
    at most world_size * max_vectors rows. Memory: max_vectors * d * 4 bytes per process for float32 input
    (50,000 x 768 is 154 MB). ``None`` keeps everything. Half-precision inputs are stored as float32 (exactly),
    float32 and float64 as they are; ``compute`` runs in float64 and equals ``isotropy_iw`` on the
    concatenation of the kept rows.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, max_vectors: int | None = 50_000, both_signs: bool = False, **kwargs):
        super().__init__(**kwargs)
        if max_vectors is not None and max_vectors < 1:
            raise ValueError(f"max_vectors: expected a positive int or None, got {max_vectors}")
        self.max_vectors = max_vectors
        self.both_signs = both_signs
        self.add_state("vectors", default=[], dist_reduce_fx="cat")
        self._kept = 0
        self._warned = False

    def update(self, vectors: Tensor, mask: Tensor | None = None) -> None:
        """vectors: [..., d]; mask: optional [...] bool, True on the rows to keep (e.g. real tokens)."""
        x = _rows(vectors, mask).detach()
        if x.dtype not in (torch.float32, torch.float64):
            x = x.to(torch.float32)
        if self.vectors and x.shape[1] != self.vectors[0].shape[1]:
            raise ValueError(
                f"vectors: dimension {x.shape[1]} differs from earlier updates ({self.vectors[0].shape[1]})"
            )
        if self.max_vectors is not None:
            room = self.max_vectors - self._kept
            if x.shape[0] > room:
                if not self._warned:
                    warnings.warn(
                        f"IsotropyIW: max_vectors={self.max_vectors} reached; "
                        "further vectors are ignored until reset()",
                        stacklevel=2,
                    )
                    self._warned = True
                x = x[: max(room, 0)]
        # an empty first update is kept: its [0, d] state lets a DDP rank that saw no vectors join the others'
        # gather of [n, d] states (`width`)
        if x.shape[0] == 0 and self.vectors:
            return
        self.vectors.append(x)
        self._kept += x.shape[0]

    @property
    def width(self) -> int:
        """D of the vectors seen so far (0 before any update)."""
        v = self.vectors
        return (int(v[0].shape[1]) if v else 0) if isinstance(v, list) else int(v.shape[-1])

    def compute(self) -> Tensor:
        """Return I(W) (Eq. 3) of all the kept vectors as a float64 scalar tensor; NaN when none was kept."""
        if isinstance(self.vectors, list) and not self.vectors:
            return torch.tensor(math.nan, dtype=torch.float64, device=self.device)
        W = dim_zero_cat(self.vectors)
        if W.shape[0] == 0:
            return torch.tensor(math.nan, dtype=torch.float64, device=self.device)
        return torch.tensor(isotropy_iw(W, both_signs=self.both_signs), dtype=torch.float64, device=self.device)

    def reset(self) -> None:
        """Clear the kept vectors and the `max_vectors` count and warning, for the next epoch or stage."""
        super().reset()
        self._kept = 0
        self._warned = False


class AvgCos(Metric):
    """avgcos over every vector passed to ``update`` (across all processes under DDP), exactly.

    States are sufficient statistics reduced with ``"sum"``: the float64 sum of the unit vectors of the
    non-zero rows and their count, so memory is O(d) however many vectors are seen, and ``compute`` equals
    ``avg_cos`` on the concatenation of all updates.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # A scalar 0 that the first update broadcasts to shape (d,).
        self.add_state("unit_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, vectors: Tensor, mask: Tensor | None = None) -> None:
        """vectors: [..., d]; mask: optional [...] bool, True on the rows to keep (e.g. real tokens)."""
        x = _rows(vectors, mask).detach()
        # an empty update still sets the width (unit_sum becomes zeros(d)): a DDP rank that saw no vectors then
        # sums a [d] state like the others (`width`)
        if self.unit_sum.ndim == 1 and x.shape[1] != self.unit_sum.shape[0]:
            raise ValueError(f"vectors: dimension {x.shape[1]} differs from earlier updates ({self.unit_sum.shape[0]})")
        total, count = unit_sum(x)
        self.unit_sum = self.unit_sum.to(torch.float64) + total.to(self.unit_sum.device)
        self.count = self.count + count

    @property
    def width(self) -> int:
        """D of the vectors seen so far (0 before any update)."""
        return int(self.unit_sum.shape[0]) if self.unit_sum.ndim == 1 else 0

    def compute(self) -> Tensor:
        """Return avgcos (Eq. 4) of all the non-zero vectors seen, a float64 scalar tensor; NaN with fewer than two."""
        value = avg_cos_from_unit_sum(self.unit_sum, int(self.count))
        return torch.tensor(value, dtype=torch.float64, device=self.device)
