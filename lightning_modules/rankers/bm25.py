"""BM25 as a `model` choice: `python evaluate.py model=bm25 data=cranfield` and BM25 rows in experiment grids.

Not an nn.Module and nothing to train: the entry carries only the config schema, so `model=bm25` composes and is
validated like any ranker. `pipeline.run.evaluate` hands it to `retrieval.bm25.run_bm25` (full-collection
retrieval with bm25s over `model.split`, scored with trec_eval semantics); `train.py model=bm25` is an input error.

    python evaluate.py model=bm25 data=cranfield model.split=all model.depth=1000 output_dir=outputs/bm25-cranfield
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import InputError, check_choice
from core.ranges import COUNT, NON_NEGATIVE, PROBABILITY, check_ranges
from datamodules.bm25 import METHODS
from datamodules.corpus import SPLITS
from lightning_modules.rankers import RANKERS


@dataclass
class BM25Config:
    """`model: bm25`: the bm25s variant and parameters, the retrieval depth and whose queries are run."""

    name: str = "bm25"
    method: str = "lucene"  # bm25s variant (Kamphuis et al. 2020)
    k1: float = 1.5
    b: float = 0.75
    depth: int = 1000  # documents retrieved per query
    # whose queries: train | val | test (the split neural rankers are tested on, so rows compare) | all (every judged
    # query of every split, the usual setting for published BM25 figures on the classic collections)
    split: str = "test"

    def __post_init__(self):
        check_choice("model.method", self.method, METHODS)
        check_choice("model.split", self.split, (*SPLITS, "all"))
        check_ranges("model", self, k1=NON_NEGATIVE, b=PROBABILITY, depth=COUNT)


@RANKERS.register("bm25", schema=BM25Config)
def build(cfg: BM25Config):
    """Refuse to build BM25 as a neural ranker: it is evaluated by `evaluate.py`, never trained (module docstring)."""
    raise InputError(
        "model.name",
        "bm25 is not a neural ranker and has nothing to train; run `python evaluate.py model=bm25 data=...`",
    )
