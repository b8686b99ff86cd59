"""Summary statistics of a relative answer-position distribution, against the uniform distribution.

The values lie in [0, 1); the uniform distribution is what an unbiased passage collection would give
(position-bias paper Sec. 1: "inside a passage ... no word position is supposed to be explicitly favored").

- count, mean, std, median, quantiles (10/25/50/75/90 %), and the shares of answers starting in the first 10 %
  and 25 % of the passage (and in the first k when a biased split's k is given).
- `ks_uniform`: Kolmogorov-Smirnov distance D = sup |F(x) - x| to U(0, 1) and its p-value (scipy.stats.kstest),
  bin-free. Word positions are discrete (multiples of 1/n), so even an exactly rotated sample keeps D of the
  order of 1/(2 n_words); with "all" spans the values of one question are not independent, so read p-values as
  descriptive.
- `chi2_uniform`: Pearson chi-square of the `bins` equal-width bin counts against equal counts (scipy.stats.
  chisquare; dof = bins - 1) and `kl_uniform_nats`: KL(P || U) of the binned distribution in nats
  (0 = flat; log(1/k) for answers spread evenly over the first k only).
- `histogram`: bin edges, counts and fractions (what the figure draws).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def summarize(values, bins: int = 20, keep_first: float | None = None) -> dict:
    """Return the summary statistics of relative answer positions (module doc), with `bins` histogram bins.

    `keep_first`: a biased split's k, adding `share_first_k`. An empty sample gives only `{"count": 0}`.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return {"count": 0}
    counts, edges = np.histogram(x, bins=bins, range=(0.0, 1.0))
    frac = counts / x.size
    nz = frac > 0
    chi2 = stats.chisquare(counts)
    ks = stats.kstest(x, "uniform")
    out = {
        "count": int(x.size),
        "mean": float(x.mean()),
        "std": float(x.std()),
        "median": float(np.median(x)),
        "quantiles": {f"{q:g}": float(np.quantile(x, q)) for q in QUANTILES},
        "share_first_10": float(np.mean(x < 0.1)),
        "share_first_25": float(np.mean(x < 0.25)),
        "ks_uniform": {"statistic": float(ks.statistic), "pvalue": float(ks.pvalue)},
        "chi2_uniform": {"statistic": float(chi2.statistic), "dof": int(bins - 1), "pvalue": float(chi2.pvalue)},
        "kl_uniform_nats": float(np.sum(frac[nz] * np.log(frac[nz] * bins))),
        "histogram": {
            "edges": [float(e) for e in edges],
            "counts": [int(c) for c in counts],
            "fraction": [float(f) for f in frac],
        },
    }
    if keep_first is not None:
        out["share_first_k"] = float(np.mean(x < keep_first))
    return out
