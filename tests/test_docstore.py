"""The document store (datamodules/docstore.py) and memory-mapped triples (datamodules/triples.py) against the
in-memory readers they replace: the same texts, order, ids and errors, built once and reused."""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from core.errors import InputError
from datamodules import docstore
from datamodules.docstore import DocStore, fingerprint, open_store, store_folder
from datamodules.textfiles import iter_id_text, read_id_text_tsv
from datamodules.triples import TripleArray, read_id_triples, read_id_triples_list

IDS = ["10", "2", "doc-ä", "1", "b", "a+b", "zz", "0x", "99", "é", "3", "c"]


def _collection(tmp_path: Path, ids=IDS, name="collection.tsv") -> Path:
    rng = np.random.default_rng(0)
    lines = [f"{d}\t{' '.join(f'w{int(w)}' for w in rng.integers(0, 50, rng.integers(1, 30)))} {d}" for d in ids]
    path = tmp_path / name
    path.write_text("\n".join(lines[:5]) + "\n\n" + "\n".join(lines[5:]) + "\n", encoding="utf-8")  # a blank line too
    return path


def _store(path: Path, cache: Path, records=None) -> DocStore:
    return open_store(
        cache, fingerprint("tsv-collection", [path]), records or (lambda: iter_id_text(path, "passage")), str(path)
    )


@pytest.fixture(params=[3, docstore.BATCH_ROWS], ids=["batches-of-3", "one-batch"])
def batch_rows(request, monkeypatch):
    monkeypatch.setattr(docstore, "BATCH_ROWS", request.param)
    return request.param


def test_store_equals_dict_reader(tmp_path, batch_rows):
    path = _collection(tmp_path)
    ref = read_id_text_tsv(path, "passage")
    store = _store(path, tmp_path / "cache")
    assert len(store) == len(ref) and list(store) == list(ref)  # source order, as the dict's
    assert dict(store.items()) == ref and store == ref
    for row, (d, text) in enumerate(ref.items()):
        assert (
            store[d] == text
            and d in store
            and store.row(d) == row
            and store.id_at(row) == d
            and store.text_at(row) == text
        )
    assert list(store.ids) == list(ref) and store.ids[-1] == list(ref)[-1]
    assert [store.id_at(r) for r in store.sorted_rows()] == sorted(ref)
    assert "nope" not in store and 3 not in store and store.row("nope") == -1
    with pytest.raises(KeyError):
        store["nope"]
    again = pickle.loads(pickle.dumps(store))  # a DataLoader worker reopens the folder
    assert again == ref and len(pickle.dumps(store)) < 500


@pytest.mark.parametrize("collide", [False, True], ids=["keys", "colliding-keys"])
def test_rows_equals_a_lookup_per_id(tmp_path, batch_rows, monkeypatch, collide):
    """`rows` (one vectorised search, ids confirmed by their bytes, dense hits read a batch span at once) gives what
    a dict lookup gives for every id, unknown ones and repeats included; with every key colliding (a key of the id's
    length, at build and lookup alike) the walk over equal keys still finds each id."""
    if collide:
        monkeypatch.setattr(docstore, "id_key", lambda d: len(d.encode("utf-8")))
        monkeypatch.setattr(docstore, "_blake8", lambda b: len(b).to_bytes(8, "little"))
    path = _collection(tmp_path)
    ref = {d: r for r, d in enumerate(read_id_text_tsv(path, "passage"))}
    store = _store(path, tmp_path / "cache")
    asked = [*IDS, "nope", "1", "doc-a", "", *reversed(IDS), "zzz"]
    assert store.rows(asked).tolist() == [ref.get(d, -1) for d in asked]
    assert store.rows([]).tolist() == [] and store.rows(iter(["c"])).tolist() == [ref["c"]]
    monkeypatch.setattr(docstore, "ROWS_CHUNK", 3)  # chunks that split the ids anywhere: the same rows, in order
    assert store.rows(iter(asked)).tolist() == [ref.get(d, -1) for d in asked]


def test_store_built_once_and_damage_rebuilt(tmp_path):
    path = _collection(tmp_path)
    cache = tmp_path / "cache"
    first = _store(path, cache)

    def never():
        raise AssertionError("the store was built again")

    assert _store(path, cache, never) == first
    folder = store_folder(cache, first.fingerprint)
    keys = folder / "index_keys.npy"
    keys.write_bytes(keys.read_bytes()[:-8])  # a truncated index
    with pytest.warns(UserWarning, match="damaged"):
        assert _store(path, cache) == read_id_text_tsv(path, "passage")
    path.write_text(path.read_text() + "new\tan added passage\n")  # other content: another store
    grown = _store(path, cache)
    assert len(grown) == len(IDS) + 1 and grown.fingerprint != first.fingerprint


def test_store_duplicate_id_names_both_lines_and_leaves_nothing(tmp_path):
    path = _collection(tmp_path, IDS + ["b"])
    with pytest.raises(InputError) as dict_error:
        read_id_text_tsv(path, "passage")
    cache = tmp_path / "cache"
    with pytest.raises(InputError) as store_error:
        _store(path, cache)
    assert str(store_error.value) == str(dict_error.value)
    assert "first at line" in str(store_error.value)
    assert not cache.exists()  # nothing left: no temporary folder, no lock file, no folder made for them


def test_store_built_by_one_of_two_processes(tmp_path):
    path = _collection(tmp_path)
    counter = tmp_path / "builds"
    script = f"""
import os, sys, time
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from datamodules.docstore import fingerprint, open_store
from datamodules.textfiles import iter_id_text
path = {str(path)!r}
arrived = Path({str(tmp_path / "arrived")!r})
def records():
    with open({str(counter)!r}, "a") as f:
        f.write("x")
    while len(list(arrived.iterdir())) < 2:  # build while the other process is at the store's lock (an event)
        time.sleep(0.05)
    yield from iter_id_text(path, "passage")
(arrived / str(os.getpid())).touch()
print(len(open_store({str(tmp_path / "cache")!r}, fingerprint("tsv-collection", [path]), records, path)))
"""
    (tmp_path / "arrived").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == [str(len(IDS))] * 2 and counter.read_text() == "x"


def _triples_file(tmp_path: Path, lines: list[str], name="triples.tsv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_triple_array_equals_list_reader(tmp_path, batch_rows):
    path = _collection(tmp_path)
    store = _store(path, tmp_path / "cache")
    queries = {f"q{i}": f"query {i}" for i in range(5)}
    rng = np.random.default_rng(1)
    lines = [f"q{rng.integers(5)}\t{IDS[rng.integers(len(IDS))]}\t {IDS[rng.integers(len(IDS))]}" for _ in range(50)]
    tpath = _triples_file(tmp_path, lines)
    ref = read_id_triples_list(tpath)
    triples = read_id_triples(tpath, store, queries, tmp_path / "cache", str(tpath))
    assert isinstance(triples, TripleArray) and triples == ref and list(triples) == ref
    assert isinstance(triples.rows.base, np.memmap)  # a plain view of the mapping: nothing read into memory
    keep = np.array([3, 0, 7])
    assert list(triples.take(keep)) == [ref[i] for i in keep] and triples.take(keep).take(np.array([2])) == [ref[7]]
    assert pickle.loads(pickle.dumps(triples)) == ref
    again = read_id_triples(tpath, store, queries, tmp_path / "cache", str(tpath))
    assert again.path == triples.path  # parsed once


@pytest.mark.parametrize(
    "lines, message",
    [
        (["q0\t10\t2", "q0\t10\tnope"], ":2: triple (q0, 10, nope) of split train names unknown doc id 'nope'"),
        (
            ["q0\t10\t2", "q7\t10\t2"],
            ":2: triple (q7, 10, 2) of split train names query 'q7' which is not among the queries",
        ),
        (["q0\t10\t2", "q0\t10"], ":2: expected 3 tab-separated columns"),
        (["q0\t10\t2", "q0\t\t2"], ":2: empty id"),
    ],
)
def test_triple_errors_name_the_line(tmp_path, lines, message):
    path = _collection(tmp_path)
    store = _store(path, tmp_path / "cache")
    tpath = _triples_file(tmp_path, lines)
    with pytest.raises(InputError) as e:
        read_id_triples(tpath, store, {"q0": "a query"}, tmp_path / "cache", str(tpath))
    assert str(e.value).startswith(f"{tpath}:") and message in str(e.value)
    assert not list((tmp_path / "cache").glob("triples/*.npy"))


def test_truncated_triples_cache_is_parsed_again(tmp_path):
    path = _collection(tmp_path)
    cache = tmp_path / "cache"
    store = _store(path, cache)
    tpath = _triples_file(tmp_path, ["q0\t10\t2", "q0\tb\tc"])
    first = read_id_triples(tpath, store, {"q0": "x"}, cache, str(tpath))
    first.path.write_bytes(first.path.read_bytes()[:-8])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = read_id_triples(tpath, store, {"q0": "x"}, cache, str(tpath))
    assert any("reading" in str(w.message) for w in caught) and again == [("q0", "10", "2"), ("q0", "b", "c")]


@pytest.mark.parametrize("block", [7, 1 << 22])
def test_triple_array_distinct_in_first_seen_order(tmp_path, block):
    """TripleArray.distinct (block-wise array passes) equals the loop the head stage used to run over the triples:
    dict.fromkeys of the queries and of the passages (positive, then negative), also through a selection."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 50, size=(1000, 3)).astype(np.int32)
    np.save(tmp_path / "t.npy", rows)
    whole = TripleArray(tmp_path / "t.npy", [str(i) for i in range(50)], None)
    keep = rng.permutation(1000)[:300]
    for triples, ref in ((whole, rows), (whole.take(keep), rows[keep])):
        q, d = triples.distinct(block)
        assert q.tolist() == list(dict.fromkeys(int(r[0]) for r in ref))
        assert d.tolist() == list(dict.fromkeys(int(x) for r in ref for x in (r[1], r[2])))


@pytest.mark.parametrize("max_texts", [None, 9])
def test_head_stage_training_texts_equal_for_stored_and_listed_triples(tmp_path, max_texts):
    """The head stage's training texts (distinct queries and passages, first-seen order, a seeded sample) are the same
    from memory-mapped triples over a store as from the same triples as a list over a dict."""
    from types import SimpleNamespace

    from datamodules.representations import training_texts

    path = _collection(tmp_path)
    store = _store(path, tmp_path / "cache")
    queries = {f"q{i}": f"query {i}" for i in range(5)}
    rng = np.random.default_rng(2)
    tpath = _triples_file(
        tmp_path,
        [f"q{rng.integers(5)}\t{IDS[rng.integers(len(IDS))]}\t{IDS[rng.integers(len(IDS))]}" for _ in range(40)],
    )
    triples = read_id_triples(tpath, store, queries, tmp_path / "cache", str(tpath))

    def dm(docs, trip):
        split = SimpleNamespace(queries=queries)
        return SimpleNamespace(triples=trip, dataset=SimpleNamespace(docs=docs, split=lambda name: split))

    listed = training_texts(dm(read_id_text_tsv(path, "passage"), list(triples)), max_texts, seed=3)
    stored = training_texts(dm(store, triples), max_texts, seed=3)
    assert stored == listed and len(stored[0]) + len(stored[1]) == (max_texts or len(listed[0]) + len(listed[1]))


@pytest.mark.parametrize("windows", [False, True])
def test_the_head_stage_encodes_the_same_training_texts_whatever_the_training_cut(tmp_path, windows):
    """Why `train.py stage=head` refuses data.rotate_train, data.rotation and data.train_passage on its command line
    (pipeline/jobs.py): the texts its representation cache encodes are the training triples' queries and whole,
    unrotated passages, whichever way fine-tuning cut them."""
    from conftest import synthetic_data

    from datamodules.representations import training_texts

    base = dict(data_seed=5, num_train_queries=12, passage_words=(8 if windows else None))
    texts = set()
    for over in ({}, {"rotate_train": True}, {"rotate_train": True, "rotation": "per_epoch"}):
        if windows:
            over = {**over, "train_passage": "first"} if over else over
        dm = synthetic_data(tmp_path, 3, **base, **over)
        texts.add(tuple(map(tuple, training_texts(dm, None, 3))))
    assert len(texts) == 1
    queries, docs = next(iter(texts))
    dm = synthetic_data(tmp_path, 3, **base)
    assert set(docs) <= set(dm.dataset.docs.values()) and len(queries) > 0
