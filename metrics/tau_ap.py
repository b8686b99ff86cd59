"""AP rank correlation tau_AP and its two tie-aware variants, for ColBERT term importance.

tau_AP is Yilmaz, Aslam & Robertson's (SIGIR 2008); the variants are Urbano & Marrero's ("The Treatment of Ties in
AP Correlation", ICTIR 2017). It is the correlation the white-box paper uses for ColBERT term importance (section 3:
"using the Python implementation provided by [13]", i.e. Urbano & Marrero's).

Scores, not ranks: higher is better, `x` is the reference ranking and `y` the one compared to it (for term
importance: x = the ColBERT scores of Eq. 1, y = the scores with one word's subword rows removed). A pair (i, j)
is concordant when both rankings order it strictly the same way.

- `tau_ap(x, y)`, no ties in either (Yilmaz et al., Eq. 3 of their paper): walking down y's ranking,

      tau_AP = 2 / (n - 1) * sum_{i=2..n} C(i) / (i - 1) - 1,

  C(i) = how many of the i - 1 items above rank i (in y) x also puts above that item. Errors near the top of y
  weigh more (fewer items above share the penalty); not symmetric.
- `tau_ap_a(x, y)`, the "accuracy" scenario: x is a truth without ties, y an estimate with ties. The expected
  tau_AP over all orders of y's tied groups, in closed form: an item of a tied group starting at rank p (a = p - 1
  items strictly above) of size t sits at rank p + k - 1, k uniform in 1..t, and

      tau_AP,a = 2 / (n - 1) * [ sum_i c_i * (1/t_i) sum_{k=1..t_i} 1 / (a_i + k - 1)              (term I)
                                 + sum_groups (1/2) sum_{m=1..t-1} m / (a + m) ] - 1                (term II)

  c_i: concordant items strictly above i's group; term II: the m group members above the item in rank a + m + 1
  are concordant with it half the time on average. Equals `tau_ap` without ties; all of y tied gives 0.
- `tau_ap_b(x, y)`, the "agreement" scenario: ties in both, symmetric: the mean of the two directions of

      tau_AP,b(x -> y) = 2 / |{i : p_i > 1}| * sum_{i : p_i > 1} c_i / (p_i - 1) - 1,

  p_i = 1 + #{j : y_j > y_i} (the first rank of i's tied group in y), c_i = #{j : y_j > y_i and x_j > x_i}: items
  tied with i in y are neither above nor below it, and a pair tied in x is not concordant. Equals the mean of
  tau_ap(x, y) and tau_ap(y, x) without ties. Undefined (NaN) when either ranking is all one tie.

The white-box paper does not say which variant it used, and they differ (without ties, a is Yilmaz's tau_AP and b
the mean of its two directions), so the term-importance analysis reports both (`correlations`: one pass over the
pairwise matrices). `b` takes ties in both rankings as they are (duplicate passages tie in both; a masked ranking can
tie passages that differed only through the removed word); `a` needs a reference without ties, so ties in the
original ranking are broken by candidate order (the BM25 rank), which is what a sort would do.

The pairwise comparisons are vectorised ([n, n] boolean matrices: candidate sets are at most a few thousand);
tests check them against a literal walk down the ranking and against published values of Urbano's implementation.
"""

from __future__ import annotations

import numpy as np

VARIANTS = ("a", "b")


def _as_pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"x and y must be 1-d of the same length, got {x.shape} and {y.shape}")
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("scores must not be NaN")
    return x, y


def _has_ties(v: np.ndarray) -> bool:
    return len(np.unique(v)) != len(v)


def _above(v: np.ndarray) -> np.ndarray:
    """[n, n] bool: above[i, j] = item j is strictly above item i (higher score)."""
    return v[None, :] > v[:, None]


def _directed_b(ax: np.ndarray, ay: np.ndarray) -> float:
    """Compute the directed tau_AP,b(x -> y) from `_above(x)`, `_above(y)`.

    Walk y's ranking (tied groups by their first rank), concordance judged by x.
    """
    n_above = ay.sum(1)  # p_i - 1
    c = (ay & ax).sum(1)
    counted = n_above > 0
    if not counted.any():
        return float("nan")
    return float(2.0 * np.mean(c[counted] / n_above[counted]) - 1.0)


def tau_ap(x, y) -> float:
    """Yilmaz et al.'s tau_AP of ranking y against reference x; neither may hold ties (NaN for n < 2)."""
    x, y = _as_pair(x, y)
    if _has_ties(x) or _has_ties(y):
        raise ValueError("tau_ap needs rankings without ties; use tau_ap_a or tau_ap_b")
    if len(x) < 2:
        return float("nan")
    return _directed_b(_above(x), _above(y))  # without ties p_i - 1 = i - 1 and every item but the first counts


def tau_ap_a(x, y) -> float:
    """Compute Urbano & Marrero's tau_AP,a (accuracy) of ranking y against reference x.

    x is a reference without ties, ties are allowed in y; the value is the expectation of tau_ap over every order of
    y's ties (NaN for n < 2).
    """
    x, y = _as_pair(x, y)
    if _has_ties(x):
        raise ValueError("tau_ap_a needs a reference x without ties; use tau_ap_b")
    if len(x) < 2:
        return float("nan")
    return _tau_ap_a(_above(x), _above(y), y)


def _tau_ap_a(ax: np.ndarray, ay: np.ndarray, y: np.ndarray) -> float:
    """tau_AP,a from `_above(x)` (x without ties), `_above(y)` and y (n >= 2)."""
    n = len(y)
    a = ay.sum(1)  # items strictly above i's tied group
    t = (y[None, :] == y[:, None]).sum(1)  # size of i's tied group
    c = (ay & ax).sum(1)
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])  # H_0..H_n
    # term I: (1/t) sum_{k=1..t} 1/(a + k - 1) = (H_{a+t-1} - H_{a-1}) / t, for a >= 1 (a = 0 has c = 0)
    ok = a > 0
    term1 = np.zeros(n)
    term1[ok] = c[ok] * (harmonic[a[ok] + t[ok] - 1] - harmonic[a[ok] - 1]) / t[ok]
    # term II per item (1/t of its group's share): (1/2t) sum_{m=1..t-1} m/(a+m) = ((t-1) - a (H_{a+t-1} - H_a)) / 2t
    term2 = ((t - 1) - a * (harmonic[a + t - 1] - harmonic[a])) / (2.0 * t)
    return float(2.0 / (n - 1) * (term1.sum() + term2.sum()) - 1.0)


def tau_ap_b(x, y) -> float:
    """Urbano & Marrero's tau_AP,b (agreement): symmetric, ties allowed in both (NaN when either is all tied)."""
    x, y = _as_pair(x, y)
    if len(x) < 2:
        return float("nan")
    ax, ay = _above(x), _above(y)
    return 0.5 * (_directed_b(ax, ay) + _directed_b(ay, ax))


def break_ties(scores, order_key=None) -> np.ndarray:
    """Return scores without ties, the reference tau_ap_a needs.

    They keep every strict order of `scores` and order tied items by `order_key` ascending (default: position), e.g.
    a candidate list's rank. Returns -rank (higher = better).
    """
    s = np.asarray(scores, dtype=np.float64)
    key = np.arange(len(s)) if order_key is None else np.asarray(order_key)
    order = np.lexsort((key, -s))
    out = np.empty(len(s))
    out[order] = -np.arange(len(s), dtype=np.float64)
    return out


def correlation(x, y, variant: str = "b") -> float:
    """One term-importance correlation of the module doc: `b` as is, `a` with ties in x broken by position."""
    if variant == "b":
        return tau_ap_b(x, y)
    if variant == "a":
        return tau_ap_a(break_ties(x), y)
    raise ValueError(f"tau_AP variant {variant!r}; expected one of {VARIANTS}")


def correlations(x, y) -> dict[str, float]:
    """Return both term-importance correlations, {"a": correlation(x, y, "a"), "b": correlation(x, y, "b")}.

    The two share the pairwise matrices (NaN for n < 2).
    """
    x, y = _as_pair(x, y)
    if len(x) < 2:
        return {v: float("nan") for v in VARIANTS}
    ax, ay = _above(x), _above(y)
    ax_broken = _above(break_ties(x)) if _has_ties(x) else ax
    return {"a": _tau_ap_a(ax_broken, ay, y), "b": 0.5 * (_directed_b(ax, ay) + _directed_b(ay, ax))}
