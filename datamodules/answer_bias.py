"""A position-biased training split on real text, built from a dataset with answer spans.

It reproduces the answer-position bias the position-bias paper found in MS MARCO (Sec. 4.1, Fig. 1: "the answer
positions in the MS MARCO dataset strongly favor earlier positions in the paragraphs"), built from a dataset with answer
spans (SQuAD, where the paper found answers "relatively unbiased"), because MS MARCO passages cannot be had here.

How the split is built (`data.answer_bias_keep_first` = k, `data.answer_bias_late_keep` = p,
`data.answer_bias_seed`):

1. The relative answer start of a span is word-based, as the paper's Fig. 1 and rotation (Eq. 7) are:
   (index of the word holding the span's first character) / (number of words), on the whitespace-normalized
   passage (`rotation.relative_answer_positions`), in [0, 1).
2. A training question is *early* when every answer span it has, in every relevant passage that has spans, starts
   at a relative position < k; otherwise it is *late*. "Every span" (not the first) because SQuAD dev questions
   carry up to three annotators' spans: with "every", the biased split has all its answers in the first k.
3. Early questions are kept. Late questions are kept with probability p (default 0: a hard filter; 0 < p < 1
   re-weights the split towards the start instead of cutting it), decided per question by
   SHA-256(seed, qid), so the choice does not depend on the run seed, the order of queries or the other queries.
4. Questions with no answer span at all (their position is unknown, as the MS MARCO answers the paper "omitted"
   because they "could not directly be matched") are dropped.
5. Only the training split changes: its queries, qrels, and (when the source gives them) triples and candidates
   are cut to the kept questions, before training triples are sampled. Val and test are untouched, so biased
   and unbiased training are tested on the same questions.

Debiased training on the biased split is the same config with `data.rotate_train=true` (Eq. 7: one cut per
passage with the default `data.rotation=per_passage`, a new cut every epoch with `per_epoch`).
"""

from __future__ import annotations

import dataclasses
import hashlib

from core.errors import InputError
from datamodules.corpus import IRDataset, Split
from datamodules.rotation import relative_answer_positions


def question_answer_starts(ds: IRDataset, qid: str, judged: dict[str, int]) -> list[float]:
    """Relative answer starts of every span of `qid` in its relevant passages (grade > 0) that have spans."""
    out: list[float] = []
    for doc_id, grade in judged.items():
        spans = ds.answers.get((qid, doc_id)) if grade > 0 else None
        if spans:
            out += relative_answer_positions(ds.docs[doc_id], spans)
    return out


def late_kept(seed: int, qid: str, p: float) -> bool:
    """Whether a late question is kept: a uniform draw in [0, 1) from (seed, qid) below p."""
    if p <= 0:
        return False
    digest = hashlib.sha256(f"answer_bias|{int(seed)}|{qid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < p


def apply_answer_bias(ds: IRDataset, keep_first: float, late_keep: float = 0.0, seed: int = 13) -> IRDataset:
    """Return `ds` with its training split cut to the position-biased questions (module doc).

    The counts go into `IRDataset.answer_bias`.
    """
    if not 0 < keep_first <= 1:
        raise InputError(
            "config key 'data.answer_bias_keep_first'",
            f"is {keep_first}; expected a fraction of the passage in (0, 1], or null (off)",
        )
    if not ds.answers:
        raise InputError(
            "config key 'data.answer_bias_keep_first'",
            f"is {keep_first} but dataset {ds.name} has no answer spans; "
            "a position-biased split needs a source with answers (squad, synthetic, ir_datasets with answers)",
        )
    train = ds.split("train")
    early = late_in = late_out = no_answer = 0
    keep: set[str] = set()
    for qid in train.queries:
        starts = question_answer_starts(ds, qid, train.qrels.get(qid, {}))
        if not starts:
            no_answer += 1
        elif max(starts) < keep_first:
            early += 1
            keep.add(qid)
        elif late_kept(seed, qid, late_keep):
            late_in += 1
            keep.add(qid)
        else:
            late_out += 1
    if not keep:
        raise InputError(
            "config key 'data.answer_bias_keep_first'",
            f"is {keep_first}: no training question of dataset {ds.name} has its answer in the first "
            f"{keep_first:g} of its passage; expected a larger fraction",
        )
    biased = Split(
        queries={q: t for q, t in train.queries.items() if q in keep},
        qrels={q: j for q, j in train.qrels.items() if q in keep},
        triples=None if train.triples is None else [t for t in train.triples if t[0] in keep],
        candidates=None if train.candidates is None else {q: c for q, c in train.candidates.items() if q in keep},
        origins=dict(train.origins),
    )
    counts = {
        "keep_first": keep_first,
        "late_keep": late_keep,
        "seed": int(seed),
        "questions": len(train.queries),
        "kept": len(keep),
        "early": early,
        "late_kept": late_in,
        "late_dropped": late_out,
        "no_answer_dropped": no_answer,
    }
    return dataclasses.replace(ds, splits={**ds.splits, "train": biased}, answer_bias=counts)


def describe(counts: dict) -> str:
    """One line for the log: how many training questions the biased split keeps, and why the others went."""
    return (
        f"position-biased training split (data.answer_bias_keep_first={counts['keep_first']:g}, "
        f"late_keep={counts['late_keep']:g}): {counts['kept']:,} of {counts['questions']:,} training questions kept "
        f"({counts['early']:,} answered in the first {counts['keep_first']:g}, "
        f"{counts['late_kept']:,} later ones kept; "
        f"dropped {counts['late_dropped']:,} answered later and {counts['no_answer_dropped']:,} without answer spans)"
    )
