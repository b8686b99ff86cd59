"""TREC run files: one line per retrieved document, ``qid Q0 docid rank score tag``.

``write_trec_run`` orders each query's documents the way trec_eval ranks them (score descending, ties broken
by docid descending), so the rank column agrees with what trec_eval computes from the scores. Queries are
written in sorted qid order; scores with ``repr`` of the float, which reads back to the same float64.
The file is written atomically (``core.io.atomic_open``): a crash leaves the old file or none. Runs are read by
``datamodules.textfiles.read_trec_run`` (one reader for candidate lists and runs read back).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from core.errors import InputError
from core.io import atomic_open
from metrics.ir import rank_documents

__all__ = ["write_trec_run"]


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
