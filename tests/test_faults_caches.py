"""Caches keyed by all that makes them, checked when read (issue 48, item 3).

For every cache and store: an untouched one is reused (nothing rebuilt, nothing re-hashed beyond its stat), and a
same-size edit of its files or of its inputs (for the representation cache: another tokenizer, precision, weights,
lengths) is found: rebuilt with exactly one warning naming the cache and why, and the result equals a fresh build's.
Tiny random BERTs and synthetic texts; no entry script runs (the head stage's own keying is tested through
`pipeline.head_stage.build_cache`'s pieces: `input_digest` of the checkpoint file).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core import digests
from datamodules.docstore import fingerprint, open_store, open_text_index
from datamodules.textfiles import iter_id_text

PAST = time.time() - 3600  # inputs older than core.digests.RACY_S: their memo is trusted on stat


def caught_warnings(fn):
    """(fn()'s result, the messages of the warnings it raised)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught]


def one_warning(msgs: list[str], *needles: str) -> str:
    hits = [m for m in msgs if all(n in m for n in needles)]
    assert len(hits) == 1, msgs
    return hits[0]


def edit_same_size(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first `old` in the file by `new` (same length) in place: same size and inode, a later mtime."""
    assert len(old) == len(new)
    raw = path.read_bytes()
    at = raw.index(old)
    time.sleep(0.02)  # past the clock's tick: the edit moves the mtime, as any edit a person makes
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)


def flip_byte(path: Path, at: int | None = None) -> None:
    """Change one byte of the file in place (same size)."""
    raw = path.read_bytes()
    at = len(raw) // 2 if at is None else at
    time.sleep(0.02)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([raw[at] ^ 0x01]))


@pytest.fixture
def hashed(monkeypatch):
    """The files core.digests hashes from now on (every SHA-256 of a cache's or an input's file)."""
    seen: list[str] = []
    real = digests.file_sha256
    monkeypatch.setattr(digests, "file_sha256", lambda p: seen.append(Path(p).name) or real(p))
    monkeypatch.setattr(digests, "_seen", {})
    return seen


# ---- core.digests: the memo every cache shares ---------------------------------------------------------------------
def test_input_digest_memo_rehashes_only_when_the_stat_moves(tmp_path, hashed):
    f, memo = tmp_path / "collection.tsv", tmp_path / "cache" / "digests"
    f.write_text("d1\tfirst passage\nd2\tsecond passage\n")
    os.utime(f, (PAST, PAST))
    first, changed = digests.input_digest(f, memo)
    assert changed is None and hashed == ["collection.tsv"]
    digests._seen.clear()  # another process: the memo on disk answers
    assert digests.input_digest(f, memo) == (first, None) and hashed == ["collection.tsv"]
    os.utime(f, (PAST + 5, PAST + 5))  # touched, same bytes: hashed again, no change
    assert digests.input_digest(f, memo) == (first, None) and len(hashed) == 2
    edit_same_size(f, b"first", b"F1rst")
    os.utime(f, (PAST + 5, PAST + 5))  # even with the mtime set back: the ctime moved
    digest, changed = digests.input_digest(f, memo)
    assert digest != first and changed == "same size, other bytes" and len(hashed) == 3


def test_record_problem_size_always_bytes_when_the_stat_moved(tmp_path, hashed):
    f = tmp_path / "ids.bin"
    f.write_bytes(bytes(range(200)))
    record = digests.file_record(f)
    hashed.clear()
    assert digests.record_problem(f, record) is None and hashed == []  # stat as written: nothing read
    flip_byte(f)
    assert "does not match its checksum" in digests.record_problem(f, record)
    f.write_bytes(bytes(range(100)))
    assert "has 100 bytes, the manifest says 200" in digests.record_problem(f, record)


# ---- the representation cache (models/heads/cache.py) -------------------------------------------------------------
@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    from conftest import make_tiny_bert, tiny_bi_encoders

    from models.loading import pair_tokenizer_for

    bert = make_tiny_bert(tmp_path_factory.mktemp("tiny_bert_caches"))
    ranker = tiny_bi_encoders(str(bert))["colbert"]
    return ranker, pair_tokenizer_for(ranker), bert


QUERIES = ["what is a kernel", "whitening the token vectors"]
DOCS = ["kernel pooling in ranking", "a flow head on frozen vectors", "isotropy of token vectors"]


def _rep_build(path, ranker, pt, **kw):
    from models.heads.cache import RepresentationCache

    kw = {"dtype": "float32", "batch_size": 2, **kw}
    return RepresentationCache.build(path, ranker, pt, QUERIES, DOCS, **kw)


def _other_tokenizer(bert: Path, tmp_path: Path):
    """The tiny BERT's tokenizer with two vocabulary entries swapped: the same vocabulary, other ids."""
    from transformers import AutoTokenizer

    other = tmp_path / "bert_other_vocab"
    shutil.copytree(bert, other)
    spec = json.loads((other / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["kernel"], vocab["token"] = vocab["token"], vocab["kernel"]
    (other / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return AutoTokenizer.from_pretrained(str(other))


@pytest.mark.parametrize("change", ["tokenizer", "precision", "weights", "query length", "vectors.bin edited"])
def test_representation_cache_notices_what_made_it(colbert, tmp_path, change, monkeypatch):
    from datamodules.tokenization import PairTokenizer
    from models.heads import cache as cache_mod

    ranker, pt, bert = colbert
    path = tmp_path / "representations" / "c"
    good = np.array(_rep_build(path, ranker, pt).vectors())

    encoded = []
    real = cache_mod._vectors
    monkeypatch.setattr(cache_mod, "_vectors", lambda *a: encoded.append(1) or real(*a))
    again, msgs = caught_warnings(lambda: _rep_build(path, ranker, pt))  # untouched: reused
    assert not encoded and not [m for m in msgs if "representation cache" in m]
    assert np.array_equal(np.array(again.vectors()), good)

    kw, use_ranker, use_pt = {}, ranker, pt
    if change == "tokenizer":
        use_pt = PairTokenizer(_other_tokenizer(bert, tmp_path), pt.kind, pt.query_max_len, pt.doc_max_len)
    elif change == "precision":
        kw = {"precision": "bf16-autocast", "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
    elif change == "weights":
        use_ranker = copy.deepcopy(ranker)
        with torch.no_grad():
            next(use_ranker.parameters()).add_(0.01)
    elif change == "query length":
        use_pt = PairTokenizer(pt.tokenizer, pt.kind, 3, pt.doc_max_len)
    else:
        flip_byte(path / "vectors.bin", 4 * 7)  # one float32's low byte: still finite
    rebuilt, msgs = caught_warnings(lambda: _rep_build(path, use_ranker, use_pt, **kw))
    why = "does not match its checksum" if change == "vectors.bin edited" else f"other inputs ({change})"
    one_warning(msgs, "representation cache", why, "rebuilding it")
    fresh = _rep_build(tmp_path / "fresh", use_ranker, use_pt, **kw)
    assert np.array_equal(np.array(rebuilt.vectors()), np.array(fresh.vectors()))
    if change != "vectors.bin edited":
        assert not np.array_equal(np.array(rebuilt.vectors()), good)


def test_checkpoint_digest_sees_other_weights_at_the_same_path(colbert, tmp_path, hashed):
    """The head stage keys its cache by the checkpoint file's digest (memoised): other weights at the same path, even
    written in place with the mtime set back, are other weights; an untouched checkpoint is not read again."""
    ranker = colbert[0]
    ck, memo = tmp_path / "last.ckpt", tmp_path / "cache" / "digests"
    torch.save({"state_dict": ranker.state_dict()}, ck)
    os.utime(ck, (PAST, PAST))
    first, _ = digests.input_digest(ck, memo)
    digests._seen.clear()
    assert digests.input_digest(ck, memo)[0] == first and hashed == ["last.ckpt"]  # memo: not read again
    flip_byte(ck, ck.stat().st_size // 2)  # a weight's byte, in place: same size and inode
    os.utime(ck, (PAST, PAST))
    assert digests.input_digest(ck, memo)[0] != first


def test_a_same_size_edit_of_the_backbone_config_builds_a_new_representation_cache(tmp_path, monkeypatch):
    """The fourth fault trial's C2: a checkpoint records its backbone's path, and the architecture is read from that
    folder's config.json at every load, so `"gelu"` -> `"relu"` there (same size) is another ranker from the same
    checkpoint: the head stage's cache (keyed as `build_cache` keys it: the checkpoint's digest, the backbone's files'
    digests memoised in <cache>/digests) is rebuilt with one warning naming the file, and equals a fresh cache's."""
    from conftest import make_tiny_bert, tiny_bi_encoders

    from models.heads import cache as cache_mod
    from models.loading import pair_tokenizer_for
    from models.rankers.backbone import backbone_digests

    bert = make_tiny_bert(tmp_path / "bert")  # its own copy: the shared fixture's folder is not edited
    memo, path = tmp_path / "cache" / "digests", tmp_path / "cache" / "representations" / "c"
    ranker = tiny_bi_encoders(str(bert))["colbert"]
    state = copy.deepcopy(ranker.state_dict())  # the checkpoint: every weight, as load_ranker loads them (strictly)
    ck = tmp_path / "last.ckpt"
    torch.save({"state_dict": state}, ck)
    weights, _ = digests.input_digest(ck, memo)

    def from_checkpoint():
        r = tiny_bi_encoders(str(bert))["colbert"]
        r.load_state_dict(state)
        return r, pair_tokenizer_for(r)

    def build(at, r, pt):
        return _rep_build(at, r, pt, weights=weights, backbone=backbone_digests(str(bert), memo))

    good = np.array(build(path, *from_checkpoint()).vectors())
    encoded = []
    real = cache_mod._vectors
    monkeypatch.setattr(cache_mod, "_vectors", lambda *a: encoded.append(1) or real(*a))
    _, msgs = caught_warnings(lambda: build(path, *from_checkpoint()))  # untouched: reused
    assert not encoded and not [m for m in msgs if "representation cache" in m]

    config = bert / "config.json"
    size = config.stat().st_size
    edit_same_size(config, b'"gelu"', b'"relu"')
    assert config.stat().st_size == size
    rebuilt, msgs = caught_warnings(lambda: build(path, *from_checkpoint()))
    one_warning(msgs, "representation cache", "other inputs (backbone config.json); rebuilding it")
    assert encoded
    fresh = build(tmp_path / "fresh" / "c", *from_checkpoint())
    assert np.array_equal(np.array(rebuilt.vectors()), np.array(fresh.vectors()))
    assert not np.array_equal(np.array(rebuilt.vectors()), good)  # relu: other vectors, which the old cache held


def test_single_token_cache_is_keyed_by_the_heads_activation_and_epsilon(tmp_path):
    """The single-token cache (lexical enrichment) of a backbone's own MLM head: the head's activation and LayerNorm
    epsilon come from the backbone's config.json, so a head with the same tensors and another activation is optimised
    anew (not read from the first head's cache), and its vectors equal an uncached run's."""
    from analyses.vocab.lexical_enrichment import cached_single_tokens
    from analyses.vocab.mlm_head import MLMHead

    torch.manual_seed(0)
    emb = torch.randn(12, 8)
    gelu = MLMHead(emb, act="gelu")
    relu = MLMHead(emb, act="relu")
    relu.load_state_dict(gelu.state_dict())  # the same tensors
    opts = SimpleNamespace(st_lr=0.05, st_threshold=0.5, st_max_steps=5, st_batch_size=8)
    ids, cache = [1, 4, 7], tmp_path / "cache"
    first, _ = cached_single_tokens(gelu, ids, opts, cache)
    got, summary = cached_single_tokens(relu, ids, opts, cache)
    assert summary["optimised_now"] == len(ids)  # not the gelu head's vectors
    want, _ = cached_single_tokens(relu, ids, opts, None)
    assert torch.equal(got, want) and not torch.equal(got, first)
    assert len(list((cache / "single_tokens").glob("*.pt"))) == 2


# ---- the document store, its text index (datamodules/docstore.py) -------------------------------------------------
def _collection(tmp_path: Path) -> Path:
    path = tmp_path / "collection.tsv"
    path.write_text("".join(f"d{i}\tpassage number {i} about kernel{i % 3}\n" for i in range(12)), encoding="utf-8")
    os.utime(path, (PAST, PAST))
    return path


def _open(path: Path, cache: Path):
    return open_store(
        cache, fingerprint("tsv-collection", [path], cache_dir=cache), lambda: iter_id_text(path, "passage"), str(path)
    )


@pytest.mark.parametrize("edited", ["docs.arrow", "index_rows.npy", "sorted_rows.npy"])
def test_document_store_same_size_edit_is_rebuilt(tmp_path, edited, monkeypatch, hashed):
    from datamodules import docstore

    path, cache = _collection(tmp_path), tmp_path / "cache"
    store = _open(path, cache)
    items = list(store.items())
    builds = []
    real = docstore._build
    monkeypatch.setattr(docstore, "_build", lambda *a: builds.append(1) or real(*a))
    hashed.clear()
    _, msgs = caught_warnings(lambda: _open(path, cache))  # untouched: reused, nothing hashed
    assert not builds and hashed == [] and not msgs
    f = store.folder / edited
    if edited == "docs.arrow":
        edit_same_size(f, b"passage number 5", b"passage NUMBER 5")  # the case: a same-size edit inside it
    else:
        arr = np.load(f)
        arr[[0, 1]] = arr[[1, 0]]
        time.sleep(0.02)
        with open(f, "r+b") as fh:  # in place: same size and inode
            fh.seek(len(f.read_bytes()) - arr.nbytes)
            fh.write(arr.tobytes())
    again, msgs = caught_warnings(lambda: _open(path, cache))
    one_warning(msgs, "document store", edited, "does not match its checksum", "rebuilding it")
    assert builds == [1] and list(again.items()) == items


def test_collection_same_size_edit_makes_a_new_store_with_a_warning(tmp_path):
    path, cache = _collection(tmp_path), tmp_path / "cache"
    before = _open(path, cache)
    edit_same_size(path, b"passage number 5", b"passage NUMBER 5")
    after, msgs = caught_warnings(lambda: _open(path, cache))
    one_warning(msgs, "collection.tsv", "changed since the caches were made from it (same size, other bytes)")
    assert after.fingerprint != before.fingerprint and after["d5"].startswith("passage NUMBER 5")
    fresh = _open(path, tmp_path / "fresh")
    assert list(after.items()) == list(fresh.items())
    _, msgs = caught_warnings(lambda: _open(path, cache))  # said once: the memo now holds the new content
    assert not msgs


def test_text_index_same_size_edit_is_rebuilt(tmp_path):
    path, cache = _collection(tmp_path), tmp_path / "cache"
    store = _open(path, cache)
    index = open_text_index(store, cache)
    texts = [store.text_bytes_at(r) for r in range(len(store))]
    want = index.rows_of(texts)
    _, msgs = caught_warnings(lambda: open_text_index(store, cache))
    assert not msgs
    flip_byte(index.folder / "keys.npy", len((index.folder / "keys.npy").read_bytes()) - 3)
    again, msgs = caught_warnings(lambda: open_text_index(store, cache))
    one_warning(msgs, "text index", "keys.npy does not match its checksum", "rebuilding it")
    assert np.array_equal(again.rows_of(texts), want)


# ---- BM25: index and runs (datamodules/bm25.py) ---------------------------------------------------------------------
BM25_DOCS = {f"d{i}": f"passage {i} about kernels and {'flows' if i % 2 else 'whitening'} {i * 7}" for i in range(12)}
BM25_QUERIES = {"q1": "kernels", "q2": "whitening flows"}


def test_bm25_index_same_size_edit_is_rebuilt(tmp_path, monkeypatch, hashed):
    from datamodules import bm25

    cache = tmp_path / "cache"
    want = bm25.compute_bm25_run(BM25_DOCS, BM25_QUERIES, 5, bm25.BM25Params(), cache)
    builds = []
    real = bm25._build_index
    monkeypatch.setattr(bm25, "_build_index", lambda *a, **k: builds.append(1) or real(*a, **k))
    hashed.clear()
    _, msgs = caught_warnings(lambda: bm25.bm25_index(BM25_DOCS, bm25.BM25Params(), cache))
    assert not builds and hashed == [] and not msgs
    (folder,) = (p for p in (cache / "bm25").glob("index-*") if p.is_dir())
    f = folder / bm25.DOC_IDS
    flip_byte(f, len(f.read_bytes()) - 1)  # the last doc id's last character
    got, msgs = caught_warnings(lambda: bm25.compute_bm25_run(BM25_DOCS, BM25_QUERIES, 5, bm25.BM25Params(), cache))
    one_warning(msgs, "BM25 index", "doc_ids.npy does not match its checksum", "rebuilding it")
    assert builds == [1] and got == want


def test_bm25_run_cache_same_size_edit_is_recomputed(tmp_path):
    from datamodules.bm25 import bm25_run

    computed = []

    def run():
        return bm25_run(BM25_DOCS, BM25_QUERIES, 5, tmp_path, "t", compute=lambda: computed.append(1) or ranked())

    def ranked():
        return bm25_run(BM25_DOCS, BM25_QUERIES, 5)

    good = run()
    _, msgs = caught_warnings(run)
    assert computed == [1] and not msgs  # untouched: read back
    (path,) = (tmp_path / "bm25").glob("t-*.json")
    edit_same_size(path, b'"d', b'"x')  # another doc id, same size: still valid JSON
    again, msgs = caught_warnings(run)
    one_warning(msgs, "BM25 run cache", "does not match its checksum", "recomputing it")
    assert computed == [1, 1] and again == good


# ---- triples: id triples, text triples (datamodules/triples.py, text_triples.py) -----------------------------------
def _triples_inputs(tmp_path: Path):
    path, cache = _collection(tmp_path), tmp_path / "cache"
    store = _open(path, cache)
    queries = {"q1": "kernel question", "q2": "another question"}
    tpath = tmp_path / "triples.tsv"
    tpath.write_text("q1\td1\td2\nq2\td3\td4\nq1\td5\td6\n", encoding="utf-8")
    os.utime(tpath, (PAST, PAST))
    return store, queries, tpath, cache


def test_id_triples_same_size_edit_is_read_again(tmp_path):
    from datamodules.triples import read_id_triples

    store, queries, tpath, cache = _triples_inputs(tmp_path)
    want = list(read_id_triples(tpath, store, queries, cache, str(tpath)))
    (npy,) = (cache / "triples").glob("*.npy")
    mtime = npy.stat().st_mtime_ns
    _, msgs = caught_warnings(lambda: list(read_id_triples(tpath, store, queries, cache, str(tpath))))
    assert not msgs and npy.stat().st_mtime_ns == mtime  # untouched: reused, not rewritten
    arr = np.load(npy)
    arr[0, 1], arr[0, 2] = arr[0, 2], arr[0, 1]  # positive and negative swapped: same size
    time.sleep(0.02)
    with open(npy, "r+b") as fh:
        fh.seek(len(npy.read_bytes()) - arr.nbytes)
        fh.write(arr.tobytes())
    got, msgs = caught_warnings(lambda: list(read_id_triples(tpath, store, queries, cache, str(tpath))))
    one_warning(msgs, "cached triples are stale or damaged", "does not match its checksum", "reading")
    assert got == want
    edit_same_size(tpath, b"q1\td1\td2", b"q1\td2\td1")  # the source itself: a new content, named once
    got, msgs = caught_warnings(lambda: list(read_id_triples(tpath, store, queries, cache, str(tpath))))
    one_warning(msgs, "triples.tsv", "changed since the caches were made from it")
    assert got[0] == ("q1", "d2", "d1") and got[1:] == want[1:]


def test_text_triples_same_size_edit_is_rebuilt(tmp_path):
    from datamodules.text_triples import read_text_triples

    store, queries, _, cache = _triples_inputs(tmp_path)
    tpath = tmp_path / "text_triples.tsv"
    tpath.write_text(
        f"kernel question\t{store['d1']}\t{store['d2']}\nnew question\t{store['d3']}\ta passage not in it\n",
        encoding="utf-8",
    )
    want = list(read_text_triples(tpath, store, dict(queries), cache))
    (folder,) = (p for p in (cache / "triples").glob("text-*") if p.is_dir())
    _, msgs = caught_warnings(lambda: list(read_text_triples(tpath, store, dict(queries), cache)))
    assert not msgs
    npy = folder / "triples.npy"
    arr = np.load(npy)
    arr[0, 1], arr[0, 2] = arr[0, 2], arr[0, 1]
    time.sleep(0.02)
    with open(npy, "r+b") as fh:
        fh.seek(len(npy.read_bytes()) - arr.nbytes)
        fh.write(arr.tobytes())
    got, msgs = caught_warnings(lambda: list(read_text_triples(tpath, store, dict(queries), cache)))
    one_warning(msgs, "cached text triples are incomplete or damaged")
    assert got == want


# ---- the token cache (datamodules/token_cache.py), docpairs (ir_datasets) ----------------------------------------
def test_token_cache_same_size_edit_is_rebuilt(tmp_path, hashed):
    from datamodules.token_cache import token_table

    texts = ["a bb ccc", "dddd", "ee f"]
    calls = []

    def build():
        return token_table(
            tmp_path,
            {"t": 1},
            len(texts),
            lambda: iter(texts),
            lambda b: calls.append(1) or [[len(w) for w in t.split()] for t in b],
            100,
        )

    want = [list(r) for r in (build()[i] for i in range(3))]
    hashed.clear()
    _, msgs = caught_warnings(build)
    assert len(calls) == 1 and hashed == [] and not msgs
    (folder,) = (p for p in (tmp_path / "tokens").iterdir() if p.is_dir())
    flip_byte(folder / "ids.bin", 0)
    table, msgs = caught_warnings(build)
    one_warning(msgs, "token cache is stale or damaged", "ids.bin does not match its checksum")
    assert len(calls) == 2 and [list(table[i]) for i in range(3)] == want


def test_docpairs_same_size_edit_is_read_again(tmp_path):
    from datamodules.sources import ir_datasets_source as src

    pairs = [SimpleNamespace(query_id=f"q{i}", doc_id_a=f"a{i}", doc_id_b=f"b{i}") for i in range(5)]
    read = []
    ds = SimpleNamespace(docpairs_iter=lambda: read.append(1) or iter(pairs), docpairs_count=lambda: len(pairs))
    cfg = SimpleNamespace(cache_dir=str(tmp_path), max_docpairs=None)
    pytest.importorskip("ir_datasets")
    want = list(src._docpairs(ds, "x/y", cfg))
    _, msgs = caught_warnings(lambda: list(src._docpairs(ds, "x/y", cfg)))
    assert read == [1] and not msgs
    (arrow,) = (tmp_path / "docpairs").glob("*.arrow")
    edit_same_size(arrow, b"a3", b"a9")
    got, msgs = caught_warnings(lambda: list(src._docpairs(ds, "x/y", cfg)))
    one_warning(msgs, "cached docpairs are stale or damaged", "does not match its checksum")
    assert read == [1, 1] and got == want


def test_sidecar_of_an_earlier_version_is_a_stale_cache(tmp_path):
    f = tmp_path / "run.json"
    f.write_text(json.dumps({"run": {}}))
    assert "no checksum record" in digests.sidecar_problem(f)
    digests.write_sidecar(f)
    assert digests.sidecar_problem(f) is None


# ---- through the head stage: the case (bf16 after an fp32 cache), other weights at the same path -----------
@pytest.mark.slow
def test_head_stage_rebuilds_a_cache_of_another_precision_or_weights(tmp_path, tiny_bert):
    """`train.py stage=head` (in-process): an fp32 cache is reused as is, then bf16 and other weights at the same
    checkpoint path each rebuild it with one warning, and the head's metrics equal a run on a fresh cache."""
    from test_faults_inputs import SMALL  # the tiny run of the other fault tests

    from pipeline.cli import main
    from pipeline.config import compose
    from pipeline.run import train

    common = [*SMALL, f"model.backbone={tiny_bert}"]
    ft = tmp_path / "ft"
    train(
        compose(
            [
                *common,
                "trainer.max_steps=1",
                "eval.before_training=false",
                f"data.cache_dir={tmp_path / 'c0'}",
                "eval.start_candidate=false",
                f"output_dir={ft}",
            ]
        )
    )
    ck = ft / "checkpoints" / "last.ckpt"

    def head(name: str, cache: Path, *extra: str) -> tuple[dict, list[str]]:
        out = tmp_path / name
        argv = [*common, "stage=head", f"ckpt={ck}", "head=whitening", f"data.cache_dir={cache}", f"output_dir={out}"]
        rc, msgs = caught_warnings(lambda: main([*argv, *extra], lambda c, _: train(c)))
        assert rc == 0
        return json.loads((out / "metrics.json").read_text()), [m for m in msgs if "representation cache" in m]

    cache = tmp_path / "cache"
    first, err = head("h0", cache)
    assert not err
    reps = cache / "representations"
    (folder,) = (p for p in reps.iterdir() if p.is_dir())
    written = (folder / "vectors.bin").stat().st_mtime_ns
    again, err = head("h1", cache)
    assert not err and again == first and (folder / "vectors.bin").stat().st_mtime_ns == written  # reused
    bf16, err = head("h2", cache, "trainer.precision=bf16-mixed")
    assert len(err) == 1 and "other inputs (precision); rebuilding it" in err[0], err
    fresh, _ = head("h3", tmp_path / "fresh", "trainer.precision=bf16-mixed")
    assert bf16 == fresh
    state = torch.load(ck, map_location="cpu", weights_only=False)
    w = next(k for k in state["state_dict"] if k.endswith("word_embeddings.weight"))
    state["state_dict"][w] = state["state_dict"][w] * 1.5
    torch.save(state, ck)  # other weights at the same path
    other, err = head("h4", cache, "trainer.precision=bf16-mixed")
    assert len(err) == 1 and "other inputs (weights); rebuilding it" in err[0], err
    fresh, _ = head("h5", tmp_path / "fresh2", "trainer.precision=bf16-mixed")
    assert other == fresh and len([p for p in reps.iterdir() if p.is_dir()]) == 1
