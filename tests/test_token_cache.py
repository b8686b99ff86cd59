"""Batches assembled from cached content tokens equal batches tokenised from text; the cache is keyed and checked."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import msmarco_shaped_config, synthetic_data
from transformers import AutoTokenizer

from datamodules.token_cache import TokenTable, token_table, tokenizer_digest
from datamodules.tokenization import PairTokenizer, template_of


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


def batches(loader) -> list[dict]:
    return [dict(b) for b in loader]


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            if isinstance(x[k], dict):  # HOST_LENGTHS: numpy arrays the batch carries on the host
                assert sorted(x[k]) == sorted(y[k]) and all(np.array_equal(x[k][j], y[k][j]) for j in x[k]), k
            else:
                assert torch.equal(x[k], y[k]), k


def data(tmp_path, pt, pretokenize: bool, **settings):
    """The data module as the pipeline makes it: read with no tokenizer (pipeline/stages.load_data), then given one."""
    settings = {"num_docs": 80, "num_train_queries": 24, "candidate_depth": 12, "batch_size": 8, **settings}
    dm = synthetic_data(tmp_path / "cache", 3, None, pretokenize=pretokenize, **settings)
    dm.tokenizer = pt
    dm.pretokenize()  # what the loaders call first
    return dm


@pytest.mark.parametrize("kind", ["bi", "cross"])
@pytest.mark.parametrize("lengths", [(8, 16), (32, 180)])
@pytest.mark.parametrize("rotate", [False, True])
def test_cached_batches_equal_text_batches(tmp_path, hf_tokenizer, kind, lengths, rotate):
    pt = PairTokenizer(hf_tokenizer, kind, *lengths)
    settings = {"rotate_train": rotate, "rotate_eval": rotate}
    text, cached = data(tmp_path, pt, False, **settings), data(tmp_path, pt, True, **settings)
    assert text.train_tokens is None and cached.train_tokens is not None
    assert cached.eval_splits["test"].tokens is not None
    assert_same(batches(text.train_dataloader()), batches(cached.train_dataloader()))
    for name in ("val", "test"):
        assert_same(batches(text.eval_dataloader(name)), batches(cached.eval_dataloader(name)))


def test_per_epoch_rotation_and_windows_stay_text(tmp_path, hf_tokenizer):
    pt = PairTokenizer(hf_tokenizer, "bi", 8, 16)
    per_epoch = data(tmp_path, pt, True, rotate_train=True, rotation="per_epoch")
    assert per_epoch.train_tokens is None and per_epoch.eval_splits["val"].tokens is not None
    windows = data(tmp_path, pt, True, passage_words=6)
    assert windows.train_tokens is None and windows.eval_splits["val"].tokens is None


def test_workers_give_the_same_batches(tmp_path, hf_tokenizer):
    pt = PairTokenizer(hf_tokenizer, "bi", 8, 16)
    dm = data(tmp_path, pt, True)
    alone = batches(dm.train_dataloader())
    dm.cfg.num_workers = 2
    assert_same(alone, batches(dm.train_dataloader()))


def test_template_probe(hf_tokenizer):
    t = template_of(hf_tokenizer)
    cls, sep = hf_tokenizer.cls_token_id, hf_tokenizer.sep_token_id
    assert t.single == ((cls,), (sep,)) and t.pair == ((cls,), (sep,), (sep,)) and t.pair_types
    left = AutoTokenizer.from_pretrained(hf_tokenizer.name_or_path, padding_side="left")
    assert template_of(left) is None  # batches are assembled right-padded: such a tokenizer is fed text


def build(tmp_path, texts, key=None, tokenize=None):
    key = key or {"what": "test"}
    tokenize = tokenize or (lambda block: [[len(w) for w in t.split()] for t in block])
    return token_table(tmp_path, key, len(texts), lambda: iter(texts), tokenize, 100)


def test_table_reads_back_and_reuses(tmp_path):
    texts = ["a bb ccc", "dddd", "ee f"]
    table = build(tmp_path, texts)
    assert [list(table[i]) for i in range(3)] == [[1, 2, 3], [4], [2, 1]]
    calls = []
    again = build(tmp_path, texts, tokenize=lambda b: calls.append(b) or [[0]] * len(b))
    assert calls == [] and list(again[1]) == [4]
    assert list(TokenTable.of([[5, 6], []]).lengths()) == [2, 0]


def test_same_size_edit_and_truncation_rebuild(tmp_path):
    texts = ["a bb ccc", "dddd"]
    table = build(tmp_path, texts)
    ids = table.folder / "ids.bin"
    raw = bytearray(ids.read_bytes())
    raw[0] ^= 0xFF  # same size, other bytes
    ids.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="does not match its checksum"):
        table = build(tmp_path, texts)
    assert list(table[0]) == [1, 2, 3]
    ids.write_bytes(ids.read_bytes()[:-2])
    with pytest.warns(UserWarning, match="bytes, the manifest says"):
        table = build(tmp_path, texts)
    assert list(table[1]) == [4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(tmp_path, texts)  # intact: opened silently


def test_key_names_tokenizer_and_length(tmp_path, tiny_bert, hf_tokenizer):
    other = AutoTokenizer.from_pretrained(tiny_bert, do_lower_case=False)
    assert tokenizer_digest(hf_tokenizer) == tokenizer_digest(AutoTokenizer.from_pretrained(tiny_bert))
    assert tokenizer_digest(hf_tokenizer) != tokenizer_digest(other)
    hf_tokenizer("some text", truncation=True, max_length=5)  # the wrapper's truncation state is not part of the key
    assert tokenizer_digest(hf_tokenizer) == tokenizer_digest(AutoTokenizer.from_pretrained(tiny_bert))
    pt_short, pt_long = PairTokenizer(hf_tokenizer, "bi", 8, 16), PairTokenizer(hf_tokenizer, "bi", 8, 32)
    short, long = data(tmp_path, pt_short, True), data(tmp_path, pt_long, True)
    a, b = short.eval_splits["val"].tokens.passages.table, long.eval_splits["val"].tokens.passages.table
    assert a.folder != b.folder
    assert a.lengths().max() <= 14 < b.lengths().max()
    manifest = json.loads((b.folder / "manifest.json").read_text())
    assert manifest["key"]["cap"] == 30 and manifest["count"] == len(b)
    assert np.array_equal(np.diff(np.asarray(b.offsets)), b.lengths())


@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_store_and_id_triples(tmp_path, hf_tokenizer, kind):
    """A document store with memory-mapped id triples (the MS MARCO layout): rows are read, not looked up."""
    from bench import synthetic_msmarco as sm
    from datamodules.datamodule import RankingDataModule

    spec = sm.Spec(passages=400, val_queries=6, test_queries=6, other_queries=2, vocab=300)
    folder, _, _ = sm.ensure(tmp_path / "data", spec, log=lambda *a: None)
    pt = PairTokenizer(hf_tokenizer, kind, 8, 24)

    def module(pretokenize: bool):
        settings = dict(candidate_depth=5, batch_size=16, pretokenize=pretokenize)
        cfg = msmarco_shaped_config(folder, tmp_path / "cache", **settings)
        dm = RankingDataModule(cfg, None, seed=1)
        dm.setup()
        dm.tokenizer = pt
        return dm

    text, cached = module(False), module(True)
    assert cached.train_tokens is None  # built by the loaders, for the tokenizer they are given
    assert_same(batches(text.train_dataloader()), batches(cached.train_dataloader()))
    passages = cached.train_tokens[1]
    assert passages.holds_rows_of(cached.triples) and passages.held is None  # every passage: one table for all runs
    assert_same(batches(text.eval_dataloader("test")), batches(cached.eval_dataloader("test")))


def test_resume_with_workers_continues_the_same_batches(tmp_path, hf_tokenizer):
    """A loader resumed after k batches (as Lightning restores it) gives the uninterrupted run's remaining batches."""
    pt = PairTokenizer(hf_tokenizer, "bi", 8, 16)
    dm = data(tmp_path, pt, True, num_workers=2)
    loader = dm.train_dataloader()
    assert loader.num_workers == 2 and loader.persistent_workers and loader.prefetch_factor == 4
    whole = batches(loader)
    resumed = dm.train_dataloader()
    resumed.load_state_dict({"epoch": 0, "consumed": 3})
    assert_same(whole[3:], batches(resumed))
    dm.cfg.num_workers = 0
    assert_same(whole, batches(dm.train_dataloader()))  # and the same as without workers


def test_loader_workers_rule(monkeypatch):
    from datamodules.datamodule import loader_workers

    assert loader_workers(3, cuda=False, devices=1) == 3  # a setting is taken as it is
    assert loader_workers(None, cuda=False, devices=1) == 0  # the CPU's cores run the model
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert loader_workers(None, cuda=True, devices=1) == 8  # at most 8
    assert loader_workers(None, cuda=True, devices=4) == 3  # 16 cores / 4 ranks, less the rank's own
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert loader_workers(None, cuda=True, devices=2) == 1  # at least one


@pytest.mark.parametrize("name", ["repbert", "colbert"])
def test_index_encoding_from_the_token_cache(tmp_path, tiny_bert, name):
    """Full ranking's encoding of a tokenised collection gives the ids and vectors of encoding its texts."""
    from conftest import tiny_bi_encoders

    from datamodules.tokenized import TokenizedCollection
    from models.loading import pair_tokenizer_for
    from retrieval.encode import encode_docs

    ranker = tiny_bi_encoders(tiny_bert)[name]
    pt = pair_tokenizer_for(ranker)
    docs = {f"d{i}": " ".join(["alpha beta", "gamma"] * (i % 7 + 1)) + f"  word{i}\tend" for i in range(40)}
    collection = TokenizedCollection.of(docs, pt, tmp_path, True)
    assert isinstance(collection, TokenizedCollection) and len(collection) == len(docs)
    assert TokenizedCollection.of(docs, pt, tmp_path, False) is docs
    assert [list(collection.text_at(i)) for i in range(3)] == pt.ids([docs["d0"], docs["d1"], docs["d2"]], "doc")
    text = list(encode_docs(ranker, pt, docs, batch_size=8, output="tokens"))
    cached = list(encode_docs(ranker, pt, collection, batch_size=8, output="tokens"))
    assert [ids for ids, _ in text] == [ids for ids, _ in cached]
    for (_, a), (_, b) in zip(text, cached):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)


@pytest.mark.parametrize("model", ["colbert", "bert_cat"])
def test_train_py_uses_the_cache_and_writes_the_same_files(tmp_path, tiny_bert, model):
    """train.py reads the data before the model (no tokenizer then): the loaders still assemble batches from the cache,
    and the run's files are byte for byte those of tokenising text per batch."""
    from conftest import finetune_steps, job_args, run_script, small_run

    outs = {}
    for flag in ("true", "false"):
        cache, out = tmp_path / f"cache-{flag}", tmp_path / f"out-{flag}"
        setup = [
            *small_run(*finetune_steps(3), triples=24, eval_queries=6, depth=10, probe_queries=4, probe_docs=8),
            f"model={model}",
            f"model.backbone={tiny_bert}",
            "eval.isotropy_paper=false",
        ]
        # (BERT_CAT encodes no vectors of its own: train.py refuses the isotropy keys beside it)
        run_script(
            "train.py",
            *job_args("train.py", setup),
            f"data.pretokenize={flag}",
            f"data.cache_dir={cache}",
            f"output_dir={out}",
        )
        outs[flag] = out
    built = list((tmp_path / "cache-true" / "tokens").glob("*/manifest.json"))
    assert len(built) == 2  # the passages (cut once per passage) and the training queries
    for name in ("metrics.json", "per_query.json", "run.trec", "validation.json"):
        assert (outs["true"] / name).read_bytes() == (outs["false"] / name).read_bytes(), name
    assert not (tmp_path / "cache-false" / "tokens").exists()
