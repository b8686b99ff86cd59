"""Texts tokenised once: a collection's (or a query set's) content tokens on disk, read by row.

    table = token_table(cache_dir, key, count, texts, tokenize)   # built once per tokenizer, length and content
    table[r]                                                       # row r's content tokens (no special tokens)

Why: tokenising 256 passages takes ~0.1-1 s of a CPU, which on a GPU is most of a training step; gathering cached ids
and padding them takes about a millisecond. A batch is assembled from the content tokens by
`PairTokenizer.*_from_content`, exactly as the tokenizer would build it from the text.

Layout of `<cache_dir>/tokens/<digest[:32]>/`:

- `ids.bin`: every row's content tokens, flat, as little-endian uint16 (vocabularies up to 65,535) or int32;
- `offsets.npy`: int64 [count + 1], row r is ids[offsets[r]:offsets[r + 1]];
- `manifest.json`, written last: the key (below) and its digest, count, token count, dtype, the files' sizes and
  SHA-256, and each file's (size, mtime, inode) when written.

The key names everything the tokens depend on: the tokenizer (`tokenizer_digest`: its vocabulary, normaliser,
pre-tokeniser and special tokens), the cut (`cap` content tokens), the texts' content (a collection's fingerprint or
a digest of the texts) and how each text was made from it (normalised, rotated with which seed). A cache of another
key is another folder. A folder whose files do not match its manifest is rebuilt with a warning: sizes are compared at
every open, checksums when a file's (size, mtime, inode) differs from when it was written (a same-size edit changes
the mtime). One process builds while the others wait on a file lock; the folder appears whole (core.io.AtomicDir).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

from core.digests import file_record, record_problem
from core.io import AtomicDir
from core.lock import build_lock
from core.progress import phase

TOKENS_VERSION = 1
BLOCK = 8192  # texts tokenised per call: large enough for the fast tokenizer's threads, small enough for memory
_FILES = ("ids.bin", "offsets.npy")


def tokenizer_digest(tokenizer) -> str:
    """Return the SHA-256 of what a tokenizer does to text: its fast tokenizer's JSON, class and special tokens.

    The JSON's truncation and padding settings are left out: the Hugging Face wrapper rewrites them on every call.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)
        spec.pop("padding", None)
    else:
        spec = {"vocab": sorted(tokenizer.get_vocab().items())}
    spec["class"] = type(tokenizer).__name__
    spec["special"] = {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}
    spec["padding_side"] = getattr(tokenizer, "padding_side", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def texts_digest(texts: Iterable[tuple[str, str]]) -> str:
    """Return the SHA-256 of (id, text) pairs in order: the content key of texts held in memory (a dict, a list)."""
    h = hashlib.sha256(b"texts")
    for ident, text in texts:
        for s in (ident, text):
            b = s.encode("utf-8")
            h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def collection_digest(docs: Mapping[str, str]) -> str:
    """Return the content key of a collection: a store's fingerprint (it names the source files), else its texts'."""
    fp = getattr(docs, "fingerprint", None)
    return fp if isinstance(fp, str) else texts_digest(docs.items())


class TokenTable:
    """The content tokens of `count` texts, row by row (module docstring). Pickles as its folder, reopened mapped.

    Built in memory (`folder=None`) it pickles as its arrays.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, folder: Path | None = None):
        self.ids, self.offsets, self.folder = ids, offsets, folder

    @classmethod
    def open(cls, folder: str | os.PathLike) -> TokenTable:
        """Open the table in `folder` (memory-mapped; `token_table` checks it first)."""
        folder = Path(folder)
        m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        offsets = np.load(folder / "offsets.npy", mmap_mode="r")
        ids = (
            np.memmap(folder / "ids.bin", dtype=np.dtype(m["dtype"]), mode="r")
            if m["tokens"]
            else np.zeros(0, np.dtype(m["dtype"]))
        )
        # plain arrays over the same mapping: np.memmap's indexing costs ~3 us a row in subclass bookkeeping, which
        # was most of a batch's gathering
        return cls(ids.view(np.ndarray), offsets.view(np.ndarray), folder)

    @classmethod
    def of(cls, contents: list[list[int]]) -> TokenTable:
        """Return a table in memory of the given content tokens (a few thousand queries: not worth a file)."""
        lengths = np.fromiter((len(c) for c in contents), dtype=np.int64, count=len(contents))
        offsets = np.zeros(len(contents) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter((t for c in contents for t in c), dtype=np.int32, count=int(offsets[-1]))
        return cls(ids, offsets)

    def __getstate__(self):
        if self.folder is not None:
            return {"folder": str(self.folder)}
        return {"ids": self.ids, "offsets": self.offsets}

    def __setstate__(self, state):
        if "folder" in state:
            opened = TokenTable.open(state["folder"])
            self.ids, self.offsets, self.folder = opened.ids, opened.offsets, opened.folder
        else:
            self.ids, self.offsets, self.folder = state["ids"], state["offsets"], None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> np.ndarray:
        return self.ids[int(self.offsets[row]) : int(self.offsets[row + 1])]

    def lengths(self) -> np.ndarray:
        """Content tokens of every row."""
        return np.diff(np.asarray(self.offsets))


def table_problem(folder: Path, digest: str, count: int) -> str | None:
    """None when `folder` holds a complete table of key `digest` with `count` rows, else what is wrong with it."""
    path = folder / "manifest.json"
    if not path.is_file():
        return "no manifest"
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
        if m.get("version") != TOKENS_VERSION or m.get("digest") != digest or m.get("count") != count:
            return "another version, key or row count"
        for name in _FILES:
            # sizes at every open; a file touched since it was written (other mtime or inode) is checked byte for byte
            record = {"bytes": m["sizes"][name], "sha256": m["sha256"][name], "stat": m["stat"][name]}
            if (problem := record_problem(folder / name, record)) is not None:
                return problem
        offsets = np.load(folder / "offsets.npy", mmap_mode="r")
        if offsets.shape != (count + 1,) or int(offsets[0]) != 0 or int(offsets[-1]) != m["tokens"]:
            return "offsets.npy does not fit the manifest"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable ({e})"
    return None


def token_table(
    cache_dir: str | os.PathLike,
    key: dict,
    count: int,
    texts: Callable[[], Iterable[str]],
    tokenize: Callable[[list[str]], list[list[int]]],
    vocab_size: int,
    what: str = "texts",
) -> TokenTable:
    """Open the token table of `key` in `cache_dir`, building it first from `texts()` (`count` of them, in row order).

    `tokenize` maps a block of texts to their content tokens; `vocab_size` picks the smallest dtype that holds them.
    """
    digest = hashlib.sha256(json.dumps({"version": TOKENS_VERSION, **key}, sort_keys=True).encode()).hexdigest()
    folder = Path(cache_dir) / "tokens" / digest[:32]
    if table_problem(folder, digest, count) is None:
        return TokenTable.open(folder)
    with build_lock(folder, "token cache"):
        problem = table_problem(folder, digest, count)  # another process may have built it while this one waited
        if problem is None:
            return TokenTable.open(folder)
        if folder.exists():
            warnings.warn(f"{folder}: token cache is stale or damaged ({problem}); tokenising again", stacklevel=2)
        with (
            phase(f"tokenising {count:,} {what} once", total=count, unit=what, key="tokenising") as progress,
            AtomicDir(folder, kind="a token cache") as tmp,
        ):
            _build(tmp, key, digest, count, texts, tokenize, vocab_size, progress.advance)
    return TokenTable.open(folder)


def _build(tmp: Path, key: dict, digest: str, count: int, texts, tokenize, vocab_size: int, advance) -> None:
    dtype = np.dtype("<u2") if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype("<i4")
    offsets = np.zeros(count + 1, dtype=np.int64)
    row = 0
    block: list[str] = []

    def flush(f) -> None:
        nonlocal row
        contents = tokenize(block)
        lengths = np.fromiter((len(c) for c in contents), dtype=np.int64, count=len(contents))
        np.cumsum(lengths, out=offsets[row + 1 : row + 1 + len(block)])
        offsets[row + 1 : row + 1 + len(block)] += offsets[row]
        f.write(np.fromiter((t for c in contents for t in c), dtype=dtype, count=int(lengths.sum())).tobytes())
        row += len(block)
        advance(len(block))
        block.clear()

    with open(tmp / "ids.bin", "wb") as f:
        for text in texts():
            if row + len(block) >= count:
                raise ValueError(f"more than the {count} texts expected")
            block.append(text)
            if len(block) == BLOCK:
                flush(f)
        if block:
            flush(f)
    if row != count:
        raise ValueError(f"{row} texts where {count} were expected")
    np.save(tmp / "offsets.npy", offsets)
    records = {n: file_record(tmp / n) for n in _FILES}
    manifest = {
        "version": TOKENS_VERSION,
        "digest": digest,
        "key": key,
        "count": count,
        "tokens": int(offsets[-1]),
        "dtype": dtype.str,
        "sizes": {n: r["bytes"] for n, r in records.items()},
        "sha256": {n: r["sha256"] for n, r in records.items()},
        "stat": {n: r["stat"] for n, r in records.items()},
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
