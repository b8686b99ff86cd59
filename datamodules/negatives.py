"""Training-negative sampling for sources whose files have no triples.

Negatives are drawn from each query's BM25 candidates (datamodules/bm25.py) or uniformly from the collection.
"""

from __future__ import annotations

import hashlib

import numpy as np

from datamodules.bm25 import bm25_candidates  # noqa: F401  (re-exported: the candidates negatives come from)
from datamodules.corpus import Split, Triple
from datamodules.docstore import ids_in_order


def _rng(seed: int, qid: str) -> np.random.Generator:
    digest = hashlib.sha256(f"negatives|{int(seed)}|{qid}".encode()).digest()
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


def sample_triples(
    split: Split,
    docs: dict[str, str],
    candidates: dict[str, list[str]] | None,
    strategy: str = "bm25",
    seed: int = 0,
    per_positive: int = 1,
) -> list[Triple]:
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
    doc_ids = ids_in_order(docs)  # by position; a store's ids are read when drawn
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
