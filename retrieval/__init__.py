"""First-stage / full ranking over a whole collection (no BM25 candidates).

- `retrieval.base`: `Index`, the one interface of every index family (build, search, save, load, from_checkpoint, the
  manifest and its checks), and `INDEXES`, the registry family -> index class (`index_for(ranker)` picks by
  `RankerCapabilities.index`); importing `retrieval` registers the families below.
- `retrieval.encode`: streaming encoders (one batch of tokenisation at a time).
- `retrieval.dense`: `DenseIndex`, faiss over the pooled vectors of RepBERT (cosine) and BERT_DOT (dot); flat
  (exact, default), ivf, hnsw, pq, ivfpq; faiss-gpu when present.
- `retrieval.colbert_e2e`: `ColBERTIndex`, ColBERT end-to-end: token-level faiss candidates, exact Eq. 1 re-scoring.
- `retrieval.config`, `retrieval.retrieve`: the `retrieval` config group and its job,
  `python evaluate.py retrieval=dense ckpt=... data=... [retrieval.k=1000 ...]`.
- `retrieval.bm25`: `BM25Index`, the first-stage family (no ranker), and BM25 full-collection runs,
  `python evaluate.py model=bm25 data=... [model.split=all]`.
- `retrieval.first_stage`: `FIRST_STAGE`, the registry of `model` choices that are first-stage retrievers (BM25), and
  `model_capabilities(name)` over rankers and first-stage retrievers alike.

Runs are `{qid: {doc id: score}}`, the pipeline's run form: `metrics.trec.write_trec_run` writes them,
`metrics.ir.evaluate_run` scores them.
"""

from retrieval.base import INDEXES, Index, index_class, index_for, open_index
from retrieval.bm25 import BM25Index
from retrieval.colbert_e2e import ColBERTIndex, colbert_index_from_checkpoint
from retrieval.dense import INDEX_TYPES, DenseIndex, IndexOptions, index_from_checkpoint
from retrieval.encode import encode_docs, encode_queries

__all__ = [
    "Index",
    "INDEXES",
    "index_class",
    "index_for",
    "open_index",
    "BM25Index",
    "DenseIndex",
    "ColBERTIndex",
    "IndexOptions",
    "INDEX_TYPES",
    "index_from_checkpoint",
    "colbert_index_from_checkpoint",
    "encode_docs",
    "encode_queries",
]
