"""Answer spans from answer strings, for QA datasets that give answer texts but no offsets.

Such as MS MARCO QnA through ir_datasets: `MsMarcoQnAQuery.answers`.

The position-bias paper (Sec. 4.1) builds Figure 1 this way: "we matched the available answer tokens to the
passage tokens of the selected passages ... and counted all matches. For MS MARCO we omitted answers that could not
directly be matched in the passage." Here a match is every non-overlapping occurrence of the answer's words in
the passage, case-insensitive, any whitespace between words, not starting or ending inside a word; answers that
do not occur (MS MARCO's answers are often written by the annotator, not copied) give no span and are omitted,
as MS MARCO's placeholder "No Answer Present." is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from datamodules.corpus import Span

NO_ANSWER = "no answer present."


def answer_pattern(answer: str) -> re.Pattern | None:
    """Return a regex for the answer's words separated by any whitespace, at word boundaries.

    None for an empty answer (or MS MARCO's "No Answer Present.").
    """
    words = answer.split()
    if not words or answer.strip().lower() == NO_ANSWER:
        return None
    body = r"\s+".join(re.escape(w) for w in words)
    # \b only where the answer itself starts/ends with a word character ("(1980)" may follow a letter)
    left = r"(?<!\w)" if re.match(r"\w", words[0]) else ""
    right = r"(?!\w)" if re.search(r"\w$", words[-1]) else ""
    return re.compile(left + body + right, re.IGNORECASE)


def match_answer_spans(passage: str, answers: Iterable[str]) -> list[Span]:
    """Every match of every answer in the passage as sorted, distinct character spans [start, end)."""
    spans: set[Span] = set()
    for answer in answers:
        pattern = answer_pattern(answer)
        if pattern is not None:
            spans.update(m.span() for m in pattern.finditer(passage))
    return sorted(spans)
