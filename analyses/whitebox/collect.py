"""Running the white-box statistics on a ColBERT ranker (the plain nn.Module of models/rankers/colbert.py).

Every passage and query is encoded once (`encode_texts`: the ranker's `encode` then `scoring_vectors`, i.e. the unit
vectors Eq. 1 compares, in eval mode and without gradients); per query, its candidates' vectors give the C*_id and
exact-match matrices (maxsim.py), from which every word's removal (tau_AP,a and tau_AP,b, section 3) and every
query token's Eq. 2 term are computed (`analyse_query`); the spectral ratio reads the stored passage vectors of the
query subwords (`spectral_by_subword`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from analyses.whitebox.maxsim import MaxSim, max_sim
from analyses.whitebox.words import Word
from metrics.delta_es import pair_difference
from metrics.spectral import sample_rows, spectral_ratio
from metrics.tau_ap import VARIANTS, correlations
from models.encoding import encode_collection
from models.rankers.base import EncodedTexts


def encode_texts(ranker, ids: list[list[int]], side: str, batch_size: int = 64, pad_id: int = 0) -> EncodedTexts:
    """Encode `ids` into the unit token vectors Eq. 1 compares, with their WordPiece ids (`encode_collection`)."""
    return encode_collection(ranker, ids, side, batch_size=batch_size, pad_id=pad_id, scoring=True, keep_ids=True)


def query_maxsim(queries: EncodedTexts, k: int, docs: EncodedTexts, candidates) -> MaxSim:
    """Eq. 1's C*_id and exact matches of query k against its candidate passages (indices into `docs`)."""
    d = docs.padded(candidates)
    return max_sim(queries.tokens(k), queries.token_ids(k), d.tokens, d.mask, docs.padded_ids(candidates))


@dataclass
class QueryResult:
    """The white-box statistics of one query, per analysed word: tau_AP of its removal and its Eq. 2 pair differences.

    Also the share of exact matches of each word's subwords over the query's candidates.
    """

    # tau_AP variant ("a", "b") -> word key -> tau_AP(ranking, ranking without the word)
    tau: dict[str, dict[str, float]] = field(default_factory=lambda: {v: {} for v in VARIANTS})
    # (word key, token position, token id, Eq. 2 pair difference) for every subword of every analysed word
    differences: list[tuple[str, int, int, float]] = field(default_factory=list)
    exact_share: dict[str, float] = field(default_factory=dict)  # word key -> share of (subword, candidate) exact


def analyse_query(ms: MaxSim, words: list[Word], term_importance: bool = True, delta_es: bool = True) -> QueryResult:
    """Compute the term importance of every word type of the query and the Eq. 2 term of every subword occurrence.

    Term importance: all the word's occurrences removed together, the word being masked, as tau_AP,a and tau_AP,b
    (tau_ap.correlations); and the Eq. 2 term of every subword occurrence. Float64 for the scores, so removing a row
    does not create ties that float32 rounding would.
    """
    c_star = ms.c_star.double().numpy()
    exact = ms.exact.numpy()
    score = c_star.sum(0)
    out = QueryResult()
    rows: dict[str, list[int]] = {}
    for w in words:
        rows.setdefault(w.key, []).extend(w.positions)
    if term_importance:
        for key, r in rows.items():
            for variant, value in correlations(score, score - c_star[r].sum(0)).items():
                out.tau[variant][key] = value
    for key, r in rows.items():
        out.exact_share[key] = float(exact[r].mean())
    if delta_es:
        for w in words:
            for pos, tid in zip(w.positions, w.subwords):
                out.differences.append((w.key, pos, tid, pair_difference(c_star[pos], exact[pos])))
    return out


@dataclass
class SpectralResult:
    """The spectral ratio (Figure 3 of the white-box paper) of one subword's contextual vectors in the passages."""

    occurrences: int  # in the encoded passages
    used: int  # min(occurrences, cap)
    ratio: float  # over the `used` vectors
    ratio_equal: float | None  # over exactly `equal` vectors (None: fewer occurrences than that)


def spectral_by_subword(
    docs: EncodedTexts, token_ids, cap: int, min_occurrences: int, equal: int | None, seed: int
) -> dict[int, SpectralResult]:
    """Return the spectral ratio (spectral.py) of each subword's contextual vectors in the encoded passages.

    Over a seeded sample of at most `cap` occurrences; subwords with fewer than `min_occurrences` are left out.
    """
    flat = docs.ids.numpy()
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    out: dict[int, SpectralResult] = {}
    for t in sorted({int(t) for t in token_ids}):
        a, b = np.searchsorted(sorted_ids, t, "left"), np.searchsorted(sorted_ids, t, "right")
        n = int(b - a)
        if n < max(1, min_occurrences):
            continue
        pick = sample_rows(n, cap, seed, t)
        rows = order[a:b][pick]
        vecs = docs.vecs[torch.from_numpy(rows)].double().numpy()
        eq = spectral_ratio(vecs[:equal]) if equal is not None and n >= equal else None
        out[t] = SpectralResult(occurrences=n, used=len(rows), ratio=spectral_ratio(vecs), ratio_equal=eq)
    return out
