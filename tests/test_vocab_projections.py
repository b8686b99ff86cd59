"""Vocabulary projections (analyses/vocab/projections.py, analysis.py): each statistic on a hand-checked example,
Eq. 3 against a float64 NumPy reference (ColBERT's max over tokens), the re-ranking scores against the ranker's own
score_all, and `python evaluate.py analysis=vocab_projections` end to end on a tiny random BERT."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import fake_checkpoint, run_script

from analyses.vocab.projections import (
    PairStats,
    amnesia_row,
    amnesia_summary,
    coverage,
    expansion,
    expansion_tokens,
    is_content,
    project,
    rank_in,
    ranks_of,
    token_mrr,
    top_tokens,
)


def test_ranks_and_top_tokens():
    logp = torch.tensor([0.1, 0.5, 0.3, -1.0, 0.4])
    assert ranks_of(logp, [1, 4, 2, 0, 3]) == {1: 1, 4: 2, 2: 3, 0: 4, 3: 5}
    assert top_tokens(logp, 3) == [1, 4, 2]
    assert rank_in(np.array([0.2, 0.9, 0.2, 0.5]), 0) == 3 and rank_in(np.array([0.2, 0.9, 0.2, 0.5]), 1) == 1


def pairs():
    # q1 = {1, 2, 3}, p1 = {2, 3, 4}: shared {2, 3}; q2 = {5, 6}, p2 = {5, 6, 7}: shared {5, 6}
    a = PairStats(
        "a",
        {1, 2, 3},
        {2, 3, 4},
        rank_q={1: 4, 2: 1, 3: 7, 4: 9},
        rank_p={1: 50, 2: 3, 3: 30, 4: 2},
        top_q=[2, 9, 4, 8, 1, 3],
        content={2, 3, 4, 9},
    )
    b = PairStats(
        "b",
        {5, 6},
        {5, 6, 7},
        rank_q={5: 2, 6: 100, 7: 3},
        rank_p={5: 1, 6: 12, 7: 40},
        top_q=[11, 5, 7],
        content={5, 6},
    )  # 7 is a stopword here: never an expansion token
    return [a, b]


def test_coverage_by_hand():
    cov = coverage(pairs(), [1, 5, 10, 50, 100])
    # shared ranks in Q: 1, 7, 2, 100; in P: 3, 30, 1, 12
    assert cov[1] == {"Q": 1 / 4, "P": 1 / 4, "shared_tokens": 4}
    assert (cov[5]["Q"], cov[5]["P"]) == (2 / 4, 2 / 4)
    assert (cov[10]["Q"], cov[10]["P"]) == (3 / 4, 2 / 4)
    assert (cov[50]["Q"], cov[50]["P"]) == (3 / 4, 1.0)
    assert (cov[100]["Q"], cov[100]["P"]) == (1.0, 1.0)


def test_token_mrr_by_hand():
    m = token_mrr(pairs())
    assert m["shared"]["mrr"] == pytest.approx((1 / 3 + 1 / 30 + 1 / 1 + 1 / 12) / 4) and m["shared"]["tokens"] == 4
    assert m["passage_only"]["mrr"] == pytest.approx((1 / 2 + 1 / 40) / 2)  # token 4 of p1, token 7 of p2
    assert m["query_only"]["mrr"] == pytest.approx(1 / 50) and m["query_only"]["tokens"] == 1


def test_expansion_by_hand():
    a, b = pairs()
    assert expansion_tokens(a, 3) == [4] and expansion_tokens(a, 1) == [] and expansion_tokens(b, 3) == []
    e = expansion([a, b], [1, 3, 6])
    assert e["queries_with_expansion"] == {1: 0.0, 3: 0.5, 6: 0.5}
    # top-5 of Q: a -> [2, 9, 4, 8, 1] holds one expansion token (4; 9 is not in p1), b -> [11, 5, 7] none
    assert e["top5_expansion_share"] == pytest.approx(1 / 8)
    assert (
        is_content("michael")
        and is_content("##ba")
        and not is_content("the")
        and not is_content("?")
        and not is_content("##,")
    )


def test_amnesia_by_hand():
    a, b = pairs()
    ra = amnesia_row(a, ranker_rank=2)  # shared content {2, 3}: P ranks 3, 30; Q ranks 1, 7
    assert ra == {
        "qid": "a",
        "tokens": 2,
        "ranker_rank": 2,
        "retrieved": True,
        "max_rank_P": 30,
        "median_rank_P": 16.5,
        "max_rank_Q": 7,
        "median_rank_Q": 4.0,
    }
    rb = amnesia_row(b, ranker_rank=9)
    assert rb["retrieved"] is False and rb["max_rank_P"] == 12 and rb["max_rank_Q"] == 100
    c = PairStats("c", {1}, {1}, {1: 5}, {1: 5}, [], content=set())
    assert amnesia_row(c, 1) is None  # no shared content token
    rows = [ra, rb, {**rb, "qid": "x", "max_rank_P": 40}]
    s = amnesia_summary(rows)
    assert s["retrieved"]["queries"] == 1 and s["missed"]["queries"] == 2
    assert s["missed"]["median_max_rank_P"] == 26.0 and s["retrieved"]["median_max_rank_P"] == 30.0
    from scipy.stats import mannwhitneyu

    assert s["mann_whitney_p_missed_greater"]["max_rank_P"] == pytest.approx(
        mannwhitneyu([12, 40], [30], alternative="greater").pvalue
    )


def test_projection_matches_float64_reference():
    from analyses.vocab.mlm_head import MLMHead

    g = torch.Generator().manual_seed(0)
    emb = torch.randn(50, 8, generator=g)
    head = MLMHead(emb)
    torch.nn.init.normal_(head.dense.weight, generator=g)
    torch.nn.init.normal_(head.bias, generator=g)
    W, c = head.dense.weight.detach().double().numpy(), head.dense.bias.detach().double().numpy()
    from scipy.special import erf

    def ref(h):  # Eq. 1 in float64: LayerNorm(GELU(W h + c)) . v_i + b_i, log-softmax
        x = h @ W.T + c
        x = 0.5 * x * (1 + erf(x / np.sqrt(2)))
        x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
        z = x @ emb.double().numpy().T + head.bias.detach().double().numpy()
        return z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)

    h = torch.randn(3, 8, generator=g)
    assert np.allclose(project(head, h).numpy(), ref(h.double().numpy()), atol=1e-4)
    tokens = torch.randn(2, 4, 8, generator=g)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    got = project(head, tokens, mask).numpy()
    for i in range(2):  # ColBERT: max over the real tokens of each token's log-probabilities
        expect = ref(tokens[i][mask[i]].double().numpy()).max(0)
        assert np.allclose(got[i], expect, atol=1e-4)


@pytest.mark.parametrize("name", ["repbert", "bert_dot", "colbert"])
def test_candidate_scores_are_the_rankers(name, tiny_bert_nodropout):
    from analyses.vocab.analysis import candidate_scores, encode
    from lightning_modules.module import RankingModule

    m = RankingModule({"name": name, "backbone": tiny_bert_nodropout}, {}).eval()
    r, tok = m.ranker, m.ranker.tokenizer
    qs, ps = (
        ["where is the cat", "symptoms of shingles"],
        ["the cat sat on the mat", "shingles rash", "dogs and cats bark loudly"],
    )
    q = encode(r, tok(qs)["input_ids"], "query", 1, tok.pad_token_id)
    d = encode(r, tok(ps)["input_ids"], "doc", 2, tok.pad_token_id)
    pt = m.pair_tokenizer
    with torch.no_grad():
        ref = r.score_all(r.encode_queries(pt.queries(qs)), r.encode_docs(pt.docs(ps))).double().numpy()
    for k in range(2):
        assert np.allclose(candidate_scores(r, q, k, d, [2, 0, 1]), ref[k, [2, 0, 1]], atol=1e-5)


def head_and_repbert(tmp_path, backbone):
    """(an MLM head file for `backbone` as fit_mlm_head writes it, untrained; a RepBERT checkpoint moved off it)."""
    from analyses.vocab.mlm_head import MLMHead, backbone_embeddings, save_head

    emb, _ = backbone_embeddings(backbone)
    return save_head(MLMHead(emb), tmp_path / "head.pt", backbone, {}), fake_checkpoint(
        tmp_path / "rb.ckpt", backbone, "repbert"
    )


@pytest.mark.slow
def test_evaluate_command_end_to_end(tmp_path, tiny_bert_nodropout):
    head, ckpt = head_and_repbert(tmp_path, tiny_bert_nodropout)
    common = [
        "analysis=vocab_projections",
        "logger=none",
        "data.num_test_queries=12",
        "data.candidate_depth=15",
        f"data.cache_dir={tmp_path / 'c'}",
        f"analysis.mlm_head={head}",
        "analysis.table_pairs=3",
    ]
    out = tmp_path / "o"
    run_script("evaluate.py", *common, f"ckpt={ckpt}", f"output_dir={out}")
    res = json.loads((out / "vocab_projections.json").read_text())
    assert sorted(res["models"]) == ["backbone", "trained"] and res["settings"]["pairs"] == 12
    for name in ("coverage", "expansion", "amnesia"):
        assert (out / f"vocab_projections_{name}.png").stat().st_size > 1000
    for r in res["models"].values():
        assert len(r["table1"]) == 3 and len(r["table1"][0]["top_Q"].split()) == 20
        cov = [r["coverage"][k]["Q"] for k in sorted(r["coverage"], key=int)]
        assert cov == sorted(cov)  # coverage can only grow with k
        a = r["amnesia"]
        assert (
            a["retrieved"]["queries"] + a["missed"]["queries"]
            == a["queries"]
            == len(a["rows"])
            <= a["bm25_top_queries"]
        )
    assert res["models"]["trained"]["coverage"] != res["models"]["backbone"]["coverage"]
    bad = run_script(
        "evaluate.py",
        *common,
        "model=repbert",
        f"model.backbone={tiny_bert_nodropout}",
        "analysis.mlm_head=null",
        f"output_dir={tmp_path / 'x'}",
        check=False,
    )
    assert bad.returncode == 2 and "fit_mlm_head" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, (
        bad.stderr[-800:]
    )
    from analyses.registry import run_analysis
    from core.errors import InputError
    from pipeline.config import compose

    for args, needle in [
        (["model=bert_cat", f"model.backbone={tiny_bert_nodropout}"], "model.name"),
        (["model=colbert", "model.compress_dim=8", f"model.backbone={tiny_bert_nodropout}"], "model.compress_dim"),
        (["analysis.k_values=[0]", f"ckpt={ckpt}"], "analysis.k_values"),
    ]:
        with pytest.raises(InputError, match=needle):
            run_analysis(compose([*common, *args, f"output_dir={tmp_path / 'x'}"]), True)
    assert not (tmp_path / "x").exists()
