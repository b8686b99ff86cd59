"""Answer spans from answer strings (datamodules/answer_matching.py) and through the ir_datasets source, for
MS MARCO QnA-style queries that carry answer texts (a local dataset registered here; no download)."""

from __future__ import annotations

import uuid
from typing import NamedTuple

from analyses.positions import eval_units, relative_starts
from datamodules.answer_matching import match_answer_spans
from datamodules.sources import load_dataset
from datamodules.sources.ir_datasets_source import IrDatasetsConfig


def test_every_match_case_insensitive_at_word_boundaries():
    text = "The cat sat. the  Cat is (1980) old; cats purr"
    assert match_answer_spans(text, ["the cat"]) == [(0, 7), (13, 21)]  # any whitespace between words
    assert match_answer_spans(text, ["cat"]) == [(4, 7), (18, 21)]  # not inside "cats"
    assert match_answer_spans(text, ["(1980)", "1980"]) == [(25, 31), (26, 30)]
    assert match_answer_spans(text, ["No Answer Present.", "", "dog", "at"]) == []


class QnAQuery(NamedTuple):  # the fields of ir_datasets' MsMarcoQnAQuery
    query_id: str
    text: str
    type: str
    answers: tuple


def _register_qna(tmp_path) -> str:
    import ir_datasets
    from ir_datasets.formats import BaseQueries, TrecQrels, TsvDocs
    from ir_datasets.util import LocalDownload

    class Queries(BaseQueries):
        def queries_iter(self):
            yield QnAQuery("1", "who wrote it", "PERSON", ("Jane Doe",))
            yield QnAQuery("2", "when", "NUMERIC", ("No Answer Present.",))
            yield QnAQuery("3", "what colour", "DESCRIPTION", ("It is blue, mostly", "blue"))

        def queries_cls(self):
            return QnAQuery

    docs = tmp_path / "docs.tsv"
    docs.write_text(
        "p1\tit was written by jane doe in 1990 and jane  doe liked it\n"
        "p2\tnothing about that\np3\tthe sky is blue\np4\tblue is the colour of the sea\n"
    )
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("1 0 p1 1\n2 0 p2 1\n3 0 p3 1\n3 0 p4 1\n3 0 p1 0\n")
    name = f"isorank-test/{uuid.uuid4().hex}"
    ir_datasets.registry.register(
        name,
        ir_datasets.Dataset(TsvDocs(LocalDownload(str(docs))), Queries(), TrecQrels(LocalDownload(str(qrels)), {})),
    )
    return name


def test_ir_datasets_answers_become_spans_in_relevant_passages(tmp_path):
    name = _register_qna(tmp_path)
    ds = load_dataset(IrDatasetsConfig(train_id=None, val_id=None, test_id=name), 0)
    # all matches in each relevant passage; unmatched and placeholder answers give none (as the paper omits them)
    assert ds.answers == {("1", "p1"): [(18, 26), (39, 48)], ("3", "p3"): [(11, 15)], ("3", "p4"): [(0, 4)]}
    positions = relative_starts(ds, eval_units(ds, "test"))
    assert positions.tolist() == [4 / 13, 9 / 13, 3 / 4, 0 / 7]
