"""A BEIR dataset folder (`data.source: beir`), as unpacked from the BEIR downloads.

The layout:

    <path>/corpus.jsonl     {"_id", "title", "text", ...}   (or corpus.jsonl.gz)
    <path>/queries.jsonl    {"_id", "text", ...}            (or queries.jsonl.gz)
    <path>/qrels/{train,dev,test}.tsv   header `query-id<TAB>corpus-id<TAB>score`, then one judgement a line

Passage text = "title text" when `use_title` and the title is non-empty (the BEIR convention), else text.
Each split's queries are the queries judged in its qrels file (grades <= 0 are kept as judged non-relevant).

Missing splits: most BEIR datasets ship only `test.tsv`. A missing `dev.tsv` is derived from `train.tsv` when
that exists (a `val_fraction` of the train queries, chosen with `split_seed`, leaves train); otherwise, and for a
missing train or test file, the split is empty (zero-shot evaluation needs only test). BEIR files carry no triples
or candidate lists: negatives are sampled and candidates are the BM25 top-k.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from core.errors import InputError
from core.ranges import NON_NEGATIVE, SEED, check_ranges
from datamodules.config import DataConfig
from datamodules.corpus import IRDataset, Split
from datamodules.docstore import fingerprint, open_store
from datamodules.sources.registry import SOURCES
from datamodules.textfiles import (
    JSONL_EXPECTED,
    check_id,
    check_not_empty,
    iter_rows,
    parse_int,
    read_jsonl,
    resolve_path,
    rows_expected,
)

QRELS_COLUMNS = ("query-id", "corpus-id", "score")


@dataclass
class BeirConfig(DataConfig):
    """The `data` keys of the BEIR source: the dataset folder, the qrels file of each split, titles, the dev split.

    `val_fraction` and `split_seed` derive a dev split from the training queries when there is no dev qrels file
    (module docstring).
    """

    answers: ClassVar[bool | None] = False

    source: str = "beir"
    path: str | None = None  # the BEIR dataset folder (corpus.jsonl, queries.jsonl, qrels/)
    train_split: str = "train"  # qrels/<name>.tsv per split
    val_split: str = "dev"
    test_split: str = "test"
    use_title: bool = True
    val_fraction: float = 0.1  # of the train queries, when there is no dev qrels file (>= 1: a count)
    split_seed: int = 13

    def __post_init__(self):
        super().__post_init__()
        check_ranges("data", self, val_fraction=NON_NEGATIVE, split_seed=SEED)

    def split_keys(self) -> dict[str, frozenset[str]]:
        """Return the test qrels key as read with the test split, the others with train or val (`build`).

        Without a dev qrels file the dev split is drawn from the training qrels (`val_fraction`, `split_seed`), and
        those queries leave the training split: training and validation read all four.
        """
        train_or_val = frozenset({"train", "val"})
        keys = dict.fromkeys(("train_split", "val_split", "val_fraction", "split_seed"), train_or_val)
        return keys | {"test_split": frozenset({"test"})}


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    return None


def _string_field(obj: dict, key: str, where: str, required: bool = True) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise InputError(where, f"missing field '{key}'; expected a JSON object with '{key}'")
        return ""
    if not isinstance(value, (str, int)):
        raise InputError(where, f"field '{key}' is a {type(value).__name__}; expected a string")
    return str(value)


def iter_corpus(path: Path, use_title: bool) -> Iterator[tuple[int, str, str]]:
    """(line number, _id, passage text) of each corpus line; uniqueness is the caller's to check."""
    for lineno, obj in read_jsonl(path):
        where = f"{path}:{lineno}"
        did = check_id(_string_field(obj, "_id", where), where, "corpus _id")
        title = _string_field(obj, "title", where, required=False).strip()
        text = _string_field(obj, "text", where, required=False).strip()
        full = f"{title} {text}".strip() if use_title else text
        if not full:
            raise InputError(where, f"empty passage text for _id '{did}'; expected non-empty 'text' (or 'title')")
        yield lineno, did, full


def read_corpus(path: Path, use_title: bool) -> dict[str, str]:
    """Read a BEIR corpus.jsonl into {_id: passage text} (`iter_corpus`); a duplicate _id raises InputError."""
    docs: dict[str, str] = {}
    for lineno, did, text in iter_corpus(path, use_title):
        if did in docs:
            raise InputError(f"{path}:{lineno}", f"duplicate corpus _id '{did}'; expected unique ids")
        docs[did] = text
    return docs


def read_queries(path: Path) -> dict[str, str]:
    """Read a BEIR queries.jsonl into {_id: text}; an empty text or a duplicate _id raises InputError."""
    queries: dict[str, str] = {}
    for lineno, obj in read_jsonl(path):
        where = f"{path}:{lineno}"
        qid = check_id(_string_field(obj, "_id", where), where, "query _id")
        text = _string_field(obj, "text", where)
        if not text.strip():
            raise InputError(where, f"empty query text for _id '{qid}'; expected a non-empty query")
        if qid in queries:
            raise InputError(where, f"duplicate query _id '{qid}'; expected unique ids")
        queries[qid] = text
    return queries


def read_beir_qrels(path: Path) -> dict[str, dict[str, int]]:
    """Read a BEIR qrels TSV (`query-id<TAB>corpus-id<TAB>score`) into {query-id: {corpus-id: score}}.

    The header line is skipped; a pair listed twice keeps its highest grade.
    """
    qrels: dict[str, dict[str, int]] = {}
    first = True
    for lineno, cols in iter_rows(path, QRELS_COLUMNS):
        if first:
            first = False
            if cols[2].strip().lower() == "score" or cols[0].strip().lower() == "query-id":
                continue  # the header
        qid = check_id(cols[0].strip(), f"{path}:{lineno}", "query-id")
        did = check_id(cols[1].strip(), f"{path}:{lineno}", "corpus-id")
        grade = parse_int(cols[2].strip(), f"{path}:{lineno}", "relevance score")
        judged = qrels.setdefault(qid, {})
        judged[did] = max(grade, judged.get(did, grade))
    return qrels


@SOURCES.register("beir", schema=BeirConfig)
def build(cfg: BeirConfig, seed: int, splits: tuple[str, ...] | None = None) -> IRDataset:
    """Read the corpus, the queries and the qrels of the splits in `splits` (None: every split).

    The others come back empty; the training qrels are also read when a missing dev file is derived from them.
    """
    used = ("train", "val", "test") if splits is None else splits
    folder = resolve_path(
        cfg.path, "path", "BEIR dataset folder (corpus.jsonl, queries.jsonl, qrels/)", must_be_dir=True
    )
    corpus = _find(folder, "corpus.jsonl")
    if corpus is None:
        raise InputError("data.path", f"'{folder}' has no corpus.jsonl; expected a BEIR dataset folder")
    qfile = _find(folder, "queries.jsonl")
    if qfile is None:
        raise InputError("data.path", f"'{folder}' has no queries.jsonl; expected a BEIR dataset folder")
    # the test split's qrels, when this job reads it, are found before the corpus's store is built (a cache written);
    # a missing train or dev file leaves its split empty (many BEIR sets have test.tsv only), as IRDataset reports
    test = _find(folder / "qrels", f"{cfg.test_split}.tsv")
    if "test" in used and test is None:
        there = sorted(p.name for p in (folder / "qrels").glob("*.tsv*")) if (folder / "qrels").is_dir() else []
        raise InputError(
            "config key 'data.test_split'",
            f"is {cfg.test_split!r}, but '{folder / 'qrels' / cfg.test_split}.tsv' does not exist (qrels/ holds "
            f"{there or 'nothing'}); expected the qrels of the split evaluated",
        )
    # the files read after the store (queries, the used splits' qrels) hold a line, or are refused with their readers'
    # message before the store is built
    dev_missing = _find(folder / "qrels", f"{cfg.val_split}.tsv") is None
    qrels_found = {  # of the splits read: the used ones, and train when a missing dev file is derived from it
        split: _find(folder / "qrels", f"{getattr(cfg, key)}.tsv")
        for split, key in (("train", "train_split"), ("val", "val_split"), ("test", "test_split"))
        if split in used or (split == "train" and "val" in used and dev_missing)
    }
    check_not_empty(qfile, JSONL_EXPECTED)
    for f in qrels_found.values():
        if f is not None:
            check_not_empty(f, rows_expected(QRELS_COLUMNS))
    docs = open_store(
        cfg.cache_dir,
        fingerprint("beir-corpus", [corpus], cache_dir=cfg.cache_dir, use_title=bool(cfg.use_title)),
        lambda: iter_corpus(corpus, cfg.use_title),
        origin=str(corpus),
        kind="corpus _id",
    )
    queries = read_queries(qfile)

    qrels_by_split: dict[str, dict[str, dict[str, int]] | None] = {
        split: read_beir_qrels(f) if (f := qrels_found.get(split)) is not None else None
        for split in ("train", "val", "test")
    }
    qrels_files = {split: str(f) for split, f in qrels_found.items() if f is not None}

    if dev_missing and qrels_by_split["train"]:
        train = qrels_by_split["train"]
        qids = sorted(train)
        frac = float(cfg.val_fraction)
        n_val = int(round(frac * len(qids))) if frac < 1 else int(frac)
        n_val = min(max(n_val, 1 if frac > 0 else 0), max(len(qids) - 1, 0))
        chosen = set(np.asarray(qids)[np.random.default_rng(cfg.split_seed).permutation(len(qids))[:n_val]].tolist())
        qrels_by_split["val"] = {q: train[q] for q in qids if q in chosen}
        qrels_by_split["train"] = {q: train[q] for q in train if q not in chosen}
        qrels_files["val"] = qrels_files["train"]

    read: dict[str, Split] = {}
    for split, qrels in qrels_by_split.items():
        if split not in used:
            read[split] = Split()
            continue
        qrels = qrels or {}
        # queries judged in this split; a qrels id missing from queries.jsonl is reported by IRDataset.validate()
        split_queries = {q: queries[q] for q in qrels if q in queries}
        read[split] = Split(queries=split_queries, qrels=qrels, origins={"queries": str(qfile)})
        if split in qrels_files:
            read[split].origins["qrels"] = qrels_files[split]
    return IRDataset(name=f"beir:{folder.name}", docs=docs, splits=read, docs_origin=str(corpus))
