"""ATS / MATS (position-bias paper Eq. 8-9) against a brute-force double loop and a loop over Eq. 9's printed sum
(both `eval.mats` switches), and on encoders with and without positional information."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import finetune_steps, quick_eval

from metrics.ats import MATS_MODES, AverageTermSimilarity, average_term_similarity, mats_from_curve


def brute_force_ats(vectors, terms, positions, passages):
    """Eq. 8 literally: for every term, every pair of its occurrences in different passages, in float64."""
    x = np.asarray(vectors, dtype=np.float64)
    sums: dict[tuple[int, int], list[float]] = {}
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            if terms[i] != terms[j] or passages[i] == passages[j]:
                continue
            c = x[i] @ x[j] / (np.linalg.norm(x[i]) * np.linalg.norm(x[j]))
            sums.setdefault((int(terms[i]), abs(int(positions[i]) - int(positions[j]))), []).append(c)
    max_d = max(d for _, d in sums)
    ats = np.full(max_d + 1, np.nan)
    for d in range(max_d + 1):
        per_term = [np.mean(v) for (t, dd), v in sums.items() if dd == d]
        if per_term:
            ats[d] = np.mean(per_term)
    return ats, reference_mats(ats, "paper")[0]


def reference_mats(ats, mode: str) -> tuple[float, float]:
    """Eq. 9 from the paper's text, by a loop in float64:

        MATS = 1 / (max(da) - 1) * sum_{i=1}^{max(da)} ATS(0) - ATS(i)

    max(da) = the largest delta whose ATS has a value. A delta in 1..max(da) without a value (no pair) is skipped
    and not counted, so "max(da)" in the factor is the count of the terms summed. `paper`: divide the sum by that
    count - 1, as printed; `mean`: by the count. The std is that of the summed terms (1/count)."""
    ats = [float(a) for a in ats]
    max_da = max(i for i in range(len(ats)) if not math.isnan(ats[i]))
    total, count, terms = 0.0, 0, []
    for i in range(1, max_da + 1):
        if math.isnan(ats[i]):
            continue
        total += ats[0] - ats[i]
        count += 1
        terms.append(ats[0] - ats[i])
    mean = total / count
    std = math.sqrt(sum((t - mean) ** 2 for t in terms) / count)
    if mode == "paper":
        return (total / (count - 1) if count > 1 else math.nan), std
    return mean, std


def hand_made_set(seed=0, passages=12, length=15, vocab=6, dim=5):
    rng = np.random.default_rng(seed)
    terms, positions, pids = [], [], []
    for p in range(passages):
        n = rng.integers(length // 2, length + 1)
        terms += rng.integers(0, vocab, n).tolist()
        positions += list(range(n))
        pids += [p] * n
    vectors = rng.normal(size=(len(terms), dim))
    return vectors, np.array(terms), np.array(positions), np.array(pids)


def test_ats_equals_brute_force_double_loop():
    vectors, terms, positions, passages = hand_made_set()
    ref, ref_mats = brute_force_ats(vectors, terms, positions, passages)
    got = average_term_similarity(
        torch.tensor(vectors, dtype=torch.float64), terms, positions, passages, max_occurrences=None
    )
    assert len(got.ats) >= len(ref)
    np.testing.assert_allclose(got.ats[: len(ref)], ref, atol=1e-6, equal_nan=True)
    assert np.isnan(got.ats[len(ref) :]).all()
    assert abs(got.mats - ref_mats) < 1e-6 and got.mats_mode == "paper"
    mean = average_term_similarity(
        torch.tensor(vectors, dtype=torch.float64), terms, positions, passages, max_occurrences=None, mats="mean"
    )
    np.testing.assert_array_equal(mean.ats, got.ats)
    assert abs(mean.mats - reference_mats(ref, "mean")[0]) < 1e-6 and mean.mats < got.mats
    assert mean.mats_std == pytest.approx(got.mats_std, abs=1e-15)  # the spread of the drops, whichever MATS
    assert got.mats_std == pytest.approx(reference_mats(ref, "paper")[1], abs=1e-6)
    # a cap above every term's count changes nothing (each term in one bucket, padded)
    capped = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=10_000)
    np.testing.assert_allclose(capped.ats, got.ats, atol=1e-12, equal_nan=True)


def test_pairs_inside_one_passage_are_not_counted():
    # term 0 twice in passage 0 (delta 3) and once in passage 1 at position 0
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    r = average_term_similarity(v, [0, 0, 0], [0, 3, 0], [0, 0, 1], max_occurrences=None)
    assert r.pairs.tolist() == [1, 0, 0, 1]  # (0@0, 0@0') at delta 0 and (3, 0') at delta 3; not (0, 3) in passage 0
    assert r.ats[0] == pytest.approx(1 / math.sqrt(2))
    assert r.ats[3] == pytest.approx(1 / math.sqrt(2))


def test_input_order_and_rank_split_do_not_change_the_sampled_result():
    vectors, terms, positions, passages = hand_made_set(seed=1, passages=40)
    a = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=8, seed=3)
    perm = np.random.default_rng(0).permutation(len(terms))
    b = average_term_similarity(
        torch.tensor(vectors[perm]), terms[perm], positions[perm], passages[perm], max_occurrences=8, seed=3
    )
    np.testing.assert_array_equal(a.ats, b.ats)
    assert a.occurrences == 6 * 8  # six terms, each capped at 8
    # the metric class, fed in two "shards", equals the function on the union
    m = AverageTermSimilarity(max_occurrences=8, seed=3)
    half = len(terms) // 2
    for sl in (slice(0, half), slice(half, None)):
        m.update(
            torch.tensor(vectors[sl]), torch.tensor(terms[sl]), torch.tensor(positions[sl]), torch.tensor(passages[sl])
        )
    np.testing.assert_allclose(m.compute().ats, a.ats, atol=1e-6, equal_nan=True)  # float32 states


def test_the_cap_is_a_seeded_sample():
    vectors, terms, positions, passages = hand_made_set(seed=2, passages=60)
    one = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=5, seed=0)
    again = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=5, seed=0)
    other = average_term_similarity(torch.tensor(vectors), terms, positions, passages, max_occurrences=5, seed=1)
    np.testing.assert_array_equal(one.ats, again.ats)
    assert not np.array_equal(np.nan_to_num(one.ats), np.nan_to_num(other.ats))


def sinusoids(positions: np.ndarray, dim: int) -> np.ndarray:
    """Vaswani et al.'s positional encodings (as TK adds them)."""
    i = np.arange(dim // 2)
    angle = positions[:, None] / (10000 ** (2 * i / dim))[None, :]
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)


def test_mats_of_bag_of_words_is_zero_and_positive_with_positions():
    """A bag-of-words encoder (term vector + the mean of its passage's term vectors) has no position: MATS ~ 0.
    Adding sinusoidal position embeddings makes same-term vectors at nearby positions more alike: MATS > 0."""
    rng = np.random.default_rng(7)
    dim, vocab = 64, 50
    emb = rng.normal(size=(vocab, dim))
    vecs, terms, positions, passages = [], [], [], []
    for p in range(300):
        n = 40
        t = rng.zipf(1.3, n) % vocab
        context = emb[t].mean(0)
        vecs.append(emb[t] + context)
        terms += t.tolist()
        positions += list(range(n))
        passages += [p] * n
    bow = np.concatenate(vecs)
    terms, positions, passages = np.array(terms), np.array(positions), np.array(passages)
    scale = np.linalg.norm(emb, axis=1).mean() / math.sqrt(dim / 2)  # sinusoids as long as the term vectors
    with_pos = bow + scale * sinusoids(positions, dim)
    free = average_term_similarity(torch.tensor(bow), terms, positions, passages, max_occurrences=200, seed=0)
    biased = average_term_similarity(torch.tensor(with_pos), terms, positions, passages, max_occurrences=200, seed=0)
    assert abs(free.mats) < 0.01
    assert biased.mats > 0.1
    assert biased.ats[0] > biased.ats[1] > biased.ats[10]  # similarity falls with the positional delta


def test_mats_from_curve_equals_the_printed_equation_9_for_both_switches():
    """The printed Eq. 9 (`paper`, default) and the mean of the drops (`mean`) against `reference_mats`, on curves
    without and with deltas lacking a value, and a hand-computed example."""
    # hand-computed: drops 0.1, 0.2, 0.3 (delta 3 has no pair): paper 0.6 / (3 - 1), mean 0.6 / 3
    curve = np.array([1.0, 0.9, 0.8, np.nan, 0.7, np.nan])
    assert mats_from_curve(curve) == pytest.approx((0.3, math.sqrt(2 / 300)))
    assert mats_from_curve(curve, "mean") == pytest.approx((0.2, math.sqrt(2 / 300)))
    # no gaps: exactly 1/(max(da) - 1) * sum_{i=1}^{max(da)}, max(da) = 4
    full = np.array([0.9, 0.85, 0.8, 0.8, 0.7])
    assert mats_from_curve(full)[0] == pytest.approx((0.05 + 0.1 + 0.1 + 0.2) / 3, abs=1e-15)
    rng = np.random.default_rng(3)
    for trial in range(200):
        ats = 1 - np.cumsum(rng.uniform(-0.01, 0.05, size=int(rng.integers(2, 60))))
        if trial % 2:
            ats[1:][rng.uniform(size=len(ats) - 1) < 0.3] = np.nan
        if not np.isfinite(ats[1:]).any():
            continue
        for mode in MATS_MODES:
            want = reference_mats(ats, mode)
            got = mats_from_curve(ats, mode)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, equal_nan=True)
        k = int(np.isfinite(ats[1:]).sum())
        if k > 1:
            assert mats_from_curve(ats)[0] == pytest.approx(mats_from_curve(ats, "mean")[0] * k / (k - 1), rel=1e-12)
    # one delta: the printed 1/(max(da) - 1) is 1/0
    assert math.isnan(mats_from_curve(np.array([1.0, 0.5]))[0])
    assert mats_from_curve(np.array([1.0, 0.5]), "mean") == (0.5, 0.0)


def test_mats_from_curve_and_bad_input():
    assert mats_from_curve(np.array([1.0, 0.5, np.nan, 0.0])) == pytest.approx((1.5, 0.25))
    assert mats_from_curve(np.array([1.0, 0.5, np.nan, 0.0]), "mean") == pytest.approx((0.75, 0.25))
    assert math.isnan(mats_from_curve(np.array([np.nan, 0.5]))[0])
    assert all(math.isnan(v) for v in mats_from_curve(np.array([1.0, np.nan, np.nan])))
    with pytest.raises(ValueError, match="MATS mode"):
        mats_from_curve(np.array([1.0, 0.5, 0.2]), "printed")
    with pytest.raises(ValueError, match="MATS mode"):
        AverageTermSimilarity(mats="avg")


def test_eval_mats_reaches_the_callback_and_the_metric(tmp_path):
    """`eval.mats` (default `paper`) is validated at composition and handed to ATSCallback, whose metric computes
    with it; the metric class gives what the function gives."""
    from callbacks.ats import ATSCallback
    from core.errors import InputError
    from pipeline.config import compose
    from pipeline.stages import build_trainer

    assert compose([]).eval.mats == "paper"
    for mode in MATS_MODES:
        cfg = compose(
            [
                f"eval.mats={mode}",
                "logger=none",
                "trainer.accelerator=cpu",
                "trainer.enable_progress_bar=false",
                f"output_dir={tmp_path}",
            ]
        )
        (cb,) = [c for c in build_trainer(cfg, False, False).callbacks if isinstance(c, ATSCallback)]
        assert cb.mats == mode
    with pytest.raises(InputError, match=r"eval\.mats"):
        compose(["eval.mats=printed"])
    vectors, terms, positions, passages = hand_made_set(seed=5)
    for mode in MATS_MODES:
        m = AverageTermSimilarity(max_occurrences=None, mats=mode)
        m.update(torch.tensor(vectors), torch.tensor(terms), torch.tensor(positions), torch.tensor(passages))
        want = average_term_similarity(
            torch.tensor(vectors, dtype=torch.float32), terms, positions, passages, None, mats=mode
        )
        assert m.compute().mats == pytest.approx(want.mats, abs=1e-12) and want.mats_mode == mode
    with pytest.raises(ValueError, match="max_occurrences"):
        average_term_similarity(torch.zeros(2, 2), [0, 0], [0, 1], [0, 1], max_occurrences=1)
    with pytest.raises(ValueError, match=r"vectors \[N, d\]"):
        average_term_similarity(torch.zeros(3, 2), [0, 0], [0, 1], [0, 1])


# ------------------------------------------------------------------------------ term vectors from every ranker

PASSAGES = [
    "dense retrieval encodes passages into vectors and compares the vectors",
    "the vectors of a passage",
    "retrieval",
]


def _ranker(name: str, tiny_bert: str):
    from models.rankers import RANKERS, build_ranker

    schema = RANKERS.get(name, "model.name").schema
    extra = {"heads": 2, "head_dim": 8, "ff_dim": 24} if name == "tk" else {}
    torch.manual_seed(0)
    return build_ranker(schema(backbone=tiny_bert, query_max_len=12, doc_max_len=20, **extra)).eval()


def _pair_tokenizer(ranker):
    from datamodules.tokenization import PairTokenizer

    return PairTokenizer(ranker.tokenizer, ranker.kind, ranker.cfg.query_max_len, ranker.cfg.doc_max_len)


@pytest.mark.parametrize("name", ["tk", "colbert", "repbert", "bert_dot"])
def test_bi_encoder_passage_terms_are_its_token_representations(name, tiny_bert):
    """Each passage alone (no padding): the vectors at its non-special tokens, positions 0..n-1, and its ids."""
    from models.rankers.terms import passage_terms

    ranker = _ranker(name, tiny_bert)
    got = passage_terms(ranker, _pair_tokenizer(ranker), PASSAGES, batch_size=2, first_passage=10)
    special = set(ranker.tokenizer.all_special_ids)
    start = 0
    for p, text in enumerate(PASSAGES):
        ids = ranker.tokenizer(text, truncation=True, max_length=20)["input_ids"]
        keep = [i for i, t in enumerate(ids) if t not in special]
        with torch.no_grad():
            enc = ranker.token_representations(
                torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), side="doc"
            )
        n = len(keep)
        sl = slice(start, start + n)
        assert got.terms[sl].tolist() == [ids[i] for i in keep]
        assert got.positions[sl].tolist() == list(range(n))
        assert got.passages[sl].tolist() == [10 + p] * n
        torch.testing.assert_close(got.vectors[sl], enc.tokens[0, keep].float(), atol=1e-5, rtol=1e-5)
        start += n
    assert start == len(got.terms)


def test_bert_cat_passage_terms_are_the_passage_side_of_the_pair(tiny_bert):
    from models.rankers.terms import passage_terms

    ranker = _ranker("bert_cat", tiny_bert)
    tok = _pair_tokenizer(ranker)
    queries = ["what are vectors", "retrieval"]
    got = passage_terms(ranker, tok, PASSAGES, queries=queries, batch_size=2)
    special = set(ranker.tokenizer.all_special_ids)
    start = 0
    for p, text in enumerate(PASSAGES):
        pair = tok.pairs([queries[p % 2]], [text])
        ids, types = pair["input_ids"][0].tolist(), pair["token_type_ids"][0].tolist()
        keep = [i for i, (t, s) in enumerate(zip(ids, types)) if s == 1 and t not in special]
        doc_ids = [t for t in ranker.tokenizer(text)["input_ids"] if t not in special]
        with torch.no_grad():
            hidden = ranker.encoder(**pair).last_hidden_state[0]
        n = len(keep)
        assert got.terms[start : start + n].tolist() == doc_ids  # the passage's own terms, none of the query's
        assert got.positions[start : start + n].tolist() == list(range(n))
        torch.testing.assert_close(got.vectors[start : start + n], hidden[keep], atol=1e-5, rtol=1e-5)
        start += n
    assert start == len(got.terms)
    with pytest.raises(ValueError, match="queries"):
        passage_terms(ranker, tok, PASSAGES)


# ------------------------------------------------------------------------------ callback and DDP

FAST = quick_eval("eval.ats_passages=24", "eval.ats_max_occurrences=20", logger="csv")


@pytest.mark.slow
def test_callback_logs_mats_at_validation_and_test_equal_to_a_direct_computation(tmp_path, tiny_bert):
    """TK trained 2 steps: val/mats is logged at the validation, metrics.json holds the test split's MATS, and it
    equals ATS computed here from the checkpoint on the same seeded passages."""
    import csv
    import json

    from callbacks.ats import ats_sample
    from lightning_modules.loading import load_module
    from models.rankers.terms import passage_terms
    from pipeline.config import compose
    from pipeline.run import load_data, train

    model = ["model=tk", f"model.backbone={tiny_bert}", "model.heads=2", "model.head_dim=8", "model.ff_dim=24"]
    out = tmp_path / "run"
    cfg = compose(
        [
            *FAST,
            *model,
            "data.max_train_triples=16",
            *finetune_steps(2),
            f"output_dir={out}",
        ]
    )
    train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    logged = list(csv.DictReader(open(next(out.glob("csv/*/metrics.csv")))))
    assert any(row.get("val/mats") for row in logged)

    best = sorted((out / "checkpoints").glob("best-*.ckpt"))[-1]
    ev = compose([*FAST, f"ckpt={best}"])
    module = load_module(ev, model_from_cli=False)
    split = load_data(ev).eval_splits["test"]
    docs, _ = ats_sample(len(split.dtexts), len(split.qtexts), 24, ev.seed)
    terms = passage_terms(module.ranker, module.pair_tokenizer, [split.dtexts[i] for i in docs])
    ref = average_term_similarity(
        terms.vectors, terms.terms, terms.positions, terms.passages, max_occurrences=20, seed=ev.seed
    )
    assert np.isfinite(ref.mats)
    assert metrics["mats"] == pytest.approx(ref.mats, abs=1e-6)
    assert metrics["ats0"] == pytest.approx(ref.ats[0], abs=1e-6)


def _ats_ddp_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        vectors, terms, positions, passages = hand_made_set(seed=4, passages=30)
        mine = np.isin(passages, np.arange(30)[rank::world])  # each rank encodes its own passages
        m = AverageTermSimilarity(max_occurrences=6, seed=2)
        m.update(
            torch.tensor(vectors[mine], dtype=torch.float32),
            torch.tensor(terms[mine]),
            torch.tensor(positions[mine]),
            torch.tensor(passages[mine]),
        )
        result = m.compute()
        if rank == 0:
            torch.save(torch.tensor(result.ats), out_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_metric_gathers_occurrences_across_ddp_ranks(tmp_path):
    """Two gloo ranks with disjoint passages give the single-process ATS: pairs across ranks count."""
    import torch.multiprocessing as mp

    out = tmp_path / "ats.pt"
    mp.spawn(_ats_ddp_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    vectors, terms, positions, passages = hand_made_set(seed=4, passages=30)
    single = average_term_similarity(
        torch.tensor(vectors, dtype=torch.float32), terms, positions, passages, max_occurrences=6, seed=2
    )
    np.testing.assert_allclose(torch.load(out).numpy(), single.ats, atol=1e-12, equal_nan=True)


# ------------------------------------------------------------------------------ analysis=ats


def _save_checkpoint(path, model: dict, seed: int):
    from lightning_modules.module import RankingModule

    torch.manual_seed(seed)
    module = RankingModule(model, {})
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": {"model": model, "optim": {}}}, path)
    return module


@pytest.mark.slow
def test_analysis_writes_the_curves_of_every_model_equal_to_a_direct_computation(tmp_path, tiny_bert):
    import json

    from datamodules.datamodule import eval_rotation_key, passage_text
    from datamodules.sources import data_config, load_dataset
    from metrics.ats import average_term_similarity as ats_fn
    from models.rankers.terms import passage_terms
    from pipeline.config import compose
    from pipeline.run import evaluate

    tk = {
        "name": "tk",
        "backbone": tiny_bert,
        "heads": 2,
        "head_dim": 8,
        "ff_dim": 24,
        "query_max_len": 16,
        "doc_max_len": 40,
    }
    cat = {"name": "bert_cat", "backbone": tiny_bert, "query_max_len": 16, "doc_max_len": 40}
    tk_module = _save_checkpoint(tmp_path / "tk.ckpt", tk, 0)
    cat_module = _save_checkpoint(tmp_path / "cat.ckpt", cat, 1)
    out = tmp_path / "ats"
    cfg = compose(
        [
            "analysis=ats",
            "logger=none",
            f"ckpt={tmp_path / 'tk.ckpt'}",
            "analysis.label=tk",
            f"analysis.compare.cat={tmp_path / 'cat.ckpt'}",
            "analysis.passages=30",
            "analysis.max_occurrences=12",
            "data.rotate_eval=true",
            "eval.mats=mean",
            f"output_dir={out}",
        ]
    )
    evaluate(cfg, model_from_cli=False)
    saved = json.loads((out / "ats.json").read_text())
    assert (out / "ats.png").stat().st_size > 0 and set(saved["models"]) == {"tk", "cat"}
    assert saved["settings"]["mats"] == "mean" and {m["mats_mode"] for m in saved["models"].values()} == {"mean"}

    dc = data_config(cfg)
    ds = load_dataset(dc, cfg.seed)
    ids = sorted(ds.docs)
    ids = [ids[i] for i in np.sort(np.random.default_rng([cfg.seed, 8]).permutation(len(ids))[:30])]
    texts = [passage_text(ds.docs[d], True, cfg.seed, 0, eval_rotation_key(d)) for d in ids]
    # the analysis draws the passages, then the order of the test queries paired with them (BERT_CAT), from one rng
    rng = np.random.default_rng([cfg.seed, 8])
    rng.permutation(len(ds.docs))
    qids = sorted(ds.split("test").queries)
    queries = [ds.split("test").queries[qids[i]] for i in rng.permutation(len(qids))]
    for label, module in (("tk", tk_module), ("cat", cat_module)):
        terms = passage_terms(module.ranker, module.pair_tokenizer, texts, queries=queries if label == "cat" else None)
        ref = ats_fn(terms.vectors, terms.terms, terms.positions, terms.passages, 12, cfg.seed, mats="mean")
        assert saved["models"][label]["mats"] == pytest.approx(ref.mats, abs=1e-9)
        got = np.array([np.nan if v is None else v for v in saved["models"][label]["ats"]])
        np.testing.assert_allclose(got, ref.ats, atol=1e-9, equal_nan=True)


@pytest.mark.slow
def test_analysis_bad_compare_checkpoint_is_one_line_error(tmp_path):
    from conftest import run_script

    proc = run_script(
        "evaluate.py",
        "analysis=ats",
        "logger=none",
        "model=tk",
        f"analysis.compare.x={tmp_path / 'nope.ckpt'}",
        f"output_dir={tmp_path / 'o'}",
        check=False,
    )
    assert proc.returncode == 2
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "analysis.compare.x" in err[0] and "does not exist" in err[0], proc.stderr[-2000:]
    assert not (tmp_path / "o" / "ats.json").exists()


def test_callback_skips_validations_of_a_frozen_ranker(tiny_bert):
    """The head stage trains a head on a frozen ranker: its term vectors cannot change between validations."""
    from types import SimpleNamespace

    from callbacks.ats import ATSCallback

    ranker = _ranker("colbert", tiny_bert)
    ranker.token_head = torch.nn.Linear(4, 4)  # trainable, but not a term-vector parameter
    cb, calls = ATSCallback(), []
    cb._log = lambda trainer, module, split: calls.append(split)
    trainer, module = SimpleNamespace(sanity_checking=False), SimpleNamespace(ranker=ranker)
    cb.on_validation_epoch_end(trainer, module)
    assert calls == ["val"]
    for n, p in ranker.named_parameters():
        p.requires_grad = n.startswith("token_head.")
    cb.on_validation_epoch_end(trainer, module)
    cb.on_test_epoch_end(trainer, module)
    assert calls == ["val", "test"]
