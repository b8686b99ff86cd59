"""ColBERT's late interaction as pure functions (white-box paper Eq. 1).

s(q, d) = sum_i C*_i, C*_i = max_j C_ij, C_ij the cosine of query token i and passage token j (vectors already unit
length), padding masked out.

One implementation for the ranker's scores (rankers/colbert.py), end-to-end re-scoring (through the ranker) and
the analyses (white-box C*_id and exact matches, vocabulary re-ranking).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["c_star", "maxsim_all", "maxsim_pairs"]


def c_star(sim: Tensor, d_mask: Tensor) -> Tensor:
    """C*_i = max_j C_ij over real passage tokens: `sim` [..., Lq, Ld], `d_mask` (bool) broadcastable to it."""
    return sim.masked_fill(~d_mask, float("-inf")).max(dim=-1).values


def maxsim_pairs(qn: Tensor, q_mask: Tensor, dn: Tensor, d_mask: Tensor) -> Tensor:
    """Query i against passage i: qn [B, Lq, D], dn [B, Ld, D], masks [B, L] -> [B]."""
    best = c_star(torch.einsum("bid,bjd->bij", qn, dn), d_mask[:, None, :])  # [B, Lq]
    return (best * q_mask.to(best.dtype)).sum(-1)


def maxsim_all(qn: Tensor, q_mask: Tensor, dn: Tensor, d_mask: Tensor) -> Tensor:
    """Every query against every passage: qn [Bq, Lq, D], dn [Bd, Ld, D] -> [Bq, Bd]."""
    best = c_star(torch.einsum("qid,pjd->qpij", qn, dn), d_mask[None, :, None, :])  # [Bq, Bd, Lq]
    return (best * q_mask[:, None, :].to(best.dtype)).sum(-1)
