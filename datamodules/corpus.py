"""The one internal form every data source produces.

A source reads its files (or ir_datasets) and returns an `IRDataset`: the collection, and per split the
queries, graded qrels, training triplets and evaluation candidates. Missing triplets or candidates are
filled later by `datamodules.negatives` (BM25 with bm25s), so sources only report what their files hold.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.errors import InputError

SPLITS = ("train", "val", "test")

# (qid, positive doc id, negative doc id)
Triple = tuple[str, str, str]
# character span [start, end) of an answer inside a passage text
Span = tuple[int, int]


@dataclass
class Split:
    queries: dict[str, str] = field(default_factory=dict)  # qid -> text
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)  # qid -> doc id -> grade (> 0 relevant)
    triples: list[Triple] | None = None  # training triplets; None = sample them from qrels
    candidates: dict[str, list[str]] | None = None  # qid -> doc ids to re-rank; None = BM25 top-k


@dataclass
class IRDataset:
    name: str
    docs: dict[str, str]  # doc id -> passage text
    splits: dict[str, Split]
    # (qid, doc id) -> answer character spans in docs[doc id]; for position-bias analysis and rotation.
    answers: dict[tuple[str, str], list[Span]] = field(default_factory=dict)

    def split(self, name: str) -> Split:
        if name not in self.splits:
            raise InputError(f"dataset {self.name}", f"has no '{name}' split; it has {sorted(self.splits)}")
        return self.splits[name]

    def validate(self) -> None:
        """Cross-reference checks that individual file readers cannot do on their own.

        Raises InputError naming the dataset, split and offending id: a qrels query missing from the queries, a
        triple or candidate naming an unknown doc id, an empty passage or query.
        """
        for doc_id, text in self.docs.items():
            if not text or not text.strip():
                raise InputError(f"dataset {self.name}", f"document '{doc_id}' has empty text; expected a non-empty passage")
        for split_name, split in self.splits.items():
            where = f"dataset {self.name}, split {split_name}"
            for qid, text in split.queries.items():
                if not text or not text.strip():
                    raise InputError(where, f"query '{qid}' has empty text; expected a non-empty query")
            for qid, judged in split.qrels.items():
                if qid not in split.queries:
                    raise InputError(where, f"qrels name query '{qid}' which is not among the queries")
                for doc_id in judged:
                    if doc_id not in self.docs:
                        raise InputError(where, f"qrels of query '{qid}' name unknown doc id '{doc_id}'")
            for qid, pos, neg in split.triples or ():
                if qid not in split.queries:
                    raise InputError(where, f"triple ({qid}, {pos}, {neg}) names query '{qid}' which is not among the queries")
                for doc_id in (pos, neg):
                    if doc_id not in self.docs:
                        raise InputError(where, f"triple ({qid}, {pos}, {neg}) names unknown doc id '{doc_id}'")
            for qid, doc_ids in (split.candidates or {}).items():
                if qid not in split.queries:
                    raise InputError(where, f"candidates name query '{qid}' which is not among the queries")
                for doc_id in doc_ids:
                    if doc_id not in self.docs:
                        raise InputError(where, f"candidates of query '{qid}' name unknown doc id '{doc_id}'")
