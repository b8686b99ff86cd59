"""Metrics: isotropy (I(W), avgcos), IR effectiveness with trec_eval semantics, TREC run files."""

from metrics.ir import (
    DEFAULT_MEASURES,
    RetrievalRun,
    evaluate_run,
    rank_documents,
    truncate_run,
)
from metrics.isotropy import AvgCos, IsotropyIW, avg_cos, isotropy_iw
from metrics.trec import write_trec_run

__all__ = [
    "AvgCos",
    "DEFAULT_MEASURES",
    "IsotropyIW",
    "RetrievalRun",
    "avg_cos",
    "evaluate_run",
    "isotropy_iw",
    "rank_documents",
    "truncate_run",
    "write_trec_run",
]
