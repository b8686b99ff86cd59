"""BM25 candidates (bm25s) and training-negative sampling, for sources whose files have no candidate lists or
no triples.

BM25: bm25s' default variant, "lucene" (k1 = 1.5, b = 0.75; idf = ln(1 + (N - df + 0.5) / (df + 0.5)), term
weight = idf * tf / (tf + k1 * (1 - b + b * |d| / avgdl))), over bm25s' tokenizer: lower-cased, tokens
`(?u)\\b\\w\\w+\\b`, English stopwords removed, stemmed with PyStemmer's English Snowball stemmer only when PyStemmer
is installed (it is optional; the stemmer is part of the cache key). Documents are indexed in sorted doc-id
order; a query's candidates are the documents sharing at least one term with it, best score first, ties broken by
doc id, at most k — so the result does not depend on dict order and is the same in every process.

Cache: `<cache_dir>/bm25/<key>-<digest>.json`, digest = SHA-256 of (collection content, queries, tokenizer and
stemmer settings, BM25 parameters, k). Written atomically (pipeline.io.atomic_open), so concurrent DDP ranks and
crashes never leave a half-written file; a later call with the same inputs reads it instead of recomputing.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from datamodules.corpus import Split, Triple
from pipeline.io import atomic_open

BM25_METHOD, BM25_K1, BM25_B = "lucene", 1.5, 0.75
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
STOPWORDS = "en"
CACHE_VERSION = 1


def _stemmer():
    try:
        import Stemmer  # PyStemmer, optional

        return Stemmer.Stemmer("english"), f"pystemmer-english-{getattr(Stemmer, '__version__', '?')}"
    except ImportError:
        return None, "none"


def settings() -> dict:
    return {"method": BM25_METHOD, "k1": BM25_K1, "b": BM25_B, "token_pattern": TOKEN_PATTERN, "lower": True,
            "stopwords": STOPWORDS, "stemmer": _stemmer()[1], "version": CACHE_VERSION}


def _digest(docs: dict[str, str], queries: dict[str, str], k: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({**settings(), "k": int(k)}, sort_keys=True).encode())
    for tag, items in ((b"D", docs), (b"Q", queries)):
        h.update(tag)
        for ident in sorted(items):
            i, t = ident.encode("utf-8"), items[ident].encode("utf-8")
            h.update(len(i).to_bytes(8, "little") + i + len(t).to_bytes(8, "little") + t)
    return h.hexdigest()


def tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s

    stemmer, _ = _stemmer()
    return bm25s.tokenize(texts, lower=True, token_pattern=TOKEN_PATTERN, stopwords=STOPWORDS, stemmer=stemmer,
                          return_ids=False, show_progress=False)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best positive scores, by score desc then index asc (deterministic under ties)."""
    cand = np.flatnonzero(scores > 0)
    if len(cand) > k:
        vals = scores[cand]
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]  # the k-th largest score
        above = cand[vals > kth]
        ties = cand[vals == kth][: k - len(above)]
        cand = np.concatenate([above, ties])
    return cand[np.lexsort((cand, -scores[cand]))]


def compute_bm25_candidates(docs: dict[str, str], queries: dict[str, str], k: int) -> dict[str, list[str]]:
    """No cache: index the collection with bm25s and rank it for every query."""
    import bm25s

    doc_ids = sorted(docs)
    if not doc_ids or not queries or k <= 0:
        return {q: [] for q in queries}
    doc_tokens = tokenize([docs[d] for d in doc_ids])
    if not any(doc_tokens):  # only stopwords / one-letter tokens: nothing can match
        return {q: [] for q in queries}
    retriever = bm25s.BM25(method=BM25_METHOD, k1=BM25_K1, b=BM25_B)
    retriever.index(doc_tokens, show_progress=False)
    vocab = retriever.vocab_dict
    qids = list(queries)
    out: dict[str, list[str]] = {}
    for qid, toks in zip(qids, tokenize([queries[q] for q in qids])):
        ids = [vocab[t] for t in toks if t and t in vocab]
        if not ids:
            out[qid] = []
            continue
        scores = np.asarray(retriever.get_scores_from_ids(ids), dtype=np.float64)
        out[qid] = [doc_ids[i] for i in _top_k(scores, int(k))]
    return out


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(key))[:80] or "bm25"


def cache_path(docs: dict[str, str], queries: dict[str, str], k: int, cache_dir, key: str) -> Path:
    return Path(cache_dir) / "bm25" / f"{_safe(key)}-{_digest(docs, queries, k)[:24]}.json"


def bm25_candidates(docs: dict[str, str], queries: dict[str, str], k: int, cache_dir=None, key: str = "bm25") -> dict[str, list[str]]:
    """qid -> up to k doc ids (BM25 top-k, best first). Cached on disk under cache_dir (None: no cache);
    `key` names the cache file (e.g. "squad-val"), the digest makes it specific to the inputs."""
    if cache_dir is None:
        return compute_bm25_candidates(docs, queries, k)
    path = cache_path(docs, queries, k, cache_dir, key)
    if path.exists():
        try:
            with open(path, encoding="utf-8") as f:
                payload = json.load(f)
            if payload.get("settings") == {**settings(), "k": int(k)} and set(payload["candidates"]) == set(queries):
                return {q: list(payload["candidates"][q]) for q in queries}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # unreadable or foreign file: recompute and overwrite
    result = compute_bm25_candidates(docs, queries, k)
    with atomic_open(path) as f:
        json.dump({"settings": {**settings(), "k": int(k)}, "candidates": result}, f, separators=(",", ":"))
    return result


def _rng(seed: int, qid: str) -> np.random.Generator:
    digest = hashlib.sha256(f"negatives|{int(seed)}|{qid}".encode("utf-8")).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _random_negatives(rng: np.random.Generator, doc_ids: list[str], docs: dict, exclude: set[str], m: int) -> list[str]:
    """Up to m distinct docs drawn uniformly from doc_ids minus exclude (rejection sampling when the pool is big)."""
    avail = len(doc_ids) - sum(1 for d in exclude if d in docs)
    m = min(m, avail)
    if m <= 0:
        return []
    if avail <= 4 * m:  # small pool: choose from the explicit list
        pool = [d for d in doc_ids if d not in exclude]
        return [pool[i] for i in rng.choice(len(pool), size=m, replace=False)]
    picked: list[str] = []
    seen = set(exclude)
    while len(picked) < m:
        d = doc_ids[int(rng.integers(len(doc_ids)))]
        if d not in seen:
            seen.add(d)
            picked.append(d)
    return picked


def sample_triples(split: Split, docs: dict[str, str], candidates: dict[str, list[str]] | None, strategy: str = "bm25",
                   seed: int = 0, per_positive: int = 1) -> list[Triple]:
    """(qid, positive, negative) triples from a split's qrels.

    For each query (sorted ids) and each relevant doc (grade > 0; by grade desc, then id), `per_positive` distinct
    negatives: "bm25" draws them from the query's candidates, "random" uniformly from the collection. A negative is
    never a doc judged relevant (> 0) for that query; judged non-relevant docs (grade <= 0) may be drawn. When the
    candidates of a query hold fewer usable docs than needed, the rest come from the random pool; if the whole
    collection has fewer, fewer triples are made. Randomness: one generator per (seed, qid), so a query's triples
    do not depend on the other queries or on dict order.
    """
    if strategy not in ("bm25", "random"):
        raise ValueError(f"negative sampling strategy '{strategy}'; expected 'bm25' or 'random'")
    if strategy == "bm25" and candidates is None:
        raise ValueError("strategy 'bm25' needs candidates (bm25_candidates)")
    doc_ids = list(docs)
    triples: list[Triple] = []
    for qid in sorted(split.qrels):
        if qid not in split.queries:
            continue
        judged = split.qrels[qid]
        positives = sorted((d for d, g in judged.items() if g > 0 and d in docs), key=lambda d: (-judged[d], d))
        if not positives:
            continue
        relevant = {d for d, g in judged.items() if g > 0}
        rng = _rng(seed, qid)
        for pos in positives:
            negs: list[str] = []
            if strategy == "bm25":
                pool = [d for d in dict.fromkeys(candidates.get(qid, ())) if d not in relevant and d in docs]
                if pool:
                    take = min(per_positive, len(pool))
                    negs = [pool[i] for i in rng.choice(len(pool), size=take, replace=False)]
            if len(negs) < per_positive:
                negs += _random_negatives(rng, doc_ids, docs, relevant | set(negs), per_positive - len(negs))
            triples.extend((qid, pos, neg) for neg in negs)
    return triples
