"""One report from every job (issue 49): the results table, versions.json, the cache folder's default and the note on
passages cut shorter than the backbone was trained for."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from importlib import metadata
from pathlib import Path

import pytest

from core.io import file_sha256
from metrics.results import print_table, write_result_dir


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of a printed table (rich's box characters as separators), header first."""
    rows = []
    for line in text.splitlines():
        if "│" in line or "┃" in line:
            rows.append([c.strip() for c in re.split("[│┃]", line)[1:-1]])
    return rows


def test_table_has_a_row_per_measure_and_a_column_per_result(capsys):
    print_table({"before": {"ndcg_cut_10": 0.5, "iw": 0.25}, "after": {"ndcg_cut_10": 0.75, "mrr_10": 1 / 3}}, "t")
    rows = table_rows(capsys.readouterr().out)
    # rows follow the last column; a measure a column lacks is a dash
    assert rows == [["metric", "before", "after"], ["ndcg_cut_10", "0.5000", "0.7500"], ["mrr_10", "-", "0.3333"]]


def test_versions_json_records_the_installed_libraries_beside_metrics(tmp_path):
    metrics = {"ndcg_cut_10": 0.5}
    write_result_dir(tmp_path, metrics, {"q": metrics}, {"q": {"d": 1.0}}, tag="t", versions={"stemmer": "s-1"})
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics  # metrics.json holds the measures alone
    versions = json.loads((tmp_path / "versions.json").read_text())
    assert versions["stemmer"] == "s-1"
    for dist in ("torch", "transformers", "tokenizers", "pytorch-lightning", "bm25s", "PyStemmer", "faiss-cpu"):
        assert versions["libraries"][dist] == metadata.version(dist)


def test_bm25_stemmer_is_named_with_its_exact_version():
    from datamodules.bm25 import settings

    assert settings()["stemmer"] == f"pystemmer-english-{metadata.version('PyStemmer')}"


def test_cache_dir_defaults_to_the_users_cache_directory(monkeypatch, tmp_path):
    from pipeline.config import compose

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compose(["data=cranfield"]).data.cache_dir == str(tmp_path / "xdg" / "isorank")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: only an absolute path counts
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compose([]).data.cache_dir == str(tmp_path / "home" / ".cache" / "isorank")
    assert compose(["data.cache_dir=elsewhere"]).data.cache_dir == "elsewhere"


def test_tests_never_build_caches_in_the_real_home_cache():
    import os
    import tempfile

    assert os.environ["XDG_CACHE_HOME"].startswith(tempfile.gettempdir())


@pytest.fixture(scope="module")
def st_backbone(tiny_bert, tmp_path_factory) -> str:
    """The tiny BERT as a sentence-transformers folder stating it was trained for 24 tokens."""
    path = tmp_path_factory.mktemp("st") / "bert"
    shutil.copytree(tiny_bert, path)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24, "do_lower_case": False}))
    return str(path)


def test_length_note_names_the_key_when_passages_are_cut_shorter(st_backbone, tiny_bert):
    from models.rankers import ranker_config
    from models.rankers.limits import passage_length_note

    note = passage_length_note(ranker_config({"name": "repbert", "backbone": st_backbone, "doc_max_len": 16}))
    assert "model.doc_max_len=16" in note and "set model.doc_max_len=24" in note
    assert passage_length_note(ranker_config({"name": "repbert", "backbone": st_backbone, "doc_max_len": 24})) is None
    # a plain BERT states no trained length (its tokenizer's 512 is the positions' limit): no note
    assert passage_length_note(ranker_config({"name": "repbert", "backbone": tiny_bert, "doc_max_len": 16})) is None


def evaluate(argv: list[str], capsys) -> tuple[str, list[str]]:
    """evaluate.py's job in this process: what it printed, and the messages of the warnings it gave."""
    from pipeline.cli import main
    from pipeline.run import evaluate as job

    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Python's once-per-place filter must not hide a warning an earlier test gave
        assert main(argv, job) == 0
    return capsys.readouterr().out, [str(w.message) for w in caught]


TINY = ["data=synthetic", "data.num_docs=40", "data.num_train_queries=4", "data.num_val_queries=2"]
TINY += ["data.num_test_queries=6", "logger=none", "eval.measures=[ndcg_cut_10,P_20,mrr_10]"]


@pytest.mark.slow
def test_bm25_and_dense_evaluations_print_one_layout(st_backbone, tmp_path, capsys):
    """A BM25 and a dense evaluation print the same table (rows: the measures as metrics.json names them, values
    as it holds them to 4 decimals) and record their versions; the dense one, on a backbone trained for 24 tokens
    with passages cut at 16, says so once, naming the key."""
    bm25_out, dense_out = tmp_path / "bm25", tmp_path / "dense"
    bm25, _ = evaluate([*TINY, "model=bm25", f"output_dir={bm25_out}"], capsys)
    dense, said = evaluate(
        [*TINY, "retrieval=dense", "model=repbert", f"model.backbone={st_backbone}", "model.doc_max_len=16"]
        + [f"output_dir={dense_out}", "retrieval.k=20"],
        capsys,
    )
    for text, out in ((bm25, bm25_out), (dense, dense_out)):
        metrics = json.loads((out / "metrics.json").read_text())
        rows = table_rows(text)
        assert "test metrics" in text
        assert rows == [["metric", "value"]] + [[m, f"{metrics[m]:.4f}"] for m in ("ndcg_cut_10", "P_20", "mrr_10")]
        assert json.loads((out / "versions.json").read_text())["libraries"]["torch"] == metadata.version("torch")
    assert "\t" not in dense  # no tab-separated lines of its own any more
    tok = json.loads((dense_out / "versions.json").read_text())["tokenizer"]
    files = {f: file_sha256(Path(st_backbone) / f) for f in ("tokenizer.json", "tokenizer_config.json")}
    assert tok["name"] == st_backbone and tok["files"] == files
    assert json.loads((bm25_out / "versions.json").read_text())["stemmer"].startswith("pystemmer-english-")
    notes = [m for m in said if "model.doc_max_len" in m]
    assert len(notes) == 1 and notes[0].startswith("passages are cut at model.doc_max_len=16"), said


def test_dated_records_carry_the_versions(tmp_path):
    """The records under results/ (experiments.py's, bench/'s) name the exact versions that made them."""
    from bench import record as bench_record
    from grid.record import write_record

    grid_md = write_record("x", "t", "python experiments.py grid=g", "body", root=tmp_path)
    bench_md, _ = bench_record.write_record(tmp_path, "y", "t", [], "body", [], ["a"], bench_record.utc_now())
    for md in (grid_md, bench_md):
        text = md.read_text()
        for dist in ("torch", "transformers", "tokenizers", "pytorch-lightning", "bm25s", "PyStemmer", "faiss-cpu"):
            assert f"{dist} {metadata.version(dist)}" in text, (dist, text)
