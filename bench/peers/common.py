"""What every benchmark driver shares (stdlib + torch only: each peer's driver runs in that peer's own venv).

A driver is `python -m bench.peers.<driver> SPEC.json OUT.json`, run from the repository root by bench/bench_peers.py
(a peer's with the python of its venv: importing `bench` and `bench.peers` needs only the standard library). SPEC
names one task, the precision, the thread count, the backbone directory and the data file; the driver times that
task and writes {"times": [seconds per unit of work], "units": texts per timed unit, "peak_rss_mib": ..., ...} to OUT.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time

import torch


def load_spec() -> tuple[dict, dict, str]:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.loads(open(spec_path, encoding="utf-8").read())
    data = json.loads(open(spec["data"], encoding="utf-8").read())

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec.get("seed", 0))
    return spec, data, out_path


def autocast(precision: str, device: str = "cpu"):
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def timed(fn, items, warmup: int) -> tuple[list[float], list]:
    """Run fn(item) for every item; the first `warmup` calls are not timed. Returns (times, fn's results)."""
    times, outs = [], []
    for i, item in enumerate(items):
        t0 = time.perf_counter()
        outs.append(fn(item))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times, outs


def write(out_path: str, result: dict) -> None:
    result["peak_rss_mib"] = peak_rss_mib()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        result["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, out_path)


def time_rerank(score, data: dict, spec: dict) -> dict:
    """Times score(query, candidate texts) once per re-ranking query: {"times", "units": 1 query}."""
    items = [(q, [data["passages_pool"][j] for j in cands]) for q, cands in data["rerank"]]
    return {"times": timed(lambda item: score(*item), items, spec["warmup"])[0], "units": 1}


def scores_by_query(lists: dict, per_query: list[dict]) -> dict[str, list[float]]:
    """The quality task's answer: {qid: [score of each candidate in the lists' order]}, from one {candidate index:
    score} dict per query (in the lists' query order); a candidate the tool did not score is an error."""
    out = {}
    for qid, cands, got in zip(lists["qids"], lists["candidates"], per_query, strict=True):
        missing = [j for j in cands if j not in got]
        if missing:
            raise ValueError(f"query {qid}: no score for {len(missing)} of its {len(cands)} candidates")
        out[qid] = [float(got[j]) for j in cands]
    return out
