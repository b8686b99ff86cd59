"""A run's passages and queries as cached content tokens (datamodules/token_cache.py), found by doc id or qid.

`PassageTokens`: the passages of a collection as training and evaluation cut them (normalised, rotated or not), each
tokenised once per tokenizer and length. When a run uses at least half of the collection the table holds all of it,
shared by every later run; otherwise only the rows it uses (keyed by them), so testing 8 queries on MS MARCO does not
tokenise 8.8M passages. `QueryTokens`: queries by qid, from a table on disk (training's, up to MS MARCO's 808k) or
built in memory (an evaluation split's).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from datamodules.token_cache import (
    TokenTable,
    collection_digest,
    texts_digest,
    token_table,
    tokenizer_digest,
)
from datamodules.tokenization import PairTokenizer

FULL_FRACTION = 0.5  # a run that uses this share of a collection tokenises all of it (one table for every run)


def store_rows(docs: Mapping[str, str], doc_ids: Sequence[str]) -> np.ndarray:
    """Rows of `doc_ids` in the collection's order (a store's rows; a dict's positions)."""
    if hasattr(docs, "rows"):
        return np.asarray(docs.rows(doc_ids), dtype=np.int64)
    position = {d: i for i, d in enumerate(docs)}
    return np.fromiter((position[d] for d in doc_ids), dtype=np.int64, count=len(doc_ids))


def _text_at(docs: Mapping[str, str]) -> Callable[[int], tuple[str, str]]:
    if hasattr(docs, "text_at"):
        return lambda r: (docs.id_at(r), docs.text_at(r))
    items = list(docs.items())
    return items.__getitem__


class PassageTokens:
    """Content tokens of a collection's passages, each made by `text_of(doc id, text)` (module docstring).

    `held`: the sorted collection rows the table holds (None: all). Pickles small: the table reopens its folder.
    """

    def __init__(self, table: TokenTable, held: np.ndarray | None, position: dict[str, int] | None, docs):
        self.table, self.held, self._position, self._docs = table, held, position, docs

    @classmethod
    def build(
        cls,
        docs: Mapping[str, str],
        rows: np.ndarray,
        text_of: Callable[[str, str], str],
        transform: dict,
        tokenizer: PairTokenizer,
        cache_dir: str | os.PathLike,
    ) -> PassageTokens:
        """Tokenise the passages of collection `rows` (or all, `FULL_FRACTION`), as `text_of` makes them.

        `transform` names what `text_of` does (part of the cache key).
        """
        n = len(docs)
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        held = None if len(rows) >= FULL_FRACTION * n else rows
        key = {
            "what": "passages",
            "tokenizer": tokenizer_digest(tokenizer.tokenizer),
            "cap": tokenizer.doc_cap,
            "collection": collection_digest(docs),
            "transform": transform,
            "rows": None if held is None else hashlib.sha256(held.tobytes()).hexdigest(),
        }
        at = _text_at(docs)

        def texts():
            if held is None:
                for d, text in docs.items():
                    yield text_of(d, text)
            else:
                for r in held.tolist():
                    yield text_of(*at(r))

        table = token_table(
            cache_dir,
            key,
            n if held is None else len(held),
            texts,
            tokenizer.doc_content,
            len(tokenizer.tokenizer),
            "passages",
        )
        position = None if hasattr(docs, "row") else {d: i for i, d in enumerate(docs)}
        return cls(table, held, position, docs)

    def __getstate__(self):
        return {"table": self.table, "held": self.held, "position": self._position, "docs": self._docs}

    def __setstate__(self, state):
        self.__init__(state["table"], state["held"], state["position"], state["docs"])

    def holds_rows_of(self, triples) -> bool:
        """Whether `triples` name rows of this table's collection (a TripleArray over the same store)."""
        fp = getattr(self._docs, "fingerprint", None)
        return hasattr(triples, "rows_at") and fp is not None and getattr(triples.docs, "fingerprint", None) == fp

    def row_of(self, doc_id: str) -> int:
        """Return the collection row of `doc_id`."""
        return self._position[doc_id] if self._position is not None else self._docs.row(doc_id)

    def at_rows(self, rows: np.ndarray) -> list[np.ndarray]:
        """Content tokens of collection `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        local = rows if self.held is None else np.searchsorted(self.held, rows)
        return [self.table[int(r)] for r in local]

    def of(self, doc_ids: Sequence[str]) -> list[np.ndarray]:
        """Content tokens of the passages `doc_ids`."""
        return self.at_rows(np.fromiter((self.row_of(d) for d in doc_ids), dtype=np.int64, count=len(doc_ids)))


class QueryTokens:
    """Content tokens of queries by qid (or by position, `at`)."""

    def __init__(self, table: TokenTable, qids: Sequence[str]):
        self.table = table
        self.index = {q: i for i, q in enumerate(qids)}

    @classmethod
    def in_memory(cls, texts: Sequence[str], tokenizer: PairTokenizer) -> QueryTokens:
        """Return queries tokenised now, read by position (`at`)."""
        return cls(TokenTable.of(tokenizer.query_content(list(texts))), ())

    @classmethod
    def cached(cls, queries: Mapping[str, str], tokenizer: PairTokenizer, cache_dir: str | os.PathLike) -> QueryTokens:
        """Return the queries `queries` (qid -> text), tokenised once into `cache_dir`."""
        qids = list(queries)
        key = {
            "what": f"queries ({tokenizer.kind})",  # a cross-encoder cuts and re-tokenises its queries
            "tokenizer": tokenizer_digest(tokenizer.tokenizer),
            "max_len": tokenizer.query_max_len,
            "texts": texts_digest(queries.items()),
        }
        table = token_table(
            cache_dir,
            key,
            len(qids),
            lambda: (queries[q] for q in qids),
            tokenizer.query_content,
            len(tokenizer.tokenizer),
            "queries",
        )
        return cls(table, qids)

    def __getstate__(self):
        return {"table": self.table, "index": self.index}

    def __setstate__(self, state):
        self.table, self.index = state["table"], state["index"]

    def of(self, qids: Sequence[str]) -> list[np.ndarray]:
        """Content tokens of the queries `qids`."""
        return [self.table[self.index[q]] for q in qids]

    def at(self, positions: Sequence[int]) -> list[np.ndarray]:
        """Content tokens of the queries at `positions`."""
        return [self.table[int(i)] for i in positions]


@dataclass
class SplitTokens:
    """An evaluation split's queries (by position) and passages (by unit index) as cached content tokens."""

    queries: QueryTokens
    passages: PassageTokens
    rows: np.ndarray  # the collection row of each unit (the split's doc_ids)

    def docs_at(self, units: Sequence[int]) -> list[np.ndarray]:
        """Content tokens of the split's units `units`."""
        return self.passages.at_rows(self.rows[np.asarray(units, dtype=np.int64)])


class TokenizedCollection:
    """A collection's (doc id, token ids with special tokens) in its order, tokenised once: what an index encodes.

    The passages as they are (not normalised or rotated: what full ranking encodes), cut as `PairTokenizer.docs` cuts
    them. Sized, so an index can check its settings against the count before encoding.
    """

    def __init__(self, docs: Mapping[str, str], tokenizer: PairTokenizer, cache_dir: str | os.PathLike):
        self.docs = docs
        self.head, self.tail = (np.asarray(t, np.int64) for t in tokenizer.template.single)
        self._ids = None if hasattr(docs, "id_at") else list(docs)
        rows = np.arange(len(docs))
        self.passages = PassageTokens.build(
            docs, rows, lambda d, text: text, {"normalized": False, "rotate": False}, tokenizer, cache_dir
        )

    @classmethod
    def of(cls, docs: Mapping[str, str], tokenizer: PairTokenizer, cache_dir: str | os.PathLike, enabled: bool):
        """Return the tokenised collection, or `docs` itself when disabled or the tokenizer has no template."""
        if not enabled or tokenizer.kind != "bi" or tokenizer.template is None:
            return docs
        return cls(docs, tokenizer, cache_dir)

    def __len__(self) -> int:
        return len(self.docs)

    def __iter__(self):
        for r, d in enumerate(self.docs):
            yield d, self.text_at(r)

    def id_at(self, row: int) -> str:
        """Return the doc id of row `row` (a split encoding reads its rank's windows by row)."""
        return self.docs.id_at(row) if hasattr(self.docs, "id_at") else self._ids[row]

    def text_at(self, row: int) -> np.ndarray:
        """Return row `row`'s text as the encoder takes it: its token ids with the special tokens."""
        return np.concatenate([self.head, np.asarray(self.passages.table[row], np.int64), self.tail])
