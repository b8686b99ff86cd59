"""From per-query results to the points of Figures 1-3 and their correlations with IDF.

- words (Figures 1-2): one point per word type of the analysed queries. tau_AP, as both tau_AP,a and tau_AP,b
  (`tau_ap_a`, `tau_ap_b`: the paper does not say which, tau_ap.py): "when the term appears in several queries, we
  consider the average" (mean over the queries holding it, NaN values, i.e. an all-tied ranking, left out and
  counted). Delta_ES(w) = sum_{t in w} Delta_ES(t) (delta_es.py).
- subwords (Figure 3): one point per WordPiece type of the analysed query words, with its Delta_ES(t) and spectral
  ratio.
- correlations: Pearson r (scipy.stats.pearsonr, with its two-sided p-value) of each statistic (`tau_ap_a`,
  `tau_ap_b`, `delta_es`, `spectral`) against IDF, the paper's measure, and Spearman rho beside it; also over the
  words that are not stopwords, since the paper's Figure 1 discussion singles them out, and inside each query
  (`within_query`).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from analyses.whitebox.collect import QueryResult, SpectralResult
from analyses.whitebox.idf import CollectionIDF
from analyses.whitebox.words import STOPWORDS, Word
from metrics.delta_es import DeltaES
from metrics.tau_ap import VARIANTS

# term importance (Figure 1): the word-row key and correlation key of each tau_AP variant
TAU_AP_KEYS = {v: f"tau_ap_{v}" for v in VARIANTS}


def _finite(v) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def correlate(x, y) -> dict:
    """Pearson r (and p) and Spearman rho of the finite (x, y) pairs; r = None with fewer than 3 or a constant."""
    from scipy.stats import (  # lazy: scipy.stats loads slowly, only significance tests need it
        pearsonr,
        spearmanr,
    )

    pts = [(a, b) for a, b in zip(x, y) if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    out = {"n": len(pts), "pearson_r": None, "p_value": None, "spearman_rho": None}
    if len(pts) < 3:
        return out
    a, b = np.array(pts, dtype=np.float64).T
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return out
    r = pearsonr(a, b)
    out.update(pearson_r=float(r.statistic), p_value=float(r.pvalue), spearman_rho=float(spearmanr(a, b).statistic))
    return out


def delta_es_of(results: list[QueryResult]) -> DeltaES:
    """Return Delta_ES per subword (Eq. 2 of the white-box paper), accumulated over all queries' pair differences."""
    acc = DeltaES()
    for res in results:
        for _key, _pos, tid, diff in res.differences:
            acc.add(tid, diff)
    return acc


def word_rows(
    words_per_query: list[list[Word]],
    results: list[QueryResult],
    idf: CollectionIDF,
    tokens: dict[int, str],
    dES: DeltaES | None,
) -> list[dict]:
    """One row per word type, sorted by IDF then word."""
    first: dict[str, Word] = {}
    queries: dict[str, int] = defaultdict(int)
    taus: dict[str, dict[str, list[float]]] = {v: defaultdict(list) for v in VARIANTS}
    shares: dict[str, list[float]] = defaultdict(list)
    for words, res in zip(words_per_query, results):
        for key in dict.fromkeys(w.key for w in words):
            queries[key] += 1
        for w in words:
            first.setdefault(w.key, w)
        for v in VARIANTS:
            for key, t in res.tau.get(v, {}).items():
                taus[v][key].append(t)
        for key, s in res.exact_share.items():
            shares[key].append(s)
    rows = []
    for key, w in first.items():
        row = {
            "word": key,
            "subwords": [tokens[t] for t in w.subwords],
            "df": int(idf.word_df.get(key, 0)),
            "idf": idf.word(key),
            "stopword": key in STOPWORDS,
            "queries": queries[key],
        }
        for v, name in TAU_AP_KEYS.items():
            got = taus[v].get(key, [])
            vals = [t for t in got if math.isfinite(t)]
            row[name] = float(np.mean(vals)) if vals else None
            row[f"{name}_std"] = float(np.std(vals)) if len(vals) > 1 else None
            row[f"{name}_undefined"] = len(got) - len(vals)
        row["delta_es"] = _finite(dES.word(w.subwords)) if dES is not None else None
        row["exact_match_share"] = float(np.mean(shares[key])) if shares.get(key) else None
        rows.append(row)
    rows.sort(key=lambda r: (r["idf"], r["word"]))
    return rows


def subword_rows(
    token_ids,
    idf: CollectionIDF,
    tokens: dict[int, str],
    query_occurrences: dict[int, int],
    dES: DeltaES | None,
    spectral: dict[int, SpectralResult] | None,
) -> list[dict]:
    """Return one row per WordPiece type of `token_ids` (Figure 3's points), sorted by IDF then subword.

    Each row holds the subword's document frequency and IDF, its occurrences in the queries, its Delta_ES (Eq. 2)
    with the pairs it pools and those left undefined, and its spectral ratio over the sampled passage vectors (and
    over an equal number of them); a statistic that was not computed is None.
    """
    rows = []
    for t in sorted({int(t) for t in token_ids}, key=lambda t: (idf.subword(t), tokens[t])):
        sp = (spectral or {}).get(t)
        rows.append(
            {
                "subword": tokens[t],
                "id": t,
                "df": int(idf.subword_df.get(t, 0)),
                "idf": idf.subword(t),
                "query_occurrences": int(query_occurrences.get(t, 0)),
                "delta_es": _finite(dES.value(t)) if dES is not None else None,
                "delta_es_pairs": dES.count(t) if dES is not None else None,
                "delta_es_undefined": int(dES.undefined.get(t, 0)) if dES is not None else None,
                "passage_occurrences": sp.occurrences if sp else None,
                "spectral_vectors": sp.used if sp else None,
                "spectral_ratio": _finite(sp.ratio) if sp else None,
                "spectral_ratio_equal": _finite(sp.ratio_equal) if sp else None,
            }
        )
    return rows


def within_query(queries: list[dict], words: list[dict], key: str) -> dict:
    """Return the mean and median over queries of the per-query Pearson r of IDF and a word value.

    Pearson r of IDF and a per-query word value (`key` of the per-query records) inside each query with at least
    3 such words, then the mean and median over queries: a word's tau_AP also depends on how many other words share
    its query (a long query loses less when one word goes), which the pooled correlation mixes in and this one does
    not. Not in the paper; reported beside its measure.
    """
    idf = {w["word"]: w["idf"] for w in words}
    rs = []
    for q in queries:
        pts = [(idf[w["word"]], w[key]) for w in q["words"] if w.get(key) is not None and w["word"] in idf]
        r = correlate(*zip(*pts))["pearson_r"] if len(pts) >= 3 else None
        if r is not None:
            rs.append(r)
    return {
        "queries": len(rs),
        "mean_r": float(np.mean(rs)) if rs else None,
        "median_r": float(np.median(rs)) if rs else None,
    }


def correlations(
    words: list[dict], subwords: list[dict], statistics: list[str], queries: list[dict] | None = None
) -> dict[str, dict]:
    """Return the Pearson r against IDF of each computed statistic.

    The statistics: `tau_ap_a` and `tau_ap_b` (Figure 1's term importance, both variants), `delta_es` (Figure 2)
    and `spectral` (Figure 3).
    """
    out: dict[str, dict] = {}
    content = [w for w in words if not w["stopword"]]
    queries = queries or []
    if "term_importance" in statistics:
        for key in TAU_AP_KEYS.values():
            out[key] = {
                **correlate([w["idf"] for w in words], [w[key] for w in words]),
                "without_stopwords": correlate([w["idf"] for w in content], [w[key] for w in content]),
                "within_query": within_query(queries, words, key),
            }
    if "delta_es" in statistics:
        out["delta_es"] = {
            **correlate([w["idf"] for w in words], [w["delta_es"] for w in words]),
            "without_stopwords": correlate([w["idf"] for w in content], [w["delta_es"] for w in content]),
            "subwords": correlate([s["idf"] for s in subwords], [s["delta_es"] for s in subwords]),
            "within_query": within_query(queries, words, "delta_es"),
        }
    if "spectral" in statistics:
        out["spectral"] = {
            **correlate([s["idf"] for s in subwords], [s["spectral_ratio"] for s in subwords]),
            "equal_occurrences": correlate([s["idf"] for s in subwords], [s["spectral_ratio_equal"] for s in subwords]),
        }
    return out
