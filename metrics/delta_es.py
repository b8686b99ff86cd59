"""Exact vs soft matches (white-box paper section 4, Eq. 2).

    Delta_ES(t) = mean_{i, q : i -> t} ( mean_{d in S_q : d*_i -> t} C*_id  -  mean_{d in S_q : d*_i -/-> t} C*_id )

For one query token i of query q (`pair_difference`): the mean max-similarity C*_id over the candidates where i
matches the same token t exactly, minus the mean over those where it matches another token (a soft match); defined
only when S_q holds both kinds. Delta_ES(t) averages the defined differences over every occurrence of the token
type t in every query (`DeltaES.add` / `DeltaES.value`). For a word w = t_1 ... t_n the paper uses
sum_{t in w} Delta_ES(t) (`DeltaES.word`: the subwords as the word spells them, a repeated subword counted as
often as it appears, "the way ColBERT works (summing over subwords)"); undefined when one of its subwords is.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def pair_difference(c_star, exact) -> float:
    """Compute one query token's term of Eq. 2.

    That is the mean C* over exact-match candidates minus the mean over soft-match ones (NaN when every candidate
    matches the same way). `c_star` [n] floats, `exact` [n] bools.
    """
    c = np.asarray(c_star, dtype=np.float64)
    e = np.asarray(exact, dtype=bool)
    if e.all() or not e.any():
        return float("nan")
    return float(c[e].mean() - c[~e].mean())


class DeltaES:
    """Accumulates pair differences per token type t, then Eq. 2's outer mean."""

    def __init__(self):
        self.pairs: dict[int, list[float]] = defaultdict(list)
        self.undefined: dict[int, int] = defaultdict(int)

    def add(self, token_id: int, difference: float) -> None:
        """Record one occurrence's `pair_difference` for token type `token_id`; a NaN one is counted as undefined."""
        if math.isnan(difference):
            self.undefined[int(token_id)] += 1
        else:
            self.pairs[int(token_id)].append(float(difference))

    def value(self, token_id: int) -> float:
        """Delta_ES(t); NaN when no occurrence of t had both exact and soft matches."""
        d = self.pairs.get(int(token_id))
        return float(np.mean(d)) if d else float("nan")

    def count(self, token_id: int) -> int:
        """Return how many defined differences Delta_ES(t) averages for token type `token_id`."""
        return len(self.pairs.get(int(token_id), ()))

    def word(self, subwords: list[int]) -> float:
        """Delta_ES(w) = sum_{t in w} Delta_ES(t)."""
        return float(sum(self.value(t) for t in subwords))  # NaN propagates: a partial sum would not be Eq. 2's
