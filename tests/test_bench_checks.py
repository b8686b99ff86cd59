"""bench/bench_checks.py: every check it times exists, and its timer counts the outermost calls only."""

from __future__ import annotations

import importlib
import sys
import time

from bench import bench_checks


def test_every_listed_check_is_in_the_code():
    """A check renamed or moved without the list following would leave it untimed: the list is kept with the code."""
    for spec in bench_checks.CHECKS:
        module_name, attr = spec.split(":")
        owner = importlib.import_module(module_name)
        for part in attr.split("."):
            owner = getattr(owner, part)
        assert callable(owner), spec


def test_wrapped_checks_count_outer_calls_and_their_time(monkeypatch, tmp_path):
    """Two checks, one calling the other: one outer call, its time once; the names bound by import are wrapped too."""
    mod = type(sys)("fake_checks")

    def inner(x):
        time.sleep(0.01)
        return x

    def outer(x):
        return mod.inner(x) + 1

    mod.inner, mod.outer = inner, outer
    user = type(sys)("fake_user")
    user.outer = outer  # `from fake_checks import outer`
    monkeypatch.setitem(sys.modules, "fake_checks", mod)
    monkeypatch.setitem(sys.modules, "fake_user", user)
    monkeypatch.setattr(bench_checks, "CHECKS", ("fake_checks:inner", "fake_checks:outer"))
    totals = bench_checks._wrap_checks()
    t0 = time.perf_counter()
    assert user.outer(1) == 2 and mod.inner(3) == 3
    spent = time.perf_counter() - t0
    assert totals["fake_checks:outer"]["calls"] == 1 and totals["fake_checks:inner"]["calls"] == 1
    counted = totals["fake_checks:outer"]["seconds"] + totals["fake_checks:inner"]["seconds"]
    assert 0.02 <= counted <= spent
