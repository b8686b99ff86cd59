"""Average term similarity per positional delta (ATS) and its mean drop (MATS).

Position-bias paper section 5, Eq. 8-9 (shared/papers/position-bias-passage-reranking.txt):

    ATS(da)  = 1/|T| sum_{t in T} 1/|C_{t,da}| sum_{(r^t_a1, r^t_a2) in C_{t,da}} cos(r^t_a1, r^t_a2)        (Eq. 8)
    C_{t,da} = {(r^t_a1, r^t_a2) : da = |a1 - a2|, occurrences of t in different passages}
    MATS     = 1/(max(da) - 1) * sum_{i = 1}^{max(da)} ( ATS(0) - ATS(i) )                                  (Eq. 9)

MATS, as printed and as computed (`mats_from_curve`; the switch `eval.mats`, `MATS_MODES`):
- The paper prints Eq. 9 with the factor 1/(max(da) - 1) in front of a sum over i = 1 .. max(da), i.e. max(da)
  terms over max(da) - 1: not quite a mean (the text calls MATS "the mean ATS difference to the first point").
- `paper` (default) computes the printed formula: with I = the deltas i in 1 .. max(da) at which ATS(i) has a value
  (at least one pair) and K = |I|,
      MATS_paper = 1/(K - 1) * sum_{i in I} ( ATS(0) - ATS(i) ),
  where max(da) is the largest delta with a value (after `max_delta`). When every delta 1 .. max(da) has pairs
  (the usual case; gaps appear only in thin samples, near the longest passages' length), K = max(da) and this is
  Eq. 9 verbatim. A delta without any pair has no ATS(i), so it is left out of the sum and K counts only the deltas
  summed (the printed factor applied to the deltas present); counting it in max(da) instead would score it as a
  zero drop, i.e. as unbiased. K = 1 gives 1/0: NaN.
- `mean` (our earlier reading): MATS_mean = 1/K * sum_{i in I} ( ATS(0) - ATS(i) ), the plain mean drop. So
  MATS_paper = MATS_mean * K / (K - 1), higher by 1/(K - 1): 0.5 % at K = 200, 3.6 % at K = 29.
- `mats_std` (both switches) is the standard deviation over i in I of the drops ATS(0) - ATS(i) (population std,
  1/K), around their mean MATS_mean: how uneven the curve's fall is (our reading of Table 2's "Std.dev." column,
  which the paper does not define).

Conventions taken here (the paper leaves them open):
- A pair is two occurrences of the same term in *different* passages ("occurrences of the same term t across
  different passages"), counted once (unordered; cos is symmetric, so the mean is that of ordered pairs).
- T in Eq. 8 is, for each da, the terms that have at least one pair at that delta (a term with no pair at da has
  no mean to average), so ATS(da) is the mean over those terms of their per-term mean cosine.
- Occurrences per term are capped at `max_occurrences` by a seeded uniform sample (Zipf: a few terms hold most
  tokens, and their pairs grow quadratically). Input order does not matter: occurrences are first put in
  (passage, position) order, so the sample is the same whatever order (or DDP rank) they came from.
- `std` per delta is the standard deviation of the pooled pair cosines at that delta (the shaded band of the
  paper's Figure 2, "standard deviation of same-term occurrences"); `mats_std` is that of the drops (above).

Computation: every term's (sampled) occurrences form one row of a padded [terms, m, d] batch, grouped into buckets
of m = powers of two so that padding stays below half, and one batched matrix product gives all its pair cosines;
the per-(term, delta) sums are reduced with `torch.unique` + `index_add` in float64. No Python loop runs over pairs
or terms, only over buckets and memory-bounded chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

__all__ = ["ATSResult", "MATS_MODES", "average_term_similarity", "mats_from_curve", "AverageTermSimilarity"]

# `eval.mats`: Eq. 9 as printed, 1/(K - 1) * sum of K drops (default) | the plain mean of the K drops
MATS_MODES = ("paper", "mean")

# Bound on one chunk's [terms, m, m] pair tensor (float64: 64 MiB).
_CHUNK_PAIRS = 2**23


@dataclass
class ATSResult:
    """ATS per delta 0 .. max_delta (NaN where no pair), and the summaries of Eq. 9."""

    ats: np.ndarray  # [D+1] float64, Eq. 8
    std: np.ndarray  # [D+1] std of the pooled pair cosines
    terms: np.ndarray  # [D+1] terms with a pair at the delta
    pairs: np.ndarray  # [D+1] pairs at the delta
    mats: float  # Eq. 9, as `mats_mode` computes it
    mats_std: float  # std of the drops ATS(0) - ATS(i) over the deltas i >= 1 with a value (either mode)
    occurrences: int  # occurrences used (after the cap)
    vocabulary: int  # terms with at least two of them
    mats_mode: str = "paper"  # MATS_MODES

    @property
    def deltas(self) -> np.ndarray:
        """Return the positional deltas 0 .. max_delta that `ats`, `std`, `terms` and `pairs` are indexed by."""
        return np.arange(len(self.ats))

    def to_dict(self) -> dict:
        """Return the result as JSON-ready plain types, NaN written as None (JSON has no NaN)."""
        nan = lambda x: None if not math.isfinite(x) else float(x)  # noqa: E731 - JSON has no NaN
        return {
            "mats": nan(self.mats),
            "mats_std": nan(self.mats_std),
            "mats_mode": self.mats_mode,
            "ats0": nan(float(self.ats[0])) if len(self.ats) else None,
            "occurrences": self.occurrences,
            "vocabulary": self.vocabulary,
            "delta": self.deltas.tolist(),
            "ats": [nan(float(v)) for v in self.ats],
            "std": [nan(float(v)) for v in self.std],
            "terms": self.terms.tolist(),
            "pairs": self.pairs.tolist(),
        }


def mats_from_curve(ats: np.ndarray, mode: str = "paper") -> tuple[float, float]:
    """Return (MATS, mats_std) of an ATS curve (index = delta) by Eq. 9 over the K deltas i >= 1 that have a value.

    `paper` = sum of the K drops ATS(0) - ATS(i) / (K - 1) (the printed 1/(max(da) - 1); NaN for K = 1), `mean` =
    their mean; mats_std = their standard deviation (1/K) in both modes. See the module doc.
    """
    if mode not in MATS_MODES:
        raise ValueError(f"MATS mode {mode!r}; expected one of {list(MATS_MODES)}")
    ats = np.asarray(ats, dtype=np.float64)
    if len(ats) < 2 or not math.isfinite(ats[0]):
        return math.nan, math.nan
    drops = ats[0] - ats[1:]
    drops = drops[np.isfinite(drops)]
    k = len(drops)
    if k == 0:
        return math.nan, math.nan
    if mode == "mean":
        mats = float(drops.mean())
    else:
        mats = float(drops.sum() / (k - 1)) if k > 1 else math.nan
    return mats, float(drops.std())


def _sample(terms: Tensor, positions: Tensor, passages: Tensor, cap: int | None, seed: int) -> Tensor:
    """Return the indices of the kept occurrences, grouped by term (terms ascending), at most `cap` per term.

    Each term's occurrences are a uniform seeded sample; independent of the input order.
    """
    canon = torch.from_numpy(np.lexsort((positions.numpy(), passages.numpy(), terms.numpy())))
    if cap is None:
        return canon
    gen = torch.Generator().manual_seed(int(seed))
    priority = torch.rand(len(canon), generator=gen, dtype=torch.float64)
    # stable sort by term of a random order = each term's occurrences in random order
    shuffled = canon[torch.argsort(priority)]
    order = shuffled[torch.sort(terms[shuffled], stable=True).indices]
    t = terms[order]
    _, counts = torch.unique_consecutive(t, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(t)) - torch.repeat_interleave(starts, counts)
    return order[rank < cap]


def average_term_similarity(
    vectors,
    terms,
    positions,
    passages,
    max_occurrences: int | None = 100,
    seed: int = 0,
    max_delta: int | None = None,
    mats: str = "paper",
) -> ATSResult:
    """ATS (Eq. 8) and MATS (Eq. 9) of occurrence vectors.

    vectors [N, d]: contextualised representations; terms [N]: term ids; positions [N]: absolute positions in the
    passage; passages [N]: passage ids (pairs inside one passage are not counted). `max_occurrences`: seeded cap
    per term (None: all); `max_delta`: deltas above it are dropped (None: all); `mats`: MATS_MODES (module doc).
    """
    if mats not in MATS_MODES:
        raise ValueError(f"MATS mode {mats!r}; expected one of {list(MATS_MODES)}")
    x = torch.as_tensor(vectors)
    terms, positions, passages = (torch.as_tensor(v).long().cpu().reshape(-1) for v in (terms, positions, passages))
    if x.ndim != 2 or not (len(x) == len(terms) == len(positions) == len(passages)):
        raise ValueError(
            f"vectors [N, d] and terms, positions, passages [N] expected; got {tuple(x.shape)}, "
            f"{len(terms)}, {len(positions)}, {len(passages)}"
        )
    if max_occurrences is not None and max_occurrences < 2:
        raise ValueError(f"max_occurrences must be >= 2 (pairs) or None, got {max_occurrences}")
    keep = _sample(terms, positions, passages, max_occurrences, seed)
    t = terms[keep]
    _, counts = torch.unique_consecutive(t, return_counts=True)
    # unit vectors in float64: the cosines and every sum below are float64
    xk = x[keep].cpu().double()
    xk = xk / xk.norm(dim=1, keepdim=True).clamp_min(1e-300)
    pos, pas = positions[keep], passages[keep]
    span = int(pos.max() - pos.min()) if len(pos) else 0
    n_delta = (span if max_delta is None else min(span, int(max_delta))) + 1
    ats_sum = torch.zeros(n_delta, dtype=torch.float64)
    n_terms = torch.zeros(n_delta, dtype=torch.float64)
    pair_sum = torch.zeros(n_delta, dtype=torch.float64)
    pair_sq = torch.zeros(n_delta, dtype=torch.float64)
    pair_n = torch.zeros(n_delta, dtype=torch.float64)

    starts = torch.cumsum(counts, 0) - counts
    multi = counts >= 2
    starts, counts = starts[multi], counts[multi]
    width = torch.clamp(2 ** torch.ceil(torch.log2(counts.double())).long(), min=2)
    for m in torch.unique(width).tolist():
        sel = (width == m).nonzero().squeeze(1)
        step = max(1, _CHUNK_PAIRS // (m * m))
        for a in range(0, len(sel), step):
            s, c = starts[sel[a : a + step]], counts[sel[a : a + step]]
            slot = torch.arange(m)
            real = slot[None, :] < c[:, None]  # [T, m]
            idx = torch.where(real, s[:, None] + slot[None, :], 0)
            v = xk[idx]  # [T, m, d]
            cos = torch.bmm(v, v.transpose(1, 2))  # [T, m, m]
            p, g = pos[idx], pas[idx]
            delta = (p[:, :, None] - p[:, None, :]).abs()
            valid = (
                real[:, :, None]
                & real[:, None, :]
                & torch.ones(m, m, dtype=torch.bool).triu(1)
                & (g[:, :, None] != g[:, None, :])
                & (delta < n_delta)
            )
            ti, _, _ = valid.nonzero(as_tuple=True)
            d, cv = delta[valid], cos[valid]
            pair_sum.index_add_(0, d, cv)
            pair_sq.index_add_(0, d, cv * cv)
            pair_n.index_add_(0, d, torch.ones_like(cv))
            # per (term, delta) mean, then summed over terms per delta
            keys, inverse = torch.unique(ti * n_delta + d, return_inverse=True)
            s_td = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inverse, cv)
            n_td = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(cv))
            kd = keys % n_delta
            ats_sum.index_add_(0, kd, s_td / n_td)
            n_terms.index_add_(0, kd, torch.ones_like(s_td))

    with np.errstate(invalid="ignore", divide="ignore"):
        ats = (ats_sum / n_terms).numpy()
        mean = (pair_sum / pair_n).numpy()
        var = np.maximum((pair_sq / pair_n).numpy() - mean * mean, 0.0)
    mats_value, mats_std = mats_from_curve(ats, mats)
    return ATSResult(
        ats=ats,
        std=np.sqrt(var),
        terms=n_terms.long().numpy(),
        pairs=pair_n.long().numpy(),
        mats=mats_value,
        mats_std=mats_std,
        occurrences=int(counts.sum()),
        vocabulary=len(counts),
        mats_mode=mats,
    )


class AverageTermSimilarity(Metric):
    """ATS / MATS over the occurrences of every `update`.

    Under DDP `compute()` gathers all ranks' occurrences (cat states) and computes on the whole set, so pairs across
    ranks count and every rank gets the same answer. Passage ids must be global (unique across ranks), e.g. the
    passage's index in the probe set.
    """

    full_state_update = False

    def __init__(
        self,
        max_occurrences: int | None = 100,
        seed: int = 0,
        max_delta: int | None = None,
        mats: str = "paper",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if mats not in MATS_MODES:
            raise ValueError(f"MATS mode {mats!r}; expected one of {list(MATS_MODES)}")
        self.max_occurrences, self.seed, self.max_delta, self.mats = max_occurrences, seed, max_delta, mats
        for name in ("vectors", "terms", "positions", "passages"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, vectors: Tensor, terms: Tensor, positions: Tensor, passages: Tensor) -> None:
        """Add a batch of occurrences: vectors [N, d] and their term ids, absolute positions and passage ids [N].

        Passage ids must be global (unique across ranks); vectors are kept as float32.
        """
        self.vectors.append(vectors.detach().float())
        self.terms.append(terms.long())
        self.positions.append(positions.long())
        self.passages.append(passages.long())

    def compute(self) -> ATSResult:
        """Return `average_term_similarity` (Eq. 8-9) of all the occurrences added, on every rank's under DDP."""
        if isinstance(self.vectors, list) and not self.vectors:  # after a DDP sync the states are tensors
            raise ValueError("AverageTermSimilarity.compute() before any update")
        return average_term_similarity(
            dim_zero_cat(self.vectors).cpu(),
            dim_zero_cat(self.terms).cpu(),
            dim_zero_cat(self.positions).cpu(),
            dim_zero_cat(self.passages).cpu(),
            self.max_occurrences,
            self.seed,
            self.max_delta,
            self.mats,
        )
