"""One run per output directory: an exclusive lock that a job holds from before its first write to its end.

The lock is the file `.<name>.lock` beside the output directory `<name>`, not inside it: a run stopped by bad input
must leave no folder behind, and `stage=export` renames a finished folder into place. The holder writes its pid and
host into `.<name>.lock.pid` (not into the lock file, which every contender opens). filelock's FileLock is flock(2)
on Linux, which the kernel drops when its holder dies, so a killed run (even by SIGKILL) never blocks the next one:
its two leftover files are taken over. A job that ends, normally or by an exception, removes both files and the
parent folders it created for them, if they stayed empty; so is `output_dir` itself when this job made it and it is
empty (an error, a signal or a rank's death before any file was kept there). When rank 0 (the holder) dies under
DDP, a surviving rank removes it as rank 0 would: rank 0 says in `CREATED_VARIABLE`, which the ranks it starts
inherit, that it made the folder (an `output_dir` that existed before the job stays, empty or not).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from core.errors import InputError
from core.io import PATH_ERRNOS, WriteFault, atomic_open, reason_of
from core.progress import phase
from core.ranks import as_rank_death, global_rank_zero

CREATED_VARIABLE = "ISORANK_OUTPUT_DIR_CREATED"  # output_dir, resolved, when the lock's holder made it (rank 0)


def lock_files(output_dir: str | os.PathLike) -> tuple[Path, Path]:
    """(lock file, pid file) of `output_dir`; resolved, so two spellings of one folder share a lock."""
    out = Path(output_dir).resolve()
    return out.parent / f".{out.name}.lock", out.parent / f".{out.name}.lock.pid"


@contextmanager
def output_dir_lock(output_dir: str | os.PathLike) -> Iterator[None]:
    """Hold `output_dir`'s lock for the block (on global rank 0 only; other ranks run the block without it).

    When another process holds it: InputError naming the folder and the holder's pid. An `output_dir` that exists
    and is not a folder is an InputError too; a lock that cannot be written beside it is a WriteFault.
    """
    if not global_rank_zero():
        try:
            yield
        except BaseException as e:
            if os.environ.get(CREATED_VARIABLE) == str(_resolved(output_dir)):
                dead = as_rank_death(e)
                if dead is not None and dead.rank == 0:  # the holder died: nobody else will remove it
                    _remove_if_empty(Path(output_dir))
            raise
        return
    if Path(output_dir).exists() and not Path(output_dir).is_dir():
        # checked here, before the first write of every job, not when the first results file fails to be written
        raise InputError("output_dir", f"'{output_dir}' exists and is not a folder; choose another output_dir")
    made = not Path(output_dir).exists()  # by this job, if at all: removed at its end if it stayed empty
    lock_path, pid_path = lock_files(output_dir)
    created = [p for p in (lock_path.parent, *lock_path.parent.parents) if not p.exists()]
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError("output_dir", f"cannot create '{lock_path.parent}' ({e.strerror})") from e
    lock = FileLock(lock_path, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise InputError(
            "output_dir",
            f"'{output_dir}' is in use by another run ({_holder(pid_path)}); "
            "wait for it to end or choose another output_dir",
        ) from None
    except OSError as e:  # a folder the user may not write: found here, before anything is loaded
        _remove_created(created)
        raise _lock_fault(lock_path, e) from e
    before = os.environ.get(CREATED_VARIABLE)
    if made:
        os.environ[CREATED_VARIABLE] = str(_resolved(output_dir))
    else:
        os.environ.pop(CREATED_VARIABLE, None)
    try:
        try:
            with atomic_open(pid_path) as f:
                f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        except WriteFault as e:
            raise _lock_fault(pid_path, e) from e
        yield
    finally:
        if before is None:  # a grid runs many jobs in one process: the next one says its own
            os.environ.pop(CREATED_VARIABLE, None)
        else:
            os.environ[CREATED_VARIABLE] = before
        if made:
            _remove_if_empty(Path(output_dir))
        pid_path.unlink(missing_ok=True)
        # Unlinked while still held: filelock discards a lock won on an unlinked file, so a contender that opened
        # this one just now retries on a fresh file instead of sharing the lock with the next holder.
        lock_path.unlink(missing_ok=True)
        lock.release()
        _remove_created(created)


def _resolved(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir).resolve()


def _remove_if_empty(folder: Path) -> None:
    """Remove `folder` if it is empty: a job's own output folder that kept nothing."""
    try:
        folder.rmdir()
    except OSError:  # it holds something (a result, a checkpoint, a log), or it is gone already
        pass


def _remove_created(created: list[Path]) -> None:
    for folder in created:  # deepest first; a folder that holds anything (the run's output) stays
        try:
            folder.rmdir()
        except OSError:
            break


def _lock_fault(path: Path, e: BaseException) -> WriteFault:
    """Return the WriteFault for a lock (or its pid file) that cannot be written beside output_dir.

    One line, exit 2 for a folder the user may not write, 1 for a fault of the machine.
    """
    err = e if isinstance(e, OSError) else None
    errno_ = err.errno if err is not None else getattr(e, "errno", None)
    reason = reason_of(e) if not isinstance(e, WriteFault) else e.reason
    return WriteFault(
        path,
        reason,
        "output_dir's lock lives in the folder that holds output_dir; nothing was loaded or written",
        code=2 if errno_ in PATH_ERRNOS else 1,
        errno_=errno_,
        key="output_dir",
    )


@contextmanager
def build_lock(target: str | os.PathLike, what: str = "cache") -> Iterator[None]:
    """Hold `<target>.lock` while this process builds `target` (a cache folder or file); other processes wait.

    The folders made for the lock are made here (a folder that cannot be made is an InputError naming it and `what`)
    and, with the lock file, removed on the way out when they stayed empty: a build stopped by bad input (a duplicate
    id found while the document store is written) leaves no trace in `data.cache_dir`.
    """
    lock_path = Path(f"{target}.lock")
    for attempt in range(3):  # a folder that a finishing build removes between our mkdir and our open: make it again
        created = [p for p in (lock_path.parent, *lock_path.parent.parents) if not p.exists()]
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(lock_path)
            with phase(f"waiting for another process to build the {what} {target}", key="waiting for another process"):
                lock.acquire()
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
        except OSError as e:
            raise InputError(
                str(lock_path.parent),
                f"cannot create the {what} folder ({e.strerror}); expected a writable data.cache_dir",
            ) from None
    try:
        yield
    finally:
        lock_path.unlink(missing_ok=True)  # while held, as in output_dir_lock
        lock.release()
        _remove_created(created)


@contextmanager
def claim(lock_path: str | os.PathLike) -> Iterator[bool]:
    """Hold the lock file `lock_path` for the block when no other process holds it (True), else do nothing (False).

    It never waits: this is how several processes share a list of jobs, each taking the ones nobody has.
    """
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock_path.unlink(missing_ok=True)  # while held, as in output_dir_lock
        lock.release()


def _holder(pid_path: Path) -> str:
    try:
        return pid_path.read_text().strip() or "pid not yet written"
    except OSError:
        return "pid not yet written"
