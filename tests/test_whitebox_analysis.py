"""The white-box analysis on a ColBERT ranker (tiny random BERT): Eq. 1 from the stored token vectors is the ranker's
own score, removing a word's rows equals the ranker's score with those query tokens masked out, encoding once in
length-sorted batches changes nothing, the spectral sample reads the right vectors; `python evaluate.py
analysis=whitebox` for a checkpoint with its backbone, the JSON consistent with its per-query values (both tau_AP
variants, their Pearson r against IDF scipy's on the listed words, in every output), and one-line errors that write
nothing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import fake_checkpoint, run_script

from analyses.whitebox.analysis import JSON_NAME
from analyses.whitebox.collect import (
    analyse_query,
    encode_texts,
    query_maxsim,
    spectral_by_subword,
)
from analyses.whitebox.words import query_words
from metrics.spectral import sample_rows, spectral_ratio
from metrics.tau_ap import break_ties, tau_ap_a, tau_ap_b

QUERIES = ["where is the cat sitting", "symptoms of shingles", "who wrote the book of the cat"]
PASSAGES = [
    "the cat sat on the mat near the door",
    "shingles is a viral infection with a painful rash",
    "a book about a cat, written by a famous author",
    "dogs and cats",
    "the symptoms include pain and itching",
    "the cat sat on the mat near the door",
]  # a duplicate passage: ties in every ranking


@pytest.fixture(scope="module")
def colbert(tiny_bert_nodropout):
    from lightning_modules.module import RankingModule

    m = RankingModule({"name": "colbert", "backbone": tiny_bert_nodropout}, {})
    return m.eval()


def encoded(module):
    tok = module.ranker.tokenizer
    q_ids, q_words = query_words(tok, QUERIES, module.model_cfg.query_max_len)
    d_ids = tok(PASSAGES, truncation=True, max_length=module.model_cfg.doc_max_len)["input_ids"]
    return (
        encode_texts(module.ranker, q_ids, "query", batch_size=2),
        q_words,
        encode_texts(module.ranker, d_ids, "doc", batch_size=4),
    )


@torch.inference_mode()
@pytest.mark.slow
def test_eq1_is_the_rankers_score_and_removal_masks_query_rows(colbert):
    queries, q_words, docs = encoded(colbert)
    r, pt = colbert.ranker, colbert.pair_tokenizer
    qb, db = pt.queries(QUERIES), pt.docs(PASSAGES)
    q_enc = r.encode_queries(qb)
    reference = r.score_all(q_enc, r.encode_docs(db))  # [Q, P]
    for k in range(len(QUERIES)):
        ms = query_maxsim(queries, k, docs, list(range(len(PASSAGES))))
        assert torch.allclose(ms.score, reference[k], atol=1e-5)
        for w in q_words[k]:
            masked = type(q_enc)(q_enc.tokens.clone(), q_enc.mask.clone())
            masked.mask[k, w.positions] = False  # the word's rows out of Eq. 1's sum, other tokens as encoded
            ref = r.score_all(masked, r.encode_docs(db))[k]
            assert torch.allclose(ms.without(w.positions), ref, atol=1e-5)


@torch.inference_mode()
def test_length_sorted_batches_change_nothing(colbert):
    _, _, docs = encoded(colbert)
    tok = colbert.ranker.tokenizer
    for k, text in enumerate(PASSAGES):
        ids = tok([text], truncation=True, max_length=colbert.model_cfg.doc_max_len)["input_ids"]
        alone = encode_texts(colbert.ranker, ids, "doc", batch_size=1)
        v, i = docs.tokens(k), docs.token_ids(k)
        assert i.tolist() == ids[0] and torch.allclose(v, alone.vecs, atol=1e-5)
        assert torch.allclose(v.norm(dim=-1), torch.ones(len(v)), atol=1e-5)  # the unit vectors Eq. 1 compares
    batch = docs.padded([3, 0])
    assert (
        batch.mask.sum(1).tolist() == [len(docs.token_ids(3)), len(docs.token_ids(0))]
        and (batch.tokens[~batch.mask] == 0).all()
    )


def test_query_analysis_against_direct_computation(colbert):
    queries, q_words, docs = encoded(colbert)
    k = 2  # "who wrote the book of the cat": 'the' twice, removed together
    ms = query_maxsim(queries, k, docs, list(range(len(PASSAGES))))
    res = analyse_query(ms, q_words[k])
    c = ms.c_star.double().numpy()
    s = c.sum(0)
    the = [p for w in q_words[k] if w.key == "the" for p in w.positions]
    assert len(the) == 2 and list(res.tau) == ["a", "b"]
    assert list(res.tau["a"]) == list(res.tau["b"]) == ["who", "wrote", "the", "book", "of", "cat"]
    assert res.tau["b"]["the"] == pytest.approx(tau_ap_b(s, s - c[the].sum(0)))
    # the duplicate passage ties in the original ranking: tau_AP,b takes it, tau_AP,a breaks it by candidate order
    assert s[0] == s[5]
    assert res.tau["a"]["the"] == pytest.approx(tau_ap_a(break_ties(s), s - c[the].sum(0)))
    for _key, pos, _tid, diff in res.differences:
        exact = ms.exact[pos].numpy()
        expected = c[pos][exact].mean() - c[pos][~exact].mean() if 0 < exact.sum() < len(exact) else float("nan")
        assert (math.isnan(diff) and math.isnan(expected)) or diff == pytest.approx(expected)


def test_spectral_sample_reads_the_subwords_vectors(colbert):
    _, _, docs = encoded(colbert)
    tok = colbert.ranker.tokenizer
    the, cat = tok.convert_tokens_to_ids(["the", "cat"])
    got = spectral_by_subword(docs, [the, cat, 99999], cap=5, min_occurrences=2, equal=3, seed=11)
    assert 99999 not in got
    flat = docs.ids.numpy()
    for t in (the, cat):
        where = np.flatnonzero(flat == t)  # occurrences in passage order
        pick = where[sample_rows(len(where), 5, 11, t)]
        assert got[t].occurrences == len(where) and got[t].used == min(5, len(where))
        assert got[t].ratio == pytest.approx(spectral_ratio(docs.vecs[pick].double().numpy()))
        assert got[t].ratio_equal == pytest.approx(spectral_ratio(docs.vecs[pick[:3]].double().numpy()))


# ---- the analysis entry ---------------------------------------------------------------------------------------
def run_inprocess(*args):
    from analyses.registry import run_analysis
    from pipeline.cli import model_from_cli
    from pipeline.config import compose

    return run_analysis(compose(list(args)), model_from_cli(list(args)))


COMMON = ["analysis=whitebox", "logger=none", "data.num_test_queries=12", "data.candidate_depth=15"]


TAU_AP_KEYS = ("tau_ap_a", "tau_ap_b")


def check_tau_ap_outputs(res: dict) -> None:
    """One model's JSON: each variant's word rows are the means of its per-query values, and its Pearson r against
    IDF (with n) is scipy's on the word rows it lists."""
    from scipy.stats import pearsonr

    for key in TAU_AP_KEYS:
        per_word: dict[str, list[float]] = {}
        for q in res["queries"]:
            for w in q["words"]:
                if w[key] is not None:
                    per_word.setdefault(w["word"], []).append(w[key])
        rows = {w["word"]: w for w in res["words"]}
        assert per_word and set(per_word) == {w for w, r in rows.items() if r[key] is not None}
        for word, vals in per_word.items():
            assert rows[word][key] == pytest.approx(np.mean(vals))
        idf, tau = np.array([(w["idf"], w[key]) for w in res["words"] if w[key] is not None]).T
        c = res["correlations"][key]
        assert c["n"] == len(idf) >= 3
        assert c["pearson_r"] == pytest.approx(pearsonr(idf, tau).statistic, abs=1e-12)
        assert c["p_value"] == pytest.approx(pearsonr(idf, tau).pvalue, rel=1e-9)
    assert "term_importance" not in res["correlations"] and "tau_ap" not in res["words"][0]


def test_both_tau_ap_variants_in_every_output(tmp_path, tiny_bert_nodropout, monkeypatch, capsys):
    """Term importance alone, one untrained model: the JSON (on disk), the logged scalars and tables, the printed
    summary and the figure carry tau_AP,a and tau_AP,b."""
    import analyses.whitebox.analysis as wb

    logged = {}
    monkeypatch.setattr(wb, "log_analysis", lambda cfg, name, **kw: logged.update(kw))
    out = tmp_path / "o"
    run_inprocess(
        "analysis=whitebox",
        "logger=none",
        "data.num_test_queries=6",
        "data.candidate_depth=8",
        "analysis.statistics=[term_importance]",
        "model=colbert",
        f"model.backbone={tiny_bert_nodropout}",
        f"data.cache_dir={tmp_path / 'c'}",
        f"output_dir={out}",
    )
    on_disk = json.loads((out / JSON_NAME).read_text())
    assert "tau_ap" not in on_disk["settings"] and on_disk["paper_pearson_r"]["tau_ap_a"] == -0.4
    assert (
        "tau_AP,a" in on_disk["definition"]["term_importance"]
        and "tau_AP,b" in on_disk["definition"]["term_importance"]
    )
    res = on_disk["models"]["untrained"]
    assert list(res["correlations"]) == list(TAU_AP_KEYS)
    check_tau_ap_outputs(res)
    # the two variants differ on these rankings (ties from the tiny model, and b is symmetric)
    assert any(w["tau_ap_a"] != pytest.approx(w["tau_ap_b"]) for w in res["words"])
    for key in TAU_AP_KEYS:
        assert logged["scalars"][f"whitebox/untrained/{key}/pearson_r"] == res["correlations"][key]["pearson_r"]
        assert logged["scalars"][f"whitebox/untrained/{key}/n"] == res["correlations"][key]["n"]
        assert f"{key}_std" in logged["tables"]["whitebox/untrained/words"][0]
        assert all(f"{key}_undefined" in w for w in res["words"])
    assert list(logged["images"]) == ["whitebox/term_importance"]
    assert (out / "whitebox_term_importance.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "tau_AP,a vs IDF" in printed and "tau_AP,b vs IDF" in printed


@pytest.mark.slow
def test_checkpoint_with_backbone_and_the_untrained_run(tmp_path, tiny_bert_nodropout):
    ckpt = fake_checkpoint(tmp_path / "ft.ckpt", tiny_bert_nodropout)
    cache = f"data.cache_dir={tmp_path / 'c'}"
    both = run_inprocess(*COMMON, cache, f"ckpt={ckpt}", "analysis.with_backbone=true", f"output_dir={tmp_path / 'a'}")
    plain = run_inprocess(
        *COMMON, cache, "model=colbert", f"model.backbone={tiny_bert_nodropout}", f"output_dir={tmp_path / 'b'}"
    )
    assert list(both["models"]) == ["fine-tuned", "backbone"] and list(plain["models"]) == ["untrained"]
    ft, bb, un = both["models"]["fine-tuned"], both["models"]["backbone"], plain["models"]["untrained"]
    assert bb["words"] == un["words"] and bb["subwords"] == un["subwords"]  # the same backbone, same queries
    assert ft["words"] != bb["words"]
    on_disk = json.loads((tmp_path / "a" / JSON_NAME).read_text())
    assert on_disk["settings"]["queries"] == 12 and on_disk["settings"]["candidate_depth"] == 15
    for name in ("whitebox_term_importance.png", "whitebox_delta_es.png", "whitebox_spectral.png"):
        assert (tmp_path / "a" / name).stat().st_size > 1000
    # word rows are the per-query values aggregated; r is the Pearson r of those rows, for both tau_AP variants
    for res in (ft, bb):
        check_tau_ap_outputs(res)
        subs = {s["subword"]: s for s in res["subwords"]}
        for w in res["words"]:
            if w["delta_es"] is not None:  # Delta_ES(w) = sum of its subwords' Delta_ES(t)
                assert w["delta_es"] == pytest.approx(sum(subs[t]["delta_es"] for t in w["subwords"]))
        assert all(any(ch.isalnum() for ch in w["word"]) for w in res["words"])  # punctuation skipped


@pytest.mark.slow
def test_command_line_and_one_line_errors(tmp_path, tiny_bert):
    out = tmp_path / "o"
    run_script(
        "evaluate.py",
        *COMMON,
        "model=colbert",
        f"model.backbone={tiny_bert}",
        "analysis.statistics=[spectral]",
        "analysis.max_queries=5",
        f"data.cache_dir={tmp_path / 'c'}",
        f"output_dir={out}",
    )
    res = json.loads((out / JSON_NAME).read_text())
    assert res["settings"]["queries"] == 5 and list(res["models"]["untrained"]["correlations"]) == ["spectral"]
    assert (out / "whitebox_spectral.png").exists() and not (out / "whitebox_delta_es.png").exists()
    for args, needle in [
        (["analysis.statistic=[spectral]"], "analysis.statistic"),
        (["analysis.statistics=[tfidf]"], "analysis.statistics"),
        (["analysis.tau_ap=b"], "analysis.tau_ap"),  # removed: both variants are reported
        (["model=repbert", f"model.backbone={tiny_bert}"], "model.name"),
    ]:
        bad = run_script(
            "evaluate.py",
            *COMMON,
            *args,
            f"output_dir={tmp_path / 'x'}",
            f"data.cache_dir={tmp_path / 'c'}",
            check=False,
        )
        assert bad.returncode == 2 and needle in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr[
            -500:
        ]
        assert not (tmp_path / "x").exists()


def test_the_rerankers_sample_of_questions(tmp_path, tiny_bert_nodropout, monkeypatch):
    """`data.max_eval_queries` gives the analyses that rank the re-rankers' questions: the sample of the sorted
    judged test queries by `np.random.default_rng([seed, 2])` (the run seed, or data.eval_sample_seed), whatever
    analysis.seed is; `analysis.max_queries` then samples within it (`default_rng([analysis.seed, 7])`). For
    analysis.split=all, and for an analysis that takes no sample of questions, it is a one-line error before any
    model is loaded or anything is written."""
    import analyses.whitebox.analysis as wb
    from analyses.registry import ANALYSES
    from core.errors import InputError
    from datamodules.sources import data_config, load_dataset
    from pipeline.config import compose

    monkeypatch.setattr("analyses.outputs.log_analysis", lambda *a, **k: None)
    plain = [*COMMON, "model=colbert", f"model.backbone={tiny_bert_nodropout}", f"data.cache_dir={tmp_path / 'c'}"]
    base = [*plain, "analysis.statistics=[term_importance]", "seed=3", "analysis.seed=9"]
    test = load_dataset(data_config(compose(base)), 3).split("test")
    judged = sorted(q for q in test.queries if test.qrels.get(q))
    assert len(judged) == 12
    for extra, draw in ([], 3), (["data.eval_sample_seed=0"], 0):
        res = run_inprocess(*base, *extra, "data.max_eval_queries=5", f"output_dir={tmp_path / str(draw)}")
        want = sorted(judged[i] for i in np.random.default_rng([draw, 2]).permutation(12)[:5])
        assert [q["qid"] for q in res["models"]["untrained"]["queries"]] == want
        assert res["settings"]["queries"] == 5
    fewer = run_inprocess(*base, "data.max_eval_queries=5", "analysis.max_queries=3", f"output_dir={tmp_path / 'f'}")
    pool = sorted(judged[i] for i in np.random.default_rng([3, 2]).permutation(12)[:5])
    want = sorted(pool[i] for i in np.random.default_rng([9, 7]).permutation(5)[:3])
    assert [q["qid"] for q in fewer["models"]["untrained"]["queries"]] == want

    loaded = []
    monkeypatch.setattr(wb, "_models", lambda *a, **k: loaded.append(1))
    for args, needle in [
        ([*base, "analysis.split=all"], "data.max_eval_queries.*analysis.split=all has no such sample"),
        ([*plain, "analysis=ats"], "data.max_eval_queries.*analysis ats takes no sample of a split's questions"),
    ]:
        with pytest.raises(InputError, match=needle):
            run_inprocess(*args, "data.max_eval_queries=5", f"output_dir={tmp_path / 'x'}")
        assert not (tmp_path / "x").exists() and not loaded
    takers = sorted(n for n in ANALYSES.names() if ANALYSES.get(n).schema.takes_eval_sample)
    assert takers == ["lexical_enrichment", "vocab_projections", "whitebox"]
