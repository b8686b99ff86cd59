"""Bad data input: every case is one InputError naming FILE:LINE (or the config key) and what was expected.
Cross-reference errors are raised by IRDataset.validate() through load_dataset."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import SMALL_SYNTHETIC

from core.errors import InputError
from datamodules.corpus import IRDataset
from datamodules.sources import load_dataset
from datamodules.sources.beir import BeirConfig
from datamodules.sources.classic import CacmConfig, CranfieldConfig, VaswaniConfig
from datamodules.sources.squad import SquadConfig
from datamodules.sources.synthetic import SyntheticConfig
from datamodules.sources.tsv import TsvConfig

COLLECTION = "d1\tthe cat sat\nd2\tdogs bark\nd3\ta cat and a dog\n"
QUERIES = "q1\tcat\nq2\tdogs\n"
QRELS = "q1 0 d1 1\nq2 0 d2 1\n"


def _w(path: Path, text: str, gz: bool = False) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def _tsv(tmp_path: Path, **override) -> TsvConfig:
    files = {
        "collection": ("collection.tsv", COLLECTION),
        "train_queries": ("queries.tsv", QUERIES),
        "train_qrels": ("qrels.txt", QRELS),
    }
    kw = {}
    for key, (name, text) in files.items():
        kw[key] = _w(tmp_path / name, text)
    for key, value in override.items():
        if isinstance(value, tuple):
            kw[key] = _w(tmp_path / value[0], value[1])
        else:
            kw[key] = value
    return TsvConfig(**kw)


def _error(cfg) -> str:
    with pytest.raises(InputError) as e:
        load_dataset(cfg, 0)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_good_tsv_loads(tmp_path):
    ds = load_dataset(_tsv(tmp_path), 0)
    assert len(ds.docs) == 3 and ds.splits["train"].qrels == {"q1": {"d1": 1}, "q2": {"d2": 1}}


@pytest.mark.parametrize(
    "key,name,text,line,expect",
    [
        (
            "collection",
            "collection.tsv",
            "d1\tok\nd2\tno tab here but\textra\tcolumns\nd3\tok\n",
            2,
            "expected 2 tab-separated columns",
        ),
        ("collection", "collection.tsv", "d1\tok\nd2 without a tab\n", 2, "expected 2 tab-separated columns"),
        ("collection", "collection.tsv", "d1\tok\nd2\tok\nd3\t   \n", 3, "empty passage text"),
        ("collection", "collection.tsv", "d1\tok\nd1\tagain\n", 2, "duplicate passage id 'd1' (first at line 1)"),
        ("train_queries", "queries.tsv", "q1\tcat\nq2\t\n", 2, "empty query text"),
        ("train_qrels", "qrels.txt", "q1 0 d1 1\nq2 0 d2 yes\n", 2, "relevance 'yes' is not an integer"),
        ("train_qrels", "qrels.txt", "q1 0 d1 1\nq2 0 d2\n", 2, "expected 4 whitespace-separated columns"),
        ("train_qrels", "qrels.txt", "q1 0 d1 1.5\n", 1, "is not an integer"),
        ("val_run", "run.txt", "q1 Q0 d1 1 2.0 bm25\nq1 Q0 d2 2 1.0\n", 2, "expected 6 whitespace-separated columns"),
        ("val_run", "run.txt", "q1 Q0 d1 1 high bm25\n", 1, "score 'high' is not a number"),
        ("val_run", "run.txt", "q1 Q0 d1 first 2.0 bm25\n", 1, "rank 'first' is not an integer"),
        ("train_triples", "triples.tsv", "q1\td1\td2\nq2\td2\n", 2, "expected 3 tab-separated columns"),
    ],
)
def test_malformed_tsv_trec_lines(tmp_path, key, name, text, line, expect):
    extra = {"val_queries": _w(tmp_path / "vq.tsv", QUERIES)} if key == "val_run" else {}
    msg = _error(_tsv(tmp_path, **{key: (name, text)}, **extra))
    assert f"{name}:{line}:" in msg and expect in msg, msg


def test_malformed_text_triples(tmp_path):
    msg = _error(
        _tsv(tmp_path, train_triples=("t.tsv", "cat\tthe cat sat\tdogs bark\ncat\tonly two\n"), triples_format="text")
    )
    assert "t.tsv:2:" in msg and "expected 3 tab-separated columns" in msg
    msg = _error(_tsv(tmp_path, train_triples=("t2.tsv", "cat\t \tdogs bark\n"), triples_format="text"))
    assert "t2.tsv:1:" in msg and "empty positive passage text" in msg
    with pytest.raises(InputError, match="data.triples_format"):  # a choice: checked when the config is built
        _tsv(tmp_path, triples_format="json")


def test_missing_paths_name_the_config_key(tmp_path, monkeypatch):
    missing = str(tmp_path / "nope" / "collection.tsv")
    msg = _error(_tsv(tmp_path, collection=missing))
    assert msg.startswith("data.collection:") and missing in msg
    msg = _error(_tsv(tmp_path, val_qrels="no/such/qrels.txt"))
    assert msg.startswith("data.val_qrels:") and "no/such/qrels.txt" in msg
    assert _error(TsvConfig()).startswith("data.collection:")
    monkeypatch.chdir(tmp_path)  # relative defaults resolve against the working directory
    for cfg, key in [
        (SquadConfig(), "data.path"),
        (CranfieldConfig(), "data.path"),
        (BeirConfig(path="x/y"), "data.path"),
    ]:
        msg = _error(cfg)
        assert msg.startswith(f"{key}:") and str(cfg.path) in msg


def test_corrupt_gzip_and_bad_utf8(tmp_path):
    good = gzip.compress(COLLECTION.encode())
    (tmp_path / "c.tsv.gz").write_bytes(good[: len(good) // 2])
    msg = _error(_tsv(tmp_path, collection=str(tmp_path / "c.tsv.gz")))
    assert "c.tsv.gz:" in msg and "gzip" in msg
    (tmp_path / "u.tsv").write_bytes(b"d1\tok\nd2\tbad \xff byte\n")
    msg = _error(_tsv(tmp_path, collection=str(tmp_path / "u.tsv")))
    assert "u.tsv:2:" in msg and "UTF-8" in msg


# ------------------------------------------------------------------------------------------------ JSON / JSONL


def _beir(folder: Path, corpus: str | None = None, queries: str | None = None, qrels: str | None = None) -> BeirConfig:
    _w(folder / "corpus.jsonl", corpus or '{"_id": "c1", "title": "", "text": "cats"}\n{"_id": "c2", "text": "dogs"}\n')
    _w(folder / "queries.jsonl", queries or '{"_id": "q1", "text": "cat"}\n')
    _w(folder / "qrels" / "test.tsv", qrels or "query-id\tcorpus-id\tscore\nq1\tc1\t1\n")
    return BeirConfig(path=str(folder))


def test_beir_bad_lines(tmp_path):
    assert len(load_dataset(_beir(tmp_path / "ok"), 0).docs) == 2
    cases = [
        (
            dict(corpus='{"_id": "c1", "text": "cats"}\n{"_id": "c2", "text": "dogs"\n'),
            "corpus.jsonl:2:",
            "malformed JSON",
        ),
        (dict(corpus='{"_id": "c1", "text": "cats"}\n\n["a list"]\n'), "corpus.jsonl:3:", "expected a JSON object"),
        (dict(corpus='{"_id": "c1", "title": " ", "text": ""}\n'), "corpus.jsonl:1:", "empty passage text"),
        (dict(corpus='{"text": "no id"}\n'), "corpus.jsonl:1:", "missing field '_id'"),
        (
            dict(queries='{"_id": "q1", "text": "cat"}\n{"_id": "q2", "text": "  "}\n'),
            "queries.jsonl:2:",
            "empty query text",
        ),
        (dict(qrels="query-id\tcorpus-id\tscore\nq1\tc1\tone\n"), "test.tsv:2:", "not an integer"),
        (dict(qrels="query-id\tcorpus-id\tscore\nq1 c1 1\n"), "test.tsv:2:", "expected 3 tab-separated columns"),
    ]
    for i, (kw, where, expect) in enumerate(cases):
        msg = _error(_beir(tmp_path / f"b{i}", **kw))
        assert where in msg and expect in msg, msg


def one_question_squad() -> dict:
    """A SQuAD v1.1 document of one article, one paragraph and one answered question: the base the SQuAD cases edit."""
    return {
        "version": "1.1",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "Paris is in France.",
                        "qas": [
                            {
                                "id": "a",
                                "question": "Where is Paris?",
                                "answers": [{"text": "France", "answer_start": 12}],
                            }
                        ],
                    }
                ],
            }
        ],
    }


def test_squad_bad_json(tmp_path):
    good = one_question_squad()
    ok = {"version": "1.1", "data": [json.loads(json.dumps(good["data"][0])) for _ in range(3)]}
    for i, art in enumerate(ok["data"]):
        art["paragraphs"][0]["qas"][0]["id"] = f"q{i}"
    path = _w(tmp_path / "ok.json", json.dumps(ok))
    ds = load_dataset(SquadConfig(path=path, val_articles=1, test_articles=1), 0)
    assert sum(len(s.queries) for s in ds.splits.values()) == 3
    assert ds.answers[("q0", "0-0")] == [(12, 18)]

    text = json.dumps(ok, indent=1).replace('"question": "Where is Paris?"', '"question": "Where is Paris?",,', 1)
    msg = _error(SquadConfig(path=_w(tmp_path / "bad.json", text)))
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ",," in ln)
    assert f"bad.json:{line}:" in msg and "malformed JSON" in msg
    gz = _w(tmp_path / "bad.json.gz", text, gz=True)
    assert f"bad.json.gz:{line}:" in _error(SquadConfig(path=gz))
    wrong = json.loads(json.dumps(ok))
    wrong["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 3
    msg = _error(SquadConfig(path=_w(tmp_path / "span.json", json.dumps(wrong)), val_articles=1, test_articles=1))
    assert "span.json: data[1].paragraphs[0].qas[0].answers[0]" in msg and "does not point at the answer text" in msg
    empty_q = json.loads(json.dumps(ok))
    empty_q["data"][2]["paragraphs"][0]["qas"][0]["question"] = " "
    msg = _error(SquadConfig(path=_w(tmp_path / "q.json", json.dumps(empty_q))))
    assert "q.json: data[2].paragraphs[0].qas[0]" in msg and "empty 'question'" in msg


# ------------------------------------------------------------------------------------------------ classic formats


def _cranfield(folder: Path, docs: str, qry: str, qrel: str) -> CranfieldConfig:
    _w(folder / "cran.all.1400", docs)
    _w(folder / "cran.qry", qry)
    _w(folder / "cranqrel", qrel)
    return CranfieldConfig(path=str(folder), val_fraction=0.0, test_fraction=0.0)


DOCS_SMART = ".I 1\n.T\nwing flow\n.A\nsmith\n.B\nj. ae.\n.W\nwing flow study\n.I 2\n.T\nheat\n.W\nheat transfer\n"
QRY_SMART = ".I 001\n.W\nwing flow ?\n.I 004\n.W\nheat ?\n"


def test_smart_and_cranqrel_errors(tmp_path):
    ds = load_dataset(_cranfield(tmp_path / "ok", DOCS_SMART, QRY_SMART, "1 1 2\n2 2 -1\n2 1 4\n"), 0)
    assert ds.splits["train"].qrels == {"1": {"1": 3}, "2": {"2": 0, "1": 1}}
    cases = [
        (dict(docs="wing\n" + DOCS_SMART), "cran.all.1400:1:", "expected '.I <id>'"),
        (dict(docs=DOCS_SMART.replace(".I 2", ".I")), "cran.all.1400:10:", "malformed record start"),
        (dict(docs=DOCS_SMART.replace(".I 2", ".I 1")), "cran.all.1400:10:", "duplicate record id"),
        (dict(docs=DOCS_SMART.replace(".T\nheat", ".Q\nheat")), "cran.all.1400:11:", "unknown field marker '.Q'"),
        (dict(qrel="1 1 2\n2 2\n"), "cranqrel:2:", "expected 3 whitespace-separated columns"),
        (dict(qrel="1 1 2\n2 2 x\n"), "cranqrel:2:", "relevance code 'x' is not an integer"),
        (dict(qrel="1 1 7\n"), "cranqrel:1:", "relevance code 7; expected 1..4, 5 or -1"),
    ]
    for i, (kw, where, expect) in enumerate(cases):
        args = {"docs": DOCS_SMART, "qry": QRY_SMART, "qrel": "1 1 2\n", **kw}
        msg = _error(_cranfield(tmp_path / f"c{i}", **args))
        assert where in msg and expect in msg, msg


def test_trec_sgml_errors(tmp_path):
    def vaswani(folder, docs, queries="<top>\n<num>1</num><title>\nWING\n</title>\n</top>\n", qrels="1 0 1 1\n"):
        _w(folder / "doc-text.trec", docs)
        _w(folder / "query-text.trec", queries)
        _w(folder / "qrels", qrels)
        return VaswaniConfig(path=str(folder), val_fraction=0.0, test_fraction=0.0)

    good = "<DOC>\n<DOCNO>1</DOCNO>\nwing flow\n</DOC>\n<DOC>\n<DOCNO>2</DOCNO>\nheat\n</DOC>\n"
    assert load_dataset(vaswani(tmp_path / "ok", good), 0).docs == {"1": "wing flow", "2": "heat"}
    cases = [
        (good.replace("</DOC>\n<DOC>", "\n<DOC>", 1), "doc-text.trec:1:", "never closed"),
        (good + "<DOC>\n<DOCNO>3</DOCNO>\ntext\n", "doc-text.trec:9:", "never closed"),
        (good.replace("<DOCNO>2</DOCNO>", ""), "doc-text.trec:5:", "record has no <DOCNO>"),
        (good.replace("heat", " "), "doc-text.trec:5:", "empty text"),
        (good + "stray text\n", "doc-text.trec:9:", "text outside a <DOC> record"),
    ]
    for i, (docs, where, expect) in enumerate(cases):
        msg = _error(vaswani(tmp_path / f"v{i}", docs))
        assert where in msg and expect in msg, msg
    msg = _error(vaswani(tmp_path / "q", good, qrels="1 0 1 1\n1 0 2\n"))
    assert "qrels:2:" in msg and "expected 4 whitespace-separated columns" in msg


def test_cacm_bad_jsonl(tmp_path):
    folder = tmp_path / "cacm"
    _w(folder / "cacm.jsonl.gz", '{"id": "CACM-0001", "contents": "a"}\n{"id": "CACM-0002", "contents": ""}\n', gz=True)
    _w(folder / "topics.cacm.txt", "<DOC>\n<DOCNO> 1 </DOCNO>\nx\n</DOC>\n")
    _w(folder / "qrels.cacm.txt", "1 Q0 CACM-1 1\n")
    msg = _error(CacmConfig(path=str(folder), val_fraction=0.0, test_fraction=0.0))
    assert "cacm.jsonl.gz:2:" in msg and "empty 'contents'" in msg


# ------------------------------------------------------------------------------------------------ cross-references


def test_cross_reference_errors_via_validate(tmp_path):
    """Each error names the file and line of the offending entry (found again only when there is an error)."""
    msg = _error(_tsv(tmp_path, train_qrels=("qrels_q.txt", "q1 0 d1 1\nq9 0 d2 1\n")))
    assert msg.startswith(f"{tmp_path / 'qrels_q.txt'}:2: ") and "split train" in msg
    assert "query 'q9' which is not among the queries" in msg
    msg = _error(_tsv(tmp_path, train_qrels=("qrels_d.txt", "q1 0 d1 1\nq2 0 d2 1\nq1 0 d7 1\n")))
    assert msg.startswith(f"{tmp_path / 'qrels_d.txt'}:3: ") and "unknown doc id 'd7'" in msg
    msg = _error(_tsv(tmp_path, train_triples=("tr.tsv", "q1\td1\td2\nq1\td1\td9\n")))
    assert (
        msg.startswith(f"{tmp_path / 'tr.tsv'}:2: ")
        and "triple (q1, d1, d9) of split train names unknown doc id 'd9'" in msg
    )
    msg = _error(_tsv(tmp_path, train_triples=("tr2.tsv", "q5\td1\td2\n")))
    assert msg.startswith(f"{tmp_path / 'tr2.tsv'}:1: ") and "names query 'q5'" in msg
    msg = _error(
        _tsv(tmp_path, val_queries=("vq.tsv", QUERIES), val_run=("vr.txt", "q1 Q0 d1 1 2.0 r\nq1 Q0 d42 2 1.0 r\n"))
    )
    assert msg.startswith(f"{tmp_path / 'vr.txt'}:2: ") and "split val" in msg
    assert "candidates of query 'q1' (split val) name unknown doc id 'd42'" in msg
    folder = tmp_path / "beir"
    msg = _error(_beir(folder, qrels="query-id\tcorpus-id\tscore\nq1\tc1\t1\nq2\tc2\t1\n"))
    assert ":3: " in msg and "qrels" in msg.split(":3: ")[0] and "query 'q2' which is not among the queries" in msg


def test_bad_config_values():
    assert _error(SyntheticConfig(passage_words_min=50, passage_words_max=40)).startswith("data.passage_words_max:")
    assert _error(SyntheticConfig(num_topics=400)).startswith("data.num_topics:")


@pytest.mark.slow
def test_test_split_without_scorable_pairs_stops_before_any_output(tmp_path, tiny_bert):
    """A test split whose judged queries have no candidates (here the run file ranks only an unjudged query) would
    otherwise train and then fail with nothing to write: one line naming the split, exit 2, no output folder."""
    from conftest import run_script

    files = {  # evaluate.py reads the test split alone (and refuses the other splits' files)
        "collection": ("collection.tsv", COLLECTION),
        "test_queries": ("test_queries.tsv", QUERIES),
        "test_qrels": ("test_qrels.txt", "q1 0 d1 1\n"),
        "test_run": ("test_run.txt", "q2 Q0 d2 1 3.0 x\n"),
    }
    args = [f"data.{key}={_w(tmp_path / name, text)}" for key, (name, text) in files.items()]
    out = tmp_path / "out"
    proc = run_script(
        "evaluate.py", "data=tsv", *args, f"model.backbone={tiny_bert}", "logger=none", f"output_dir={out}", check=False
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]  # the model load logs to stderr too
    assert len(err) == 1 and "split 'test'" in err[0] and "no (judged query, candidate) pair" in err[0]
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ byte-order marks

BOM = "\ufeff"  # what Excel and many Windows tools write at the start of a UTF-8 file


def test_bom_is_not_part_of_the_first_id(tmp_path):
    """Every reader drops a leading BOM: TSV, gzip TSV, qrels, triples, runs, JSONL, SQuAD JSON, SMART, GloVe."""
    cfg = _tsv(
        tmp_path,
        collection=str(tmp_path / "c.tsv.gz"),
        train_queries=("q.tsv", BOM + QUERIES),
        train_qrels=("r.txt", BOM + QRELS),
        train_triples=("t.tsv", BOM + "q1\td1\td2\n"),
        val_queries=("vq.tsv", BOM + QUERIES),
        val_run=("vr.txt", BOM + "q1 Q0 d1 1 2.0 r\n"),
    )
    _w(tmp_path / "c.tsv.gz", BOM + COLLECTION, gz=True)
    ds = load_dataset(cfg, 0)
    assert set(ds.docs) == {"d1", "d2", "d3"} and set(ds.splits["train"].queries) == {"q1", "q2"}
    assert ds.splits["train"].qrels == {"q1": {"d1": 1}, "q2": {"d2": 1}} and ds.splits["train"].triples == [
        ("q1", "d1", "d2")
    ]
    assert ds.splits["val"].candidates == {"q1": ["d1"]}

    beir = load_dataset(
        _beir(
            tmp_path / "beir",
            corpus=BOM + '{"_id": "c1", "text": "cats"}\n',
            queries=BOM + '{"_id": "q1", "text": "cat"}\n',
            qrels=BOM + "query-id\tcorpus-id\tscore\nq1\tc1\t1\n",
        ),
        0,
    )
    assert set(beir.docs) == {"c1"} and beir.splits["test"].qrels == {"q1": {"c1": 1}}

    squad = one_question_squad()
    ds = load_dataset(
        SquadConfig(path=_w(tmp_path / "squad.json", BOM + json.dumps(squad)), val_articles=0, test_articles=0), 0
    )
    assert set(ds.docs) == {"0-0"}

    ds = load_dataset(_cranfield(tmp_path / "cran", BOM + DOCS_SMART, BOM + QRY_SMART, BOM + "1 1 2\n"), 0)
    assert set(ds.docs) == {"1", "2"} and ds.splits["train"].qrels["1"] == {"1": 3}

    from datamodules.textfiles import read_trec_run
    from models.rankers.word_vectors import from_glove

    assert read_trec_run(_w(tmp_path / "run.trec", BOM + "q1 Q0 d1 1 2.0 r\n")) == {"q1": {"d1": 2.0}}
    assert from_glove(_w(tmp_path / "g.txt", BOM + "the 1 2\ncat 3 4\n"), {"the": 0, "cat": 1}, 2).found == 2


@pytest.mark.slow
def test_bom_files_give_the_same_bm25_metrics(tmp_path):
    """evaluate.py model=bm25 on BOM-prefixed collection, queries and qrels: the same metrics.json and run.trec."""
    from conftest import run_script

    outs = []
    for bom in ("", BOM):
        folder = tmp_path / ("bom" if bom else "plain")
        c, q, r = (
            _w(folder / name, bom + text)
            for name, text in (("c.tsv", COLLECTION), ("q.tsv", QUERIES), ("r.txt", QRELS))
        )
        files = [f"data.test_{kind}={path}" for kind, path in (("queries", q), ("qrels", r))]  # what BM25 reads
        out = folder / "out"
        run_script(
            "evaluate.py", "model=bm25", "data=tsv", f"data.collection={c}", *files, "logger=none", f"output_dir={out}"
        )
        outs.append(out)
    assert (outs[0] / "metrics.json").read_text() == (outs[1] / "metrics.json").read_text()
    assert (outs[0] / "run.trec").read_text() == (outs[1] / "run.trec").read_text()
    assert "\ufeff" not in (outs[1] / "run.trec").read_text()


# ------------------------------------------------------------------------------------------------ empty inputs


@pytest.mark.parametrize(
    "key,name,expect",
    [
        ("collection", "collection.tsv", "2 tab-separated columns (passage id, passage text)"),
        ("train_queries", "queries.tsv", "2 tab-separated columns (query id, query text)"),
        ("train_qrels", "qrels.txt", "4 whitespace-separated columns (qid, iter, docid, rel)"),
        ("train_triples", "triples.tsv", "3 tab-separated columns (qid, positive doc id, negative doc id)"),
        ("val_run", "run.txt", "6 whitespace-separated columns (qid, Q0, docid, rank, score, tag)"),
    ],
)
@pytest.mark.parametrize("text", ["", "\n \n"], ids=["empty", "blank"])
def test_empty_files_name_the_file(tmp_path, key, name, expect, text):
    """Tenth fault trial E4: an empty triples file was refused by its reader after the collection's store (and the
    triples cache folder) had been built. Every file of the source is refused before anything is written, with the
    message of its reader."""
    extra = {"val_queries": _w(tmp_path / "vq.tsv", QUERIES)} if key == "val_run" else {}
    cache = tmp_path / "cache"
    msg = _error(_tsv(tmp_path, **{key: (name, text)}, **extra, cache_dir=str(cache)))
    assert msg == f"{tmp_path / name}: is empty; expected lines of {expect}", msg
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))


def test_empty_files_of_other_formats_name_the_file(tmp_path):
    assert (
        _error(_beir(tmp_path / "b1", corpus="\n"))
        == f"{tmp_path / 'b1' / 'corpus.jsonl'}: is empty; expected one JSON object a line"
    )
    assert (
        _error(_beir(tmp_path / "b2", queries="\n"))
        == f"{tmp_path / 'b2' / 'queries.jsonl'}: is empty; expected one JSON object a line"
    )
    msg = _error(_cranfield(tmp_path / "c1", "", QRY_SMART, "1 1 2\n"))
    assert msg == f"{tmp_path / 'c1' / 'cran.all.1400'}: is empty; expected SMART records starting with '.I <id>'"
    # every record without text is left out (with a warning), and with it every judgement
    msg = _error(_cranfield(tmp_path / "c2", ".I 1\n.T\n.W\n", QRY_SMART, "1 1 2\n"))
    assert msg == (
        f"data.path ({tmp_path / 'c2'}): has no judged query (a query with a relevant document in the qrels); "
        "expected at least one"
    )
    with pytest.raises(InputError, match=r"^c.tsv: holds no passages; expected a collection of at least one passage$"):
        IRDataset("x", {}, {}, docs_origin="c.tsv").validate()  # the backstop for sources without a file of their own
    (tmp_path / "v").mkdir()
    _w(tmp_path / "v" / "doc-text.trec", "")
    _w(tmp_path / "v" / "query-text.trec", "<top>\n<num>1</num><title>\nWING\n</title>\n</top>\n")
    _w(tmp_path / "v" / "qrels", "1 0 1 1\n")
    msg = _error(VaswaniConfig(path=str(tmp_path / "v"), val_fraction=0.0, test_fraction=0.0))
    assert msg == f"{tmp_path / 'v' / 'doc-text.trec'}: is empty; expected <DOC> ... </DOC> records"


@pytest.mark.parametrize(
    "setting,split,problem",
    [
        (
            "data.num_train_queries=0",
            "train",
            "has no training triple to train on (0 judged queries); check data.num_train_queries=0",
        ),
        (
            "data.num_val_queries=0",
            "val",
            "has no (judged query, candidate) pair to validate on (0 judged queries with candidates); "
            "check data.candidate_depth=100, data.num_val_queries=0",
        ),
        (
            "data.num_test_queries=0",
            "test",
            "has no (judged query, candidate) pair to score (0 judged queries with candidates); "
            "check data.candidate_depth=100, data.num_test_queries=0",
        ),
    ],
)
def test_empty_split_names_the_split_and_its_settings(tmp_path, setting, split, problem):
    """Training needs train, val and test; evaluation only test (an empty train or val split is fine there)."""
    from pipeline.config import compose
    from pipeline.stages import load_data

    cfg = compose([*SMALL_SYNTHETIC, setting, f"data.cache_dir={tmp_path}", "data.candidate_depth=100"])
    with pytest.raises(InputError) as e:
        load_data(cfg, fit=True)
    assert str(e.value) == f"data 'synthetic', split '{split}': {problem}"
    if split != "test":
        assert len(load_data(cfg).eval_splits["test"].pairs) > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "script,args,expect",
    [
        (
            "evaluate.py",
            ["model=bm25", "data=tsv", "data.collection={empty}"],
            "{empty}: is empty; expected lines of 2 tab-separated columns",
        ),
        (
            "train.py",
            [*SMALL_SYNTHETIC, "data.num_val_queries=0"],
            "data 'synthetic', split 'val': has no (judged query, candidate) pair",
        ),
    ],
    ids=["empty-collection", "empty-val-split"],
)
def test_empty_inputs_stop_before_anything_is_written(tmp_path, script, args, expect):
    from conftest import run_script

    empty = _w(tmp_path / "empty.tsv", "")
    for name, text in (("q.tsv", QUERIES), ("r.txt", QRELS)):
        _w(tmp_path / name, text)
    files = [f"data.test_{k}={tmp_path / n}" for k, n in (("queries", "q.tsv"), ("qrels", "r.txt"))]
    out = tmp_path / "out"
    argv = (
        [a.format(empty=empty) for a in args]
        + (files if "data=tsv" in args else [])
        + ["logger=none", f"output_dir={out}"]
    )
    proc = run_script(script, *argv, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]  # train.py logs "Seed set to 42" first
    assert len(err) == 1 and err[0].startswith("error: " + expect.format(empty=empty)), err
    assert "Traceback" not in proc.stderr and not out.exists()
