"""The re-ranking depth chosen on validation (`eval.rerank_depths`), as the position-bias paper does.

Section 3 of the paper: "The re-ranking depth for each model instance is tuned on the best mean nDCG@10 of the
validation set, as part of an early stopping strategy. For MS MARCO we evaluate a re-ranking depth until 1000 and for
SQuAD up to 100".

Re-ranking at depth d means scoring the first-stage top d of each query and ranking only those. A split is scored
once, at its full candidate depth (`data.candidate_depth`, which must be at least the largest depth listed), and the
run at depth d is that run cut to each query's first d candidates in first-stage order (`truncate`): the scores of a
pair do not depend on the other candidates, so this equals scoring at depth d, at one scoring's cost.

- Validation (`RankingModule`, every validation): the split's run is evaluated at every listed depth and the depth
  with the best mean nDCG@10 (`SELECT_BY`) is kept, the smallest one on a tie (the cheaper re-ranking); the
  validation's measures are those of the chosen depth, and `val/rerank_depth` is logged beside them. The monitored
  `val/ndcg_cut_10` is then the best over the depths, so checkpoint and depth are chosen together: the paper's
  "as part of an early stopping strategy".
- Test: the depth chosen at the validation of the tested checkpoint (saved in every checkpoint) cuts the test run;
  metrics.json holds it as `rerank_depth`. evaluate.py on such a checkpoint (e.g. a grid's rotated test) applies the
  same depth when its config lists depths.

Candidates in first-stage order are an `EvalSplit`'s pairs: queries in order, each query's candidates in their given
(BM25 or given run) order; with passages (`unit_doc`), a document's rank is its first passage's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from metrics.ir import evaluate_run

__all__ = ["SELECT_BY", "candidate_ranks", "choose_depth", "truncate"]

SELECT_BY = "ndcg_cut_10"  # the paper's "best mean nDCG@10 of the validation set"

Run = Mapping[str, Mapping[str, float]]


def candidate_ranks(
    qids: Sequence[str], doc_ids: Sequence[str], pairs: np.ndarray, unit_doc: np.ndarray | None = None
) -> dict[str, dict[str, int]]:
    """Return {qid: {docid: 0-based first-stage rank}} of an evaluation split's (qidx, unit) `pairs`.

    The pairs are given in first-stage order per query; `unit_doc` maps passage units to their document (None: the
    units are the documents).
    """
    ranks: dict[str, dict[str, int]] = {}
    for qi, unit in np.asarray(pairs, dtype=np.int64).reshape(-1, 2).tolist():
        doc = doc_ids[int(unit_doc[unit]) if unit_doc is not None else unit]
        mine = ranks.setdefault(qids[qi], {})
        mine.setdefault(doc, len(mine))
    return ranks


def truncate(run: Run, ranks: Mapping[str, Mapping[str, int]], depth: int) -> dict[str, dict[str, float]]:
    """Cut `run` to each query's first `depth` candidates.

    A pair without a first-stage rank is dropped (it was not a candidate at any depth).
    """
    out: dict[str, dict[str, float]] = {}
    for qid, docs in run.items():
        rank = ranks.get(qid, {})
        kept = {d: s for d, s in docs.items() if rank.get(d, depth) < depth}
        if kept:
            out[qid] = kept
    return out


def choose_depth(
    run: Run, qrels: Mapping[str, Mapping[str, int]], ranks: Mapping[str, Mapping[str, int]], depths: Sequence[int]
) -> tuple[int, dict[int, float]]:
    """Return (the depth with the best mean `SELECT_BY`, the smallest on a tie; {depth: its mean}) over `depths`."""
    if not depths:
        raise ValueError("choose_depth needs at least one depth")
    by_depth = {
        int(d): evaluate_run(truncate(run, ranks, int(d)), qrels, [SELECT_BY])[0][SELECT_BY]
        for d in sorted(set(depths))
    }
    best = max(by_depth.values())
    return min(d for d, v in by_depth.items() if v == best), by_depth
