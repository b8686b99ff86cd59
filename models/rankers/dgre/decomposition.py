"""Mutual information decomposition layer (DGRe paper section 3.3.3, Eq. 13-15).

The refined words Z^l = [Z_[CLS], Z_q, Z_[SEP], Z_d, Z_[SEP]] (Eq. 13) are split on the query / document segments.
"Based on query word representations Z_q, we use a sigmoid function to decide the probability that this document
word is important for the current query word", P = sigmoid((W_1 Z_q)(W_2 Z_d)^T) in [0, 1]^{m x n}, and the document
words are decomposed into a query-related and a query-unrelated part:

    Z_dr = P Z_d,        Z_du = (1 - P) Z_d                                                    (Eq. 14-15)

both [m, d]: row i is the document as seen from query word i. Only Z_dr enters the prediction (E_Z[Z] = 1 x Z_dr
+ 0 x Z_du); Z_du exists for the mutual information terms (mi.py).

Defaults are Eq. 14-15 as printed: `norm="sum"` (the product P Z_d) and `scale=False` (raw dot products in the
sigmoid). Two switches (the ranker's `decomposition_norm`, `attention_scale`; both on in
configs/model/dgre_tuned.yaml): `norm="mean"` divides both products by the number n of document words, so that
Z_dr + Z_du is the mean document word for every query word whatever the document's length (the printed sum grows
with n, and with it the scale of everything downstream); `scale=True` divides the logits of P by sqrt(d) (as
Eq. 5), since sigmoid of raw d = 384 dot products is 0 or 1 almost everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

DECOMPOSITION_NORMS = ("mean", "sum")


@dataclass
class Decomposed:
    """The decomposition layer's output (Eq. 14-15): Z_dr, Z_du, the query rows Z_q and P, rows aligned to tokens."""

    related: Tensor  # Z_dr [B, L, d], rows of query words (others 0)
    unrelated: Tensor  # Z_du [B, L, d], likewise
    query: Tensor  # Z_q [B, L, d], the refined query words (others 0)
    query_mask: Tensor  # [B, L] bool: the rows that are query words
    importance: Tensor  # P [B, L, L], non-zero only for (query word, document word)


class Decomposition(nn.Module):
    """The mutual information decomposition layer, Eq. 14-15: P = sigmoid((W_1 Z_q)(W_2 Z_d)^T), Z_dr, Z_du.

    `norm` and `scale` are the two switches of the module docstring ("sum" and False: as printed).
    """

    def __init__(self, dim: int, norm: str = "sum", scale: bool = False):
        super().__init__()
        if norm not in DECOMPOSITION_NORMS:
            raise ValueError(f"unknown decomposition norm {norm!r}; expected one of {DECOMPOSITION_NORMS}")
        self.w_1 = nn.Linear(dim, dim, bias=False)
        self.w_2 = nn.Linear(dim, dim, bias=False)
        self.norm = norm
        self.scale = 1.0 / math.sqrt(dim) if scale else 1.0

    def forward(self, z: Tensor, query: Tensor, doc: Tensor) -> Decomposed:
        """z: Z^l [B, L, d]; query / doc: [B, L] bool word masks (masking.segments)."""
        pair = (query[:, :, None] & doc[:, None, :]).to(z.dtype)
        p = torch.sigmoid(torch.einsum("bid,bjd->bij", self.w_1(z), self.w_2(z)) * self.scale) * pair
        zero_d = z * doc[:, :, None].to(z.dtype)
        related = torch.bmm(p, zero_d)
        unrelated = torch.bmm(pair - p, zero_d)
        if self.norm == "mean":
            n = doc.sum(1).clamp_min(1).to(z.dtype)[:, None, None]
            related, unrelated = related / n, unrelated / n
        return Decomposed(related, unrelated, z * query[:, :, None].to(z.dtype), query, p)


__all__ = ["Decomposition", "Decomposed", "DECOMPOSITION_NORMS"]
