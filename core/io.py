"""Atomic file and folder writes, and one `WriteFault` for a write that the machine refuses.

A crash never leaves a half-written metrics file, run, checkpoint, index or export behind; a write that the machine
refuses (full disk, file-size limit, permission, I/O error) is one `WriteFault`.

- `atomic_open` / `write_json` / `AtomicDir`: temp file (or temporary sibling folder), fsync, rename. Any OSError on
  the way, or torch.save's "enforce fail at inline_container.cc" (its writer's report of an OSError), becomes a
  `WriteFault` naming the file, the OS's reason and what was kept; the temp file is removed.
- `result_set`: the files of one result (metrics.json, per_query.json, run.trec, config.yaml, ...) staged in a hidden
  folder inside the output folder, then renamed into place as a set, metrics.json last, with SIGINT / SIGTERM held
  for the few renames: a folder holds either the earlier result or the new one, never a mix.
- `check_writable`: the probe every job runs on its output folders before it loads any data or model.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from core.errors import InputError
from core.progress import phase

# errno values that say the path itself cannot be used (a choice of the user: exit 2 when found before the job
# starts); every other write failure (full disk, quota, file-size limit, I/O error) is a fault of the machine (exit 1)
PATH_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
    errno.ENAMETOOLONG,
    errno.ELOOP,
    errno.ENOENT,
}


class WriteFault(Exception):
    """A write the machine refused: `path`, the OS's reason, and what was kept.

    `code`: the exit code (1: a fault of the machine; 2: found by the probe before the job started, on a path the user
    chose).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        reason: str,
        kept: str,
        code: int = 1,
        errno_: int | None = None,
        key: str | None = None,
    ):
        self.path, self.reason, self.kept, self.code, self.errno = str(path), reason, kept, code, errno_
        super().__init__((f"{key}: " if key else "") + f"cannot write '{path}' ({reason}); {kept}")


def os_error_of(exc: BaseException) -> OSError | None:
    """Return the OSError behind `exc`, or None.

    That is `exc` itself, or the one torch.save's C++ writer reports as "enforce fail at inline_container.cc" (Python
    keeps it as the RuntimeError's context). A TimeoutError or ConnectionError is not a write failure: None.
    """
    if isinstance(exc, OSError):
        return None if isinstance(exc, (TimeoutError, ConnectionError)) else exc
    if not torch_write_failure(exc):
        return None
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # Rust writers (safetensors' save_file, tokenizers)
_FAISS_WRITE = re.compile(r"write error in .*\((?P<reason>[^()]+)\)\s*$")  # faiss.write_index


def torch_write_failure(exc: BaseException) -> bool:
    """Tell whether `exc` is torch.save's report of a failed write (a RuntimeError from its C++ zip writer)."""
    return isinstance(exc, RuntimeError) and (
        "inline_container.cc" in str(exc) or "PytorchStreamWriter failed" in str(exc)
    )


def _library_reason(exc: BaseException) -> str | None:
    """Return the OS's reason in the message of a library's writer that does not raise OSError (safetensors, faiss)."""
    text = str(exc)
    m = _OS_ERROR.search(text)
    if m and ("I/O error" in text or "serializ" in text.lower()):
        return os.strerror(int(m.group(1)))
    m = _FAISS_WRITE.search(text.strip().splitlines()[-1] if text.strip() else "")
    if m and "faiss" in text:
        return m.group("reason")
    return None


_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")  # NumPy's tofile, which drops errno


def reason_of(exc: BaseException) -> str:
    """Return why a write failed, for a WriteFault's message.

    The OS's reason (strerror) when an OSError is behind `exc`, else the reason a library writer's message names,
    else torch.save's first line.
    """
    e = os_error_of(exc)
    if e is not None and e.strerror:
        return e.strerror
    if e is not None:
        m = _SHORT_WRITE.search(str(e))
        if m:
            return (
                f"the write stopped short, {m.group(2)} of {m.group(1)} items written: a full disk or a file-size limit"
            )
        return str(e) or type(e).__name__
    lib = _library_reason(exc)
    if lib is not None:
        return lib
    return f"torch.save failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def as_write_fault(exc: BaseException, path: str | os.PathLike, kept: str) -> WriteFault | None:
    """Return `exc` as a WriteFault on `path` that says what was `kept`, or None when it is not a write failure.

    A write failure is an OSError, torch.save's report of one, or a library writer's (safetensors, faiss) that names
    the OS's reason.
    """
    if isinstance(exc, WriteFault):
        return exc
    if not isinstance(exc, Exception):
        return None
    if os_error_of(exc) is None and not torch_write_failure(exc) and _library_reason(exc) is None:
        return None
    e = os_error_of(exc)
    return WriteFault(path, reason_of(exc), kept, errno_=e.errno if e is not None else None)


def path_in_traceback(exc: BaseException) -> str | None:
    """Return the file being written when a plain `f.write` raised the OSError `exc` (which names no file), or None.

    The file is read from the innermost frames' locals: an open file object's name, else a local path such as `path`,
    `folder` or `spill_dir`.
    """
    import io as _io

    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames[-6:]):
        values = list(frame.f_locals.items())
        own = frame.f_locals.get("self")
        values += [(a, getattr(own, a)) for a in ("_file", "file", "path") if own is not None and hasattr(own, a)]
        for _, v in values:
            if isinstance(v, _io.IOBase) and isinstance(getattr(v, "name", None), str):
                return v.name
        for k, v in values:
            if isinstance(v, Path) and any(w in k for w in ("path", "dir", "folder", "file", "tmp", "out")):
                return str(v)
    return None


def _kept(path: Path) -> str:
    return f"the earlier {path.name} is unchanged" if path.exists() else "no partial file was left"


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Write to a temp file in the same directory, fsync, then rename over `path`; a failed write is a WriteFault."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp creates 0600; results are meant to be shared like any file
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        fault = None if isinstance(e, WriteFault) else as_write_fault(e, path, _kept(path))
        if fault is not None:
            raise fault from e
        raise


LOUD_HASH_BYTES = 1 << 28  # files from this size are checksummed as a phase (core/progress.py): 0.5 s and more


def file_sha256(path: str | os.PathLike) -> str:
    """Return the SHA-256 of a file's bytes, read in 8 MB blocks (how every cache checks its files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < LOUD_HASH_BYTES:
            while block := f.read(1 << 23):
                h.update(block)
            return h.hexdigest()
        # a collection or a triples file: seconds to minutes (about 2 s per GB here)
        with phase(f"checksumming {path} ({size / 1e9:.1f} GB)", total=size >> 20, unit="MB", key="checksumming") as p:
            while block := f.read(1 << 23):
                h.update(block)
                p.advance(len(block) >> 20)
    return h.hexdigest()


def current_umask() -> int:
    """Return the process's umask (read by setting it, so it is set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, obj) -> None:
    """Write `obj` to `path` as JSON (indented, keys sorted) through `atomic_open`; a refused write is a WriteFault."""
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
    """A folder written whole or not at all: a temporary sibling that replaces `path` on success.

    `with AtomicDir(path) as tmp:` write files into `tmp`; on success they are fsynced and `tmp` replaces `path`
    (an existing directory of the same kind is swapped out and deleted); on error `tmp` is removed and `path` is
    untouched. A non-empty `path` without the file `marker` (an index's manifest.json) is never replaced: it is not
    ours to delete.
    """

    def __init__(self, path: str | os.PathLike, marker: str = "manifest.json", kind: str = "an index directory"):
        self.path, self.marker, self.kind = Path(path), marker, kind

    def check(self) -> None:
        """Refuse (InputError) a `path` this would not replace; a job calls it before it loads anything."""
        p = self.path
        if p.is_symlink() and not p.exists():
            raise InputError(
                str(p),
                f"is a symbolic link to '{os.readlink(p)}', which does not exist; create the link's target or choose "
                "another folder",
            )
        if p.exists() and (not p.is_dir() or (any(p.iterdir()) and not (p / self.marker).exists())):
            raise InputError(str(p), f"exists and is not {self.kind} (no {self.marker}); refusing to replace it")

    def __enter__(self) -> Path:
        p = self.path
        self.check()
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.tmp-", dir=p.parent))
            os.chmod(self.tmp, 0o777 & ~current_umask())  # mkdtemp creates 0700; a cache or index is meant to be shared
        except OSError as e:
            raise WriteFault(p, reason_of(e), self._kept()) from e
        return self.tmp

    def _kept(self) -> str:
        return f"the earlier {self.path.name} is unchanged" if self.path.exists() else "no partial folder was left"

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            fault = as_write_fault(exc, self.path, self._kept())
            if fault is not None and fault is not exc:
                raise fault from exc
            return False
        old = None
        try:
            for f in self.tmp.iterdir():
                _fsync_path(f)
            _fsync_path(self.tmp)
            with signals_held():  # the old folder is never left renamed away by an interrupt
                if self.path.exists():
                    old = self.path.parent / f".{self.path.name}.old-{uuid.uuid4().hex[:8]}"
                    os.rename(self.path, old)
                os.rename(self.tmp, self.path)
            _fsync_path(self.path.parent)
        except BaseException as e:  # an interrupt or a refused write before the rename: no temporary folder stays
            shutil.rmtree(self.tmp, ignore_errors=True)
            if isinstance(e, OSError):
                raise WriteFault(self.path, reason_of(e), self._kept()) from e
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP are held (delivered when the block ends) for a few renames that must go together."""
    held = {signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# output folders whose result set was published by this process (the interrupt message says they are complete)
PUBLISHED: set[Path] = set()


@contextmanager
def result_set(
    out: str | os.PathLike, last: str = "metrics.json", retire: tuple[Path, ...] = (), shared: bool = False
) -> Iterator[Path]:
    """Publish one result's files into `out` as a set: all of them, or on any error none.

    `with result_set(out) as tmp:` write one result's files (and folders, e.g. an index) into `tmp`, a hidden
    folder inside `out` that no reader looks at; on success they are fsynced and renamed into `out` as a set: the
    earlier `last` (metrics.json, the mark of a finished run) is removed first, `last` is renamed in last, with
    SIGINT / SIGTERM held throughout, and the files in `retire` (a pending attempt's config) are removed with them.
    On any error or interrupt `tmp` is removed and `out` holds the earlier result unchanged; a refused write is a
    WriteFault saying so, a file of the set whose place holds a folder (or the reverse) before anything is renamed.
    `shared`: other processes may publish into `out` at once (a grid's folder): only staged sets older than an hour
    (left by a killed process) are removed, not another's live one.
    """
    out = Path(out)
    kept = f"earlier results in '{out}' unchanged" if (out / last).exists() else f"no result was written to '{out}'"
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob(".results.tmp-*"):  # a set staged by a killed job (this job holds out's lock)
            if not shared or time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".results.tmp-", dir=out))
    except OSError as e:
        raise WriteFault(out, reason_of(e), kept) from e
    try:
        yield tmp
        names = sorted(p.name for p in tmp.iterdir() if p.name != last) + ([last] if (tmp / last).exists() else [])
        mask = current_umask()
        for name in names:
            if not (tmp / name).is_dir():  # a folder of the set was written by AtomicDir, fsynced and shareable
                os.chmod(tmp / name, 0o666 & ~mask)
                _fsync_path(tmp / name)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        fault = as_write_fault(e, getattr(e, "path", None) or out, kept)
        if fault is not None:
            if isinstance(e, WriteFault):  # a file of the staged set: name its place in `out`
                fault = WriteFault(
                    out / Path(e.path).name if Path(e.path).parent == tmp else e.path, e.reason, kept, errno_=e.errno
                )
            raise fault from e
        raise
    for name in names:  # os.replace cannot put a file over a folder: refused before the first rename
        target, staged = out / name, tmp / name
        if target.exists() and target.is_dir() != staged.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            what = "a folder, not a file" if target.is_dir() else "a file, not a folder"
            raise WriteFault(target, f"it is {what}", f"{kept}; move it away", code=2, errno_=errno.EISDIR)
    olds = []
    try:
        with signals_held():
            (out / last).unlink(missing_ok=True)  # from here until `last` is back, the folder reads as unfinished
            for name in names:
                if (tmp / name).is_dir() and (out / name).exists():  # a folder of the set (an index): swapped
                    olds.append(out / f".{name}.old-{uuid.uuid4().hex[:8]}")
                    os.rename(out / name, olds[-1])
                os.replace(tmp / name, out / name)
            for p in retire:
                Path(p).unlink(missing_ok=True)
            _fsync_path(out)
    except OSError as e:
        raise WriteFault(out / last, reason_of(e), f"'{out}' holds no finished result (no {last})") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for old in olds:
            shutil.rmtree(old, ignore_errors=True)
    for p in retire:  # an attempt's folder left empty
        for folder in (Path(p).parent, Path(p).parent.parent):
            try:
                folder.rmdir()
            except OSError:
                break
    PUBLISHED.add(out.resolve())


# The folders the caches keep in `data.cache_dir`, one per family (docs/reliability.md "Caches": what keys each):
# a file or a dangling link in one's place is found by the job's first checks (`check_cache_folders`), not when the
# family first writes there, after the data loaded. tests/test_faults_checks.py keeps this list in step with the code.
CACHE_FOLDERS = (
    "bm25",
    "digests",
    "docpairs",
    "docstore",
    "representations",
    "single_tokens",
    "tokens",
    "triples",
)


def check_cache_folders(cache_dir: str | os.PathLike, key: str = "data.cache_dir") -> None:
    """Refuse a cache folder whose family folder (`CACHE_FOLDERS`) is a file or a dangling link, naming it."""
    check_subfolders(cache_dir, {name: f"the {name} cache is kept in that folder" for name in CACHE_FOLDERS}, key)


# The folders a job writes in its output_dir: a file in one's place is refused before anything loads
OUTPUT_FOLDERS = {
    "checkpoints": "the run's checkpoints are written there",
    "attempts": "a continued run's attempt is written there",
}


def check_subfolders(parent: str | os.PathLike, folders: dict[str, str], key: str) -> None:
    """Refuse a folder of `folders` ({name: what it is for}) inside `parent` that is a file or a dangling link."""
    for name, role in folders.items():
        q = Path(parent) / name
        if q.is_symlink() and not q.exists():
            what = f"a symbolic link to '{os.readlink(q)}', which does not exist"
        elif q.exists() and not q.is_dir():
            what = "a file, not a folder"
        else:
            continue
        raise WriteFault(
            q,
            f"it is {what}; {role}",
            f"move it away or choose another {key}; nothing was loaded or written",
            code=2,
            errno_=errno.ENOTDIR,
            key=key,
        )


def check_writable(path: str | os.PathLike, key: str) -> None:
    """Probe that `path` can be written: every job runs this before it loads data or a model.

    `path` (created if missing) takes a file that is written, renamed and removed. Folders it created are removed
    again, so a job stopped later by bad input leaves nothing behind. A refusal is a WriteFault naming `key` and the
    path: exit 2 for a path the user cannot use (permission, read-only file system, not a folder), 1 for a fault of
    the machine (full disk, I/O error).
    """
    p = Path(path)
    # a dangling symbolic link on the way: mkdir would say "File exists" of a folder that does not
    dangling = next((q for q in (p, *p.parents) if q.is_symlink() and not q.exists()), None)
    if dangling is not None:
        raise WriteFault(
            dangling,
            f"it is a symbolic link to '{os.readlink(dangling)}', which does not exist",
            "create the link's target or choose another folder; nothing was loaded or written",
            code=2,
            errno_=errno.ENOENT,
            key=key,
        )
    # a file where a folder is expected, the path itself or a folder above it: mkdir would say "File exists" or
    # "Not a directory", which reads as if the folder were there
    blocking = next((q for q in (p, *p.parents) if q.exists() and not q.is_dir()), None)
    if blocking is not None:
        raise WriteFault(
            blocking,
            "it is a file, not a folder",
            "move it away or choose another folder; nothing was loaded or written",
            code=2,
            errno_=errno.ENOTDIR,
            key=key,
        )
    created = [q for q in (p, *p.parents) if not q.exists()]
    probe = p / f".write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        times = None if created else (p.stat().st_atime_ns, p.stat().st_mtime_ns)
    except OSError:
        times = None
    renamed = probe.with_suffix(".renamed")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(probe, renamed)
    except OSError as e:
        code = 2 if e.errno in PATH_ERRNOS else 1
        raise WriteFault(
            p,
            reason_of(e),
            "choose a folder this job can write; nothing was loaded or written",
            code=code,
            errno_=e.errno,
            key=key,
        ) from e
    finally:
        # whatever ended the probe (a refusal, or SIGINT / SIGTERM raised inside it), it leaves no trace: no probe
        # file, an existing folder's times as they were, no folder it made
        with signals_held():
            for q in (probe, renamed):
                with contextlib.suppress(OSError):
                    q.unlink()
            if times is not None:
                with contextlib.suppress(OSError):
                    os.utime(p, ns=times)
            for q in created:  # deepest first
                try:
                    q.rmdir()
                except OSError:
                    break


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Save a matplotlib figure to PNG via a temp file and rename (no half-written image), then close it."""
    import matplotlib.pyplot as plt  # heavy, and only analyses and figure callbacks draw

    path = Path(path)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path
