r"""Dense full ranking with faiss for the single-vector rankers (RepBERT, BERT_DOT).

    index = DenseIndex.build(ranker, docs)                      # docs: {doc id: text} or an iterable of pairs
    run = index.search(queries, k=100)                          # {qid: {doc id: score}}
    write_trec_run("run.trec", run, tag="repbert-dense")
    index.save("outputs/x/index"); DenseIndex.load("outputs/x/index", ranker)

    index = DenseIndex.from_checkpoint("outputs/x/checkpoints/last.ckpt", docs, index_type="hnsw")

`DenseIndex` is the ``dense`` family of the one index interface (`retrieval.base.Index`: build, search, save, load,
the manifest and its checks); `index_from_checkpoint` is the older name of `DenseIndex.from_checkpoint`.

Scores are the ranker's own: RepBERT's cosine (vectors L2-normalised with `cosine_normalize`, then inner product),
BERT_DOT's dot product (raw inner product). Every index uses the inner-product metric, so a flat index returns the
exact top-k of `ranker.score_all`.

Index types (`index_type=`):

| type    | faiss                      | exact | knobs                                         |
|---------|----------------------------|-------|-----------------------------------------------|
| `flat`  | IndexFlatIP (default)      | yes   |                                               |
| `ivf`   | IndexIVFFlat               | no    | `nlist`, `nprobe` (nprobe = nlist is exact)   |
| `hnsw`  | IndexHNSWFlat, inner prod. | no    | `hnsw_m`, `ef_construction`, `ef_search`      |
| `pq`    | IndexPQ                    | no    | `pq_m` sub-quantizers, `pq_nbits`             |
| `ivfpq` | IndexIVFPQ                 | no    | `nlist`, `nprobe`, `pq_m`, `pq_nbits`         |

Building streams the collection (`retrieval.encode.encode_docs`): one batch of tokenisation at a time, vectors
added to faiss as they come. Trained types (ivf, pq, ivfpq) buffer the first `train_size` vectors, train on them,
then add everything; defaults adapt to a small collection (`nlist` ~ min(4 sqrt(n), n / 39), `pq_nbits` <= log2 n).

faiss-gpu is used when present (`faiss.get_num_gpus() > 0`; `use_gpu=False` opts out, `use_gpu=True` demands it)
for flat, ivf and ivfpq; HNSW and PQ stay on the CPU (faiss has no GPU version of them). On faiss-cpu everything
runs on the CPU. Saved indexes are always CPU indexes.

On disk (`save`, atomic: written into a temporary sibling directory, fsynced, then renamed into place):
`index.faiss`, `doc_ids.json` (row -> doc id), `manifest.json` (ranker, checkpoint, index type and parameters,
dim, count, score, precision, faiss version).

From the command line (retrieval/config.py, retrieval/retrieve.py):

    python evaluate.py retrieval=dense ckpt=outputs/x/checkpoints/last.ckpt data=vaswani output_dir=outputs/x-dense \
        [retrieval.split=test] [retrieval.k=1000] [retrieval.index_type=hnsw] [retrieval.nlist=N] \
        [retrieval.nprobe=N] [retrieval.hnsw_m=M] [retrieval.ef_search=N] [retrieval.pq_m=M] [retrieval.pq_nbits=B] \
        [retrieval.batch_size=auto] [retrieval.precision=bf16] [retrieval.device=cuda] [retrieval.gpu_index=false] \
        [retrieval.index_dir=DIR] [retrieval.k_tokens=256] [retrieval.depth=1000]

writes `run.trec`, `metrics.json` (the split's qrels, `eval.measures`) and the index (`<output_dir>/index` unless
`retrieval.index_dir`). A ColBERT checkpoint is served by `retrieval.colbert_e2e` (end-to-end, `retrieval.k_tokens`,
`retrieval.depth`).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sized
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import InputError
from core.io import AtomicDir, write_json
from models.loading import pair_tokenizer_for
from models.rankers.base import cosine_normalize
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
from retrieval.encode import (
    encode_docs,
    encode_queries,
)

__all__ = [
    "INDEX_TYPES",
    "INDEX_OPTIONS",
    "IndexOptions",
    "FaissBuilder",
    "DenseIndex",
    "index_from_checkpoint",
    "run_from_hits",
    "faiss_gpu_available",
]

INDEX_TYPES = ("flat", "ivf", "hnsw", "pq", "ivfpq")
TRAINED = ("ivf", "pq", "ivfpq")
ON_GPU = ("flat", "ivf", "ivfpq")  # what faiss can put on a GPU among ours
GPU_MAX_K = 2048  # faiss GPU k-selection limit
FORMAT, VERSION = "isorank-dense-index", 1


# ---- faiss index construction ----------------------------------------------------------------------------------
def load_faiss():
    """Return the faiss module (faiss-cpu or faiss-gpu, whichever is installed), imported on first use."""
    import faiss  # lazy: faiss-cpu or faiss-gpu, only dense retrieval needs it

    return faiss


def faiss_gpu_available() -> bool:
    """Tell whether faiss can use a GPU: a faiss-gpu build that sees at least one usable CUDA device."""
    faiss = load_faiss()
    try:
        return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    except Exception:  # a GPU build on a machine without a usable driver
        return False


@dataclass
class IndexOptions:
    """How the faiss index is built and searched. Keys are checked by `validate` (InputError naming the key)."""

    index_type: str = "flat"
    nlist: int | None = None  # ivf, ivfpq: inverted lists; None = min(4 sqrt(n), n / 39) over the training sample
    nprobe: int | None = None  # ivf, ivfpq: lists visited per query; None = min(nlist, 16)
    hnsw_m: int = 32  # hnsw: neighbours per node
    ef_construction: int = 80  # hnsw: candidate list while building
    ef_search: int = 128  # hnsw: candidate list while searching (>= k is sensible)
    pq_m: int | None = None  # pq, ivfpq: sub-quantizers (must divide dim); None = largest divisor of dim <= dim / 8
    pq_nbits: int | None = None  # pq, ivfpq: bits per sub-quantizer code; None = 8, fewer for a tiny training sample
    train_size: int = 65536  # ivf, pq, ivfpq: the first vectors streamed, buffered to train on
    use_gpu: bool | None = None  # None = use faiss-gpu when present

    @classmethod
    def from_kwargs(cls, **kw) -> IndexOptions:
        """Build validated options from keyword arguments; an unknown or invalid key is an InputError naming it."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise InputError(unknown[0], f"unknown index option; expected one of {sorted(names)}")
        opts = cls(**kw)
        opts.validate()
        return opts

    def validate(self) -> None:
        """Check every option (type, range, a GPU for `use_gpu=True`); the first bad one is an InputError naming it."""
        if self.index_type not in INDEX_TYPES:
            raise InputError(
                "index_type", f"unknown index type '{self.index_type}'; expected one of {list(INDEX_TYPES)}"
            )
        for key in ("nlist", "nprobe", "pq_m", "pq_nbits"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise InputError(key, f"is {v!r}; expected a positive integer or None")
        for key in ("hnsw_m", "ef_construction", "ef_search", "train_size"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(key, f"is {v!r}; expected a positive integer")
        if self.pq_nbits is not None and self.pq_nbits > 16:
            raise InputError("pq_nbits", f"is {self.pq_nbits}; expected at most 16")
        if self.use_gpu and not faiss_gpu_available():
            raise InputError("use_gpu", "is true but faiss sees no GPU (faiss-cpu installed, or no CUDA device)")


INDEX_OPTIONS = tuple(f.name for f in fields(IndexOptions))  # the faiss keyword arguments of dense / ColBERT builds


def _default_pq_m(dim: int) -> int:
    return max(m for m in range(1, max(1, dim // 8) + 1) if dim % m == 0)


def resolve_params(opts: IndexOptions, dim: int, n_train: int | None) -> dict:
    """Return the concrete parameters of the index to build (defaults filled in, checked against dim and n_train)."""
    p: dict[str, Any] = {"index_type": opts.index_type}
    t = opts.index_type
    if t in ("ivf", "ivfpq"):
        nlist = opts.nlist or max(1, min(int(4 * math.sqrt(n_train)), n_train // 39))
        if nlist > n_train:
            raise InputError(
                "nlist", f"is {nlist} but only {n_train} vectors are there to train on; expected nlist <= {n_train}"
            )
        p.update(nlist=nlist, nprobe=min(opts.nprobe or min(nlist, 16), nlist))
    if t in ("pq", "ivfpq"):
        m = opts.pq_m or _default_pq_m(dim)
        if dim % m:
            raise InputError("pq_m", f"is {m}, which does not divide the vector dimension {dim}")
        nbits = opts.pq_nbits or max(1, min(8, int(math.log2(max(2, n_train)))))
        if 2**nbits > n_train:
            raise InputError(
                "pq_nbits",
                f"is {nbits}: {2**nbits} centroids per sub-quantizer need at least that many training vectors, "
                f"got {n_train}",
            )
        p.update(pq_m=m, pq_nbits=nbits)
    if t == "hnsw":
        p.update(hnsw_m=opts.hnsw_m, ef_construction=opts.ef_construction, ef_search=opts.ef_search)
    if t in TRAINED:
        p["n_train"] = n_train
    return p


def make_cpu_index(dim: int, p: dict):
    faiss = load_faiss()
    ip = faiss.METRIC_INNER_PRODUCT
    t = p["index_type"]
    if t == "flat":
        return faiss.IndexFlatIP(dim)
    if t == "hnsw":
        index = faiss.IndexHNSWFlat(dim, p["hnsw_m"], ip)
        index.hnsw.efConstruction = p["ef_construction"]
        index.hnsw.efSearch = p["ef_search"]
        return index
    if t == "pq":
        return faiss.IndexPQ(dim, p["pq_m"], p["pq_nbits"], ip)
    quantizer = faiss.IndexFlatIP(dim)
    if t == "ivf":
        index = faiss.IndexIVFFlat(quantizer, dim, p["nlist"], ip)
    else:
        index = faiss.IndexIVFPQ(quantizer, dim, p["nlist"], p["pq_m"], p["pq_nbits"], ip)
    return index  # faiss' Python wrapper keeps `quantizer` alive as long as `index`


class Placement:
    """Where a faiss index lives: a CPU index, or a GPU copy with the resources it needs kept alive."""

    def __init__(self, use_gpu: bool | None):
        self.want_gpu = faiss_gpu_available() if use_gpu is None else bool(use_gpu)
        self.resources = None
        self.on_gpu = False

    def place(self, cpu_index, index_type: str):
        if not self.want_gpu or index_type not in ON_GPU:
            return cpu_index
        faiss = load_faiss()
        try:
            if self.resources is None:
                self.resources = faiss.StandardGpuResources()
            gpu_index = faiss.index_cpu_to_gpu(self.resources, 0, cpu_index)
        except Exception as e:  # e.g. an IVFPQ code size the GPU kernels do not support
            warnings.warn(
                f"faiss GPU placement of a '{index_type}' index failed ({e}); using the CPU index", stacklevel=2
            )
            return cpu_index
        self.on_gpu = True
        return gpu_index

    def to_cpu(self, index):
        return load_faiss().index_gpu_to_cpu(index) if self.on_gpu else index

    def set_params(self, index, p: dict) -> None:
        faiss = load_faiss()
        t = p["index_type"]
        if t in ("ivf", "ivfpq"):
            space = faiss.GpuParameterSpace() if self.on_gpu else faiss.ParameterSpace()
            space.set_index_parameter(index, "nprobe", int(p["nprobe"]))
        elif t == "hnsw":
            index.hnsw.efSearch = int(p["ef_search"])


class FaissBuilder:
    """Streams float32 vectors into a faiss index; `finish()` returns (index, params).

    Trained types buffer the first `train_size` vectors, train on them, then add them and everything after.
    """

    def __init__(self, opts: IndexOptions, placement: Placement | None = None, what: str = "docs"):
        self.opts = opts
        self.placement = placement or Placement(opts.use_gpu)
        self.what = what
        self.index = None
        self.params: dict | None = None
        self.dim: int | None = None
        self.count = 0
        self._pending: list[np.ndarray] = []
        self._n_pending = 0

    def add(self, x: np.ndarray) -> None:
        """Add vectors `x` [n, dim] to the index (buffered until a trained type has `train_size` to train on).

        Another shape than [n, dim] (or a change of dim) is a ValueError; a NaN or inf vector is an InputError on
        `what`.
        """
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            raise ValueError(f"expected [n, dim] vectors, got shape {x.shape}")
        if self.dim is None:
            self.dim = int(x.shape[1])
        elif x.shape[1] != self.dim:
            raise ValueError(f"vector dimension changed from {self.dim} to {x.shape[1]}")
        if not len(x):
            return
        if not np.isfinite(x).all():
            raise InputError(
                self.what, "an encoded vector is not finite (NaN or inf); check the checkpoint and precision"
            )
        self.count += len(x)
        if self.index is None and self.opts.index_type in TRAINED:
            self._pending.append(x)
            self._n_pending += len(x)
            if self._n_pending >= self.opts.train_size:
                self._train_and_flush()
            return
        if self.index is None:
            self._create(None)
        self.index.add(x)

    def _create(self, n_train: int | None) -> None:
        self.params = resolve_params(self.opts, self.dim, n_train)
        self.index = self.placement.place(make_cpu_index(self.dim, self.params), self.opts.index_type)

    def _train_and_flush(self) -> None:
        x = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._n_pending = [], 0
        sample = x[: self.opts.train_size]
        self._create(len(sample))
        self.index.train(sample)
        self.index.add(x)

    def finish(self):
        """Train on what is buffered if the index is not trained yet, add it, and return (index, params).

        No vector at all is an InputError ("no documents to index").
        """
        if self.index is None:
            if not self._pending:
                raise InputError(self.what, "no documents to index")
            self._train_and_flush()
        self.placement.set_params(self.index, self.params)
        return self.index, self.params


def run_from_hits(qids: list, scores: np.ndarray, rows: np.ndarray, doc_ids: list[str]) -> dict[str, dict[str, float]]:
    """Faiss (D, I) -> {qid: {doc id: score}}; rows of -1 (fewer hits than k) are dropped."""
    run = {}
    for qid, srow, irow in zip(qids, scores, rows):
        run[str(qid)] = {doc_ids[i]: float(s) for s, i in zip(srow, irow) if i >= 0}
    return run


def read_faiss(path: Path, count: int):
    if not path.is_file():
        raise InputError(str(path), "missing faiss index file")
    try:
        index = load_faiss().read_index(str(path))
    except Exception as e:
        raise InputError(
            str(path),
            f"cannot read faiss index ({str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__})",
        ) from e
    if index.ntotal != count:
        raise InputError(str(path), f"holds {index.ntotal} vectors; the manifest says {count}")
    return index


def _config_dict(cfg) -> dict:
    return asdict(cfg) if is_dataclass(cfg) else dict(cfg)


def base_manifest(fmt: str, ranker, checkpoint, params: dict, dim: int, count: int, precision: str) -> dict:
    return {
        "format": fmt,
        "version": VERSION,
        "ranker": ranker.cfg.name,
        "ranker_config": _config_dict(ranker.cfg),
        "checkpoint": str(Path(checkpoint).resolve()) if checkpoint else None,
        "index_type": params["index_type"],
        "params": params,
        "dim": int(dim),
        "count": int(count),
        "precision": precision,
        "faiss_version": getattr(load_faiss(), "__version__", "?"),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


# ---- the dense index -------------------------------------------------------------------------------------------
@register_index
class DenseIndex(Index):
    """A faiss index over the pooled vectors of a single-vector ranker, with the doc id of every row.

    The `retrieval.base.Index` of the ``dense`` family (`RankerCapabilities.index`): RepBERT, BERT_DOT.
    """

    family = "dense"
    format = FORMAT
    serves = "a single-vector ranker"
    encoding = "sequence"
    build_options = (*ENCODING_OPTIONS, *INDEX_OPTIONS)
    search_options = ("batch_size", "device", "precision")
    load_options = ("pair_tokenizer", "use_gpu")

    def __init__(
        self,
        index,
        doc_ids: list[str],
        manifest: dict,
        ranker=None,
        pair_tokenizer=None,
        placement: Placement | None = None,
    ):
        self.index = index
        self.doc_ids = doc_ids
        self.manifest = manifest
        self.ranker = ranker
        self.pair_tokenizer = pair_tokenizer
        self.placement = placement or Placement(False)

    # -- properties
    @property
    def dim(self) -> int:
        """Dimension of the indexed vectors."""
        return self.manifest["dim"]

    @property
    def index_type(self) -> str:
        """The faiss index type: flat, ivf, hnsw, pq or ivfpq."""
        return self.manifest["index_type"]

    @property
    def cosine(self) -> bool:
        """Whether scores are cosines (RepBERT: vectors L2-normalised) rather than raw dot products (BERT_DOT)."""
        return self.manifest["score"] == "cosine"

    def __len__(self) -> int:
        return len(self.doc_ids)

    # -- building
    @classmethod
    def build(
        cls,
        ranker,
        docs: Mapping | Iterable,
        *,
        pair_tokenizer=None,
        batch_size: int | str = 64,
        device=None,
        precision: str = "fp32",
        sort_window: int | None = None,
        checkpoint: str | None = None,
        encoded: Iterable | None = None,
        **index_opts,
    ) -> DenseIndex:
        """Encode `docs` ({id: text} or an iterable of (id, text)) in streamed batches and index their vectors.

        `encoded`: the batches (ids, vectors) of `docs` already encoded (retrieval/split.py's merge of a split
        encoding), indexed instead of encoding here. `index_opts`: the fields of `IndexOptions` (index_type, nlist,
        nprobe, hnsw_m, ...).
        """
        cls.check_ranker(ranker)
        opts = IndexOptions.from_kwargs(**index_opts)
        if isinstance(docs, Sized) and opts.index_type in TRAINED:  # fail before encoding when the size is known
            n = min(len(docs), opts.train_size)
            if n and opts.nlist is not None and opts.nlist > n:
                raise InputError(
                    "nlist", f"is {opts.nlist} but only {n} vectors are there to train on; expected nlist <= {n}"
                )
        pt = pair_tokenizer or pair_tokenizer_for(ranker)
        builder = FaissBuilder(opts)
        doc_ids: list[str] = []
        seen: set[str] = set()
        with build_phase(docs, cls.family, encoding=encoded is None) as ph:
            if encoded is None:
                encoded = encode_docs(
                    ranker, pt, docs, batch_size, device, precision, sort_window=sort_window, output="sequence"
                )
            for ids, vecs in encoded:
                record_doc_ids(ids, doc_ids, seen)
                builder.add(cls._prepare(vecs, ranker.cosine))
                ph.advance(len(ids))
            del seen
            index, params = builder.finish()
        manifest = base_manifest(FORMAT, ranker, checkpoint, params, builder.dim, builder.count, precision)
        manifest.update(
            score="cosine" if ranker.cosine else "dot", metric="inner_product", normalized=bool(ranker.cosine)
        )
        return cls(index, doc_ids, manifest, ranker, pt, builder.placement)

    @staticmethod
    def _prepare(vecs: torch.Tensor | np.ndarray, cosine: bool) -> np.ndarray:
        t = torch.as_tensor(vecs, dtype=torch.float32)
        if cosine:
            t = cosine_normalize(t)  # the ranker's own normalisation: faiss inner product = RepBERT's cosine
        return np.ascontiguousarray(t.numpy(), dtype=np.float32)

    # -- searching
    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Change nprobe (ivf, ivfpq) or efSearch (hnsw) of this index (recorded in the manifest on save)."""
        p = self.params
        if nprobe is not None:
            if p["index_type"] not in ("ivf", "ivfpq"):
                raise InputError("nprobe", f"applies to ivf and ivfpq indexes, this one is '{p['index_type']}'")
            if not isinstance(nprobe, int) or nprobe < 1:
                raise InputError("nprobe", f"is {nprobe!r}; expected a positive integer")
            p["nprobe"] = min(nprobe, p["nlist"])
        if ef_search is not None:
            if p["index_type"] != "hnsw":
                raise InputError("ef_search", f"applies to hnsw indexes, this one is '{p['index_type']}'")
            if not isinstance(ef_search, int) or ef_search < 1:
                raise InputError("ef_search", f"is {ef_search!r}; expected a positive integer")
            p["ef_search"] = ef_search
        self.placement.set_params(self.index, p)

    def search_vectors(self, vectors: np.ndarray | torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Search faiss with already-prepared vectors [Q, dim]; return (scores [Q, k'], rows [Q, k']).

        k' = min(k, count).
        """
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InputError("k", f"is {k!r}; expected a positive integer")
        x = np.ascontiguousarray(torch.as_tensor(vectors, dtype=torch.float32).numpy())
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise InputError(
                "queries", f"query vectors have shape {tuple(x.shape)}; this index holds {self.dim}-dimensional vectors"
            )
        k = min(k, len(self.doc_ids))
        if self.placement.on_gpu and k > GPU_MAX_K:
            raise InputError("k", f"is {k}; faiss on the GPU returns at most {GPU_MAX_K} hits per query")
        return self.index.search(x, k)

    def encode_queries(
        self, queries: Mapping | Iterable, batch_size: int | str = 64, device=None, precision: str | None = None
    ):
        """Yield (qids, prepared query vectors [B, dim]) in batches."""
        ranker = self.ensure_ranker()
        prec = precision or self.manifest.get("precision", "fp32")
        for qids, vecs in encode_queries(
            ranker, self.pair_tokenizer, queries, batch_size, device, prec, output="sequence"
        ):
            yield qids, self._prepare(vecs, self.cosine)

    def search(
        self,
        queries: Mapping[str, str] | Iterable,
        k: int = 100,
        *,
        batch_size: int | str = 64,
        device=None,
        precision: str | None = None,
    ) -> dict[str, dict[str, float]]:
        """Return the top-k documents of every query: {qid: {doc id: score}} (a run; write it with write_trec_run).

        `precision` defaults to the one the index was built with.
        """
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InputError("k", f"is {k!r}; expected a positive integer")
        run: dict[str, dict[str, float]] = {}
        with search_phase(queries, self.family) as ph:
            for qids, vecs in self.encode_queries(queries, batch_size, device, precision):
                scores, rows = self.search_vectors(vecs, k)
                for qid, docs in run_from_hits(qids, scores, rows, self.doc_ids).items():
                    if qid in run:
                        raise InputError("queries", f"duplicate query id '{qid}'")
                    run[qid] = docs
                ph.advance(len(qids))
        return run

    # -- persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the index directory atomically (see the module docstring); returns its path."""
        path = Path(path)
        with AtomicDir(path) as tmp:
            load_faiss().write_index(self.placement.to_cpu(self.index), str(tmp / "index.faiss"))
            write_json(tmp / "doc_ids.json", self.doc_ids)
            write_json(tmp / "manifest.json", self.manifest)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, ranker=None, pair_tokenizer=None, use_gpu: bool | None = None) -> DenseIndex:
        """Read an index directory.

        Without `ranker`, `search` rebuilds it from the recorded checkpoint when first needed (`search_vectors` needs
        no ranker).
        """
        path = Path(path)
        manifest = cls.read_manifest(path)
        if ranker is not None:
            cls.check_ranker(ranker)
        check_ranker_matches(ranker, manifest, path)
        count = int(manifest["count"])
        doc_ids = read_doc_ids(path / "doc_ids.json", count)
        cpu_index = read_faiss(path / "index.faiss", count)
        if cpu_index.d != manifest["dim"]:
            raise InputError(
                str(path / "index.faiss"),
                f"holds {cpu_index.d}-dimensional vectors; the manifest says {manifest['dim']}",
            )
        placement = Placement(use_gpu)
        index = placement.place(cpu_index, manifest["index_type"])
        placement.set_params(index, manifest["params"])
        return cls(index, doc_ids, manifest, ranker, pair_tokenizer, placement)


def index_from_checkpoint(ckpt_path: str | os.PathLike, docs: Mapping | Iterable, *, device=None, **opts) -> DenseIndex:
    """Load the ranker of a checkpoint and index `docs` with it: `DenseIndex.from_checkpoint` (`retrieval.base`).

    `opts`: `DenseIndex.build`'s keyword arguments (batch_size, precision, index_type, nlist, ...).
    """
    return DenseIndex.from_checkpoint(ckpt_path, docs, device=device, **opts)
