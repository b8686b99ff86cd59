"""Keys shared by every data source (`configs/data/*.yaml`).

Each source subclasses `DataConfig` with the keys of its own files, so an unknown or misspelt key is an error for that
source.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import ClassVar

from core.errors import InputError, check_choice, check_unused
from core.ranges import COUNT, NON_NEGATIVE, SEED, check_ranges
from datamodules.folds import FOLD_SEED, check_fold_config
from datamodules.rotation import ROTATIONS

# Keys that change only what a run trains on, never its validation or test split: a test with data overrides that
# differ from a training run's in these keys alone is that run's own test (grid/engine.py runs it once).
TRAINING_ONLY = frozenset(
    {
        "batch_size",
        "negatives",
        "max_train_triples",
        "rotate_train",
        "rotation",
        "train_passage",
        "answer_bias_keep_first",
        "answer_bias_late_keep",
        "answer_bias_seed",
    }
)


PROJECT = "isorank"  # pyproject.toml's name: the folder of this project's caches in the user's cache directory


def default_cache_dir() -> str:
    """Return `data.cache_dir`'s default: `$XDG_CACHE_HOME/isorank`, else `~/.cache/isorank` (XDG base directories).

    Not a folder under the current one: every run of the user, from any folder, shares one document store, BM25 index
    and token cache per collection, and no command leaves a `.cache/` where it was run. Absolute, so config.yaml
    records where the run's caches are.
    """
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    # the spec: a relative XDG_CACHE_HOME is invalid and is ignored
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return str(root / PROJECT)


@dataclass
class DataConfig:
    """The `data` config group's keys common to every source, checked when the config is built.

    Each key's comment below says what it does. Construction validates choices and ranges, the fold keys
    (`check_fold_config`), the answer-bias keys (`check_answer_bias`) and the passage windows (`check_passages`), so a
    bad value raises InputError before any data is read.
    """

    # What the source can give: answer spans in its passages (`IRDataset.answers`, the position-bias paper's answer
    # positions and biased splits): True always, False never, None depending on the dataset (ir_datasets: QnA ones)
    # or not declared. A key or an analysis that needs them is refused from the config where a source never has them.
    answers: ClassVar[bool | None] = None

    source: str = "synthetic"
    batch_size: int = 16  # training triplets per optimiser step and rank
    # Evaluation step size: distinct passages for bi-encoders (each encoded once however many queries list it),
    # (query, passage) pairs for cross-encoders.
    eval_batch_size: int = 64
    # DataLoader worker processes per rank; null = chosen from the machine: none without a GPU (the model's own work
    # uses the cores, and a batch assembled from cached tokens costs about a millisecond), else one per core the rank
    # can spare, at most 8 (`datamodules.datamodule.loader_workers`).
    num_workers: int | None = None
    # Tokenise the run's passages and queries once, into `<cache_dir>/tokens/` (datamodules/token_cache.py), and
    # assemble each batch from the cached ids: the same batches as tokenising text per batch (false), without the
    # host's tokenising on every step. Passage windows and per-epoch rotation are tokenised per batch either way.
    pretokenize: bool = True
    # When a split has no training triplets: negatives sampled from each query's BM25 candidates ("bm25") or
    # uniformly from the collection ("random"); "given" demands triplets from the source.
    negatives: str = "bm25"
    # When a split has no candidate lists: re-rank the BM25 top-k (bm25s) of each query.
    candidate_depth: int = 100
    max_train_triples: int | None = None
    # At most this many judged queries per evaluation split, sampled from `eval_sample_seed`; null there = the run
    # seed (each seed tests its own sample), an integer = every seed tests the same queries (paired across seeds).
    max_eval_queries: int | None = None
    eval_sample_seed: int | None = None
    # Rotation debiasing (position-bias paper Eq. 7), separately for training and evaluation passages.
    rotate_train: bool = False
    rotate_eval: bool = False
    # Which cut (datamodules/rotation.py): "per_passage" = one seeded cut per passage, the same in training,
    # evaluation and every epoch (the paper's debiased data set, Sec. 4.2); "per_epoch" = training redraws the cut
    # every epoch and per triple (evaluation is cut per passage either way).
    rotation: str = "per_passage"
    # where collections' stores, BM25 indexes, token and triple caches are built once and shared by every run
    cache_dir: str = field(default_factory=default_cache_dir)
    # k-fold cross-validation over the judged queries of all splits (datamodules/folds.py), for sources without
    # training triples and candidate lists: test = fold `fold`, val = fold (fold + 1) % num_folds, train = the rest.
    # null = the source's own splits. `fold_seed` fixes the assignment (independent of the run seed).
    num_folds: int | None = None
    fold: int = 0
    fold_seed: int = FOLD_SEED
    # Position-biased training split (datamodules/answer_bias.py), for sources with answer spans: keep the training
    # questions whose answers start in the first `answer_bias_keep_first` fraction of the passage's words (null =
    # off); a question answered later is kept with probability `answer_bias_late_keep` (0 = a hard filter), drawn
    # per question from `answer_bias_seed` (independent of the run seed, so every seed trains on the same subset).
    answer_bias_keep_first: float | None = None
    answer_bias_late_keep: float = 0.0
    answer_bias_seed: int = 13
    # Long documents as passages (datamodules/passages.py; FirstP / MaxP, the BERT-MaxP baseline): windows of
    # `passage_words` words every `passage_stride` words (null: half the window); null = whole documents (cut at
    # model.doc_max_len tokens). Evaluation scores a document by its best passage (`doc_score: max`) or its first
    # (`first`); training takes one passage of each triplet document, drawn per epoch (`train_passage: random`,
    # every passage of a relevant document counts as relevant) or the first (`first`).
    passage_words: int | None = None
    passage_stride: int | None = None
    doc_score: str = "max"
    train_passage: str = "random"

    def split_keys(self) -> dict[str, frozenset[str]]:
        """Return the source's keys that only some splits' reading uses: key -> the splits any of which reads it.

        A job reads some splits only (an evaluation its test split, `load_dataset`'s `splits`); a key of a split it
        does not read changes nothing there (`split_keys_unread`). None here: a source whose one file holds every
        split (SQuAD, the classic collections, synthetic) reads all its keys whatever the split. Sources with a file
        or id per split (tsv, BEIR, ir_datasets) declare theirs.
        """
        return {}

    def __post_init__(self):
        check_choice("data.negatives", self.negatives, ("bm25", "random", "given"))
        check_choice("data.rotation", self.rotation, ROTATIONS)
        check_ranges(
            "data",
            self,
            batch_size=COUNT,
            eval_batch_size=COUNT,
            num_workers=NON_NEGATIVE,
            candidate_depth=COUNT,
            max_train_triples=COUNT,
            max_eval_queries=COUNT,
            eval_sample_seed=SEED,
            answer_bias_seed=SEED,
        )
        check_fold_config(self)
        check_answer_bias(self)
        check_passages(self)
        check_eval_sample(self)


def check_passages(cfg: DataConfig) -> None:
    """Window size and stride are positive, the stride at most the window (no word is skipped)."""
    check_choice("data.doc_score", cfg.doc_score, ("max", "first"))
    check_choice("data.train_passage", cfg.train_passage, ("random", "first"))
    size, stride = cfg.passage_words, cfg.passage_stride
    if size is None:
        if stride is not None:
            raise InputError(
                "config key 'data.passage_stride'",
                f"is {stride} but data.passage_words is null (whole documents); set both or neither",
            )
        # how a document's passages score or train means nothing without passages
        why = "data.passage_words is null (whole documents: each is its one passage)"
        check_unused("data", cfg, ("doc_score", "train_passage"), why, "set data.passage_words")
        return
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(
            "config key 'data.passage_words'", f"is {size!r}; expected a window of at least 1 word, or null"
        )
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= size):
        raise InputError(
            "config key 'data.passage_stride'",
            f"is {stride!r}; expected 1 <= stride <= data.passage_words ({size}), or null (half the window)",
        )


def passage_window(cfg: DataConfig) -> tuple[int, int] | None:
    """(size, stride) of the passage windows, or None for whole documents."""
    if cfg.passage_words is None:
        return None
    return int(cfg.passage_words), int(cfg.passage_stride or max(1, cfg.passage_words // 2))


def check_answer_bias(cfg: DataConfig) -> None:
    """Check that the answer-bias keys are in range (k in (0, 1], a keep probability in [0, 1]).

    Run at composition time, so a bad value stops the run before any data is read.
    """
    k = cfg.answer_bias_keep_first
    if k is not None and not 0 < k <= 1:  # also rejects NaN
        raise InputError(
            "config key 'data.answer_bias_keep_first'",
            f"is {k}; expected a fraction of the passage in (0, 1], or null (off)",
        )
    if not 0 <= cfg.answer_bias_late_keep <= 1:
        raise InputError(
            "config key 'data.answer_bias_late_keep'",
            f"is {cfg.answer_bias_late_keep}; expected a probability in [0, 1]",
        )
    if k is not None and type(cfg).answers is False:
        raise InputError(
            "config key 'data.answer_bias_keep_first'",
            f"is {k}, but data source '{cfg.source}' has no answer spans; a position-biased split needs a source "
            "with answers (squad, synthetic, ir_datasets with answer strings)",
        )
    if k is None and cfg.answer_bias_late_keep:
        raise InputError(
            "config key 'data.answer_bias_late_keep'",
            f"is {cfg.answer_bias_late_keep} but data.answer_bias_keep_first is null (no biased split); "
            "set both or neither",
        )
    # the seed draws which later-answered questions late_keep keeps: with no share to draw, it draws nothing
    if k is None:
        why = "data.answer_bias_keep_first is null (no biased split), so it draws nothing"
        check_unused(
            "data",
            cfg,
            ("answer_bias_seed",),
            why,
            "set data.answer_bias_keep_first and data.answer_bias_late_keep > 0",
        )
    elif not cfg.answer_bias_late_keep:
        why = "data.answer_bias_late_keep is 0 (a hard filter), so it draws nothing"
        check_unused("data", cfg, ("answer_bias_seed",), why, "set data.answer_bias_late_keep > 0")


def check_eval_sample(cfg: DataConfig) -> None:
    """`data.eval_sample_seed` draws the sample of `data.max_eval_queries`: without one it would be silently unused."""
    if cfg.max_eval_queries is None:
        why = "data.max_eval_queries is null (every judged query is tested, none sampled)"
        check_unused("data", cfg, ("eval_sample_seed",), why, "set data.max_eval_queries")


def split_settings(cfg: DataConfig, split: str) -> str:
    """Return `data.key=value` of the keys that decide what `split` holds, for the message of a split left empty.

    Those keys are its files or ids, counts and fractions, folds, sampling.
    """
    values = asdict(cfg) if is_dataclass(cfg) else dict(cfg)
    when_set = (
        "max_questions_per_split",
        "max_queries_per_split",
        "num_folds",
        "fold_ids",
        "pool_ids",
        *(("max_train_triples", "answer_bias_keep_first") if split == "train" else ("max_eval_queries",)),
    )

    def decides(key: str, value) -> bool:
        if key in when_set:
            return value is not None
        if key.startswith("max_") or key == "train_passage":
            return False
        if key.startswith(f"{split}_") or f"_{split}_" in key or key.endswith(("_fraction", "_articles")):
            return True  # shown even when null: an unset file or id is a common reason
        if key == "fold":
            return values.get("num_folds") is not None
        return key == "candidate_depth" and split != "train"

    return ", ".join(f"data.{k}={'null' if v is None else v}" for k, v in values.items() if decides(k, v))


def empty_split(cfg: DataConfig, split: str, problem: str) -> InputError:
    """Return the error for a split left with nothing to use: names the split and the settings that emptied it."""
    return InputError(
        f"data '{cfg.source}', split '{split}'", f"{problem}; check {split_settings(cfg, split) or 'the data source'}"
    )


def split_keys_unread(cfg: DataConfig, splits: tuple[str, ...] | None) -> dict[str, str]:
    """Return the data keys (`data.<key>`) that a job reading only `splits` (None: every split) never reads, with why.

    The keys `cfg.split_keys()` declares for splits other than those; none with `data.num_folds` set, since folds
    re-split the queries of every split, so every split is read (`load_dataset`).

    >>> from datamodules.sources.tsv import TsvConfig
    >>> sorted(split_keys_unread(TsvConfig(), ("test",)))[:3]
    ['data.train_qrels', 'data.train_queries', 'data.train_run']
    >>> split_keys_unread(TsvConfig(num_folds=5), ("test",))
    {}
    """
    if splits is None or cfg.num_folds is not None:
        return {}
    reads = f"the {' and '.join(splits)} split{'s' if len(splits) > 1 else ''} only"
    return {
        f"data.{key}": f"source '{cfg.source}' reads it with the {' or '.join(sorted(by))} split, and this job reads "
        f"{reads}"
        for key, by in cfg.split_keys().items()
        if not by & set(splits)
    }
