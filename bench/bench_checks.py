"""What issue 48's checks cost inside whole runs: each check function timed where it runs, against the run's wall time.

    python -m bench.bench_checks [runs=default,bm25_cold,bm25_warm] [passages=1000000] [repeats=1] [record=true]

bench_ab.py compares whole runs of two checkouts; on a shared 2-core machine their spread (up to 20 % between
repeats of the default run) hides a 2 % change. This bench measures the checks themselves: each run is the entry
script in a child process whose check functions (`CHECKS`: the file records and digests of core/digests.py, the id
check of every line read, the checkpoint-header and measure checks before loading, the rank watchdog's hooks, the
attempt folder, the lost-best check, the representation cache's key) are wrapped with a timer. Only the outermost
call is counted (a check calling another is not counted twice), so the sum is the time the run spent in them. The
record gives, per run, the wall seconds, the seconds in checks, their ratio and the calls per check.

Runs: `default` is `python train.py` as README.md runs it (fresh output and cache folders, `logger=none`);
`bm25_cold` / `bm25_warm` are bench_ab's 1M-passage BM25 evaluations (a fresh cache, then the cache it left).
A check that this checkout no longer has is an error: the list is kept with the code.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import options, record

REPO = record.REPO
RUNS = ("default", "bm25_cold", "bm25_warm")
CHILD = "BENCH_CHECKS_CHILD"  # the child's result file; set: this process is the child

# module:attribute (a function, or Class.method) of every check issue 48 added to a run's path
CHECKS = (
    "core.digests:file_record",
    "core.digests:record_problem",
    "core.digests:input_digest",
    "core.digests:write_sidecar",
    "core.digests:sidecar_problem",
    "datamodules.textfiles:check_id",
    "pipeline.jobs:check",
    "pipeline.jobs:check_files",
    "pipeline.jobs:check_machine",
    "pipeline.stages:check_outputs",
    "metrics.ir:check_measures",
    "callbacks.checkpoint:lost_best_warning",
    "callbacks.rank_watch:RankWatchCallback.setup",
    "callbacks.rank_watch:RankWatchCallback.teardown",
    "pipeline.stages:attempt_dir",
    "pipeline.stages:begin_attempt",
    "pipeline.head_stage:check_head_stage",
    "models.heads.cache:cache_inputs",
    "analyses.vocab.mlm_head:check_head_source",
)


@dataclass
class Options:
    runs: str = ",".join(RUNS)
    passages: int = 1_000_000  # the BM25 runs' collection (bench/synthetic_msmarco.py)
    repeats: int = 1
    data_dir: str = str(REPO / "bench" / "results" / "scale-data")
    work_dir: str = str(REPO / "bench" / "results" / "checks-work")
    seed: int = 0
    record: bool = True
    timeout: int = 3600


# ---- the child: wrap the checks, run the script ---------------------------------------------------------------------
def _wrap_checks() -> dict[str, dict]:
    """Replace every check by a timed wrapper, in its module and wherever it was imported by name; the totals."""
    totals: dict[str, dict] = {}
    depth = [0]
    for spec in CHECKS:
        module_name, attr = spec.split(":")
        module = importlib.import_module(module_name)
        owner, name = module, attr
        if "." in attr:
            cls_name, name = attr.split(".")
            owner = getattr(module, cls_name)
        original = getattr(owner, name, None)
        if original is None:
            raise SystemExit(f"error: bench_checks: {spec} is not in this checkout; update CHECKS")
        totals[spec] = {"calls": 0, "seconds": 0.0}

        def timed(*args, __f=original, __t=totals[spec], **kwargs):
            if depth[0]:
                return __f(*args, **kwargs)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return __f(*args, **kwargs)
            finally:
                __t["seconds"] += time.perf_counter() - t0
                __t["calls"] += 1
                depth[0] -= 1

        setattr(owner, name, timed)
        if owner is module:  # `from module import check` elsewhere bound the original
            for other in list(sys.modules.values()):
                if other is not None and other is not module and getattr(other, name, None) is original:
                    setattr(other, name, timed)
    return totals


def child(out: Path, argv: list[str]) -> None:
    sys.path.insert(0, str(REPO))
    for m in ("pipeline.cli", "pipeline.run", "pipeline.head_stage", "retrieval.retrieve", "datamodules.datamodule"):
        importlib.import_module(m)  # what the entry scripts import, so that names bound by import are wrapped too
    totals = _wrap_checks()
    sys.argv = list(argv)
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out.write_text(json.dumps({"code": code, "checks": totals}))
    raise SystemExit(code)


# ---- the parent: run each job, gather the record --------------------------------------------------------------------
def run_one(script: str, args: list[str], result: Path, timeout: int) -> tuple[float, dict]:
    env = {**os.environ, CHILD: str(result), "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_checks", script, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result.is_file():
        raise SystemExit(f"error: {script} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return wall, json.loads(result.read_text())["checks"]


def main(argv=None) -> dict:
    from bench.bench_ab import bm25_args
    from bench.synthetic_msmarco import Spec, ensure, files

    opts = options.parse(Options, argv, __doc__)
    runs = [r for r in opts.runs.split(",") if r]
    if not runs or any(r not in RUNS for r in runs):
        options.error(f"runs: expected a comma-separated subset of {list(RUNS)}, got '{opts.runs}'")
    started = record.utc_now()
    work = Path(opts.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    f = None
    if any(r.startswith("bm25") for r in runs):
        folder, _, _ = ensure(opts.data_dir, Spec(passages=opts.passages, seed=opts.seed), log=lambda *a: None)
        f = files(folder)
    rows = []
    for run in runs:
        for k in range(1 if run == "bm25_cold" else opts.repeats):
            out = work / f"{run}-{k}"
            if run == "default":
                script, args = "train.py", [f"output_dir={out}", f"data.cache_dir={work / f'cache-{k}'}", "logger=none"]
            else:
                queries, depth = ("test", 1000) if run == "bm25_cold" else ("other", 1000 - k)
                script, args = "evaluate.py", [*bm25_args(f, work / "bm25-cache", queries, depth), f"output_dir={out}"]
            wall, checks = run_one(script, args, work / f"{run}-{k}.json", opts.timeout)
            spent = sum(c["seconds"] for c in checks.values())
            calls = {k2.split(":")[1]: c["calls"] for k2, c in checks.items() if c["calls"]}
            rows.append(
                {
                    "run": run,
                    "repeat": k,
                    "wall_s": round(wall, 2),
                    "checks_s": round(spent, 4),
                    "share_pct": round(100 * spent / wall, 4),
                    "calls": json.dumps(calls),
                    "by_check": json.dumps(
                        {k2.split(":")[1]: round(c["seconds"], 4) for k2, c in checks.items() if c["calls"]}
                    ),
                }
            )
            print(
                f"bench_checks: {run} #{k}: {wall:.1f} s, checks {spent:.3f} s ({100 * spent / wall:.3f} %)", flush=True
            )
    if opts.record:
        md, _ = record.write_record(
            record.RESULTS,
            "checks-cost",
            "What issue 48's checks cost inside whole runs",
            [
                ("Date", started.date().isoformat()),
                ("Command", f"`{record.relative(record.command_line('bench.bench_checks', argv))}`"),
                ("Commit", record.git_commit()),
                ("Machine", _machine()),
                ("Data", _data_line(runs, opts.passages)),
            ],
            "Seconds inside the checks (bench/bench_checks.py `CHECKS`, outermost calls) against each run's wall "
            "time, imports included.\n\n"
            + record.markdown_table(
                rows,
                [
                    ("run", "run"),
                    ("repeat", "#"),
                    ("wall_s", "wall (s)"),
                    ("checks_s", "in checks (s)"),
                    ("share_pct", "share (%)"),
                    ("by_check", "seconds by check"),
                    ("calls", "calls by check"),
                ],
            ),
            rows,
            ["run", "repeat", "wall_s", "checks_s", "share_pct", "by_check", "calls"],
            started,
        )
        print(f"record: {md}")
    return {"rows": rows}


def _data_line(runs: list[str], passages: int) -> str:
    parts = ["default run: its own synthetic collection"] if "default" in runs else []
    if any(r.startswith("bm25") for r in runs):
        parts.append(f"BM25: {passages:,} synthetic MS MARCO-shaped passages (bench/synthetic_msmarco.py)")
    return "; ".join(parts)


def _machine() -> str:
    from bench.bench_ab import machine_line

    return machine_line()


if __name__ == "__main__":
    if os.environ.get(CHILD):
        child(Path(os.environ.pop(CHILD)), sys.argv[1:])
    else:
        main()
