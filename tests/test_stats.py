"""metrics/significance.py: p-values equal scipy.stats on the same numbers; degenerate inputs give p = 1."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from core.errors import InputError
from metrics.significance import (
    TESTS,
    UNPAIRED,
    check_test,
    p_value,
    pair_by_query,
    pair_by_replicate,
    per_query_means,
    significance_mark,
)

rng = np.random.default_rng(0)
BASE = rng.uniform(0, 1, 40)
METHOD = np.clip(BASE + rng.normal(0.05, 0.1, 40), 0, 1)


def test_t_tests_equal_scipy():
    assert p_value(METHOD, BASE, "t_test_one_tailed") == pytest.approx(
        stats.ttest_rel(METHOD, BASE, alternative="greater").pvalue, rel=1e-12
    )
    assert p_value(METHOD, BASE, "t_test_two_tailed") == pytest.approx(stats.ttest_rel(METHOD, BASE).pvalue, rel=1e-12)
    # one-tailed is method > baseline: swapping the systems gives 1 - p
    p = p_value(METHOD, BASE, "t_test_one_tailed")
    assert p_value(BASE, METHOD, "t_test_one_tailed") == pytest.approx(1 - p, rel=1e-9)
    assert p_value(METHOD, BASE, "t_test_two_tailed") == pytest.approx(2 * min(p, 1 - p), rel=1e-9)


def test_wilcoxon_equals_scipy():
    assert p_value(METHOD, BASE, "wilcoxon") == pytest.approx(stats.wilcoxon(METHOD, BASE).pvalue, rel=1e-12)
    assert p_value(METHOD, BASE, "wilcoxon_one_tailed") == pytest.approx(
        stats.wilcoxon(METHOD, BASE, alternative="greater").pvalue, rel=1e-12
    )
    # ties with zero differences (typical of per-query IR values): zeros dropped ("wilcox"), as scipy's default
    a = np.array([0.5, 0.5, 1.0, 0.2, 0.0, 0.7, 0.3, 1.0])
    b = np.array([0.5, 0.3, 0.5, 0.2, 0.1, 0.4, 0.3, 0.6])
    assert p_value(a, b, "wilcoxon") == pytest.approx(stats.wilcoxon(a, b).pvalue, rel=1e-12)


def test_student_t_test_is_the_pooled_variance_formula():
    """The isotropy paper's test (section 5.1.2): three seeds' values a side, one-tailed, equal variances; t and the
    degrees of freedom from the pooled-variance formula in float64, p from Student's t distribution."""
    new, old = np.array([0.612, 0.598, 0.631]), np.array([0.590, 0.601, 0.585])
    na, nb = len(new), len(old)
    pooled = ((na - 1) * new.var(ddof=1) + (nb - 1) * old.var(ddof=1)) / (na + nb - 2)
    t = (new.mean() - old.mean()) / math.sqrt(pooled * (1 / na + 1 / nb))
    assert p_value(new, old, "student_t_one_tailed") == pytest.approx(stats.t.sf(t, na + nb - 2), rel=1e-12)
    assert p_value(old, new, "student_t_one_tailed") == pytest.approx(stats.t.cdf(t, na + nb - 2), rel=1e-12)
    # unpaired: the order within a side and unequal sizes do not matter to it
    assert p_value(new[::-1], old, "student_t_one_tailed") == p_value(new, old, "student_t_one_tailed")
    assert 0 < p_value(new, old[:2], "student_t_one_tailed") < 1
    # the same samples: t = 0, p = 1/2 (one-tailed); a paired test of identical systems gives 1
    assert p_value(new, new.copy(), "student_t_one_tailed") == pytest.approx(0.5)


@pytest.mark.parametrize("test", TESTS)
def test_identical_inputs_give_one(test):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if test not in UNPAIRED:
            assert p_value(BASE, BASE.copy(), test) == 1.0
        assert p_value([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], test) == 1.0
        assert p_value([0.3], [0.1], test) == 1.0  # one pair: no test possible
        assert p_value([], [], test) == 1.0
    p = p_value(METHOD, BASE, test)
    assert 0 <= p <= 1 and not math.isnan(p)


def test_bad_arguments():
    with pytest.raises(InputError, match="unknown significance test 'sign'"):
        p_value(METHOD, BASE, "sign")
    with pytest.raises(InputError, match="analysis.significance: 'student_t_one_tailed' compares the runs' means"):
        check_test("student_t_one_tailed", "analysis.significance", paired=True)
    with pytest.raises(ValueError):
        p_value([1.0, 2.0], [1.0], "t_test_two_tailed")


def test_per_query_means_and_pairing():
    seed1 = {"q1": {"m": 1.0}, "q2": {"m": 0.0}, "q3": {"m": 0.5}}
    seed2 = {"q1": {"m": 0.0}, "q2": {"m": 1.0}}
    means = per_query_means([seed1, seed2], "m")
    assert means == {"q1": 0.5, "q2": 0.5, "q3": 0.5}
    a, b, qids = pair_by_query(means, {"q2": 0.25, "q1": 0.0, "q9": 1.0})
    assert qids == ["q1", "q2"] and a == [0.5, 0.5] and b == [0.0, 0.25]
    assert pair_by_replicate({"seed1": 0.3, "seed2": 0.4}, {"seed2": 0.1, "seed1": 0.2}) == (
        [0.3, 0.4],
        [0.2, 0.1],
        ["seed1", "seed2"],
    )


def test_marks():
    assert [significance_mark(p) for p in (0.001, 0.01, 0.02, 0.05, 0.051, None)] == ["**", "**", "*", "*", "", ""]
