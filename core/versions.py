"""What made a record: the exact versions of the libraries a result depends on, read from the installed packages.

    library_versions()            # {"torch": "2.13.0+cpu", "transformers": "5.24.0", ...}, every record's `libraries`
    distribution_version("PyStemmer")   # "3.1.0", or None when it is not installed
    versions_line()               # "isorank 0.1.0, torch 2.13.0+cpu, ...": the line a Markdown record carries

The one collector of versions: every result set (metrics/results.py `versions.json`), analysis (analyses/outputs.py)
and dated record under results/ (bench/record.py, grid/record.py) takes its `libraries` from here. Versions are read
from the installed distributions' metadata (importlib.metadata), not from a module's `__version__`: nothing is
imported (this layer knows no training framework), and a module without `__version__` (PyStemmer) still has one.
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["LIBRARIES", "FAISS", "distribution_version", "library_versions", "versions_line"]

# the distributions whose version decides a result: the project itself, the model stack, the BM25 stack and metrics
LIBRARIES = (
    "isorank",
    "torch",
    "transformers",
    "tokenizers",
    "pytorch-lightning",
    "bm25s",
    "PyStemmer",
    "pytrec-eval-terrier",
    "numpy",
)
# faiss is one module shipped by several distributions (README: the GPU build replaces faiss-cpu's files); each that is
# installed is recorded, none when none is
FAISS = ("faiss-cpu", "faiss-gpu-cu12", "faiss-gpu")


def distribution_version(name: str) -> str | None:
    """Return the installed version of distribution `name` (importlib.metadata), or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Return {distribution: version} of `LIBRARIES` (None: not installed) and of each installed faiss build."""
    found = {name: distribution_version(name) for name in LIBRARIES}
    found.update({name: v for name in FAISS if (v := distribution_version(name)) is not None})
    return found


def versions_line() -> str:
    """Return `library_versions()` as one line, `name version` comma-separated (`not installed` for None)."""
    return ", ".join(f"{k} {v or 'not installed'}" for k, v in library_versions().items())
