"""The ColBERT end-to-end token store (retrieval/colbert_e2e.py): written to disk chunk by chunk while building and
memory-mapped for re-scoring, saved by hard link, float16/32 rows or PLAID-style residual codes.

The residual stores are checked against brute-force ColBERT in NumPy float64 over freshly encoded passages (the
ranker's own encoders, nothing of the index), within the per-query-token tolerance the module docstring and
docs/retrieval.md document.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch
from test_retrieval import DOCS, QUERIES, make, one_thread  # noqa: F401 (one_thread: autouse fixture)

from core.errors import InputError
from core.npy import NpyRowWriter
from models.loading import pair_tokenizer_for
from models.rankers.colbert import ColBERTConfig
from retrieval.colbert_e2e import CODEC_FILE, TOKENS_FILE, ColBERTIndex
from retrieval.config import DenseRetrievalConfig

# documented bound on |exact score - float32 score| per query token (module docstring, docs/retrieval.md)
RESIDUAL_TOLERANCE = {"residual8": 0.005, "residual4": 0.02}


@pytest.fixture(scope="module")
def colbert(tiny_bert):
    return make(ColBERTConfig(backbone=tiny_bert, doc_max_len=24))


def _staging_folders(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".colbert-store-"))


@torch.no_grad()
def numpy_maxsim(ranker, queries=QUERIES, docs=DOCS) -> tuple[list[str], list[str], np.ndarray]:
    """Brute-force ColBERT (Eq. 1) in float64: every passage encoded on its own, cosine MaxSim summed over the
    query's tokens. (qids, doc ids, scores [Q, N])."""
    pt = pair_tokenizer_for(ranker)

    def vectors(enc) -> np.ndarray:
        x = enc.tokens[0][enc.mask[0]].double().numpy()
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    qids, dids = list(queries), list(docs)
    q = [vectors(ranker.encode_queries(pt.queries([queries[i]]))) for i in qids]
    d = [vectors(ranker.encode_docs(pt.docs([docs[i]]))) for i in dids]
    return qids, dids, np.array([[(qv @ dv.T).max(1).sum() for dv in d] for qv in q])


def test_npy_row_writer_appends_chunks_and_writes_the_header_last(tmp_path):
    rng = np.random.default_rng(0)
    for dtype in (np.float16, np.float32, np.uint8):
        parts = [rng.normal(size=(n, 5)).astype(dtype) for n in (3, 0, 1, 7)]
        w = NpyRowWriter(tmp_path / f"{np.dtype(dtype).name}.npy", dtype, 5)
        for x in parts:
            w.write(x)
        got = w.close()
        assert isinstance(got, np.memmap) and got.dtype == dtype
        np.testing.assert_array_equal(got, np.concatenate(parts))
        np.testing.assert_array_equal(np.load(tmp_path / f"{np.dtype(dtype).name}.npy"), np.concatenate(parts))
    with pytest.raises(ValueError, match="width 5"):
        NpyRowWriter(tmp_path / "w.npy", np.float32, 5).write(np.zeros((2, 4)))


@pytest.mark.parametrize("store_dtype", ["float16", "float32", "residual8"])
def test_small_chunks_equal_one_chunk(colbert, store_dtype, tmp_path):
    """The same store, offsets and runs whether the store is written 3 rows at a time or in one piece."""
    one = ColBERTIndex.build(colbert, DOCS, batch_size=8, store_dtype=store_dtype, store_chunk=10**9)
    small = ColBERTIndex.build(colbert, DOCS, batch_size=8, store_dtype=store_dtype, store_chunk=3)
    assert one.tokens.dtype == small.tokens.dtype and one.tokens.shape == small.tokens.shape
    np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(small.tokens))
    np.testing.assert_array_equal(one.offsets, small.offsets)
    assert one.manifest["store_dtype"] == store_dtype
    for k_tokens, depth in ((one.n_tokens, None), (3, 5)):
        assert one.search(QUERIES, k=6, k_tokens=k_tokens, depth=depth) == small.search(
            QUERIES, k=6, k_tokens=k_tokens, depth=depth
        )


def test_store_is_a_memory_map_in_a_temporary_folder_removed_with_the_index(colbert, tmp_path):
    idx = ColBERTIndex.build(colbert, DOCS, batch_size=8, store_dir=tmp_path)
    assert (
        isinstance(idx.tokens, np.memmap)
        and idx.tokens.dtype == np.float16
        and idx.tokens.shape == (idx.n_tokens, idx.dim)
    )
    (staging,) = _staging_folders(tmp_path)
    assert idx.store_path == tmp_path / staging / TOKENS_FILE
    del idx
    gc.collect()
    assert _staging_folders(tmp_path) == []


def test_save_links_the_store_and_the_index_reads_the_saved_one(colbert, tmp_path):
    idx = ColBERTIndex.build(colbert, DOCS, batch_size=8, store_dir=tmp_path)
    built = os.stat(idx.store_path)
    before = idx.search(QUERIES, k=5, k_tokens=8, depth=10)
    idx.save(tmp_path / "cb")
    saved = os.stat(tmp_path / "cb" / TOKENS_FILE)
    assert (saved.st_dev, saved.st_ino) == (built.st_dev, built.st_ino)  # hard link: the store was not copied
    assert _staging_folders(tmp_path) == []  # the build's temporary folder is gone once saved
    assert idx.store_path == tmp_path / "cb" / TOKENS_FILE and isinstance(idx.tokens, np.memmap)
    assert idx.search(QUERIES, k=5, k_tokens=8, depth=10) == before
    idx.save(tmp_path / "cb")  # over itself: the store is linked from the folder being replaced
    loaded = ColBERTIndex.load(tmp_path / "cb", colbert)
    assert loaded.search(QUERIES, k=5, k_tokens=8, depth=10) == before


def test_failed_build_leaves_no_store_behind(colbert, tmp_path):
    with pytest.raises(InputError, match="duplicate doc id 'd0'"):
        ColBERTIndex.build(
            colbert, [("d0", "a b"), ("d1", "c"), ("d0", "d")], batch_size=1, store_dir=tmp_path, store_chunk=1
        )
    assert _staging_folders(tmp_path) == []


@pytest.mark.parametrize("store_dtype", ["residual8", "residual4"])
def test_residual_store_scores_within_documented_tolerance(colbert, store_dtype, tmp_path):
    qids, dids, ref = numpy_maxsim(colbert)
    idx = ColBERTIndex.build(colbert, DOCS, batch_size=8, store_dtype=store_dtype)
    assert idx.tokens.dtype == np.uint8 and idx.tokens.shape == (idx.n_tokens, idx.manifest["store_codec"]["code_size"])
    assert idx.tokens.shape[1] < idx.dim * 2  # smaller than float16 rows
    run = idx.search(QUERIES, k=len(DOCS), k_tokens=idx.n_tokens, depth=None)
    pt = pair_tokenizer_for(colbert)
    worst = 0.0
    for qi, qid in enumerate(qids):
        n_q = int(colbert.encode_queries(pt.queries([QUERIES[qid]])).mask.sum())
        assert set(run[qid]) == set(dids)
        err = max(abs(run[qid][d] - ref[qi, j]) for j, d in enumerate(dids)) / n_q
        worst = max(worst, err)
    assert worst <= RESIDUAL_TOLERANCE[store_dtype]
    assert worst > 0  # really compressed

    idx.save(tmp_path / "cb")
    loaded = ColBERTIndex.load(tmp_path / "cb", colbert)
    assert loaded.codec is not None and loaded.manifest["store_codec"] == idx.manifest["store_codec"]
    assert loaded.search(QUERIES, k=5, k_tokens=8, depth=10) == idx.search(QUERIES, k=5, k_tokens=8, depth=10)
    (tmp_path / "cb" / CODEC_FILE).unlink()
    with pytest.raises(InputError, match="missing faiss index file"):
        ColBERTIndex.load(tmp_path / "cb", colbert)


def test_store_dtype_is_checked(colbert):
    with pytest.raises(InputError, match="store_dtype.*residual8"):
        ColBERTIndex.build(colbert, DOCS, store_dtype="int8")
    with pytest.raises(InputError, match="store_chunk"):
        ColBERTIndex.build(colbert, DOCS, store_chunk=0)
    assert DenseRetrievalConfig(store_dtype="residual4").store_dtype == "residual4"
    with pytest.raises(InputError, match="retrieval.store_dtype"):
        DenseRetrievalConfig(store_dtype="pq")
