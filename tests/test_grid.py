"""Grid runner (grid/engine.py, experiments.py) and tables (grid/tables.py): a tiny grid end to end, resumable."""

import dataclasses
import gzip
import io
import json
import math
import shutil
import time
from pathlib import Path

import pytest
from conftest import GRID_SYN as SYN
from conftest import REPO, job_args, run_script
from scipy import stats

from core.errors import InputError
from datamodules.config import TRAINING_ONLY, DataConfig
from grid.engine import Cell, exportable, load_grid, plan, run
from grid.tables import render_markdown, summarize

FAST = [
    "logger=none",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "data.batch_size=8",
    "data.max_train_triples=16",
    "data.candidate_depth=20",
    "eval.probe_queries=8",
    "eval.probe_docs=16",
    "eval.before_training=false",
]
SYN4 = [*SYN[:1], "data.data_seed=4", *SYN[2:]]  # another collection of the same sizes (out of distribution)
SYN_START = [*SYN[:1], "data.data_seed=4", "data.answer_position=start", *SYN[2:]]  # ... with answers at the start
BM25_ROWS = {"bm25": ["model=bm25", "model.depth=20"]}  # nothing to train: a grid of cells in seconds
GRID_KEYS = ("name", "baseline", "untrained", "rows", "train_data", "eval_data", "seeds", "common", "measures", "test")


def tiny_grid(tmp_path: Path, name: str, baseline: str, rows: dict, **keys) -> Path:
    """tmp_path/<name>.yaml, the grid file the end-to-end grid tests share: trained on SYN with FAST settings (cache
    tmp_path/cache), one seed, ndcg_cut_10, cells in process under tmp_path/grids; `keys` add or replace grid keys
    (None leaves one out), written in the order a grid file lists them."""
    grid = {
        "name": name,
        "baseline": baseline,
        "rows": rows,
        "train_data": {"syn": SYN},
        "seeds": [1],
        "common": [*FAST, f"data.cache_dir={tmp_path / 'cache'}"],
        "measures": ["ndcg_cut_10"],
        "launcher": "inprocess",
        "output_root": str(tmp_path / "grids"),
        **keys,
    }
    order = [*GRID_KEYS, *(k for k in grid if k not in GRID_KEYS)]
    gfile = tmp_path / f"{name}.yaml"
    gfile.write_text(json.dumps({k: grid[k] for k in order if grid.get(k) is not None}))  # JSON is YAML
    return gfile


def write_grid(tmp_path, tiny_bert):
    return tiny_grid(
        tmp_path,
        "tiny",
        "colbert",
        # model keys go with the rows: BM25's schema has no backbone (a key it does not know is an error)
        {
            "colbert": ["model=colbert", f"model.backbone={tiny_bert}"],
            "repbert": ["model=repbert", f"model.backbone={tiny_bert}"],
            "bm25": ["model=bm25", "model.depth=20"],
        },
        # syn: the training run's own test; syn_start: evaluate.py on another collection (OOD)
        eval_data={"syn": SYN, "syn_start": SYN_START},
        seeds=[1, 2],
        measures=["ndcg_cut_10", "P_20"],
        test="t_test_one_tailed",
    )


@pytest.mark.slow
def test_tiny_grid_runs_resumes_and_tabulates(tmp_path, tiny_bert):
    gfile = write_grid(tmp_path, tiny_bert)
    log = io.StringIO()
    report = run([f"grid={gfile}"], out=log)
    root = tmp_path / "grids" / "tiny"
    trains = [root / r / "syn" / s for r in ("colbert", "repbert") for s in ("seed1", "seed2")]
    evals = [d / "eval-syn_start" for d in trains]
    assert set(report.status.values()) == {"ran"} and len(report.status) == 12, report.status
    for d in trains + evals:
        assert (d / "metrics.json").is_file() and (d / "per_query.json").is_file()
    assert any((trains[0] / "checkpoints").glob("best-*.ckpt"))
    assert "ckpt: " in (evals[0] / "config.yaml").read_text() and "best-" in (evals[0] / "config.yaml").read_text()

    # results.json: one entry per row x train x eval x seed, with per-query values; CSV alongside
    res = json.loads((root / "results.json").read_text())
    assert len(res["cells"]) == 12 and all(c["status"] == "done" for c in res["cells"])
    # the BM25 row: evaluate.py model=bm25 on each cell's data, nothing trained, same numbers for every seed
    bm = [c for c in res["cells"] if c["row"] == "bm25" and c["eval"] == "syn"]
    assert not list((root / "bm25" / "syn" / "seed1").glob("checkpoints/*")) and bm[0]["metrics"] == bm[1]["metrics"]
    direct = tmp_path / "bm25-direct"
    run_script(
        "evaluate.py",
        "model=bm25",
        "model.depth=20",
        *SYN,
        "logger=none",
        f"data.cache_dir={tmp_path / 'cache'}",
        "seed=1",
        f"output_dir={direct}",
    )
    assert json.loads((direct / "metrics.json").read_text())["ndcg_cut_10"] == bm[0]["metrics"]["ndcg_cut_10"]
    cell = next(c for c in res["cells"] if c["row"] == "repbert" and c["eval"] == "syn" and c["seed"] == 2)
    assert cell["metrics"]["ndcg_cut_10"] == json.loads((trains[3] / "metrics.json").read_text())["ndcg_cut_10"]
    assert len(cell["per_query"]) == 16 and set(next(iter(cell["per_query"].values()))) >= {"ndcg_cut_10", "P_20"}
    csv_lines = (root / "results.csv").read_text().splitlines()
    assert csv_lines[0] == "grid,row,train,eval,replicate,seed,fold,qid,measure,value"
    assert any(",all,ndcg_cut_10," in ln for ln in csv_lines)

    # table: means over seeds and % change against the baseline
    blocks = {(b["train"], b["eval"]): b for b in summarize(res)}
    for ev in ("syn", "syn_start"):
        cells = [c for c in res["cells"] if c["eval"] == ev]
        base = sum(c["metrics"]["ndcg_cut_10"] for c in cells if c["row"] == "colbert") / 2
        mine = sum(c["metrics"]["ndcg_cut_10"] for c in cells if c["row"] == "repbert") / 2
        row = blocks[("syn", ev)]["rows"][1]["measures"]["ndcg_cut_10"]
        assert row["mean"] == pytest.approx(mine) and row["change_pct"] == pytest.approx(100 * (mine - base) / base)
        assert f"{mine:.4f} ({100 * (mine - base) / base:+.1f}%)" in report.table
    table = (root / "table.md").read_text()
    assert table == report.table
    assert "| colbert (baseline) |" in table and "### trained on syn, evaluated on syn_start" in table

    # another baseline (Tables 3-5 of one grid): its own table-<row>.md, table.md untouched
    report = run([f"grid={gfile}", "action=table", "baseline=repbert"], out=io.StringIO())
    assert (root / "table.md").read_text() == table
    other = (root / "table-repbert.md").read_text()
    assert other == report.table and "| repbert (baseline) |" in other and other != table

    # rerun: every cell skipped, nothing rewritten
    mtimes = {d: (d / "metrics.json").stat().st_mtime_ns for d in trains + evals}
    log = io.StringIO()
    report = run([f"grid={gfile}"], out=log)
    assert set(report.status.values()) == {"skipped"}
    assert log.getvalue().count("skipped (metrics.json exists)") == 12
    assert {d: (d / "metrics.json").stat().st_mtime_ns for d in mtimes} == mtimes
    # a logging override does not invalidate finished cells; a setting that changes the numbers stops the run
    # before anything runs, naming a cell and what differs; action=list marks those cells
    log = io.StringIO()
    report = run([f"grid={gfile}", "trainer.log_every_n_steps=5"], out=log)
    assert set(report.status.values()) == {"skipped"} and "differ from" not in log.getvalue()
    with pytest.raises(InputError, match=r"12 started cell\(s\) have other settings.*now \['trainer.max_steps=3'\]"):
        run([f"grid={gfile}", "trainer.max_steps=3"], out=io.StringIO())
    assert {d: (d / "metrics.json").stat().st_mtime_ns for d in mtimes} == mtimes
    listed = run([f"grid={gfile}", "trainer.max_steps=3", "action=list"], out=io.StringIO())
    assert {s.split(":")[0] for s in listed.status.values()} == {"done (other settings"}

    # a cell killed before writing metrics.json (checkpoints there, metrics.json not): only that cell runs again,
    # resumed from its last.ckpt; through experiments.py with the subprocess launcher
    victim = trains[1]
    before = json.loads((victim / "metrics.json").read_text())
    (victim / "metrics.json").unlink()
    proc = run_script("experiments.py", f"grid={gfile}", "launcher=subprocess")
    assert "train colbert/syn/seed2: resumed" in proc.stdout
    assert proc.stdout.count("skipped (metrics.json exists)") == 11
    after = json.loads((victim / "metrics.json").read_text())
    assert after["ndcg_cut_10"] == pytest.approx(before["ndcg_cut_10"], abs=1e-9)
    assert "error:" not in (victim / "train.log").read_text()
    for d, t in mtimes.items():
        if d != victim:
            assert (d / "metrics.json").stat().st_mtime_ns == t, d


def results_fixture(values_a, values_b, replicates=("seed1", "seed2")):
    """results.json-shaped dict: rows base and new, per-query ndcg values per replicate."""
    cells = []
    for row, values in (("base", values_a), ("new", values_b)):
        for rep, per_rep in zip(replicates, values):
            pq = {f"q{i}": {"ndcg_cut_10": v} for i, v in enumerate(per_rep)}
            cells.append(
                {
                    "row": row,
                    "train": "d",
                    "eval": "d",
                    "replicate": rep,
                    "status": "done",
                    "per_query": pq,
                    "metrics": {"ndcg_cut_10": math.fsum(per_rep) / len(per_rep)},
                }
            )
    return {
        "grid": "g",
        "baseline": "base",
        "test": "t_test_one_tailed",
        "paired_by": "query",
        "measures": ["ndcg_cut_10"],
        "rows": ["base", "new"],
        "train_data": ["d"],
        "eval_data": ["d"],
        "replicates": list(replicates),
        "folds": None,
        "cells": cells,
    }


def test_table_significance_uses_per_query_means_over_seeds():
    a = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.2], [0.3, 0.2, 0.1, 0.4, 0.3, 0.2]]
    b = [[0.4, 0.5, 0.3, 0.6, 0.9, 0.5], [0.5, 0.6, 0.4, 0.7, 0.8, 0.4]]
    res = results_fixture(a, b)
    ma = [(x + y) / 2 for x, y in zip(*a)]
    mb = [(x + y) / 2 for x, y in zip(*b)]
    for test, p in (
        ("t_test_one_tailed", stats.ttest_rel(mb, ma, alternative="greater").pvalue),
        ("t_test_two_tailed", stats.ttest_rel(mb, ma).pvalue),
        ("wilcoxon", stats.wilcoxon(mb, ma).pvalue),
    ):
        cell = summarize(res, test)[0]["rows"][1]["measures"]["ndcg_cut_10"]
        assert cell["p"] == pytest.approx(p, rel=1e-12) and cell["pairs"] == 6
        assert cell["mean"] == pytest.approx(sum(mb) / 6)
        assert cell["change_pct"] == pytest.approx(100 * (sum(mb) - sum(ma)) / sum(ma))
    text = render_markdown(res)
    p1 = stats.ttest_rel(mb, ma, alternative="greater").pvalue
    assert p1 <= 0.01
    assert f"| new | {sum(mb) / 6:.4f} ({100 * (sum(mb) - sum(ma)) / sum(ma):+.1f}%)** |" in text, text
    # per-replicate pairing: the runs' means, paired by seed
    cell = summarize(res, "t_test_two_tailed", "replicate")[0]["rows"][1]["measures"]["ndcg_cut_10"]
    assert cell["pairs"] == 2
    assert cell["p"] == pytest.approx(stats.ttest_rel([sum(r) / 6 for r in b], [sum(r) / 6 for r in a]).pvalue)
    # the isotropy paper's test: Student's t on every run's mean of each row, unpaired
    cell = summarize(res, "student_t_one_tailed", "replicate")[0]["rows"][1]["measures"]["ndcg_cut_10"]
    assert cell["pairs"] == 2 and cell["p"] == pytest.approx(
        stats.ttest_ind([sum(r) / 6 for r in b], [sum(r) / 6 for r in a], alternative="greater").pvalue, rel=1e-12
    )
    assert "one-tailed Student's t-test with equal variances" in render_markdown(
        res, "student_t_one_tailed", "replicate"
    )
    # identical systems: p = 1, no mark, +0.0%
    same = render_markdown(results_fixture(a, a))
    assert "| new | 0.2667 (+0.0%) |" in same, same
    # a row with a missing run is marked
    res["cells"][-1]["status"] = "missing"
    assert "| new [1/2 runs] |" in render_markdown(res)


def test_run_level_isotropy_columns_are_means_without_test():
    a = [[0.1, 0.2, 0.3, 0.4], [0.3, 0.2, 0.1, 0.4]]
    b = [[0.4, 0.5, 0.3, 0.6], [0.5, 0.6, 0.4, 0.7]]
    res = results_fixture(a, b)
    for cell, iw in zip(res["cells"], (0.6, 0.7, 0.1, 0.3)):
        cell["metrics"]["iw"] = iw
    res["measures"] = ["ndcg_cut_10", "iw"]
    rows = summarize(res)[0]["rows"]
    assert rows[0]["measures"]["iw"]["mean"] == pytest.approx(0.65) and rows[1]["measures"]["iw"][
        "mean"
    ] == pytest.approx(0.2)
    assert rows[1]["measures"]["iw"]["p"] is None and rows[1]["measures"]["ndcg_cut_10"]["p"] is not None
    text = render_markdown(res)
    assert "| 0.2000 |" in text and "untested" in text, text


def test_best_step_column_is_the_mean_step_without_test():
    res = results_fixture([[0.1, 0.2, 0.3]] * 2, [[0.2, 0.3, 0.4]] * 2)
    for cell, step in zip(res["cells"], (0, 0, 100, 300)):
        cell["metrics"]["best_step"] = step
    res["measures"] = ["ndcg_cut_10", "best_step"]
    rows = summarize(res)[0]["rows"]
    assert rows[1]["measures"]["best_step"]["mean"] == 200 and rows[1]["measures"]["best_step"]["p"] is None
    assert "| 0 |" in render_markdown(res) and "| 200 |" in render_markdown(res)


def test_grid_file_errors_and_cell_layout(tmp_path):
    def grid(**kw):
        base = {
            "baseline": "a",
            "rows": {"a": ["model=colbert"], "b": ["model=repbert"]},
            "train_data": ["synthetic"],
            "seeds": [1, 2],
        }
        base.update(kw)
        p = tmp_path / "g.yaml"
        p.write_text(json.dumps({k: v for k, v in base.items() if v is not None}))
        return p

    spec, extra = load_grid([f"grid={grid()}", "trainer.max_steps=3"])
    assert spec.name == "g" and extra == ["trainer.max_steps=3"]
    cells = plan(spec, extra)
    assert [c.label for c in cells] == [
        "a/synthetic/seed1",
        "b/synthetic/seed1",
        "a/synthetic/seed2",
        "b/synthetic/seed2",
    ]
    assert cells[1].argv == (
        "data=synthetic",
        "model=repbert",
        "trainer.max_steps=3",
        "seed=1",
        "logger.group=g",
        "logger.run_name=b-synthetic-synthetic-seed1",
        f"output_dir={spec.dir / 'b' / 'synthetic' / 'seed1'}",
    )
    spec, _ = load_grid([f"grid={grid(folds=5, seeds=[7])}"])
    cells = plan(spec)
    assert [c.replicate for c in cells[::2]] == [f"fold{f}" for f in range(5)]
    assert "data.num_folds=5" in cells[2].argv and "data.fold=1" in cells[2].argv and "seed=7" in cells[2].argv
    for kw, needle in (
        ({"baseline": "c"}, "baseline: 'c' is not a row"),
        ({"test": "sign"}, "unknown significance test"),
        ({"seeds": ["x"]}, "seeds"),
        ({"folds": 2}, "folds"),
        ({"bogus": 1}, "unknown grid key 'bogus'"),
        ({"rows": {"a/b": []}, "baseline": "a/b"}, "label 'a/b'"),
        ({"common": ["seed=3"]}, "set by the grid"),
        ({"test": "student_t_one_tailed"}, "paired_by: is 'query'.*expected paired_by: replicate"),
        ({"folds": 5, "common": ["data.fold=1"]}, "data.fold"),
        ({"rows": None}, "rows: is missing"),
    ):
        with pytest.raises(InputError, match=needle):
            load_grid([f"grid={grid(**kw)}"])
    with pytest.raises(InputError, match="no grid 'nope'"):
        load_grid(["grid=nope"])
    # another baseline or test on the command line tabulates beside table.md, never over it
    names = {
        tuple(a): load_grid([f"grid={grid()}", *a])[0].table_path.name
        for a in (
            [],
            ["baseline=b"],
            ["test=wilcoxon"],
            ["baseline=b", "test=student_t_one_tailed", "paired_by=replicate"],
        )
    }
    assert list(names.values()) == [
        "table.md",
        "table-b.md",
        "table-wilcoxon-query.md",
        "table-b-student_t_one_tailed-replicate.md",
    ]
    # only=: globs on the cell labels select what runs (e.g. one fold of every row first)
    spec, _ = load_grid([f"grid={grid(folds=5, seeds=[7])}", "only=[*/fold0,b/*/fold3]"])
    assert [c.label for c in plan(spec) if spec.selected(c)] == [
        "a/synthetic/fold0",
        "b/synthetic/fold0",
        "b/synthetic/fold3",
    ]
    spec, _ = load_grid([f"grid={grid()}"])
    assert all(spec.selected(c) for c in plan(spec))
    with pytest.raises(InputError, match="only: is 5; expected cell-label globs"):
        load_grid([f"grid={grid(only=5)}"])


@pytest.mark.slow
def test_experiments_cli_one_line_error(tmp_path):
    g = tmp_path / "g.yaml"
    g.write_text(
        json.dumps(
            {
                "baseline": "a",
                "rows": {"a": ["model=colbert"]},
                "train_data": ["synthetic"],
                "output_root": str(tmp_path / "out"),
            }
        )
    )
    proc = run_script("experiments.py", f"grid={g}", "model.compress_dimm=8", check=False)
    assert proc.returncode == 2
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "model.compress_dimm" in err[0] and "a/synthetic/run" in err[0], proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_example_grid_composes():
    from grid.engine import check

    spec, _ = load_grid(["grid=squad_3seeds"])
    assert spec.baseline == "bm25" and set(spec.rows) == {"bm25", "colbert", "repbert"} and spec.seeds == [1, 2, 3]
    cells = plan(spec)
    assert len(cells) == 9
    check(spec, cells)  # every cell's config composes (BM25's row has no training keys it does not know)


@pytest.mark.slow
def test_head_rows_build_on_their_base_row(tmp_path, tiny_bert):
    """A row with head=whitening reuses its base row's fine-tuned checkpoint (stage=head) and evaluates out of
    distribution with its head; its 'before_head' equals the base row's own test metrics (same model, no head)."""
    rows = {
        "colbert_white": ["model=colbert", f"model.backbone={tiny_bert}", "head=whitening"],
        "colbert": ["model=colbert", f"model.backbone={tiny_bert}"],
    }
    gfile = tiny_grid(tmp_path, "heads", "colbert", rows, eval_data={"syn": SYN, "syn_start": SYN_START})
    spec, _ = load_grid([f"grid={gfile}"])
    cells = plan(spec)
    assert [c.label for c in cells][:2] == ["colbert/syn/seed1", "colbert/syn/seed1/eval-syn_start"]  # base first
    report = run([f"grid={gfile}"], out=io.StringIO())
    assert set(report.status.values()) == {"ran"}, report.status
    root = tmp_path / "grids" / "heads"
    base = json.loads((root / "colbert" / "syn" / "seed1" / "metrics.json").read_text())
    head = json.loads((root / "colbert_white" / "syn" / "seed1" / "metrics.json").read_text())
    assert head["before_head"]["ndcg_cut_10"] == pytest.approx(base["ndcg_cut_10"], abs=1e-9)
    assert head["iw"] > base["iw"]
    cfg = (root / "colbert_white" / "syn" / "seed1" / "config.yaml").read_text()
    assert "stage: head" in cfg and str(root / "colbert" / "syn" / "seed1" / "checkpoints") in cfg
    ood = json.loads((root / "colbert_white" / "syn" / "seed1" / "eval-syn_start" / "metrics.json").read_text())
    base_ood = json.loads((root / "colbert" / "syn" / "seed1" / "eval-syn_start" / "metrics.json").read_text())
    assert ood["before_head"]["ndcg_cut_10"] == pytest.approx(base_ood["ndcg_cut_10"], abs=1e-9)
    res = json.loads((root / "results.json").read_text())
    assert all(
        isinstance(v, int) if k == "best_step" else isinstance(v, float)
        for c in res["cells"]
        for k, v in c["metrics"].items()
    )


def test_head_row_without_base_row_is_an_error(tmp_path, tiny_bert):
    grid = {
        "name": "h",
        "baseline": "w",
        "rows": {"w": ["model=colbert", "head=whitening"]},
        "train_data": ["synthetic"],
    }
    gfile = tmp_path / "h.yaml"
    gfile.write_text(json.dumps(grid))
    spec, _ = load_grid([f"grid={gfile}"])
    with pytest.raises(InputError, match="rows.w.*no row with its other overrides"):
        plan(spec)


def test_a_key_its_cells_job_does_not_take_stops_the_grid_at_planning(tmp_path):
    """Each cell's job (pipeline/jobs.py) is checked with the checkpoint keys its run will add, before any cell runs."""
    from grid.engine import check

    gfile = tmp_path / "j.yaml"
    gfile.write_text(
        json.dumps({"baseline": "a", "rows": {"a": ["model=colbert", "retrieval=dense"]}, "train_data": ["synthetic"]})
    )
    spec, _ = load_grid([f"grid={gfile}"])
    with pytest.raises(
        InputError, match=r"grid j, cell a/synthetic/run: config key 'retrieval': job 'finetune' \(train.py\) takes no"
    ):
        check(spec, plan(spec))
    assert not spec.dir.exists()  # nothing written


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs" / "grid").glob("*.yaml")))
def test_every_shipped_grid_composes(name):
    """Every grid in configs/grid plans and composes every cell (head rows find their base row)."""
    from grid.engine import check

    spec, _ = load_grid([f"grid={name}"])
    check(spec, plan(spec))


# ---------------------------------------------------------------- transfer rows, per-row comparisons, Table 3-4 layout


def transfer_grid(tmp_path, rows=None, **kw):
    grid = {
        "name": "tr",
        "baseline": "a",
        # the fine-tuned row first: the plan must still run the cell it starts from before it
        "rows": rows or {"a_ft": ["model=colbert", "init_ckpt=@a/pre"], "a": ["model=colbert"]},
        "train_data": {"main": ["data=synthetic"], "pre": ["data=synthetic", "data.data_seed=9"]},
        "train_on": {"a_ft": ["main"]},
        "compare_to": {"a_ft": "a"},
        "seeds": [1],
    }
    grid.update(kw)
    gfile = tmp_path / "tr.yaml"
    gfile.write_text(json.dumps({k: v for k, v in grid.items() if v is not None}))
    return gfile


def test_transfer_rows_plan_after_the_cell_they_start_from(tmp_path):
    spec, _ = load_grid([f"grid={transfer_grid(tmp_path)}"])
    cells = plan(spec)
    labels = [c.label for c in cells]
    assert labels == [
        "a/main/seed1",
        "a/main/seed1/eval-pre",
        "a/pre/seed1",
        "a/pre/seed1/eval-main",
        "a_ft/main/seed1",
        "a_ft/main/seed1/eval-pre",
    ], labels
    ft = cells[4]
    assert ft.init_dir == spec.dir / "a" / "pre" / "seed1" and "init_ckpt=@a/pre" in ft.argv
    assert not any(a.startswith("init_ckpt") for a in cells[5].argv)  # evaluation uses the cell's own checkpoint
    for kw, needle in (
        (
            {
                "rows": {"a": ["model=colbert"], "b": ["model=colbert", "init_ckpt=@c/pre"]},
                "train_on": None,
                "compare_to": None,
            },
            "init_ckpt=@<row>/<train_data>",
        ),
        (
            {
                "rows": {"a": ["model=colbert"], "b": ["model=colbert", "init_ckpt=@a/x"]},
                "train_on": None,
                "compare_to": None,
            },
            "init_ckpt=@<row>/<train_data>",
        ),
        ({"train_on": {"a": ["main"], "a_ft": ["main"]}}, "row 'a' does not train on 'pre'"),
        ({"train_on": {"a_ft": ["nope"]}}, "train_on.a_ft"),
        ({"compare_to": {"a_ft": "zz"}}, "compare_to.a_ft"),
        ({"delta_eval": ["main"]}, "delta_eval"),
        ({"delta_base": "third"}, "delta_base: is 'third'; expected second"),
    ):
        with pytest.raises(InputError, match=needle):
            load_grid([f"grid={transfer_grid(tmp_path, **kw)}"])


@pytest.mark.slow
def test_transfer_grid_fine_tunes_from_the_pretrained_checkpoint(tmp_path, tiny_bert):
    from grid.engine import best_checkpoint

    model = ["model=bert_dot", f"model.backbone={tiny_bert}"]
    gfile = transfer_grid(
        tmp_path,
        rows={"a_ft": [*model, "init_ckpt=@a/pre"], "a": model},
        train_data={"main": SYN, "pre": [*SYN[:1], "data.data_seed=4", *SYN[2:]]},
        eval_data={"main": SYN},
        common=[*FAST, "eval.ats_passages=16", f"data.cache_dir={tmp_path / 'cache'}"],
        measures=["ndcg_cut_10", "mats"],
        launcher="inprocess",
        output_root=str(tmp_path / "grids"),
    )
    report = run([f"grid={gfile}"], out=io.StringIO())
    assert set(report.status.values()) == {"ran"} and len(report.status) == 4, report.status  # + a/pre tested on main
    root = tmp_path / "grids" / "tr"
    cfg = (root / "a_ft" / "main" / "seed1" / "config.yaml").read_text()
    assert f"init_ckpt: {best_checkpoint(root / 'a' / 'pre' / 'seed1')}" in cfg
    res = json.loads((root / "results.json").read_text())
    assert {(c["row"], c["train"]) for c in res["cells"]} == {("a", "main"), ("a", "pre"), ("a_ft", "main")}
    assert "| a_ft (vs a) |" in report.table and "mats" in report.table


def delta_fixture():
    """Two rows, two seeds, evaluated on 'orig' and 'rot' (same queries)."""
    vals = {
        ("m", "orig"): [[0.5, 0.6, 0.7, 0.8, 0.4, 0.9], [0.6, 0.6, 0.8, 0.7, 0.5, 0.9]],
        ("m", "rot"): [[0.3, 0.5, 0.6, 0.4, 0.4, 0.7], [0.4, 0.4, 0.5, 0.6, 0.3, 0.8]],
        ("n", "orig"): [[0.2, 0.3, 0.2, 0.4, 0.3, 0.1], [0.3, 0.2, 0.2, 0.5, 0.3, 0.2]],
        ("n", "rot"): [[0.2, 0.3, 0.3, 0.4, 0.2, 0.1], [0.3, 0.3, 0.2, 0.4, 0.3, 0.2]],
    }
    cells = []
    for (row, ev), per_rep in vals.items():
        for rep, v in zip(("seed1", "seed2"), per_rep):
            pq = {f"q{i}": {"ndcg_cut_10": x} for i, x in enumerate(v)}
            cells.append(
                {
                    "row": row,
                    "train": "d",
                    "eval": ev,
                    "replicate": rep,
                    "status": "done",
                    "per_query": pq,
                    "metrics": {"ndcg_cut_10": math.fsum(v) / len(v), "mats": 0.1 if row == "m" else 0.02},
                }
            )
    res = {
        "grid": "g",
        "baseline": "m",
        "test": "wilcoxon",
        "paired_by": "query",
        "measures": ["ndcg_cut_10", "mats"],
        "rows": ["m", "n"],
        "train_data": ["d"],
        "eval_data": ["orig", "rot"],
        "replicates": ["seed1", "seed2"],
        "folds": None,
        "cells": cells,
        "delta_eval": ["orig", "rot"],
        "compare_to": {"n": "n"},
    }
    return res, vals


def test_delta_table_is_tables_3_4_with_wilcoxon_between_test_sets():
    from grid.tables import summarize_delta

    res, vals = delta_fixture()
    mean = lambda reps: [(x + y) / 2 for x, y in zip(*reps)]  # noqa: E731 - per-query means over the seeds
    for e in summarize_delta(res):
        a, b = mean(vals[(e["row"], "orig")]), mean(vals[(e["row"], "rot")])
        v = e["measures"]["ndcg_cut_10"]
        assert v["first"] == pytest.approx(sum(a) / 6) and v["second"] == pytest.approx(sum(b) / 6)
        # the paper's Delta: relative to the debiased (second) value, Table 3's (0.395 - 0.432) / 0.395 = -9.4 %
        assert v["change_pct"] == pytest.approx(100 * (sum(b) - sum(a)) / sum(b))
        assert v["p"] == pytest.approx(stats.wilcoxon(b, a).pvalue, rel=1e-12)
        assert e["measures"]["mats"]["p"] is None
    text = render_markdown(res)
    a, b = mean(vals[("m", "orig")]), mean(vals[("m", "rot")])
    assert f"| m | d | {sum(a) / 6:.4f} | {sum(b) / 6:.4f} | {100 * (sum(b) - sum(a)) / sum(b):+.1f}%" in text, text
    assert "Δ = (rot - orig) / rot (the paper's Delta" in text
    # delta_base=first: relative to the first evaluation data, the switch
    first = render_markdown({**res, "delta_base": "first"})
    assert f"| m | d | {sum(a) / 6:.4f} | {sum(b) / 6:.4f} | {100 * (sum(b) - sum(a)) / sum(a):+.1f}%" in first, first
    assert [e["measures"]["ndcg_cut_10"]["change_pct"] for e in summarize_delta({**res, "delta_base": "first"})] == [
        pytest.approx(100 * (sum(mean(vals[(r, "rot")])) - sum(mean(vals[(r, "orig")]))) / sum(mean(vals[(r, "orig")])))
        for r in ("m", "n")
    ]
    # the paper's own Table 3 figures, through the same formula: BERT_CAT 0.432 -> 0.395 is its -9.4 %, TK's -20.8 %
    paper = {**res, "measures": ["ndcg_cut_10"], "cells": [], "rows": ["m"], "eval_data": ["orig", "rot"]}
    for orig, rot, printed in ((0.432, 0.395, -9.4), (0.373, 0.329, -13.4), (0.371, 0.307, -20.8)):
        paper["cells"] = [
            {
                "row": "m",
                "train": "d",
                "eval": ev,
                "status": "done",
                "replicate": "seed1",
                "metrics": {"ndcg_cut_10": v},
                "per_query": {"ndcg_cut_10": {"q1": v}},
            }
            for ev, v in (("orig", orig), ("rot", rot))
        ]
        assert round(summarize_delta(paper)[0]["measures"]["ndcg_cut_10"]["change_pct"], 1) == printed
    # compare_to: n is its own reference (no change, no test), m stays the baseline
    rows = summarize(res)[0]["rows"]
    assert (
        [r["row"] for r in rows] == ["m", "n"]
        and rows[1]["baseline"]
        and rows[1]["measures"]["ndcg_cut_10"]["p"] is None
    )


@pytest.mark.slow
def test_untrained_row_is_the_backbone_evaluated_as_it_is(tmp_path, tiny_bert):
    """A row listed in `untrained` runs evaluate.py with its overrides and no checkpoint (the backbone at step 0, the
    isotropy tables' row beside Ft), on the training data and out of distribution; its numbers equal a direct
    evaluate.py of the same model, and the fine-tuned row is tested against it."""
    model = ["model=colbert", f"model.backbone={tiny_bert}"]
    rows = {"colbert_backbone": model, "colbert": model}
    gfile = tiny_grid(
        tmp_path,
        "backbone",
        "colbert_backbone",
        rows,
        untrained=["colbert_backbone"],
        eval_data={"syn": SYN, "syn_start": SYN4},
    )
    spec, _ = load_grid([f"grid={gfile}"])
    assert [c.untrained for c in plan(spec)] == [True, True, False, False]
    report = run([f"grid={gfile}"], out=io.StringIO())
    assert set(report.status.values()) == {"ran"}, report.status
    cell = tmp_path / "grids" / "backbone" / "colbert_backbone" / "syn" / "seed1"
    assert not (cell / "checkpoints").exists()  # nothing trained
    direct = tmp_path / "direct"
    args = job_args("evaluate.py", [*model, *SYN, *FAST])  # the overrides the grid passes an untrained row
    run_script("evaluate.py", *args, f"data.cache_dir={tmp_path / 'cache'}", "seed=1", f"output_dir={direct}")
    assert (
        json.loads((cell / "metrics.json").read_text())["ndcg_cut_10"]
        == json.loads((direct / "metrics.json").read_text())["ndcg_cut_10"]
    )
    res = json.loads((tmp_path / "grids" / "backbone" / "results.json").read_text())
    assert {(c["row"], c["eval"]) for c in res["cells"] if c["status"] == "done"} == {
        (r, e) for r in ("colbert_backbone", "colbert") for e in ("syn", "syn_start")
    }


def test_untrained_key_is_checked(tmp_path):
    for untrained, rows, msg in (
        (["nope"], {"a": ["model=colbert"]}, "'nope' is not a row"),
        (["a"], {"a": ["model=colbert", "head=whitening"]}, "sets a head"),
    ):
        g = tmp_path / "g.yaml"
        g.write_text(json.dumps({"baseline": "a", "rows": rows, "train_data": ["synthetic"], "untrained": untrained}))
        with pytest.raises(InputError, match=msg):
            load_grid([f"grid={g}"])


def test_table_record_with_paper_figures(tmp_path, monkeypatch):
    """`action=table record=true` writes results/<date>-<name>.md with the command, commit, machine, the cells'
    summed wall time and the table, the paper's figures under our rows; a second record does not overwrite it."""
    import grid.record as record

    monkeypatch.setattr(record, "RESULTS_DIR", tmp_path / "results")
    grid = {
        "name": "rec",
        "baseline": "bm25",
        "rows": {"bm25": ["model=bm25"], "bm25_b": ["model=bm25", "model.b=0.5"]},
        "train_data": ["synthetic"],
        "seeds": [1, 2],
        "measures": ["ndcg_cut_10"],
        "output_root": str(tmp_path / "grids"),
        "paper": {"synthetic": {"bm25_b": {"ndcg_cut_10": 0.612}}},
    }
    gfile = tmp_path / "rec.yaml"
    gfile.write_text(json.dumps(grid))
    spec, _ = load_grid([f"grid={gfile}"])
    values = {("bm25", 1): [0.5, 0.6], ("bm25", 2): [0.5, 0.6], ("bm25_b", 1): [0.7, 0.8], ("bm25_b", 2): [0.6, 0.8]}
    for c in plan(spec):  # finished cells as run.py leaves them, each with its wall time
        c.dir.mkdir(parents=True)
        v = values[(c.row, c.seed)]
        (c.dir / "metrics.json").write_text(json.dumps({"ndcg_cut_10": sum(v) / 2}))
        (c.dir / "per_query.json").write_text(json.dumps({"q1": {"ndcg_cut_10": v[0]}, "q2": {"ndcg_cut_10": v[1]}}))
        (c.dir / "cell.json").write_text(json.dumps({"argv": list(c.argv), "wall_s": 90.0}))
    report = run([f"grid={gfile}", "action=table", "record=true"], out=io.StringIO())
    assert "| ↳ paper | 0.6120 |" in report.table
    records = sorted((tmp_path / "results").glob("*-rec.md"))
    assert len(records) == 1
    text = records[0].read_text()
    assert "- Wall time: 6 min 00 s (sum over 4 cell runs)" in text and "- Commit: " in text and "- Machine: " in text
    assert f"python experiments.py grid={gfile} action=table record=true" in text
    assert "| bm25_b | 0.7250 (+31.8%)" in text and "| ↳ paper | 0.6120 |" in text
    run([f"grid={gfile}", "action=table", "record=true"], out=io.StringIO())
    assert len(list((tmp_path / "results").glob("*-rec*.md"))) == 2  # the first one is kept
    # eval_data labels of their own (the position-bias grid): the training cells' time counts too
    two = dict(
        grid,
        name="rec2",
        paper=None,
        eval_data={
            "a": ["data=synthetic", "data.max_eval_queries=2"],
            "b": ["data=synthetic", "data.max_eval_queries=1"],
        },
    )
    g2 = tmp_path / "rec2.yaml"
    g2.write_text(json.dumps(two))
    spec2, _ = load_grid([f"grid={g2}"])
    for c in plan(spec2):
        c.dir.mkdir(parents=True)
        (c.dir / "metrics.json").write_text(json.dumps({"ndcg_cut_10": 0.5}))
        (c.dir / "per_query.json").write_text(json.dumps({"q1": {"ndcg_cut_10": 0.5}}))
        (c.dir / "cell.json").write_text(
            json.dumps({"argv": list(c.argv), "wall_s": 600.0 if c.kind == "train" else 60.0})
        )
    run([f"grid={g2}", "action=table", "record=true", "seeds=[1]"], out=io.StringIO())
    text = next((tmp_path / "results").glob("*-rec2.md")).read_text()
    assert "- Wall time: 24 min 00 s (sum over 6 cell runs)" in text  # seed 1: 2 rows x (600 s + 2 x 60 s)
    bad = dict(grid, paper={"synthetic": {"nope": {"ndcg_cut_10": 0.6}}})
    gfile.write_text(json.dumps(bad))
    with pytest.raises(InputError, match="paper.synthetic.nope"):
        load_grid([f"grid={gfile}"])


def test_head_rows_build_on_the_fine_tuned_row_not_the_backbone():
    from grid.engine import head_bases

    spec, _ = load_grid(["grid=squad_colbert_heads"])
    assert spec.rows["colbert_backbone"] == spec.rows["colbert"] and spec.untrained == ["colbert_backbone"]
    assert set(head_bases(spec).values()) == {"colbert"}


def test_a_cell_claimed_by_another_grid_process_is_left_to_it(tmp_path):
    """Two grid processes on one grid share its cells: a cell whose `.<cell>.grid.lock` another process holds is
    skipped as busy (not run, not touched), the others run; once the lock is free, the next run takes it."""
    from filelock import FileLock

    gfile = tiny_grid(tmp_path, "shared", "bm25", BM25_ROWS, seeds=[1, 2])
    held = tmp_path / "grids" / "shared" / "bm25" / "syn" / "seed2"
    other = FileLock(held.parent / ".seed2.grid.lock")  # what the other grid process holds while it runs seed2
    other.acquire()
    try:
        log = io.StringIO()
        report = run([f"grid={gfile}"], out=log)
    finally:
        other.release()
    assert report.status == {"bm25/syn/seed1": "ran", "bm25/syn/seed2": "busy"}
    assert "bm25/syn/seed2: skipped (another grid process is running it)" in log.getvalue()
    assert not held.exists() and (held.parent / "seed1" / "metrics.json").is_file()
    report = run([f"grid={gfile}"], out=io.StringIO())
    assert report.status == {"bm25/syn/seed1": "skipped", "bm25/syn/seed2": "ran"}
    assert not list(held.parent.glob(".*.grid.lock"))  # claims leave no files behind


def _held_until(lock_path: Path, log: io.StringIO, *lines: str, timeout: float = 300.0):
    """Another grid process, as the lock file sees it: it holds `lock_path` until every one of `lines` is in `log`
    (what the grid under test has said), then dies without having run the cell. Returns the thread once the lock is
    held. Releasing on what the grid said, not after a fixed time, keeps the test independent of the machine's load."""
    import threading

    from filelock import FileLock

    held = threading.Event()

    def other():
        with FileLock(lock_path):
            held.set()
            deadline = time.monotonic() + timeout
            while not all(line in log.getvalue() for line in lines) and time.monotonic() < deadline:
                time.sleep(0.02)

    thread = threading.Thread(target=other)
    thread.start()
    held.wait()
    return thread


def test_wait_s_takes_the_cells_another_process_leaves(tmp_path):
    """wait_s: a process does not leave a cell that another one holds; it runs what it can, looks again every wait_s
    seconds, and takes the cell when the other process lets go of it unfinished (printing its skip once)."""
    gfile = tiny_grid(tmp_path, "shared", "bm25", BM25_ROWS, seeds=[1, 2])
    cells = tmp_path / "grids" / "shared" / "bm25" / "syn"
    log = io.StringIO()
    skip, seed2 = "bm25/syn/seed1: skipped (another grid process is running it)", "train bm25/syn/seed2: ran"
    other = _held_until(cells / ".seed1.grid.lock", log, skip, seed2)
    report = run([f"grid={gfile}", "wait_s=0.1"], out=log)
    other.join()
    assert report.status == {"bm25/syn/seed1": "ran", "bm25/syn/seed2": "ran"}
    text = log.getvalue()
    assert text.count(skip) == 1
    assert text.index(seed2) < text.index("train bm25/syn/seed1: ran")  # seed 2 ran meanwhile
    with pytest.raises(InputError, match="wait_s"):
        load_grid([f"grid={gfile}", "wait_s=0"])


def test_wait_s_waits_on_a_training_cell_held_elsewhere_and_stops_when_nothing_can_change(
    tmp_path, tiny_bert, crash_when
):
    """A cell blocked on a training cell that another process holds waits for it, and runs (saying so) once that cell
    has run; a cell blocked on a training cell that failed here ends the run (no other process could unblock it)."""
    model = ["model=colbert", f"model.backbone={tiny_bert}"]
    gfile = tiny_grid(tmp_path, "waits", "colbert", {"colbert": model}, eval_data={"syn": SYN, "syn4": SYN4})
    train, evaluation = "colbert/syn/seed1", "colbert/syn/seed1/eval-syn4"
    undo = crash_when(lambda trainer: True)
    log = io.StringIO()
    report = run([f"grid={gfile}", "wait_s=0.1"], out=log)
    undo()
    assert report.status == {train: "failed", evaluation: "blocked"}
    assert f"failed: {train}\nblocked (a cell they need is not finished): {evaluation}\n" in log.getvalue()
    shutil.rmtree(tmp_path / "grids" / "waits" / "colbert")
    log = io.StringIO()
    lock = tmp_path / "grids" / "waits" / "colbert" / "syn" / ".seed1.grid.lock"
    other = _held_until(lock, log, f"eval {evaluation}: blocked")
    report = run([f"grid={gfile}", "wait_s=0.1"], out=log)
    other.join()
    assert report.status == {train: "ran", evaluation: "ran"}, log.getvalue()
    text = log.getvalue()
    assert text.count(f"eval {evaluation}: blocked") == 1
    # "running" is said when a cell starts: once, after its wait, not before the block
    assert text.count(f"eval {evaluation}: running") == 1
    assert (
        text.index(f"eval {evaluation}: blocked")
        < text.index(f"eval {evaluation}: running")
        < text.index(f"eval {evaluation}: ran")
    )


def test_cells_exported_and_imported_tabulate_as_if_run_in_one_place(tmp_path):
    """action=export / import: seed 1 run in one place and seed 2 in another give, once seed 1's finished cells are
    imported beside seed 2, the same results and table as both seeds run in one place; an import that would mix
    other settings, or another grid's cells, stops before writing anything; a cell finished here is kept."""
    gfile = tiny_grid(
        tmp_path, "travel", "bm25", BM25_ROWS, seeds=[1, 2], measures=["ndcg_cut_10", "P_20"], output_root=None
    )
    grid = json.loads(gfile.read_text())
    quiet = io.StringIO

    def grid_run(root, *extra):
        return run([f"grid={gfile}", f"output_root={tmp_path / root}", *extra], out=quiet())

    cells = tmp_path / "seed1.json.gz"
    grid_run("a", "seeds=[1]")
    assert grid_run("a", "seeds=[1]", "action=export", f"cells_file={cells}").status == {}
    first = cells.read_bytes()
    grid_run("a", "seeds=[1]", "action=export", f"cells_file={cells}")
    assert cells.read_bytes() == first  # the same cells, the same bytes
    grid_run("b", "seeds=[2]")
    report = grid_run("b", "action=import", f"cells_file={cells}")
    assert report.status == {"bm25/syn/seed1": "imported"}
    assert grid_run("b", "action=import", f"cells_file={cells}").status == {"bm25/syn/seed1": "skipped"}  # kept
    merged = grid_run("b", "action=table")
    together = grid_run("c")
    a = json.loads((tmp_path / "b" / "travel" / "results.json").read_text())
    b = json.loads((tmp_path / "c" / "travel" / "results.json").read_text())
    assert [c["status"] for c in a["cells"]] == ["done", "done"]
    assert [(c["metrics"], c["per_query"]) for c in a["cells"]] == [(c["metrics"], c["per_query"]) for c in b["cells"]]
    assert merged.table.replace(str(tmp_path / "b"), "") == together.table.replace(str(tmp_path / "c"), "")

    # other overrides, another grid, a missing file: one error each, nothing written
    with pytest.raises(InputError, match="cell 'bm25/syn/seed1' ran with other overrides"):
        grid_run("d", "model.depth=10", "action=import", f"cells_file={cells}")
    other = dict(grid, name="elsewhere")
    ofile = tmp_path / "elsewhere.yaml"
    ofile.write_text(json.dumps(other))
    with pytest.raises(InputError, match="holds cells of grid 'travel', not of 'elsewhere'"):
        run([f"grid={ofile}", f"output_root={tmp_path / 'd'}", "action=import", f"cells_file={cells}"], out=quiet())
    with pytest.raises(InputError, match="does not exist"):
        grid_run("d", "action=import", f"cells_file={tmp_path / 'none.json.gz'}")
    with pytest.raises(InputError, match="cells_file.*is missing"):
        grid_run("d", "action=export")
    assert not list((tmp_path / "d").rglob("metrics.json"))


def test_a_training_cell_travels_only_with_the_cells_that_need_its_checkpoint(tmp_path):
    """action=export carries no checkpoint: a finished training cell is held back while a cell that needs its
    checkpoint (an evaluation, a head row, and that head row's evaluations) is unfinished, and so are the finished
    cells that need it; a unit whose cells have all finished goes whole."""

    def cell(kind, row, ev="syn", base=None, rep="seed1", done=True):
        d = tmp_path / row / "syn" / rep if kind == "train" else tmp_path / row / "syn" / rep / f"eval-{ev}"
        if done:
            d.mkdir(parents=True, exist_ok=True)
            for name in ("metrics.json", "per_query.json"):
                (d / name).write_text("{}")
        return Cell(kind, row, "syn", ev, rep, 1, None, d, (), base_dir=base)

    ft = cell("train", "colbert")
    ft_eval = cell("eval", "colbert", "cranfield")
    head = cell("train", "colbert_glow", base=ft.dir)
    head_eval = cell("eval", "colbert_glow", "cranfield", base=ft.dir, done=False)  # not finished
    whitening = cell("train", "colbert_whitening", base=ft.dir)
    other = cell("train", "colbert", rep="seed2")
    other_eval = cell("eval", "colbert", "cranfield", rep="seed2")
    cells = [ft, ft_eval, head, head_eval, whitening, other, other_eval]
    assert [c.label for c in exportable(cells)] == [other.label, other_eval.label]
    for name in ("metrics.json", "per_query.json"):  # the head row's evaluation finishes: seed 1 goes whole
        head_eval.dir.mkdir(parents=True, exist_ok=True)
        (head_eval.dir / name).write_text("{}")
    assert exportable(cells) == cells


def test_the_position_bias_grid_plans_no_test_its_training_cells_already_ran():
    """squad_position_bias: testing on `original` is what both trainings (biased, and debiased = the same data with
    data.rotate_train=true) end with, so only `rotated` gets evaluation cells; a changed test key makes one again."""
    assert TRAINING_ONLY <= {f.name for f in dataclasses.fields(DataConfig)}  # no misspelt key matches nothing
    spec, extra = load_grid(["grid=squad_position_bias"])
    assert [spec.own_test(t, e) for t in ("biased", "debiased") for e in ("original", "rotated")] == [
        True,
        False,
        True,
        False,
    ]
    evals = {c.eval for c in plan(spec, extra) if c.kind == "eval"}
    assert evals == {"rotated"}
    spec, _ = load_grid(
        [
            "grid=squad_position_bias",
            "eval_data={original: [data=squad_biased, data.max_eval_queries=50], rotated: [data=squad_biased]}",
        ]
    )
    assert not spec.own_test("biased", "original") and spec.own_test("biased", "rotated")


@pytest.mark.slow
def test_a_test_read_from_the_training_cell_equals_evaluate_py_on_its_checkpoint(tmp_path, tiny_bert):
    """The grid reads `original` from the debiased training cell (own_test): evaluate.py on that cell's best
    checkpoint with the test's own overrides, the cell the grid no longer runs, gives the same metrics and
    per-query values; cells files that still hold such a cell import without it."""
    cache = tmp_path / "cache"
    gfile = tiny_grid(
        tmp_path,
        "pb",
        "colbert",
        {"colbert": ["model=colbert", f"model.backbone={tiny_bert}"]},
        train_data={"debiased": [*SYN, "data.rotate_train=true"]},
        eval_data={"original": SYN, "rotated": [*SYN, "data.rotate_eval=true"]},
    )
    report = run([f"grid={gfile}"], out=io.StringIO())
    assert report.status == {"colbert/debiased/seed1": "ran", "colbert/debiased/seed1/eval-rotated": "ran"}
    train_dir = tmp_path / "grids" / "pb" / "colbert" / "debiased" / "seed1"
    res = json.loads((tmp_path / "grids" / "pb" / "results.json").read_text())
    assert {c["eval"]: c["dir"] for c in res["cells"]} == {
        "original": str(train_dir),
        "rotated": str(train_dir / "eval-rotated"),
    }

    best = next((train_dir / "checkpoints").glob("best-*.ckpt"))
    out = tmp_path / "eval-original"
    args = job_args("evaluate.py", [f"ckpt={best}", *FAST, *SYN])  # the overrides the grid passes its evaluation
    run_script("evaluate.py", *args, f"data.cache_dir={cache}", f"output_dir={out}")
    ours, theirs = (json.loads((d / "per_query.json").read_text()) for d in (train_dir, out))
    assert ours == theirs
    ours, theirs = (json.loads((d / "metrics.json").read_text()) for d in (train_dir, out))
    keys = ["ndcg_cut_10", "P_20", "iw_paper", "avgcos_paper"]
    assert {k: ours[k] for k in keys} == pytest.approx({k: theirs[k] for k in keys}, abs=1e-9)

    # a cells file from before: the would-be cell is left out, the others import
    cells = tmp_path / "cells.json.gz"
    run([f"grid={gfile}", "action=export", f"cells_file={cells}"], out=io.StringIO())
    doc = json.loads(gzip.decompress(cells.read_bytes()))
    old = {"label": "colbert/debiased/seed1/eval-original", "argv": [], "files": {}}
    cells.write_bytes(gzip.compress(json.dumps(dict(doc, cells=[*doc["cells"], old])).encode()))
    log = io.StringIO()
    report = run(
        [f"grid={gfile}", f"output_root={tmp_path / 'elsewhere'}", "action=import", f"cells_file={cells}"], out=log
    )
    assert report.status["colbert/debiased/seed1/eval-original"] == "skipped"
    assert sorted(k for k, v in report.status.items() if v == "imported") == [
        "colbert/debiased/seed1",
        "colbert/debiased/seed1/eval-rotated",
    ]
    assert "1 left out: tests their training cell already ran" in log.getvalue()


def test_the_grid_uses_only_the_public_api_of_pipeline():
    """grid/ imports from pipeline only names without a leading underscore, each in its module's `__all__` when the
    module declares one (import-linter checks the modules; this checks the names)."""
    import ast
    import importlib

    private = []
    for path in sorted((REPO / "grid").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pipeline":
                public = getattr(importlib.import_module(node.module), "__all__", None)
                for alias in node.names:
                    if alias.name.startswith("_") or (public is not None and alias.name not in public):
                        private.append(f"{path.name}:{node.lineno} {node.module}.{alias.name}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id == "pipeline":
                    private.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert private == [], f"grid/ uses private names of pipeline: {private}"


def test_a_bf16_grid_says_once_at_its_start_that_this_cpu_emulates_bf16(tmp_path, monkeypatch):
    """The warning each bf16 cell's log holds (core/precision.py) is also the grid's own, once, before any cell runs;
    not on a CPU with bf16 kernels, and not for an fp32 grid."""
    import io
    import warnings

    import core.precision
    import grid.engine as engine

    monkeypatch.setattr(engine, "_run_pass", lambda *a, **k: (False, False))  # no cell runs
    for precision, native, want in ("bf16-mixed", False, 1), ("bf16-mixed", True, 0), ("32-true", False, 0):
        gfile = tmp_path / "p.yaml"
        grid = {
            "baseline": "a",
            "rows": {"a": ["model=colbert"], "b": ["model=repbert"]},
            "train_data": ["synthetic"],
            "common": [f"trainer.precision={precision}", "trainer.accelerator=cpu"],
            "output_root": str(tmp_path / "out"),
        }
        gfile.write_text(json.dumps(grid))
        monkeypatch.setattr(core.precision, "cpu_bf16_native", lambda native=native: native)
        monkeypatch.setattr(core.precision, "_warned", set())
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            engine.run([f"grid={gfile}"], out=io.StringIO())
        ours = [str(w.message) for w in got if "no bf16 kernels" in str(w.message)]
        assert len(ours) == want, (precision, native, ours)
        assert all(m.startswith("trainer.precision=bf16-mixed on this CPU") for m in ours)


def test_each_cell_gets_the_overrides_its_job_reads(tmp_path, monkeypatch):
    """A grid's common and row overrides serve all its cells: a cell is launched with those its job reads
    (pipeline/jobs.py `applied`; evaluate.py refuses the others on its command line), and cell.json keeps the planned
    ones, so cells finished before this stay valid on resume."""
    from grid import engine
    from grid.engine import check, run_cell
    from pipeline.jobs import unread

    rows = {"bb": ["model=colbert", "optim.lr=1e-5", "data.negatives=random"], "ft": ["model=colbert"]}
    gfile = tiny_grid(tmp_path, "applied", "bb", rows, untrained=["bb"])
    spec, _ = load_grid([f"grid={gfile}"])
    cells = plan(spec)
    _, _, composed = check(spec, cells)  # the planned keys an evaluation does not read do not stop the grid
    launched = {}
    monkeypatch.setattr(engine, "_launch", lambda script, argv, *a: launched.setdefault(script, argv) and (0, ""))
    untrained = next(c for c in cells if c.untrained)
    run_cell(untrained, spec)
    argv = launched["evaluate.py"]
    dropped = [a for a in untrained.argv if a not in argv]
    # FAST's training keys and the row's optimiser and negatives
    assert sorted(a.split("=")[0] for a in dropped) == [
        "data.batch_size",
        "data.max_train_triples",
        "data.negatives",
        "eval.before_training",
        "optim.lr",
        "trainer.max_steps",
        "trainer.val_check_interval",
    ]
    assert all(unread("evaluate", a.split("=")[0]) is not None for a in dropped)
    assert [a for a in untrained.argv if a in argv] == argv  # the rest, in order
    assert json.loads((untrained.dir / "cell.json").read_text())["argv"] == list(untrained.argv)
    cfg, job = composed[engine._config_key(untrained)]
    from pipeline.config import compose

    default = compose([])
    assert job == "evaluate" and cfg.optim.lr == default.optim.lr and cfg.trainer.max_steps == default.trainer.max_steps


def test_an_evaluation_cell_gets_the_data_keys_of_the_splits_it_reads(tmp_path, monkeypatch):
    """Training data of the tsv source serves a grid's training and evaluation cells alike: an evaluation cell
    (evaluate.py reads the test split) is launched without the training and validation files, which its job would
    refuse on the command line (`DataConfig.split_keys`); a training cell gets them all."""
    from grid import engine
    from grid.engine import check, run_cell

    files = {f"{s}_{k}": f"{s}.{k}.tsv" for s in ("train", "val", "test") for k in ("queries", "qrels")}
    tsv = [
        "data=tsv",
        "data.collection=c.tsv",
        "data.train_triples=t.tsv",
        *(f"data.{k}={v}" for k, v in files.items()),
    ]
    rows = {"bb": ["model=colbert"], "ft": ["model=colbert"]}
    gfile = tiny_grid(tmp_path, "splits", "bb", rows, untrained=["bb"], train_data={"tsv": tsv})
    spec, _ = load_grid([f"grid={gfile}"])
    cells = plan(spec)
    check(spec, cells)
    launched = {}
    monkeypatch.setattr(engine, "_launch", lambda script, argv, *a: launched.setdefault(script, argv) and (0, ""))
    run_cell(next(c for c in cells if c.untrained), spec)
    run_cell(next(c for c in cells if c.kind == "train" and not c.untrained), spec)
    data = {s: {a.split("=")[0] for a in launched[s] if a.startswith("data.")} for s in ("train.py", "evaluate.py")}
    split_files = {f"data.{k}" for k in files} | {"data.train_triples"}
    assert split_files <= data["train.py"]
    assert data["train.py"] - data["evaluate.py"] >= split_files - {"data.test_queries", "data.test_qrels"}
    assert {"data.collection", "data.test_queries", "data.test_qrels"} <= data["evaluate.py"]
    assert not {"data.train_triples", "data.train_queries", "data.val_qrels"} & data["evaluate.py"]


def test_a_cell_without_its_cell_json_is_judged_by_its_config_yaml_whatever_checkpoint_it_was_launched_with(tmp_path):
    """`_config_differs` (a cell whose cell.json is unreadable, judged by the config.yaml its run wrote): the
    checkpoint a grid passes at launch (a head row's evaluation's head_ckpt, a transfer row's resolved init_ckpt) is not
    a planned setting, and a key the cell's job does not read is not passed to it; neither makes the cell's settings
    differ. Any planned key that differs does."""
    from omegaconf import OmegaConf

    from grid.engine import _config_differs, _planned

    spec, _ = load_grid([f"grid={transfer_grid(tmp_path, output_root=str(tmp_path / 'grids'))}"])
    heads = tiny_grid(
        tmp_path,
        "heads",
        "colbert",
        {"colbert_white": ["model=colbert", "head=whitening"], "colbert": ["model=colbert"]},
        eval_data={"syn": SYN, "syn4": SYN4},
    )
    cells = plan(spec) + plan(load_grid([f"grid={heads}"])[0])
    launched = {"init_ckpt": "/runs/a/pre/seed1/checkpoints/best-2.ckpt", "head_ckpt": "/runs/h/head.ckpt"}
    judged = [c for c in cells if c.init_dir is not None or (c.kind == "eval" and c.base_dir is not None)]
    assert {c.row for c in judged} == {"a_ft", "colbert_white"}
    for cell in judged:
        _, cfg, _ = _planned(cell)
        saved = OmegaConf.to_container(cfg)
        for key, path in launched.items():
            if saved.get(key):
                saved[key] = path  # what the run recorded: the real checkpoint
        cell.dir.mkdir(parents=True)
        OmegaConf.save(saved, cell.dir / "config.yaml")
        assert _config_differs(cell, "x") is None, cell.label
        saved["seed"] = 99
        OmegaConf.save(saved, cell.dir / "config.yaml")
        assert "seed: ran with 99" in _config_differs(cell, "x"), cell.label
