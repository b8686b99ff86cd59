"""The persistent BM25 index (datamodules/bm25.py): the chunked build gives exactly the rankings and scores of bm25s'
own in-memory index (the previous implementation, kept here as the reference), on a toy collection, a random
Zipf-like one with ties and on Cranfield; it is built once per collection and reused for other queries, keyed by the
collection's fingerprint when it has one, rebuilt with a warning when damaged, and built by one process of several."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, shared_data
from test_negatives import DOCS, QUERIES

import datamodules.bm25 as bm25
from core.bm25s_lib import bm25s_module
from core.io import WriteFault
from datamodules.bm25 import METHODS, BM25Params, bm25_index, bm25_run, compute_bm25_run


# ---- the reference: the previous implementation (bm25s' tokenize and index, one query at a time) --------------------
def ref_tokenize(texts):
    stemmer, _ = bm25._stemmer()
    return bm25s_module().tokenize(
        texts,
        lower=True,
        token_pattern=bm25.TOKEN_PATTERN,
        stopwords=bm25.STOPWORDS,
        stemmer=stemmer,
        return_ids=False,
        show_progress=False,
    )


def ref_top_k(scores, k):
    cand = np.flatnonzero(scores > 0)
    if len(cand) > k:
        vals = scores[cand]
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]
        above = cand[vals > kth]
        ties = cand[vals == kth][: k - len(above)]
        cand = np.concatenate([above, ties])
    return cand[np.lexsort((cand, -scores[cand]))]


DEFAULT_PARAMS = BM25Params()


def ref_run(docs, queries, k, params=DEFAULT_PARAMS):
    doc_ids = sorted(docs)
    if not doc_ids or not queries or k <= 0:
        return {q: [] for q in queries}
    doc_tokens = ref_tokenize([docs[d] for d in doc_ids])
    if not any(doc_tokens):
        return {q: [] for q in queries}
    retriever = bm25s_module().BM25(method=params.method, k1=params.k1, b=params.b)
    retriever.index(doc_tokens, show_progress=False)
    vocab = retriever.vocab_dict
    qids = list(queries)
    out = {}
    for qid, toks in zip(qids, ref_tokenize([queries[q] for q in qids])):
        ids = [vocab[t] for t in toks if t and t in vocab]
        if not ids:
            out[qid] = []
            continue
        scores = np.asarray(retriever.get_scores_from_ids(ids), dtype=np.float64)
        out[qid] = [(doc_ids[i], float(scores[i])) for i in ref_top_k(scores, int(k))]
    return out


def zipf_collection(n_docs=3000, n_queries=60, seed=0):
    """Random texts over a Zipf vocabulary: frequent terms, exact duplicates (ties), stopword-only and empty documents,
    queries with repeated terms and with unknown ones."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}x" for i in range(800)] + ["the", "of", "and"])
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    docs = {f"d{i:05d}": " ".join(rng.choice(words, size=rng.integers(1, 40), p=p)) for i in range(n_docs)}
    docs.update({"d00007": docs["d00003"], "dstop": "the of and", "dempty": "", "dpunct": "!!! ?"})
    queries = {f"q{i}": " ".join(rng.choice(words, size=rng.integers(1, 7), p=p)) for i in range(n_queries)}
    queries.update({"rep": "w1x w1x w5x", "unk": "zzz yyy", "stop": "the of"})
    return docs, queries


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(bm25, "CHUNK_DOCS", 7)  # many chunks, some of token-less documents only
    monkeypatch.setattr(bm25, "RANK_BATCH", 5)


# ---- same results as bm25s' own index -------------------------------------------------------------------------------
def test_tokenizer_gives_bm25s_tokens():
    texts = [
        *DOCS.values(),
        *QUERIES.values(),
        "Ünïcödé Straße ΣΊΣΥΦΟΣ naïve",
        "x_y 42 3.14 a1 B2B",
        "",
        "the of",
        "Running runs RAN runner's",
        "tab\tnew\nline",
        "日本語 テキスト",
    ]
    assert bm25.tokenize(texts) == ref_tokenize(texts)
    terms = bm25._Terms()
    tok, row = bm25._encode(texts, terms)
    stems = {v: k for k, v in terms.stems.items()}
    assert [[stems[t] for t in tok[row == i]] for i in range(len(texts))] == ref_tokenize(texts)


@pytest.mark.parametrize("method", METHODS)
def test_same_run_as_bm25s_index(small_chunks, method):
    """Bit-identical scores and identical rankings (ties by doc id), for every variant, with and without the index
    on disk."""
    docs, queries = zipf_collection()
    params = BM25Params(method, 1.2, 0.6)
    ref = ref_run(docs, queries, 25, params)
    assert compute_bm25_run(docs, queries, 25, params) == ref
    assert ref["unk"] == ref["stop"] == []
    assert any(a[1] == b[1] for r in ref.values() for a, b in zip(r, r[1:]))  # ties occur
    toy = ref_run(DOCS, QUERIES, 20, params)
    assert compute_bm25_run(DOCS, QUERIES, 20, params) == toy


def test_same_run_through_the_saved_index(tmp_path, small_chunks):
    docs, queries = zipf_collection(seed=1)
    for k in (1, 10, 5000):
        assert bm25_run(docs, queries, k, tmp_path, "z") == ref_run(docs, queries, k)


@pytest.mark.data("cranfield")
def test_same_run_on_cranfield(tmp_path):
    from datamodules.sources import load_dataset
    from datamodules.sources.classic import CranfieldConfig

    ds = load_dataset(CranfieldConfig(path=str(shared_data("cranfield")), val_fraction=0.0, test_fraction=0.0), 0)
    queries = {q: t for s in ds.splits.values() for q, t in s.queries.items()}
    assert len(ds.docs) > 1300 and len(queries) == 225
    for params in (BM25Params(), BM25Params("bm25+", 0.9, 0.4)):
        got = bm25_run(ds.docs, queries, 1000, tmp_path, "cran", params)
        assert got == ref_run(ds.docs, queries, 1000, params)


def test_top_k_equals_a_full_sort():
    rng = np.random.default_rng(0)
    for n, k in [(300_000, 1000), (300_000, 10), (200_000, 1), (50, 10), (300_000, 2000)]:
        for scores in (
            np.round(rng.random(n) * 20) / 4 * (rng.random(n) < 0.7),  # many ties and zeros
            (rng.random(n) < 0.001) * rng.random(n),  # few positive
            np.sort(rng.random(n)),
        ):  # the best at the end (a strided sample misses them)
            scores = scores.astype(np.float32)
            assert np.array_equal(bm25._top_k(scores, k), ref_top_k(scores, k)), (n, k)


# ---- built once, reused, verified ------------------------------------------------------------------------------------
def _no_build(*a, **k):
    raise AssertionError("the index was rebuilt")


def test_index_reused_for_other_queries_and_depths(tmp_path, monkeypatch):
    docs, queries = zipf_collection(n_docs=500)
    first = bm25_run(docs, dict(list(queries.items())[:20]), 10, tmp_path, "a")
    entries = sorted(p.name for p in (tmp_path / "bm25").iterdir())
    assert [e for e in entries if e.startswith("index-")] and not [
        e for e in entries if e.startswith(".")
    ]  # no locks, temps
    folder = next((tmp_path / "bm25").glob("index-*"))
    assert {p.name for p in folder.iterdir()} >= {
        "data.csc.index.npy",
        "indices.csc.index.npy",
        "indptr.csc.index.npy",
        "vocab.index.json",
        "params.index.json",
        "doc_ids.npy",
        "manifest.json",
    }
    monkeypatch.setattr(bm25, "_build_index", _no_build)
    other = dict(list(queries.items())[20:])
    assert bm25_run(docs, other, 50, tmp_path, "b") == ref_run(docs, other, 50)
    assert bm25_run(docs, dict(list(queries.items())[:20]), 10, tmp_path, "a") == first
    index = bm25_index(docs, BM25Params(), tmp_path)
    assert isinstance(index.doc_ids, np.memmap) and index.doc_ids.tolist() == sorted(docs)
    assert isinstance(index.retriever.scores["data"], np.memmap)
    # other parameters or another collection: another index
    for d, p in [(docs, BM25Params(k1=1.0)), ({**docs, "new": "w1x"}, BM25Params())]:
        with pytest.raises(AssertionError, match="rebuilt"):
            bm25_run(d, other, 5, tmp_path, "c", p)


class Store(Mapping):
    """A disk-backed collection's interface: a Mapping with a `fingerprint`, counting the texts read."""

    def __init__(self, docs, fingerprint):
        self.docs, self.fingerprint, self.reads = docs, fingerprint, 0

    def __getitem__(self, key):
        self.reads += 1
        return self.docs[key]

    def __iter__(self):
        return iter(self.docs)

    def __len__(self):
        return len(self.docs)


def test_fingerprint_keys_the_collection(tmp_path, monkeypatch):
    docs, queries = zipf_collection(n_docs=300)
    store = Store(docs, "a" * 64)
    assert bm25_run(store, queries, 10, tmp_path, "s") == ref_run(docs, queries, 10)
    assert store.reads == len(docs)  # the build read each text once; the digest read none
    again = Store(docs, "a" * 64)
    monkeypatch.setattr(bm25, "_build_index", _no_build)
    assert bm25_run(again, {"x": "w2x w3x"}, 10, tmp_path, "s") == ref_run(docs, {"x": "w2x w3x"}, 10)
    assert again.reads == 0  # reused without reading a text
    assert bm25.collection_digest(again) != bm25.collection_digest(docs)
    with pytest.raises(AssertionError, match="rebuilt"):
        bm25_run(Store(docs, "b" * 64), queries, 10, tmp_path, "s")


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "missing"])
def test_damaged_index_is_rebuilt_with_a_warning(tmp_path, damage):
    docs, queries = zipf_collection(n_docs=400)
    want = ref_run(docs, queries, 20)
    bm25_index(docs, BM25Params(), tmp_path)
    folder = next((tmp_path / "bm25").glob("index-*"))
    data = folder / "data.csc.index.npy"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    elif damage == "flip":  # same size, other bytes
        b = bytearray(data.read_bytes())
        b[-5] ^= 0xFF
        data.write_bytes(bytes(b))
    elif damage == "manifest":
        (folder / "manifest.json").write_text('{"collection": ')
    else:
        (folder / "vocab.index.json").unlink()
    with pytest.warns(UserWarning, match=r"BM25 index is incomplete or damaged \(.+\); rebuilding it"):
        got = bm25_run(docs, queries, 20, tmp_path, "r")
    assert got == want
    assert bm25.load_index(folder, json.loads((folder / "manifest.json").read_text()), warn=True) is not None
    assert [p.name for p in (tmp_path / "bm25").iterdir() if p.name.startswith(".")] == []


def test_failed_run_write_leaves_the_index_and_no_file(tmp_path, monkeypatch):
    docs, queries = zipf_collection(n_docs=200)
    bm25_index(docs, BM25Params(), tmp_path)
    real = json.dumps

    def failing(obj, *a, **k):
        if isinstance(obj, list):
            raise OSError("disk full")
        return real(obj, *a, **k)

    monkeypatch.setattr(bm25.json, "dumps", failing)
    with pytest.raises(WriteFault, match="disk full"):  # the one-line write fault (core/io.py), nothing kept
        bm25_run(docs, queries, 5, tmp_path, "w")
    assert [p.name.startswith("index-") for p in (tmp_path / "bm25").iterdir()] == [True]


def test_collection_without_tokens(tmp_path):
    assert bm25_run({"a": "the of", "b": "x"}, {"q": "the x"}, 5, tmp_path, "e") == {"q": []}
    assert not list((tmp_path / "bm25").glob("index-*"))


CHILD = """
import json, os, sys, time
import datamodules.bm25 as bm25
docs = json.load(open(sys.argv[1]))
queries = {"a": "w1x w2x", "b": "w3x w3x w9x"}
build, rank = bm25._build_index, bm25.rank
arrived = sys.argv[3] + ".arrived"
def slow_build(*a, **k):
    open(sys.argv[2], "a").write(f"build {os.getpid()}\\n")
    while len(os.listdir(arrived)) < 3:  # build once the others are at the lock: an event, not a time
        time.sleep(0.05)
    return build(*a, **k)
def logged_rank(*a, **k):
    open(sys.argv[2], "a").write(f"rank {os.getpid()}\\n")
    return rank(*a, **k)
bm25._build_index, bm25.rank, bm25.POLL_S = slow_build, logged_rank, 0.2
open(os.path.join(arrived, str(os.getpid())), "w").close()
run = bm25.bm25_run(docs, queries, 10, sys.argv[3], "ddp")
print(json.dumps(run))
"""


def test_processes_share_one_build_and_one_run(tmp_path):
    """Three processes at once (as DDP ranks): one builds the index and the run, the others wait and read them."""
    docs, _ = zipf_collection(n_docs=300)
    (tmp_path / "docs.json").write_text(json.dumps(docs))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    (tmp_path / "cache.arrived").mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path / "docs.json"), str(tmp_path / "log"), str(tmp_path / "cache")],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    runs = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert (
        runs[0] == runs[1] == runs[2] == json.loads(json.dumps(ref_run(docs, {"a": "w1x w2x", "b": "w3x w3x w9x"}, 10)))
    )
    log = (tmp_path / "log").read_text().split()
    assert log[0::2] == ["build", "rank"]  # once each, over the three processes
    assert sorted(p.name for p in Path(tmp_path / "cache" / "bm25").iterdir() if p.name.startswith(".")) == []
