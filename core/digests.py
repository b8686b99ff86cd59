"""Digests of files, checked cheaply: the one implementation every cache and store keys and checks its files with.

    record = file_record(path)              # {"bytes", "sha256", "stat"}: kept in a cache's manifest when it is written
    record_problem(path, record)            # None, or what differs: the size at every read, the bytes when stat moved
    digest = input_digest(path, memo_dir)   # the SHA-256 of an input (a collection, a checkpoint), memoised

A file's `stat` is its (size, mtime in ns, inode); an input's adds the ctime (`input_stat`). A file whose stat is what
it was when its digest was taken holds the same bytes (an edit, even of the same size, moves the mtime; a file written
anew has another inode), so the digest is taken again only when the stat moved: a run that changed nothing hashes
nothing. An input's digest taken within
`RACY_S` of its mtime is not trusted on stat alone (a second write within the clock's tick could leave the stat as it
was), as git treats a racily clean index entry.

`input_digest` memoises in `<memo_dir>/<blake2b of the resolved path>.json` (its stat and SHA-256), so the first run
after an edit re-hashes it and later runs do not; it says when the content changed since the memo (`changed`), which
the callers turn into their one `warning:` line. `write_sidecar` / `sidecar_problem` keep a single-file cache's record
beside it (`<file>.sha256`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from core.io import atomic_open, file_sha256

RACY_S = 1.0  # a digest taken this soon after the file's mtime is not trusted on its stat alone
SIDECAR = ".sha256"  # JSON, named so that no glob of the cache files (*.json, *.npy) takes it

_seen: dict[str, tuple[list[int], str]] = {}  # this process's digests: resolved path -> (stat, SHA-256)


def stat_key(path: str | os.PathLike) -> list[int]:
    """Return the file's (size, mtime in ns, inode): what tells whether its bytes may have changed."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def input_stat(path: str | os.PathLike) -> list[int]:
    """Return an input's (size, mtime in ns, inode, ctime in ns).

    The ctime also moves when a same-size edit in place has its mtime set back (`touch -r`), which no one does to a
    cache's own files but may to a checkpoint or a file of data.
    """
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _trusted(stat: list[int], now_ns: int) -> bool:
    return now_ns - stat[1] >= RACY_S * 1e9


def file_record(path: str | os.PathLike) -> dict:
    """Return {"bytes", "sha256", "stat"} of a file just written: what a manifest keeps to check it when read."""
    stat = stat_key(path)
    return {"bytes": stat[0], "sha256": file_sha256(path), "stat": stat}


def record_problem(path: str | os.PathLike, record: dict) -> str | None:
    """None when `path` still holds the bytes of `record` (file_record), else what differs.

    The size is compared at every call; the SHA-256 only when the stat differs from the record's (once per process
    and stat: a second call with the same stat is free).
    """
    path = Path(path)
    try:
        now = stat_key(path)
    except OSError:
        return f"{path.name} is missing"
    if now[0] != record["bytes"]:
        return f"{path.name} has {now[0]} bytes, the manifest says {record['bytes']}"
    if now == record.get("stat"):  # the cache's own file, as written: no one edits it within the clock's tick
        return None
    if _digest_of(path, now) != record["sha256"]:
        return f"{path.name} does not match its checksum (same size, other bytes: changed since it was written)"
    return None


def _digest_of(path: Path, stat: list[int]) -> str:
    key = str(path.resolve())
    seen = _seen.get(key)
    if seen is not None and seen[0] == stat and _trusted(stat, time.time_ns()):
        return seen[1]
    digest = file_sha256(path)
    _seen[key] = (stat, digest)
    return digest


def memo_folder(cache_dir: str | os.PathLike) -> Path:
    """Return the folder of the input digests' memo in a cache folder: `<cache_dir>/digests/`."""
    return Path(cache_dir) / "digests"


def input_digest(path: str | os.PathLike, memo_dir: str | os.PathLike | None = None) -> tuple[str, str | None]:
    """Return (the SHA-256 of the file `path`, how it changed since the memo when its content did, else None).

    The change is "same size, other bytes" or "N -> M bytes".
    Re-hashed only when its stat moved since the memo in `memo_dir` (or this process's, without one).
    """
    path = Path(path)
    resolved = str(path.resolve())
    stat = input_stat(path)
    now_ns = time.time_ns()
    memo_path = (
        Path(memo_dir) / f"{hashlib.blake2b(resolved.encode(), digest_size=16).hexdigest()}.json" if memo_dir else None
    )
    memo = None
    if memo_path is not None:
        try:
            memo = json.loads(memo_path.read_text(encoding="utf-8"))
            if memo.get("path") != resolved:
                memo = None
        except (OSError, ValueError):
            memo = None
    if memo is None and resolved in _seen:
        memo = {"stat": _seen[resolved][0], "sha256": _seen[resolved][1], "trusted": True}
    if memo is not None and memo.get("stat") == stat and memo.get("trusted") and isinstance(memo.get("sha256"), str):
        return memo["sha256"], None
    digest = file_sha256(path)
    trusted = _trusted(stat, now_ns)
    _seen[resolved] = (stat, digest)
    if memo_path is not None:
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(memo_path) as f:
                json.dump({"path": resolved, "stat": stat, "sha256": digest, "trusted": trusted}, f)
        except OSError:
            pass  # a memo that cannot be written costs a hash next time, nothing else
    if memo is None or memo.get("sha256") in (None, digest):
        return digest, None
    was = memo["stat"][0] if isinstance(memo.get("stat"), list) and memo["stat"] else None
    return digest, ("same size, other bytes" if was == stat[0] else f"{was} -> {stat[0]} bytes")


def sidecar(path: str | os.PathLike) -> Path:
    """Return the record file of the single-file cache `path`: `<path>.sha256` beside it."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR)


def write_sidecar(path: str | os.PathLike, record: dict | None = None, **fields) -> None:
    """Write the record of the file `path` (file_record, or the one given, plus `fields`) beside it, atomically."""
    with atomic_open(sidecar(path)) as f:
        json.dump({**(record or file_record(path)), **fields}, f)


def sidecar_problem(path: str | os.PathLike, **fields) -> str | None:
    """None when `path` matches the record beside it (and the record holds `fields`), else what is wrong."""
    try:
        record = json.loads(sidecar(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"it has no checksum record ({sidecar(path).name}; written by an earlier version?)"
    except (OSError, ValueError) as e:
        return f"its checksum record is unreadable ({type(e).__name__})"
    for k, v in fields.items():
        if record.get(k) != v:
            return f"it was made from another {k.replace('_', ' ')}"
    try:
        return record_problem(path, record)
    except (KeyError, TypeError):
        return "its checksum record lacks bytes or sha256"
