"""Significance tests for comparing a method with a baseline (scipy.stats).

There are paired tests, and the isotropy paper's unpaired one.

Units of pairing:

- per query (the usual IR practice): the values of one measure for the same query under both systems. With several
  seeds (or repeated folds) a query's value is first averaged over the runs in which it was tested
  (`per_query_means`), then the two systems are paired on the queries both have (`pair_by_query`);
- per seed / fold (`pair_by_replicate`): each replicate's mean of the measure, paired by replicate.

Tests (`TESTS`):

- `t_test_one_tailed`: paired t-test, alternative "method > baseline"
  (`scipy.stats.ttest_rel(..., alternative="greater")`);
- `t_test_two_tailed`: paired t-test, two-sided;
- `wilcoxon`: Wilcoxon signed-rank test, two-sided (`scipy.stats.wilcoxon`, zero differences dropped: "wilcox");
- `wilcoxon_one_tailed`: the same, alternative "method > baseline";
- `student_t_one_tailed`: Student's two-sample t-test with equal variances, alternative "method > baseline"
  (`scipy.stats.ttest_ind(..., equal_var=True, alternative="greater")`), unpaired: the isotropy paper's test
  (section 5.1.2, "using the three performance values for the three random seeds, we conducted one-tailed t-test
  under the assumption of homoscedasticity"), so it takes the replicates' values (`paired_by: replicate`) and
  ignores which seed is which.

Degenerate inputs give p = 1.0 instead of NaN or an exception: all differences zero (identical systems), fewer than
two pairs (two values a side for the unpaired test). (A constant non-zero difference is scipy's own answer:
t = +-inf, p = 0 or 1.)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from core.errors import InputError

__all__ = [
    "TESTS",
    "UNPAIRED",
    "check_test",
    "p_value",
    "per_query_means",
    "pair_by_query",
    "pair_by_replicate",
    "significance_mark",
]

TESTS = ("t_test_one_tailed", "t_test_two_tailed", "wilcoxon", "wilcoxon_one_tailed", "student_t_one_tailed")
UNPAIRED = ("student_t_one_tailed",)  # tests of two independent samples (of the replicates' values)


def check_test(name: str, where: str = "test", paired: bool = False) -> str:
    """Return `name` if it is a test of TESTS (a paired one where `paired`: per-query comparisons).

    Raises InputError at `where` otherwise.
    """
    allowed = [t for t in TESTS if not (paired and t in UNPAIRED)]
    if name not in TESTS:
        raise InputError(where, f"unknown significance test '{name}'; expected one of {allowed}")
    if name not in allowed:
        raise InputError(
            where, f"'{name}' compares the runs' means, not paired per-query values; expected one of {allowed}"
        )
    return name


def p_value(method: Sequence[float], baseline: Sequence[float], test: str = "t_test_one_tailed") -> float:
    """Return the p-value of `test`.

    On paired samples (method[i] with baseline[i]), or for an UNPAIRED test on two independent samples (lengths may
    differ); one-tailed tests ask "method > baseline".
    """
    from scipy import stats  # lazy: scipy.stats loads slowly, only significance tests need it

    check_test(test)
    a = np.asarray(method, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or (a.shape != b.shape and test not in UNPAIRED):
        raise ValueError(
            "p_value: method and baseline must be 1-d and, for a paired test, of equal length "
            f"(got {a.shape} and {b.shape})"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("p_value: values must be finite")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # precision-loss warnings on (near-)constant differences
        if test in UNPAIRED:
            if min(len(a), len(b)) < 2 or (np.all(a == a[0]) and np.all(b == a[0])):
                return 1.0
            p = stats.ttest_ind(a, b, equal_var=True, alternative="greater").pvalue
        else:
            d = a - b
            if len(d) < 2 or not np.any(d != 0):
                return 1.0
            if test == "t_test_one_tailed":
                p = stats.ttest_rel(a, b, alternative="greater").pvalue
            elif test == "t_test_two_tailed":
                p = stats.ttest_rel(a, b, alternative="two-sided").pvalue
            else:
                alternative = "greater" if test == "wilcoxon_one_tailed" else "two-sided"
                p = stats.wilcoxon(a, b, zero_method="wilcox", alternative=alternative).pvalue
    p = float(p)
    return 1.0 if math.isnan(p) else p


def per_query_means(runs: Iterable[Mapping[str, Mapping[str, float]]], measure: str) -> dict[str, float]:
    """{qid: mean of `measure` over the runs (per_query.json contents) that tested the query}."""
    sums: dict[str, list[float]] = {}
    for per_query in runs:
        for qid, values in per_query.items():
            if measure in values:
                sums.setdefault(str(qid), []).append(float(values[measure]))
    return {q: math.fsum(v) / len(v) for q, v in sums.items()}


def pair_by_query(
    method: Mapping[str, float], baseline: Mapping[str, float]
) -> tuple[list[float], list[float], list[str]]:
    """Return (method values, baseline values, qids) on the queries both have, in qid order."""
    qids = sorted(set(method) & set(baseline))
    return [method[q] for q in qids], [baseline[q] for q in qids], qids


def pair_by_replicate(
    method: Mapping[str, float], baseline: Mapping[str, float]
) -> tuple[list[float], list[float], list[str]]:
    """Return (method means, baseline means, replicate ids) on the seeds/folds both have."""
    return pair_by_query(method, baseline)


def significance_mark(p: float | None) -> str:
    """'**' for p <= 0.01, '*' for p <= 0.05, '' otherwise (or no test)."""
    if p is None:
        return ""
    return "**" if p <= 0.01 else "*" if p <= 0.05 else ""
