"""Relative answer start positions of one split, as the position-bias paper's Figure 1 shows them.

Sec. 4.1: "the distribution of the QA-answer start positions in their respective relevant passages", for the
original passages and for the passages rotated by Eq. 7 exactly as training and evaluation rotate them.

Definition (chosen to follow the paper and `datamodules/rotation.py`):

- position of an answer = index of the whitespace-separated word that holds the answer span's first character,
  in the whitespace-normalized passage; relative position = that index / the passage's number of words, in
  [0, 1). Words, not characters, because the paper matches "answer tokens to the passage tokens" and Eq. 7 cuts
  "the word sequence": a rotation by r moves word w to (w - r) mod n, so rotated positions are exact, and a uniform
  r makes them uniform over {0, 1/n, ..., (n-1)/n} in every passage.
- which answers: `spans="all"` (default) counts every distinct annotated span of a (question, relevant passage)
  pair, as the paper "counted all matches"; `spans="first"` counts only the span that starts first (one position
  per pair). Relevant passages without spans (e.g. synthetic grade-1 passages) contribute nothing.
- units: the training split is analysed as training sees it: one unit per training triple whose positive has
  answer spans, cut as `data.rotate_train` cuts it under `data.rotation` (`rotation_draw`): with `per_passage`
  (default) once per passage (doc id), the same cut at every epoch; with `per_epoch` by that triple's key
  (`train_rotation_key(i, positive)`) at each epoch 0..epochs-1. val/test: one unit per (question, relevant passage)
  pair with spans, cut once by doc id, as `data.rotate_eval` does under either setting. The rotated series of
  `epochs` epochs pools all of them; only per_epoch training units differ between epochs (with per_passage, and
  for val/test, every epoch repeats epoch 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datamodules.corpus import IRDataset
from datamodules.datamodule import eval_rotation_key, rotation_draw
from datamodules.rotation import answer_start_words, rotation_index

SPAN_MODES = ("all", "first")


@dataclass(frozen=True)
class Unit:
    """One relevant passage of one question, as a training triple's positive or an evaluation pair."""

    qid: str
    doc_id: str
    key: str  # its rotation key
    per_epoch: bool = False  # its cut is redrawn every epoch (data.rotation=per_epoch training); else epoch 0's always


def train_units(ds: IRDataset, triples: list[tuple[str, str, str]], rotation_mode: str = "per_passage") -> list[Unit]:
    """Return the positives of the training triples (in training order) that have answer spans, as units.

    Each is keyed as `data.rotation` = `rotation_mode` cuts them (`rotation_draw`).
    """
    per_epoch = rotation_mode == "per_epoch"
    return [
        Unit(q, pos, rotation_draw(rotation_mode, 0, pos, i)[1], per_epoch)
        for i, (q, pos, _) in enumerate(triples)
        if ds.answers.get((q, pos))
    ]


def eval_units(ds: IRDataset, split: str) -> list[Unit]:
    """(question, relevant passage) pairs of an evaluation split that have answer spans."""
    s = ds.split(split)
    return [
        Unit(q, d, eval_rotation_key(d))
        for q in sorted(s.qrels)
        for d, g in sorted(s.qrels[q].items())
        if g > 0 and ds.answers.get((q, d))
    ]


def start_words(ds: IRDataset, unit: Unit, spans: str = "all") -> tuple[list[int], int]:
    """Word indices of the unit's answer starts (all spans, or the first-starting one) and the passage's words."""
    answer_spans = ds.answers[(unit.qid, unit.doc_id)]
    if spans == "first":
        answer_spans = [min(answer_spans)]
    return answer_start_words(ds.docs[unit.doc_id], answer_spans)


def relative_starts(
    ds: IRDataset, units: list[Unit], spans: str = "all", rotate: bool = False, seed: int = 0, epochs: int = 1
) -> np.ndarray:
    """Return the relative answer starts of `units`, in the original or the rotated passages.

    In the original passages, or (rotate=True) in the passages rotated with the run seed at each epoch
    0..epochs-1 (epoch-major order; a unit that is not `per_epoch` has its epoch-0 cut at every epoch).
    """
    words = [start_words(ds, u, spans) for u in units]
    if not rotate:
        return np.array([w / n for ws, n in words for w in ws], dtype=np.float64)
    out = [
        ((w - rotation_index(seed, epoch if u.per_epoch else 0, u.key, n)) % n) / n
        for epoch in range(epochs)
        for u, (ws, n) in zip(units, words)
        for w in ws
    ]
    return np.array(out, dtype=np.float64)
