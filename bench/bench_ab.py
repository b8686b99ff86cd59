"""Wall time of whole runs in two checkouts, interleaved on one machine: did a change make a run slower?

    python -m bench.bench_ab before=<checkout of the earlier commit> [passages=1000000] [repeats=3]
                             [runs=bm25_cold,bm25_warm,default] [data_dir=...] [work_dir=...] [record=true]

Each run is the checkout's own entry script as a subprocess (`cwd` = that checkout, `logger=none`):

- `bm25_cold`: `evaluate.py model=bm25 data=tsv` over `passages` MS MARCO-shaped synthetic passages
  (bench/synthetic_msmarco.py) with the 6,980 test queries, `model.depth=1000`: the document store, the BM25 index
  and the run built from nothing (a fresh `data.cache_dir`), then the evaluation. Once per checkout.
- `bm25_warm`: the same with the caches of `bm25_cold` (the store and index are read and checked, the run is
  recomputed: each repeat ranks the 1,000 `other` queries into a fresh folder, whose run cache it then holds, so the
  next repeat gets another `model.depth`). `repeats` per checkout.
- `default`: `python train.py` as README.md runs it (fresh output and cache folders): the default run. `repeats` per
  checkout, at most 2 by default (each is minutes).

Repeats alternate the checkouts' order (A B, B A, ...), so drift of the machine falls on both. The record gives each
run's median seconds per checkout, after / before, the samples, and whether the runs' `metrics.json` are equal. This
bench is how a change is shown to cost no more than a given fraction of a run (issue 48: at most 2 %).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import options, record
from bench.synthetic_msmarco import Spec, ensure, files
from core.versions import versions_line

REPO = record.REPO
RUNS = ("bm25_cold", "bm25_warm", "default")


@dataclass
class Options:
    before: str = ""  # a checkout (git worktree) of the earlier commit; required
    after: str = str(REPO)  # the checkout measured against it: this one
    passages: int = 1_000_000
    repeats: int = 3
    default_repeats: int = 1
    runs: str = ",".join(RUNS)
    data_dir: str = str(REPO / "bench" / "results" / "scale-data")
    work_dir: str = str(REPO / "bench" / "results" / "ab-work")
    seed: int = 0
    record: bool = True
    timeout: int = 3600  # seconds per run


def commit_of(checkout: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def bm25_args(f: dict[str, Path], cache: Path, queries: str, depth: int) -> list[str]:
    return [
        "model=bm25",
        f"model.depth={depth}",
        "model.split=test",
        "data=tsv",
        f"data.collection={f['collection']}",
        f"data.cache_dir={cache}",
        f"data.test_queries={f[f'queries.{queries}']}",
        f"data.test_qrels={f[f'qrels.{queries}']}",
        "logger=none",
    ]


def timed(checkout: Path, script: str, args: list[str], timeout: int) -> float:
    """Run `python <script> args` in `checkout`; its wall seconds (start-up and imports included)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, script, *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: {checkout}/{script} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return seconds


def main(argv=None) -> dict:
    opts = options.parse(Options, argv, __doc__)
    if not opts.before:
        options.error("before=<checkout of the earlier commit> is required")
    runs = [r for r in opts.runs.split(",") if r]
    if not runs or any(r not in RUNS for r in runs):
        options.error(f"runs: expected a comma-separated subset of {list(RUNS)}, got '{opts.runs}'")
    sides = {"before": Path(opts.before).resolve(), "after": Path(opts.after).resolve()}
    for name, path in sides.items():
        if not (path / "evaluate.py").is_file():
            options.error(f"{name}: '{path}' is not a checkout of this project (no evaluate.py)")
    started = record.utc_now()
    work = Path(opts.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    folder, _, _ = ensure(opts.data_dir, Spec(passages=opts.passages, seed=opts.seed), log=lambda *a: None)
    f = files(folder)
    samples: dict[str, dict[str, list[float]]] = {r: {s: [] for s in sides} for r in runs}
    metrics: dict[str, dict[str, str]] = {r: {} for r in runs}

    def one(run: str, side: str, k: int) -> None:
        checkout, base = sides[side], work / side
        out = base / f"{run}-{k}"
        if run == "default":
            args = [f"output_dir={out}", f"data.cache_dir={base / f'default-cache-{k}'}"]
            seconds = timed(checkout, "train.py", args, opts.timeout)
        else:
            cold = run == "bm25_cold"
            queries, depth = ("test", 1000) if cold else ("other", 1000 - k)
            args = [*bm25_args(f, base / "cache", queries, depth), f"output_dir={out}"]
            seconds = timed(checkout, "evaluate.py", args, opts.timeout)
        samples[run][side].append(round(seconds, 2))
        metrics[run].setdefault(side, (out / "metrics.json").read_text())
        print(f"bench_ab: {run} {side} #{k}: {seconds:.1f} s", flush=True)

    order = list(sides)
    for run in runs:
        n = 1 if run == "bm25_cold" else opts.default_repeats if run == "default" else opts.repeats
        for k in range(n):
            for side in order if k % 2 == 0 else order[::-1]:
                one(run, side, k)
    rows = []
    for run in runs:
        b, a = (statistics.median(samples[run][s]) for s in sides)
        same = metrics[run].get("before") == metrics[run].get("after")
        rows.append({"run": run, "before_s": b, "after_s": a, "ratio": round(a / b, 4), "same_metrics": same})
    result = {
        "started": started.isoformat(timespec="seconds"),
        "before": {"path": str(sides["before"]), "commit": commit_of(sides["before"])},
        "after": {"path": str(sides["after"]), "commit": commit_of(sides["after"])},
        "passages": opts.passages,
        "rows": rows,
        "samples": samples,
    }
    for row in rows:
        print(
            f"{row['run']:>10}: before {row['before_s']:.1f} s, after {row['after_s']:.1f} s, "
            f"after/before {row['ratio']:.3f}, metrics {'equal' if row['same_metrics'] else 'DIFFER'}"
        )
    if opts.record:
        write_record(result, opts, argv)
    return result


def machine_line() -> str:
    from bench.bench_speed import machine_info

    info = machine_info(os.cpu_count() or 1)
    return f"{info['cpu_model']} ({info.get('cpu_family_model', '?')}), {info['logical_cpus']} logical CPUs"


def write_record(result: dict, opts: Options, argv) -> Path:
    md, tsv = record.record_paths(record.RESULTS, "run-time-ab", record.utc_now().date())
    head = ["run", "before_s", "after_s", "ratio", "same_metrics"]
    lines = [
        f"# Whole runs before and after ({result['before']['commit']} vs {result['after']['commit']})",
        "",
        f"- Date: {record.utc_now().date().isoformat()}",
        f"- Command: `{record.relative(record.command_line('bench.bench_ab', argv))}`",
        f"- Commits: before {result['before']['commit']}, after {result['after']['commit']}",
        f"- Machine: {machine_line()}",
        f"- Versions: {versions_line()}",
        f"- Data: {opts.passages:,} synthetic MS MARCO-shaped passages (bench/synthetic_msmarco.py, seed {opts.seed})",
        "",
        "| run | before (s, median) | after (s, median) | after / before | same metrics.json |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {r['run']} | {r['before_s']:.1f} | {r['after_s']:.1f} | {r['ratio']:.3f} | "
            f"{'yes' if r['same_metrics'] else 'no'} |"
            for r in result["rows"]
        ),
        "",
        "Samples (s): " + json.dumps(result["samples"]),
        "",
    ]
    md.write_text("\n".join(lines))
    tsv.write_text("\t".join(head) + "\n" + "".join("\t".join(str(r[h]) for h in head) + "\n" for r in result["rows"]))
    print(f"record: {md}")
    return md


if __name__ == "__main__":
    main()
