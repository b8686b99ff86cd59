"""bm25s is loaded only through core/bm25s_lib.py, which pins JAX to the CPU first (bm25s runs a JAX top-k at import,
and JAX would otherwise take 75% of a GPU's memory: seen on an H100, core/bm25s_lib.py)."""

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO, project_sources


def test_only_core_bm25s_lib_imports_bm25s():
    offenders = []
    for path in project_sources():
        rel = path.relative_to(REPO)
        if rel == Path("core/bm25s_lib.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{rel}:{node.lineno}" for n in names if n.split(".")[0] == "bm25s"]
    assert offenders == [], f"import bm25s through core.bm25s_lib: {offenders}"


def run(code: str, env: dict) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_jax_pinned_to_cpu_before_bm25s_loads_unless_the_user_chose():
    code = (
        "import os, sys; from core.bm25s_lib import stopwords_en; words = stopwords_en(); "
        "print(os.environ.get('JAX_PLATFORMS'), 'bm25s' in sys.modules, len(words), 'the' in words)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"}
    assert run(code, env) == "cpu True 33 True"
    assert run(code, {**env, "JAX_PLATFORMS": "cuda"}).startswith("cuda True")
