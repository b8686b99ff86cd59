"""Documents longer than a cross-encoder's input as passages: sliding windows, FirstP / MaxP.

FirstP / MaxP are Dai & Callan 2019's, the BERT-MaxP baseline of the DGRe paper; here for any ranker
(`data.passage_words`, `data.passage_stride`, `data.doc_score`, `data.train_passage`).

- Windows: a document's whitespace words are cut into windows of `size` words starting every `stride` words
  (0, stride, 2 stride, ...), the last window being the first that reaches the end of the document (it may be
  shorter); a document of at most `size` words is one passage. Dai & Callan use 150 words with a stride of 75.
- Evaluation (`doc_score`): `max` (MaxP) scores every passage of every candidate document and gives the document
  its best passage's score; `first` (FirstP) scores the first passage only. The passages are the units of the
  evaluation split (EvalSplit.dtexts, one (query, passage) pair per model input, batched like any pair) and
  `EvalSplit.unit_doc` maps each back to its document: the module's RetrievalRun keeps the highest score of each
  (query, document), which is MaxP (and for FirstP the only score).
- Training (`train_passage`): "all passages from a relevant document are considered relevant" (Dai & Callan's
  passage-level labels, used by BERT-MaxP): each triplet's positive and negative document are replaced by one of
  their passages, drawn per (run seed, epoch, triplet index, document) (`random`, so over the epochs every passage
  of a document is seen and DDP ranks and resumed runs draw the same passage), or always their first passage
  (`first`, FirstP's training).
- Rotation (position-bias paper Eq. 7, `data.rotate_train` / `data.rotate_eval`) applies to the whole document
  before it is cut into windows, in training and evaluation alike; with `data.rotation=per_passage` a document's
  cut is the same everywhere, so its windows are too (only the `random` window draw changes with the epoch).
"""

from __future__ import annotations

import hashlib

import numpy as np

DOC_SCORES = ("max", "first")
TRAIN_PASSAGES = ("random", "first")


def window_starts(n_words: int, size: int, stride: int) -> list[int]:
    """Start word of every window of a document of n_words words (module docstring)."""
    starts = [0]
    while starts[-1] + size < n_words:
        starts.append(starts[-1] + stride)
    return starts


def split_passages(text: str, size: int, stride: int) -> list[str]:
    """Cut `text` into its passages: windows of `size` whitespace words every `stride` words, words joined by a space.

    A text of at most `size` words is one passage; the last window may be shorter (module docstring).
    """
    words = text.split()
    return [" ".join(words[s : s + size]) for s in window_starts(len(words), size, stride)]


def passage_index(seed: int, epoch: int, key: str, n_passages: int) -> int:
    """Deterministic index in [0, n_passages) from (seed, epoch, key), the same in every process."""
    if n_passages <= 1:
        return 0
    digest = hashlib.sha256(f"passage|{int(seed)}|{int(epoch)}|{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % int(n_passages)


def training_passage(text: str, size: int, stride: int, mode: str, seed: int, epoch: int, key: str) -> str:
    """Return the passage of a training document that a triplet uses (`data.train_passage`).

    `mode` "first": its first window (FirstP's training); else (`random`) the window drawn from (seed, epoch, key) by
    `passage_index`, so every process and a resumed run draw the same one, and the epochs cycle through them.
    """
    passages = split_passages(text, size, stride)
    return passages[0] if mode == "first" else passages[passage_index(seed, epoch, key, len(passages))]


def expand_pairs(
    pairs: np.ndarray, doc_texts: list[str], size: int, stride: int, doc_score: str
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Turn (query, document) pairs into (query, passage) pairs for evaluation.

    Returns (pairs over passage units [N', 2], passage texts, unit -> document index). Every document's passages are
    cut once, in document order; `first` keeps one.
    """
    texts: list[str] = []
    counts = np.zeros(len(doc_texts), dtype=np.int64)
    for i, text in enumerate(doc_texts):
        ps = split_passages(text, size, stride)
        if doc_score == "first":
            ps = ps[:1]
        texts.extend(ps)
        counts[i] = len(ps)
    first_unit = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    unit_doc = np.repeat(np.arange(len(doc_texts), dtype=np.int64), counts)
    if len(pairs) == 0:
        return pairs.reshape(0, 2), texts, unit_doc
    n = counts[pairs[:, 1]]
    rows = np.repeat(np.arange(len(pairs)), n)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(n) - n, n)
    units = first_unit[pairs[rows, 1]] + within
    return np.stack([pairs[rows, 0], units], axis=1), texts, unit_doc


__all__ = [
    "DOC_SCORES",
    "TRAIN_PASSAGES",
    "window_starts",
    "split_passages",
    "passage_index",
    "training_passage",
    "expand_pairs",
]
