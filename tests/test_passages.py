"""Long documents as passages (datamodules/passages.py): sliding windows against a brute-force definition, FirstP /
MaxP document scores through the ordinary evaluation path against scoring every passage one at a time, the
passages training triplets draw, and the config checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import synthetic_config

from core.errors import InputError
from datamodules.config import DataConfig
from datamodules.datamodule import RankingDataModule, TripletDataset
from datamodules.passages import (
    expand_pairs,
    passage_index,
    split_passages,
    window_starts,
)
from datamodules.sources.synthetic import SyntheticConfig
from lightning_modules.module import RankingModule


@pytest.mark.parametrize(
    "n,size,stride", [(0, 4, 2), (3, 4, 2), (4, 4, 2), (5, 4, 2), (10, 4, 2), (11, 4, 3), (20, 5, 5), (7, 3, 1)]
)
def test_windows_cover_the_document_and_stop_at_its_end(n, size, stride):
    starts = window_starts(n, size, stride)
    assert starts == [stride * k for k in range(len(starts))]
    covered = {w for s in starts for w in range(s, min(s + size, n))}
    assert covered == set(range(n))
    assert starts[-1] + size >= n  # the last window reaches the end ...
    assert all(s + size < n for s in starts[:-1])  # ... and is the first that does
    words = [f"w{i}" for i in range(n)]
    assert split_passages(" ".join(words), size, stride) == [" ".join(words[s : s + size]) for s in starts]


def test_expand_pairs_matches_a_loop():
    docs = ["a b c d e f g", "h i", "j k l m n"]
    pairs = np.array([[0, 2], [0, 0], [1, 1], [1, 2]])
    for mode in ("max", "first"):
        got_pairs, texts, unit_doc = expand_pairs(pairs, docs, 3, 2, mode)
        want_texts, want_doc, first = [], [], {}
        for d, text in enumerate(docs):
            ps = split_passages(text, 3, 2)[: 1 if mode == "first" else None]
            first[d] = len(want_texts)
            want_texts += ps
            want_doc += [d] * len(ps)
        want_pairs = [(q, first[d] + k) for q, d in pairs.tolist() for k in range(want_doc.count(d))]
        assert texts == want_texts and unit_doc.tolist() == want_doc
        assert [tuple(p) for p in got_pairs.tolist()] == want_pairs


# ------------------------------------------------------------------------------------------------ evaluation


def data_cfg(**kw) -> SyntheticConfig:
    sizes = dict(num_docs=60, num_train_queries=12, num_val_queries=4, num_test_queries=3, num_topics=12)
    base = dict(data_seed=5, candidate_depth=4, passage_words_min=20, passage_words_max=30, eval_batch_size=5)
    return synthetic_config(kw.pop("cache_dir"), **{**sizes, **base, **kw})  # num_topics=12: SyntheticConfig's default


def brute_force_run(module, split, doc_texts, mode, size, stride):
    """score(q, d) = max (or first) over the passages of d, each pair scored alone."""
    tok, r = module.pair_tokenizer, module.ranker
    run = {}
    for qi, qid in enumerate(split.qids):
        for d in sorted({int(split.unit_doc[u]) for q, u in split.pairs if q == qi}):
            ps = split_passages(doc_texts[d], size, stride)[: 1 if mode == "first" else None]
            with torch.no_grad():
                s = [
                    float(r.score(tok.pairs([split.qtexts[qi]], [p]))[0])
                    if r.kind == "cross"
                    else float(
                        r.score_pairs(r.encode_queries(tok.queries([split.qtexts[qi]])), r.encode_docs(tok.docs([p])))[
                            0
                        ]
                    )
                    for p in ps
                ]
            run.setdefault(qid, {})[split.doc_ids[d]] = max(s)
    return run


# Lightning's test loop plus a brute-force reference, four times: 2 s alone, 25-50 s inside the suite on the loaded
# 2-core machine (OpenMP threads spin-waiting in the tiny linears once earlier tests have run)
@pytest.mark.slow
@pytest.mark.parametrize("name,mode", [("bert_cat", "max"), ("bert_cat", "first"), ("dgre", "max"), ("colbert", "max")])
def test_firstp_maxp_through_the_evaluation_path(tiny_bert_nodropout, tmp_path, name, mode):
    module = RankingModule(
        {"name": name, "backbone": tiny_bert_nodropout, "query_max_len": 8, "doc_max_len": 16}, {}
    ).eval()
    cfg = data_cfg(passage_words=8, passage_stride=5, doc_score=mode, cache_dir=str(tmp_path))
    dm = RankingDataModule(cfg, module.pair_tokenizer, seed=0)
    dm.setup()
    split = dm.eval_splits["test"]
    doc_texts = [dm.dataset.docs[d] for d in split.doc_ids]  # no rotation: the normalised text is the text
    assert len(split.dtexts) > len(split.doc_ids) or mode == "first"
    if module.ranker.kind == "bi":
        module._eval_queries = module.encode_query_texts(split.qtexts)
    with torch.no_grad():
        for batch in dm.eval_dataloader("test"):
            scores = (
                module.score_chunk(module._eval_queries, batch) if "pair_d" in batch else module.ranker.score(batch)
            )
            module.runs["test"].update(batch["qidx"], batch["didx"], scores.float())
    got = module.runs["test"].to_run(split.qids, split.doc_ids)
    want = brute_force_run(module, split, [" ".join(t.split()) for t in doc_texts], mode, 8, 5)
    assert set(got) == set(want) and all(set(got[q]) == set(want[q]) for q in want)
    for q in want:
        for d in want[q]:
            assert got[q][d] == pytest.approx(want[q][d], abs=1e-5)


# ------------------------------------------------------------------------------------------------ training


def test_training_passages_are_seeded_per_epoch_and_cover_the_document(tmp_path):
    from datamodules.sources import load_dataset

    cfg = data_cfg(cache_dir=str(tmp_path))
    ds = load_dataset(cfg, 0)
    triples = [(q, sorted(ds.docs)[0], sorted(ds.docs)[1]) for q in list(ds.split("train").queries)[:2]]
    queries = ds.split("train").queries
    rnd = TripletDataset(ds, triples, queries, rotate=False, seed=3, window=(6, 3), train_passage="random")
    first = TripletDataset(ds, triples, queries, rotate=False, seed=3, window=(6, 3), train_passage="first")
    doc = " ".join(ds.docs[triples[0][1]].split())
    passages = split_passages(doc, 6, 3)
    seen = {rnd[(epoch, 0)][1] for epoch in range(60)}
    assert seen == set(passages)  # every passage of the relevant document serves as a positive over the epochs
    for epoch in range(5):
        q, pos, neg, _ = rnd[(epoch, 0)]
        key = f"0:{triples[0][1]}"
        assert pos == passages[passage_index(3, epoch, key, len(passages))]
        assert (
            rnd[(epoch, 0)] == TripletDataset(ds, triples, queries, False, 3, (6, 3), "random")[(epoch, 0)]
        )  # reproducible
        assert first[(epoch, 0)][1] == passages[0]
    assert TripletDataset(ds, triples, queries, False, 3)[(0, 0)][1] == doc  # no window: the whole document


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"passage_words": 0}, "data.passage_words"),
        ({"passage_words": 10, "passage_stride": 11}, "data.passage_stride"),
        ({"passage_stride": 5}, "data.passage_stride"),
        ({"passage_words": 10, "doc_score": "sum"}, "data.doc_score"),
        ({"passage_words": 10, "train_passage": "all"}, "data.train_passage"),
        # without windows they would be silently unused
        ({"doc_score": "first"}, "data.doc_score.*is 'first' but data.passage_words is null"),
        ({"train_passage": "first"}, "data.train_passage.*is 'first' but data.passage_words is null"),
    ],
)
def test_bad_passage_settings_are_input_errors(kw, key):
    with pytest.raises(InputError, match=key.replace("data.", r"data\.")):
        DataConfig(**kw)
