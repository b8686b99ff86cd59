"""Triangle distance (DGRe paper section 3.4.1, Eq. 18-21).

These are auxiliary losses on the representations of a query, its relevant document d+ and its non-relevant document
d- (one training triplet).

Cosine distance (Eq. 18), l(a, b) = 1 when a and b have the same label, else 0:

    s(x_a, x_b) = 1 - (2 l(a, b) - 1) cos(x_a, x_b)       = 1 - cos  (same label),  1 + cos  (different labels)

(the OCR reads "1 + 2l(a,b) cos"; this is the reading under which equal labels pull together and different labels
push apart, which is what the text says the distance is for: "to make examples with different labels separated").

Pointwise (Eq. 19): between the query words E_q and the document words E_d of the last transformer layer E^L of
each pair, the query and a relevant document having the same label: s(E_q, E_d+; l = 1) and s(E_q, E_d-; l = 0),
E_q and E_d being the mean over the segment's words (the cosine of Eq. 18 takes vectors); averaged over the two
documents of the triplet ("1/n_q sum_j").

Pairwise (Eq. 20, lost in the OCR except its description): "treating each query-document pair as an instance, we
define the distance between query-document representations with different labels as this cosine distance ...
computed for transformer and mutual information decomposition layer, respectively, whose query-document
representations are e_qd = E^L(0)" (and the pooled query-related part Z_dr for the decomposition layer): the
summation s(e_qd+, e_qd-; l = 0) over the two layers.

Triangle (Eq. 21): C_triangle = C_point + C_pair. Each is averaged over the triplets of the batch.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

DISTANCES = ("none", "point", "pair", "triangle")


def cosine_distance(a: Tensor, b: Tensor, same_label: Tensor | bool) -> Tensor:
    """Eq. 18 row by row: a, b [N, d], same_label [N] bool (or one bool for all rows) -> [N]."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-8)
    # a Python bool stays on the host: torch.as_tensor(True, device="cuda") would be a copy that waits for the device
    sign = (1.0 if same_label else -1.0) if isinstance(same_label, bool) else 2.0 * same_label.to(cos.dtype) - 1.0
    return 1.0 - sign * cos


def point_distance(query_pos: Tensor, doc_pos: Tensor, query_neg: Tensor, doc_neg: Tensor) -> Tensor:
    """Compute C_point (Eq. 19) per triplet [B].

    The query words are set against the relevant (l = 1) and non-relevant (l = 0) document's words, each side pooled;
    query_* / doc_* [B, d] from the pair with d+ / d-.
    """
    return 0.5 * (cosine_distance(query_pos, doc_pos, True) + cosine_distance(query_neg, doc_neg, False))


def pair_distance(pos_reprs: list[Tensor], neg_reprs: list[Tensor]) -> Tensor:
    """Compute C_pair (Eq. 20) per triplet [B]: the sum over layers of s(e_qd+, e_qd-; l = 0).

    Each list holds one [B, d] representation per layer (E^L(0), pooled Z_dr).
    """
    return sum(cosine_distance(p, n, False) for p, n in zip(pos_reprs, neg_reprs))


def distance_loss(
    kind: str, point: tuple[Tensor, Tensor, Tensor, Tensor], pos_reprs: list[Tensor], neg_reprs: list[Tensor]
) -> Tensor | None:
    """Return the batch mean of C_point, C_pair or C_triangle (Eq. 21) for `kind` (none -> None)."""
    if kind == "none":
        return None
    if kind not in DISTANCES:
        raise ValueError(f"unknown distance {kind!r}; expected one of {DISTANCES}")
    total = 0.0
    if kind in ("point", "triangle"):
        total = total + point_distance(*point)
    if kind in ("pair", "triangle"):
        total = total + pair_distance(pos_reprs, neg_reprs)
    return total.mean()


__all__ = ["DISTANCES", "cosine_distance", "point_distance", "pair_distance", "distance_loss"]
