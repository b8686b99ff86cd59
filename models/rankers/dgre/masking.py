"""The disentangled word graph of DGRe (paper section 3.3.2, Eq. 7-10) and the query / document segments it needs.

Input: the attention-like scores S = (W_Q E)(W_K E)^T / sqrt(d_k) of one transformer layer (Eq. 5 before its
softmax, Eq. 8 inside the ReLU) for each [CLS] q [SEP] d [SEP] sequence, [B, L, L]. Output: the graph A~ [B, L, L]
over which the GGNN propagates (Eq. 11), one row per word, each row a distribution over that word's neighbours
(or all zeros when the word has none left).

Three masking strategies (`model.masking`, the rows of the paper's Table 3):

- `none`: "keep all the word relations": A~ = softmax(S) over the real tokens of the sequence (padding excluded),
  i.e. the attention distribution itself.
- `heuristic`: "only keep the relations between the query and document words as Eq. (7)": softmax of S over the
  entries with M_ij = 1 (query <-> document, and i = j); every other entry is exactly 0.
- `adaptive`: Eq. 8-10. G = ReLU(S . M) (M of Eq. 7) removes the same entries and, on top, every relation with a
  negative score ("ReLU is introduced to filter all possible spurious relations with the word similarity smaller
  than 0"); G is divided by its infinite norm ("to avoid overflow") and each row goes through the modified softmax
  of Eq. 9, softmax_m(x)_i = (exp(x_i) - 1) 1[x_i != 0] / sum_j (exp(x_j) - 1) 1[x_j != 0], which gives exactly 0
  to the filtered entries.

Readings of the OCR'd equations (each a choice where the text is garbled):
- Eq. 7 indexes the sequence from 0: [CLS] = 0, query words 1..m, [SEP] = m+1, document words m+2..m+n+1, and the
  last [SEP]. M_ij = 1 for a query word i and a document word j (and j, i: "according to the symmetry of M its
  down-triangle matrix is filled") and for i = j. We take the document side without the final [SEP] (the OCR's
  upper bound m+n+2 would add it); [CLS] and the [SEP]s keep only their self-loop.
- Eq. 8 reads "ReLU( (W_Q E)(W_K E)^T / sqrt(d_k) ... eps ... M )" with "eps small enough". Whether the mask
  multiplies the scores or subtracts (1 - M)/eps from them, the masked entries leave the ReLU as exactly 0 (for
  any eps below 1/max S), so both readings give the same G; we apply M with `torch.where` (exact for any scores).
- Multi-head layers: S is the mean over heads of the per-head scaled scores (one graph per pair; the paper writes
  one W_Q, W_K).
- "Infinite norm" (Eq. 10): `entry` (default) = the largest |G_ij| of the pair's matrix, so the entries land in
  [0, 1] and exp() cannot overflow; `row` = each row by its own largest entry (softmax_m works row by row);
  `induced` = the matrix norm max_i sum_j |G_ij|. A matrix (or row) of zeros is left at zero.
- A row with no non-zero entry (every relation of the word filtered) has no neighbours: its row of A~ is 0 and
  the word gets no message in Eq. 11 (0/0 is never formed).
"""

from __future__ import annotations

import torch
from torch import Tensor

MASKINGS = ("none", "heuristic", "adaptive")
INF_NORMS = ("entry", "row", "induced")


def segments(input_ids: Tensor, attention_mask: Tensor, sep_token_id: int) -> tuple[Tensor, Tensor]:
    """Return (query word mask, document word mask), each [B, L] bool, of `[CLS] q [SEP] d [SEP]` sequences.

    Padding comes after the last [SEP]; query words lie between [CLS] (position 0) and the first [SEP], document words
    between the first and the second [SEP]. Derived from the [SEP] positions, so it holds with or without token type
    ids.
    """
    real = attention_mask.bool()
    is_sep = (input_ids == sep_token_id) & real
    seps_before = torch.cumsum(is_sep.long(), dim=1) - is_sep.long()  # [SEP]s strictly before each position
    position = torch.arange(input_ids.shape[1], device=input_ids.device)
    query = real & ~is_sep & (seps_before == 0) & (position > 0)
    doc = real & ~is_sep & (seps_before == 1)
    return query, doc


def heuristic_mask(query: Tensor, doc: Tensor, attention_mask: Tensor) -> Tensor:
    """M of Eq. 7, [B, L, L] bool: query <-> document word pairs (both directions) and the diagonal of real tokens."""
    q, d = query[:, :, None], doc[:, :, None]
    bipartite = (q & doc[:, None, :]) | (d & query[:, None, :])
    real = attention_mask.bool()
    eye = torch.eye(query.shape[1], dtype=torch.bool, device=query.device)[None] & real[:, :, None]
    return bipartite | eye


def adaptive_scores(scores: Tensor, mask: Tensor) -> Tensor:
    """G of Eq. 8: ReLU of the scores on the entries of M, exactly 0 elsewhere."""
    return torch.relu(torch.where(mask, scores, torch.zeros((), dtype=scores.dtype, device=scores.device)))


def infinity_normalise(g: Tensor, norm: str = "entry") -> Tensor:
    """G / ||G||_inf (Eq. 10), for G >= 0 of shape [B, L, L]; see the module docstring for the three readings."""
    if norm == "entry":
        scale = g.abs().amax(dim=(1, 2), keepdim=True)
    elif norm == "row":
        scale = g.abs().amax(dim=2, keepdim=True)
    elif norm == "induced":
        scale = g.abs().sum(dim=2).amax(dim=1)[:, None, None]
    else:
        raise ValueError(f"unknown infinite norm {norm!r}; expected one of {INF_NORMS}")
    return g / torch.where(scale > 0, scale, torch.ones_like(scale))


def modified_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """softmax_m of Eq. 9 along `dim`: (exp(x_i) - 1) 1[x_i != 0] / sum_j (exp(x_j) - 1) 1[x_j != 0].

    For x >= 0 (what Eq. 8's ReLU produces) the weights are >= 0, exactly 0 where x_i = 0, and sum to 1 over the
    non-zero entries; a vector of zeros maps to zeros. expm1 keeps small entries accurate (exp(x) - 1 would lose
    them to rounding).
    """
    w = torch.where(x != 0, torch.expm1(x), torch.zeros((), dtype=x.dtype, device=x.device))
    total = w.sum(dim=dim, keepdim=True)
    return w / torch.where(total != 0, total, torch.ones_like(total))


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax of each row over its entries with mask = True, exactly 0 elsewhere (and rows without any: 0)."""
    neg = torch.finfo(scores.dtype).min
    p = torch.softmax(torch.where(mask, scores, torch.full((), neg, dtype=scores.dtype, device=scores.device)), dim=-1)
    return torch.where(mask, p, torch.zeros((), dtype=p.dtype, device=p.device))


def disentangled_graph(
    scores: Tensor, query: Tensor, doc: Tensor, attention_mask: Tensor, masking: str = "adaptive", norm: str = "entry"
) -> Tensor:
    """Build the graph A~ [B, L, L] from the scores S [B, L, L] under `masking` (module docstring).

    `masking`: none | heuristic | adaptive; `norm`: the infinite norm of Eq. 10 (adaptive only).
    """
    real = attention_mask.bool()
    if masking == "none":
        return masked_softmax(scores, real[:, :, None] & real[:, None, :])
    mask = heuristic_mask(query, doc, attention_mask)
    if masking == "heuristic":
        return masked_softmax(scores, mask)
    if masking == "adaptive":
        return modified_softmax(infinity_normalise(adaptive_scores(scores, mask), norm))
    raise ValueError(f"unknown masking {masking!r}; expected one of {MASKINGS}")


__all__ = [
    "MASKINGS",
    "INF_NORMS",
    "segments",
    "heuristic_mask",
    "adaptive_scores",
    "infinity_normalise",
    "modified_softmax",
    "masked_softmax",
    "disentangled_graph",
]
