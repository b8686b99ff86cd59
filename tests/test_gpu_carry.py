"""bench/gpu_carry.py and bench/gpu_session.sh: what travels to the lent GPU machine, and the session's refusals.

The downloads need the package registries, so they are not run here; bench/gpu_session.sh was rehearsed end to end
on this CPU in a venv holding the machine's packages (docs/performance.md)."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import REPO

from bench import gpu_carry


@pytest.mark.parametrize("name", ["requirements-gpu-project.txt", "requirements-gpu-pylate.txt"])
def test_every_carried_package_is_pinned(name):
    """The machine has no registry: each wheel is fetched by name and version, with no dependencies, so each line
    names one exact version, and no package is listed twice (two versions stop pip's whole install there)."""
    reqs = gpu_carry.requirements(name)
    assert reqs and all(r.count("==") == 1 for r in reqs), reqs
    names = [r.split("==")[0].lower().replace("_", "-") for r in reqs]
    assert len(names) == len(set(names))


def test_a_destination_git_would_send_is_refused_before_any_download(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(gpu_carry, "download", lambda *a: calls.append(a))
    with pytest.raises(SystemExit) as e:
        gpu_carry.main(["dest=not-ignored-carry"])
    assert e.value.code == 2 and calls == [] and not (REPO / "not-ignored-carry").exists()
    assert "dest=not-ignored-carry: not git-ignored" in capsys.readouterr().err


def test_travelling_bytes_count_the_tree_once_and_the_carried_folder(tmp_path):
    carried = tmp_path / "c"
    (carried / "w").mkdir(parents=True)
    (carried / "w" / "a.whl").write_bytes(b"x" * 1000)
    assert gpu_carry.travelling_bytes(carried) - gpu_carry.travelling_bytes(tmp_path / "empty") == 1000


def test_the_session_without_the_carried_folder_says_what_to_run(tmp_path):
    env = dict(os.environ, GPU_CARRY=str(tmp_path / "nothing"), OUT=str(tmp_path / "out"))
    p = subprocess.run(["bash", "bench/gpu_session.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stdout.strip() == (
        f"gpu_session: {tmp_path / 'nothing'}/wheels missing: run `python -m bench.gpu_carry` and carry "
        f"{tmp_path / 'nothing'}"
    )


def test_wheels_the_requirements_no_longer_name_are_removed(tmp_path):
    """An older pin's wheel left in .gpu/ would be a second version of its package, which stops the machine's pip."""
    names = [
        "filelock-4.3.1-py3-none-any.whl",
        "filelock-4.2.0-py3-none-any.whl",  # the pin before
        "pystemmer-3.1.0-cp312-cp312-manylinux1_x86_64.whl",  # PyStemmer==3.1.0, as the wheel spells it
        "pytrec_eval_terrier-0.5.11-cp312-cp312-manylinux_2_28_x86_64.whl",
        "zuko-1.6.0-py3-none-any.whl",  # no longer required
    ]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    reqs = ["filelock==4.3.1", "PyStemmer==3.1.0", "pytrec-eval-terrier==0.5.11"]
    assert gpu_carry.prune(tmp_path, reqs) == ["filelock-4.2.0-py3-none-any.whl", "zuko-1.6.0-py3-none-any.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - {names[1], names[4]})
