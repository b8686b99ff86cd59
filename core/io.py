"""Atomic file and folder writes: a crash never leaves a half-written metrics file, run, checkpoint, index or export
behind."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from core.errors import InputError


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Write to a temp file in the same directory, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp creates 0600; results are meant to be shared like any file
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, obj) -> None:
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def _fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicDir:
    """`with AtomicDir(path) as tmp:` write files into `tmp`; on success they are fsynced and `tmp` replaces `path`
    (an existing directory of the same kind is swapped out and deleted); on error `tmp` is removed and `path` is
    untouched. A non-empty `path` without the file `marker` (an index's manifest.json) is never replaced: it is not
    ours to delete."""

    def __init__(self, path: str | os.PathLike, marker: str = "manifest.json", kind: str = "an index directory"):
        self.path, self.marker, self.kind = Path(path), marker, kind

    def __enter__(self) -> Path:
        p = self.path
        if p.exists() and (not p.is_dir() or (any(p.iterdir()) and not (p / self.marker).exists())):
            raise InputError(str(p), f"exists and is not {self.kind} (no {self.marker}); refusing to replace it")
        p.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.tmp-", dir=p.parent))
        os.chmod(self.tmp, 0o777 & ~current_umask())  # mkdtemp creates 0700; a cache or index is meant to be shared
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        for f in self.tmp.iterdir():
            _fsync_path(f)
        _fsync_path(self.tmp)
        old = None
        if self.path.exists():
            old = self.path.parent / f".{self.path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(self.path, old)
        os.rename(self.tmp, self.path)
        _fsync_path(self.path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False


def save_figure(fig, path: str | os.PathLike) -> Path:
    """A matplotlib figure to PNG via a temp file and rename (no half-written image), then closed."""
    import matplotlib.pyplot as plt  # heavy, and only analyses and figure callbacks draw

    path = Path(path)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path
