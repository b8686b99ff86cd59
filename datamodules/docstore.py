"""A collection on disk, read by id: the document store of every large source (MS MARCO's 8.8M passages).

    store = open_store(cache_dir, fingerprint, records, origin="collection.tsv")   # built once, then opened
    store["7"]          # the passage text of doc id "7" (a Mapping[str, str], like the dict it replaces)
    store.rows(ids)     # doc ids -> row numbers, vectorised (-1: unknown)

Why: a Python dict of the collection costs about 0.5 KB per passage in every DDP rank and DataLoader worker (4.4 GB a
rank for MS MARCO). The store is an Arrow IPC file (pyarrow; the format Hugging Face `datasets` keeps, without its
dependencies), memory-mapped, so every rank and worker shares one copy through the page cache and a rank's own
memory for the collection is the id -> row index below, itself memory-mapped.

Layout of `<cache_dir>/docstore/<fingerprint[:32]>/`:

- `docs.arrow`: columns `id`, `text` (UTF-8), rows in the source's order (the order the dict had), record batches of
  `BATCH_ROWS` rows (the manifest says how many), so row r is row r % BATCH_ROWS of batch r // BATCH_ROWS;
- `index_keys.npy`, `index_rows.npy`: the 64-bit BLAKE2b key of every id, sorted, and each key's row: a lookup is a
  binary search and a check that the row's id is the asked one (so a key collision costs a step, never a wrong text);
- `sorted_rows.npy`: the rows in sorted doc-id order (BM25 indexes in that order; ties are broken by doc id);
- `manifest.json`, written last: count, fingerprint, origin, and every file's record (core.digests.file_record: bytes,
  SHA-256, stat when written). Sizes are compared at every open, the bytes when a file's (size, mtime, inode) moved
  since it was written, so a same-size edit of docs.arrow is found; a folder that does not match is rebuilt with a
  warning.

The fingerprint names the content: `fingerprint(...)` combines the source files' SHA-256 with the reader's settings,
so an edited file gets a new store and an unchanged one is reused by every run, split and rank. The digests are
memoised by (size, mtime, inode) in `<cache_dir>/digests/` (core.digests.input_digest), so an unchanged collection is
not read to be named; an edited one is re-hashed and named in one warning. One process builds while the others wait
on a file lock; the folder appears whole (written to a temp folder, then renamed).

Beside a store, built on first use and keyed by its fingerprint: `<fingerprint[:32]>-texts/`, its text -> row index
(`open_text_index`: the 64-bit BLAKE2b key of every text, sorted, with its row; a hit is confirmed by reading the
text), which text triples resolve passages with. `StackedStore` reads two stores as one collection (the rows of the
second after those of the first): a collection plus the passages that text triples add to it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import struct
import tempfile
import warnings
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from core.digests import file_record, input_digest, memo_folder, record_problem
from core.errors import InputError
from core.io import AtomicDir, current_umask
from core.lock import build_lock
from core.progress import phase

STORE_VERSION = 2  # 2: every file's record (docs.arrow's SHA-256 included), input digests memoised
BATCH_ROWS = 1 << 16
ROWS_CHUNK = 1 << 20  # ids `DocStore.rows` resolves at once
_FILES = ("docs.arrow", "index_keys.npy", "index_rows.npy", "sorted_rows.npy")


def id_key(doc_id: str) -> int:
    """Return the 64-bit key of a doc id in the store's index (BLAKE2b, the same in every process: hash() is salted)."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


def _blake8(data: bytes) -> bytes:
    """Return the 8-byte BLAKE2b digest of `data`: `id_key`'s little-endian bytes."""
    return hashlib.blake2b(data, digest_size=8).digest()


def fingerprint(kind: str, paths: Iterable[Path], *, cache_dir: str | os.PathLike | None = None, **settings) -> str:
    """Return the SHA-256 of a source's files (their SHA-256, in the given order) and the reader's settings.

    It is the store's name. A file is hashed (about 2 s per GB here) only when its (size, mtime, inode) moved since
    its digest was memoised in `<cache_dir>/digests/`; a content change since then is said in one warning.
    """
    h = hashlib.sha256(json.dumps({"kind": kind, "version": STORE_VERSION, **settings}, sort_keys=True).encode())
    for path in paths:
        digest, changed = input_digest(path, memo_folder(cache_dir) if cache_dir is not None else None)
        if changed is not None:
            warnings.warn(
                f"{path}: changed since the caches were made from it ({changed}); they are made again from its content",
                stacklevel=2,
            )
        h.update(b"\0file\0" + digest.encode())
    return h.hexdigest()


class RowStore(Mapping[str, str]):
    """A read-only Mapping doc id -> text whose documents have rows 0..len-1.

    Subclasses give `row(doc_id)`, `text_at(row)`, `id_at(row)`, `__len__`, `__iter__` and `_sorted_rows`; the lookups
    by id are shared.
    """

    # the texts were checked (non-empty, ids unique) when the store was built: IRDataset.validate need not read them
    texts_checked = True
    _sorted_rows: np.ndarray

    def row(self, doc_id: str) -> int:
        """Return the row of `doc_id`, -1 when the store does not hold it (each subclass implements it)."""
        raise NotImplementedError

    def text_at(self, row: int) -> str:
        """Return the text of row `row` (each subclass implements it)."""
        raise NotImplementedError

    def id_at(self, row: int) -> str:
        """Return the doc id of row `row` (each subclass implements it)."""
        raise NotImplementedError

    def rows(self, doc_ids: Iterable[str]) -> np.ndarray:
        """Rows of many doc ids (int64, -1 for unknown ones)."""
        return np.fromiter((self.row(d) for d in doc_ids), dtype=np.int64)

    @property
    def ids(self) -> StoreIds:
        """The doc ids in row order (the source's order), a lazy sequence: ids[i] reads row i."""
        return StoreIds(self)

    def sorted_rows(self) -> np.ndarray:
        """Return the rows in sorted doc-id order (memory-mapped)."""
        return self._sorted_rows

    def __getitem__(self, doc_id: str) -> str:
        r = self.row(doc_id) if isinstance(doc_id, str) else -1
        if r < 0:
            raise KeyError(doc_id)
        return self.text_at(r)

    def __contains__(self, doc_id) -> bool:
        return isinstance(doc_id, str) and self.row(doc_id) >= 0


class DocStore(RowStore):
    """The collection of one store folder (module docstring), a read-only Mapping doc id -> text.

    Its texts live in a memory-mapped Arrow file. Pickles as its folder, so DataLoader workers reopen it instead of
    copying it.
    """

    def __init__(self, folder: str | os.PathLike):
        import pyarrow as pa  # the store's only user of pyarrow; heavy to import

        self.folder = Path(folder)
        manifest = json.loads((self.folder / "manifest.json").read_text())
        self.fingerprint: str = manifest["fingerprint"]
        self.origin: str = manifest["origin"]
        self._n = int(manifest["count"])
        self._batch_rows = int(manifest["batch_rows"])
        mapped = pa.memory_map(str(self.folder / "docs.arrow"), "r")
        base = mapped.read_buffer(1).address
        self._reader = pa.ipc.open_file(mapped)
        self._batches = [self._reader.get_batch(i) for i in range(self._reader.num_record_batches)]
        # Single texts are read with pread at their file offsets, not through the mapping: a page fault maps the whole
        # page-cache folio around it (2 MB on this project's kernel), so 1,600 random reads showed as 284 MB of the
        # process's RSS; pread leaves it in the page cache. Per column, per batch: (file offset of its int32 offsets,
        # file offset of its bytes). The mapping serves the bulk readers (__iter__, items).
        self._cols = {name: [_file_offsets(b.column(name), base) for b in self._batches] for name in ("id", "text")}
        self._fd = os.open(self.folder / "docs.arrow", os.O_RDONLY)
        self._keys = np.load(self.folder / "index_keys.npy", mmap_mode="r")
        self._key_rows = np.load(self.folder / "index_rows.npy", mmap_mode="r")
        self._sorted_rows = np.load(self.folder / "sorted_rows.npy", mmap_mode="r")

    def __getstate__(self):
        return {"folder": str(self.folder)}

    def __setstate__(self, state):
        self.__init__(state["folder"])

    def __repr__(self) -> str:
        return f"DocStore({self._n} documents, {self.folder})"

    # ---- rows ------------------------------------------------------------------------------------------------
    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
            self._fd = None

    def _bytes(self, column: str, row: int) -> bytes:
        b, i = divmod(int(row), self._batch_rows)
        offsets_at, data_at = self._cols[column][b]
        start, end = struct.unpack("<ii", os.pread(self._fd, 8, offsets_at + 4 * i))
        return os.pread(self._fd, end - start, data_at + start)

    def _string(self, column: str, row: int) -> str:
        return self._bytes(column, row).decode("utf-8")

    def _column_batch(self, column: str, b: int) -> tuple[np.ndarray, bytes]:
        """Return (offsets from 0, UTF-8 bytes) of column `column` in record batch `b`, read with pread.

        A pass over the whole collection through the mapping would leave every page of it in this process's RSS.
        """
        n = self._batches[b].num_rows
        offsets_at, data_at = self._cols[column][b]
        offsets = np.frombuffer(os.pread(self._fd, 4 * (n + 1), offsets_at), dtype="<i4").astype(np.int64)
        data = os.pread(self._fd, int(offsets[-1] - offsets[0]), data_at + int(offsets[0])) if n else b""
        return offsets - offsets[0], data

    def _spans(self, column: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (file offset of the first byte, of the byte after the last) of column `column` in each of `rows`.

        Vectorised over the rows of each record batch (its int32 offsets are read through the mapping: 4 bytes a row).
        """
        rows = np.asarray(rows, dtype=np.int64)
        starts, ends = np.empty(len(rows), dtype=np.int64), np.empty(len(rows), dtype=np.int64)
        batch, at = np.divmod(rows, self._batch_rows)
        order = np.argsort(batch, kind="stable")
        cuts = np.flatnonzero(np.diff(batch[order])) + 1
        for part in np.split(order, cuts) if len(order) else ():
            b = int(batch[part[0]])
            array = self._batches[b].column(column)
            offsets = np.frombuffer(array.buffers()[1], dtype="<i4")[array.offset : array.offset + len(array) + 1]
            data_at = self._cols[column][b][1]
            starts[part] = data_at + offsets[at[part]]
            ends[part] = data_at + offsets[at[part] + 1]
        return starts, ends

    def text_at(self, row: int) -> str:
        """Return the text of row `row`, read with pread (not through the mapping: see `__init__`)."""
        return self._string("text", row)

    def text_bytes_at(self, row: int) -> bytes:
        """Return the text of row `row` as UTF-8 bytes (no decoding: how the text index confirms a hit)."""
        return self._bytes("text", row)

    def id_at(self, row: int) -> str:
        """Return the doc id of row `row`, read with pread."""
        return self._string("id", row)

    def rows(self, doc_ids: Iterable[str]) -> np.ndarray:
        """Rows of many doc ids (int64, -1 for unknown ones), one vectorised search of the id index.

        A run's candidates are millions of ids (MS MARCO's 6.9M): one binary search and one read per id cost ~13 us
        each. Here the keys are searched at once and each hit is confirmed by its id's bytes; an id whose first key
        match is not it (a 64-bit key collision) takes `row`'s walk over the equal keys. The ids are taken `ROWS_CHUNK`
        at a time, so the encoded ids held at once stay ~100 MB however long the run.
        """
        it = iter(doc_ids)
        parts = []
        while chunk := list(itertools.islice(it, ROWS_CHUNK)):
            parts.append(self._chunk_rows(chunk))
        return np.concatenate(parts) if parts else np.full(0, -1, dtype=np.int64)

    def _chunk_rows(self, ids: list[str]) -> np.ndarray:
        """`rows` of one chunk of ids."""
        out = np.full(len(ids), -1, dtype=np.int64)
        if not ids or not self._n:
            return out
        encoded = [d.encode("utf-8") for d in ids]
        keys = np.frombuffer(b"".join(_blake8(e) for e in encoded), dtype="<u8")  # id_key of each, at once
        at = np.searchsorted(self._keys, keys)
        hit = np.flatnonzero((at < self._n) & (self._keys[np.minimum(at, self._n - 1)] == keys))
        rows = np.asarray(self._key_rows[at[hit]], dtype=np.int64)
        starts, ends = self._spans("id", rows)
        found = np.zeros(len(hit), dtype=bool)
        # the ids are read batch by batch: one pread of the span that holds a batch's hits when they are dense in it
        # (a run's candidates), else one pread an id
        batch = rows // self._batch_rows
        order = np.argsort(batch, kind="stable")
        for part in np.split(order, np.flatnonzero(np.diff(batch[order])) + 1) if len(order) else ():
            a, b = starts[part], ends[part]
            lo, hi = int(a.min()), int(b.max())
            wanted = [encoded[i] for i in hit[part].tolist()]
            if hi - lo <= 256 * len(part):
                block = os.pread(self._fd, hi - lo, lo)
                got = [block[x:y] for x, y in zip((a - lo).tolist(), (b - lo).tolist())]
            else:
                got = [os.pread(self._fd, y - x, x) for x, y in zip(a.tolist(), b.tolist())]
            found[part] = [g == w for g, w in zip(got, wanted)]
        out[hit[found]] = rows[found]
        for i in hit[~found].tolist():  # a key collision: walk the equal keys
            out[i] = self.row(ids[i])
        return out

    def row(self, doc_id: str) -> int:
        """Return the row of `doc_id`, -1 when the store does not hold it (a binary search of the id index)."""
        key = np.uint64(id_key(doc_id))
        i = int(np.searchsorted(self._keys, key))
        while i < self._n and self._keys[i] == key:
            r = int(self._key_rows[i])
            if self.id_at(r) == doc_id:
                return r
            i += 1
        return -1

    # ---- Mapping ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[str]:
        for batch in self._batches:
            yield from batch.column("id").to_pylist()

    def items(self):
        """Return the (doc id, text) items, streamed batch by batch in row order."""
        return _StoreItems(self)


class _StoreItems(ItemsView):
    """items() streamed batch by batch (ItemsView's default would look every id up again)."""

    def __iter__(self):
        for batch in self._mapping._batches:
            yield from zip(batch.column("id").to_pylist(), batch.column("text").to_pylist())


class StoreIds(Sequence[str]):
    """The doc ids of a RowStore in row order, a lazy sequence: ids[i] reads row i's id when asked."""

    def __init__(self, store: RowStore):
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.store.id_at(r) for r in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.store.id_at(i)


def ids_in_order(docs: Mapping[str, str]) -> Sequence[str]:
    """Return a collection's doc ids in its order, by position: the store's lazy view, or a dict's keys as a list."""
    ids = getattr(docs, "ids", None)
    return ids if isinstance(ids, Sequence) else list(docs)


def _file_offsets(array, base: int) -> tuple[int, int]:
    """Return (file offset of the int32 offsets of row 0, file offset of the bytes) of a string array.

    The array belongs to a memory-mapped Arrow file whose first byte is at address `base` (zero-copy buffers: their
    address minus the map's).
    """
    _, offsets, data = array.buffers()
    return offsets.address - base + 4 * array.offset, (data.address - base) if data is not None else 0


# ---- building ------------------------------------------------------------------------------------------------
def store_folder(cache_dir: str | os.PathLike, fp: str) -> Path:
    """Return the folder of the store of content `fp`: `<cache_dir>/docstore/<fp[:32]>/`."""
    return Path(cache_dir) / "docstore" / fp[:32]


def _manifest_ok(folder: Path, fp: str) -> str | None:
    """None when the folder holds a complete store of `fp`, else what is wrong with it."""
    path = folder / "manifest.json"
    if not path.is_file():
        return "no manifest"
    try:
        m = json.loads(path.read_text())
        if m.get("version") != STORE_VERSION or m.get("fingerprint") != fp or int(m["batch_rows"]) < 1:
            return "another version or content"
        for name in _FILES:  # sizes at every open, the bytes when a file's stat moved since it was written
            if (problem := record_problem(folder / name, m["files"][name])) is not None:
                return problem
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable ({e})"
    return None


def store_problem(folder: str | os.PathLike, fp: str) -> str | None:
    """None when `folder` holds a complete store of content `fp`, else what is wrong with it."""
    return _manifest_ok(Path(folder), fp)


def open_store(
    cache_dir: str | os.PathLike,
    fp: str,
    records: Callable[[], Iterable[tuple[int, str, str]]],
    origin: str,
    kind: str = "passage id",
) -> DocStore:
    """Open the store of content `fp` in `cache_dir`, building it first when no complete one exists.

    It is built from `records()` ((line number, id, text) in source order; the reader raises InputError on a malformed
    line). One process builds, others wait.
    """
    folder = store_folder(cache_dir, fp)
    problem = _manifest_ok(folder, fp)
    if problem is None:
        return DocStore(folder)
    with build_lock(folder, "document store"):
        problem = _manifest_ok(folder, fp)  # another process may have built it while this one waited
        if problem is not None:
            if folder.exists():
                warnings.warn(
                    f"{folder}: document store is incomplete or damaged ({problem}); rebuilding it", stacklevel=2
                )
            _build(folder, fp, records, origin, kind)
    return DocStore(folder)


def _build(folder: Path, fp: str, records, origin: str, kind: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp creates 0700; the store is shared by every user of the cache
    try:
        write_store_files(tmp, fp, records, origin, kind)
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_store_files(tmp: Path, fp: str, records, origin: str, kind: str = "passage id") -> None:
    """Write the files of a store of content `fp` (module docstring) from `records()` into the empty folder `tmp`.

    `tmp` must exist; the files are fsynced; the caller renames it into place (open_store) or writes it inside a folder
    it renames (text triples).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    keys, lines = [], []
    ids: list[str] = []
    texts: list[str] = []
    unit = "passages" if kind.startswith("passage") else "documents"
    with phase(f"building the document store of {origin}", unit=unit, key="building the document store") as ph:
        with pa.OSFile(str(tmp / "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:

            def flush():
                writer.write_batch(
                    pa.record_batch([pa.array(ids, pa.string()), pa.array(texts, pa.string())], schema=schema)
                )
                ph.advance(len(ids))
                ids.clear()
                texts.clear()

            for lineno, doc_id, text in records():
                ids.append(doc_id)
                texts.append(text)
                keys.append(id_key(doc_id))
                lines.append(lineno)
                if len(ids) == BATCH_ROWS:
                    flush()
            if ids or not keys:
                flush()
        ph.stage(f"indexing the ids of {len(keys):,} {unit}")
        key_arr = np.array(keys, dtype=np.uint64)
        del keys
        order = np.argsort(key_arr, kind="stable")
        key_arr = key_arr[order]
        np.save(tmp / "index_keys.npy", key_arr)
        np.save(tmp / "index_rows.npy", order.astype(np.int64))
        table = pa.ipc.open_file(pa.memory_map(str(tmp / "docs.arrow"), "r")).read_all()
        _check_unique(table, key_arr, order, np.array(lines, dtype=np.int64), origin, kind)
        np.save(tmp / "sorted_rows.npy", pc.sort_indices(table.column("id")).to_numpy().astype(np.int64))
        del table
    for p in tmp.iterdir():  # fsynced before their records are taken
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    files = {name: file_record(tmp / name) for name in _FILES}
    with open(tmp / "manifest.json", "w") as f:
        json.dump(
            {
                "version": STORE_VERSION,
                "fingerprint": fp,
                "origin": origin,
                "count": len(key_arr),
                "batch_rows": BATCH_ROWS,
                "files": files,
            },
            f,
            indent=2,
        )
        f.flush()
        os.fsync(f.fileno())


def _check_unique(table, sorted_keys: np.ndarray, rows: np.ndarray, lines: np.ndarray, origin: str, kind: str) -> None:
    """Raise InputError for a doc id listed twice, naming both lines, as the in-memory readers report it."""
    same = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    ids = table.column("id")
    dups = []
    for i in same:  # equal keys: the same id, or (about never) a 64-bit collision
        a, b = sorted(int(r) for r in rows[i : i + 2])
        if ids[a].as_py() == ids[b].as_py():
            dups.append((b, a))
    if dups:
        second, first = min(dups)
        raise InputError(
            f"{origin}:{lines[second]}",
            f"duplicate {kind} '{ids[second].as_py()}' (first at line {lines[first]}); expected unique ids",
        )


# ---- text -> row: the index text triples resolve passages with ----------------------------------------------------
TEXT_INDEX_VERSION = 2  # 2: the files' records (bytes, SHA-256, stat) in the manifest


def text_key(data: bytes | memoryview) -> int:
    """Return the 64-bit key of a text's UTF-8 bytes in a text index (BLAKE2b, as `id_key`)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def text_keys(texts: Sequence[bytes | memoryview]) -> np.ndarray:
    """`text_key` of each text, as a uint64 array."""
    blake2b = hashlib.blake2b
    return np.frombuffer(b"".join([blake2b(t, digest_size=8).digest() for t in texts]), dtype="<u8").astype(np.uint64)


def text_index_folder(cache_dir: str | os.PathLike, fp: str) -> Path:
    """Return the folder of the text index of the store of content `fp`: `<cache_dir>/docstore/<fp[:32]>-texts/`."""
    return Path(cache_dir) / "docstore" / f"{fp[:32]}-texts"


class TextIndex:
    """Rows of a store by text, the index text triples resolve passages with.

    `keys.npy`, the 64-bit `text_key` of every text, sorted (rows ascending among equal keys), and `rows.npy`, each
    key's row; both memory-mapped. A lookup is a binary search, then a read of the row's text to confirm it (a key
    collision costs a read, never a wrong row).
    """

    def __init__(self, folder: str | os.PathLike, store: DocStore):
        self.folder, self.store = Path(folder), store
        self.keys = np.load(self.folder / "keys.npy", mmap_mode="r")
        self.key_rows = np.load(self.folder / "rows.npy", mmap_mode="r")
        if self.keys.shape != (len(store),) or self.key_rows.shape != (len(store),):
            raise ValueError(f"{self.folder}: {self.keys.shape[0]} keys for {len(store)} texts")

    def rows_of(self, texts: Sequence[bytes | memoryview]) -> np.ndarray:
        """Return the row of each text (UTF-8 bytes), -1 where the store does not hold it.

        A text the store holds more than once gets its last row (as `{text: id for id, text in docs.items()}` keeps the
        last id).
        """
        keys = text_keys(texts)
        out = np.full(len(texts), -1, dtype=np.int64)
        if not len(self.keys):
            return out
        at = np.searchsorted(self.keys, keys, side="right") - 1  # the last entry of each key: its highest row
        hit = np.flatnonzero((at >= 0) & (self.keys[np.maximum(at, 0)] == keys))
        rows = np.asarray(self.key_rows[at[hit]], dtype=np.int64)
        starts, ends = self.store._spans("text", rows)
        sizes = np.fromiter((len(texts[i]) for i in hit), dtype=np.int64, count=len(hit))
        same = np.flatnonzero(ends - starts == sizes)  # a text of another length is another text: no read
        if len(same):
            # the stored texts, read with pread (not through the mapping: module docstring), compared byte for byte
            pread, fd = os.pread, self.store._fd
            stored = b"".join([pread(fd, n, s) for s, n in zip(starts[same].tolist(), sizes[same].tolist())])
            asked = b"".join([texts[i] for i in hit[same].tolist()])
            equal = np.ones(len(same), dtype=bool)
            if stored != asked:  # some differ (a key collision): which
                wrong = np.flatnonzero(np.frombuffer(stored, np.uint8) != np.frombuffer(asked, np.uint8))
                equal[np.searchsorted(np.cumsum(sizes[same]), wrong, side="right")] = False
            out[hit[same[equal]]] = rows[same[equal]]
        for i in hit[out[hit] < 0].tolist():  # the key's last row holds another text: a collision, check the others
            j, key = int(at[i]) - 1, keys[i]
            while j >= 0 and self.keys[j] == key:
                row = int(self.key_rows[j])
                if self.store.text_bytes_at(row) == texts[i]:
                    out[i] = row
                    break
                j -= 1
        return out


def open_text_index(store: DocStore, cache_dir: str | os.PathLike) -> TextIndex:
    """Open the text index of `store` in `cache_dir` (`<fingerprint[:32]>-texts/` beside the store).

    Built from the store's texts (read batch by batch with pread: the collection's texts never sit in memory) when
    missing or damaged. One process builds, others wait.
    """
    folder = text_index_folder(cache_dir, store.fingerprint)

    problem = "no manifest"

    def opened() -> TextIndex | None:
        nonlocal problem
        try:
            m = json.loads((folder / "manifest.json").read_text())
            if m.get("version") != TEXT_INDEX_VERSION or m.get("fingerprint") != store.fingerprint:
                problem = "another version or store"
                return None
            for name in ("keys.npy", "rows.npy"):  # sizes at every open, the bytes when a file's stat moved
                if (problem := record_problem(folder / name, m["files"][name])) is not None:
                    return None
            return TextIndex(folder, store)
        except (OSError, ValueError, KeyError, TypeError) as e:
            problem = f"unreadable ({type(e).__name__})"
        return None

    if (index := opened()) is not None:
        return index
    with build_lock(folder, "text index"):
        if (index := opened()) is not None:
            return index
        if folder.exists():
            warnings.warn(f"{folder}: text index is incomplete or damaged ({problem}); rebuilding it", stacklevel=2)
        keys = np.empty(len(store), dtype=np.uint64)
        at = 0
        with phase(
            f"indexing the texts of {len(store):,} passages ({store.origin})",
            total=len(store),
            unit="passages",
            key="indexing the texts of the document store",
        ) as p:
            for b in range(len(store._batches)):
                offsets, data = store._column_batch("text", b)
                view, o = memoryview(data), offsets.tolist()
                keys[at : at + len(o) - 1] = text_keys([view[o[i] : o[i + 1]] for i in range(len(o) - 1)])
                at += len(o) - 1
                p.advance(len(o) - 1)
            order = np.argsort(keys, kind="stable")  # stable: rows ascending among equal keys
        with AtomicDir(folder) as tmp:
            np.save(tmp / "keys.npy", keys[order])
            np.save(tmp / "rows.npy", order.astype(np.int64))
            files = {name: file_record(tmp / name) for name in ("keys.npy", "rows.npy")}
            with open(tmp / "manifest.json", "w") as f:
                json.dump(
                    {
                        "version": TEXT_INDEX_VERSION,
                        "fingerprint": store.fingerprint,
                        "count": len(store),
                        "files": files,
                    },
                    f,
                    indent=2,
                )
        del keys, order
    return TextIndex(folder, store)


# ---- two stores as one collection ----------------------------------------------------------------------------------
class StackedStore(RowStore):
    """The read-only Mapping doc id -> text of `base` followed by `extra` (two stores with disjoint ids).

    It has the DocStore methods the pipeline uses; row r < len(base) is base's row r, row len(base) + r is extra's row
    r. `sorted_rows` is the file of `stacked_sorted_rows(base, extra)`. Pickles as the two folders and that path.
    """

    def __init__(self, base: DocStore, extra: DocStore, sorted_rows: str | os.PathLike):
        self.base, self.extra, self.sorted_rows_path = base, extra, Path(sorted_rows)
        self._n0 = len(base)
        self.fingerprint: str = hashlib.sha256(f"stacked|{base.fingerprint}|{extra.fingerprint}".encode()).hexdigest()
        self.origin: str = base.origin
        self._sorted_rows = np.load(self.sorted_rows_path, mmap_mode="r")
        if self._sorted_rows.shape != (len(self),):
            raise ValueError(
                f"{self.sorted_rows_path}: {self._sorted_rows.shape} sorted rows for {len(self)} documents"
            )

    def __getstate__(self):
        return {"base": self.base, "extra": self.extra, "sorted_rows": str(self.sorted_rows_path)}

    def __setstate__(self, state):
        self.__init__(**state)

    def __repr__(self) -> str:
        return f"StackedStore({self.base!r} + {self.extra!r})"

    def _at(self, row: int) -> tuple[DocStore, int]:
        row = int(row)
        return (self.base, row) if row < self._n0 else (self.extra, row - self._n0)

    def text_at(self, row: int) -> str:
        """Return the text of stacked row `row` (base's rows first, then extra's)."""
        store, r = self._at(row)
        return store.text_at(r)

    def text_bytes_at(self, row: int) -> bytes:
        """Return the text of stacked row `row` as UTF-8 bytes."""
        store, r = self._at(row)
        return store.text_bytes_at(r)

    def id_at(self, row: int) -> str:
        """Return the doc id of stacked row `row`."""
        store, r = self._at(row)
        return store.id_at(r)

    def row(self, doc_id: str) -> int:
        """Return the stacked row of `doc_id` (base's row, else extra's plus len(base)); -1 when neither holds it."""
        r = self.base.row(doc_id)
        if r >= 0:
            return r
        r = self.extra.row(doc_id)
        return r + self._n0 if r >= 0 else -1

    def __len__(self) -> int:
        return self._n0 + len(self.extra)

    def __iter__(self) -> Iterator[str]:
        yield from self.base
        yield from self.extra

    def items(self):
        """Return the (doc id, text) items, base's then extra's, streamed batch by batch."""
        return _StackedItems(self)


class _StackedItems(ItemsView):
    def __iter__(self):
        yield from self._mapping.base.items()
        yield from self._mapping.extra.items()


def stacked_sorted_rows(base: DocStore, extra: DocStore) -> np.ndarray:
    """Return the rows of StackedStore(base, extra) in sorted doc-id order (an argsort of both id columns: ids only)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.chunked_array([b.column("id") for s in (base, extra) for b in s._batches], pa.string())
    return pc.sort_indices(ids).to_numpy().astype(np.int64)
