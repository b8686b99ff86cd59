"""GPU check: train.py and evaluate.py on CUDA against the same runs on the CPU of the same machine, in one run.

    python -m bench.bench_gpu [rankers=colbert,repbert,bert_dot,bert_cat,tk,dgre] [heads=whitening,nice,glow]
                              [steps=20] [backbone=random] [tokenizer=minilm] [device=cuda] [workers=4]
                              [overrides=key=value,...] [work_dir=outputs/bench-gpu] [out=bench/results/gpu.json]

The unit tests pin trainer.accelerator=cpu, so this is where the pipeline's CUDA paths run. Everything is on the
seeded synthetic collection (no files needed). `backbone=random` builds a seeded random BERT of MiniLM's shape
(6 layers, 384 dims) without dropout, so that the CPU and CUDA runs compute the same function; any other value is a
model directory or a backbone name. Per ranker:

1. `train`: train.py in fp32 on the CPU and on `device`, same seed. The test metrics differ only by float rounding
   carried through `steps` optimiser steps (and by dropout, where a ranker has its own).
2. `eval`: evaluate.py of the CPU run's tested checkpoint on `device`: the same weights on another device, so its
   metrics must equal the CPU run's to float32 rounding (the closest parity this check has).
3. `bf16`: train.py on `device` with bf16-mixed, as the grids run: its nDCG@10, the metrics that are not finite
   (none expected), and its wall time.

Then each head (`train.py stage=head` on the CPU ColBERT checkpoint, on both devices) and dense retrieval
(`evaluate.py retrieval=dense` on the CPU RepBERT checkpoint, `retrieval.device` cpu and `device`). A comparison
reports the largest |difference| over the numeric keys that both metrics.json files hold (nested ones dotted). Runs go
`workers` at a time, so the wall times are those of a shared machine: they show where time goes, not a speed-up.
With `device=cpu` every job runs twice on the CPU: a dry run of the check on a machine without a GPU, whose
comparisons show how far two identical CPU runs agree.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench import options
from core.io import write_json
from models.rankers.backbone import save_random_bert
from pipeline.config import compose
from pipeline.jobs import applied, select

REPO = Path(__file__).resolve().parents[1]
RANKERS = ["colbert", "repbert", "bert_dot", "bert_cat", "tk", "dgre"]
HEADS = ["whitening", "nice", "glow"]


@dataclass
class Options:
    rankers: str = ",".join(RANKERS)
    heads: str = ",".join(HEADS)
    steps: int = 20
    backbone: str = "random"
    tokenizer: str = "minilm"
    device: str = "cuda"
    workers: int = 4
    overrides: str = ""  # comma-separated key=value added to every run, e.g. data.num_test_queries=30
    work_dir: str = "outputs/bench-gpu"
    out: str = "bench/results/gpu.json"


def random_backbone(path: Path, tokenizer: str) -> str:
    """A seeded random BERT of all-MiniLM-L6-v2's shape, dropout off, with that model's tokenizer."""
    if not (path / "config.json").exists():
        save_random_bert(
            path,
            tokenizer=tokenizer,
            hidden_size=384,
            num_hidden_layers=6,
            num_attention_heads=12,
            intermediate_size=1536,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    return str(path)


def flat_numbers(obj, prefix: str = "") -> dict[str, float]:
    """metrics.json's numeric leaves, nested keys dotted (`before_head.iw`); booleans and strings left out."""
    out: dict[str, float] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_numbers(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def compare(a: dict, b: dict) -> dict:
    """The largest |a - b| over the numeric keys both hold, which key it is, and keys not finite in either."""
    fa, fb = flat_numbers(a), flat_numbers(b)
    shared = sorted(set(fa) & set(fb) - {"best_step", "wall_s"})
    diffs = {k: abs(fa[k] - fb[k]) for k in shared if math.isfinite(fa[k]) and math.isfinite(fb[k])}
    worst = max(diffs, key=diffs.get) if diffs else None
    return {
        "keys": len(shared),
        "max_abs_diff": diffs.get(worst),
        "worst_key": worst,
        "ndcg_cut_10": [fa.get("ndcg_cut_10"), fb.get("ndcg_cut_10")],
        "not_finite": sorted(k for k in shared if not (math.isfinite(fa[k]) and math.isfinite(fb[k]))),
    }


def check_bf16(metrics: dict) -> dict:
    """A bf16-mixed run's verdict: its nDCG@10 and the metrics that are not finite (a bf16 overflow shows here)."""
    flat = flat_numbers(metrics)
    return {
        "ndcg_cut_10": flat.get("ndcg_cut_10"),
        "not_finite": sorted(k for k, v in flat.items() if not math.isfinite(v)),
    }


class Runner:
    def __init__(self, work: Path, opts: Options):
        self.work, self.opts = work, opts
        self.jobs: dict[str, dict] = {}

    def run(self, name: str, script: str, device: str, *overrides: str) -> dict | None:
        """One train.py / evaluate.py subprocess into work/<name>; its metrics.json, or None when it failed."""
        out = self.work / name
        shutil.rmtree(out, ignore_errors=True)  # the bench's own folder: a run refuses an output_dir holding one
        accel = "cpu" if device == "cpu" else "gpu"
        args = [
            "logger=none",
            "trainer.enable_progress_bar=false",
            f"trainer.accelerator={accel}",
            f"output_dir={out}",
            *overrides,
        ]
        cfg = compose(args)
        cmd = [sys.executable, script, *applied(args, select(cfg, script), cfg)]  # what its job reads
        env = dict(os.environ, WANDB_MODE="disabled", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # the CPU jobs share the cores; a GPU job needs a core or two to feed its device
        cpu_threads = max(1, (os.cpu_count() or 2) // self.opts.workers)
        env["OMP_NUM_THREADS"] = str(cpu_threads if device == "cpu" else min(2, cpu_threads))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall = round(time.perf_counter() - t0, 1)
        metrics_path = out / "metrics.json"
        ok = proc.returncode == 0 and metrics_path.exists()
        self.jobs[name] = {"command": " ".join(cmd[1:]), "rc": proc.returncode, "wall_s": wall}
        print(f"{name:32s} {'ok' if ok else 'FAILED rc=' + str(proc.returncode):12s} {wall:7.1f} s", flush=True)
        if not ok:
            self.jobs[name]["stderr_tail"] = proc.stderr[-2000:]
            print("    " + "\n    ".join(proc.stderr.strip().splitlines()[-12:]), flush=True)
        return json.loads(metrics_path.read_text()) if ok else None


def tested_checkpoint(run_dir: Path, metrics: dict) -> Path:
    best = run_dir / "checkpoints" / f"best-{metrics.get('best_step')}.ckpt"
    return best if best.exists() else run_dir / "checkpoints" / "last.ckpt"


def main(argv: list[str] | None = None) -> dict:
    opts = options.parse(Options, argv, __doc__)
    import torch

    if opts.device != "cpu" and not torch.cuda.is_available():
        options.error(f"device={opts.device}: torch sees no CUDA device here; device=cpu runs the check on the CPU")
    work = (REPO / opts.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    backbone = random_backbone(work / "backbone", opts.tokenizer) if opts.backbone == "random" else opts.backbone
    rankers = [r for r in opts.rankers.split(",") if r]
    heads = [h for h in opts.heads.split(",") if h]
    dev = opts.device
    tag = dev if dev != "cpu" else "cpu2"  # device=cpu: a second CPU run, which must repeat the first exactly
    # evaluate.py takes eval.* and data.* from its command line, not from the checkpoint
    evaluation = ["eval.ats_passages=16", *(o for o in opts.overrides.split(",") if o)]
    base = [
        f"model.backbone={backbone}",
        f"trainer.max_steps={opts.steps}",
        f"trainer.val_check_interval={opts.steps}",
        "eval.before_training=false",
        *evaluation,
    ]
    head_args = {
        "whitening": [],
        "nice": ["head.epochs=1", "head.max_train_texts=200"],
        "glow": ["head.epochs=1", "head.max_train_texts=200"],
    }
    runner = Runner(work, opts)
    comparisons: dict[str, dict] = {}

    lock = threading.RLock()  # the comparisons and the partial JSON, written from the pool's threads

    def compared(name: str, a: dict, b: dict) -> None:
        with lock:
            comparisons[name] = c = compare(a, b)
            write_json(REPO / opts.out, {"options": vars(opts), "partial": True, "comparisons": comparisons})
        print(
            f"  {name}: {c['keys']} keys, max |diff| {c['max_abs_diff']} ({c['worst_key']})"
            + (f", NOT FINITE: {c['not_finite']}" if c["not_finite"] else ""),
            flush=True,
        )

    def ranker_chain(r: str) -> None:
        cpu = runner.run(f"{r}-train-cpu", "train.py", "cpu", f"model={r}", *base)
        compare_training(r)
        if cpu is None:
            return
        ckpt = tested_checkpoint(work / f"{r}-train-cpu", cpu)
        ev = runner.run(f"{r}-eval-{tag}", "evaluate.py", dev, f"ckpt={ckpt}", *evaluation)
        if ev is not None:
            compared(f"{r} eval: cpu checkpoint, cpu vs {dev}", cpu, ev)
        if r == "colbert":
            with ThreadPoolExecutor(max_workers=2) as pool:
                list(pool.map(lambda h: head_pair(h, ckpt), heads))
        if r == "repbert":
            dense = ["retrieval=dense", f"ckpt={ckpt}", "retrieval.k=100", *evaluation]
            a = runner.run("repbert-dense-cpu", "evaluate.py", "cpu", *dense, "retrieval.device=cpu")
            b = runner.run(f"repbert-dense-{tag}", "evaluate.py", dev, *dense, f"retrieval.device={dev}")
            if a is not None and b is not None:
                compared(f"repbert dense retrieval: cpu vs {dev}", a, b)

    def head_pair(h: str, ckpt: Path) -> None:
        args = ["stage=head", f"ckpt={ckpt}", f"head={h}", *head_args[h], *evaluation]
        a = runner.run(f"colbert-{h}-cpu", "train.py", "cpu", *args)
        b = runner.run(f"colbert-{h}-{tag}", "train.py", dev, *args)
        if a is not None and b is not None:
            compared(f"colbert {h} head: cpu vs {dev}", a, b)

    def compare_training(r: str) -> None:
        """Called by both train runs of a ranker as each ends: the second to end compares them."""
        a, b = (work / f"{r}-train-{d}" / "metrics.json" for d in ("cpu", tag))
        with lock:
            name = f"{r} train: cpu vs {dev}"
            if name not in comparisons and a.exists() and b.exists():
                compared(name, json.loads(a.read_text()), json.loads(b.read_text()))

    bf16: dict[str, dict] = {}

    def device_runs(r: str) -> None:
        runner.run(f"{r}-train-{tag}", "train.py", dev, f"model={r}", *base)
        compare_training(r)
        m = runner.run(f"{r}-bf16-{tag}", "train.py", dev, f"model={r}", *base, "trainer.precision=bf16-mixed")
        if m is not None:
            with lock:
                bf16[r] = check_bf16(m)
            print(
                f"  {r} bf16-mixed on {dev}: nDCG@10 {bf16[r]['ndcg_cut_10']}"
                + (f", NOT FINITE: {bf16[r]['not_finite']}" if bf16[r]["not_finite"] else ", every metric finite"),
                flush=True,
            )

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=opts.workers) as pool:
        for future in [pool.submit(f, r) for r in rankers for f in (ranker_chain, device_runs)]:
            future.result()
    failed = sorted(n for n, j in runner.jobs.items() if j["rc"] != 0)
    result = {
        "options": vars(opts),
        "device_name": torch.cuda.get_device_name() if dev != "cpu" else "cpu",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "failed": failed,
        "comparisons": comparisons,
        "bf16": bf16,
        "jobs": runner.jobs,
    }
    write_json(REPO / opts.out, result)
    print(f"\n{'comparison':52s} {'keys':>4s} {'max |diff|':>10s}  worst key / nDCG@10 a, b")
    for name, c in comparisons.items():
        diff = "n/a" if c["max_abs_diff"] is None else f"{c['max_abs_diff']:.2e}"
        print(
            f"{name:52s} {c['keys']:4d} {diff:>10s}  {c['worst_key']} / {c['ndcg_cut_10']}"
            + (f"  NOT FINITE: {c['not_finite']}" if c["not_finite"] else "")
        )
    for r, b in bf16.items():
        print(
            f"bf16-mixed {r:8s} nDCG@10 {b['ndcg_cut_10']}"
            + (f"  NOT FINITE: {b['not_finite']}" if b["not_finite"] else "")
        )
    print(f"failed: {failed or 'none'}; {len(runner.jobs)} runs in {result['wall_s']} s -> {opts.out}")
    return result


if __name__ == "__main__":
    main()
