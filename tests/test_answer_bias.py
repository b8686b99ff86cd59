"""The position-biased training split (datamodules/answer_bias.py): which questions it keeps (checked by brute force
against word positions counted here with str.split, not with the code under test), what it leaves alone (val,
test, the collection), its re-weighting mode, the config keys and their errors, and the data module on top."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import shared_data, synthetic_data

from core.errors import InputError
from datamodules.answer_bias import apply_answer_bias, late_kept
from datamodules.corpus import IRDataset, Split
from datamodules.datamodule import RankingDataModule
from datamodules.sources import load_dataset
from datamodules.sources.squad import SquadConfig
from datamodules.sources.synthetic import SyntheticConfig
from pipeline.config import compose


def _word_position(text: str, start: int) -> float:
    """Relative start by hand: words of text[:start + 1] (the word holding the start is the last) over all words."""
    while text[start].isspace():  # a span opening with whitespace starts at its first word
        start += 1
    return (len(text[: start + 1].split()) - 1) / len(text.split())


def _early_by_hand(ds: IRDataset, k: float) -> tuple[set[str], set[str]]:
    """(questions with every answer start < k, questions with no span) of the training split."""
    early, none = set(), set()
    train = ds.splits["train"]
    for qid in train.queries:
        starts = [
            _word_position(ds.docs[d], s)
            for d, g in train.qrels[qid].items()
            if g > 0
            for s, _ in ds.answers.get((qid, d), [])
        ]
        if not starts:
            none.add(qid)
        elif all(p < k for p in starts):
            early.add(qid)
    return early, none


@pytest.mark.parametrize("k", [0.05, 0.25, 0.5, 0.999, 1.0])
def test_filter_keeps_exactly_the_early_questions_synthetic(k):
    ds = load_dataset(SyntheticConfig(), 0)
    biased = apply_answer_bias(ds, k)
    early, none = _early_by_hand(ds, k)
    assert set(biased.splits["train"].queries) == early
    c = biased.answer_bias
    assert (c["kept"], c["early"], c["no_answer_dropped"], c["questions"]) == (len(early), len(early), len(none), 400)
    assert c["early"] + c["late_kept"] + c["late_dropped"] + c["no_answer_dropped"] == c["questions"]
    if k == 1.0:
        assert len(early) == 400  # every relative start is < 1
    # only the training split changes
    assert biased.splits["val"] is ds.splits["val"] and biased.splits["test"] is ds.splits["test"]
    assert biased.docs is ds.docs and biased.answers is ds.answers
    kept = biased.splits["train"]
    assert kept.qrels == {q: ds.splits["train"].qrels[q] for q in early}


@pytest.mark.data("squad_v1.1_dev/dev-v1.1.json.gz")
def test_filter_keeps_exactly_the_early_questions_squad():
    path = shared_data("squad_v1.1_dev", "dev-v1.1.json.gz")
    ds = load_dataset(SquadConfig(path=str(path)), 0)
    for k in (0.1, 0.25, 0.6):
        early, none = _early_by_hand(ds, k)
        assert not none
        biased = apply_answer_bias(ds, k)
        assert set(biased.splits["train"].queries) == early
        assert biased.answer_bias["kept"] == len(early) < len(ds.splits["train"].queries)
    # the shipped config: 2,220 of 6,880 training questions (quoted in configs/data/squad_biased.yaml)
    c = apply_answer_bias(ds, 0.25).answer_bias
    assert (c["kept"], c["questions"]) == (2220, 6880)


def _toy() -> IRDataset:
    docs = {"d1": "alpha beta gamma delta", "d2": "one two three four five six seven eight nine ten", "d3": "x y z"}
    train = Split(
        queries={"q1": "a", "q2": "b", "q3": "c", "q4": "d"},
        qrels={"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}, "q4": {"d1": 1, "d2": 1}},
        triples=[("q1", "d1", "d3"), ("q2", "d2", "d1"), ("q3", "d3", "d1"), ("q4", "d1", "d3")],
        candidates={"q1": ["d1", "d2"], "q2": ["d2"], "q3": ["d3"], "q4": ["d1"]},
    )
    val = Split(queries={"v": "v"}, qrels={"v": {"d2": 1}})
    answers = {
        ("q1", "d1"): [(0, 5)],  # word 0 of 4: 0.0
        ("q2", "d2"): [(4, 7), (45, 48)],  # words 1 and 9 of 10: 0.1 and 0.9
        ("q4", "d1"): [(6, 10)],
        ("q4", "d2"): [(14, 19)],  # 1/4 and 3/10
        ("v", "d2"): [(45, 48)],
    }
    return IRDataset(name="toy", docs=docs, splits={"train": train, "val": val, "test": Split()}, answers=answers)


def test_every_span_must_be_early_and_questions_without_spans_are_dropped():
    ds = _toy()
    b = apply_answer_bias(ds, 0.3)
    # q1 (0.0) kept; q2 has a span at 0.9; q3 has no span; q4's spans are at 0.25 and 0.3 (not < 0.3)
    assert list(b.splits["train"].queries) == ["q1"]
    assert b.splits["train"].triples == [("q1", "d1", "d3")] and b.splits["train"].candidates == {"q1": ["d1", "d2"]}
    assert b.answer_bias == {
        "keep_first": 0.3,
        "late_keep": 0.0,
        "seed": 13,
        "questions": 4,
        "kept": 1,
        "early": 1,
        "late_kept": 0,
        "late_dropped": 2,
        "no_answer_dropped": 1,
    }
    assert list(apply_answer_bias(ds, 0.31).splits["train"].queries) == ["q1", "q4"]
    assert b.splits["val"] is ds.splits["val"]


def test_late_keep_reweights_with_its_own_seed():
    ds = load_dataset(SyntheticConfig(), 0)
    hard = set(apply_answer_bias(ds, 0.25).splits["train"].queries)
    early, _ = _early_by_hand(ds, 0.25)
    late = set(ds.splits["train"].queries) - early
    assert set(apply_answer_bias(ds, 0.25, late_keep=1.0).splits["train"].queries) == set(ds.splits["train"].queries)
    half = apply_answer_bias(ds, 0.25, late_keep=0.5, seed=3)
    kept_late = set(half.splits["train"].queries) - hard
    assert kept_late <= late and kept_late == {q for q in late if late_kept(3, q, 0.5)}
    assert 0.35 < len(kept_late) / len(late) < 0.65
    assert half.answer_bias["late_kept"] == len(kept_late)
    assert set(apply_answer_bias(ds, 0.25, 0.5, seed=3).splits["train"].queries) == set(half.splits["train"].queries)
    other = set(apply_answer_bias(ds, 0.25, 0.5, seed=4).splits["train"].queries)
    assert other != set(half.splits["train"].queries) and other >= hard
    # the subset does not depend on the run seed (only on answer_bias_seed)
    cfg = SyntheticConfig(data_seed=0, answer_bias_keep_first=0.25, answer_bias_late_keep=0.5, answer_bias_seed=3)
    assert load_dataset(cfg, 1).splits["train"].queries == load_dataset(cfg, 2).splits["train"].queries


def test_the_data_module_builds_triples_from_the_biased_questions_only(tmp_path):
    def module(**bias) -> RankingDataModule:
        return synthetic_data(tmp_path, 5, **bias)

    plain, biased = module(), module(answer_bias_keep_first=0.3)
    early, _ = _early_by_hand(plain.dataset, 0.3)
    assert 0 < len(early) < 60
    assert {q for q, _, _ in biased.triples} == early
    # a query's sampled triples do not depend on the other queries: the biased triples are the plain ones of `early`
    assert biased.triples == [t for t in plain.triples if t[0] in early]
    for split in ("val", "test"):
        assert biased.eval_splits[split].qids == plain.eval_splits[split].qids
        assert biased.eval_splits[split].dtexts == plain.eval_splits[split].dtexts
    assert biased.dataset.answer_bias["kept"] == len(early)


def test_squad_biased_config_composes():
    cfg = compose(["data=squad_biased"])
    assert (
        cfg.data.source == "squad" and cfg.data.answer_bias_keep_first == 0.25 and cfg.data.answer_bias_late_keep == 0.0
    )
    assert compose(["data=squad"]).data.answer_bias_keep_first is None


@pytest.mark.parametrize(
    "argv, key",
    [
        (["data=squad_biased", "data.answer_bias_keep_first=0"], "data.answer_bias_keep_first"),
        (["data=squad_biased", "data.answer_bias_keep_first=1.5"], "data.answer_bias_keep_first"),
        (["data.answer_bias_keep_first=-0.2"], "data.answer_bias_keep_first"),
        (["data.answer_bias_keep_first=nan"], "data.answer_bias_keep_first"),
        (["data.answer_bias_keep_first=early"], "data.answer_bias_keep_first"),
        (["data=squad_biased", "data.answer_bias_late_keep=1.2"], "data.answer_bias_late_keep"),
        (["data.answer_bias_late_keep=0.3"], "data.answer_bias_late_keep"),  # without keep_first
        # the seed draws which later-answered questions late_keep keeps: none without a split, none at 0
        (["data.answer_bias_seed=3"], "data.answer_bias_seed"),
        (["data=squad_biased", "data.answer_bias_seed=3"], "data.answer_bias_seed"),
        (["data.answer_bias_keep_firstt=0.3"], "data.answer_bias_keep_firstt"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(argv, key):
    with pytest.raises(InputError) as e:
        compose(argv)
    assert key in e.value.where and "\n" not in str(e.value)


def test_the_seed_draws_only_with_a_late_keep_share():
    """Why `data.answer_bias_seed` is refused beside a hard filter: at late_keep 0 no seed changes the split, at 0.5
    the seed decides which later-answered questions stay."""
    ds = _toy()
    hard = [sorted(apply_answer_bias(ds, 0.25, 0.0, seed).splits["train"].queries) for seed in range(4)]
    assert hard.count(hard[0]) == 4
    soft = {tuple(sorted(apply_answer_bias(ds, 0.25, 0.5, seed).splits["train"].queries)) for seed in range(8)}
    assert len(soft) > 1
    assert compose(["data=squad_biased", "data.answer_bias_late_keep=0.5", "data.answer_bias_seed=3"])


def test_a_dataset_without_answers_cannot_be_biased():
    ds = dataclasses.replace(_toy(), answers={})
    with pytest.raises(InputError, match="data.answer_bias_keep_first.*no answer spans"):
        apply_answer_bias(ds, 0.25)
    with pytest.raises(InputError, match="no training question"):
        apply_answer_bias(dataclasses.replace(_toy(), answers={("q2", "d2"): [(45, 48)]}), 0.5)
