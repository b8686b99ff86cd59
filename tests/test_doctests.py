"""The examples in library docstrings run and print what they show (PyLate keeps its scoring functions this way)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = [
    "core",
    "metrics",
    "datamodules",
    "lightning_modules",
    "models",
    "callbacks",
    "retrieval",
    "analyses",
    "pipeline",
    "grid",
]


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        pkg = importlib.import_module(package)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}.")]
    return names


def _examples() -> list[tuple[str, doctest.DocTest]]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        for test in finder.find(module, name):
            if test.examples and test.name.startswith(name):  # its own docstrings, not an imported object's
                found.append((test.name, test))
    return found


EXAMPLES = _examples()


def test_docstring_examples_exist():
    """The collection below is not empty by accident (a moved package would silently drop them)."""
    names = {name for name, _ in EXAMPLES}
    assert "datamodules.sources.used_splits" in names and "metrics.isotropy.isotropy_iw_batched" in names, names


@pytest.mark.parametrize("name,test", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_docstring_example(name, test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=lambda s: print(s, end=""))
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (printed above)"
