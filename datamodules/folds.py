"""k-fold cross-validation over the judged queries of a collection (`data.num_folds`, `data.fold`, `data.fold_seed`).

Small collections (Cranfield, Vaswani, CISI, CACM) have no predefined splits, and one fixed train/val/test split
of 50-200 queries gives noisy comparisons. With `data.num_folds=k`, the judged queries of ALL splits the source
produced are pooled and dealt into k folds; run f (`data.fold=f`, 0 <= f < k) then uses

    test = fold f,   val = fold (f + 1) % k,   train = the other k - 2 folds

(k = 5: 3 train / 1 val / 1 test folds, as in the isotropy and DGRe papers). Over f = 0..k-1 every judged query is
in exactly one test fold, so the per-query results of the k runs cover the whole query set once.

Assignment (deterministic, independent of the run seed and of the process: no Python `hash()`): every query gets
the key sha256(f"{fold_seed}|{qid}"); queries in key order are dealt round-robin to folds 0, 1, ..., k-1, 0, ...
(fold sizes differ by at most one). The key of a query does not depend on the other queries, so adding or removing
a query moves few others. Which split the source had put a query in plays no part.

Grouped folds: for SQuAD, whose source splits by article so that no paragraph is relevant in two splits, the unit
dealt is the article (of the query's relevant paragraph, doc id `<article>-<paragraph>`): groups in key order go
to the fold with the fewest queries so far (ties: the lowest fold), so folds stay article-disjoint and about even.

Only sources that give neither training triples nor candidate lists can be re-split this way (classic
collections, synthetic, squad, and tsv/beir folders without triples or runs): triples and runs are tied to their
own split's queries. Such a source with `data.num_folds` set stops with an InputError naming `data.num_folds`.
Queries without any relevant document are left out (they give no training signal and no test score).

What the source does before pooling still applies (SQuAD's `max_questions_per_split` caps each of its own splits
first), and so does what the data module does after (`data.max_eval_queries` samples the val/test folds with the
run seed, or with `data.eval_sample_seed` when set): leave `max_eval_queries` null for every query to be tested
exactly once over the k runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from core.errors import InputError
from datamodules.corpus import SPLITS, IRDataset, Split

FOLD_SEED = 13  # data.fold_seed's default

__all__ = [
    "check_fold_config",
    "fold_key",
    "assign_folds",
    "fold_roles",
    "query_groups",
    "pooled_queries",
    "apply_folds",
]


def check_fold_config(cfg) -> int | None:
    """Validate `data.num_folds` / `data.fold` / `data.fold_seed`; returns num_folds (None: folds off)."""
    k = getattr(cfg, "num_folds", None)
    fold = getattr(cfg, "fold", 0)
    if k is None:
        if fold not in (0, None):
            raise InputError(
                "data.fold", f"is {fold} but data.num_folds is null; set data.num_folds=K (e.g. 5) to cross-validate"
            )
        seed = getattr(cfg, "fold_seed", FOLD_SEED)
        if seed != FOLD_SEED:  # it assigns queries to folds: without folds it would be silently unused
            raise InputError(
                "data.fold_seed",
                f"is {seed} but data.num_folds is null (the source's own splits); set data.num_folds=K to "
                f"cross-validate or leave it at {FOLD_SEED}",
            )
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 3:
        raise InputError(
            "data.num_folds",
            f"is {k}; expected an integer >= 3 (folds for test, val and at least one for training) or null",
        )
    if isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < k:
        raise InputError("data.fold", f"is {fold}; expected an integer in 0..{k - 1} (data.num_folds={k})")
    seed = getattr(cfg, "fold_seed", FOLD_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError("data.fold_seed", f"is {seed!r}; expected an integer")
    return k


def fold_key(seed: int, item: str) -> bytes:
    """Sort key of a query (or group) under `fold_seed`: stable across processes, platforms and Python versions."""
    return hashlib.sha256(f"{int(seed)}|{item}".encode()).digest()


def assign_folds(
    qids: Iterable[str], num_folds: int, seed: int, groups: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Qid -> fold in 0..num_folds-1.

    Without `groups`: queries in `fold_key` order dealt round-robin (fold sizes differ by at most one). With
    `groups` (qid -> group id): whole groups in `fold_key` order, each to the fold with the fewest queries so far
    (ties: lowest fold index), so the queries of a group share a fold.
    """
    qids = sorted(set(qids))
    if groups is None:
        order = sorted(qids, key=lambda q: fold_key(seed, q))
        return {q: i % num_folds for i, q in enumerate(order)}
    members: dict[str, list[str]] = {}
    for q in qids:
        members.setdefault(str(groups.get(q, q)), []).append(q)
    sizes = [0] * num_folds
    out: dict[str, int] = {}
    for g in sorted(members, key=lambda g: fold_key(seed, g)):
        f = min(range(num_folds), key=lambda i: (sizes[i], i))
        sizes[f] += len(members[g])
        out.update(dict.fromkeys(members[g], f))
    return out


def fold_roles(fold: int, num_folds: int) -> dict[str, list[int]]:
    """{"train": [...], "val": [(fold + 1) % k], "test": [fold]}."""
    val = (fold + 1) % num_folds
    return {"train": [i for i in range(num_folds) if i not in (fold, val)], "val": [val], "test": [fold]}


def _natural(q: str):
    return (0, int(q), q) if q.isdigit() else (1, 0, q)


def pooled_queries(ds: IRDataset) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Return (queries, qrels) of every query with a relevant document, over all splits.

    A query id in two splits must have the same text and judgements there (else there is no single query to assign).
    """
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    seen_in: dict[str, str] = {}
    for name, split in ds.splits.items():
        for qid, judged in split.qrels.items():
            if not any(g > 0 for g in judged.values()) or qid not in split.queries:
                continue
            if qid in queries and (queries[qid] != split.queries[qid] or qrels[qid] != judged):
                raise InputError(
                    "data.num_folds",
                    f"dataset {ds.name}: query '{qid}' is in splits {seen_in[qid]} and {name} "
                    "with different text or judgements; folds need each query once",
                )
            queries[qid] = split.queries[qid]
            qrels[qid] = dict(judged)
            seen_in.setdefault(qid, name)
    return queries, qrels


def query_groups(ds: IRDataset, qrels: Mapping[str, Mapping[str, int]]) -> dict[str, str] | None:
    """Return qid -> group that must stay in one fold, or None (every query on its own).

    A dataset that groups its documents (`IRDataset.doc_group`; SQuAD: by article) puts each query in the group of
    its first relevant document, so no document is relevant in two folds (SQuAD: as its own split by article).
    """
    if ds.doc_group is None:
        return None
    groups = {}
    for qid, judged in qrels.items():
        rel = sorted(d for d, g in judged.items() if g > 0)
        groups[qid] = ds.doc_group(rel[0])
    return groups


def apply_folds(ds: IRDataset, num_folds: int, fold: int, seed: int, source: str = "") -> IRDataset:
    """Return `ds` with its splits rebuilt from fold `fold` of `num_folds` (see the module docstring).

    Docs and answers are kept. Raises InputError naming data.num_folds when a split carries triples or candidates.
    """
    source = source or ds.name
    for name, split in ds.splits.items():
        for what, value in (("training triples", split.triples), ("candidate lists", split.candidates)):
            if value is not None:
                raise InputError(
                    "data.num_folds",
                    f"is {num_folds} but source '{source}' gives {what} (split {name}), "
                    "which belong to its own splits; "
                    "folds only re-split sources without triples and candidate lists (cranfield, vaswani, cisi, cacm, "
                    "synthetic, squad); set data.num_folds=null",
                )
    queries, qrels = pooled_queries(ds)
    groups = query_groups(ds, qrels)
    units = len(set(groups.values())) if groups else len(queries)
    if units < num_folds:
        what = "articles" if groups else "judged queries"
        raise InputError(
            "data.num_folds",
            f"is {num_folds} but dataset {ds.name} has only {units} {what}; expected at most {units} folds",
        )
    assignment = assign_folds(queries, num_folds, seed, groups)
    roles = fold_roles(fold, num_folds)
    splits: dict[str, Split] = {}
    for name in SPLITS:
        wanted = set(roles[name])
        qids = sorted((q for q, f in assignment.items() if f in wanted), key=_natural)
        splits[name] = Split(queries={q: queries[q] for q in qids}, qrels={q: dict(qrels[q]) for q in qids})
    return IRDataset(
        name=ds.name,
        docs=ds.docs,
        splits=splits,
        answers=dict(ds.answers),
        docs_origin=ds.docs_origin,
        doc_group=ds.doc_group,
    )
