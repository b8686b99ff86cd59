"""The tests that read the source tree (layering, capability and import checks) read the project's own packages
(conftest.project_sources): a virtual environment, build folder or cache inside the checkout is never read."""

import shutil
import subprocess

import pytest
from conftest import REPO, project_sources

UNPARSABLE = "def broken(:\n"  # what a file of a library's own tests inside .venv/ may hold for this Python


@pytest.mark.parametrize("git", [True, False], ids=["git-checkout", "plain-folder"])
def test_a_venv_build_folder_and_cache_in_the_checkout_are_not_read(tmp_path, git):
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "train.py").write_text("x = 1\n")
    for rel in ("core/__init__.py", "core/errors.py", "retrieval/dense.py", "tests/test_x.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    for rel in (".venv/lib/python3.11/site-packages/torch/test_bad.py", "build/lib/core/errors.py", ".cache/x.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(UNPARSABLE)
    if git:
        (root / ".gitignore").write_text("/build/\n.cache/\n")  # .venv/ left out on purpose: still not read
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "pyproject.toml", "train.py", "core"], cwd=root, check=True)
        (root / "core" / "new.py").write_text("x = 2\n")  # untracked, not ignored: part of the working tree
    found = [p.relative_to(root).as_posix() for p in project_sources(root=root)]
    want = ["core/__init__.py", "core/errors.py", "retrieval/dense.py", "train.py"]
    assert found == sorted(want + (["core/new.py"] if git else []))
    assert [p.relative_to(root).as_posix() for p in project_sources("retrieval", root=root)] == ["retrieval/dense.py"]
    with pytest.raises(AssertionError, match="not a package"):
        project_sources("tests", root=root)


def test_the_checkout_itself():
    found = {p.relative_to(REPO).as_posix() for p in project_sources()}
    assert {"train.py", "evaluate.py", "experiments.py", "core/errors.py", "pipeline/run.py"} <= found
    assert not any(f.startswith(("tests/", ".venv/", "venv/", "outputs/")) for f in found)
