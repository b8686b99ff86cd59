"""BM25 candidates (bm25s, datamodules/bm25.py) against a brute-force NumPy BM25, the on-disk cache, and negative
sampling (datamodules/negatives.py)."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest

import datamodules.bm25 as bm25
from core.io import WriteFault
from datamodules.bm25 import bm25_candidates
from datamodules.corpus import Split
from datamodules.negatives import sample_triples
from datamodules.sources import load_dataset
from datamodules.sources.synthetic import SyntheticConfig

DOCS = {
    "d01": "The quick brown fox jumps over the lazy dog.",
    "d02": "A fox, a fox and another fox: foxes everywhere in the forest.",
    "d03": "Dogs and cats are common household pets; the dog barks at the cat.",
    "d04": "Quantum computing uses qubits. Qubits can be in superposition, unlike classical bits.",
    "d05": "The lazy cat sleeps all day long in the warm sun near the window of the old house.",
    "d06": "Brown bears and brown foxes live in the northern forest with many other animals.",
    "d07": "Classical computing relies on bits that are either zero or one, never both at once.",
    "d08": "The dog and the fox are both canines, yet the fox is wild and the dog is tame.",
    "d09": "Superposition and entanglement are central to quantum information science.",
    "d10": "Bananas are yellow.",
    "d11": "Bananas are yellow.",  # an exact duplicate: an exact tie, broken by doc id
    "d12": "It is what it is.",  # stopwords only: no tokens
}
QUERIES = {
    "a": "brown fox",
    "b": "lazy dog",
    "c": "quantum bits superposition",
    "d": "yellow bananas",
    "e": "the of and",
    "f": "fox dog cat",
}


def brute_force_bm25(docs: dict[str, str], query: str, k1: float = 1.5, b: float = 0.75) -> dict[str, float]:
    """BM25, Lucene variant (bm25s' default): idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
    tf part = tf / (tf + k1 * (1 - b + b * dl / avgdl)); tokens = lower-cased \\w\\w+ minus English stopwords,
    then Snowball-stemmed (PyStemmer, a dependency)."""
    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN

    stop, stem = set(STOPWORDS_EN), Stemmer.Stemmer("english").stemWord

    def tok(t):
        return [stem(w) for w in re.findall(r"(?u)\b\w\w+\b", t.lower()) if w not in stop]

    ids = sorted(docs)
    toks = [tok(docs[d]) for d in ids]
    n = len(ids)
    dl = np.array([len(t) for t in toks], dtype=float)
    avgdl = dl.mean()
    df = Counter(w for t in toks for w in set(t))
    scores = np.zeros(n)
    for term in tok(query):
        if term not in df:
            continue
        idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
        tf = np.array([t.count(term) for t in toks], dtype=float)
        scores += idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))
    return {d: s for d, s in zip(ids, scores) if s > 0}


def _ranking(scores: dict[str, float]) -> list[str]:
    return sorted(scores, key=lambda d: (-round(scores[d], 6), d))


def test_bm25_equals_brute_force():
    got = bm25_candidates(DOCS, QUERIES, k=20, cache_dir=None)
    for qid, query in QUERIES.items():
        ref = brute_force_bm25(DOCS, query)
        vals = sorted(ref.values(), reverse=True)
        # the reference ranking is unambiguous: scores differ clearly or tie exactly
        assert all(a - b_ > 1e-4 or a == b_ for a, b_ in zip(vals, vals[1:]))
        assert got[qid] == _ranking(ref), qid
    assert got["e"] == []  # only stopwords: nothing matches
    assert bm25_candidates({"x": "the of", "y": "a"}, {"q": "the cat"}, 5) == {"q": []}
    assert got["d"] == ["d10", "d11"]
    top3 = bm25_candidates(DOCS, QUERIES, k=3, cache_dir=None)
    assert all(top3[q] == got[q][:3] for q in QUERIES)


def test_bm25_does_not_depend_on_dict_order():
    shuffled = dict(reversed(list(DOCS.items())))
    assert bm25_candidates(shuffled, QUERIES, 5) == bm25_candidates(DOCS, QUERIES, 5)


def test_bm25_cache_hit_and_keying(tmp_path, monkeypatch):
    first = bm25_candidates(DOCS, QUERIES, 5, cache_dir=tmp_path, key="tiny/val")
    files = list((tmp_path / "bm25").glob("*.json"))
    assert len(files) == 1 and files[0].name.startswith("tiny_val-") and files[0].suffix == ".json"

    def boom(*a, **k):
        raise AssertionError("recomputed despite a cache hit")

    monkeypatch.setattr(bm25, "compute_bm25_run", boom)
    assert bm25_candidates(DOCS, QUERIES, 5, cache_dir=tmp_path, key="tiny/val") == first
    # a different collection, queries or k is a different cache entry (so it recomputes)
    for docs, queries, k in [
        ({**DOCS, "d10": "Bananas are green."}, QUERIES, 5),
        (DOCS, {"a": "brown"}, 5),
        (DOCS, QUERIES, 6),
    ]:
        with pytest.raises(AssertionError, match="recomputed"):
            bm25_candidates(docs, queries, k, cache_dir=tmp_path, key="tiny/val")
    assert not [p for p in (tmp_path / "bm25").iterdir() if p.name.endswith(".tmp")]


def test_bm25_cache_write_is_atomic(tmp_path, monkeypatch):
    def half_written(obj, f, **kw):
        f.write('{"settings": {"broken"')
        raise OSError("disk full")

    monkeypatch.setattr(bm25.json, "dump", half_written)
    with pytest.raises(WriteFault, match="disk full"):  # the one-line write fault (core/io.py)
        bm25_candidates(DOCS, QUERIES, 5, cache_dir=tmp_path, key="x")
    assert list((tmp_path / "bm25").iterdir()) == []  # neither the file nor a temp file is left


def _split() -> Split:
    return Split(
        queries={q: QUERIES[q] for q in "abcf"},
        qrels={
            "a": {"d06": 2, "d01": 1, "d02": 0},
            "b": {"d01": 1},
            "c": {"d04": 1, "d09": 1, "d07": 0},
            "f": {"d08": 1},
        },
    )


@pytest.mark.parametrize("strategy", ["bm25", "random"])
def test_sample_triples_never_uses_relevant_docs_and_is_deterministic(strategy):
    split = _split()
    cands = bm25_candidates(DOCS, split.queries, 10)
    triples = sample_triples(split, DOCS, cands, strategy, seed=3, per_positive=2)
    assert triples == sample_triples(split, DOCS, cands, strategy, seed=3, per_positive=2)
    for qid, pos, neg in triples:
        assert split.qrels[qid][pos] > 0
        assert split.qrels[qid].get(neg, 0) <= 0
        assert neg in DOCS
    per = Counter((q, p) for q, p, _ in triples)
    assert set(per) == {(q, d) for q, j in split.qrels.items() for d, g in j.items() if g > 0}
    assert set(per.values()) == {2}
    for (q, p), c in per.items():  # distinct negatives per positive
        assert len({n for q2, p2, n in triples if (q2, p2) == (q, p)}) == c
    if strategy == "bm25":  # negatives come from the query's candidates when it has enough
        for qid, _, neg in triples:
            usable = [d for d in cands[qid] if split.qrels[qid].get(d, 0) <= 0]
            if len(usable) >= 2:
                assert neg in cands[qid]
    seeds = {tuple(sample_triples(split, DOCS, cands, strategy, seed=s, per_positive=2)) for s in range(6)}
    assert len(seeds) > 1


def test_sample_triples_falls_back_to_random_and_order_independence():
    split = Split(queries={"q": "x"}, qrels={"q": {"d01": 1, "d02": 1}})
    only_relevant = {"q": ["d01", "d02"]}
    triples = sample_triples(split, DOCS, only_relevant, "bm25", seed=0, per_positive=3)
    assert len(triples) == 6 and all(n not in ("d01", "d02") for _, _, n in triples)
    tiny = {"d01": "a", "d02": "b", "d03": "c"}
    assert [n for _, _, n in sample_triples(split, tiny, None, "random", seed=0, per_positive=5)] == ["d03", "d03"]
    # a query's triples do not depend on the other queries
    big = _split()
    cands = bm25_candidates(DOCS, big.queries, 10)
    alone = Split(queries={"c": QUERIES["c"]}, qrels={"c": big.qrels["c"]})
    assert [t for t in sample_triples(big, DOCS, cands, "bm25", 1) if t[0] == "c"] == sample_triples(
        alone, DOCS, cands, "bm25", 1
    )
    with pytest.raises(ValueError):
        sample_triples(big, DOCS, None, "bm25", 0)


def test_bm25_on_synthetic_finds_relevant_and_hard_negatives(tmp_path):
    ds = load_dataset(SyntheticConfig(), 0)
    split = ds.splits["test"]
    cands = bm25_candidates(ds.docs, split.queries, 50, cache_dir=tmp_path, key="synthetic-test")
    recall = np.mean([any(d in split.qrels[q] for d in cands[q][:50]) for q in split.queries])
    assert recall > 0.9
    triples = sample_triples(split, ds.docs, cands, "bm25", seed=0)
    assert len(triples) == sum(len(j) for j in split.qrels.values())
    assert all(split.qrels[q].get(n, 0) <= 0 for q, _, n in triples)
