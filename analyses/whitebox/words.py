"""Query words and their WordPiece subwords (white-box paper sections 3-4).

Sections 3-4: "all the contributions of subwords that compose the word"; "for a word w composed of several
WordPiece components t_1, ..., t_n".

A word is a pre-token of the backbone's own tokenizer (BERT's basic tokenisation: the normaliser lower-cases and
strips accents for uncased models, then text splits on whitespace and punctuation, every punctuation character being
a word of its own), as the fast tokenizer's `word_ids` report it; its subwords are the WordPiece tokens it became.
Its key is the subwords joined with '##' dropped (`hypertrophy` for hyper ##tro ##phy), so a query word and the
same word in a passage (idf.py) get the same key. [CLS] and [SEP] belong to no word: their rows of Eq. 1 stay in
every score and are never analysed (this ColBERT has no [Q]/[D] markers, as the paper's variant). A word that
query truncation (`model.query_max_len`) cut is left out. Punctuation-only words and stopwords are flagged here;
the analysis decides what to do with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.bm25s_lib import stopwords_en

# The 33-word English stop list of Lucene, which bm25s ("en") and this project's BM25 (datamodules/bm25.py) use.
STOPWORDS = stopwords_en()


@dataclass
class Word:
    """One word of a tokenised query: its key, its token positions and the WordPiece ids at those positions."""

    key: str  # subwords joined, '##' dropped
    positions: list[int] = field(default_factory=list)  # token positions in the tokenised query ([CLS] = 0)
    subwords: list[int] = field(default_factory=list)  # WordPiece ids at those positions

    @property
    def punctuation(self) -> bool:
        """Whether the word has no letter or digit (a punctuation-only word)."""
        return not any(ch.isalnum() for ch in self.key)

    @property
    def stopword(self) -> bool:
        """Whether the word is in Lucene's English stop list (`STOPWORDS`)."""
        return self.key in STOPWORDS


def word_key(pieces: list[str]) -> str:
    """Return a word's key: its WordPiece pieces joined with '##' dropped (`hypertrophy` for hyper ##tro ##phy)."""
    return "".join(p[2:] if p.startswith("##") else p for p in pieces)


def group_words(input_ids: list[int], word_ids: list[int | None], tokens: list[str]) -> dict[int, Word]:
    """Word index -> Word (positions in order), from one encoding's ids, `word_ids` and token strings."""
    words: dict[int, Word] = {}
    for pos, (tid, w) in enumerate(zip(input_ids, word_ids)):
        if w is None:  # [CLS], [SEP], padding
            continue
        word = words.setdefault(w, Word(""))
        word.positions.append(pos)
        word.subwords.append(int(tid))
    for word in words.values():
        word.key = word_key([tokens[p] for p in word.positions])
    return words


def query_words(tokenizer, texts: list[str], max_len: int) -> tuple[list[list[int]], list[list[Word]]]:
    """Return per query its token ids as the ranker sees them and its complete words in order of appearance.

    The token ids are truncated to `max_len`, with [CLS]/[SEP], as PairTokenizer.queries makes them, without
    padding; a word that the truncation cut is left out.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("word segmentation needs a fast tokenizer (word_ids)")
    cut = tokenizer(texts, truncation=True, max_length=max_len)
    full = tokenizer(texts, add_special_tokens=False, verbose=False)
    ids_out, words_out = [], []
    for b in range(len(texts)):
        ids = cut["input_ids"][b]
        words = group_words(ids, cut.word_ids(b), tokenizer.convert_ids_to_tokens(ids))
        whole = {}
        for w in full.word_ids(b):
            if w is not None:
                whole[w] = whole.get(w, 0) + 1
        ids_out.append(list(ids))
        words_out.append([words[w] for w in sorted(words) if len(words[w].positions) == whole.get(w)])
    return ids_out, words_out
