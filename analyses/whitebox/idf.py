"""Collection IDF of words and of WordPiece subwords.

The "standard term importance" the white-box paper plots ColBERT's statistics against (IDF(w) in Figures 1-2,
"IDF (subword level)" in Figure 3).

    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

BM25's IDF in Lucene's form (the one datamodules/bm25.py scores with; the paper argues a term's BM25 score "roughly
corresponds to its IDF" on passages), N = the passages of the whole collection, df(t) = how many hold t at least
once. Always > 0, finite for df = 0 (a query word absent from the collection), and close to ln(N / df) for rare
terms. Words and subwords come from the ranker's own tokenizer over the full passage texts, no truncation (a
collection statistic, not what one encoding sees): words as words.py defines them (so a query word's key finds its
df), subwords as WordPiece ids.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from analyses.whitebox.words import word_key


def bm25_idf(df: int, n_docs: int) -> float:
    """Return BM25's IDF in Lucene's form, ln(1 + (N - df + 0.5) / (df + 0.5)), for `df` of `n_docs` passages."""
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


@dataclass
class CollectionIDF:
    """Document frequencies of words and WordPiece subwords over a collection, and their BM25 IDF (module doc)."""

    n_docs: int = 0
    word_df: Counter = field(default_factory=Counter)  # word key -> passages holding it
    subword_df: Counter = field(default_factory=Counter)  # WordPiece id -> passages holding it

    def word(self, key: str) -> float:
        """Return the IDF of the word with key `key` (words.word_key); a word absent from the collection has df 0."""
        return bm25_idf(self.word_df.get(key, 0), self.n_docs)

    def subword(self, token_id: int) -> float:
        """Return the IDF of the WordPiece id `token_id` (Figure 3's "IDF (subword level)")."""
        return bm25_idf(self.subword_df.get(int(token_id), 0), self.n_docs)


def collection_idf(tokenizer, texts: list[str], batch_size: int = 1024) -> CollectionIDF:
    """Document frequencies of words and subwords over `texts` (one passage each)."""
    out = CollectionIDF(n_docs=len(texts))
    # a word's key from its ids without a per-token tokenizer call: each id's piece with '##' dropped (words.word_key)
    pieces = [word_key([t]) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]
    for s in range(0, len(texts), batch_size):
        # full texts (no truncation, so no warning about the model's maximum length either)
        enc = tokenizer(texts[s : s + batch_size], add_special_tokens=False, verbose=False)
        for b, ids in enumerate(enc["input_ids"]):
            out.subword_df.update(set(ids))
            words: dict[int, list[str]] = {}
            for tid, w in zip(ids, enc.word_ids(b)):
                words.setdefault(w, []).append(pieces[tid])
            out.word_df.update({"".join(p) for w, p in words.items() if w is not None})
    return out
