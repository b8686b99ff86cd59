"""Text triples streamed over a document store (datamodules/text_triples.py) against the dict-based reader they
replaced (kept below as the reference): the same (qid, positive id, negative id) triples, the same added passages and
queries (ids, texts and order), the same errors word for word, parsed once into the cache and nothing left behind by
an error."""

from __future__ import annotations

import gzip
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from core.errors import InputError
from datamodules import docstore, text_triples
from datamodules.docstore import StackedStore, fingerprint, open_store, open_text_index
from datamodules.sources import load_dataset
from datamodules.sources.tsv import TsvConfig
from datamodules.text_triples import WHITESPACE, read_text_triples
from datamodules.textfiles import content_id, iter_id_text, iter_rows, read_id_text_tsv
from datamodules.triples import TripleArray


# ---- the reference: datamodules/sources/tsv.py's reader before the store (verbatim) --------------------------------
def reference_read_triples_text(
    path: Path, docs: dict[str, str], queries: dict[str, str]
) -> list[tuple[str, str, str]]:
    doc_by_text = {t: d for d, t in docs.items()}
    query_by_text = {t: q for q, t in queries.items()}
    triples = []
    for lineno, cols in iter_rows(path, ("query text", "positive passage", "negative passage")):
        for col, what in zip(cols, ("query", "positive passage", "negative passage")):
            if not col.strip():
                raise InputError(f"{path}:{lineno}", f"empty {what} text; expected non-empty text")
        q, pos, neg = cols
        qid = query_by_text.get(q)
        if qid is None:
            qid = content_id("q", q)
            queries[qid] = q
            query_by_text[q] = qid
        ids = []
        for text in (pos, neg):
            did = doc_by_text.get(text)
            if did is None:
                did = content_id("h", text)
                docs[did] = text
                doc_by_text[text] = did
            ids.append(did)
        triples.append((qid, ids[0], ids[1]))
    return triples


# ---- helpers -------------------------------------------------------------------------------------------------------
def _write(path: Path, text: str) -> Path:
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(text.encode("utf-8"))
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


def _collection(tmp_path: Path, items: list[tuple[str, str]], name="collection.tsv") -> Path:
    return _write(tmp_path / name, "".join(f"{d}\t{t}\n" for d, t in items))


def _both(tmp_path: Path, cpath: Path, queries: dict[str, str], tpath: Path, cache=None):
    """(reference: triples, docs, queries), (new: triples, docs, queries)."""
    ref_docs, ref_queries = read_id_text_tsv(cpath, "passage"), dict(queries)
    ref = reference_read_triples_text(tpath, ref_docs, ref_queries)
    cache = cache or tmp_path / "cache"
    store = open_store(
        cache, fingerprint("tsv-collection", [cpath]), lambda: iter_id_text(cpath, "passage"), str(cpath)
    )
    new_queries = dict(queries)
    triples = read_text_triples(tpath, store, new_queries, cache)
    return (ref, ref_docs, ref_queries), (triples, triples.docs, new_queries)


def _assert_same(ref, new, original_docs: int):
    (rt, rd, rq), (nt, nd, nq) = ref, new
    assert isinstance(nt, TripleArray) and list(nt) == rt and len(nt) == len(rt)
    assert list(nq.items()) == list(rq.items())  # added queries, their texts and order
    assert list(nt.qids) == list(rq)
    assert len(nd) == len(rd) and list(nd) == list(rd) and list(nd.items()) == list(rd.items())  # added passages too
    added = list(rd.items())[original_docs:]
    assert isinstance(nd, StackedStore) == bool(added)
    for row, (d, text) in enumerate(rd.items()):
        assert nd[d] == text and d in nd and nd.row(d) == row and nd.id_at(row) == d and nd.text_at(row) == text
    assert list(nd.ids) == list(rd) and nd.rows(list(rd)[::-1]).tolist() == list(range(len(rd)))[::-1]
    assert [nd.id_at(r) for r in nd.sorted_rows()] == sorted(rd)
    assert "no such id" not in nd and nd.row("no such id") == -1 and nd.texts_checked
    with pytest.raises(KeyError):
        nd["no such id"]


QUERIES = {"q1": "what is a cat", "q2": "where do dogs sleep", "q3": "how fast is a horse"}
DOCS = [
    ("d1", "cats sit on mats"),
    ("d2", "dogs sleep in kennels"),
    ("d3", "horses run fast"),
    ("d4", "birds fly south"),
]


@pytest.fixture(params=[None, 40], ids=["one-block", "blocks-of-40-bytes"])
def block_bytes(request, monkeypatch):
    if request.param:
        monkeypatch.setattr(text_triples, "BLOCK_BYTES", request.param)
    return request.param


@pytest.fixture(params=[docstore.BATCH_ROWS, 2], ids=["one-batch", "batches-of-2"])
def batch_rows(request, monkeypatch):
    monkeypatch.setattr(docstore, "BATCH_ROWS", request.param)
    return request.param


# ---- the same triples, passages and queries as the reference -------------------------------------------------------
def test_all_passages_in_the_collection(tmp_path, block_bytes, batch_rows):
    cpath = _collection(tmp_path, DOCS)
    lines = [
        "what is a cat\tcats sit on mats\tdogs sleep in kennels",
        "where do dogs sleep\tdogs sleep in kennels\tbirds fly south",
        "what is a cat\tcats sit on mats\thorses run fast",
        "how fast is a horse\thorses run fast\tcats sit on mats",
    ]
    tpath = _write(tmp_path / "t.tsv", "\n".join(lines) + "\n")
    ref, new = _both(tmp_path, cpath, QUERIES, tpath)
    _assert_same(ref, new, len(DOCS))
    assert new[1] is new[0].docs and not isinstance(new[1], StackedStore)  # nothing added: the collection's own store
    assert new[0].rows.dtype == np.int32


def test_new_passages_and_queries(tmp_path, block_bytes, batch_rows):
    cpath = _collection(tmp_path, DOCS)
    lines = [
        "what is a cat\tcats sit on mats\ta brand new passage",
        "a new query\ta brand new passage\tdogs sleep in kennels",
        "another new query\tsecond new passage\tthird new passage",
        "a new query\tthird new passage\tcats sit on mats",
        " what is a cat\tcats sit on mats \tcats sit on mats",  # surrounding spaces: other texts, kept as they are
        "where do dogs sleep\tsecond new passage\ta brand new passage",
    ]
    tpath = _write(tmp_path / "t.tsv", "\n".join(lines) + "\n")
    ref, new = _both(tmp_path, cpath, QUERIES, tpath)
    _assert_same(ref, new, len(DOCS))
    assert len(ref[1]) == len(DOCS) + 4 and len(ref[2]) == len(QUERIES) + 3


def test_duplicate_texts_take_the_last_id(tmp_path, block_bytes, batch_rows):
    docs = [("a", "same text"), ("b", "other"), ("c", "same text"), ("d", "x"), ("e", "same text"), ("f", "x")]
    cpath = _collection(tmp_path, docs)
    queries = {"q1": "same query", "q2": "different", "q3": "same query"}
    tpath = _write(tmp_path / "t.tsv", "same query\tsame text\tx\ndifferent\tother\tsame text\nsame query\tx\tx\n")
    ref, new = _both(tmp_path, cpath, queries, tpath)
    _assert_same(ref, new, len(docs))
    assert list(new[0]) == [("q3", "e", "f"), ("q2", "b", "e"), ("q3", "f", "f")]


def test_non_ascii_text(tmp_path, block_bytes, batch_rows):
    docs = [
        ("é", "café crème brûlée"),
        ("2", "東京の天気は晴れ"),
        ("3", "emoji 🐈 cat"),
        ("4", "ideographic\u3000space inside"),
    ]
    cpath = _collection(tmp_path, docs)
    queries = {"q": "où est le café", "k": "天気"}
    lines = [
        "où est le café\tcafé crème brûlée\t東京の天気は晴れ",
        "天気\t東京の天気は晴れ\tnouveau passage ü",
        "новый запрос\temoji 🐈 cat\tideographic\u3000space inside",
        "новый запрос\tnouveau passage ü\t\u00a0leading nbsp",
    ]
    tpath = _write(tmp_path / "t.tsv", "\n".join(lines))  # no final newline
    ref, new = _both(tmp_path, cpath, queries, tpath)
    _assert_same(ref, new, len(docs))


def test_gzip_bom_crlf_and_blank_lines(tmp_path, block_bytes, batch_rows):
    cpath = _collection(tmp_path, DOCS, name="collection.tsv.gz")
    text = (
        "\ufeffwhat is a cat\tcats sit on mats\tnew one\r\n\r\n   \n"
        "a new query\tnew one\tdogs sleep in kennels\r\n\u3000\t\n"  # a whitespace-only line is skipped, tabs and all
        "where do dogs sleep\tbirds fly south\tcats sit on mats\r\r\n"
        "a new query\ta lone\rcarriage return\tnew one\n"
    )  # inside a text, \r is text
    tpath = _write(tmp_path / "t.tsv.gz", text)
    ref, new = _both(tmp_path, cpath, QUERIES, tpath)
    _assert_same(ref, new, len(DOCS))
    assert ref[0][0][0] == "q1"  # the byte-order mark is not part of the first query


@pytest.mark.parametrize("seed", range(4))
def test_random_files_equal_the_reference(tmp_path, monkeypatch, seed):
    """Random collections with repeated texts, triples mixing collection texts, new texts and near-misses (a space
    more), read in random block sizes."""
    rng = np.random.default_rng(seed)
    words = ["cat", "dog", "ä", "東", "mat", "🐈", "sun"]
    texts = [" ".join(rng.choice(words, rng.integers(1, 4))) for _ in range(25)]
    docs = [(f"p{i}", texts[rng.integers(len(texts))]) for i in range(30)]
    queries = {f"q{i}": " ".join(rng.choice(words, 2)) for i in range(8)}
    pool = texts + [t + " " for t in texts[:5]] + ["new " + t for t in texts[:10]]
    qpool = list(queries.values()) + ["new query " + w for w in words]
    lines = [
        f"{qpool[rng.integers(len(qpool))]}\t{pool[rng.integers(len(pool))]}\t{pool[rng.integers(len(pool))]}"
        for _ in range(200)
    ]
    cpath = _collection(tmp_path, docs)
    tpath = _write(tmp_path / "t.tsv", "\n".join(lines) + "\n")
    monkeypatch.setattr(text_triples, "BLOCK_BYTES", int(rng.integers(30, 400)))
    monkeypatch.setattr(docstore, "BATCH_ROWS", int(rng.integers(2, 9)))
    ref, new = _both(tmp_path, cpath, queries, tpath)
    _assert_same(ref, new, len(docs))


def test_content_id_clashes(tmp_path):
    """A new query whose content id is a train qid takes its place and text, as the reference does; a new passage
    whose content id the collection holds for another text is an error (a store is read-only)."""
    cpath = _collection(tmp_path, DOCS)
    queries = {**QUERIES, content_id("q", "brand new query"): "an old text"}
    tpath = _write(
        tmp_path / "t.tsv",
        "what is a cat\tcats sit on mats\tbirds fly south\nbrand new query\tcats sit on mats\tbirds fly south\n",
    )
    ref, new = _both(tmp_path, cpath, queries, tpath)
    _assert_same(ref, new, len(DOCS))
    cpath = _collection(tmp_path, DOCS + [(content_id("h", "brand new passage"), "an old passage")], name="c2.tsv")
    tpath = _write(tmp_path / "t2.tsv", "what is a cat\tcats sit on mats\tbrand new passage\n")
    with pytest.raises(InputError, match="already holds for another text"):
        _both(tmp_path, cpath, QUERIES, tpath)


def test_text_index_confirms_every_hit(tmp_path, monkeypatch):
    """With every text on one key (all keys collide), lookups still find the right, last row by reading texts."""
    monkeypatch.setattr(docstore, "text_key", lambda data: 7)
    docs = [("a", "one"), ("b", "two"), ("c", "one"), ("d", "three"), ("e", "six")]  # "six": read, not "one" or "two"
    cpath = _collection(tmp_path, docs)
    store = open_store(
        tmp_path / "cache", fingerprint("tsv-collection", [cpath]), lambda: iter_id_text(cpath, "passage"), str(cpath)
    )
    index = open_text_index(store, tmp_path / "cache")
    assert index.rows_of([b"one", b"two", b"three", b"six", b"four", b"on", b"xyz"]).tolist() == [
        2,
        1,
        3,
        4,
        -1,
        -1,
        -1,
    ]
    tpath = _write(tmp_path / "t.tsv", "what is a cat\tone\tfour\nwhat is a cat\ttwo\tthree\n")
    ref, new = _both(tmp_path, cpath, QUERIES, tpath, cache=tmp_path / "cache")
    _assert_same(ref, new, len(docs))


# ---- parsed once, pickled, end to end -------------------------------------------------------------------------------
def test_second_load_reuses_the_cache(tmp_path, monkeypatch):
    cpath = _collection(tmp_path, DOCS)
    tpath = _write(
        tmp_path / "t.tsv", "what is a cat\tcats sit on mats\tnew passage\nnew query\tnew passage\tbirds fly south\n"
    )
    ref, first = _both(tmp_path, cpath, QUERIES, tpath)

    def never(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(text_triples, "_build", never)
    monkeypatch.setattr(text_triples, "open_text_index", never)
    _, again = _both(tmp_path, cpath, QUERIES, tpath)
    _assert_same(ref, again, len(DOCS))
    assert again[0].path == first[0].path and again[1].fingerprint == first[1].fingerprint
    # other queries: another cache entry (query indices depend on them)
    monkeypatch.undo()
    ref2, other = _both(tmp_path, cpath, {**QUERIES, "q9": "new query"}, tpath)
    _assert_same(ref2, other, len(DOCS))
    assert other[0].path != first[0].path


def test_damaged_cache_is_rebuilt(tmp_path):
    cpath = _collection(tmp_path, DOCS)
    tpath = _write(tmp_path / "t.tsv", "what is a cat\tcats sit on mats\tnew passage\n")
    ref, first = _both(tmp_path, cpath, QUERIES, tpath)
    rows = first[0].path
    rows.write_bytes(rows.read_bytes()[:-4])  # a truncated array
    with pytest.warns(UserWarning, match="damaged"):
        _, again = _both(tmp_path, cpath, QUERIES, tpath)
    _assert_same(ref, again, len(DOCS))


def test_pickles_for_dataloader_workers(tmp_path):
    cpath = _collection(tmp_path, DOCS)
    tpath = _write(
        tmp_path / "t.tsv", "what is a cat\tcats sit on mats\tnew passage\nnew query\tnew passage\tbirds fly south\n"
    )
    (rt, rd, _), (triples, docs, _) = _both(tmp_path, cpath, QUERIES, tpath)
    docs2 = pickle.loads(pickle.dumps(docs))
    assert isinstance(docs2, StackedStore) and dict(docs2.items()) == rd and docs2.fingerprint == docs.fingerprint
    assert len(pickle.dumps(docs)) < 1000  # folders, not texts
    t2 = pickle.loads(pickle.dumps(triples))
    assert list(t2) == rt and list(t2.take(np.array([1, 0]))) == [rt[1], rt[0]]
    q, d = t2.distinct()  # the head stage's pass over the rows
    assert [t2.qids[i] for i in q] == list(dict.fromkeys(t[0] for t in rt))
    assert [docs2.text_at(r) for r in d] == [rd[x] for x in dict.fromkeys(x for t in rt for x in t[1:])]


def test_load_dataset_with_text_triples(tmp_path):
    cfg = TsvConfig(
        collection=str(_collection(tmp_path, DOCS)),
        train_queries=str(_write(tmp_path / "q.tsv", "q1\twhat is a cat\n")),
        train_qrels=str(_write(tmp_path / "qrels.txt", "q1 0 d1 1\n")),
        triples_format="text",
        cache_dir=str(tmp_path / "cache"),
        train_triples=str(
            _write(tmp_path / "t.tsv", "what is a cat\tcats sit on mats\tnew passage\nnew query\tnew passage\td\n")
        ),
    )
    ds = load_dataset(cfg, 0)
    train = ds.splits["train"]
    new_doc, new_q = content_id("h", "new passage"), content_id("q", "new query")
    assert list(train.triples) == [("q1", "d1", new_doc), (new_q, new_doc, content_id("h", "d"))]
    assert train.queries == {"q1": "what is a cat", new_q: "new query"} and ds.docs is train.triples.docs
    assert ds.docs[new_doc] == "new passage" and len(ds.docs) == len(DOCS) + 2
    # BM25 over the stacked collection (its index keyed by the stacked fingerprint) ranks as over the dict
    from datamodules.bm25 import bm25_run

    queries = {"a": "new passage", "b": "cats on mats"}
    assert bm25_run(ds.docs, queries, 3, tmp_path / "cache") == bm25_run(dict(ds.docs.items()), queries, 3)


# ---- errors: the reference's, word for word; nothing left in the cache ----------------------------------------------
def _reference_error(tpath: Path) -> str:
    with pytest.raises(InputError) as e:
        reference_read_triples_text(tpath, dict(DOCS), dict(QUERIES))
    return str(e.value)


GOOD = "what is a cat\tcats sit on mats\tdogs sleep in kennels\n"


@pytest.mark.parametrize(
    "body, line, expect",
    [
        (GOOD + "what is a cat\tonly two\n", 2, "expected 3 tab-separated columns"),
        (GOOD * 3 + "a\tb\tc\td\n", 4, "expected 3 tab-separated columns"),
        (GOOD + "a\tb\tc\ra\tb\tc\n", 2, "expected 3 tab-separated columns"),  # a lone \r does not end a line
        (GOOD + "\tcats sit on mats\tx\n", 2, "empty query text"),
        (GOOD + GOOD + "q\t \tx\n", 3, "empty positive passage text"),
        (GOOD + "q\tx\t\u3000\u2003\n", 2, "empty negative passage text"),
        (GOOD + "q\tnew\t\n", 2, "empty negative passage text"),
        (GOOD + "\n\nq\tnew\n", 4, "expected 3 tab-separated columns"),
    ],
    ids=[
        "two-columns",
        "four-columns",
        "lone-cr",
        "empty-query",
        "blank-positive",
        "unicode-blank-negative",
        "empty-negative",
        "after-blank-lines",
    ],
)
def test_errors_name_the_line(tmp_path, block_bytes, body, line, expect):
    tpath = _write(tmp_path / "t.tsv", body)
    message = _reference_error(tpath)
    assert f"t.tsv:{line}:" in message and expect in message
    with pytest.raises(InputError) as e:
        _both_new(tmp_path, tpath)
    assert str(e.value) == message
    _assert_no_leftovers(tmp_path / "cache")


def _both_new(tmp_path: Path, tpath: Path):
    cpath = _collection(tmp_path, DOCS)
    store = open_store(
        tmp_path / "cache", fingerprint("tsv-collection", [cpath]), lambda: iter_id_text(cpath, "passage"), str(cpath)
    )
    queries = dict(QUERIES)
    read_text_triples(tpath, store, queries, tmp_path / "cache")
    raise AssertionError("no error")


def _assert_no_leftovers(cache: Path):
    """Only complete artefacts stay: the store and its text index (and lock files); no triples, no temp file."""
    left = [p.relative_to(cache) for p in cache.rglob("*") if ".tmp" in p.name or "text-" in str(p.relative_to(cache))]
    assert not [p for p in left if not p.name.endswith(".lock")], left
    triples = cache / "triples"
    assert not triples.exists() or all(p.name.endswith(".lock") for p in triples.iterdir())


@pytest.mark.parametrize("kind", ["bad-utf8", "corrupt-gzip", "empty", "blank-only"])
def test_bytes_errors_name_the_line(tmp_path, kind):
    if kind == "bad-utf8":
        tpath = tmp_path / "t.tsv"
        tpath.write_bytes(GOOD.encode() * 2 + b"q\tbad \xff byte\tx\n" + GOOD.encode())
    elif kind == "corrupt-gzip":
        good = gzip.compress((GOOD * 2000).encode())
        tpath = tmp_path / "t.tsv.gz"
        tpath.write_bytes(good[: len(good) // 2])
    else:
        tpath = _write(tmp_path / "t.tsv", "" if kind == "empty" else "\n  \n\t\t\n")
    message = _reference_error(tpath)
    with pytest.raises(InputError) as e:
        _both_new(tmp_path, tpath)
    assert str(e.value) == message
    assert {
        "bad-utf8": "t.tsv:3: is not valid UTF-8",
        "corrupt-gzip": "t.tsv.gz:",
        "empty": "is empty",
        "blank-only": "is empty",
    }[kind] in message
    _assert_no_leftovers(tmp_path / "cache")


def test_whitespace_is_pythons():
    assert set(WHITESPACE) == {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()}


def test_built_by_one_of_two_processes(tmp_path):
    """Two ranks at once: one parses, the other waits and opens what it wrote."""
    import subprocess

    cpath = _collection(tmp_path, DOCS)
    tpath = _write(
        tmp_path / "t.tsv", "what is a cat\tcats sit on mats\tnew passage\nnew query\tnew passage\tbirds fly south\n"
    )
    counter = tmp_path / "builds"
    (tmp_path / "arrived").mkdir()
    script = f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from pathlib import Path
from datamodules import text_triples
from datamodules.docstore import fingerprint, open_store
from datamodules.textfiles import iter_id_text
build = text_triples._build
arrived = Path({str(tmp_path / "arrived")!r})
def counted(*args):
    with open({str(counter)!r}, "a") as f:
        f.write("x")
    while len(list(arrived.iterdir())) < 2:  # build while the other process is at the lock (an event, not a time)
        time.sleep(0.05)
    build(*args)
text_triples._build = counted
c, cache = Path({str(cpath)!r}), {str(tmp_path / "cache")!r}
store = open_store(cache, fingerprint("tsv-collection", [c]), lambda: iter_id_text(c, "passage"), str(c))
queries = {QUERIES!r}
(arrived / str(os.getpid())).touch()
print(list(text_triples.read_text_triples(Path({str(tpath)!r}), store, queries, cache)), len(queries))
"""
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    ref = reference_read_triples_text(tpath, dict(DOCS), dict(QUERIES))
    assert outs == [f"{ref} {len(QUERIES) + 1}"] * 2 and counter.read_text() == "x"
