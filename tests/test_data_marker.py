"""`@pytest.mark.data(...)` (tests/conftest.py): a test that reads ../shared/data skips, naming the missing path, when
the data is absent, except in CI (env CI=true, any case), where it fails instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import conftest
import pytest


def test_shared_data_is_next_to_the_repo():
    assert conftest.SHARED_DATA == (conftest.REPO.parent / "shared" / "data").resolve()


@pytest.fixture
def no_data(tmp_path, monkeypatch) -> Path:
    missing = tmp_path / "shared" / "data"
    monkeypatch.setattr(conftest, "SHARED_DATA", missing)
    return missing


@pytest.mark.parametrize("ci", ["true", "TRUE", "True", " true "])
def test_missing_data_fails_in_ci(no_data, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="shared data missing in CI") as e:
        conftest.require_shared_data("cranfield")
    assert str(no_data / "cranfield") in str(e.value)
    with pytest.raises(pytest.fail.Exception, match="shared data missing in CI"):
        conftest.shared_data("squad_v1.1_dev", "dev-v1.1.json.gz")


@pytest.mark.parametrize("ci", [None, "", "false", "1", "yes"])
def test_missing_data_skips_outside_ci(no_data, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="shared data not present") as e:
        conftest.require_shared_data("cisi", "cacm")
    assert str(no_data / "cisi") in str(e.value) and str(no_data / "cacm") in str(e.value)
    with pytest.raises(pytest.skip.Exception, match="shared data not present"):
        conftest.require_shared_data()  # the folder itself


def test_present_data_neither_skips_nor_fails(no_data, monkeypatch):
    (no_data / "cranfield").mkdir(parents=True)
    for ci in ("true", "false"):
        monkeypatch.setenv("CI", ci)
        conftest.require_shared_data("cranfield")
        assert conftest.shared_data("cranfield") == no_data / "cranfield"
    with pytest.raises(pytest.skip.Exception, match=str(no_data / "cacm")):
        conftest.require_shared_data("cranfield", "cacm")  # one missing path is enough


SUITE = """
import pytest
from conftest import shared_data

@pytest.mark.data("cranfield")
def test_marked():
    pass

@pytest.mark.parametrize("name", [pytest.param("cisi", marks=pytest.mark.data("cisi"))])
def test_marked_param(name):
    pass

def test_plain():
    pass
"""


def _run_suite(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    """The real conftest.py in a repo of its own (so ../shared/data is tmp_path/shared/data), pytest in a subprocess."""
    tests = tmp_path / "repo" / "tests"
    tests.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(conftest.__file__), tests / "conftest.py")
    (tests / "test_suite.py").write_text(SUITE)
    (tmp_path / "repo" / "pytest.ini").write_text("[pytest]\nmarkers =\n    data(*paths): reads ../shared/data\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no third-party plugins: a second of start-up per run
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path / "repo",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # two pytest sessions in subprocesses
def test_hook_fails_marked_tests_in_ci_and_skips_them_elsewhere(tmp_path):
    missing = tmp_path / "shared" / "data"
    proc = _run_suite(tmp_path, "true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 failed, 1 passed" in proc.stdout, proc.stdout
    assert f"shared data missing in CI (CI=true): {missing / 'cranfield'}" in proc.stdout
    assert f"shared data missing in CI (CI=true): {missing / 'cisi'}" in proc.stdout

    proc = _run_suite(tmp_path, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 2 skipped" in proc.stdout, proc.stdout
    assert f"shared data not present: {missing / 'cranfield'}" in proc.stdout
    assert f"shared data not present: {missing / 'cisi'}" in proc.stdout

    (missing / "cranfield").mkdir(parents=True)
    (missing / "cisi").mkdir()
    proc = _run_suite(tmp_path, "true")
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout + proc.stderr
