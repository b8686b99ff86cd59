"""The pieces of ColBERT's score (white-box paper Eq. 1) for one query against its candidate set S_q.

    s(q, d) = sum_{i in q} max_{j in d} cos(E_qi, E_dj) = sum_i max_j C_ij = sum_i C*_id

from the ranker's own vectors (`ColBERT.scoring_vectors`: unit length, so a dot product is the cosine), and which
document token each query token matches: "query token i matches the document token j* if C_ij* = C*_id", d*_i.
Query token i matches *exactly* in d (d*_i -> t, the t of Eq. 2) when d*_i is the same WordPiece token as i; when
several j attain the maximum, one of them being the same token is enough (exact ties of cosines are rare but
possible for repeated text). Padding takes part in neither the max nor the sum; [CLS]/[SEP] rows and columns do,
as in the ranker's score.

Removing a word from Eq. 1 (section 3: "we remove from the sum in Equation (1) all the contributions of subwords
that compose the word") is then `score - c_star[rows].sum(0)`: no re-encoding, the context of the other tokens is
the one the full query gave them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from models.rankers.maxsim import c_star


@dataclass
class MaxSim:
    """C*_id of Eq. 1 for every query token and candidate, and which of those maxima are exact matches."""

    c_star: Tensor  # [Lq, n] C*_id
    exact: Tensor  # [Lq, n] bool: d*_i is the same token as query token i

    @property
    def score(self) -> Tensor:
        """s(q, d) for every candidate: [n] (Eq. 1)."""
        return self.c_star.sum(0)

    def without(self, rows: list[int]) -> Tensor:
        """s(q, d) with the rows of the given query token positions removed from the sum: [n]."""
        return self.score - self.c_star[rows].sum(0)


def max_sim(q_vecs: Tensor, q_ids: Tensor, d_vecs: Tensor, d_mask: Tensor, d_ids: Tensor) -> MaxSim:
    """Compute Eq. 1's C*_id and the exact matches of one query against its candidates.

    q_vecs [Lq, D], q_ids [Lq] (real tokens only, unit vectors); d_vecs [n, Ld, D], d_mask [n, Ld] bool,
    d_ids [n, Ld]. C_ij in float32 whatever the storage type.
    """
    sim = torch.einsum("id,njd->inj", q_vecs.float(), d_vecs.float())  # [Lq, n, Ld] = C_ij per candidate
    valid = d_mask[None, :, :]
    best = c_star(sim, valid)
    same = (d_ids[None, :, :] == q_ids[:, None, None]) & valid
    exact_best = c_star(sim, same)  # the best similarity among the passage's copies of query token i
    return MaxSim(c_star=best, exact=same.any(-1) & (exact_best == best))
