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
    assert w["interval_ms"] == {"median": 1000.0, "p90": 1000.0, "max": 1000.0}
    stalls = bgs.steady_window([0.0, 0.01, 0.02, 0.52, 0.53, 0.54], [1] * 5, skip=0)
    assert stalls["interval_ms"] == {"median": 10.0, "p90": 304.0, "max": 500.0}  # gaps 10,10,10,10,500: 10 + 0.6 x 490
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


def test_probe_profiles_the_steps_of_its_window(tmp_path):
    """BENCH_SCALE_CPROFILE=FROM:TO:PATH: cProfile from the end of optimiser step FROM to the end of step TO; a
    function called in each step shows as many calls as the window holds steps, one called before it none."""
    import pstats

    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(bench_scale.PROBE)
    stats = tmp_path / "steps.prof"
    code = (
        "import torch\n"
        "def in_step(): pass\n"
        "def before(): pass\n"
        "p = torch.nn.Parameter(torch.zeros(3)); o = torch.optim.SGD([p], lr=0.1)\n"
        "before()\n"
        "for _ in range(6):\n    in_step(); p.sum().backward(); o.step()\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=f"{probe}{os.pathsep}{REPO}",
        BENCH_SCALE_PROBE=str(tmp_path),
        BENCH_SCALE_CPROFILE=f"2:5:{stats}",
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True)
    calls = {f[2]: v[1] for f, v in pstats.Stats(str(stats)).stats.items() if f[0] == "<string>"}
    assert calls.get("in_step") == 3 and "before" not in calls  # steps 3, 4 and 5


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
    assert bgs.parse_args(["peers="]).peers is None  # no peer (an empty value reads as null)
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


def _wheel(folder, name: str, version: str, source: str) -> None:
    """A pure-Python wheel of one module `name` (its source `source`), written as a zip as pip reads it."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for f, text in files.items():
            z.writestr(f, text)


@pytest.mark.slow  # two pip runs and interpreter starts (~15 s)
def test_pylate_from_a_wheelhouse_runs_this_interpreter_with_its_wheels_first(tmp_path):
    """Without a venv (the GPU machine's python3 is a venv's, so `venv --system-site-packages` would lose its torch):
    every wheel installed with no dependencies into a folder that the interpreter's wrapper puts first on the path,
    ahead of the packages already installed (there PyLate's transformers 5.3 over the machine's 5.17)."""
    house = tmp_path / "house"
    house.mkdir()
    _wheel(house, "pylate", "9.9.9", "__version__ = '9.9.9'\n")
    _wheel(house, "einops", "0.0.1", "__version__ = 'shadowed'\n")  # installed here too: the wheel's must win
    opts = bgs.parse_args([f"pylate_python={tmp_path / 'pylate-python'}", f"pylate_wheelhouse={house}"])
    python, why, installed = bgs.ensure_pylate(opts, tmp_path / "work")
    assert why is None and python == str(tmp_path / "pylate-python"), why
    assert installed == ["einops 0.0.1", "pylate 9.9.9"]
    code = "import einops, pylate, torch; print(einops.__version__, pylate.__version__, torch.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import torch

    assert out == ["shadowed", "9.9.9", torch.__version__]
    # a second run on the same machine reuses the wrapper and names the same wheels (not the interpreter's whole env)
    assert bgs.ensure_pylate(opts, tmp_path / "work") == (python, None, ["einops 0.0.1", "pylate 9.9.9"])
    # a broken wheelhouse: PyLate is recorded as not run, with pip's reason
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "broken-1.0-py3-none-any.whl").write_text("not a zip")
    opts = bgs.parse_args([f"pylate_python={tmp_path / 'other'}", f"pylate_wheelhouse={tmp_path / 'bad'}"])
    python, why, _ = bgs.ensure_pylate(opts, tmp_path / "work2")
    assert python is None and why.startswith(f"installing PyLate from {tmp_path / 'bad'} failed: ")


def test_commit_of_a_copied_working_tree_comes_from_bench_commit(tmp_path, monkeypatch):
    """On the GPU machine no .git travels: the record names the commit bench/gpu_carry.py wrote (BENCH_COMMIT)."""
    monkeypatch.setattr(record, "REPO", tmp_path)
    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    assert record.git_commit() == "unknown (not a git checkout)"
    monkeypatch.setenv("BENCH_COMMIT", "4fb0a5f")
    assert record.git_commit().startswith("4fb0a5f (a copy of the working tree")
    monkeypatch.setattr(record, "REPO", REPO)  # a checkout: its own commit, whatever the variable says
    assert not record.git_commit().startswith("4fb0a5f (a copy")


@pytest.mark.parametrize("task", bgs.TASKS)
def test_ours_overrides_end_every_command_of_ours(task, tmp_path):
    """`ours_overrides` (an A/B of one key on the GPU, e.g. model.length_buckets=1) comes last, so that it wins over
    the bench's own settings, in train.py's and evaluate.py's commands alike."""
    names = ["collection", "queries.train", "qrels.train", "triples", "queries.dev", "qrels.dev"]
    data = {
        "files": {n: tmp_path / n for n in [*names, "queries.test", "qrels.test"]},
        "val_run": tmp_path / "val.run",
        "test_run": tmp_path / "test.run",
        "passages": 10,
    }
    opts = bgs.parse_args(["tiny=true", "ours_overrides=model.length_buckets=1,data.num_workers=2"])
    how = bgs.ours_command(task, "bb", 4, opts, data, tmp_path / "cache", tmp_path / "out")
    assert how["cmd"][-2:] == ["model.length_buckets=1", "data.num_workers=2"]
    assert how["cmd"][0] == ("train.py" if task.endswith("-train") else "evaluate.py")
    plain = bgs.ours_command(task, "bb", 4, bgs.parse_args(["tiny=true"]), data, tmp_path / "cache", tmp_path / "out")
    assert plain["cmd"] == how["cmd"][:-2]
