"""Rotation debiasing of passages (position-bias paper, Sec. 4.2, Eq. 7).

The rotation is

    p~_{1:n} = [p_{r:n} ; p_{1:r-1}]

over the whitespace-separated words of a passage: cut the word sequence at a random word r, swap the two parts.
Here r is 0-based (`r = 0` leaves the passage unchanged; the paper's 1-based r = our r + 1).

Whitespace: both the rotated and the un-rotated passage go through `normalize` (every run of whitespace -> one
space, no leading/trailing space), so a model never sees a spacing difference between the two conditions.
`rotate` normalizes its input itself; evaluate un-rotated text as `normalize(text)[0]` (or `rotate(text, 0)`).

Answer spans are character spans [start, end) and are mapped through both steps. A span that contains the cut
(the space before word r) is split into two spans in the rotated text: the part from word r on (now at the start
of the passage) and the part before word r (now at the end); spans are returned sorted by start.

Which cut a passage gets (`data.rotation`, `ROTATIONS`):

- `per_passage` (default, the paper's reading): "for each passage p_{1:n} in the collection we create a debiased
  instance p~_{1:n}" (Sec. 4.2), i.e. a debiased *data set*: ONE cut r per passage, a pure function of (run seed,
  passage id) (`passage_rotation_index`). The same passage gets the same rotation in training (`data.rotate_train`)
  and evaluation (`data.rotate_eval`), at every epoch, in every triple it appears in, on every DDP rank and
  dataloader worker, and after a resume.
- `per_epoch` (our earlier behaviour, a data augmentation the paper does not describe): training redraws the cut
  every epoch and per training example, from (seed, epoch, triple index, passage id); evaluation still cuts each
  passage once (by passage id, as `per_passage`), so `rotate_eval` is the same under both settings.

Both go through `rotation_index`, SHA-256 of (seed, epoch, key): identical in every process and independent of the
order examples are visited in. `per_passage` is `rotation_index(seed, 0, passage id)`, which is also the cut
evaluation has always used, so rotated evaluation sets are unchanged by the switch.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Sequence

Span = tuple[int, int]
_WORD = re.compile(r"\S+")
# `data.rotation`: one cut per passage (the paper's debiased data set, default) | a new cut per epoch and example
ROTATIONS = ("per_passage", "per_epoch")


def normalize(text: str, spans: Sequence[Span] = ()) -> tuple[str, list[Span]]:
    """Collapse whitespace to single spaces (and strip the ends); map character spans into the new text.

    Words are the maximal runs of non-whitespace characters (as `str.split()`). A span's leading/trailing whitespace
    is trimmed, so the mapped span's text equals the original span's text with its whitespace collapsed; spans that
    are empty or only whitespace are dropped.
    """
    matches = list(_WORD.finditer(text))
    norm = " ".join(m.group() for m in matches)
    if not spans:
        return norm, []
    starts = [m.start() for m in matches]
    ends = [m.end() for m in matches]
    new_starts, n = [], 0
    for m in matches:
        new_starts.append(n)
        n += m.end() - m.start() + 1
    mapped: list[Span] = []
    for s, e in spans:
        s, e = max(0, int(s)), min(len(text), int(e))
        i = bisect.bisect_right(ends, s)  # first word ending after s
        j = bisect.bisect_left(starts, e) - 1  # last word starting before e
        if s >= e or i >= len(matches) or j < i:
            continue
        ns = new_starts[i] + max(0, s - starts[i])
        ne = new_starts[j] + min(e, ends[j]) - starts[j]
        if ns < ne:
            mapped.append((ns, ne))
    return norm, mapped


def word_starts(text: str) -> list[int]:
    """Character offsets of the words of a normalized text."""
    if not text:
        return []
    starts = [0]
    i = text.find(" ")
    while i != -1:
        starts.append(i + 1)
        i = text.find(" ", i + 1)
    return starts


def rotate(text: str, r: int, spans: Sequence[Span] = ()) -> tuple[str, list[Span]]:
    """Eq. 7 with 0-based r: words[r:] + words[:r] of the normalized text (r is taken modulo the word count).

    Spans are mapped into the rotated text; one that crosses the cut becomes two spans (see the module doc).
    """
    norm, nspans = normalize(text, spans)
    starts = word_starts(norm)
    if not starts:
        return norm, nspans
    r = int(r) % len(starts)
    if r == 0:
        return norm, sorted(nspans)
    cut = starts[r]  # the space before word r is at cut - 1
    head, tail = norm[: cut - 1], norm[cut:]
    rotated = tail + " " + head
    shift_head = len(tail) + 1  # head chars move from i to i + shift_head
    out: list[Span] = []
    for s, e in nspans:
        if s >= cut:
            out.append((s - cut, e - cut))
        elif e <= cut - 1:
            out.append((s + shift_head, e + shift_head))
        else:  # crosses the cut: [s, cut-1) stays with the head, [cut, e) with the tail
            if e > cut:
                out.append((0, e - cut))
            if s < cut - 1:
                out.append((s + shift_head, cut - 1 + shift_head))
    return rotated, sorted(out)


def rotation_index(seed: int, epoch: int, key: str, n_words: int) -> int:
    """Deterministic r in [0, n_words) from (seed, epoch, example key), the same in every process."""
    if n_words <= 1:
        return 0
    digest = hashlib.sha256(f"rotation|{int(seed)}|{int(epoch)}|{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % int(n_words)


def passage_rotation_index(seed: int, passage_id: str, n_words: int) -> int:
    """Return the `per_passage` cut (Sec. 4.2: one debiased instance per passage), r in [0, n_words).

    Drawn from (seed, passage id) alone, `rotation_index(seed, 0, passage_id, n_words)`; no epoch, no example, no
    process enters it.
    """
    return rotation_index(seed, 0, str(passage_id), n_words)


def rotate_seeded(text: str, seed: int, epoch: int, key: str, spans: Sequence[Span] = ()) -> tuple[str, list[Span]]:
    """Normalize + rotation_index + rotate: the debiased instance of one passage for (seed, epoch, key)."""
    norm, nspans = normalize(text, spans)
    return rotate(norm, rotation_index(seed, epoch, key, len(word_starts(norm))), nspans)


def answer_start_words(text: str, spans: Sequence[Span]) -> tuple[list[int], int]:
    """Return (index of the word holding each span's start, number of words), on the normalized text.

    Spans that `normalize` drops (empty or whitespace only) are skipped. Under rotation by r, word w moves to
    (w - r) mod n.
    """
    norm, nspans = normalize(text, spans)
    n = len(word_starts(norm))
    return ([norm.count(" ", 0, s) for s, _ in nspans] if n else []), n


def relative_answer_positions(text: str, spans: Sequence[Span]) -> list[float]:
    """Return the word-based relative position of each answer start, in [0, 1).

    (index of the word holding the span start) / (number of words), on the normalized text. Word-based because rotation
    moves whole words: a uniformly drawn r makes this exactly uniform over {0, 1/n, ..., (n-1)/n} for every passage.
    """
    words, n = answer_start_words(text, spans)
    return [w / n for w in words]
