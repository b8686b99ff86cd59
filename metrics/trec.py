"""TREC run files: one line per retrieved document, ``qid Q0 docid rank score tag``.

``write_trec_run`` orders each query's documents the way trec_eval ranks them (score descending, ties broken
by docid descending), so the rank column agrees with what trec_eval computes from the scores. Queries are
written in sorted qid order; scores with ``repr`` of the float, which reads back to the same float64.
The file is written atomically (``core.io.atomic_open``): a crash leaves the old file or none.
"""
from __future__ import annotations

import math
import os
from typing import Mapping

from core.errors import InputError
from core.io import atomic_open
from metrics.ir import rank_documents

__all__ = ["write_trec_run", "read_trec_run"]


def _check_token(value: str, what: str) -> str:
    value = str(value)
    if not value or any(c.isspace() for c in value):
        raise InputError("run", f"{what} {value!r} must be non-empty and contain no whitespace (TREC format)")
    return value


def write_trec_run(path: str | os.PathLike, run: Mapping[str, Mapping[str, float]], tag: str) -> None:
    """Write ``run`` ({qid: {docid: score}}) to ``path`` in TREC format with run tag ``tag``.

    Ranks start at 1. Queries with no documents produce no lines. Scores must be finite.
    """
    tag = _check_token(tag, "run tag")
    lines = []
    queries = sorted(((str(q), docs) for q, docs in run.items()), key=lambda qd: qd[0])
    for i, (qid, docs) in enumerate(queries):
        _check_token(qid, "query id")
        if i and queries[i - 1][0] == qid:
            raise InputError("run", f"query id {qid!r} appears twice")
        for rank, (docid, score) in enumerate(rank_documents(docs), start=1):
            _check_token(docid, f"query {qid!r}: document id")
            if not math.isfinite(score):
                raise InputError("run", f"query {qid!r}, document {docid!r}: score {score} is not finite")
            lines.append(f"{qid} Q0 {docid} {rank} {score!r} {tag}\n")
    with atomic_open(path) as f:
        f.writelines(lines)


def read_trec_run(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Read a TREC run file into {qid: {docid: score}}. The Q0 and rank columns are not used (trec_eval
    ranks by score too); blank lines are skipped; a document listed twice for a query is an error, as in
    trec_eval."""
    run: dict[str, dict[str, float]] = {}
    try:
        # utf-8-sig: a byte-order mark (Excel, Windows tools) must not become part of the first qid
        f = open(path, encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(str(path), "no such TREC run file") from None
    with f:
        for lineno, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            where = f"{path}:{lineno}"
            if len(fields) != 6:
                raise InputError(where, f"expected 6 fields 'qid Q0 docid rank score tag', got {len(fields)}")
            qid, _, docid, _, score_text, _ = fields
            try:
                score = float(score_text)
            except ValueError:
                raise InputError(where, f"score {score_text!r} is not a number") from None
            if not math.isfinite(score):
                raise InputError(where, f"score {score_text!r} is not finite")
            docs = run.setdefault(qid, {})
            if docid in docs:
                raise InputError(where, f"document {docid!r} listed twice for query {qid!r}")
            docs[docid] = score
    return run
