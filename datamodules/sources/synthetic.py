"""Seeded synthetic collection (`data.source: synthetic`), the embedded default: it needs no files.

A small English-ish collection built from pseudo-words (syllables), so every run is reproducible offline:

- `num_topics` topics, each with its own vocabulary (Zipf-weighted), plus a shared background vocabulary and
  English function words. A passage (`passage_words_min`..`passage_words_max` words, in sentences) mixes words of
  its topic, background words and function words.
- every query has one relevant passage (grade 2) holding an "evidence block": two key terms of the query (a rare
  term unique to the query and a topic term) next to the ANSWER, a capitalised two-word name unique to the query.
  The block is placed so that the answer's relative word position follows `answer_position`: "uniform" ->
  U(0, 1); "start" -> Beta(1, `start_beta`) (mean 1 / (1 + start_beta), skewed to the start, like MS MARCO in the
  position-bias paper, Fig. 1).
- with probability `partial_relevance` a second passage of the same topic gets the two key terms but no answer:
  grade 1. Other passages of the same topic share the topic terms: hard negatives for BM25 and for the ranker.
- queries (3-8 words): a question word ("what", "which", ... sometimes "is the") and at least two terms of the
  relevant passage: the block's topic term, usually the rare term, often another topic term of the passage;
  sometimes "of" between them or a topic word the passage may lack. BM25 works somewhat; a neural ranker can
  learn to look for the key terms *and* the answer next to them.
- `IRDataset.answers[(qid, relevant doc id)] = [(char start, char end)]` of the answer name in the passage.

Everything is drawn from one numpy Generator seeded with `data_seed` (or, when null, the run seed), so the
collection is identical in every process. No triples and no candidate lists: negatives are sampled (BM25 or
random) and candidates are the BM25 top-k, like for the classic collections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from core.bm25s_lib import stopwords_en
from core.errors import InputError, check_choice
from core.ranges import COUNT, NON_NEGATIVE, POSITIVE, PROBABILITY, SEED, check_ranges
from datamodules.config import DataConfig
from datamodules.corpus import IRDataset, Split
from datamodules.sources.registry import SOURCES


@dataclass
class SyntheticConfig(DataConfig):
    """The `data` keys of the synthetic collection: sizes, topics, passage lengths and where answers sit.

    Each key's comment and the module docstring say what it controls; `answer_position: start` gives a
    position-biased collection (answers skewed to the start of the passage, like MS MARCO in the position-bias paper).
    """

    answers: ClassVar[bool | None] = True

    source: str = "synthetic"
    data_seed: int | None = None  # null: the run seed
    num_docs: int = 600
    num_train_queries: int = 400
    num_val_queries: int = 40
    num_test_queries: int = 60
    num_topics: int = 12
    topic_words: int = 40  # vocabulary size of each topic
    passage_words_min: int = 30
    passage_words_max: int = 60
    answer_position: str = "uniform"  # uniform | start
    start_beta: float = 6.0  # "start": relative answer position ~ Beta(1, start_beta)
    partial_relevance: float = 0.5  # probability of an extra grade-1 passage per query

    def __post_init__(self):
        super().__post_init__()
        check_choice("data.answer_position", self.answer_position, ("uniform", "start"))
        check_ranges(
            "data",
            self,
            data_seed=SEED,
            num_docs=COUNT,
            num_topics=COUNT,
            topic_words=COUNT,
            passage_words_min=COUNT,
            passage_words_max=COUNT,
            num_train_queries=NON_NEGATIVE,
            num_val_queries=NON_NEGATIVE,
            num_test_queries=NON_NEGATIVE,
            start_beta=POSITIVE,
            partial_relevance=PROBABILITY,
        )


FUNCTION_WORDS = [
    "the",
    "of",
    "and",
    "in",
    "a",
    "to",
    "is",
    "for",
    "with",
    "on",
    "by",
    "as",
    "that",
    "from",
    "was",
    "are",
    "its",
    "which",
    "at",
    "this",
    "an",
    "or",
    "be",
    "has",
    "were",
    "it",
]
QUESTION_WORDS = ["what", "which", "who", "where", "how", "when"]
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "h", "w", "br", "st", "tr", "pl"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o"]
_CODAS = ["", "", "", "", "n", "r", "s", "l", "m", "t"]
# evidence blocks: "A" = the answer, "R" = the rare key term, "K" = the first topic key term
_TEMPLATES = [
    ["A", "is", "the", "K", "of", "R"],
    ["R", "K", "was", "A"],
    ["K", "by", "A", "in", "R"],
    ["the", "R", "K", "of", "A"],
    ["A", "and", "R", "K"],
]


def _pseudo_words(rng: np.random.Generator, n: int, exclude: set[str]) -> list[str]:
    words: list[str] = []
    seen = set(exclude)
    while len(words) < n:
        k = 2 if rng.random() < 0.8 else 3
        w = "".join(
            _ONSETS[rng.integers(len(_ONSETS))]
            + _VOWELS[rng.integers(len(_VOWELS))]
            + _CODAS[rng.integers(len(_CODAS))]
            for _ in range(k)
        )
        if w not in seen and len(w) >= 4:
            seen.add(w)
            words.append(w)
    return words


def _check(cfg) -> None:
    """Check what the single-key ranges of SyntheticConfig cannot say: how the sizes fit together."""
    if cfg.passage_words_max < cfg.passage_words_min:
        raise InputError(
            "data.passage_words_max", f"is {cfg.passage_words_max} < passage_words_min {cfg.passage_words_min}"
        )
    total = cfg.num_train_queries + cfg.num_val_queries + cfg.num_test_queries
    if total > cfg.num_docs:
        raise InputError(
            "data.num_docs",
            f"is {cfg.num_docs}; every query needs its own relevant passage, "
            f"so expected >= {total} (the total number of queries)",
        )
    if cfg.num_docs < 2 * cfg.num_topics:
        raise InputError(
            "data.num_topics",
            f"is {cfg.num_topics}; expected at most num_docs / 2 = {cfg.num_docs // 2} so each topic has two passages",
        )


@SOURCES.register("synthetic", schema=SyntheticConfig)
def build(cfg: SyntheticConfig, seed: int, splits: tuple[str, ...] | None = None) -> IRDataset:
    """Build the whole generated collection.

    Its splits are a seeded permutation of all its queries, so `splits` changes nothing.
    """
    _check(cfg)
    rng = np.random.default_rng(int(cfg.data_seed if cfg.data_seed is not None else seed))
    n_docs, n_topics = int(cfg.num_docs), int(cfg.num_topics)
    counts = {"train": int(cfg.num_train_queries), "val": int(cfg.num_val_queries), "test": int(cfg.num_test_queries)}
    n_queries = sum(counts.values())

    # pseudo-words never collide with real function words (BM25 would drop a key term that is a stopword)
    reserved = set(FUNCTION_WORDS) | set(QUESTION_WORDS) | stopwords_en()
    n_names = 160 + int(2 * np.sqrt(n_queries))  # n_names * (n_names - 1) distinct two-word answers
    vocab = _pseudo_words(rng, n_topics * cfg.topic_words + 150 + n_queries + n_names, reserved)
    topics = [vocab[t * cfg.topic_words : (t + 1) * cfg.topic_words] for t in range(n_topics)]
    off = n_topics * cfg.topic_words
    background = vocab[off : off + 150]
    rare = vocab[off + 150 : off + 150 + n_queries]
    names = [w.capitalize() for w in vocab[off + 150 + n_queries :]]
    zipf = 1.0 / np.arange(1, cfg.topic_words + 1) ** 0.8
    zipf /= zipf.sum()

    # passages as token lists; an answer is the token ("A", query index)
    doc_topic = np.concatenate([np.arange(n_topics), rng.integers(0, n_topics, n_docs - n_topics)])
    rng.shuffle(doc_topic)
    tokens: list[list] = []
    for d in range(n_docs):
        length = int(rng.integers(cfg.passage_words_min, cfg.passage_words_max + 1))
        kind = rng.random(length)
        fn = rng.integers(len(FUNCTION_WORDS), size=length)
        tw = rng.choice(cfg.topic_words, size=length, p=zipf)
        bg = rng.integers(len(background), size=length)
        topic = topics[doc_topic[d]]
        tokens.append(
            [
                FUNCTION_WORDS[fn[i]] if u < 0.3 else topic[tw[i]] if u < 0.8 else background[bg[i]]
                for i, u in enumerate(kind)
            ]
        )

    # unique two-word answer names
    name_pairs = set()
    answers_text: list[str] = []
    while len(answers_text) < n_queries:
        i, j = rng.integers(len(names), size=2)
        if i != j and (i, j) not in name_pairs:
            name_pairs.add((i, j))
            answers_text.append(f"{names[i]} {names[j]}")

    topic_sets = [set(t) for t in topics]
    primaries = rng.permutation(n_docs)[:n_queries]
    by_topic = [np.flatnonzero(doc_topic == t) for t in range(n_topics)]
    query_text: list[str] = []
    qrels: list[dict[int, int]] = []
    for qi in range(n_queries):
        d = int(primaries[qi])
        topic = topics[doc_topic[d]]
        k1 = topic[rng.choice(cfg.topic_words, p=zipf)]
        # the second key term is a topic word the passage already holds (shared with same-topic passages)
        present = sorted({t for t in tokens[d] if isinstance(t, str) and t in topic_sets[doc_topic[d]] and t != k1})
        k2 = present[rng.integers(len(present))] if present else k1
        block = [{"A": ("A", qi), "R": rare[qi], "K": k1}.get(t, t) for t in _TEMPLATES[rng.integers(len(_TEMPLATES))]]
        ans_at = next(i for i, t in enumerate(block) if isinstance(t, tuple))
        total = len(tokens[d]) + len(block)
        p = rng.random() if cfg.answer_position == "uniform" else rng.beta(1.0, cfg.start_beta)
        target = min(int(p * total), total - 1)  # the answer's word index
        start = int(np.clip(target - ans_at, 0, len(tokens[d])))
        tokens[d][start:start] = block
        judged = {d: 2}
        if rng.random() < cfg.partial_relevance:
            mates = by_topic[doc_topic[d]]
            mates = mates[mates != d]
            if len(mates):
                m = int(mates[rng.integers(len(mates))])
                pos = int(rng.integers(0, len(tokens[m]) + 1))
                tokens[m][pos:pos] = [k1, "of", rare[qi]]
                judged[m] = 1
        qrels.append(judged)
        # the query: a question word and key terms (3-8 words)
        keys = [k1] + ([rare[qi]] if rng.random() < 0.85 else []) + ([k2] if rng.random() < 0.6 and k2 != k1 else [])
        if len(keys) < 2:
            keys.append(rare[qi] if k2 == k1 else k2)
        keys = [keys[i] for i in rng.permutation(len(keys))]
        words = [QUESTION_WORDS[rng.integers(len(QUESTION_WORDS))]]
        if rng.random() < 0.5:
            words += ["is", "the"]
        first_key = len(words)
        words += keys
        if rng.random() < 0.3:  # "of" between two key terms
            words.insert(int(rng.integers(first_key + 1, len(words))), "of")
        if rng.random() < 0.3:
            words.append(topic[rng.choice(cfg.topic_words, p=zipf)])
        query_text.append(" ".join(words[:8]))

    # render passages: sentences of 6-14 words, capitalised, ending with "."
    docs: dict[str, str] = {}
    answers: dict[tuple[str, str], list[tuple[int, int]]] = {}
    doc_ids = [f"d{j:05d}" for j in range(n_docs)]
    qids = [f"q{i:05d}" for i in range(n_queries)]
    for d, toks in enumerate(tokens):
        parts: list[str] = []
        pos = 0
        left = int(rng.integers(6, 15))
        new_sentence = True
        for k, tok in enumerate(toks):
            if isinstance(tok, tuple):
                word = answers_text[tok[1]]
                answers[(qids[tok[1]], doc_ids[d])] = [(pos, pos + len(word))]
            else:
                word = tok.capitalize() if new_sentence else tok
            left -= 1
            new_sentence = left == 0 or k == len(toks) - 1
            if new_sentence:
                word += "."
                left = int(rng.integers(6, 15))
            parts.append(word)
            pos += len(word) + 1
        docs[doc_ids[d]] = " ".join(parts)

    splits: dict[str, Split] = {}
    qi = 0
    for name, count in counts.items():
        split = Split()
        for _ in range(count):
            split.queries[qids[qi]] = query_text[qi]
            split.qrels[qids[qi]] = {doc_ids[d]: g for d, g in qrels[qi].items()}
            qi += 1
        splits[name] = split
    return IRDataset(name="synthetic", docs=docs, splits=splits, answers=answers)
