r"""The `retrieval` config group: full ranking over the whole collection from evaluate.py instead of re-ranking.

    python evaluate.py retrieval=dense ckpt=outputs/x/checkpoints/last.ckpt data=vaswani output_dir=outputs/x-dense \
        retrieval.k=1000 retrieval.index_type=hnsw retrieval.precision=bf16

`retrieval=none` (configs/retrieval/none.yaml, the default): evaluate.py re-ranks as always. `retrieval=dense`
(configs/retrieval/dense.yaml): retrieval/retrieve.py `retrieve` indexes the collection with the checkpoint's ranker
(faiss; RepBERT / BERT_DOT through retrieval/dense.py, ColBERT end-to-end through retrieval/colbert_e2e.py) and
retrieves the top `k` of every query of `split`. Every key is checked here (a one-line InputError naming it), when
the config is composed, so `--dry-run` rejects what the run would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError, check_choice
from core.ranges import COUNT, Range, check_ranges
from datamodules.corpus import SPLITS
from datamodules.sources import used_splits
from models.batch_fit import BATCH
from retrieval.colbert_e2e import STORE_DTYPES
from retrieval.dense import INDEX_TYPES
from retrieval.encode import PRECISIONS

__all__ = ["RetrievalConfig", "DenseRetrievalConfig", "SCHEMAS", "check_index_place", "schema"]

DEVICE = re.compile(r"(cpu|mps|cuda(:\d+)?)")


def _key(name: str) -> str:
    return f"config key 'retrieval.{name}'"


@dataclass
class RetrievalConfig:
    """`retrieval=none`: no full ranking; evaluate.py evaluates (re-ranks) as usual."""

    name: str = "none"


@dataclass
class DenseRetrievalConfig(RetrievalConfig):
    """`retrieval=dense` (configs/retrieval/dense.yaml); index keys as in retrieval.dense.IndexOptions."""

    name: str = "dense"
    split: str = "test"  # whose queries are retrieved for: train | val | test
    k: int = 1000  # documents retrieved per query
    index_type: str = "flat"  # flat | ivf | hnsw | pq | ivfpq
    nlist: int | None = None  # ivf, ivfpq: inverted lists; null = min(4 sqrt(n), n / 39)
    nprobe: int | None = None  # ivf, ivfpq: lists visited per query; null = min(nlist, 16)
    hnsw_m: int = 32  # hnsw: neighbours per node
    ef_construction: int = 80  # hnsw: candidate list while building
    ef_search: int = 128  # hnsw: candidate list while searching
    pq_m: int | None = None  # pq, ivfpq: sub-quantizers (must divide dim); null = largest divisor of dim <= dim / 8
    pq_nbits: int | None = None  # pq, ivfpq: bits per code, <= 16; null = 8 (fewer for a tiny collection)
    # texts per encoder forward pass; auto: as many as the device's memory allows, 64 on the CPU (models/batch_fit.py)
    batch_size: int | str = "auto"
    precision: str = "fp32"  # fp32 | bf16 | fp16 (fp16: CUDA only)
    device: str | None = None  # cpu | cuda | cuda:N | mps; null = where the checkpoint loads (CPU)
    devices: int = (
        1  # processes that encode the collection (retrieval/split.py): with device=cuda one per GPU, else CPU processes
    )
    gpu_index: bool = True  # faiss-gpu when present; false keeps the faiss index on the CPU
    index_dir: str | None = None  # where the index is saved; null = <output_dir>/index
    k_tokens: int = 256  # colbert: token hits per query token
    depth: int | None = 1000  # colbert: candidates re-scored per query; null = every candidate
    store_dtype: str = "float16"  # colbert: token store for re-scoring, float16 | float32 | residual8 | residual4

    def splits_read(self) -> tuple[str, ...]:
        """Return the split whose queries it retrieves for (`split`), as `retrieval.retrieve` loads it."""
        return used_splits(self.split)

    def __post_init__(self):
        check_choice("retrieval.split", self.split, SPLITS)
        check_choice("retrieval.index_type", self.index_type, INDEX_TYPES)
        check_choice("retrieval.precision", self.precision, PRECISIONS)
        check_choice("retrieval.store_dtype", self.store_dtype, tuple(STORE_DTYPES))
        check_ranges(
            "retrieval",
            self,
            k=COUNT,
            hnsw_m=COUNT,
            ef_construction=COUNT,
            ef_search=COUNT,
            batch_size=BATCH,
            k_tokens=COUNT,
            nlist=COUNT,
            nprobe=COUNT,
            pq_m=COUNT,
            pq_nbits=Range(1, 16),
            depth=COUNT,
        )
        if self.device is not None and not DEVICE.fullmatch(self.device):
            raise InputError(_key("device"), f"is {self.device!r}; expected cpu, cuda, cuda:N, mps or null")
        check_ranges("retrieval", self, devices=COUNT)
        if self.precision == "fp16" and not str(self.device).startswith("cuda"):
            raise InputError(
                _key("precision"),
                f"is fp16 with retrieval.device={self.device or 'null'}: fp16 needs a CUDA device; use bf16 or fp32, "
                "or retrieval.device=cuda",
            )
        if self.devices > 1 and self.device not in (None, "cpu", "cuda"):
            raise InputError(
                _key("device"),
                f"is {self.device!r} with retrieval.devices={self.devices}; expected cuda (GPUs 0..N-1), cpu or null",
            )

    @property
    def accelerator(self) -> str:
        """Where the split encoding's processes run (`devices` > 1): "cuda" or "cpu"."""
        return "cuda" if self.device == "cuda" else "cpu"

    def index_options(self) -> dict:
        """Keyword arguments of `DenseIndex.build` / `ColBERTIndex.build` for the faiss index."""
        return dict(
            index_type=self.index_type,
            nlist=self.nlist,
            nprobe=self.nprobe,
            hnsw_m=self.hnsw_m,
            ef_construction=self.ef_construction,
            ef_search=self.ef_search,
            pq_m=self.pq_m,
            pq_nbits=self.pq_nbits,
            use_gpu=None if self.gpu_index else False,
        )


SCHEMAS: dict[str, type] = {"none": RetrievalConfig, "dense": DenseRetrievalConfig}


def schema(name: str) -> type:
    """Return the schema of `retrieval.name`; an unknown name is an InputError listing the known ones."""
    if name not in SCHEMAS:
        raise InputError("retrieval.name", f"unknown retrieval '{name}'; expected one of {sorted(SCHEMAS)}")
    return SCHEMAS[name]


def check_index_place(cfg) -> None:
    """Refuse a shared `retrieval.index_dir` that is `output_dir`, holds it or lies in it (the retrieve job's check).

    The index is saved by replacing its folder whole: at output_dir (or above it) that replace would take the run's
    results with it, and inside output_dir it would share the folder the result set owns. `--dry-run` makes it too.
    """
    index_dir = cfg.retrieval.get("index_dir")
    if not index_dir:
        return
    index, out = Path(str(index_dir)).expanduser().absolute(), Path(str(cfg.output_dir)).expanduser().absolute()
    index_r, out_r = index.resolve(), out.resolve()  # through links, as the writes would go
    if index_r == out_r or index_r in out_r.parents:
        where = "is output_dir" if index_r == out_r else "holds output_dir"
    elif out_r in index_r.parents:
        where = "lies inside output_dir"
    else:
        return
    raise InputError(
        _key("index_dir"),
        f"'{index_dir}' {where} ('{cfg.output_dir}'); a shared index is saved by replacing its folder whole, so it "
        "must lie outside the run's results: choose another folder, or leave it null to keep the index with the "
        "results (<output_dir>/index)",
    )
