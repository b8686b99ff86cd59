"""Ranking effectiveness with trec_eval semantics, through pytrec_eval, plus a DDP-safe run accumulator.

Conventions (the same as ``trec_eval -c -l <relevance_level>``):

- **Graded qrels.** A document is relevant when its grade >= ``relevance_level`` (default 1, trec_eval's
  ``-l``). nDCG uses the grade itself as the gain and log2(rank + 1) as the discount (trec_eval's ndcg, not
  the 2^rel - 1 variant); the ideal DCG is taken over all judged documents of the query.
- **Ranking and ties.** Documents are ranked by score, descending; equal scores are broken by docid,
  descending (byte order), which is trec_eval's rule. trec_eval stores scores as C ``float``: scores equal
  after rounding to float32 tie even if their float64 values differ. pytrec_eval applies all this
  internally, and the ``mrr_K`` cut below (``rank_documents``) applies the same order before cutting, so a
  tie straddling rank K is resolved the way trec_eval would resolve it.
- **Which queries count.** Means are taken over every query of the qrels with at least one relevant
  document. A query of that set that is absent from the run (or has no documents in it) scores 0 on every
  measure (trec_eval ``-c``). pytrec_eval itself only evaluates queries present in both, so the zeros are
  added here. Queries of the run without qrels, and qrels queries with no relevant document, are ignored
  (they are not in ``per_query`` either).

Measure names (the keys of the results are exactly the names asked for):

- ``P_K``, ``recall_K``, ``ndcg_cut_K``, ``map_cut_K``, ``success_K``: trec_eval's measure at cutoff K;
- ``map``, ``recip_rank``, ``ndcg``, ``Rprec``, ``bpref``: trec_eval's measure over the whole run
  (``recip_rank`` is *not* cut: 1/rank of the first relevant document, wherever it is);
- ``mrr_K`` (e.g. ``mrr_10``, MS MARCO's MRR@10): trec_eval's ``recip_rank`` on the run truncated to each
  query's top K, i.e. 0 when no relevant document is in the top K. trec_eval has no such measure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pytrec_eval
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from core.errors import InputError

__all__ = ["DEFAULT_MEASURES", "check_measures", "evaluate_run", "rank_documents", "truncate_run", "RetrievalRun"]

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

# The measures of every run unless `eval.measures` says otherwise (configs/config.yaml shows the same list).
DEFAULT_MEASURES: tuple[str, ...] = ("ndcg_cut_10", "ndcg_cut_20", "P_20", "mrr_10", "recall_100")

_CUT_MEASURES = ("P", "recall", "ndcg_cut", "map_cut", "success")
_PLAIN_MEASURES = ("map", "recip_rank", "ndcg", "Rprec", "bpref")
_NAME = re.compile(r"^(?P<base>[A-Za-z_]+?)_(?P<k>[0-9]+)$")


def _parse_measure(name: str, where: str = "measures") -> tuple[str, str, int | None]:
    """Name -> (kind, pytrec_eval measure, cutoff); kind is 'trec' or 'mrr'. `where` names the source in errors."""
    if name in _PLAIN_MEASURES:
        return "trec", name, None
    m = _NAME.match(name)
    if m and int(m["k"]) >= 1:
        base, k = m["base"], int(m["k"])
        if base in _CUT_MEASURES:
            return "trec", f"{base}.{k}", k
        if base == "mrr":
            return "mrr", "recip_rank", k
    raise InputError(
        where,
        f"unknown measure {name!r}; expected one of {list(_PLAIN_MEASURES)}, "
        f"{[b + '_K' for b in _CUT_MEASURES]} or 'mrr_K' (K a positive int)",
    )


def check_measures(names: Iterable[str], where: str = "measures") -> None:
    """Check that every name is a measure `evaluate_run` computes; raise InputError naming `where` otherwise.

    >>> check_measures(["ndcg_cut_10", "mrr_10", "map"])
    >>> check_measures(["ndcg@10"], "config key 'eval.measures'")
    Traceback (most recent call last):
    ...
    core.errors.InputError: config key 'eval.measures': unknown measure 'ndcg@10'; expected one of ['map', ...
    """
    for name in names:
        _parse_measure(str(name), where)


def rank_documents(docs: Mapping[str, float]) -> list[tuple[str, float]]:
    """One query's (docid, score) pairs in trec_eval order: score descending, then docid descending.

    trec_eval keeps scores as C ``float``, so two scores that round to the same float32 tie (and are ordered
    by docid) even when their float64 values differ; the order here does the same. Scores are returned as
    given (float64).
    """
    items = [(str(d), float(s)) for d, s in docs.items()]
    with np.errstate(over="ignore"):
        keys = np.asarray([s for _, s in items], dtype=np.float64).astype(np.float32).astype(np.float64).tolist()
    order = sorted(range(len(items)), key=lambda i: (keys[i], items[i][0]), reverse=True)
    return [items[i] for i in order]


def truncate_run(run: Run, k: int) -> dict[str, dict[str, float]]:
    """Each query's top k documents in trec_eval order (ties at the cut resolved by docid, descending)."""
    return {qid: dict(rank_documents(docs)[:k]) for qid, docs in run.items()}


def _clean_run(run: Run, keep: set[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for qid, docs in run.items():
        qid = str(qid)
        if qid not in keep or not docs:
            continue
        clean = {}
        for docid, score in docs.items():
            score = float(score)
            if not math.isfinite(score):
                raise InputError("run", f"query {qid!r}, document {docid!r}: score {score} is not finite")
            clean[str(docid)] = score
        out[qid] = clean
    return out


def _clean_qrels(qrels: Qrels, relevance_level: int) -> dict[str, dict[str, int]]:
    """Return the qrels of the queries with at least one relevant document, grades as ints."""
    out = {}
    for qid, docs in qrels.items():
        grades = {}
        for docid, rel in docs.items():
            if isinstance(rel, float) and not rel.is_integer():
                raise InputError("qrels", f"query {qid!r}, document {docid!r}: grade {rel} is not an integer")
            grades[str(docid)] = int(rel)
        if any(g >= relevance_level for g in grades.values()):
            out[str(qid)] = grades
    return out


def evaluate_run(
    run: Run,
    qrels: Qrels,
    measures: Iterable[str] = DEFAULT_MEASURES,
    relevance_level: int = 1,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """trec_eval ``-c`` measures of ``run`` ({qid: {docid: score}}) against graded ``qrels``.

    Returns (means, per_query): ``means[measure]`` is the mean over the qrels queries with at least one
    relevant document, and ``per_query[qid][measure]`` the value for each of them (0 for queries the run
    lacks). See the module docstring for the measure names and conventions.
    """
    measures = list(dict.fromkeys([measures] if isinstance(measures, str) else measures))
    if not measures:
        raise InputError("measures", "no measure requested")
    parsed = {name: _parse_measure(name) for name in measures}
    qrels_c = _clean_qrels(qrels, relevance_level)
    if not qrels_c:
        raise InputError("qrels", f"no query has a document with relevance >= {relevance_level}; nothing to evaluate")
    run_c = _clean_run(run, set(qrels_c))

    per_query: dict[str, dict[str, float]] = {qid: dict.fromkeys(measures, 0.0) for qid in sorted(qrels_c)}
    trec = {name: spec for name, (kind, spec, _) in parsed.items() if kind == "trec"}
    if trec and run_c:
        evaluator = pytrec_eval.RelevanceEvaluator(qrels_c, set(trec.values()), relevance_level=relevance_level)
        for qid, values in evaluator.evaluate(run_c).items():
            for name, spec in trec.items():
                per_query[qid][name] = float(values[spec.replace(".", "_")])
    mrr = {name: k for name, (kind, _, k) in parsed.items() if kind == "mrr"}
    if mrr and run_c:
        evaluator = pytrec_eval.RelevanceEvaluator(qrels_c, {"recip_rank"}, relevance_level=relevance_level)
        for k in sorted(set(mrr.values())):
            for qid, values in evaluator.evaluate(truncate_run(run_c, k)).items():
                for name in (n for n, cut in mrr.items() if cut == k):
                    per_query[qid][name] = float(values["recip_rank"])

    n = len(per_query)
    means = {name: math.fsum(q[name] for q in per_query.values()) / n for name in measures}
    return means, per_query


class RetrievalRun(Metric):
    """Accumulates (query index, document index, score) triples; under DDP ``compute`` gathers every rank's.

    States are lists reduced with ``"cat"``, so no special code is needed for DDP. A padded
    DistributedSampler repeats a few samples to even out the ranks, so the gathered triples can contain the
    same (query, document) pair more than once: ``compute`` keeps one triple per pair, with the highest of
    its scores (order-independent; the copies differ at most by floating-point noise). Scores are stored as
    float32 (float64 if given as float64), indices as int64.

    ``to_run(qids, docids)`` maps indices back to string ids (``qids[qidx]``, ``docids[didx]``) and
    ``evaluate(qids, docids, qrels, measures)`` returns ``evaluate_run``'s (means, per_query) for the run.
    As with any torchmetrics state that starts empty, every rank must call ``update`` at least once before a
    synced ``compute`` (a DistributedSampler guarantees it); an update with empty tensors counts (a rank with an
    empty evaluation shard makes one: lightning_modules/module.py).
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("qidx", default=[], dist_reduce_fx="cat")
        self.add_state("didx", default=[], dist_reduce_fx="cat")
        self.add_state("scores", default=[], dist_reduce_fx="cat")

    def update(self, qidx: Tensor, didx: Tensor, scores: Tensor) -> None:
        """Append a batch of (query index, document index, score) triples: three equal-size tensors of any shape."""
        qidx, didx, scores = (torch.as_tensor(t).detach().reshape(-1) for t in (qidx, didx, scores))
        if not (qidx.numel() == didx.numel() == scores.numel()):
            raise ValueError(
                "RetrievalRun.update: qidx, didx and scores differ in size "
                f"({qidx.numel()}, {didx.numel()}, {scores.numel()})"
            )
        if qidx.is_floating_point() or didx.is_floating_point():
            raise ValueError("RetrievalRun.update: qidx and didx must be integer tensors")
        if scores.dtype != torch.float64:
            scores = scores.to(torch.float32)
        self.qidx.append(qidx.long())
        self.didx.append(didx.long())
        self.scores.append(scores)

    def compute(self) -> tuple[Tensor, Tensor, Tensor]:
        """(qidx, didx, scores), one triple per distinct (qidx, didx) pair, sorted by (qidx, didx)."""
        if isinstance(self.qidx, list) and not self.qidx:
            empty = torch.zeros(0, dtype=torch.long, device=self.device)
            return empty, empty.clone(), torch.zeros(0, dtype=torch.float32, device=self.device)
        qidx = dim_zero_cat(self.qidx).long()
        didx = dim_zero_cat(self.didx).long()
        scores = dim_zero_cat(self.scores)
        pairs, inverse = torch.unique(torch.stack([qidx, didx], dim=1), dim=0, return_inverse=True)
        best = torch.full((pairs.shape[0],), -math.inf, dtype=scores.dtype, device=scores.device)
        best = best.scatter_reduce(0, inverse, scores, reduce="amax", include_self=True)
        return pairs[:, 0], pairs[:, 1], best

    def to_run(self, qid_list: Sequence[str], docid_list: Sequence[str]) -> dict[str, dict[str, float]]:
        """{qid: {docid: score}} with ``qid_list[qidx]`` and ``docid_list[didx]``."""
        # compute() results with one element come back 0-dim (torchmetrics squeezes them): reshape.
        qidx, didx, scores = (t.reshape(-1).tolist() for t in self.compute())
        for name, idx, ids in (("query", qidx, qid_list), ("document", didx, docid_list)):
            if idx and (min(idx) < 0 or max(idx) >= len(ids)):
                bad = min(idx) if min(idx) < 0 else max(idx)
                raise ValueError(f"RetrievalRun.to_run: {name} index {bad} is outside the {len(ids)} ids given")
        run: dict[str, dict[str, float]] = {}
        for q, d, s in zip(qidx, didx, scores):
            run.setdefault(str(qid_list[q]), {})[str(docid_list[d])] = s
        return run

    def evaluate(
        self,
        qid_list: Sequence[str],
        docid_list: Sequence[str],
        qrels: Qrels,
        measures: Iterable[str] = DEFAULT_MEASURES,
        relevance_level: int = 1,
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """``evaluate_run(self.to_run(qid_list, docid_list), qrels, measures, relevance_level)``."""
        return evaluate_run(self.to_run(qid_list, docid_list), qrels, measures, relevance_level)
