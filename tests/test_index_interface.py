"""One index interface (retrieval/base.py): every registered index family implements `Index`, round-trips through
save / load to the same run, is chosen by the ranker's capability through the `INDEXES` registry, and an index loaded
without a ranker re-opens its recorded checkpoint with `models.loading.load_ranker`.

Tiny random BERTs (conftest) and a tiny collection, as in tests/test_retrieval.py; BM25 over the same texts.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_capabilities import ToyMulti, ToyMultiConfig
from test_retrieval import _texts, one_thread  # noqa: F401 (an autouse fixture)

import datamodules.bm25 as bm25_lib
import retrieval.base
from core.errors import InputError
from core.registry import Entry
from models.loading import pair_tokenizer_for
from models.rankers import build_ranker
from models.rankers.capabilities import INDEXES as RANKER_INDEX_FAMILIES
from models.rankers.capabilities import RankerCapabilities
from models.rankers.colbert import ColBERTConfig
from models.rankers.repbert import RepBERTConfig
from retrieval import BM25Index, ColBERTIndex, DenseIndex
from retrieval.base import INDEXES, Index, index_class, index_for, open_index
from retrieval.dense import INDEX_OPTIONS

# test_retrieval.py's vocabulary and one-thread fixture (tiny models are fastest on one thread of a shared CPU)
DOCS = {f"d{i}": t for i, t in enumerate(_texts(30, 1, 3, 30))}
QUERIES = {f"q{i}": t for i, t in enumerate(_texts(5, 2, 1, 6))}


def _make(cfg):
    torch.manual_seed(0)
    return build_ranker(cfg).eval()


@pytest.fixture(scope="module")
def rankers(tiny_bert):
    """A ranker for every family that needs one (a family added to INDEXES needs one here too)."""
    return {
        "dense": _make(RepBERTConfig(backbone=tiny_bert)),
        "colbert": _make(ColBERTConfig(backbone=tiny_bert, doc_max_len=24)),
    }


# family -> (build options, search options) of the round trip: small and exact where the family has a choice
CASES = {
    "bm25": ({}, {}),
    "dense": ({"batch_size": 8}, {}),
    "colbert": ({"batch_size": 8, "store_dtype": "float32"}, {"k_tokens": 16, "depth": 20}),
}


# ---- the contract ------------------------------------------------------------------------------------------------
def test_every_family_is_registered_and_complete():
    """The families: every ranker capability's index family plus BM25; each class implements the whole base."""
    assert INDEXES.names() == ["bm25", "colbert", "dense"]
    assert set(RANKER_INDEX_FAMILIES) <= set(INDEXES.names())
    assert sorted(CASES) == INDEXES.names()  # a new family needs a round trip below
    formats = set()
    for family in INDEXES.names():
        cls = index_class(family)
        assert issubclass(cls, Index) and not inspect.isabstract(cls) and cls.family == family
        assert cls.needs_ranker == (family in RANKER_INDEX_FAMILIES)
        assert cls.encoding in (("sequence", "tokens") if cls.needs_ranker else (None,))
        formats.add(cls.format)
    assert len(formats) == len(INDEXES.names())  # open_index tells them apart by format


@pytest.mark.parametrize("family", ["bm25", "colbert", "dense"])
@pytest.mark.parametrize("stage", ["build", "search", "load"])
def test_declared_options_are_the_signatures_keywords(family, stage):
    """`build_options` / `search_options` / `load_options` list exactly the keywords the methods take, so
    retrieval/retrieve.py's `options(stage, offered)` passes a family every option it offers and nothing else."""
    cls = index_class(family)
    params = inspect.signature(getattr(cls, stage)).parameters.values()
    named = {
        p.name for p in params if p.kind is p.KEYWORD_ONLY or (p.default is not p.empty and p.kind is not p.VAR_KEYWORD)
    }
    named -= {"ranker", "k"}  # the base's own arguments
    if any(p.kind is p.VAR_KEYWORD for p in params):
        assert stage == "build" and cls.needs_ranker  # the faiss options, checked by IndexOptions.from_kwargs
        named |= set(INDEX_OPTIONS)
    assert set(getattr(cls, f"{stage}_options")) == named
    offered = {"batch_size": 1, "k_tokens": 2, "store_dtype": "float32", "cache_key": "x", "mmap": True}
    assert set(cls.options(stage, offered)) == set(offered) & named


def _build(family, rankers, docs=DOCS, **opts):
    cls = index_class(family)
    return cls.build(rankers.get(family), docs, **CASES[family][0], **opts)


@pytest.mark.parametrize("family", ["bm25", "colbert", "dense"])
def test_build_search_save_load_round_trip(rankers, family, tmp_path):
    """build / search / save / load on a tiny collection: the loaded index gives the same run, bit for bit."""
    index = _build(family, rankers)
    assert len(index) == len(DOCS) and index.manifest["format"] == index.format
    run = index.search(QUERIES, k=5, **CASES[family][1])
    assert sorted(run) == sorted(QUERIES) and all(0 < len(r) <= 5 for r in run.values())
    assert all(list(r.values()) == sorted(r.values(), reverse=True) for r in run.values())  # best first
    path = index.save(tmp_path / "index")
    assert path == tmp_path / "index" and json.loads((path / "manifest.json").read_text())["format"] == index.format
    cls = type(index)
    loaded = cls.load(path, rankers.get(family))
    assert type(loaded) is cls and len(loaded) == len(DOCS) and loaded.params == index.params
    assert loaded.checkpoint is None
    assert loaded.search(QUERIES, k=5, **CASES[family][1]) == run
    again = open_index(path, rankers.get(family))  # any family, by the manifest's format
    assert type(again) is cls and again.search(QUERIES, k=5, **CASES[family][1]) == run
    with pytest.raises(InputError, match="^k: is 0; expected a positive integer"):
        index.search(QUERIES, k=0)
    with pytest.raises(InputError, match="not an index directory"):
        cls.load(tmp_path)
    other = index_class("dense" if family != "dense" else "colbert")
    with pytest.raises(InputError, match=f"format is '{index.format}'; expected '{other.format}'"):
        other.load(path)


def test_ranker_checks_name_the_family_that_serves_it(rankers):
    with pytest.raises(
        InputError, match="'colbert' is not a single-vector ranker.*use retrieval.colbert_e2e.ColBERTIndex"
    ):
        DenseIndex.build(rankers["colbert"], DOCS)
    with pytest.raises(InputError, match="'repbert' is not a ColBERT ranker.*use retrieval.dense.DenseIndex"):
        ColBERTIndex.build(rankers["dense"], DOCS)
    with pytest.raises(InputError, match="^ranker: the bm25 index takes no ranker; got 'repbert'"):
        BM25Index.build(rankers["dense"], DOCS)
    with pytest.raises(InputError, match="^ckpt: the bm25 index takes no checkpoint"):
        BM25Index.from_checkpoint("x.ckpt", DOCS)
    assert BM25Index.build(None, DOCS).ensure_ranker() is None


# ---- the registry picks the index by capability ------------------------------------------------------------------
# the multi-vector ranker that tests/test_capabilities.py defines: it declares index="colbert" and is no ColBERT class
@pytest.fixture(scope="module")
def toy(tiny_bert):
    torch.manual_seed(1)
    return ToyMulti(ToyMultiConfig(backbone=tiny_bert, doc_max_len=24)).eval()


class Spy(ColBERTIndex):
    """The ColBERT index, recording what retrieve() hands it; registered in place of the `colbert` entry."""

    calls: list = []

    @classmethod
    def build(cls, ranker, docs, **options):
        cls.calls.append(("build", sorted(options)))
        return super().build(ranker, docs, **options)

    def search(self, queries, k=100, **options):
        self.calls.append(("search", sorted(options)))
        return super().search(queries, k, **options)


@pytest.fixture
def spy_registered(monkeypatch):
    """INDEXES' `colbert` entry is Spy for the test: whoever asks the registry gets Spy, a name check would not."""
    monkeypatch.setitem(INDEXES._entries, "colbert", Entry("colbert", Spy, None))
    Spy.calls = []
    return Spy


def test_index_for_asks_the_capability_through_the_registry(toy, rankers, spy_registered):
    assert index_for(rankers["dense"]) is DenseIndex
    assert index_for(toy) is Spy  # toy_multi declares index="colbert": the registry's entry, whatever it holds
    assert index_for(rankers["colbert"]) is Spy

    class CrossToy:
        capabilities = RankerCapabilities(vectors="none")
        cfg = SimpleNamespace(name="cross_toy")

    with pytest.raises(InputError, match="^model.name: 'cross_toy' has no index family; full ranking serves"):
        index_for(CrossToy())


def test_retrieve_builds_the_registry_index_with_its_declared_options(toy, spy_registered, tmp_path, monkeypatch):
    """retrieval/retrieve.py with the toy ranker: the registry's colbert entry is built and searched, with ColBERT's
    own options (store_dtype, store_dir, k_tokens, depth) and none of another family's."""
    import retrieval.retrieve
    from pipeline.config import compose

    monkeypatch.setattr(
        retrieval.retrieve, "load_configured", lambda cfg, model_from_cli: (toy, pair_tokenizer_for(toy), None)
    )
    out = tmp_path / "out"
    argv = ["retrieval=dense", "model=colbert", "data=synthetic", "data.num_docs=30", "data.num_train_queries=4"]
    argv += ["data.num_val_queries=2", "data.num_test_queries=4", "logger=none", f"output_dir={out}"]
    argv += ["retrieval.k=3", "retrieval.k_tokens=100000", "retrieval.depth=null", "retrieval.store_dtype=float32"]
    argv += ["retrieval.batch_size=16"]
    means = retrieval.retrieve.retrieve(compose(argv))
    assert "ndcg_cut_10" in means
    (build, build_opts), (search, search_opts) = Spy.calls
    assert build == "build" and {"store_dtype", "store_dir", "encoded", "index_type"} <= set(build_opts)
    assert set(build_opts) <= set(ColBERTIndex.build_options)
    assert search == "search" and search_opts == ["batch_size", "depth", "k_tokens"]
    manifest = json.loads((out / "index" / "manifest.json").read_text())
    assert manifest["ranker"] == "toy_multi" and manifest["format"] == ColBERTIndex.format
    assert manifest["store_dtype"] == "float32"


# ---- a loaded index re-opens its checkpoint ----------------------------------------------------------------------
@pytest.mark.parametrize("family", ["dense", "colbert"])
def test_loaded_without_a_ranker_reopens_the_recorded_checkpoint(tiny_bert, family, tmp_path, monkeypatch):
    from lightning_modules.module import RankingModule

    torch.manual_seed(0)
    name = "repbert" if family == "dense" else "colbert"
    module = RankingModule({"name": name, "backbone": tiny_bert, "doc_max_len": 24}, {})
    ckpt = tmp_path / "m.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, ckpt)
    cls = index_class(family)
    index = cls.from_checkpoint(ckpt, DOCS, **CASES[family][0])
    assert index.checkpoint == str(ckpt.resolve()) and index.manifest["ranker"] == name
    run = index.search(QUERIES, k=5, **CASES[family][1])
    index.save(tmp_path / "idx")
    opened = []
    real = retrieval.base.load_ranker

    def spy(path, **kw):
        opened.append(str(path))
        return real(path, **kw)

    monkeypatch.setattr(retrieval.base, "load_ranker", spy)
    loaded = cls.load(tmp_path / "idx")
    assert loaded.ranker is None and opened == []  # not before it is needed
    assert loaded.search(QUERIES, k=5, **CASES[family][1]) == run
    assert opened == [str(ckpt.resolve())] and loaded.ranker.cfg.name == name
    loaded.search(QUERIES, k=5, **CASES[family][1])
    assert len(opened) == 1  # once
    with pytest.raises(InputError, match="^ckpt: checkpoint .* does not exist"):
        cls.from_checkpoint(tmp_path / "missing.ckpt", DOCS)


# ---- BM25 through the interface ----------------------------------------------------------------------------------
def test_bm25_index_is_the_one_bm25_implementation(tmp_path, monkeypatch):
    """BM25Index ranks as datamodules.bm25 does (the same run, cached in the same files), reads the cache's own index
    folders, and a run read back from the run cache opens no index."""
    want = bm25_lib.bm25_run(DOCS, QUERIES, 7, tmp_path / "ref", "r", bm25_lib.BM25Params("bm25+", 1.2, 0.5))
    index = BM25Index.build(None, DOCS, method="bm25+", k1=1.2, b=0.5, cache_dir=tmp_path / "c")
    run = index.search(QUERIES, k=7, cache_key="r")
    assert run == {q: dict(r) for q, r in want.items()}
    assert [p.name for p in (tmp_path / "c" / "bm25").glob("r-*.json")] == [
        p.name for p in (tmp_path / "ref" / "bm25").glob("r-*.json")
    ]
    (folder,) = (tmp_path / "c" / "bm25").glob("index-*")
    cached = BM25Index.load(folder)  # a cache folder: no `format` in its manifest
    assert cached.search(QUERIES, k=7) == run and cached.params == {"method": "bm25+", "k1": 1.2, "b": 0.5}

    def no_index(*a, **k):
        raise AssertionError("an index was opened")

    monkeypatch.setattr(bm25_lib, "bm25_index", no_index)
    again = BM25Index.build(None, DOCS, method="bm25+", k1=1.2, b=0.5, cache_dir=tmp_path / "c")
    assert again.search(QUERIES, k=7, cache_key="r") == run  # read back
    monkeypatch.undo()
    # a saved index tokenised otherwise than this version reads queries is refused
    path = index.save(tmp_path / "saved")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["settings"]["stemmer"] = "some-other-stemmer"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="was built with stemmer 'some-other-stemmer'"):
        BM25Index.load(path)
    # a collection without a token: empty rankings, nothing to save
    empty = BM25Index.build(None, [("a", "the of"), ("b", "x")])
    assert empty.search({"q": "the x"}, k=3) == {"q": {}} and len(empty) == 2
    with pytest.raises(InputError, match="^docs: no document has a token"):
        empty.save(tmp_path / "nothing")
    assert not Path(tmp_path / "nothing").exists()
