"""ColBERT end-to-end retrieval: token-level faiss search for candidates, then exact late-interaction re-scoring.

    index = ColBERTIndex.build(ranker, docs)                           # docs: {doc id: text} or (id, text) pairs
    run = index.search(queries, k=100, k_tokens=256, depth=1000)       # {qid: {doc id: exact ColBERT score}}

`ColBERTIndex` is the ``colbert`` family of the one index interface (`retrieval.base.Index`: build, search, save,
load, from_checkpoint, the manifest and its checks); `colbert_index_from_checkpoint` is the older name of
`ColBERTIndex.from_checkpoint`.

Indexing (streamed, one batch of tokenisation at a time): every non-padding token vector of every passage,
L2-normalised (ColBERT scores cosines), goes into a faiss inner-product index (any `retrieval.dense` index type:
flat by default, ivf / hnsw / pq / ivfpq for large collections). The same vectors are kept for re-scoring in one
contiguous `[T, ...]` token store with `offsets [N + 1]`: passage i owns rows offsets[i]:offsets[i + 1], so token
row -> passage is a binary search and no per-token id map is stored.

The token store is written to disk while building, `store_chunk` rows at a time, and re-scoring reads it through a
memory map: a collection's store (MS MARCO's 8.8M passages: ~150 GB in float16 at 128 dimensions) never sits in
memory, so the build's memory does not grow with it (the faiss index itself does, unless it is compressed: pq,
ivfpq). It goes into a temporary folder under `store_dir` (the system temp dir by default): give the folder the
index will be saved in (retrieval/retrieve.py gives the index folder's parent) and `save` hard-links the store
into the index instead of copying it. The folder is removed once saved, or when the index is garbage-collected.

`store_dtype`: `float16` (default) or `float32` rows, or `residual8` / `residual4` codes, compressed as PLAID does
(Santhanam et al. 2022): k-means centroids over the first `train_size` token vectors (the sample the faiss index
trains on), and every vector stored as its nearest centroid's id plus its residual scalar-quantised per dimension
to 8 or 4 bits (faiss IVF-SQ as a standalone codec, `sa_encode` / `sa_decode`); re-scoring decodes the candidates'
rows only. At 384 dimensions a token costs 1536 / 768 / 386 / 194 bytes, and the exact score moves, per query
token, by at most 2e-5 (float16), 0.003 (residual8), 0.012 (residual4) against float32 on Cranfield (untrained
MiniLM ColBERT); the tests allow 0.005 and 0.02. Compressed top-k lists can reorder where scores are close (figures
and rankings: docs/retrieval.md). Vectors far outside the training sample's range are clipped, so the sample must
represent the collection (stream a collection sorted by topic or source in a mixed order).

Search, per query (ColBERT, Khattab & Zaharia 2020, section 3.6):
1. each query token retrieves its `k_tokens` nearest passage tokens; the passages owning them are the candidates;
2. when there are more than `depth` candidates, the `depth` best by an approximate score are kept: for each query
   token the best similarity among its retrieved tokens of that passage, or, when none was retrieved, the
   similarity of its k_tokens-th hit (an upper bound for the exact case; XTR's "missing similarity imputation"),
   summed over query tokens; ties by passage order. `depth=None` keeps every candidate;
3. the candidates are re-scored exactly with the ranker's own Eq. 1 (`ranker.score_all`: sum over query tokens of
   the max cosine over passage tokens, padding masked) on their stored token matrices, and the top k returned.

With float32 storage the returned scores equal `ranker.score_all` on freshly encoded passages (up to float
rounding); the other stores perturb them as above. With `k_tokens` covering every stored token and
`depth=None` the result is the exact top k of brute-force ColBERT over the whole collection.

On disk (`save`, atomic like `retrieval.dense`): `index.faiss`, `tokens.npy` (the store: float rows, or uint8
codes), `store_codec.faiss` (residual stores), `offsets.npy`, `doc_ids.json`, `manifest.json`; `load` memory-maps
`tokens.npy`.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from core.errors import InputError
from core.io import AtomicDir, write_json
from core.npy import NpyRowWriter
from models.loading import pair_tokenizer_for
from models.rankers.base import Encoded, cosine_normalize
from retrieval.base import (
    ENCODING_OPTIONS,
    Index,
    build_phase,
    check_ranker_matches,
    read_doc_ids,
    record_doc_ids,
    register_index,
    search_phase,
)
from retrieval.dense import (
    GPU_MAX_K,
    INDEX_OPTIONS,
    FaissBuilder,
    IndexOptions,
    Placement,
    base_manifest,
    load_faiss,
    read_faiss,
)
from retrieval.encode import (
    encode_docs,
    encode_queries,
)

__all__ = ["ColBERTIndex", "colbert_index_from_checkpoint", "candidates_from_hits", "TokenStoreWriter"]

FORMAT = "isorank-colbert-e2e-index"
FLOAT_STORES = {"float16": np.float16, "float32": np.float32}
RESIDUAL_STORES = {"residual8": "SQ8", "residual4": "SQ4"}  # faiss scalar quantiser of the residuals
STORE_DTYPES = (*FLOAT_STORES, *RESIDUAL_STORES)
STORE_CHUNK = 16384  # token rows per write (and per encode of a residual store): the build's buffer
TOKENS_FILE, CODEC_FILE = "tokens.npy", "store_codec.faiss"


def train_residual_codec(sample: np.ndarray, store_dtype: str):
    """Train PLAID's residual compression on `sample` as a faiss standalone codec; return (codec, manifest params).

    IVF k-means centroids (as many as PLAID takes, 2^floor(log2(16 sqrt(n))), capped at n / 39 so k-means has the
    points per centroid faiss asks for) and each residual scalar-quantised per dimension over the range seen on
    `sample`.
    """
    faiss = load_faiss()
    n, dim = sample.shape
    nlist = 1 << int(math.log2(max(1.0, min(16 * math.sqrt(n), n / 39))))
    spec = f"IVF{nlist},{RESIDUAL_STORES[store_dtype]}"
    codec = faiss.index_factory(dim, spec)  # L2: each vector's residual is taken from its nearest centroid
    codec.train(np.ascontiguousarray(sample, dtype=np.float32))
    return codec, {"codec": spec, "nlist": nlist, "n_train": int(n), "code_size": int(codec.sa_code_size())}


class TokenStoreWriter:
    """Streams float32 token vectors into `folder/tokens.npy`, `chunk` rows per write.

    The rows are float rows, or (residual stores) uint8 codes from a codec trained on the first `train_size` vectors,
    which are held until then. Memory: one chunk (plus the training sample), whatever the collection's size.
    """

    def __init__(self, folder: Path, store_dtype: str, chunk: int = STORE_CHUNK, train_size: int = 65536):
        self.path, self.store_dtype, self.chunk, self.train_size = (
            Path(folder) / TOKENS_FILE,
            store_dtype,
            chunk,
            train_size,
        )
        self.codec, self.params = None, {}
        self._pending: list[np.ndarray] = []
        self._n_pending = 0
        self._writer: NpyRowWriter | None = None

    @property
    def _needs_codec(self) -> bool:
        return self.store_dtype in RESIDUAL_STORES and self.codec is None

    def add(self, x: np.ndarray) -> None:
        """Append token vectors `x` [n, D] (float32) to the store; whole chunks are written as soon as they fill.

        A residual store holds everything until `train_size` vectors have arrived and its codec is trained.
        """
        self._pending.append(x)
        self._n_pending += len(x)
        if self._needs_codec:
            if self._n_pending < self.train_size:
                return
            self._train()
        self._flush(final=False)

    def _take_pending(self) -> np.ndarray:
        x = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._n_pending = [], 0
        return x

    def _train(self) -> None:
        x = self._take_pending()
        self.codec, self.params = train_residual_codec(x[: self.train_size], self.store_dtype)
        self._pending, self._n_pending = [x], len(x)

    def _flush(self, final: bool) -> None:
        if not self._pending or (self._n_pending < self.chunk and not final):
            return
        x = self._take_pending()
        end = len(x) if final else len(x) - len(x) % self.chunk
        for start in range(0, end, self.chunk):
            self._write(x[start : start + self.chunk])
        if end < len(x):
            self._pending, self._n_pending = [x[end:].copy()], len(x) - end  # a copy: `x` itself is freed

    def _write(self, x: np.ndarray) -> None:
        rows = (
            self.codec.sa_encode(np.ascontiguousarray(x, dtype=np.float32))
            if self.codec is not None
            else x.astype(FLOAT_STORES[self.store_dtype])
        )
        if self._writer is None:
            self._writer = NpyRowWriter(self.path, rows.dtype, rows.shape[1])
        self._writer.write(rows)

    def finish(self) -> np.memmap:
        """Write what is left and return the store memory-mapped."""
        if self._needs_codec and self._pending:
            self._train()
        self._flush(final=True)
        if self._writer is None:
            raise InputError("docs", "no token vectors to store")
        return self._writer.close()

    def abort(self) -> None:
        """Close the store file after a failed build, unfinished; removing its folder is the caller's job."""
        if self._writer is not None:
            self._writer.abort()


def link_or_copy(src: Path, dst: Path) -> None:
    """Make `dst` a hard link to `src` (instant, no second copy on disk), or a copy where linking is impossible.

    It is copied only where the file system cannot link (another device, no hard links). A token store is never
    written again once closed, and a saved index is replaced as a whole folder (core.io.AtomicDir), so the two names
    can share the file.
    """
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def candidates_from_hits(scores: np.ndarray, rows: np.ndarray, offsets: np.ndarray, depth: int | None) -> np.ndarray:
    """Passage indices (sorted ascending when not capped, else by approximate score) from one query's token hits.

    scores, rows: [Lq, k'] faiss results of the query's tokens (rows -1 = no hit).
    """
    valid = rows >= 0
    docs = np.searchsorted(offsets, np.where(valid, rows, 0), side="right") - 1
    uniq, inv = np.unique(docs[valid], return_inverse=True)
    if depth is None or len(uniq) <= depth:
        return uniq
    nq = rows.shape[0]
    # imputation per query token: its k'-th (smallest) retrieved similarity; 0 when it retrieved nothing
    imput = np.array([s[v].min() if v.any() else 0.0 for s, v in zip(scores, valid)], dtype=np.float64)
    approx = np.repeat(imput[:, None], len(uniq), axis=1)
    qrow = np.broadcast_to(np.arange(nq)[:, None], rows.shape)[valid]
    np.maximum.at(approx, (qrow, inv), scores[valid].astype(np.float64))
    total = approx.sum(0)
    order = np.lexsort((uniq, -total))[:depth]  # best approximate score first, ties by passage index
    return uniq[order]


@register_index
class ColBERTIndex(Index):
    """Token-level faiss index + on-disk token store of a ColBERT ranker's passages.

    The store holds float16/32 rows or residual codes (see the module docstring). The `retrieval.base.Index` of the
    ``colbert`` family (`RankerCapabilities.index`): ColBERT and any ranker scoring by its Eq. 1.
    """

    family = "colbert"
    format = FORMAT
    serves = "a ColBERT ranker"
    encoding = "tokens"
    build_options = (*ENCODING_OPTIONS, "store_dtype", "store_dir", "store_chunk", *INDEX_OPTIONS)
    search_options = ("k_tokens", "depth", "batch_size", "device", "precision", "rescore_chunk")
    load_options = ("pair_tokenizer", "use_gpu", "mmap")

    def __init__(
        self,
        index,
        tokens: np.ndarray,
        offsets: np.ndarray,
        doc_ids: list[str],
        manifest: dict,
        ranker=None,
        pair_tokenizer=None,
        placement: Placement | None = None,
        codec=None,
        store_path: Path | None = None,
    ):
        self.index, self.doc_ids, self.manifest = index, doc_ids, manifest
        self.tokens, self.offsets = tokens, offsets  # passage k's token rows: tokens[offsets[k]:offsets[k + 1]]
        self.codec = codec  # residual stores: the faiss codec decoding `tokens` (uint8 codes); None: float rows
        self.store_path = store_path  # the .npy file `tokens` maps, which `save` links instead of rewriting
        self._staging: weakref.finalize | None = None  # removes the build's temporary store folder
        self.ranker, self.pair_tokenizer, self.placement = ranker, pair_tokenizer, placement or Placement(False)

    def __len__(self) -> int:
        return len(self.doc_ids)

    @property
    def n_tokens(self) -> int:
        """Number of token vectors indexed: the rows of the token store."""
        return int(self.offsets[-1])

    @property
    def dim(self) -> int:
        """Dimension of the indexed token vectors (the ranker's output dimension)."""
        return self.manifest["dim"]

    # -- building
    @classmethod
    def build(
        cls,
        ranker,
        docs: Mapping | Iterable,
        *,
        pair_tokenizer=None,
        batch_size: int | str = 32,
        device=None,
        precision: str = "fp32",
        sort_window: int | None = None,
        store_dtype: str = "float16",
        store_dir: str | os.PathLike | None = None,
        store_chunk: int = STORE_CHUNK,
        checkpoint: str | None = None,
        encoded: Iterable | None = None,
        **index_opts,
    ) -> ColBERTIndex:
        """Encode `docs` in streamed batches, index every non-padding token vector, write them to the token store.

        `store_dir`: where the store is written while building (a temporary folder inside it; None: the system temp
        dir): the folder the index will be saved in, so that `save` links the store instead of copying it.
        `encoded`: the batches (ids, Encoded) of `docs` already encoded (retrieval/split.py), indexed instead of
        encoding here.
        `store_chunk`: token rows buffered per write. `index_opts`: `retrieval.dense.IndexOptions` fields for the
        token index (index_type, nlist, ...; `train_size` also sizes a residual store's training sample).
        """
        cls.check_ranker(ranker)
        if store_dtype not in STORE_DTYPES:
            raise InputError("store_dtype", f"is {store_dtype!r}; expected one of {list(STORE_DTYPES)}")
        if not isinstance(store_chunk, int) or isinstance(store_chunk, bool) or store_chunk < 1:
            raise InputError("store_chunk", f"is {store_chunk!r}; expected a positive integer")
        opts = IndexOptions.from_kwargs(**index_opts)
        pt = pair_tokenizer or pair_tokenizer_for(ranker)
        if store_dir is not None:
            Path(store_dir).mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".colbert-store-", dir=store_dir))
        store = TokenStoreWriter(folder, store_dtype, store_chunk, opts.train_size)
        try:
            builder = FaissBuilder(opts, what="docs")
            doc_ids: list[str] = []
            seen: set[str] = set()
            lengths: list[np.ndarray] = []
            with build_phase(docs, cls.family, encoding=encoded is None) as ph:
                if encoded is None:
                    encoded = encode_docs(
                        ranker, pt, docs, batch_size, device, precision, sort_window=sort_window, output="tokens"
                    )
                for ids, enc in encoded:
                    record_doc_ids(ids, doc_ids, seen)
                    flat = cosine_normalize(enc.tokens)[enc.mask]  # [sum of lengths, D], passage by passage, in order
                    lengths.append(enc.mask.sum(1).numpy().astype(np.int64))
                    x = np.ascontiguousarray(flat.numpy(), dtype=np.float32)
                    builder.add(x)
                    store.add(x)
                    ph.advance(len(ids))
                del seen
                if not doc_ids:
                    raise InputError("docs", "no documents to index")
                index, params = builder.finish()
                tokens = store.finish()
        except BaseException:
            store.abort()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        offsets = np.zeros(len(doc_ids) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        manifest = base_manifest(FORMAT, ranker, checkpoint, params, builder.dim, len(doc_ids), precision)
        manifest.update(
            n_tokens=int(offsets[-1]), store_dtype=store_dtype, score="colbert_maxsim_cosine", metric="inner_product"
        )
        if store.codec is not None:
            manifest["store_codec"] = store.params
        out = cls(index, tokens, offsets, doc_ids, manifest, ranker, pt, builder.placement, store.codec, store.path)
        out._staging = weakref.finalize(out, shutil.rmtree, str(folder), True)
        return out

    # -- searching
    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Change nprobe (ivf, ivfpq; capped at nlist) or efSearch (hnsw) of the token index (recorded on save)."""
        p = self.manifest["params"]
        if nprobe is not None:
            p["nprobe"] = min(int(nprobe), p.get("nlist", nprobe))
        if ef_search is not None:
            p["ef_search"] = int(ef_search)
        self.placement.set_params(self.index, p)

    def token_rows(self, idx: np.ndarray) -> np.ndarray:
        """Return the stored token vectors of store rows `idx` as float32 [n, D].

        They are read from the memory map (only those rows) and, for a residual store, decoded.
        """
        rows = self.tokens[idx]
        if self.codec is not None:
            return self.codec.sa_decode(np.ascontiguousarray(rows, dtype=np.uint8))
        return np.asarray(rows, dtype=np.float32)

    def doc_tokens(self, rows: np.ndarray) -> Encoded:
        """Return the stored (normalised) token matrices of passages `rows`, padded.

        The result is Encoded(tokens [C, L, D] float32, mask).
        """
        start, end = self.offsets[rows], self.offsets[rows + 1]
        lens = end - start
        width = int(lens.max()) if len(lens) else 0
        ar = np.arange(width)
        mask = ar[None, :] < lens[:, None]
        idx = np.where(mask, start[:, None] + ar[None, :], 0)
        toks = torch.from_numpy(self.token_rows(idx.reshape(-1)).reshape(len(rows), width, -1))
        toks[~torch.from_numpy(mask)] = 0.0
        return Encoded(tokens=toks, mask=torch.from_numpy(mask))

    def rescore(self, q_tokens: torch.Tensor, q_mask: torch.Tensor, rows: np.ndarray, chunk: int = 256) -> np.ndarray:
        """Exact ColBERT scores (ranker.score_all, Eq. 1) of one query [Lq, D] against passages `rows`."""
        ranker = self.ensure_ranker()
        dev = next(ranker.parameters()).device
        q = Encoded(tokens=q_tokens[None].to(dev), mask=q_mask[None].to(dev))
        out = []
        with torch.inference_mode():
            for s in range(0, len(rows), chunk):
                d = self.doc_tokens(rows[s : s + chunk])
                d = Encoded(tokens=d.tokens.to(dev), mask=d.mask.to(dev))
                out.append(ranker.score_all(q, d)[0].float().cpu())
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.float32)

    def search(
        self,
        queries: Mapping[str, str] | Iterable,
        k: int = 100,
        *,
        k_tokens: int = 256,
        depth: int | None = 1000,
        batch_size: int | str = 32,
        device=None,
        precision: str | None = None,
        rescore_chunk: int = 256,
    ) -> dict[str, dict[str, float]]:
        """Return the top-k passages of every query by exact ColBERT score among the token-search candidates.

        The result is a run {qid: {doc id: score}}. `k_tokens`: hits per query token; `depth`: at most this many
        candidates re-scored.
        """
        for key, v in (("k", k), ("k_tokens", k_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(key, f"is {v!r}; expected a positive integer")
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise InputError("depth", f"is {depth!r}; expected a positive integer or None")
        ranker = self.ensure_ranker()
        prec = precision or self.manifest.get("precision", "fp32")
        kk = min(k_tokens, self.n_tokens)
        if self.placement.on_gpu and kk > GPU_MAX_K:
            raise InputError("k_tokens", f"is {kk}; faiss on the GPU returns at most {GPU_MAX_K} hits per query token")
        run: dict[str, dict[str, float]] = {}
        with search_phase(queries, self.family) as ph:
            for qids, enc in encode_queries(
                ranker, self.pair_tokenizer, queries, batch_size, device, prec, output="tokens"
            ):
                flat = np.ascontiguousarray(cosine_normalize(enc.tokens)[enc.mask].numpy(), dtype=np.float32)
                if flat.shape[1] != self.dim:
                    raise InputError(
                        "ranker", f"query token vectors are {flat.shape[1]}-dimensional; this index holds {self.dim}"
                    )
                scores, hits = self.index.search(flat, kk)
                lens = enc.mask.sum(1).tolist()
                start = 0
                for b, qid in enumerate(qids):
                    qid = str(qid)
                    if qid in run:
                        raise InputError("queries", f"duplicate query id '{qid}'")
                    sl = slice(start, start + lens[b])
                    start += lens[b]
                    cands = candidates_from_hits(scores[sl], hits[sl], self.offsets, depth)
                    exact = self.rescore(enc.tokens[b], enc.mask[b], cands, rescore_chunk)
                    order = np.lexsort((cands, -exact.astype(np.float64)))[:k]
                    run[qid] = {self.doc_ids[cands[i]]: float(exact[i]) for i in order}
                ph.advance(len(qids))
        return run

    # -- persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the index directory atomically.

        A store on disk is hard-linked in (copied across file systems); the index then reads the saved store, and the
        build's temporary store folder is removed.
        """
        path = Path(path)
        with AtomicDir(path) as tmp:
            load_faiss().write_index(self.placement.to_cpu(self.index), str(tmp / "index.faiss"))
            if self.store_path is not None:
                link_or_copy(self.store_path, tmp / TOKENS_FILE)
            else:
                np.save(tmp / TOKENS_FILE, np.asarray(self.tokens))
            if self.codec is not None:
                load_faiss().write_index(self.codec, str(tmp / CODEC_FILE))
            np.save(tmp / "offsets.npy", self.offsets)
            write_json(tmp / "doc_ids.json", self.doc_ids)
            write_json(tmp / "manifest.json", self.manifest)
        if self.store_path is not None:
            self.store_path = path / TOKENS_FILE
            self.tokens = np.load(self.store_path, mmap_mode="r")
            if self._staging is not None:
                self._staging()
        return path

    @classmethod
    def load(
        cls, path: str | os.PathLike, ranker=None, pair_tokenizer=None, use_gpu: bool | None = None, mmap: bool = True
    ) -> ColBERTIndex:
        """Read an index directory; `tokens.npy` is memory-mapped unless `mmap=False`.

        Without `ranker`, `search` rebuilds it from the recorded checkpoint.
        """
        path = Path(path)
        manifest = cls.read_manifest(path)
        if ranker is not None:
            cls.check_ranker(ranker)
        check_ranker_matches(ranker, manifest, path)
        count, n_tokens, kind = int(manifest["count"]), int(manifest["n_tokens"]), manifest.get("store_dtype")
        if kind not in STORE_DTYPES:
            raise InputError(str(path), f"store_dtype is {kind!r}; expected one of {list(STORE_DTYPES)}")
        doc_ids = read_doc_ids(path / "doc_ids.json", count)
        try:
            offsets = np.load(path / "offsets.npy")
            tokens = np.load(path / TOKENS_FILE, mmap_mode="r" if mmap else None)
        except (OSError, ValueError) as e:
            raise InputError(str(path), f"cannot read the token store ({type(e).__name__}: {e})") from e
        codec = read_codec(path / CODEC_FILE, manifest) if kind in RESIDUAL_STORES else None
        width = manifest["store_codec"]["code_size"] if codec is not None else manifest["dim"]
        if offsets.shape != (count + 1,) or int(offsets[-1]) != n_tokens or tokens.shape != (n_tokens, width):
            raise InputError(
                str(path),
                f"token store shapes {tokens.shape}, {offsets.shape} do not match the manifest "
                f"({n_tokens} tokens of width {width}, {count} docs)",
            )
        cpu_index = read_faiss(path / "index.faiss", n_tokens)
        placement = Placement(use_gpu)
        index = placement.place(cpu_index, manifest["index_type"])
        placement.set_params(index, manifest["params"])
        return cls(
            index,
            tokens,
            offsets,
            doc_ids,
            manifest,
            ranker,
            pair_tokenizer,
            placement,
            codec,
            path / TOKENS_FILE if mmap else None,
        )


def read_codec(path: Path, manifest: dict):
    """Read a residual store's faiss codec, checked against the manifest (dimension, code size)."""
    codec = read_faiss(path, 0)  # a codec holds no vectors
    params = manifest.get("store_codec") or {}
    if codec.d != manifest["dim"] or codec.sa_code_size() != params.get("code_size"):
        raise InputError(
            str(path),
            f"codec of {codec.d} dimensions, {codec.sa_code_size()}-byte codes; "
            f"the manifest says {manifest['dim']}, {params.get('code_size')}",
        )
    return codec


def colbert_index_from_checkpoint(
    ckpt_path: str | os.PathLike, docs: Mapping | Iterable, *, device=None, **opts
) -> ColBERTIndex:
    """Load the ranker of a ColBERT checkpoint and index `docs` with it: `ColBERTIndex.from_checkpoint` (older name)."""
    return ColBERTIndex.from_checkpoint(ckpt_path, docs, device=device, **opts)
