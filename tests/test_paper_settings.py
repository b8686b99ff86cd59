"""Grids that claim a paper's setting train with the paper's printed settings (issue 34): the pairwise hinge loss, the
learning rate of every parameter group, the batch size, the re-ranking depth chosen on validation (position-bias
paper section 3; DGRe paper section 4.1.4), and the `deviations:` list the table and record print. Every check is
against an independent reference: float64 NumPy formulas, a rule on parameter names, brute-force nDCG@10."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from core.errors import InputError
from datamodules.datamodule import EvalSplit
from grid.engine import check, load_grid, plan, run
from lightning_modules.module import RankingModule
from metrics.rerank_depth import candidate_ranks, choose_depth, truncate
from pipeline.config import compose

QUERIES = ["what is heat transfer", "slab conduction", "boundary layer flow at high speed"]
DOCS = ["heat transfer in slabs", "a study of boundary layers", "flow of air over wings at speed", "conduction"]


# ------------------------------------------------------------------------------------------------ the hinge loss


@pytest.mark.parametrize("name", ["bert_cat", "bert_dot", "tk"])
@pytest.mark.parametrize("margin", [1.0, 0.25])
def test_hinge_loss_equals_a_float64_numpy_formula(tiny_bert, name, margin):
    """optim.loss=hinge (the position-bias paper's "pairwise hinge loss", DGRe's Eq. 25) is the mean over the batch of
    max(0, margin - s(q, p+) + s(q, p-)), each triplet on its own negative; the reference scores each pair on its
    own and takes the hinge in float64."""
    m = RankingModule(
        {"name": name, "backbone": tiny_bert, "query_max_len": 8, "doc_max_len": 16},
        {"loss": "hinge", "margin": margin, "in_batch_negatives": False},
    ).eval()
    m.log = lambda *a, **k: None  # no trainer to log to
    q, pos, neg = QUERIES, DOCS[:3], [DOCS[3], DOCS[0], DOCS[1]]
    tok = m.pair_tokenizer
    with torch.no_grad():
        sp = np.array([m.ranker.score(tok.pairs([a], [b]))[0].item() for a, b in zip(q, pos)], dtype=np.float64)
        sn = np.array([m.ranker.score(tok.pairs([a], [b]))[0].item() for a, b in zip(q, neg)], dtype=np.float64)
        # a margin that puts some triplets inside the hinge and some outside (both branches of the max)
        loss = m.training_step(tok.triplets(q, pos, neg), 0).item()
    want = np.mean(np.maximum(0.0, margin - sp + sn))
    assert loss == pytest.approx(float(want), abs=1e-5)


# ------------------------------------------------------------------------------------------------ learning rates


class _StubTrainer:
    estimated_stepping_batches = 100


def _grid_modules(grid: str, rows: list[str], tiny_bert: str):
    """(row, composed cell config, RankingModule) for the first training cell of each row, on a tiny BERT."""
    spec, extra = load_grid([f"grid={grid}"])
    out = []
    for row in rows:
        cell = next(c for c in plan(spec, extra) if c.row == row and c.kind == "train")
        cfg = compose([*cell.argv, f"model.backbone={tiny_bert}", "model.query_max_len=8", "model.doc_max_len=16"])
        out.append(
            (
                row,
                cfg,
                RankingModule(
                    OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.optim), list(cfg.eval.measures)
                ),
            )
        )
    return out


# Learning rate by parameter name, as each paper prints it: independent of Ranker.param_groups.
POSITION_BIAS = {
    "bert_cat": lambda n: 7e-6,
    "bert_dot": lambda n: 7e-6,  # "Adam with a learning rate of 7*10^-6"
    "tk": lambda n: 1e-3 if n.startswith("ranker.scoring.") else 1e-4,
}  # "10^-3 for the kernel-pooling weights"
DGRE = {
    "bert_cat": lambda n: 1e-5,
    "bert_maxp": lambda n: 1e-5,  # "The learning rate of BERT fine-tuning ... is 1e-5"
    "dgre": lambda n: 1e-5 if n.startswith("ranker.encoder.") else 5e-5,
}  # "... and DGRe is ... 5e-5"


@pytest.mark.parametrize(
    "grid,rule",
    [("squad_position_bias", POSITION_BIAS), ("dgre_cranfield_literal", DGRE), ("dgre_cranfield_literal_20ep", DGRE)],
)
def test_grid_cells_train_every_parameter_at_the_papers_learning_rate(tiny_bert, grid, rule):
    """Each parameter of a tiny model built from the grid's cell config lands in an optimiser group at the paper's
    rate, and the first Adam step moves it by that rate: with gradient 1 Adam's first step is lr x 1/(1 + eps), plus
    AdamW's decoupled decay lr x wd x p on weight matrices (wd 0 in the position-bias grid: Adam)."""
    for row, cfg, m in _grid_modules(grid, list(rule), tiny_bert):
        m = m.double()  # float64 weights: a step of 1e-5 / 11 on a weight of 1 is exact enough to compare
        m._trainer = _StubTrainer()
        conf = m.configure_optimizers()
        opt = conf["optimizer"]
        factor = 1.0 / (cfg.optim.warmup_steps + 1) if cfg.optim.warmup_steps else 1.0  # the schedule at step 0
        group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
        named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
        assert len(group_of) == len(named) == sum(len(g["params"]) for g in opt.param_groups), row  # each exactly once
        before = {}
        for n, p in named:
            want = rule[row](n)
            assert group_of[id(p)]["initial_lr"] == pytest.approx(want, rel=1e-12), (row, n)
            assert group_of[id(p)]["lr"] == pytest.approx(want * factor, rel=1e-12), (row, n)
            p.grad = torch.ones_like(p)
            before[n] = p.detach().clone()
        opt.step()
        for n, p in named:
            lr = rule[row](n) * factor
            wd = group_of[id(p)]["weight_decay"]
            assert wd == (cfg.optim.weight_decay if p.ndim >= 2 else 0.0), (row, n)
            moved = (before[n] - p.detach()).numpy()
            want = lr * (1.0 / (1.0 + 1e-8) + wd * before[n].numpy())
            np.testing.assert_allclose(moved, want, rtol=1e-6, atol=lr * 1e-6, err_msg=f"{row} {n}")


def test_position_bias_grid_trains_with_the_papers_printed_settings():
    """Every cell of squad_position_bias: pairwise hinge on each triplet's own negative, batch 32, Adam (no weight
    decay, no warm-up, a constant rate, no clipping), the BM25 top 100 with the depth chosen on validation among
    depths up to 100, the starting model no checkpoint candidate."""
    spec, extra = load_grid(["grid=squad_position_bias"])
    cells = plan(spec, extra)
    assert len(cells) == 42
    # BM25, the candidates' order, is a reference row: one untrained run per seed, on both test sets
    assert sorted(c.label for c in cells if c.row == "bm25") == sorted(
        f"bm25/biased/seed{s}{e}" for s in (1, 2, 3) for e in ("", "/eval-rotated")
    )
    for cell in cells:
        if cell.row == "bm25":
            continue
        cfg = compose(list(cell.argv))
        o = cfg.optim
        assert (o.loss, o.margin, o.in_batch_negatives, o.weight_decay, o.warmup_steps, o.schedule) == (
            "hinge",
            1.0,
            False,
            0.0,
            0,
            "constant",
        ), cell.label
        assert (
            cfg.data.batch_size * cfg.trainer.accumulate_grad_batches == 32 and cfg.trainer.gradient_clip_val is None
        ), cell.label
        assert cfg.data.candidate_depth == max(cfg.eval.rerank_depths) == 100 and not cfg.eval.start_candidate, (
            cell.label
        )
        if cfg.model.name == "tk":
            assert (cfg.model.contextualization_lr, cfg.model.kernel_lr) == (1e-4, 1e-3), cell.label
        else:
            assert o.lr == 7e-6, cell.label
    text = " ".join(spec.deviations)
    for named in ("MiniLM", "DistilBERT", "margin", "120 optimiser steps", "200 sampled questions", "10, 20, ..., 100"):
        assert named in text, named
    assert "rerank_depth" in spec.measures


def test_dgre_literal_grid_trains_with_the_papers_printed_settings():
    """dgre_cranfield_literal: batch 32, BERT at 1e-5, DGRe's layers at 5e-5, lambda 1e-2, Eq. 25; what the CPU cannot
    follow (the 20 epochs) is a named deviation."""
    spec, extra = load_grid(["grid=dgre_cranfield_literal"])
    cells = [(cell, compose(list(cell.argv))) for cell in plan(spec, extra)]  # composed once: seconds a cell
    for cell, cfg in cells:
        if cell.row == "bm25":
            continue
        assert (cfg.data.batch_size, cfg.optim.lr, cfg.optim.loss, cfg.optim.margin) == (32, 1e-5, "hinge", 1.0), (
            cell.label
        )
        if cfg.model.name == "dgre":
            assert (cfg.model.layers_lr, cfg.model.aux_lambda) == (5e-5, 0.01), cell.label
    assert any("20 epochs" in d for d in spec.deviations)
    # the GPU grid: the same cells with the printed 20 epochs in place of the 60 steps, and no such deviation left
    literal = {cell.label: cfg for cell, cfg in cells}
    spec20, extra20 = load_grid(["grid=dgre_cranfield_literal_20ep"])
    epochs = {c.label: compose(list(c.argv)) for c in plan(spec20, extra20)}
    assert epochs.keys() == literal.keys()
    for label, cfg in epochs.items():
        assert (cfg.trainer.max_epochs, cfg.trainer.max_steps, literal[label].trainer.max_steps) == (20, -1, 60), label
        for group in ("model", "optim", "data"):
            assert OmegaConf.to_container(cfg[group]) == OmegaConf.to_container(literal[label][group]), (label, group)
    assert not any("epochs" in d for d in spec20.deviations)
    assert [d for d in spec20.deviations if not d.startswith("Precision")] == [
        d for d in spec.deviations if not d.startswith(("Precision", "Training length"))
    ]
    spec, _ = load_grid(["grid=squad_repbert_heads"])
    assert any("in-batch negatives" in d for d in spec.deviations)


# ------------------------------------------------------------------------------------------------ re-ranking depth


def ndcg10(ranked: list[str], qrels: dict[str, int]) -> float:
    """trec_eval's ndcg_cut_10 of one query: gain = grade, discount 1 / log2(rank + 1), the ideal over the qrels."""
    dcg = sum(qrels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:10]
    return dcg / sum(g / math.log2(i + 2) for i, g in enumerate(ideal))


def brute_force(scores: dict[str, dict[str, float]], order: dict[str, list[str]], qrels, depth: int) -> float:
    """Mean nDCG@10 over the judged queries when each query re-ranks its first `depth` candidates by score."""
    vals = []
    for q, judged in qrels.items():
        top = order[q][:depth]
        ranked = sorted(top, key=lambda d: -scores[q][d])
        vals.append(ndcg10(ranked, judged))
    return float(np.mean(vals))


def tiny_case(seed: int, n_q: int = 4, n_c: int = 14):
    """A split of n_q queries with n_c BM25 candidates each (a shared pool of documents), graded qrels, and distinct
    scores for every pair: (EvalSplit, {qid: {doc: score}}, {qid: candidates in BM25 order})."""
    rng = np.random.default_rng(seed)
    doc_ids = [f"d{i:02d}" for i in range(20)]
    qids = [f"q{i}" for i in range(n_q)]
    order = {q: [doc_ids[j] for j in rng.permutation(len(doc_ids))[:n_c]] for q in qids}
    qrels = {q: {d: int(rng.integers(1, 3)) for d in rng.choice(order[q], size=3, replace=False)} for q in qids}
    qrels[qids[0]]["d19" if "d19" not in order[qids[0]] else "d18"] = 1  # a relevant document BM25 missed
    didx = {d: i for i, d in enumerate(doc_ids)}
    pairs = np.array([(qi, didx[d]) for qi, q in enumerate(qids) for d in order[q]], dtype=np.int64)
    scores = {q: {d: float(s) for d, s in zip(order[q], rng.permutation(n_c) + rng.random(n_c) * 0.5)} for q in qids}
    es = EvalSplit(qids, doc_ids, pairs, qrels, [f"text {q}" for q in qids], [f"text {d}" for d in doc_ids])
    return es, scores, order


def fill(run, es: EvalSplit, scores) -> None:
    qidx, didx, s = zip(*((qi, di, scores[es.qids[qi]][es.doc_ids[di]]) for qi, di in es.pairs.tolist()))
    run.update(torch.tensor(qidx), torch.tensor(didx), torch.tensor(s, dtype=torch.float64))


DEPTHS = (2, 4, 6, 10, 14)


def _recorder(logged: dict):
    """A stand-in for LightningModule.log that keeps each logged value in `logged`."""
    return lambda k, v, **kw: logged.__setitem__(k, v)


def test_depth_selection_picks_the_best_validation_ndcg_and_applies_it_to_test(tiny_bert):
    """RankingModule with eval.rerank_depths: each validation keeps the depth with the best brute-force nDCG@10
    (the smallest on a tie) and reports that depth's measures; the test re-ranks only the first d candidates of each
    query, d the chosen depth, and metrics.json's rerank_depth says which; a test with no chosen depth takes the
    largest, with a warning."""
    chosen_any = set()
    for seed in range(12):
        val, val_scores, val_order = tiny_case(seed)
        test, test_scores, test_order = tiny_case(100 + seed, n_q=5)
        m = RankingModule({"name": "bert_dot", "backbone": tiny_bert}, {})
        m._trainer = SimpleNamespace(datamodule=SimpleNamespace(eval_splits={"val": val, "test": test}))
        logged = {}
        m.log = _recorder(logged)
        m.rerank_depths = DEPTHS

        fill(m.runs["val"], val, val_scores)
        m._eval_epoch_end("val")
        by_depth = {d: brute_force(val_scores, val_order, val.qrels, d) for d in DEPTHS}
        best = min(d for d in DEPTHS if by_depth[d] >= max(by_depth.values()) - 1e-12)
        assert m.rerank_depth == best, (seed, by_depth)
        assert logged["val/rerank_depth"] == best
        assert logged["val/ndcg_cut_10"] == pytest.approx(by_depth[best], abs=1e-9)
        chosen_any.add(best)

        fill(m.runs["test"], test, test_scores)
        m._eval_epoch_end("test")
        res = m.results["test"]
        assert res["metrics"]["rerank_depth"] == best
        assert res["metrics"]["ndcg_cut_10"] == pytest.approx(
            brute_force(test_scores, test_order, test.qrels, best), abs=1e-9
        )
        assert all(set(docs) == set(test_order[q][:best]) for q, docs in res["run"].items())
    assert len(chosen_any) >= 2, chosen_any  # the cases do not all pick the same depth

    m.rerank_depth = None  # e.g. a checkpoint from before eval.rerank_depths
    fill(m.runs["test"], test, test_scores)
    with pytest.warns(UserWarning, match="testing at the largest, 14"):
        m._eval_epoch_end("test")
    assert m.results["test"]["metrics"]["rerank_depth"] == 14


def test_choose_depth_breaks_ties_towards_the_smaller_depth_and_ranks_passages_by_their_document():
    # one query, candidates a b c in BM25 order, only `a` relevant and ranked first: every depth gives nDCG@10 1
    run, qrels = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}, {"q": {"a": 1}}
    ranks = {"q": {"a": 0, "b": 1, "c": 2}}
    assert choose_depth(run, qrels, ranks, [3, 1, 2]) == (1, {1: 1.0, 2: 1.0, 3: 1.0})
    assert truncate(run, ranks, 2) == {"q": {"a": 3.0, "b": 2.0}}
    # passages (units 0-4) of documents x y z: a document's rank is its first passage's
    pairs = np.array([[0, 3], [0, 4], [0, 0], [0, 1], [0, 2]])
    unit_doc = np.array([0, 0, 1, 2, 2])  # units 0-1 are x, 2 y, 3-4 z
    assert candidate_ranks(["q"], ["x", "y", "z"], pairs, unit_doc) == {"q": {"z": 0, "x": 1, "y": 2}}


SMALL = [
    "data=synthetic",
    "data.data_seed=3",
    "data.num_docs=120",
    "data.num_train_queries=30",
    "data.num_val_queries=8",
    "data.num_test_queries=12",
    "data.max_train_triples=16",
    "data.candidate_depth=20",
    "logger=none",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "data.batch_size=4",
    "eval.probe_queries=8",
    "eval.probe_docs=16",
    "eval.before_training=false",
    "eval.start_candidate=false",
    "eval.isotropy_paper=false",
    "eval.ats_passages=0",
    "eval.rerank_depths=[3,5,10,20]",
    "optim.loss=hinge",  # each triplet's own negative (train.py refuses the in-batch keys beside it)
]


@pytest.mark.slow
def test_train_and_evaluate_keep_the_depth_chosen_at_the_tested_checkpoints_validation(tmp_path, tiny_bert):
    """train.py: validation.json has val/rerank_depth per validation, the best checkpoint holds the depth of its
    validation, metrics.json the depth applied to the test (the best step's), run.trec at most that many documents a
    query; evaluate.py on the best checkpoint (a grid's evaluation cell) tests at the same depth to the same numbers."""
    from pipeline.cli import main
    from pipeline.run import evaluate, train

    out = tmp_path / "run"
    assert (
        main(
            [
                *SMALL,
                "model=colbert",
                f"model.backbone={tiny_bert}",
                f"data.cache_dir={tmp_path / 'c'}",
                f"output_dir={out}",
            ],
            lambda cfg, _: train(cfg),
        )
        == 0
    )
    curve = json.loads((out / "validation.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    chosen = {v["step"]: v["val/rerank_depth"] for v in curve["validations"]}
    assert set(chosen) == {2, 4} and set(chosen.values()) <= {3, 5, 10, 20}
    assert metrics["rerank_depth"] == chosen[metrics["best_step"]]
    best = next((out / "checkpoints").glob("best-*.ckpt"))
    assert torch.load(best, weights_only=False)["rerank_depth"] == metrics["rerank_depth"]
    per_query: dict[str, int] = {}
    for line in (out / "run.trec").read_text().splitlines():
        per_query[line.split()[0]] = per_query.get(line.split()[0], 0) + 1
    assert max(per_query.values()) <= metrics["rerank_depth"]

    again = tmp_path / "eval"
    assert main([*SMALL, f"ckpt={best}", f"data.cache_dir={tmp_path / 'c'}", f"output_dir={again}"], evaluate) == 0
    theirs = json.loads((again / "metrics.json").read_text())
    assert theirs["rerank_depth"] == metrics["rerank_depth"]
    assert theirs["ndcg_cut_10"] == pytest.approx(metrics["ndcg_cut_10"], abs=1e-6)


@pytest.mark.parametrize(
    "argv,key",
    [
        (["eval.rerank_depth=[10]"], "eval.rerank_depth"),  # misspelt: unknown key
        (["eval.rerank_depths=[10,200]", "data.candidate_depth=100"], "eval.rerank_depths"),
        (["eval.rerank_depths=[0,10]"], "eval.rerank_depths"),
        (["eval.rerank_depths=[]"], "eval.rerank_depths"),
        (["eval.rerank_depths=20"], "eval.rerank_depths"),
    ],
)
def test_rerank_depths_is_a_checked_key(argv, key):
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        compose(argv)


# ------------------------------------------------------------------------------------------------ deviations


def _record_grid(tmp_path, **extra) -> Path:
    grid = {
        "name": "dev",
        "baseline": "bm25",
        "rows": {"bm25": ["model=bm25"], "bm25_b": ["model=bm25", "model.b=0.5"]},
        "train_data": ["synthetic"],
        "seeds": [1],
        "measures": ["ndcg_cut_10"],
        "output_root": str(tmp_path / "grids"),
        **extra,
    }
    gfile = tmp_path / "dev.yaml"
    gfile.write_text(json.dumps(grid))
    return gfile


def test_a_grid_prints_its_deviations_in_the_table_and_the_record(tmp_path, monkeypatch):
    import grid.record as record

    monkeypatch.setattr(record, "RESULTS_DIR", tmp_path / "results")
    devs = [
        "Backbone: all-MiniLM-L6-v2; the paper: DistilBERT.",
        "Training length: 120 steps; the paper: early stopping.",
    ]
    gfile = _record_grid(tmp_path, deviations=devs)
    spec, _ = load_grid([f"grid={gfile}"])
    assert spec.deviations == devs
    for c in plan(spec):
        c.dir.mkdir(parents=True)
        (c.dir / "metrics.json").write_text(json.dumps({"ndcg_cut_10": 0.5}))
        (c.dir / "per_query.json").write_text(json.dumps({"q1": {"ndcg_cut_10": 0.5}}))
    report = run([f"grid={gfile}", "action=table", "record=true"], out=io.StringIO())
    text = next((tmp_path / "results").glob("*-dev.md")).read_text()
    for where in (report.table, text, (tmp_path / "grids" / "dev" / "table.md").read_text()):
        assert "Deviations from the paper's setting (grid key `deviations`):" in where
        assert all(f"- {d}\n" in where for d in devs)
    assert json.loads((tmp_path / "grids" / "dev" / "results.json").read_text())["deviations"] == devs
    plain = _record_grid(tmp_path)  # no deviations: no such paragraph
    assert "Deviations" not in run([f"grid={plain}", "action=table"], out=io.StringIO()).table


@pytest.mark.parametrize(
    "extra,msg",
    [
        ({"deviation": ["x"]}, "unknown grid key 'deviation'"),
        ({"deviations": "one string, not a list"}, "deviations"),
        ({"deviations": [""]}, "deviations"),
        ({"deviations": [{"a": 1}]}, "deviations"),
    ],
)
def test_grid_keys_stay_checked(tmp_path, extra, msg):
    with pytest.raises(InputError, match=msg):
        load_grid([f"grid={_record_grid(tmp_path, **extra)}"])


@pytest.mark.parametrize("grid,cells", [("squad_position_bias", 42), ("dgre_cranfield_literal", 35)])
def test_the_two_grids_dry_run(grid, cells):
    """`python experiments.py grid=NAME --dry-run`: every cell composed and checked, the plan listed."""
    spec, extra = load_grid([f"grid={grid}"])
    planned = plan(spec, extra)
    check(spec, planned)
    assert len(planned) == cells
