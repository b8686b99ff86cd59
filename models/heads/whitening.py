"""Whitening (isotropy paper section 4.1.2, Eq. 7-10; Su et al. 2021).

    mu = 1/N sum_i x_i                                   (7)
    Sigma = 1/(N-1) sum_i (x_i - mu)^T (x_i - mu)         (8)  unbiased
    Sigma = U Lambda U^T                                  (9)  symmetric eigendecomposition (= SVD here)
    z_i = (x_i - mu) U sqrt(Lambda^-1)                    (10)

`MomentAccumulator` streams the sums over any number of batches in float64 (never holding the vectors), merges
across DDP ranks by adding its three sums, and `Whitening.fit` turns them into the buffers `mean` and `transform`
(= U Lambda^{-1/2}, stored in float64 inside the checkpoint and applied in the input's dtype). Eigenvalues below
`eps * max eigenvalue` are raised to that floor: a rank-deficient covariance (fewer vectors than dimensions, or
collapsed directions of a fine-tuned model) would otherwise divide by ~0 and blow those directions up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from core.ranges import POSITIVE, check_ranges
from models.heads import HEADS
from models.heads.base import HeadCapabilities, HeadConfig, IsotropyHead


@dataclass
class WhiteningConfig(HeadConfig):
    """`head: whitening`: Eq. 7-10, with `eps` the eigenvalue floor (relative to the largest eigenvalue)."""

    name: str = "whitening"
    eps: float = 1e-6  # eigenvalue floor, relative to the largest eigenvalue

    def __post_init__(self):
        super().__post_init__()
        check_ranges("head", self, eps=POSITIVE)


class MomentAccumulator:
    """n, sum x, sum x^T x over streamed [..., D] batches, in float64."""

    def __init__(self, dim: int, device=None):
        self.n = 0
        self.sum = torch.zeros(dim, dtype=torch.float64, device=device)
        self.outer = torch.zeros(dim, dim, dtype=torch.float64, device=device)

    def update(self, x: Tensor) -> None:
        """Add a batch of vectors [..., D] to the sums (in float64, on the accumulator's device)."""
        x = x.reshape(-1, x.shape[-1]).to(self.sum.device, torch.float64)
        self.n += x.shape[0]
        self.sum += x.sum(0)
        self.outer += x.T @ x

    def merge(self, other: MomentAccumulator) -> None:
        """Add another accumulator's sums to this one's (e.g. another DDP rank's), as if it had seen its batches."""
        self.n += other.n
        self.sum += other.sum
        self.outer += other.outer

    def moments(self) -> tuple[Tensor, Tensor]:
        """(mu, unbiased Sigma) of Eq. 7-8."""
        if self.n < 2:
            raise ValueError(f"whitening needs at least 2 vectors, got {self.n}")
        mu = self.sum / self.n
        cov = (self.outer - self.n * torch.outer(mu, mu)) / (self.n - 1)
        return mu, 0.5 * (cov + cov.T)  # exact symmetry for eigh


class Whitening(IsotropyHead):
    """Whitening head, z = (x - mu) U Lambda^-1/2 (Eq. 10); `fit` sets mu and U Lambda^-1/2 from Eq. 7-9.

    It has nothing to train: `fit` (or `fit_vectors`) must be called before use. `eps` floors the eigenvalues (module
    docstring).
    """

    capabilities = HeadCapabilities(fit="closed_form")

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim)
        self.eps = eps
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("transform", torch.eye(dim, dtype=torch.float64))
        self.register_buffer("fitted", torch.tensor(False))

    @torch.no_grad()
    def fit(self, acc: MomentAccumulator) -> Whitening:
        """Set the head's mean and transform from the accumulated moments (Eq. 7-9) and return the head."""
        mu, cov = acc.moments()
        evals, evecs = torch.linalg.eigh(cov)
        evals = evals.clamp_min(self.eps * float(evals.max().clamp_min(torch.finfo(torch.float64).tiny)))
        self.mean.copy_(mu)
        self.transform.copy_(evecs * evals.rsqrt())  # U diag(Lambda^-1/2): column j scaled by 1/sqrt(lambda_j)
        self.fitted.fill_(True)
        return self

    def fit_vectors(self, vectors: np.ndarray, chunk: int = 65536) -> Whitening:
        """Fit Eq. 7-10 from `vectors` [N, D] (an array or a memory map), streamed once in chunks through the sums."""
        acc = MomentAccumulator(vectors.shape[1])
        for s in range(0, len(vectors), chunk):
            acc.update(torch.from_numpy(np.asarray(vectors[s : s + chunk], dtype=np.float32)))
        return self.fit(acc)

    def forward_and_logdet(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Return (z [..., D] of Eq. 10, log |det U Lambda^-1/2| [...], the same constant for every vector)."""
        if not bool(self.fitted):
            raise RuntimeError("whitening head used before fit(): run the head stage (stage=head head=whitening)")
        w = self.transform.to(x.dtype)
        z = (x - self.mean.to(x.dtype)) @ w
        logdet = torch.linalg.slogdet(self.transform)[1].to(z.dtype)  # constant: |det U Lambda^-1/2|
        return z, logdet.expand(z.shape[:-1])

    def inverse(self, z: Tensor) -> Tensor:
        """Return x [..., D] = z (U Lambda^-1/2)^-1 + mu, undoing Eq. 10."""
        return z @ torch.linalg.inv(self.transform).to(z.dtype) + self.mean.to(z.dtype)


@HEADS.register("whitening", schema=WhiteningConfig, capabilities=Whitening.capabilities)
def build(cfg: WhiteningConfig, dim: int) -> Whitening:
    """Build an unfitted whitening head for `dim`-wide vectors (the head stage fits it)."""
    return Whitening(dim, cfg.eps)
