"""Mutual information regularisation of the decomposition layer (DGRe paper section 3.4.2, Eq. 22-24).

The decomposition should (1) minimise the dependency between the query-related and the query-unrelated document
parts, I(Z_dr; Z_du) (Eq. 22); (2) minimise the dependency between the query and the unrelated part,
I(Z_q; Z_du) (Eq. 23); (3) maximise the dependency between the query and the related part, I(Z_q; Z_dr) (Eq. 24):

    L_mi = L_ru + L_qu - L_qr

Each I is estimated with MINE (Belghazi et al. 2018), the Donsker-Varadhan dual of the KL divergence between the
joint and the product of the marginals, through a statistics network T_phi:

    I(X; Y) >= I_phi = E_joint[T_phi(x, y)] - log E_marginal[exp T_phi(x, y')]

Samples: one per query word of every (query, document) pair in the batch: (Z_q[i], Z_dr[i], Z_du[i]) are the rows
of query word i (decomposition.py), the joint samples; the marginal pairs y' are the same rows under one random
permutation of the batch's samples (drawn from the global torch RNG, so seeded and restored on resume), as in MINE.
The OCR of Eq. 22-24 is lost; this is the estimator the text names ("approximate the mutual information in the dual
representation of KL-divergence, which is proposed by MINE").

Training. MINE is a min-max problem: T_phi must tighten its bound (maximise I_phi) while the encoder minimises the
estimates of (1) and (2) and maximises (3). One loss does both through a gradient reversal layer on the inputs of
the two minimised estimators:

    surrogate = -( I_ru(R(Z_dr), R(Z_du)) + I_qu(R(Z_q), R(Z_du)) + I_qr(Z_q, Z_dr) )

R is the identity forward and negates gradients backward, so every T_phi ascends its bound and the encoder
descends L_ru and L_qu and ascends L_qr: the gradient the encoder receives is that of L_mi. The value logged as
`mi` is L_mi = I_ru + I_qu - I_qr itself. (MINE's moving-average correction of the biased gradient of the log term
is not used; the paper does not mention it.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class _Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


def reverse_gradient(x: Tensor) -> Tensor:
    """Identity forward, negated gradient backward."""
    return _Reverse.apply(x)


def donsker_varadhan(joint: Tensor, marginal: Tensor) -> Tensor:
    """mean(T_joint) - log mean(exp T_marginal), in float32 (logsumexp keeps exp from overflowing)."""
    joint, marginal = joint.float(), marginal.float()
    return joint.mean() - (torch.logsumexp(marginal, dim=0) - math.log(marginal.shape[0]))


class MINE(nn.Module):
    """The statistics network T_phi(x, y) = MLP([x; y]) -> R and its DV estimate of I(X; Y).

    The output layer has no bias: the DV bound is unchanged by adding a constant to T, so such a bias would never get a
    gradient.
    """

    def __init__(self, dim_x: int, dim_y: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim_x + dim_y, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1, bias=False),
        )

    def statistic(self, x: Tensor, y: Tensor) -> Tensor:
        """Return T_phi(x_i, y_i) for each row: x [N, dim_x], y [N, dim_y] -> [N]."""
        return self.net(torch.cat([x, y], dim=-1)).squeeze(-1)

    def forward(self, x: Tensor, y: Tensor, permutation: Tensor) -> Tensor:
        """DV estimate from joint samples (x_i, y_i) and marginal samples (x_i, y_perm(i)); x, y: [N, d]."""
        return donsker_varadhan(self.statistic(x, y), self.statistic(x, y[permutation]))


class MutualInformation(nn.Module):
    """The three estimators of Eq. 22-24 and the training surrogate (module docstring)."""

    def __init__(self, dim: int, hidden: int = 128):
        super().__init__()
        self.related_unrelated = MINE(dim, dim, hidden)  # L_ru, Eq. 22
        self.query_unrelated = MINE(dim, dim, hidden)  # L_qu, Eq. 23
        self.query_related = MINE(dim, dim, hidden)  # L_qr, Eq. 24

    def forward(
        self, query: Tensor, related: Tensor, unrelated: Tensor, permutation: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """query, related, unrelated: [N, d] rows of the same N query words. Returns (surrogate loss, estimates)."""
        if permutation is None:
            permutation = torch.randperm(query.shape[0], device=query.device)
        rev = reverse_gradient
        ru = self.related_unrelated(rev(related), rev(unrelated), permutation)
        qu = self.query_unrelated(rev(query), rev(unrelated), permutation)
        qr = self.query_related(query, related, permutation)
        estimates = {"mi": (ru + qu - qr).detach(), "mi_ru": ru.detach(), "mi_qu": qu.detach(), "mi_qr": qr.detach()}
        return -(ru + qu + qr), estimates


__all__ = ["MINE", "MutualInformation", "donsker_varadhan", "reverse_gradient"]
