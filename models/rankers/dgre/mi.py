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
How many rows are query words only the device knows: the rows come in a fixed-size block with a `valid` flag each,
and the estimates weigh them by it (`marginal_pairs`), so that no step waits for the host to learn the count.
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

from models.gradients import reverse_gradient


def donsker_varadhan(joint: Tensor, marginal: Tensor, weight: Tensor | None = None) -> Tensor:
    """mean(T_joint) - log mean(exp T_marginal), in float32 (logsumexp keeps exp from overflowing).

    `weight` [N] bool keeps only its rows (the same in both); with fewer than 2 rows the estimate is 0 (one row is its
    own marginal), decided on the device.
    """
    joint, marginal = joint.float(), marginal.float()
    if weight is None:
        return joint.mean() - (torch.logsumexp(marginal, dim=0) - math.log(marginal.shape[0]))
    n = weight.sum().float()
    mean_joint = torch.where(weight, joint, 0.0).sum() / n.clamp(min=1.0)
    # the lowest float, not -inf: with no row at all the (discarded) value stays finite, and so do its gradients
    log_mean_exp = (
        torch.logsumexp(marginal.masked_fill(~weight, torch.finfo(marginal.dtype).min), 0) - n.clamp(min=1.0).log()
    )
    return torch.where(n > 1, mean_joint - log_mean_exp, 0.0)


def marginal_pairs(valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Pair the `valid` rows with a random permutation of themselves, in fixed-size tensors (no host sync).

    valid: [N] bool. Returns (rows, partners, kept), each [N]: the first n = valid.sum() entries of `rows` are the
    valid rows in order, those of `partners` the same rows in a uniformly random order (drawn from the global torch
    RNG), and `kept` marks those first n entries; the entries after them pair invalid rows, to be weighed 0.

    >>> torch.manual_seed(0) and None
    >>> rows, partners, kept = marginal_pairs(torch.tensor([True, False, True, True, False]))
    >>> rows[:3].tolist(), sorted(partners[:3].tolist()), kept.tolist()
    ([0, 2, 3], [0, 2, 3], [True, True, True, False, False])
    """
    n = valid.sum()
    rows = torch.argsort((~valid).to(torch.uint8), stable=True)  # valid rows first, in their order
    keys = torch.rand(valid.shape[0], device=valid.device).masked_fill(~valid, 2.0)  # invalid rows sort last
    partners = torch.argsort(keys)
    return rows, partners, torch.arange(valid.shape[0], device=valid.device) < n


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

    def forward(self, x: Tensor, y: Tensor, permutation: Tensor, weight: Tensor | None = None) -> Tensor:
        """DV estimate from joint samples (x_i, y_i) and marginal samples (x_i, y_perm(i)); x, y: [N, d].

        `weight` [N] bool: only these i count (donsker_varadhan).
        """
        return donsker_varadhan(self.statistic(x, y), self.statistic(x, y[permutation]), weight)


class MutualInformation(nn.Module):
    """The three estimators of Eq. 22-24 and the training surrogate (module docstring)."""

    def __init__(self, dim: int, hidden: int = 128):
        super().__init__()
        self.related_unrelated = MINE(dim, dim, hidden)  # L_ru, Eq. 22
        self.query_unrelated = MINE(dim, dim, hidden)  # L_qu, Eq. 23
        self.query_related = MINE(dim, dim, hidden)  # L_qr, Eq. 24

    def forward(
        self,
        query: Tensor,
        related: Tensor,
        unrelated: Tensor,
        permutation: Tensor | None = None,
        valid: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Return (surrogate loss, estimates) of rows `query`, `related`, `unrelated` [N, d] of the same N words.

        `valid` [N] bool: which rows are query words (the others are left out, with no host sync: marginal_pairs);
        None: all are. `permutation` (tests): the marginal partner of each row, for `valid=None` only.
        """
        weight = None
        if valid is not None:
            if permutation is not None:
                raise ValueError("MutualInformation: pass a permutation or valid rows, not both")
            rows, permutation, weight = marginal_pairs(valid)
            query, related, unrelated = query[rows], related[rows], unrelated[rows]
            permutation = torch.argsort(rows)[permutation]  # partners as positions in the reordered rows
        elif permutation is None:
            permutation = torch.randperm(query.shape[0], device=query.device)
        rev = reverse_gradient
        ru = self.related_unrelated(rev(related), rev(unrelated), permutation, weight)
        qu = self.query_unrelated(rev(query), rev(unrelated), permutation, weight)
        qr = self.query_related(query, related, permutation, weight)
        estimates = {"mi": (ru + qu - qr).detach(), "mi_ru": ru.detach(), "mi_qu": qu.detach(), "mi_qr": qr.detach()}
        return -(ru + qu + qr), estimates


__all__ = ["MINE", "MutualInformation", "donsker_varadhan", "marginal_pairs"]
