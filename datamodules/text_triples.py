r"""Text triples over a document store, streamed, read into the memory-mapped rows of a TripleArray.

Text triples are `query text<TAB>positive passage<TAB>negative passage` lines, as MS MARCO `triples.train.small.tsv`,
over a document store, streamed: the collection is never read into memory, and the triples become the memory-mapped rows
of datamodules/triples.py (a TripleArray), so training, DDP sharding, exact resume and `distinct` treat them as id
triples.

    triples = read_text_triples(path, store, queries, cache_dir)   # parsed once, then opened
    triples.docs                                                    # the collection, with the passages they add

Ids follow the rules of datamodules/sources/tsv.py: a passage text equal to a collection passage takes that passage's
id (the last one in the collection's order when several share the text), any other text gets `content_id("h",
text)` and is added to the collection; a query text equal to a query of `queries` takes its qid (the last such),
otherwise `content_id("q", text)`, added to `queries` (the dict is updated in place, as the reader it replaces did).

How: the file is cut into blocks of whole lines (on "\n", as the line reader of datamodules/textfiles.py cuts them),
and pyarrow compute splits, checks and dictionary-encodes each block: the only Python loop is over a block's distinct
texts. A passage text is looked up in the store's text index (docstore.open_text_index: 64-bit keys, each hit
confirmed by reading the text), a query text in a dict of the queries. Passages not in the collection go into a
second store, and `triples.docs` is a docstore.StackedStore of the two (the store itself when nothing is added).

Everything is kept in `<cache_dir>/triples/text-<digest>/`, the digest naming the file's content, the store and the
queries: `triples.npy` (int32 rows: query index, positive row, negative row), `queries.json` (the qids the triples
assign, in order), `extra/` (the added passages' store) and `sorted_rows.npy` (the stacked rows in doc-id order) when
passages were added, `manifest.json` last (with each file's record: bytes, SHA-256, stat; a file that no longer
matches, a same-size edit included, gets the folder rebuilt with a warning). One process builds while the others
wait on a lock; the folder is written in a temp folder and renamed whole, so an error leaves nothing behind. A
malformed line, bad UTF-8 or a corrupt gzip stream sends the file to the line reader, which raises the InputError
naming the line, word for word as before.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from core.digests import file_record, record_problem
from core.errors import InputError
from core.io import AtomicDir
from core.lock import build_lock
from core.npy import NpyRowWriter
from core.progress import phase
from datamodules.docstore import (
    BATCH_ROWS,
    DocStore,
    StackedStore,
    TextIndex,
    fingerprint,
    open_text_index,
    stacked_sorted_rows,
    store_problem,
    write_store_files,
)
from datamodules.textfiles import content_id, iter_rows
from datamodules.triples import TripleArray

TEXT_TRIPLES_VERSION = 2  # 2: the files' records (core.digests) in the manifest; input digests memoised
BLOCK_BYTES = (
    1 << 22
)  # bytes of lines per block: 1M MS MARCO-shaped triples parse as fast in blocks of 1-16 MB, and the
# peak RSS above the start grows with the block (4 MB: +128 MB; 16 MB: +291 MB; the old dict path: +600 MB)
COLUMNS = ("query text", "positive passage", "negative passage")
WHAT = ("query", "positive passage", "negative passage")
# The characters str.isspace() holds for, which str.strip() removes (tests/test_text_triples.py checks the list):
# pyarrow's own whitespace class is not Python's, and a text is empty when `not text.strip()`.
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_BOM = b"\xef\xbb\xbf"


class _Unparsed(Exception):
    """Something only the line reader reports exactly: a malformed line, bad UTF-8, a corrupt gzip stream, no line."""


def read_text_triples(
    path: Path, store: DocStore, queries: dict[str, str], cache_dir: str | os.PathLike
) -> TripleArray:
    """Read the text triples of the file `path` over `store` and `queries` (module docstring); parsed once, then cached.

    `queries` gets the qids the triples assign, and the result's `docs` is the collection the triples' ids are in.
    """
    path = Path(path)
    digest = _digest(path, store, queries, cache_dir)
    folder = Path(cache_dir) / "triples" / f"text-{digest[:32]}"
    triples = _open(folder, digest, store, queries)
    if triples is not None:
        return triples
    with build_lock(folder, "triples cache"):
        triples = _open(folder, digest, store, queries)  # another process may have built it while this one waited
        if triples is not None:
            return triples
        if folder.exists():
            warnings.warn(
                f"{folder}: cached text triples are incomplete or damaged; reading {path} again", stacklevel=2
            )
        index = open_text_index(store, cache_dir)
        with AtomicDir(folder) as tmp:
            _build(tmp, path, store, index, queries, digest)
        triples = _open(folder, digest, store, queries)
    if triples is None:
        raise RuntimeError(f"{folder}: the text triples just written cannot be opened")
    return triples


def _digest(path: Path, store: DocStore, queries: dict[str, str], cache_dir: str | os.PathLike) -> str:
    source = fingerprint("text-triples", [path], cache_dir=cache_dir)
    h = hashlib.sha256(f"text-triples|{TEXT_TRIPLES_VERSION}|{source}|{store.fingerprint}".encode())
    for qid, text in queries.items():
        q, t = qid.encode("utf-8"), text.encode("utf-8")
        h.update(len(q).to_bytes(8, "little") + q + len(t).to_bytes(8, "little") + t)
    return h.hexdigest()


def _open(folder: Path, digest: str, store: DocStore, queries: dict[str, str]) -> TripleArray | None:
    """Open the cached triples of `digest` in `folder`, applying the qids they assign to `queries`.

    None when the folder is missing, incomplete or damaged.
    """
    try:
        m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        if m.get("version") != TEXT_TRIPLES_VERSION or m.get("digest") != digest:
            return None
        for name, record in m["files"].items():  # sizes at every open, the bytes when a file's stat moved
            if record_problem(folder / name, record) is not None:
                return None
        assigned = json.loads((folder / "queries.json").read_text(encoding="utf-8"))
        rows = np.load(folder / "triples.npy", mmap_mode="r")
        if len(assigned) != m["queries"] or rows.shape != (m["triples"], 3) or not len(rows):
            return None
        docs = store
        if m["extra"]:
            if store_problem(folder / "extra", m["extra_fingerprint"]) is not None:
                return None
            docs = StackedStore(store, DocStore(folder / "extra"), folder / "sorted_rows.npy")
            if len(docs.extra) != m["extra"]:
                return None
        del rows
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for qid, text in assigned:
        queries[qid] = text
    return TripleArray(folder / "triples.npy", list(queries), docs)


# ---- building ------------------------------------------------------------------------------------------------------
def _build(tmp: Path, path: Path, store: DocStore, index: TextIndex, queries: dict[str, str], digest: str) -> None:
    """Write the cache folder's files into `tmp` (AtomicDir renames it into place; an exception removes it)."""
    resolver = _Resolver(store, index, dict(queries), tmp / "extra.spill.arrow")
    dtype = np.int32 if max(len(store), len(queries)) < 1 << 30 else np.int64
    writer = NpyRowWriter(tmp / "triples.npy", dtype, 3)
    try:
        unparsed = False
        try:
            with phase(f"parsing the text triples of {path}", unit="triples", key="parsing triples") as ph:
                for buf in _line_blocks(path):
                    cols = _columns(buf)
                    if cols is not None:
                        rows = resolver.block(path, *cols)
                        if rows.max() > np.iinfo(dtype).max:
                            raise InputError(
                                str(path), f"adds too many passages or queries for {np.dtype(dtype).name} rows"
                            )
                        writer.write(rows)
                        ph.advance(len(rows))
            unparsed = not writer.rows
        except _Unparsed:
            unparsed = True
        if unparsed:
            _raise_line_error(path)
        writer.close()
    finally:
        writer.abort()  # closes the file where an error left it open (AtomicDir then removes the folder)
        resolver.close()
    extra_fp = hashlib.sha256(f"text-triples-extra|{digest}".encode()).hexdigest()
    if resolver.extra:
        (tmp / "extra").mkdir()
        write_store_files(tmp / "extra", extra_fp, resolver.extra_records, f"{path} (passages not in the collection)")
        np.save(tmp / "sorted_rows.npy", stacked_sorted_rows(store, DocStore(tmp / "extra")))
    resolver.spill.unlink(missing_ok=True)
    with open(tmp / "queries.json", "w", encoding="utf-8") as f:
        json.dump(resolver.assigned, f, ensure_ascii=False)
    names = ["triples.npy", "queries.json"] + (["sorted_rows.npy"] if resolver.extra else [])
    files = {name: file_record(tmp / name) for name in names}
    with open(tmp / "manifest.json", "w", encoding="utf-8") as f:  # last
        json.dump(
            {
                "version": TEXT_TRIPLES_VERSION,
                "digest": digest,
                "origin": str(path),
                "store": store.fingerprint,
                "triples": writer.rows,
                "queries": len(resolver.assigned),
                "extra": len(resolver.extra),
                "extra_fingerprint": extra_fp,
                "files": files,
            },
            f,
            indent=2,
        )


def _raise_line_error(path: Path) -> None:
    """Read `path` line by line with the checks of the reader this module replaced.

    Raises the InputError naming the first bad line (or the file, when it holds no line).
    """
    for lineno, cols in iter_rows(path, COLUMNS):
        for col, what in zip(cols, WHAT):
            if not col.strip():
                raise InputError(f"{path}:{lineno}", f"empty {what} text; expected non-empty text")
    raise InputError(str(path), "could not be parsed as query text<TAB>positive passage<TAB>negative passage lines")


def _line_blocks(path: Path, size: int | None = None) -> Iterator[bytes]:
    """Yield the bytes of `path` in pieces of whole lines (the last may lack its newline).

    Gunzipped when named *.gz, as the line reader opens it; a leading byte-order mark is dropped; a corrupt stream
    raises _Unparsed.
    """
    size = size or BLOCK_BYTES
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as f:
            carry, first = b"", True
            while chunk := f.read(size):
                if first:
                    chunk, first = chunk.removeprefix(_BOM), False
                buf = carry + chunk if carry else chunk
                cut = buf.rfind(b"\n") + 1
                if cut:
                    yield buf[:cut]
                carry = buf[cut:]
            if carry:
                yield carry
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise _Unparsed(str(e)) from e


def _columns(buf: bytes):
    """Return (queries, positives, negatives) as pyarrow string arrays of the non-blank lines of `buf`.

    None when all are blank; _Unparsed when a line is not UTF-8, has another number of columns than 3, or an empty text.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    ends = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 0x0A) + 1
    if not len(ends) or ends[-1] != len(buf):
        ends = np.append(ends, len(buf))
    large = len(buf) >= (1 << 31) - 1
    offsets = np.concatenate([[0], ends]).astype(np.int64 if large else np.int32)
    lines = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(buf)]
    )
    try:
        lines = lines.cast(pa.large_string() if large else pa.string())  # checks UTF-8
    except pa.ArrowInvalid as e:
        raise _Unparsed(str(e)) from e
    lines = pc.utf8_rtrim(lines, characters="\r\n")  # as the line reader's rstrip("\r\n")
    lines = lines.filter(pa.array(~_blank(lines)))
    if not len(lines):
        return None
    cols = pc.split_pattern(lines, pattern="\t")
    if not pc.all(pc.equal(pc.list_value_length(cols), 3)).as_py():
        raise _Unparsed("columns")
    flat = pc.list_flatten(cols)
    out = tuple(flat.take(pa.array(np.arange(k, len(flat), 3))) for k in range(3))
    if any(_blank(c).any() for c in out):
        raise _Unparsed("empty text")
    return out


def _blank(texts) -> np.ndarray:
    """Return whether each text is empty or whitespace only (`not text.strip()`).

    Only texts starting with whitespace are trimmed.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    first = pc.utf8_slice_codeunits(texts, 0, 1)
    maybe = np.flatnonzero(
        pc.is_in(first, value_set=pa.array(["", *WHITESPACE], type=texts.type)).to_numpy(zero_copy_only=False)
    )
    out = np.zeros(len(texts), dtype=bool)
    if len(maybe):
        rest = pc.utf8_trim(texts.take(pa.array(maybe)), characters=WHITESPACE)
        out[maybe] = pc.equal(pc.binary_length(rest), 0).to_numpy(zero_copy_only=False)
    return out


def _views(strings) -> list[memoryview]:
    """Return the UTF-8 bytes of each element of a pyarrow string array, as views of its buffer (nothing decoded)."""
    import pyarrow as pa

    _, offsets, data = strings.buffers()
    width = np.int64 if strings.type in (pa.large_string(), pa.large_binary()) else np.int32
    o = np.frombuffer(offsets, dtype=width)[strings.offset : strings.offset + len(strings) + 1].tolist()
    mv = memoryview(data).cast("B") if data is not None else memoryview(b"")  # pyarrow exports signed chars ("b")
    return [mv[o[i] : o[i + 1]] for i in range(len(strings))]


class _Resolver:
    """Resolve text triples block after block into rows (query index, positive row, negative row).

    It keeps the qids assigned and the passages added so far (spilled to an Arrow file, BATCH_ROWS at a time: they may
    be many).
    """

    def __init__(self, store: DocStore, index: TextIndex, queries: dict[str, str], spill: Path):
        self.store, self.index, self.queries, self.spill = store, index, queries, spill
        self.query_rows = {text: i for i, text in enumerate(queries.values())}  # the last qid of a text wins
        self.assigned: list[tuple[str, str]] = []  # (qid, text) the triples set in `queries`, in order
        self.extra: dict[str, int] = {}  # added passage id -> its row in the extra store
        self._ids: list[str] = []
        self._texts: list[str] = []
        self._sink = self._writer = None

    def block(self, path: Path, q, pos, neg) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc

        enc = pc.dictionary_encode(q)
        qrows = np.fromiter(
            (self._query_row(t) for t in enc.dictionary.to_pylist()), dtype=np.int64, count=len(enc.dictionary)
        )
        out = np.empty((len(q), 3), dtype=np.int64)
        out[:, 0] = qrows[enc.indices.to_numpy(zero_copy_only=False)]
        # positive and negative interleaved, so the passages are met (and added) in the order of the lines
        n = len(pos)
        enc = pc.dictionary_encode(
            pa.concat_arrays([pos, neg]).take(pa.array(np.stack([np.arange(n), np.arange(n) + n], 1).reshape(-1)))
        )
        texts = _views(enc.dictionary)
        rows = self.index.rows_of(texts)
        for i in np.flatnonzero(rows < 0):
            rows[i] = self._added_row(path, bytes(texts[i]).decode("utf-8"))
        both = rows[enc.indices.to_numpy(zero_copy_only=False)]
        out[:, 1], out[:, 2] = both[0::2], both[1::2]
        return out

    def _query_row(self, text: str) -> int:
        row = self.query_rows.get(text)
        if row is None:
            qid = content_id("q", text)
            # a qid already taken (by another text) keeps its place and takes this text, as `queries[qid] = text` did
            row = list(self.queries).index(qid) if qid in self.queries else len(self.queries)
            self.queries[qid] = text
            self.assigned.append((qid, text))
            self.query_rows[text] = row
        return row

    def _added_row(self, path: Path, text: str) -> int:
        did = content_id("h", text)
        r = self.extra.get(did)
        if r is None:
            if self.store.row(did) >= 0:
                # the old reader overwrote that collection passage's text; a store is read-only
                raise InputError(
                    str(path),
                    f"passage '{text[:80]}' gets the content id '{did}', which the collection "
                    "already holds for another text; expected collection ids that are not content ids of other texts",
                )
            r = self.extra[did] = len(self.extra)
            self._ids.append(did)
            self._texts.append(text)
            if len(self._ids) == BATCH_ROWS:
                self._flush()
        return len(self.store) + r

    def _flush(self) -> None:
        import pyarrow as pa

        if self._writer is None:
            self._sink = pa.OSFile(str(self.spill), "wb")
            self._writer = pa.ipc.new_file(self._sink, pa.schema([("id", pa.string()), ("text", pa.string())]))
        self._writer.write_batch(
            pa.record_batch(
                [pa.array(self._ids, pa.string()), pa.array(self._texts, pa.string())], names=["id", "text"]
            )
        )
        self._ids.clear()
        self._texts.clear()

    def close(self) -> None:
        """Spill what is pending and close the spill file (it stays until extra_records has been read)."""
        if self._ids:
            self._flush()
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None

    def extra_records(self) -> Iterator[tuple[int, str, str]]:
        """(ordinal, id, text) of the added passages in the order they were met (the records of their store)."""
        import pyarrow as pa

        at = 0
        with pa.memory_map(str(self.spill), "r") as source:
            reader = pa.ipc.open_file(source)
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                for did, text in zip(batch.column("id").to_pylist(), batch.column("text").to_pylist()):
                    at += 1
                    yield at, did, text
