"""The one internal form every data source produces.

A source reads its files (or ir_datasets) and returns an `IRDataset`: the collection, and per split the
queries, graded qrels, training triplets and evaluation candidates. Missing triplets or candidates are
filled later by `datamodules.negatives` (BM25 with bm25s), so sources only report what their files hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.errors import InputError
from datamodules.textfiles import iter_lines

SPLITS = ("train", "val", "test")

# (qid, positive doc id, negative doc id)
Triple = tuple[str, str, str]
# character span [start, end) of an answer inside a passage text
Span = tuple[int, int]


@dataclass
class Split:
    """One split (train, val or test) of an `IRDataset`: queries, graded qrels, triplets, candidates, origins.

    A source fills what its files hold; a missing part (None triples or candidates) is filled later by
    `datamodules.negatives`. `origins` lets cross-reference errors point at the file (and line) an entry came from.
    """

    queries: dict[str, str] = field(default_factory=dict)  # qid -> text
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)  # qid -> doc id -> grade (> 0 relevant)
    # training triplets (a list, or a memory-mapped datamodules.triples.TripleArray); None = sample them from qrels
    triples: Sequence[Triple] | None = None
    candidates: dict[str, list[str]] | None = None  # qid -> doc ids to re-rank; None = BM25 top-k
    # where each part came from: "queries" / "qrels" / "triples" / "candidates" -> a file path or a config key
    # (e.g. "data.train_id (msmarco-passage/train)"); cross-reference errors point there, to the line when a file
    origins: dict[str, str] = field(default_factory=dict)

    def scored_queries(
        self, max_queries: int | None = None, seed: int = 0, sample_seed: int | None = None
    ) -> list[str]:
        """Return the ids of the queries an evaluation of this split scores, sorted.

        Its judged queries, or `max_queries` of them (`data.max_eval_queries`) drawn with `sample_seed`
        (`data.eval_sample_seed`), or with the run's `seed` when that is None. The one sample of a val / test split:
        the re-rankers' data module and the full-ranking runs (BM25, dense) all take it, so that every row of a grid
        is scored on the same questions.
        """
        qids = sorted(q for q in self.queries if self.qrels.get(q))
        if max_queries is not None and len(qids) > max_queries:
            draw = seed if sample_seed is None else sample_seed
            pick = np.random.default_rng([draw, 2]).permutation(len(qids))[:max_queries]
            qids = sorted(qids[i] for i in pick)
        return qids


@dataclass
class IRDataset:
    """The one internal form every data source produces: the collection, the splits and the answer spans.

    Sources return it from their `build`; `validate` then cross-checks it before the data module serves it.
    """

    name: str
    docs: Mapping[str, str]  # doc id -> passage text: a dict, or a disk-backed datamodules.docstore.DocStore
    splits: dict[str, Split]
    # (qid, doc id) -> answer character spans in docs[doc id]; for position-bias analysis and rotation.
    answers: dict[tuple[str, str], list[Span]] = field(default_factory=dict)
    docs_origin: str | None = None  # the collection's file or config key, for error messages
    # counts of the position-biased training split (datamodules/answer_bias.py) when `data.answer_bias_keep_first`
    # cut the training split; None otherwise
    answer_bias: dict | None = None
    # doc id -> the group of documents it belongs to, which folds keep together (SQuAD: its article, so no paragraph
    # is relevant in two folds; datamodules/folds.py); None: every document stands alone. A module-level function,
    # so the dataset pickles.
    doc_group: Callable[[str], str] | None = None

    def split(self, name: str) -> Split:
        """Return the split `name`; InputError naming the splits there are when the dataset has no such split."""
        if name not in self.splits:
            raise InputError(f"dataset {self.name}", f"has no '{name}' split; it has {sorted(self.splits)}")
        return self.splits[name]

    def eval_sample(self, split: str, dc, seed: int, split_key: str) -> list[str] | None:
        """Return the questions of `split` that `data.max_eval_queries` samples, or None when it is unset.

        `dc` is the data config (`max_eval_queries`, `eval_sample_seed`), `seed` the run seed. Everything that scores
        a val / test split's questions takes this one sample (`Split.scored_queries`): the re-rankers, the full-ranking
        runs and the analyses that rank, so that a grid's rows and analyses see the same questions. Set for another
        split (`split_key` names the key that chose it): an InputError, since no such sample exists.
        """
        if dc.max_eval_queries is None:
            return None
        if split not in ("val", "test"):
            raise InputError(
                "config key 'data.max_eval_queries'",
                f"is {dc.max_eval_queries}: it samples the val and test questions, and {split_key}={split} has no such "
                f"sample; leave it null or run {split_key}=val / test",
            )
        return self.split(split).scored_queries(dc.max_eval_queries, seed, dc.eval_sample_seed)

    def validate(self) -> None:
        """Cross-reference checks that individual file readers cannot do on their own.

        Raises InputError naming where the offending entry came from (`file:line` when the split records its
        file, else the config key, else the dataset and split): a qrels query missing from the queries, a triple
        or candidate naming an unknown doc id, an empty passage or query, a collection without passages.
        """
        if not self.docs:
            raise InputError(
                self.docs_origin or f"dataset {self.name}",
                "holds no passages; expected a collection of at least one passage",
            )
        # a store's texts were checked when it was built; reading 8.8M of them again would take minutes
        for doc_id, text in () if getattr(self.docs, "texts_checked", False) else self.docs.items():
            if not text or not text.strip():
                raise InputError(
                    self.docs_origin or f"dataset {self.name}",
                    f"document '{doc_id}' has empty text; expected a non-empty passage",
                )
        for split_name, split in self.splits.items():

            def where(kind: str, *ids: str, origins=split.origins, split_name=split_name) -> str:
                return locate(origins.get(kind), *ids) or f"dataset {self.name}, split {split_name}"

            for qid, text in split.queries.items():
                if not text or not text.strip():
                    raise InputError(
                        where("queries", qid),
                        f"query '{qid}' of split {split_name} has empty text; expected a non-empty query",
                    )
            for qid, judged in split.qrels.items():
                if qid not in split.queries:
                    raise InputError(
                        where("qrels", qid),
                        f"qrels of split {split_name} name query '{qid}' which is not among the queries",
                    )
                for doc_id in judged:
                    if doc_id not in self.docs:
                        raise InputError(
                            where("qrels", qid, doc_id),
                            f"qrels of query '{qid}' (split {split_name}) name unknown doc id '{doc_id}'",
                        )
            for qid, pos, neg in () if getattr(split.triples, "checked", False) else split.triples or ():
                if qid not in split.queries:
                    raise InputError(
                        where("triples", qid, pos, neg),
                        f"triple ({qid}, {pos}, {neg}) of split {split_name} names query '{qid}' "
                        "which is not among the queries",
                    )
                for doc_id in (pos, neg):
                    if doc_id not in self.docs:
                        raise InputError(
                            where("triples", qid, pos, neg),
                            f"triple ({qid}, {pos}, {neg}) of split {split_name} names unknown doc id '{doc_id}'",
                        )
            for qid, doc_ids in (split.candidates or {}).items():
                if qid not in split.queries:
                    raise InputError(
                        where("candidates", qid),
                        f"candidates of split {split_name} name query '{qid}' which is not among the queries",
                    )
                for doc_id in doc_ids:
                    if doc_id not in self.docs:
                        raise InputError(
                            where("candidates", qid, doc_id),
                            f"candidates of query '{qid}' (split {split_name}) name unknown doc id '{doc_id}'",
                        )


def locate(origin: str | None, *ids: str) -> str | None:
    """Return `file:line` of the first line of the file `origin` whose whitespace-separated fields include every id.

    The origin itself when it is a config key or the line is not found (ids rewritten by the reader); None without one.

    Only called on an error, so re-reading the file costs nothing in a valid run.
    """
    if not origin:
        return None
    path = Path(origin)
    if not path.is_file():
        return origin
    try:
        for lineno, line in iter_lines(path):
            fields = set(line.split())
            if all(i in fields for i in ids):
                return f"{path}:{lineno}"
    except InputError:
        pass
    return str(path)
