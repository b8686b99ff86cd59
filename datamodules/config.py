"""Keys shared by every data source (`configs/data/*.yaml`). Each source subclasses `DataConfig` with the
keys of its own files, so an unknown or misspelt key is an error for that source."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import InputError, check_choice


@dataclass
class DataConfig:
    source: str = "synthetic"
    batch_size: int = 16  # training triplets per optimiser step and rank
    # Evaluation step size: distinct passages for bi-encoders (each encoded once however many queries list it),
    # (query, passage) pairs for cross-encoders.
    eval_batch_size: int = 64
    num_workers: int = 0
    # When a split has no training triplets: negatives sampled from each query's BM25 candidates ("bm25") or
    # uniformly from the collection ("random"); "given" demands triplets from the source.
    negatives: str = "bm25"
    # When a split has no candidate lists: re-rank the BM25 top-k (bm25s) of each query.
    candidate_depth: int = 100
    max_train_triples: int | None = None
    max_eval_queries: int | None = None
    # Rotation debiasing (position-bias paper Eq. 7), separately for training and evaluation passages.
    rotate_train: bool = False
    rotate_eval: bool = False
    cache_dir: str = ".cache"
    # k-fold cross-validation over the judged queries of all splits (datamodules/folds.py), for sources without
    # training triples and candidate lists: test = fold `fold`, val = fold (fold + 1) % num_folds, train = the rest.
    # null = the source's own splits. `fold_seed` fixes the assignment (independent of the run seed).
    num_folds: int | None = None
    fold: int = 0
    fold_seed: int = 13
    # Position-biased training split (datamodules/answer_bias.py), for sources with answer spans: keep the training
    # questions whose answers start in the first `answer_bias_keep_first` fraction of the passage's words (null =
    # off); a question answered later is kept with probability `answer_bias_late_keep` (0 = a hard filter), drawn
    # per question from `answer_bias_seed` (independent of the run seed, so every seed trains on the same subset).
    answer_bias_keep_first: float | None = None
    answer_bias_late_keep: float = 0.0
    answer_bias_seed: int = 13

    def __post_init__(self):
        check_choice("data.negatives", self.negatives, ("bm25", "random", "given"))
        check_answer_bias(self)


def check_answer_bias(cfg: DataConfig) -> None:
    """The answer-bias keys are in range (k in (0, 1], a keep probability in [0, 1]); run at composition time, so a
    bad value stops the run before any data is read."""
    k = cfg.answer_bias_keep_first
    if k is not None and not 0 < k <= 1:  # also rejects NaN
        raise InputError("config key 'data.answer_bias_keep_first'", f"is {k}; expected a fraction of the passage in (0, 1], or null (off)")
    if not 0 <= cfg.answer_bias_late_keep <= 1:
        raise InputError("config key 'data.answer_bias_late_keep'", f"is {cfg.answer_bias_late_keep}; expected a probability in [0, 1]")
    if k is None and cfg.answer_bias_late_keep:
        raise InputError("config key 'data.answer_bias_late_keep'", f"is {cfg.answer_bias_late_keep} but data.answer_bias_keep_first is null (no biased split); set both or neither")
