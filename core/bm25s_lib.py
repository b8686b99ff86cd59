"""bm25s, loaded so that it cannot take the GPU.

This project imports bm25s only through `bm25s_module()`, `bm25s_submodule()` and `stopwords_en()`.

bm25s runs a JAX top-k when it is imported and JAX is installed (bm25s/selection.py). JAX then starts its CUDA
backend, which preallocates 75% of the GPU's memory (XLA's default) or, when another process holds the GPU, fails
with "Unable to initialize backend 'cuda'". Seen on an H100 machine with JAX installed (2026-11-26,
`python -m bench.bench_gpu`): one train.py held 60 GiB of the GPU, the others stopped with that error or with CUDA out
of memory. This project never computes with JAX, so JAX is pinned to the CPU before bm25s loads (JAX_PLATFORMS=cpu),
unless the user set JAX_PLATFORMS. It has no effect on a process that imported JAX before.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def bm25s_module() -> ModuleType:
    """Return the bm25s module, imported with JAX pinned to the CPU (JAX_PLATFORMS=cpu unless the user set it).

    Use it instead of `import bm25s`: bm25s imports JAX, whose CUDA backend would otherwise take the GPU (see the
    module docstring).
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return importlib.import_module("bm25s")


def bm25s_submodule(name: str) -> ModuleType:
    """Return `bm25s.<name>`, loaded after `bm25s_module()` has pinned JAX.

    `name` is e.g. "scoring", whose idf and tf scorers datamodules/bm25.py builds its index with.
    """
    bm25s_module()
    return importlib.import_module(f"bm25s.{name}")


def stopwords_en() -> frozenset[str]:
    """Return the 33-word English stop list of Lucene, which bm25s ("en") and this project's BM25 use."""
    return frozenset(bm25s_submodule("stopwords").STOPWORDS_EN)
