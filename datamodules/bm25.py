"""BM25 with bm25s: the first stage of re-ranking evaluation, the source of BM25 negatives, and a baseline run.

Scoring: bm25s' variants (Kamphuis et al. 2020), "lucene" by default (k1 = 1.5, b = 0.75):

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl)),
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)),

summed over the query's tokens as they occur (a repeated query term counts twice, as in Lucene's BooleanQuery
of term clauses), over bm25s' tokenizer: lower-cased, tokens `(?u)\\b\\w\\w+\\b`, English stopwords removed,
stemmed with PyStemmer's English Snowball stemmer only when PyStemmer is installed (optional; the stemmer is part
of the cache key). Documents are indexed in sorted doc-id order; a query's ranking holds the documents sharing at
least one term with it (score > 0), best first, ties broken by doc id, at most k — so the result does not depend
on dict order and is the same in every process.

Cache: `<cache_dir>/bm25/<key>-<digest>.json`, digest = SHA-256 of (collection content, queries, tokenizer and
stemmer settings, BM25 variant and parameters, k). Written atomically (core.io.atomic_open), so concurrent DDP
ranks and crashes never leave a half-written file; a later call with the same inputs reads it.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.bm25s_lib import bm25s_module
from core.errors import check_choice
from core.io import atomic_open

# bm25s variants (Kamphuis et al. 2020)
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
STOPWORDS = "en"
CACHE_VERSION = 2  # 2: scores kept with the doc ids

# (doc id, score) best first
Ranking = list[tuple[str, float]]


@dataclass(frozen=True)
class BM25Params:
    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75

    def __post_init__(self):
        check_choice("bm25.method", self.method, METHODS)


def _stemmer():
    try:
        import Stemmer  # PyStemmer, optional

        return Stemmer.Stemmer("english"), f"pystemmer-english-{getattr(Stemmer, '__version__', '?')}"
    except ImportError:
        return None, "none"


def settings(params: BM25Params = BM25Params()) -> dict:
    return {**asdict(params), "token_pattern": TOKEN_PATTERN, "lower": True, "stopwords": STOPWORDS,
            "stemmer": _stemmer()[1], "version": CACHE_VERSION}


def _digest(docs: dict[str, str], queries: dict[str, str], k: int, params: BM25Params) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({**settings(params), "k": int(k)}, sort_keys=True).encode())
    for tag, items in ((b"D", docs), (b"Q", queries)):
        h.update(tag)
        for ident in sorted(items):
            i, t = ident.encode("utf-8"), items[ident].encode("utf-8")
            h.update(len(i).to_bytes(8, "little") + i + len(t).to_bytes(8, "little") + t)
    return h.hexdigest()


def tokenize(texts: list[str]) -> list[list[str]]:
    bm25s = bm25s_module()  # loaded on first use: heavy, and only BM25 needs it

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


def compute_bm25_run(docs: dict[str, str], queries: dict[str, str], k: int, params: BM25Params = BM25Params()) -> dict[str, Ranking]:
    """No cache: index the collection with bm25s and rank it for every query: qid -> [(doc id, score)]."""
    bm25s = bm25s_module()  # loaded on first use: heavy, and only BM25 needs it

    doc_ids = sorted(docs)
    if not doc_ids or not queries or k <= 0:
        return {q: [] for q in queries}
    doc_tokens = tokenize([docs[d] for d in doc_ids])
    if not any(doc_tokens):  # only stopwords / one-letter tokens: nothing can match
        return {q: [] for q in queries}
    retriever = bm25s.BM25(method=params.method, k1=params.k1, b=params.b)
    retriever.index(doc_tokens, show_progress=False)
    vocab = retriever.vocab_dict
    qids = list(queries)
    out: dict[str, Ranking] = {}
    for qid, toks in zip(qids, tokenize([queries[q] for q in qids])):
        ids = [vocab[t] for t in toks if t and t in vocab]
        if not ids:
            out[qid] = []
            continue
        scores = np.asarray(retriever.get_scores_from_ids(ids), dtype=np.float64)
        out[qid] = [(doc_ids[i], float(scores[i])) for i in _top_k(scores, int(k))]
    return out


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(key))[:80] or "bm25"


def cache_path(docs: dict[str, str], queries: dict[str, str], k: int, cache_dir, key: str, params: BM25Params = BM25Params()) -> Path:
    return Path(cache_dir) / "bm25" / f"{_safe(key)}-{_digest(docs, queries, k, params)[:24]}.json"


def bm25_run(docs: dict[str, str], queries: dict[str, str], k: int, cache_dir=None, key: str = "bm25",
             params: BM25Params = BM25Params()) -> dict[str, Ranking]:
    """qid -> up to k (doc id, BM25 score), best first. Cached on disk under cache_dir (None: no cache); `key`
    names the cache file (e.g. "squad-val"), the digest makes it specific to the inputs."""
    if cache_dir is None:
        return compute_bm25_run(docs, queries, k, params)
    path = cache_path(docs, queries, k, cache_dir, key, params)
    expected = {**settings(params), "k": int(k)}
    if path.exists():
        try:
            with open(path, encoding="utf-8") as f:
                payload = json.load(f)
            if payload.get("settings") == expected and set(payload["run"]) == set(queries):
                return {q: [(str(d), float(s)) for d, s in payload["run"][q]] for q in queries}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # unreadable or foreign file: recompute and overwrite
    result = compute_bm25_run(docs, queries, k, params)
    with atomic_open(path) as f:
        json.dump({"settings": expected, "run": result}, f, separators=(",", ":"))
    return result


def no_candidates_warning(where: str, qids: list[str], why: str = "no query term occurs in the collection") -> str:
    """The one-line warning listing the judged queries that have no candidate (BM25 finds none of their terms in the
    collection, e.g. a query of punctuation only), "" when there are none. Such queries score 0 on every measure and
    have no line in run.trec, which is what `trec_eval -c` does with them; trec_eval without -c leaves them out of
    its means. `why`: for candidates from a given run, that the run ranks nothing for them. The caller warns (once,
    on rank 0)."""
    if not qids:
        return ""
    shown = ", ".join(repr(q) for q in qids[:20]) + (f" and {len(qids) - 20} more" if len(qids) > 20 else "")
    return (f"{where}: {len(qids)} judged quer{'y has' if len(qids) == 1 else 'ies have'} no candidate ({why}): "
            f"{shown}; scored 0 on every measure and absent from run.trec (as trec_eval -c "
            f"counts them)")


def bm25_candidates(docs: dict[str, str], queries: dict[str, str], k: int, cache_dir=None, key: str = "bm25") -> dict[str, list[str]]:
    """qid -> up to k doc ids (BM25 top-k with the default parameters, best first), cached as `bm25_run`."""
    return {q: [d for d, _ in ranking] for q, ranking in bm25_run(docs, queries, k, cache_dir, key).items()}
