"""Lexical enrichment (analyses/vocab/enrichment.py, lexical_enrichment.py): Eq. 5 and the whitening against float64
NumPy formulas, Eq. 4's batched optimisation reaching CE <= 0.1 on a tiny head with each item's result independent
of its batch, and `analysis=lexical_enrichment` end to end (lambda = 0 is the ranker's own evaluation)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_vocab_projections import head_and_repbert

from analyses.vocab.enrichment import (
    enrich,
    lexical_vectors,
    single_token_embeddings,
    whiten,
)
from analyses.vocab.mlm_head import MLMHead


def test_eq5_against_numpy():
    rng = np.random.default_rng(0)
    S = rng.normal(size=(6, 4))
    vocab = [10, 11, 12, 13, 14, 15]
    table = {t: i for i, t in enumerate(vocab)}
    idf = {t: float(rng.uniform(0.5, 3)) for t in vocab}
    texts = [[10, 12, 12, 15], [11], []]
    e = rng.normal(size=(3, 4))
    lex = lexical_vectors(texts, table, torch.tensor(S), idf).numpy()
    for k, toks in enumerate(texts):
        ref = sum(idf[t] * S[table[t]] for t in toks) / len(toks) if toks else np.zeros(4)
        assert np.allclose(lex[k], ref)
        plain = sum(S[table[t]] for t in toks) / len(toks) if toks else np.zeros(4)
        assert np.allclose(lexical_vectors([toks], table, torch.tensor(S), None).numpy()[0], plain)
    lam = 0.7
    got = enrich(torch.tensor(e), torch.tensor(lex), lam).numpy()
    for k in range(2):
        assert np.allclose(got[k], e[k] + lam * lex[k] / np.linalg.norm(lex[k]))
    assert np.allclose(got[2], e[2])  # a text without tokens is left as it is
    assert np.allclose(enrich(torch.tensor(e), torch.tensor(lex), lam, normalize=False).numpy(), e + lam * lex)


def test_whitening_against_numpy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 5)) @ rng.normal(size=(5, 5)) + 3.0
    w, mu, W = whiten(torch.tensor(x))
    w = w.numpy()
    assert np.allclose(mu.numpy(), x.mean(0))
    assert np.allclose(np.cov(w.T, bias=True), np.eye(5), atol=1e-8) and np.allclose(w.mean(0), 0, atol=1e-10)
    lam, U = np.linalg.eigh(np.cov(x.T, bias=True))
    assert np.allclose(np.abs(w), np.abs((x - x.mean(0)) @ U / np.sqrt(lam)), atol=1e-6)  # up to eigenvector signs


def tiny_head(vocab=40, d=48, seed=0):
    """d > vocab: linearly independent v_i, so every item can top the distribution (with a tied decoder an item
    inside the convex hull of the others never can)."""
    g = torch.Generator().manual_seed(seed)
    head = MLMHead(torch.randn(vocab, d, generator=g))
    with torch.no_grad():
        torch.nn.init.normal_(head.dense.weight, std=0.5, generator=g)
        head.norm.weight.fill_(2.0)  # logits large enough for a peaked distribution
    return head.eval()


@pytest.mark.slow
def test_single_token_embeddings_reach_the_threshold_and_are_batch_independent():
    head = tiny_head()
    ids = list(range(40))
    init = head.embeddings[ids]
    st = single_token_embeddings(head, ids, init, lr=0.01, threshold=0.1, max_steps=3000, batch_size=16)
    assert bool(st.reached(0.1).all()) and int(st.steps.max()) <= 3000
    with torch.no_grad():  # an independent check of what was kept: CE of each kept vector
        ce = F.cross_entropy(head(st.vectors), torch.tensor(ids), reduction="none")
    assert torch.allclose(ce, st.cross_entropy, atol=1e-5) and bool((ce <= 0.1).all())
    assert int((st.steps > 0).sum()) > 0  # v_t alone did not decode to t for some items (footnote 3)
    one = single_token_embeddings(head, ids[:5], init[:5], lr=0.01, threshold=0.1, max_steps=3000, batch_size=1)
    assert torch.allclose(one.vectors, st.vectors[:5], atol=1e-5) and torch.equal(one.steps, st.steps[:5])
    # the head itself is never trained
    assert all(not p.requires_grad for p in head.parameters())


def test_unreachable_items_keep_their_last_vector():
    head = tiny_head()
    with torch.no_grad():
        head.norm.weight.fill_(0.01)  # logits squashed: CE 0.1 cannot be reached
    st = single_token_embeddings(head, [3, 4], head.embeddings[[3, 4]], max_steps=5)
    assert not bool(st.reached(0.1).any()) and st.steps.tolist() == [6, 6] and torch.isfinite(st.cross_entropy).all()


@pytest.mark.slow
def test_analysis_end_to_end(tmp_path, tiny_bert_nodropout):
    from analyses.registry import run_analysis
    from datamodules.sources import data_config, load_dataset
    from lightning_modules.module import RankingModule
    from metrics.ir import evaluate_run
    from pipeline.config import compose

    head, ckpt = head_and_repbert(tmp_path, tiny_bert_nodropout)
    args = [
        "analysis=lexical_enrichment",
        "logger=none",
        "data.num_val_queries=10",
        "data.num_test_queries=12",
        "data.candidate_depth=10",
        f"data.cache_dir={tmp_path / 'c'}",
        f"analysis.mlm_head={head}",
        "analysis.st_max_steps=3",
        "analysis.ablations=[no_idf,static]",
        f"ckpt={ckpt}",
        f"output_dir={tmp_path / 'o'}",
    ]
    res = run_analysis(compose(args), False)
    on_disk = json.loads((tmp_path / "o" / "lexical_enrichment.json").read_text())
    assert (
        sorted(on_disk["results"]) == ["le", "no_idf", "static"]
        and (tmp_path / "o" / "lexical_enrichment_lambda.png").exists()
    )
    for r in res["results"].values():
        val = {float(k): v for k, v in r["validation"].items()}
        assert r["lambda"] == max(val, key=lambda x: (val[x], -x))
    # lambda = 0 is the ranker's own re-ranking, scored here independently with score_all
    cfg = compose(args)
    ds = load_dataset(data_config(cfg), int(cfg.seed))
    from datamodules.bm25 import bm25_candidates

    m = RankingModule({"name": "repbert", "backbone": tiny_bert_nodropout}, {})
    m.load_state_dict(torch.load(ckpt, weights_only=False)["state_dict"])
    m.eval()
    split = ds.split("test")
    cands = bm25_candidates(ds.docs, split.queries, 10, str(tmp_path / "c"), f"{ds.name}-test")
    run = {}
    with torch.no_grad():
        for q, c in cands.items():
            if len(c) < 2:
                continue
            pt = m.pair_tokenizer
            s = m.ranker.score_all(
                m.ranker.encode_queries(pt.queries([split.queries[q]])),
                m.ranker.encode_docs(pt.docs([ds.docs[d] for d in c])),
            )[0]
            run[q] = {d: float(v) for d, v in zip(c, s)}
    means, _ = evaluate_run(run, {q: split.qrels[q] for q in run}, ["ndcg_cut_10"])
    assert res["results"]["le"]["test"]["without_le"] == pytest.approx(means["ndcg_cut_10"], abs=1e-6)
    assert res["single_tokens"]["optimised_now"] == res["settings"]["vocabulary_items"] > 0
    again = run_analysis(
        compose([*args[:-1], f"output_dir={tmp_path / 'o2'}", "analysis.ablations=[]", "analysis.lam=0.5"]), False
    )
    assert (
        again["single_tokens"]["optimised_now"] == 0 and again["results"]["le"]["lambda"] == 0.5
    )  # s_t from the cache


def test_val_and_test_questions_are_the_rerankers_sample(tmp_path):
    """Under `data.max_eval_queries` lambda is chosen and tested on the re-rankers' questions of each split: the sorted
    judged queries sampled by `np.random.default_rng([run seed, 2])`; unset, every judged query."""
    from analyses.vocab.lexical_enrichment import _split_queries
    from datamodules.sources import data_config, load_dataset
    from pipeline.config import compose

    args = ["data.num_val_queries=10", "data.num_test_queries=12", f"data.cache_dir={tmp_path}", "seed=4"]
    dc = data_config(compose([*args, "data.max_eval_queries=5"]))
    ds = load_dataset(dc, 4)
    for name, n in ("val", 10), ("test", 12):
        split = ds.split(name)
        judged = sorted(q for q in split.queries if split.qrels.get(q))
        assert len(judged) == n
        qids, _, cands, qrels = _split_queries(ds, dc, name, 10, 4, f"analysis.{name}_split")
        assert qids == sorted(judged[i] for i in np.random.default_rng([4, 2]).permutation(n)[:5])
        assert set(qrels) == set(qids) and all(len(cands[q]) >= 2 for q in qids)
        every, *_ = _split_queries(ds, data_config(compose(args)), name, 10, 4, f"analysis.{name}_split")
        assert every == judged
