"""SQuAD v1.1 as paragraph retrieval (`data.source: squad`), as in the position-bias paper (Sec. 4.1).

- collection: every paragraph of the file (doc id `<article index>-<paragraph index>`, 0-based); the queries of
  every split are judged and ranked against the full collection.
- queries: the questions (qid = the SQuAD question id); qrels: the paragraph holding the answer, grade 1.
- answers: `IRDataset.answers[(qid, doc id)]` = every distinct (answer_start, answer_start + len(text)) span.
- splits BY ARTICLE, so no paragraph is relevant in two splits: the articles are permuted with `split_seed`
  (independent of the run seed, so every run sees the same test set); the first `test_articles` go to test, the
  next `val_articles` to val, the rest to train. Values < 1 are fractions of the articles (at least one article),
  values >= 1 counts.
- `max_questions_per_split` (optional): keep that many questions per split, a `split_seed`-seeded random subset.

The file is `dev-v1.1.json(.gz)` (train-v1.1.json works too). SQuAD carries no triples or candidate lists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from core.errors import InputError
from core.ranges import COUNT, SEED, Range, check_ranges
from datamodules.config import DataConfig
from datamodules.corpus import IRDataset, Split
from datamodules.sources.registry import SOURCES
from datamodules.textfiles import read_text, resolve_path

ARTICLES = Range(0, note="< 1: a fraction of the articles; >= 1: a count")


@dataclass
class SquadConfig(DataConfig):
    """The `data` keys of the SQuAD source: the JSON file and the seeded split by article (module docstring).

    `val_articles` / `test_articles`: < 1 a fraction of the articles (at least one), >= 1 a count;
    `max_questions_per_split` keeps a `split_seed`-seeded subset of each split's questions.
    """

    answers: ClassVar[bool | None] = True

    source: str = "squad"
    path: str = "../shared/data/squad_v1.1_dev/dev-v1.1.json.gz"
    val_articles: float = 0.15  # < 1: fraction of the articles; >= 1: number of articles
    test_articles: float = 0.15
    split_seed: int = 13
    max_questions_per_split: int | None = None

    def __post_init__(self):
        super().__post_init__()
        check_ranges(
            "data", self, val_articles=ARTICLES, test_articles=ARTICLES, split_seed=SEED, max_questions_per_split=COUNT
        )


def _count(value: float, n: int, key: str) -> int:
    v = float(value)
    if v < 1:
        return max(1, int(round(v * n))) if v > 0 else 0
    if v != int(v):
        raise InputError(f"data.{key}", f"is {value}; a value >= 1 is a count of articles and must be a whole number")
    return int(v)


def load_json(path) -> dict:
    """Read a SQuAD JSON file (gzip or plain); malformed JSON raises InputError naming the file and line."""
    text = read_text(path)  # the shared reader: gzip, UTF-8 and a leading BOM handled, errors name file:line
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}:{e.lineno}", f"malformed JSON ({e.msg} at column {e.colno}); expected the SQuAD v1.1 JSON format"
        ) from None


def _get(obj, key: str, typ: type, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(where, f"missing key '{key}'; expected the SQuAD v1.1 format (data/paragraphs/qas/answers)")
    value = obj[key]
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is int):
        names = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        raise InputError(where, f"'{key}' is a {type(value).__name__}; expected {names}")
    return value


@SOURCES.register("squad", schema=SquadConfig)
def build(cfg: SquadConfig, seed: int, splits: tuple[str, ...] | None = None) -> IRDataset:
    """Build the whole SQuAD file.

    Its splits are a seeded permutation of all its articles, so `splits` changes nothing.
    """
    path = resolve_path(cfg.path, "path", "SQuAD v1.1 JSON file (dev-v1.1.json or .json.gz)")
    root = load_json(path)
    articles = _get(root, "data", list, str(path))

    docs: dict[str, str] = {}
    answers: dict[tuple[str, str], list[tuple[int, int]]] = {}
    # per article: list of (qid, question, doc id)
    questions: list[list[tuple[str, str, str]]] = []
    seen_qids: set[str] = set()
    for ai, article in enumerate(articles):
        awhere = f"{path}: data[{ai}]"
        paragraphs = _get(article, "paragraphs", list, awhere)
        per_article = []
        for pi, para in enumerate(paragraphs):
            pwhere = f"{awhere}.paragraphs[{pi}]"
            context = _get(para, "context", str, pwhere)
            if not context.strip():
                raise InputError(pwhere, "empty 'context'; expected a non-empty paragraph")
            doc_id = f"{ai}-{pi}"
            docs[doc_id] = context
            for qi, qa in enumerate(_get(para, "qas", list, pwhere)):
                qwhere = f"{pwhere}.qas[{qi}]"
                qid = str(_get(qa, "id", (str, int), qwhere))
                question = _get(qa, "question", str, qwhere)
                if not question.strip():
                    raise InputError(qwhere, f"empty 'question' for id '{qid}'; expected a non-empty question")
                if qid in seen_qids:
                    raise InputError(qwhere, f"duplicate question id '{qid}'; expected unique ids")
                seen_qids.add(qid)
                spans = set()
                for ni, ans in enumerate(_get(qa, "answers", list, qwhere)):
                    nwhere = f"{qwhere}.answers[{ni}]"
                    text = _get(ans, "text", str, nwhere)
                    start = _get(ans, "answer_start", int, nwhere)
                    end = start + len(text)
                    if start < 0 or end > len(context) or context[start:end] != text:
                        raise InputError(
                            nwhere, f"answer_start {start} does not point at the answer text {text!r} in the context"
                        )
                    if end > start:
                        spans.add((start, end))
                if spans:
                    answers[(qid, doc_id)] = sorted(spans)
                per_article.append((qid, question, doc_id))
        questions.append(per_article)

    n = len(articles)
    n_test = _count(cfg.test_articles, n, "test_articles")
    n_val = _count(cfg.val_articles, n, "val_articles")
    if n_test + n_val >= n:
        raise InputError(
            "data.val_articles", f"val ({n_val}) + test ({n_test}) articles leave none of the {n} articles for training"
        )
    order = np.random.default_rng(cfg.split_seed).permutation(n)
    assign = {
        "test": sorted(order[:n_test].tolist()),
        "val": sorted(order[n_test : n_test + n_val].tolist()),
        "train": sorted(order[n_test + n_val :].tolist()),
    }

    cap = cfg.max_questions_per_split
    splits: dict[str, Split] = {}
    for k, (name, art_ids) in enumerate(assign.items()):
        rows = [row for a in art_ids for row in questions[a]]
        if cap is not None and len(rows) > cap:
            keep = np.sort(np.random.default_rng([cfg.split_seed, k]).permutation(len(rows))[:cap])
            rows = [rows[i] for i in keep]
        split = Split()
        for qid, question, doc_id in rows:
            split.queries[qid] = question
            split.qrels[qid] = {doc_id: 1}
        splits[name] = split
    kept = {q for s in splits.values() for q in s.queries}
    answers = {key: spans for key, spans in answers.items() if key[0] in kept}
    splits = {name: splits[name] for name in ("train", "val", "test")}
    return IRDataset(name="squad", docs=docs, splits=splits, answers=answers, doc_group=article_of)


def article_of(doc_id: str) -> str:
    """Return the article of a paragraph's doc id `<article index>-<paragraph index>` (folds keep articles together)."""
    return doc_id.split("-", 1)[0]
