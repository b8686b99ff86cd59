"""Kernel pooling over a cosine match matrix (Xiong et al. 2017; position-bias paper Eq. 5-6, TK's scoring).

    K^k_ij = exp( -(cos(q_i, p_j) - mu_k)^2 / (2 sigma^2) )                  (Eq. 5)
    phi_k  = sum_{i=1..|q|} log( sum_{j=1..|p|} K^k_ij )                    (Eq. 6, before the linear layer W_s)

Padding takes no part on either side: a padded passage term adds nothing to the inner sum, a padded query term
nothing to the outer one. The inner sum is floored at `MIN_SOFT_TF` before the log: with sigma = 0.1 a kernel far
from every similarity of a query term gets exp(-200)-sized activations, which are 0 in float32 and would give
log 0 = -inf (the authors' TK code floors it the same way, at 1e-10). It is the one departure from Eq. 6 as
printed, and only for kernels that would otherwise contribute -inf or below log(1e-10) = -23.
"""

from __future__ import annotations

import torch
from torch import Tensor

MIN_SOFT_TF = 1e-10


def kernel_means(n: int) -> Tensor:
    """Return the paper's kernel centres: `n` means evenly from -1 to +1 (11 kernels: -1.0, -0.8, ..., 1.0)."""
    if n < 2:
        raise ValueError(f"kernel pooling needs at least 2 kernels to span -1..1, got {n}")
    return torch.linspace(-1.0, 1.0, n, dtype=torch.float64).float()


def kernel_pooling(cos: Tensor, q_mask: Tensor, d_mask: Tensor, mu: Tensor, sigma: float) -> Tensor:
    """Eq. 5-6 up to W_s: [..., Lq, Ld] cosines -> [..., K] log-sum kernel features.

    `q_mask` [..., Lq] and `d_mask` [..., Ld] (True on real terms) broadcast against `cos`'s leading dims, so one
    call scores aligned pairs ([B, Lq, Ld] with [B, Lq], [B, Ld]) or every query against every passage
    ([Bq, Bd, Lq, Ld] with [Bq, 1, Lq], [1, Bd, Ld]).
    """
    k = torch.exp(-((cos.unsqueeze(-1) - mu) ** 2) / (2 * sigma**2))  # [..., Lq, Ld, K]  (Eq. 5)
    # where, not a product: a non-finite value in a padded slot must not reach the sums (0 * nan = nan)
    k = torch.where(d_mask[..., None, :, None], k, torch.zeros((), dtype=k.dtype, device=k.device))
    soft_tf = k.sum(-2)  # [..., Lq, K]: sum over passage terms j
    log_tf = torch.log(soft_tf.clamp_min(MIN_SOFT_TF))
    log_tf = torch.where(q_mask[..., None], log_tf, torch.zeros((), dtype=log_tf.dtype, device=log_tf.device))
    return log_tf.sum(-2)  # [..., K]: sum over query terms i


__all__ = ["MIN_SOFT_TF", "kernel_means", "kernel_pooling"]
