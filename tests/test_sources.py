"""Data sources: the synthetic default, SQuAD / classic collections from ../shared/data (skipped when absent), and
tsv / BEIR / ir_datasets from tiny files written here. Expected values are computed independently from the raw
files (or written by hand from them), never from the code under test."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO, shared_data
from omegaconf import OmegaConf

from core.errors import InputError
from datamodules.corpus import SPLITS, IRDataset
from datamodules.rotation import relative_answer_positions
from datamodules.sources import SOURCES, load_dataset
from datamodules.sources.beir import BeirConfig
from datamodules.sources.classic import (
    CacmConfig,
    CisiConfig,
    CranfieldConfig,
    VaswaniConfig,
)
from datamodules.sources.ir_datasets_source import IrDatasetsConfig
from datamodules.sources.squad import SquadConfig
from datamodules.sources.synthetic import (
    FUNCTION_WORDS,
    QUESTION_WORDS,
    SyntheticConfig,
)
from datamodules.sources.tsv import TsvConfig

ALL_SOURCES = ["synthetic", "squad", "cranfield", "vaswani", "cisi", "cacm", "tsv", "beir", "ir_datasets"]


def _all_splits(ds: IRDataset):
    assert set(ds.splits) == set(SPLITS)
    return [ds.splits[s] for s in SPLITS]


# ------------------------------------------------------------------------------------------------ registry, YAML


def test_every_source_is_registered_with_a_dataclass_schema():
    for name in ALL_SOURCES:
        entry = SOURCES.get(name)
        assert dataclasses.is_dataclass(entry.schema)
        assert entry.schema().source == name


@pytest.mark.parametrize(
    "yaml_name",
    ["synthetic", "squad", "squad_biased", "cranfield", "vaswani", "cisi", "cacm", "tsv", "beir", "ir_datasets"],
)
def test_data_yaml_holds_only_schema_keys(yaml_name):
    path = REPO / "configs" / "data" / f"{yaml_name}.yaml"
    raw = yaml.safe_load(path.read_text())
    assert next(iter(raw)) == "source"
    schema = SOURCES.get(raw["source"]).schema
    fields = {f.name: f for f in dataclasses.fields(schema)}
    assert set(raw) <= set(fields), set(raw) - set(fields)
    defaults = schema()
    for key, value in raw.items():
        if isinstance(getattr(defaults, key), bool):
            assert isinstance(value, bool), f"{key} must be a real boolean"
    OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.create(raw))  # types accepted by the schema


# ------------------------------------------------------------------------------------------------ synthetic


def test_synthetic_needs_no_files_and_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ../shared, no repo files
    a = load_dataset(SyntheticConfig(), 7)
    b = load_dataset(SyntheticConfig(), 7)
    c = load_dataset(SyntheticConfig(), 8)
    assert a == b
    assert a.docs != c.docs
    assert len(a.docs) == 600
    assert [len(s.queries) for s in _all_splits(a)] == [400, 40, 60]
    # data_seed pins the collection whatever the run seed
    assert load_dataset(SyntheticConfig(data_seed=3), 1) == load_dataset(SyntheticConfig(data_seed=3), 2)


def test_synthetic_structure_answers_and_relevance():
    ds = load_dataset(SyntheticConfig(), 0)
    name = re.compile(r"^[A-Z][a-z]+ [A-Z][a-z]+$")
    seen_answers = set()
    for split in _all_splits(ds):
        assert split.triples is None and split.candidates is None
        for qid, query in split.queries.items():
            words = query.split()
            assert 3 <= len(words) <= 8 and words[0] in QUESTION_WORDS
            judged = split.qrels[qid]
            assert sorted(judged.values(), reverse=True)[0] == 2 and set(judged.values()) <= {1, 2}
            (best,) = [d for d, g in judged.items() if g == 2]
            spans = ds.answers[(qid, best)]
            assert len(spans) == 1
            s, e = spans[0]
            answer = ds.docs[best][s:e]
            assert name.match(answer), answer  # exactly the two-word capitalised answer name
            assert answer not in seen_answers
            seen_answers.add(answer)
            # the key terms of the query are in its relevant passage
            doc_words = set(re.findall(r"\w+", ds.docs[best].lower()))
            keys = [w for w in words if w not in QUESTION_WORDS and w not in FUNCTION_WORDS]
            assert sum(k in doc_words for k in keys) >= 2
            for d, g in judged.items():
                if g == 1:
                    assert (qid, d) not in ds.answers
    assert len(ds.answers) == 500
    # every passage has 30..60 body words (+ evidence blocks); texts are normalized already
    for text in ds.docs.values():
        assert text == " ".join(text.split())
        assert len(text.split()) >= 30


def test_synthetic_has_hard_negatives_of_the_same_topic():
    ds = load_dataset(SyntheticConfig(), 0)
    vocab = {d: set(re.findall(r"[a-z]+", t.lower())) - set(FUNCTION_WORDS) for d, t in ds.docs.items()}
    split = ds.splits["test"]
    counts = []
    for qid in split.queries:
        (best,) = [d for d, g in split.qrels[qid].items() if g == 2]
        counts.append(sum(1 for d in ds.docs if d not in split.qrels[qid] and len(vocab[d] & vocab[best]) >= 5))
    assert np.median(counts) >= 10  # many non-relevant passages share topic vocabulary


def test_synthetic_answer_position_start_vs_uniform():
    def mean_pos(position):
        ds = load_dataset(SyntheticConfig(answer_position=position), 0)
        rel = [p for (q, d), spans in ds.answers.items() for p in relative_answer_positions(ds.docs[d], spans)]
        char = [s / len(ds.docs[d]) for (q, d), spans in ds.answers.items() for s, _ in spans]
        return np.mean(rel), np.mean(char)

    uni_w, uni_c = mean_pos("uniform")
    start_w, start_c = mean_pos("start")
    assert 0.42 < uni_w < 0.58 and 0.42 < uni_c < 0.58
    assert start_w < 0.25 and start_c < 0.25  # Beta(1, 6): mean 1/7, plus the evidence block offset
    with pytest.raises(InputError, match="data.answer_position"):
        load_dataset(SyntheticConfig(answer_position="middle"), 0)
    with pytest.raises(InputError, match="data.num_docs"):
        load_dataset(SyntheticConfig(num_docs=100), 0)


# ------------------------------------------------------------------------------------------------ SQuAD


@pytest.mark.data("squad_v1.1_dev/dev-v1.1.json.gz")
def test_squad_paragraph_retrieval_split_by_article(monkeypatch):
    path = shared_data("squad_v1.1_dev", "dev-v1.1.json.gz")
    monkeypatch.chdir(REPO)  # the default path is relative to the repo root
    ds = load_dataset(SquadConfig(), 0)
    raw = json.load(gzip.open(path))
    contexts = [p["context"] for a in raw["data"] for p in a["paragraphs"]]
    answers = {
        qa["id"]: (p["context"], {x["text"] for x in qa["answers"]}, qa["question"])
        for a in raw["data"]
        for p in a["paragraphs"]
        for qa in p["qas"]
    }
    assert len(ds.docs) == 2067 == len(contexts)
    assert sorted(ds.docs.values()) == sorted(contexts)
    assert sum(len(s.queries) for s in _all_splits(ds)) == 10570 == len(answers)
    articles = {}
    for name in SPLITS:
        split = ds.splits[name]
        assert split.triples is None and split.candidates is None
        for qid, question in split.queries.items():
            context, texts, q = answers[qid]
            assert question == q
            (doc,) = split.qrels[qid]
            assert split.qrels[qid][doc] == 1 and ds.docs[doc] == context
            articles.setdefault(doc.split("-")[0], set()).add(name)
            spans = ds.answers[(qid, doc)]
            assert {context[s:e] for s, e in spans} == texts  # every distinct answer, each slicing to its text
    assert all(len(v) == 1 for v in articles.values())  # no article in two splits
    by_split = {n: sum(1 for v in articles.values() if n in v) for n in SPLITS}
    assert by_split == {"train": 34, "val": 7, "test": 7}  # 48 articles, 0.15 each
    assert (
        load_dataset(SquadConfig(), 1).splits["test"].queries == ds.splits["test"].queries
    )  # split_seed, not run seed
    capped = load_dataset(SquadConfig(max_questions_per_split=50), 0)
    assert [len(s.queries) for s in _all_splits(capped)] == [50, 50, 50]
    assert set(capped.splits["val"].queries) <= set(ds.splits["val"].queries)


# ------------------------------------------------------------------------------------------------ classic


def _split_sanity(ds: IRDataset, n_queries: int):
    qids = [q for s in _all_splits(ds) for q in s.queries]
    assert len(qids) == len(set(qids)) == n_queries
    for s in _all_splits(ds):
        assert s.triples is None and s.candidates is None
        for q in s.queries:
            assert any(g > 0 for g in s.qrels[q].values())


@pytest.mark.data("cranfield")
def test_cranfield(monkeypatch):
    folder = shared_data("cranfield")
    monkeypatch.chdir(REPO)
    ds = load_dataset(CranfieldConfig(), 0)
    records = re.findall(r"^\.I (\d+)", (folder / "cran.all.1400").read_text(), flags=re.M)
    assert len(records) == 1400
    # docs 471 and 995 have neither title nor abstract in the file: left out
    assert len(ds.docs) == 1398 and set(records) - set(ds.docs) == {"471", "995"}
    assert ds.docs["5"].startswith("one-dimensional transient heat conduction into a double-layer slab")
    _split_sanity(ds, 225)
    queries = {q: t for s in _all_splits(ds) for q, t in s.queries.items()}
    qrels = {q: j for s in _all_splits(ds) for q, j in s.qrels.items()}
    # query ids are positions: the 3rd query in cran.qry is ".I 004", the 225th ".I 365"
    assert queries["3"] == "what problems of heat conduction in composite slabs have been solved so far ."
    assert queries["225"].startswith("what design factors can be used to control lift-drag ratios at mach")
    # cranqrel lines "1 184 2", "1 12 3", "1 13 4", "2 12 1", "1 486 -1", "3 5 3": gain = 5 - code, -1 -> 0
    assert qrels["1"]["184"] == 3 and qrels["1"]["12"] == 2 and qrels["1"]["13"] == 1
    assert qrels["2"]["12"] == 4 and qrels["1"]["486"] == 0 and qrels["3"]["5"] == 2
    assert "995" not in qrels["125"]  # the one judgement of an empty doc
    lines = [ln.split() for ln in (folder / "cranqrel").read_text().splitlines() if ln.strip()]
    assert sum(len(j) for j in qrels.values()) == len({(a, b) for a, b, _ in lines}) - 1
    assert (len(ds.splits["val"].queries), len(ds.splits["test"].queries)) == (34, 56)  # round(.15/.25 * 225)


@pytest.mark.data("vaswani_npl")
def test_vaswani(monkeypatch):
    monkeypatch.chdir(REPO)
    ds = load_dataset(VaswaniConfig(), 0)
    assert len(ds.docs) == 11429
    assert ds.docs["1"] == (
        "compact memories have flexible capacities a digital data storage system with capacity up "
        "to bits and random and or sequential access is described"
    )
    _split_sanity(ds, 93)
    queries = {q: t for s in _all_splits(ds) for q, t in s.queries.items()}
    qrels = {q: j for s in _all_splits(ds) for q, j in s.qrels.items()}
    assert queries["1"] == "MEASUREMENT OF DIELECTRIC CONSTANT OF LIQUIDS BY THE USE OF MICROWAVE TECHNIQUES"
    assert sum(len(j) for j in qrels.values()) == 2083
    assert qrels["1"]["1239"] == 1 and qrels["1"]["4462"] == 1  # first qrels lines


@pytest.mark.data("cisi", "cacm")
def test_cisi_and_cacm(monkeypatch):
    monkeypatch.chdir(REPO)
    cisi = load_dataset(CisiConfig(), 0)
    assert len(cisi.docs) == 1460
    _split_sanity(cisi, 76)  # 112 queries, 76 judged
    assert sum(len(j) for s in _all_splits(cisi) for j in s.qrels.values()) == 3114
    assert cisi.docs["1"].startswith("18 Editions of the Dewey Decimal Classifications The present study")
    cacm = load_dataset(CacmConfig(), 0)
    assert len(cacm.docs) == 3204
    _split_sanity(cacm, 52)  # 64 topics, 52 judged
    qrels = {q: j for s in _all_splits(cacm) for q, j in s.qrels.items()}
    assert sum(len(j) for j in qrels.values()) == 796
    assert qrels["1"]["CACM-1410"] == 1  # "1 Q0 CACM-1410 1"; the collection's id is CACM-1410 too
    assert "CACM-756" in cacm.docs  # collection "CACM-0756" == qrels "CACM-756"


@pytest.mark.data("cranfield")
def test_classic_split_is_seeded_and_fractional(monkeypatch):
    monkeypatch.chdir(REPO)
    a = load_dataset(CranfieldConfig(), 0)
    b = load_dataset(CranfieldConfig(), 99)
    c = load_dataset(CranfieldConfig(split_seed=1), 0)
    assert a.splits["test"].queries == b.splits["test"].queries  # run seed does not move the test set
    assert a.splits["test"].queries != c.splits["test"].queries
    d = load_dataset(CranfieldConfig(val_fraction=0.1, test_fraction=0.2), 0)
    assert [len(d.splits[s].queries) for s in SPLITS] == [158, 22, 45]


# ------------------------------------------------------------------------------------------------ tsv


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture()
def tsv_files(tmp_path):
    return {
        "collection": _write(
            tmp_path / "collection.tsv.gz", "d1\tthe cat sat on the mat\nd2\tdogs bark at night\nd3\ta cat and a dog\n"
        ),
        "train_queries": _write(tmp_path / "q.train.tsv", "q1\twhere did the cat sit\nq2\twhat do dogs do\n"),
        "train_qrels": _write(tmp_path / "qrels.train.txt", "q1 0 d1 1\nq2 0 d2 2\nq2 0 d3 0\n"),
        "train_triples": _write(tmp_path / "triples.tsv", "q1\td1\td2\nq2\td2\td1\n"),
        "val_queries": _write(tmp_path / "q.val.tsv", "q3\tcat and dog\n"),
        "val_qrels": _write(tmp_path / "qrels.val.txt", "q3 0 d3 1\n"),
        "val_run": _write(tmp_path / "run.val.txt", "q3 Q0 d1 2 1.5 bm25\nq3 Q0 d3 1 2.5 bm25\nq3 Q0 d2 3 1.5 bm25\n"),
    }


def test_tsv_ids(tsv_files):
    ds = load_dataset(TsvConfig(**tsv_files), 0)
    assert ds.docs == {"d1": "the cat sat on the mat", "d2": "dogs bark at night", "d3": "a cat and a dog"}
    train, val, test = _all_splits(ds)
    assert train.queries == {"q1": "where did the cat sit", "q2": "what do dogs do"}
    assert train.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2, "d3": 0}}
    assert train.triples == [("q1", "d1", "d2"), ("q2", "d2", "d1")]
    assert train.candidates is None
    assert val.triples is None and val.candidates == {"q3": ["d3", "d1", "d2"]}  # by score, ties by rank
    assert test.queries == {} and test.qrels == {} and test.candidates is None


def test_one_trec_run_reader_for_candidates_and_runs(tmp_path):
    """datamodules.textfiles reads every run file: scores as written, candidates best first (score, then rank), and
    the same errors for both uses, each naming the file and line (trec_eval refuses a document listed twice)."""
    from datamodules.textfiles import read_trec_run, run_candidates

    run = _write(tmp_path / "run.txt", "q1 Q0 d1 2 1.5 x\nq1 Q0 d3 1 2.5 x\nq1 Q0 d2 3 1.5 x\nq2 Q0 d1 1 -0.5 x\n")
    assert read_trec_run(run) == {"q1": {"d1": 1.5, "d3": 2.5, "d2": 1.5}, "q2": {"d1": -0.5}}
    assert run_candidates(run) == {"q1": ["d3", "d1", "d2"], "q2": ["d1"]}
    for text, message in (
        ("q1 Q0 d1 1 2.0 x\nq1 Q0 d1 2 1.0 x\n", r"run.bad:2: document 'd1' listed twice for query 'q1'"),
        ("q1 Q0 d1 1 nan x\n", r"run.bad:1: score 'nan' is not finite"),
        ("q1 Q0 d1 one 2.0 x\n", r"run.bad:1: rank 'one' is not an integer"),
    ):
        bad = _write(tmp_path / "run.bad", text)
        for reader in (read_trec_run, run_candidates):
            with pytest.raises(InputError, match=message):
                reader(bad)


def test_tsv_text_triples(tmp_path, tsv_files):
    tsv_files["train_triples"] = _write(
        tmp_path / "triples.text.tsv",
        "where did the cat sit\tthe cat sat on the mat\ta brand new passage\n"
        "a new query\ta brand new passage\tdogs bark at night\n",
    )
    ds = load_dataset(TsvConfig(**tsv_files, triples_format="text"), 0)
    train = ds.splits["train"]
    (t1, t2) = train.triples
    assert t1[0] == "q1" and t1[1] == "d1"  # known texts keep their ids
    new_doc = t1[2]
    assert new_doc.startswith("h") and ds.docs[new_doc] == "a brand new passage" and t2[1] == new_doc
    assert t2[2] == "d2" and train.queries[t2[0]] == "a new query" and t2[0].startswith("q")
    again = load_dataset(TsvConfig(**tsv_files, triples_format="text"), 5)
    assert again.splits["train"].triples == train.triples  # content ids: deterministic


def _split_fields(split):
    return split.queries, split.qrels, split.triples, split.candidates, split.origins


@pytest.mark.parametrize("used", [("train",), ("val",), ("test",), ("val", "test"), ()])
def test_tsv_reads_only_the_used_splits(tmp_path, tsv_files, used):
    """Rule 8 of issue 35: a split the job does not use is never read. Each unused split's files are replaced by
    broken ones (a line without a tab), which a read would refuse; the used splits equal those of a whole read."""
    whole = load_dataset(TsvConfig(**tsv_files), 0)
    broken = dict(tsv_files)
    for name in ("train", "val", "test"):
        if name not in used:
            for kind in ("queries", "qrels", "run", "triples"):
                if f"{name}_{kind}" in broken:
                    broken[f"{name}_{kind}"] = _write(tmp_path / f"broken.{name}.{kind}", "no tab here\n")
    with pytest.raises(InputError):
        load_dataset(TsvConfig(**broken), 0)
    ds = load_dataset(TsvConfig(**broken), 0, splits=used)
    assert ds.docs == whole.docs
    for name in ("train", "val", "test"):
        if name in used:
            assert _split_fields(ds.splits[name]) == _split_fields(whole.splits[name])
        else:
            assert not ds.splits[name].queries and not ds.splits[name].qrels and ds.splits[name].triples is None


def test_tsv_text_triples_are_read_by_every_job(tmp_path, tsv_files):
    """Text triples add passages to the document store, so a test-only job reads them too: same collection."""
    tsv_files["train_triples"] = _write(tmp_path / "t.tsv", "where did the cat sit\tthe cat sat on the mat\tnew one\n")
    whole = load_dataset(TsvConfig(**tsv_files, triples_format="text"), 0)
    test_only = load_dataset(TsvConfig(**tsv_files, triples_format="text"), 0, splits=("test",))
    assert dict(test_only.docs) == dict(whole.docs) and "new one" in set(whole.docs.values())
    assert test_only.splits["train"].queries == {} and test_only.splits["train"].triples is None


# ------------------------------------------------------------------------------------------------ BEIR


def _beir(folder: Path, with_dev: bool):
    _write(
        folder / "corpus.jsonl",
        "\n".join(
            json.dumps(o)
            for o in [
                {"_id": "c1", "title": "Cats", "text": "cats purr", "metadata": {}},
                {"_id": "c2", "title": "", "text": "dogs bark"},
                {"_id": "c3", "title": "Fish", "text": "fish swim"},
            ]
        )
        + "\n",
    )
    _write(
        folder / "queries.jsonl",
        "\n".join(json.dumps({"_id": f"q{i}", "text": f"question {i}"}) for i in range(1, 11)) + "\n",
    )
    rows = "".join(f"q{i}\tc{1 + i % 3}\t{1 + i % 2}\n" for i in range(1, 9))
    _write(folder / "qrels" / "train.tsv", "query-id\tcorpus-id\tscore\n" + rows)
    _write(folder / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq9\tc1\t1\nq10\tc2\t0\nq10\tc3\t2\n")
    if with_dev:
        _write(folder / "qrels" / "dev.tsv", "query-id\tcorpus-id\tscore\nq1\tc2\t1\n")


def test_beir_with_and_without_dev(tmp_path):
    _beir(tmp_path / "a", with_dev=True)
    ds = load_dataset(BeirConfig(path=str(tmp_path / "a")), 0)
    assert ds.docs == {"c1": "Cats cats purr", "c2": "dogs bark", "c3": "Fish fish swim"}
    train, val, test = _all_splits(ds)
    assert len(train.queries) == 8 and train.qrels["q2"] == {"c3": 1} and train.qrels["q3"] == {"c1": 2}
    assert val.queries == {"q1": "question 1"} and val.qrels == {"q1": {"c2": 1}}
    assert test.qrels == {"q9": {"c1": 1}, "q10": {"c2": 0, "c3": 2}} and set(test.queries) == {"q9", "q10"}
    assert load_dataset(BeirConfig(path=str(tmp_path / "a"), use_title=False), 0).docs["c1"] == "cats purr"

    _beir(tmp_path / "b", with_dev=False)
    cfg = BeirConfig(path=str(tmp_path / "b"), val_fraction=0.25)
    ds = load_dataset(cfg, 0)
    train, val, _ = _all_splits(ds)
    assert len(val.queries) == 2 and len(train.queries) == 6 and not set(val.queries) & set(train.queries)
    assert load_dataset(cfg, 1).splits["val"].queries == val.queries  # split_seed, deterministic


def test_beir_only_test(tmp_path):
    folder = tmp_path / "t"
    _beir(folder, with_dev=False)
    (folder / "qrels" / "train.tsv").unlink()
    train, val, test = _all_splits(load_dataset(BeirConfig(path=str(folder)), 0))
    assert train.queries == {} and val.queries == {} and len(test.queries) == 2


@pytest.mark.parametrize("with_dev", [True, False])
@pytest.mark.parametrize("used", [("train",), ("val",), ("test",), ("train", "test")])
def test_beir_reads_only_the_used_splits(tmp_path, with_dev, used):
    """The used splits equal a whole read's (a dev split derived from train included); an unused split's qrels file
    is not read: a broken one does not stop the job."""
    folder = tmp_path / "b"
    _beir(folder, with_dev=with_dev)
    cfg = BeirConfig(path=str(folder), val_fraction=0.25)
    whole = load_dataset(cfg, 0)
    needs_train = "train" in used or ("val" in used and not with_dev)
    broken = []
    for name, file in (("train", "train"), ("val", "dev"), ("test", "test")):
        if not (folder / "qrels" / f"{file}.tsv").exists() or name in used or (name == "train" and needs_train):
            continue
        broken.append(_write(folder / "qrels" / f"{file}.tsv", "query-id\tcorpus-id\tscore\nq1\tc1\tnot a number\n"))
    if broken:  # (train and test used, no dev file: nothing is left to break)
        with pytest.raises(InputError, match="relevance score"):
            load_dataset(cfg, 0)
    ds = load_dataset(cfg, 0, splits=used)
    for name in ("train", "val", "test"):
        if name in used:
            assert _split_fields(ds.splits[name]) == _split_fields(whole.splits[name])
        else:
            assert ds.splits[name].queries == {} and ds.splits[name].qrels == {}


# ------------------------------------------------------------------------------------------------ ir_datasets


def _register_local(tmp_path: Path, with_pairs: bool = True) -> str:
    import ir_datasets
    from ir_datasets.formats import (
        TrecQrels,
        TrecScoredDocs,
        TsvDocPairs,
        TsvDocs,
        TsvQueries,
    )
    from ir_datasets.util import LocalDownload

    docs = _write(tmp_path / "docs.tsv", "".join(f"p{i}\tpassage number {i} about topic {i % 3}\n" for i in range(10)))
    queries = _write(tmp_path / "queries.tsv", "".join(f"{i}\tquery {i}\n" for i in range(1, 6)))
    qrels = _write(tmp_path / "qrels.txt", "1 0 p1 1\n2 0 p2 2\n3 0 p3 1\n3 0 p4 0\n")
    pairs = _write(tmp_path / "pairs.tsv", "1\tp1\tp5\n2\tp2\tp6\n3\tp3\tp7\n1\tp1\tp8\n")
    run = _write(tmp_path / "run.txt", "1 Q0 p9 1 9.0 r\n1 Q0 p1 2 8.5 r\n2 Q0 p2 1 3.0 r\n")
    parts = [TsvDocs(LocalDownload(docs)), TsvQueries(LocalDownload(queries)), TrecQrels(LocalDownload(qrels), {})]
    if with_pairs:
        parts.append(TsvDocPairs(LocalDownload(pairs)))
    parts.append(TrecScoredDocs(LocalDownload(run)))
    name = f"isorank-test/{uuid.uuid4().hex}"
    ir_datasets.registry.register(name, ir_datasets.Dataset(*parts))
    return name


def test_ir_datasets_local(tmp_path):
    with_pairs = _register_local(tmp_path / "a", with_pairs=True)
    no_pairs = _register_local(tmp_path / "b", with_pairs=False)
    ds = load_dataset(IrDatasetsConfig(train_id=with_pairs, val_id=no_pairs, test_id=None), 0)
    assert len(ds.docs) == 10 and ds.docs["p3"] == "passage number 3 about topic 0"
    train, val, test = _all_splits(ds)
    assert train.triples == [("1", "p1", "p5"), ("2", "p2", "p6"), ("3", "p3", "p7"), ("1", "p1", "p8")]
    assert train.queries == {"1": "query 1", "2": "query 2", "3": "query 3"}  # the queries named by triples
    assert train.qrels == {"1": {"p1": 1}, "2": {"p2": 2}, "3": {"p3": 1, "p4": 0}}
    assert train.candidates == {"1": ["p9", "p1"], "2": ["p2"]}
    assert val.triples is None and val.queries == {"1": "query 1", "2": "query 2", "3": "query 3"}  # queries with qrels
    assert test.queries == {} and test.triples is None and test.candidates is None

    capped = load_dataset(
        IrDatasetsConfig(
            train_id=with_pairs,
            val_id=None,
            test_id=None,
            max_docpairs=2,
            max_queries_per_split=1,
            only_referenced_docs=True,
        ),
        0,
    )
    train = capped.splits["train"]
    assert train.triples == [("1", "p1", "p5")] and list(train.queries) == ["1"]
    assert set(capped.docs) == {"p1", "p5", "p9"}  # qrels, triples and candidates of the kept query


def test_ir_datasets_unknown_id():
    with pytest.raises(InputError, match="data.train_id"):
        load_dataset(IrDatasetsConfig(train_id="no-such-dataset/xyz", val_id=None, test_id=None), 0)


# ------------------------------------------------------------------------------------------------ split keys


def _perturbed(key: str, tmp_path: Path):
    """A value for a source key of one split that a read of that split would refuse or that would change it."""
    if key.endswith("_id"):
        return "isorank-test/no-such-dataset"
    if key.endswith(("_queries", "_qrels", "_run", "_triples")):
        return str(tmp_path / "missing" / f"{key}.tsv")
    # triples_format: "text" makes every job read the triples (not refused then), so "ids" is its one refused value
    return {"triples_format": "ids", "val_fraction": 0.9, "split_seed": 99}.get(key, "nosuch")


def _read(cfg, used) -> tuple:
    ds = load_dataset(cfg, 0, splits=used)
    return dict(ds.docs), {name: _split_fields(split) for name, split in ds.splits.items()}


def _split_key_worlds(tmp_path: Path, tsv_files: dict) -> list:
    tsv = {
        **tsv_files,
        "test_queries": _write(tmp_path / "q.test.tsv", "q4\tdogs at night\n"),
        "test_qrels": _write(tmp_path / "qrels.test.txt", "q4 0 d2 1\n"),
    }
    text = {
        **tsv,
        "train_triples": _write(tmp_path / "t.text.tsv", "where did the cat sit\tthe cat sat on the mat\tnew\n"),
    }
    _beir(tmp_path / "dev", with_dev=True)
    _beir(tmp_path / "nodev", with_dev=False)
    local = _register_local(tmp_path / "ir", with_pairs=True)
    return [
        TsvConfig(**tsv),
        TsvConfig(**text, triples_format="text"),
        BeirConfig(path=str(tmp_path / "dev")),
        BeirConfig(path=str(tmp_path / "nodev"), val_fraction=0.25),
        IrDatasetsConfig(train_id=local, val_id=local, test_id=local),
    ]


def test_a_key_of_a_split_a_job_does_not_read_changes_nothing(tmp_path, tsv_files):
    """What `DataConfig.split_keys` declares is what the sources do: for every split set a job may read, each key
    declared unread (`split_keys_unread`, the keys pipeline/jobs.py refuses on the command line) may be set to a value
    that a read would refuse (a missing file, an unknown id) or that would change the split (another seed, fraction or
    qrels name), and the dataset read is the same; every such key has a value that a whole read refuses or feels."""
    from datamodules.config import split_keys_unread

    worlds = _split_key_worlds(tmp_path, tsv_files)
    tried, felt = set(), set()
    for cfg in worlds:
        for used in [("train",), ("val",), ("test",), ("val", "test"), ("train", "val")]:
            before = _read(cfg, used)
            for key in split_keys_unread(cfg, used):
                name = key.removeprefix("data.")
                changed = dataclasses.replace(cfg, **{name: _perturbed(name, tmp_path)})
                if key not in split_keys_unread(changed, used):  # the new value makes the job read it: not refused
                    continue
                tried.add((cfg.source, name))
                assert _read(changed, used) == before, (cfg.source, used, name)
                try:
                    if _read(changed, None) != _read(cfg, None):
                        felt.add((cfg.source, name))
                except InputError:
                    felt.add((cfg.source, name))
    declared = {(c.source, k) for c in worlds for k in c.split_keys()}
    assert tried == declared  # every declared key tried
    assert felt == declared - {("tsv", "triples_format")}  # each read by a job of every split (ids: the only value)
    # the sources whose one file holds every split declare nothing
    for source in ("synthetic", "squad", "cranfield"):
        assert SOURCES.get(source).schema().split_keys() == {}
