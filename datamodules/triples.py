"""Training triples of a document store as a memory-mapped array.

MS MARCO's 39.8M id triples without 39.8M tuples of strings (about 10 GB a rank as Python objects; 0.48 GB as int32
rows on disk, shared through the page cache).

    triples = read_id_triples(path, store, queries, cache_dir, origin)   # parsed once, then memory-mapped
    qid, pos, neg = triples[i]                                            # as the list of tuples it replaces

The file (`qid<TAB>positive doc id<TAB>negative doc id`, gzip or plain) is parsed with pyarrow's CSV reader, block
by block, and every id is turned into an index: the query's position in the split's queries, the passages' rows in
the store. The array is kept in `<cache_dir>/triples/<digest>.npy`, the digest naming the file's content (its SHA-256,
memoised by stat: core.digests.input_digest), the store and the queries, so every later run, rank and worker maps the
same file; `<digest>.npy.sha256` beside it is its record (bytes, SHA-256, stat when written), and an array that no
longer matches it (a same-size edit included) is read again with a warning. A malformed line is reported by the line
reader of datamodules/textfiles.py (file and line, as for small files); an unknown id names the line too.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from core.digests import file_record, sidecar_problem, write_sidecar
from core.errors import InputError
from core.io import atomic_open
from core.npy import NpyRowWriter
from core.progress import phase
from datamodules.corpus import locate
from datamodules.docstore import DocStore, fingerprint
from datamodules.textfiles import iter_rows, rows_expected

ID_TRIPLE_COLUMNS = ("qid", "positive doc id", "negative doc id")

TRIPLES_VERSION = 1


class TripleArray(Sequence[tuple[str, str, str]]):
    """A sequence of (qid, positive doc id, negative doc id) triples backed by a memory-mapped int array.

    Triple i is read from `rows` [n, 3] (query index, positive row, negative row), optionally through a selection `keep`
    (a cap on the triples). Pickles as its file's path.
    """

    # ids were resolved against the queries and the store when the array was built: IRDataset.validate skips them
    checked = True

    def __init__(self, path: str | os.PathLike, qids: Sequence[str], docs: DocStore, keep: np.ndarray | None = None):
        self.path, self.qids, self.docs, self.keep = Path(path), qids, docs, keep
        self.rows = np.load(self.path, mmap_mode="r").view(np.ndarray)  # the mapping, without np.memmap's per-row cost

    def __getstate__(self):
        return {"path": str(self.path), "qids": self.qids, "docs": self.docs, "keep": self.keep}

    def __setstate__(self, state):
        self.__init__(**state)

    def __len__(self) -> int:
        return len(self.rows) if self.keep is None else len(self.keep)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        q, p, n = self.rows[i if self.keep is None else self.keep[i]]
        return self.qids[q], self.docs.id_at(p), self.docs.id_at(n)

    def rows_at(self, i: int) -> tuple[int, int, int]:
        """Return triple i as (query index into `qids`, positive row, negative row) of `docs`: no id is looked up."""
        q, p, n = self.rows[i if self.keep is None else self.keep[i]]
        return int(q), int(p), int(n)

    def __eq__(self, other) -> bool:  # as the list of tuples it stands for
        return (
            isinstance(other, Sequence)
            and len(self) == len(other)
            and all(tuple(a) == tuple(b) for a, b in zip(self, other))
        )

    __hash__ = None

    def take(self, indices: np.ndarray) -> TripleArray:
        """Return the triples at `indices`, in that order (a view: nothing is copied but the indices)."""
        indices = np.asarray(indices, dtype=np.int64)
        keep = indices if self.keep is None else self.keep[indices]
        return TripleArray(self.path, self.qids, self.docs, keep)

    def distinct(self, block: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
        """Return (the distinct query indices, the distinct passage rows) of the triples, each in first-seen order.

        First-seen order of passages: positive, then negative, triple after triple; so the order is the one a loop over
        the triples would list them in. Computed by block-wise NumPy passes over the array: 39.8M triples are never
        turned into Python objects.
        """
        seen = {
            "q": (np.zeros(0, np.int64), np.zeros(0, np.int64)),
            "d": (np.zeros(0, np.int64), np.zeros(0, np.int64)),
        }
        for s in range(0, len(self), block):
            part = np.asarray(
                self.rows[s : s + block] if self.keep is None else self.rows[self.keep[s : s + block]], dtype=np.int64
            )
            for name, col, at in (("q", part[:, 0], s), ("d", part[:, 1:3].reshape(-1), 2 * s)):
                values, first = seen[name]
                new, where = np.unique(col, return_index=True)
                values, first = np.concatenate([values, new]), np.concatenate([first, where + at])
                order = np.lexsort((first, values))  # by value, the earliest position first
                values, first = values[order], first[order]
                keep = np.ones(len(values), dtype=bool)
                keep[1:] = values[1:] != values[:-1]
                seen[name] = (values[keep], first[keep])
        return tuple(values[np.argsort(first, kind="stable")] for values, first in (seen["q"], seen["d"]))

    def query_indices(self) -> np.ndarray:
        """Return the distinct query indices of the triples (a pass over the array's first column)."""
        col = self.rows[:, 0] if self.keep is None else self.rows[self.keep, 0]
        return np.unique(col)


def read_id_triples_list(path: Path) -> list[tuple[str, str, str]]:
    """Read id triples as a list of (qid, positive doc id, negative doc id), line by line.

    For small files, and for the exact file:line of a malformed line.
    """
    triples = []
    for lineno, cols in iter_rows(path, ID_TRIPLE_COLUMNS):
        if not all(c.strip() for c in cols):
            raise InputError(f"{path}:{lineno}", "empty id; expected qid<TAB>positive doc id<TAB>negative doc id")
        triples.append((cols[0].strip(), cols[1].strip(), cols[2].strip()))
    return triples


def _digest(source: str, docs: DocStore, qids: Sequence[str]) -> str:
    h = hashlib.sha256(f"triples|{TRIPLES_VERSION}|{source}|{docs.fingerprint}".encode())
    for q in qids:
        h.update(q.encode("utf-8") + b"\n")
    return h.hexdigest()


def read_id_triples(
    path: Path, docs: DocStore, queries: dict[str, str], cache_dir: str | os.PathLike, origin: str, split: str = "train"
) -> TripleArray:
    """Read the id triples of the file `path` over `docs` and `queries` (module docstring).

    Parsed once into `<cache_dir>/triples/`, then memory-mapped.
    """
    return cached_triples(
        fingerprint("triples", [path], cache_dir=cache_dir),
        lambda: _tsv_blocks(path),
        docs,
        queries,
        cache_dir,
        str(path),
        split,
        on_error=lambda: read_id_triples_list(path),
    )


def cached_triples(
    source: str,
    blocks,
    docs: DocStore,
    queries: dict[str, str],
    cache_dir: str | os.PathLike,
    origin: str,
    split: str = "train",
    on_error=None,
) -> TripleArray:
    """Resolve the triples of `blocks()` into a TripleArray over `docs` and `queries`, cached on disk.

    `blocks()` yields pyarrow string arrays (qids, positive ids, negative ids), block by block. The array is kept in
    `<cache_dir>/triples/` under the digest of `source` (a name of the triples' content), the store and the queries.
    `on_error()` re-reads the source line by line when pyarrow cannot parse it, to raise the InputError naming the line.
    """
    import pyarrow as pa

    qids = list(queries)
    target = Path(cache_dir) / "triples" / f"{_digest(source, docs, qids)[:32]}.npy"
    if target.is_file():
        # the record beside it (bytes, SHA-256, stat when written: the bytes are read again only when the stat moved)
        # and the shape; the digest ties the rows to this store and these queries
        problem = sidecar_problem(target)
        try:
            rows = np.load(target, mmap_mode="r")
            if problem is None and rows.ndim == 2 and rows.shape[1] == 3 and len(rows):
                return TripleArray(target, qids, docs)
            problem = problem or f"its rows have shape {rows.shape}"
        except (OSError, ValueError) as e:
            problem = problem or f"it is unreadable ({type(e).__name__})"
        warnings.warn(
            f"{target}: cached triples are stale or damaged ({problem}); reading {origin} again", stacklevel=2
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    # rows go to disk block by block: MS MARCO's 39.8M triples never sit in memory (int32 rows: 0.48 GB on disk)
    dtype = np.int32 if max(len(docs), len(qids)) < np.iinfo(np.int32).max else np.int64
    writer = NpyRowWriter(tmp, dtype, 3)
    try:
        with phase(f"parsing the triples of {origin}", unit="triples", key="parsing triples") as ph:
            for rows in _resolve(blocks(), docs, qids, origin, split):
                writer.write(rows)
                ph.advance(len(rows))
        if not writer.rows:
            raise InputError(
                origin,
                f"holds no triples; expected {rows_expected(ID_TRIPLE_COLUMNS)}",
            )
        writer.close()
        write_sidecar(target, file_record(tmp))  # first: a rename keeps the size, mtime and inode it records
        os.replace(tmp, target)
    except BaseException as e:
        writer.abort()
        tmp.unlink(missing_ok=True)
        if isinstance(e, (pa.ArrowInvalid, ValueError, OSError)) and not isinstance(e, InputError):
            if on_error is not None:
                on_error()
            raise InputError(
                origin, "could not be parsed as qid<TAB>positive doc id<TAB>negative doc id lines"
            ) from None
        raise
    return TripleArray(target, qids, docs)


def _tsv_blocks(path: Path):
    import pyarrow as pa
    from pyarrow import csv

    names = ["qid", "pos", "neg"]
    reader = csv.open_csv(
        pa.input_stream(str(path), compression="detect"),
        read_options=csv.ReadOptions(column_names=names, block_size=1 << 24),
        parse_options=csv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False),
        convert_options=csv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=False),
    )
    for batch in reader:
        yield tuple(batch.column(n) for n in names)


def _resolve(blocks, docs: DocStore, qids: list[str], origin: str, split: str) -> Iterator[np.ndarray]:
    """Rows [n, 3] (query index, positive row, negative row) of each id block; an empty or unknown id raises."""
    import pyarrow as pa
    import pyarrow.compute as pc

    store_ids = pa.chunked_array([b.column("id") for b in docs._batches]).combine_chunks()
    query_ids = pa.array(qids, pa.string())
    first = True
    for block in blocks:
        cols = [pc.utf8_trim_whitespace(c) for c in block]
        if first and len(cols[0]):
            cols[0] = pc.utf8_ltrim(cols[0], characters="\ufeff")  # a byte-order mark, as the line reader drops it
            first = False
        if any(pc.any(pc.equal(pc.utf8_length(c), 0)).as_py() for c in cols):
            raise ValueError("empty id")
        found = [
            pc.index_in(c, value_set=v).to_numpy(zero_copy_only=False)
            for c, v in zip(cols, (query_ids, store_ids, store_ids))
        ]
        rows = np.stack([np.nan_to_num(x, nan=-1).astype(np.int64) for x in found], axis=1)
        bad = np.flatnonzero((rows < 0).any(axis=1))
        if len(bad):
            _unknown(origin, [c[int(bad[0])].as_py() for c in cols], rows[bad[0]], split)
        yield rows


def _unknown(origin: str, ids: list[str], block_row: np.ndarray, split: str) -> None:
    qid, pos, neg = ids
    where = locate(origin, qid, pos, neg) or origin
    if block_row[0] < 0:
        raise InputError(
            where, f"triple ({qid}, {pos}, {neg}) of split {split} names query '{qid}' which is not among the queries"
        )
    bad = pos if block_row[1] < 0 else neg
    raise InputError(where, f"triple ({qid}, {pos}, {neg}) of split {split} names unknown doc id '{bad}'")


class ArrowTriples(Sequence[tuple[str, str, str]]):
    """Id triples as strings in a memory-mapped Arrow file (columns qid, pos, neg).

    They stay so until a store resolves them to a TripleArray (`resolve`): what a source holds while it does not know
    the collection yet (ir_datasets docpairs). `source` names the content (the cache key of the resolved array).
    """

    def __init__(self, path: str | os.PathLike, source: str, selection=None):
        import pyarrow as pa

        self.path, self.source = Path(path), source
        self.table = pa.ipc.open_file(pa.memory_map(str(self.path), "r")).read_all()
        if selection is not None:
            self.table = self.table.filter(selection)

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return tuple(self.table.column(c)[i].as_py() for c in ("qid", "pos", "neg"))

    def __iter__(self):
        for batch in self.table.to_batches():
            yield from zip(*(batch.column(c).to_pylist() for c in ("qid", "pos", "neg")))

    def query_ids(self) -> list[str]:
        """Return the distinct qids in order of first appearance."""
        import pyarrow.compute as pc

        return pc.unique(self.table.column("qid")).to_pylist()

    def doc_ids(self) -> set[str]:
        """Return the set of doc ids the triples name, positives and negatives."""
        import pyarrow.compute as pc

        return {d for c in ("pos", "neg") for d in pc.unique(self.table.column(c)).to_pylist()}

    def only_queries(self, keep: Sequence[str]) -> ArrowTriples:
        """Return the triples of the queries `keep` (their order kept), with a `source` of their own."""
        import pyarrow as pa
        import pyarrow.compute as pc

        out = ArrowTriples.__new__(ArrowTriples)
        out.path, out.table = (
            self.path,
            self.table.filter(pc.is_in(self.table.column("qid"), value_set=pa.array(list(keep), pa.string()))),
        )
        out.source = hashlib.sha256(f"{self.source}|only|{'|'.join(keep)}".encode()).hexdigest()
        return out

    def resolve(
        self, docs: DocStore, queries: dict[str, str], cache_dir: str | os.PathLike, origin: str, split: str = "train"
    ) -> TripleArray:
        """Resolve the ids against `docs` and `queries` into a TripleArray, cached under `source` (`cached_triples`).

        An empty or unknown id raises InputError naming `origin` (and the line when it can be found).
        """

        def blocks():
            for batch in self.table.to_batches(max_chunksize=1 << 20):
                yield tuple(batch.column(c) for c in ("qid", "pos", "neg"))

        return cached_triples(self.source, blocks, docs, queries, cache_dir, origin, split)


def write_arrow_triples(path: str | os.PathLike, triples, batch_rows: int = 1 << 20) -> None:
    """Write (qid, pos, neg) string triples from an iterator into an Arrow file, atomically.

    `batch_rows` at a time, so memory stays bounded.
    """
    import pyarrow as pa

    schema = pa.schema([("qid", pa.string()), ("pos", pa.string()), ("neg", pa.string())])
    cols: tuple[list, list, list] = ([], [], [])
    with atomic_open(path, "wb") as f:
        with pa.ipc.new_file(f, schema) as writer:

            def flush():
                writer.write_batch(pa.record_batch([pa.array(c, pa.string()) for c in cols], schema=schema))
                for c in cols:
                    c.clear()

            for t in triples:
                for c, x in zip(cols, t):
                    c.append(x)
                if len(cols[0]) == batch_rows:
                    flush()
            flush()
