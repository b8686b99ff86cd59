"""ColBERT end-to-end retrieval: token-level faiss search for candidates, then exact late-interaction re-scoring.

    index = ColBERTIndex.build(ranker, docs)                           # docs: {doc id: text} or (id, text) pairs
    run = index.search(queries, k=100, k_tokens=256, depth=1000)       # {qid: {doc id: exact ColBERT score}}

Indexing (streamed, one batch of tokenisation at a time): every non-padding token vector of every passage,
L2-normalised (ColBERT scores cosines), goes into a faiss inner-product index (any `retrieval.dense` index type:
flat by default, ivf / hnsw / pq / ivfpq for large collections). The same vectors are kept for re-scoring in one
contiguous `[T, D]` array (`store_dtype`, float16 by default: half the memory of float32) with `offsets [N + 1]`:
passage i owns rows offsets[i]:offsets[i + 1], so token row -> passage is a binary search and no per-token id map
is stored.

Search, per query (ColBERT, Khattab & Zaharia 2020, section 3.6):
1. each query token retrieves its `k_tokens` nearest passage tokens; the passages owning them are the candidates;
2. when there are more than `depth` candidates, the `depth` best by an approximate score are kept: for each query
   token the best similarity among its retrieved tokens of that passage, or, when none was retrieved, the
   similarity of its k_tokens-th hit (an upper bound for the exact case; XTR's "missing similarity imputation"),
   summed over query tokens; ties by passage order. `depth=None` keeps every candidate;
3. the candidates are re-scored exactly with the ranker's own Eq. 1 (`ranker.score_all`: sum over query tokens of
   the max cosine over passage tokens, padding masked) on their stored token matrices, and the top k returned.

With float32 storage the returned scores equal `ranker.score_all` on freshly encoded passages (up to float
rounding); float16 storage perturbs them by ~1e-3 per query token. With `k_tokens` covering every stored token and
`depth=None` the result is the exact top k of brute-force ColBERT over the whole collection.

On disk (`save`, atomic like `retrieval.dense`): `index.faiss`, `tokens.npy`, `offsets.npy`, `doc_ids.json`,
`manifest.json`; `load` memory-maps `tokens.npy`.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from core.errors import InputError
from core.io import AtomicDir, write_json
from lightning_modules.loading import module_from_checkpoint
from lightning_modules.rankers.base import Encoded, cosine_normalize
from lightning_modules.rankers.colbert import ColBERT
from retrieval.dense import (
    GPU_MAX_K,
    FaissBuilder,
    IndexOptions,
    Placement,
    base_manifest,
    check_ranker_matches,
    ensure_ranker,
    load_faiss,
    read_doc_ids,
    read_faiss,
    read_manifest,
    record_doc_ids,
)
from retrieval.encode import (
    encode_docs,
    encode_queries,
    pair_tokenizer_for,
)

__all__ = ["ColBERTIndex", "colbert_index_from_checkpoint", "candidates_from_hits"]

FORMAT = "isorank-colbert-e2e-index"
STORE_DTYPES = {"float16": np.float16, "float32": np.float32}


def candidates_from_hits(scores: np.ndarray, rows: np.ndarray, offsets: np.ndarray, depth: int | None) -> np.ndarray:
    """Passage indices (sorted ascending when not capped, else by approximate score) from one query's token hits.

    scores, rows: [Lq, k'] faiss results of the query's tokens (rows -1 = no hit)."""
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


class ColBERTIndex:
    """Token-level faiss index + float16/32 token store of a ColBERT ranker's passages."""

    def __init__(self, index, tokens: np.ndarray, offsets: np.ndarray, doc_ids: list[str], manifest: dict,
                 ranker=None, pair_tokenizer=None, placement: Placement | None = None):
        self.index, self.doc_ids, self.manifest = index, doc_ids, manifest
        self.tokens, self.offsets = tokens, offsets  # passage k's token vectors: tokens[offsets[k]:offsets[k + 1]]
        self.ranker, self.pair_tokenizer, self.placement = ranker, pair_tokenizer, placement or Placement(False)

    def __len__(self) -> int:
        return len(self.doc_ids)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def dim(self) -> int:
        return self.manifest["dim"]

    @staticmethod
    def _check(ranker) -> None:
        if not isinstance(ranker, ColBERT):
            name = getattr(getattr(ranker, "cfg", None), "name", type(ranker).__name__)
            raise InputError("model.name", f"'{name}' is not a ColBERT ranker; ColBERTIndex serves colbert (repbert and bert_dot: retrieval.dense.DenseIndex)")

    # -- building
    @classmethod
    def build(cls, ranker, docs: Mapping | Iterable, *, pair_tokenizer=None, batch_size: int = 32, device=None,
              precision: str = "fp32", sort_window: int | None = None, store_dtype: str = "float16",
              checkpoint: str | None = None, **index_opts) -> "ColBERTIndex":
        """Encode `docs` in streamed batches, index every non-padding token vector, store them for re-scoring.
        `index_opts`: `retrieval.dense.IndexOptions` fields for the token index (index_type, nlist, ...)."""
        cls._check(ranker)
        if store_dtype not in STORE_DTYPES:
            raise InputError("store_dtype", f"is {store_dtype!r}; expected one of {list(STORE_DTYPES)}")
        opts = IndexOptions.from_kwargs(**index_opts)
        pt = pair_tokenizer or pair_tokenizer_for(ranker)
        builder = FaissBuilder(opts, what="docs")
        doc_ids: list[str] = []
        seen: set[str] = set()
        chunks: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for ids, enc in encode_docs(ranker, pt, docs, batch_size, device, precision, sort_window=sort_window, output="tokens"):
            record_doc_ids(ids, doc_ids, seen)
            flat = cosine_normalize(enc.tokens)[enc.mask]  # [sum of lengths, D], passage by passage, in order
            lengths.append(enc.mask.sum(1).numpy().astype(np.int64))
            x = np.ascontiguousarray(flat.numpy(), dtype=np.float32)
            builder.add(x)
            chunks.append(x.astype(STORE_DTYPES[store_dtype]))
        del seen
        if not doc_ids:
            raise InputError("docs", "no documents to index")
        index, params = builder.finish()
        offsets = np.zeros(len(doc_ids) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        tokens = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        del chunks
        manifest = base_manifest(FORMAT, ranker, checkpoint, params, builder.dim, len(doc_ids), precision)
        manifest.update(n_tokens=int(offsets[-1]), store_dtype=store_dtype, score="colbert_maxsim_cosine", metric="inner_product")
        return cls(index, tokens, offsets, doc_ids, manifest, ranker, pt, builder.placement)

    # -- searching
    def _ensure_ranker(self):
        return ensure_ranker(self)

    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        p = self.manifest["params"]
        if nprobe is not None:
            p["nprobe"] = min(int(nprobe), p.get("nlist", nprobe))
        if ef_search is not None:
            p["ef_search"] = int(ef_search)
        self.placement.set_params(self.index, p)

    def doc_tokens(self, rows: np.ndarray) -> Encoded:
        """Stored (normalised) token matrices of passages `rows`, padded: Encoded(tokens [C, L, D] float32, mask)."""
        start, end = self.offsets[rows], self.offsets[rows + 1]
        lens = end - start
        width = int(lens.max()) if len(lens) else 0
        ar = np.arange(width)
        mask = ar[None, :] < lens[:, None]
        idx = np.where(mask, start[:, None] + ar[None, :], 0)
        toks = torch.from_numpy(np.asarray(self.tokens[idx.reshape(-1)], dtype=np.float32).reshape(len(rows), width, -1))
        toks[~torch.from_numpy(mask)] = 0.0
        return Encoded(tokens=toks, mask=torch.from_numpy(mask))

    def rescore(self, q_tokens: torch.Tensor, q_mask: torch.Tensor, rows: np.ndarray, chunk: int = 256) -> np.ndarray:
        """Exact ColBERT scores (ranker.score_all, Eq. 1) of one query [Lq, D] against passages `rows`."""
        ranker = self._ensure_ranker()
        dev = next(ranker.parameters()).device
        q = Encoded(tokens=q_tokens[None].to(dev), mask=q_mask[None].to(dev))
        out = []
        with torch.inference_mode():
            for s in range(0, len(rows), chunk):
                d = self.doc_tokens(rows[s : s + chunk])
                d = Encoded(tokens=d.tokens.to(dev), mask=d.mask.to(dev))
                out.append(ranker.score_all(q, d)[0].float().cpu())
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.float32)

    def search(self, queries: Mapping[str, str] | Iterable, k: int = 100, *, k_tokens: int = 256, depth: int | None = 1000,
               batch_size: int = 32, device=None, precision: str | None = None, rescore_chunk: int = 256) -> dict[str, dict[str, float]]:
        """Top-k passages of every query by exact ColBERT score among the token-search candidates: a run
        {qid: {doc id: score}}. `k_tokens`: hits per query token; `depth`: at most this many candidates re-scored."""
        for key, v in (("k", k), ("k_tokens", k_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(key, f"is {v!r}; expected a positive integer")
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise InputError("depth", f"is {depth!r}; expected a positive integer or None")
        ranker = self._ensure_ranker()
        prec = precision or self.manifest.get("precision", "fp32")
        kk = min(k_tokens, self.n_tokens)
        if self.placement.on_gpu and kk > GPU_MAX_K:
            raise InputError("k_tokens", f"is {kk}; faiss on the GPU returns at most {GPU_MAX_K} hits per query token")
        run: dict[str, dict[str, float]] = {}
        for qids, enc in encode_queries(ranker, self.pair_tokenizer, queries, batch_size, device, prec, output="tokens"):
            flat = np.ascontiguousarray(cosine_normalize(enc.tokens)[enc.mask].numpy(), dtype=np.float32)
            if flat.shape[1] != self.dim:
                raise InputError("ranker", f"query token vectors are {flat.shape[1]}-dimensional; this index holds {self.dim}")
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
        return run

    # -- persistence
    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        with AtomicDir(path) as tmp:
            load_faiss().write_index(self.placement.to_cpu(self.index), str(tmp / "index.faiss"))
            np.save(tmp / "tokens.npy", np.asarray(self.tokens))
            np.save(tmp / "offsets.npy", self.offsets)
            write_json(tmp / "doc_ids.json", self.doc_ids)
            write_json(tmp / "manifest.json", self.manifest)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, ranker=None, pair_tokenizer=None, use_gpu: bool | None = None, mmap: bool = True) -> "ColBERTIndex":
        """Read an index directory; `tokens.npy` is memory-mapped unless `mmap=False`. Without `ranker`, `search`
        rebuilds it from the recorded checkpoint."""
        path = Path(path)
        manifest = read_manifest(path, FORMAT)
        if ranker is not None:
            cls._check(ranker)
        check_ranker_matches(ranker, manifest, path)
        count, n_tokens = int(manifest["count"]), int(manifest["n_tokens"])
        doc_ids = read_doc_ids(path / "doc_ids.json", count)
        try:
            offsets = np.load(path / "offsets.npy")
            tokens = np.load(path / "tokens.npy", mmap_mode="r" if mmap else None)
        except (OSError, ValueError) as e:
            raise InputError(str(path), f"cannot read the token store ({type(e).__name__}: {e})") from e
        if offsets.shape != (count + 1,) or int(offsets[-1]) != n_tokens or tokens.shape != (n_tokens, manifest["dim"]):
            raise InputError(str(path), f"token store shapes {tokens.shape}, {offsets.shape} do not match the manifest ({n_tokens} tokens, {count} docs, dim {manifest['dim']})")
        cpu_index = read_faiss(path / "index.faiss", n_tokens)
        placement = Placement(use_gpu)
        index = placement.place(cpu_index, manifest["index_type"])
        placement.set_params(index, manifest["params"])
        return cls(index, tokens, offsets, doc_ids, manifest, ranker, pair_tokenizer, placement)


def colbert_index_from_checkpoint(ckpt_path: str | os.PathLike, docs: Mapping | Iterable, *, device=None, **opts) -> ColBERTIndex:
    """Rebuild the RankingModule of a ColBERT checkpoint (as `pipeline.run.evaluate` does) and index `docs`."""
    module = module_from_checkpoint(ckpt_path, key="ckpt", device=device)
    return ColBERTIndex.build(module.ranker, docs, pair_tokenizer=module.pair_tokenizer, device=device, checkpoint=str(ckpt_path), **opts)
