"""bench/bench_gpu_speed.py (`python -m bench.bench_gpu_speed key=value ...`): the steady-state window, the probe's
step times and marks it reads, the record's rows, and each kind of task end to end at tiny sizes on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, read_dated_record

from bench import bench_gpu_speed as bgs
from bench import bench_scale, record


def test_steady_window_drops_the_warmup_intervals():
    # five events, 1 s apart except a slow first interval; 2 units per interval
    times = [0.0, 10.0, 11.0, 12.0, 13.0]
    w = bgs.steady_window(times, [2, 2, 2, 2], skip=1)
    assert w["window_s"] == 3.0 and w["units"] == 6.0 and w["rate"] == pytest.approx(2.0)
    assert bgs.steady_window(times, [2, 2, 2, 2], skip=3) is None  # one interval left: too few


def test_ours_figures_from_probe_records(tmp_path):
    """Training reads the optimiser steps' times (B units per step after `warmup` steps); dense encoding the marks of
    the passages' batches only, the last passage batch (whose end is not marked) and the queries' left out."""
    steps = tmp_path / "steps"
    steps.mkdir()
    (steps / "11-exit.json").write_text(
        json.dumps({"steps": 5, "step_times": [0, 5, 6, 7, 8], "cuda_peak_bytes": 2**31})
    )
    (steps / "12-exit.json").write_text(json.dumps({"steps": 0, "step_times": []}))  # another process of the run
    f = bgs.ours_figures(steps, {"read": "steps"}, batch=4, warmup=2)
    assert f["rate"] == pytest.approx(4.0) and f["events"] == 5 and f["peak_gib"] == 2.0
    marks = tmp_path / "marks"
    marks.mkdir()
    # 10 passages in batches of 4, 4, 2 (then 3 query texts): intervals of batches 0 and 1
    rows = [[0.0, [4]], [1.0, [4]], [3.0, [2]], [9.0, [3]]]
    (marks / "13-exit.json").write_text(json.dumps({"steps": 0, "step_times": [], "marks": rows}))
    f = bgs.ours_figures(marks, {"read": "marks", "limit": 10}, batch=4, warmup=0)
    assert f["units"] == 8.0 and f["window_s"] == 3.0 and f["peak_gib"] is None


def test_probe_records_step_times_marks_and_no_cuda(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(bench_scale.PROBE)
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import torch\nfrom models.encoding import pad_batch\n"
        "p = torch.nn.Parameter(torch.zeros(3)); o = torch.optim.SGD([p], lr=0.1)\n"
        "for _ in range(3):\n    p.sum().backward(); o.step()\n"
        "pad_batch([[1, 2], [3]], 0); pad_batch([[1]], 0)\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=f"{probe}{os.pathsep}{REPO}",
        BENCH_SCALE_PROBE=str(out),
        BENCH_SCALE_MARK="models.encoding:pad_batch",
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True)
    (exit_record,) = [json.loads(p.read_text()) for p in out.glob("*-exit.json")]
    assert exit_record["steps"] == 3 and len(exit_record["step_times"]) == 3
    assert exit_record["step_times"] == sorted(exit_record["step_times"])
    assert [m[1] for m in exit_record["marks"]] == [[2], [1]]
    assert "cuda_peak_bytes" not in exit_record


def test_summary_rows_and_ratios():
    ok = dict(status="ok", unit="triples")
    measured = [
        {**ok, "task": "colbert-train", "shape": "minilm", "batch": 32, "side": s, "rate_per_s": r, "tflops": 1.0}
        for s, r in (("ours", 90.0), ("bare", 100.0), ("pylate", 45.0))
    ]
    measured.append(
        {"task": "dense-encode", "shape": "minilm", "batch": 32, "side": "ours", "status": "not run: budget",
         "unit": "passages", "rate_per_s": None}
    )  # fmt: skip
    rows = bgs.summary_rows(measured)
    assert rows[0]["ratio"] == 0.9 and rows[0]["ours_pylate"] == 2.0
    assert rows[1]["ours"] == "not run" and "ratio" not in rows[1]
    table = record.markdown_table(rows, bgs.ROW_COLUMNS)
    assert "PyLate GPU busy %" not in table  # no row has a value there: the column is left out


def test_options_errors():
    for bad in (["only=colbert-train,nope"], ["batches=32,x"], ["steps=1"], ["peers=colbertv9"], ["--tiny"]):
        with pytest.raises(SystemExit) as e:
            bgs.parse_args(bad)
        assert e.value.code == 2, bad
    tiny = bgs.parse_args(["tiny=true", "batches=4"])
    assert tiny.batches == "4" and tiny.device == "cpu" and tiny.steps == bgs.TINY["steps"]


@pytest.mark.slow  # a train.py / evaluate.py subprocess each (~20 s on the shared 2-core machine)
@pytest.mark.parametrize("task", ["colbert-train", "dense-encode", "colbert-encode"])
def test_tiny_run_writes_a_record(tmp_path, task):
    """tiny=true of one task (one kind of steady-state reading each), PyLate absent: the record and its TSV hold ours,
    bare and PyLate's `not run` with the command, commit, machine and date."""
    result = bgs.main(
        [
            "tiny=true",
            f"only={task}",
            "batches=4",
            "steps=3",
            "warmup=1",
            f"pylate_python={tmp_path / 'no-venv' / 'bin' / 'python'}",
            "pylate_wheelhouse=null",
            f"work_dir={tmp_path / 'work'}",
            f"record_dir={tmp_path / 'records'}",
        ]
    )
    text, rows = read_dated_record(
        *result["record"], tmp_path / "records", "python -m bench.bench_gpu_speed tiny=true", bgs.TSV_COLUMNS
    )
    by_side = {r["side"]: r for r in rows}
    for side in ("ours", "bare"):
        assert by_side[side]["status"] == "ok" and float(by_side[side]["rate_per_s"]) > 0, by_side[side]
        assert float(by_side[side]["tflops"]) > 0 and float(by_side[side]["window_s"]) > 0
    assert by_side["ours"]["command"].startswith("python train.py" if task.endswith("train") else "python evaluate.py")
    if task == "colbert-train":
        assert by_side["pylate"]["status"].startswith("not run: no PyLate venv")
    else:
        assert "pylate" not in by_side
    assert f"| {task} | minilm | 4 |" in text
