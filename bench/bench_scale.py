"""Cost of each pipeline stage against collection size: wall time and peak RSS on MS MARCO-shaped synthetic files.

    python -m bench.bench_scale [sizes=100000,1000000,8800000] [stages=store,bm25,train,train_ddp,dense,encode,isotropy]
                                [data_dir=bench/results/scale-data] [work_dir=bench/results/scale-work]
                                [out=bench/results/scale.json] [seed=0] [train_backbone=tiny] [stage_timeout=null] ...

Data: bench/synthetic_msmarco.py writes (or reuses, keyed by size and seed) the `data=tsv` files of each size under
`data_dir`: collection.tsv, 4.5 id triples per passage (39.8M at 8.8M), ~0.057 judged train queries per passage,
1,000 validation queries, 6,980 test queries (as MS MARCO dev small) and 1,000 other test queries. Its time is
reported as stage `data` (`reused` when the files were there).

Every stage run is one subprocess (the repository's train.py / evaluate.py, or a small `python -c` driver calling
the pipeline's public functions), started with `cwd` = the repository, `logger=none`, and one `data.cache_dir` per
size (`<work_dir>/<size>/cache`, emptied when the size starts, so every build is a first build; `keep_cache=true`
keeps it, to rerun some stages against what an earlier run built); stages of a size run in the order below and
share it: without `store`, the first stage that reads the collection builds the store, and without `bm25`, the first
that needs BM25 builds its index. Per size:

- `store/build`, `store/reuse`: `datamodules.sources.load_dataset` of a `TsvConfig` holding only the collection:
  the first load builds the document store (datamodules/docstore.py), the second opens it. `load_s`: the load alone;
  `rows_us_per_id`: `DocStore.rows` over 200,000 sampled ids, against `row_loop_us_per_id`, one `row` call an id
  (20,000 of them), in the same process.
- `bm25/build`: `evaluate.py model=bm25 data=tsv` with the test queries (6,980), `model.depth=1000`,
  `model.split=test` (the split it ranks): the BM25 index build plus the top 1,000 of every query; train and val
  files null, so nothing else is read. `bm25/reuse`: the same with the 1,000 other queries (index reused, new run).
  `mrr_10`, `recall_100` show that BM25 finds the synthetic relevant passages.
- `train/cold`, `train/warm`: `train.py model=colbert` (1 process) for `train_steps` optimiser steps on the given
  triples (`data.negatives=given`), validation and test cut to `train_eval_queries` sampled queries over
  `data.candidate_depth=train_candidate_depth` BM25 candidates, `eval.before_training=false`. Cold is the first run
  of the size after the bm25 stage (it parses the triples into their memory-mapped array and runs BM25 for every
  validation and test query); warm repeats it with every cache filled (`train_warm=false` skips it).
  `train_ddp`: the warm run with `trainer=ddp trainer.accelerator=cpu trainer.devices=2` (the same global batch:
  `data.batch_size` halved per rank). The backbone is a random 2-layer, 32-wide BERT (`train_backbone=tiny`,
  models/rankers/backbone.save_random_bert), so these stages measure data start-up; `minilm` or a path
  gives another.
- `dense` (largest size only): `retrieval.dense.FaissBuilder` (the builder behind DenseIndex.build) fed
  `dense_chunk` L2-normalised random float32 vectors of `dense_dim` (384, MiniLM's width) at a time, one per
  passage, as stand-ins for encodings; then `dense_search_queries` random queries searched for the top `dense_k`.
  `gen_s` (drawing the vectors), `add_s`, `search_s` apart.
- `encode` (smallest size only): `DenseIndex.build` of RepBERT on the packaged all-MiniLM-L6-v2 over the first
  `encode_passages` passages (fp32, batches of 64, all cores): `passages_per_s`.
- `isotropy` (smallest size only): `prep`, one training step of ColBERT on `isotropy_backbone` (default MiniLM)
  to get a checkpoint (its BM25 top `isotropy_depth` of every test query fills the cache for the two runs after
  it); then `evaluate.py ckpt=<it>` on `isotropy_queries` sampled test queries x top `isotropy_depth` with
  `eval.isotropy_paper=true` (`on`) and `false` (`off`), each a whole process: `ratio` = on / off.

What is measured:
- wall: from starting the subprocess to reaping it (s).
- peak RSS: VmHWM (the kernel's resident-set high-water mark: anonymous memory plus the file pages it maps, so a
  memory-mapped store counts in every process that touches it) of every Python process of the stage, read at its
  exit by a `sitecustomize` probe put on PYTHONPATH (`BENCH_SCALE_PROBE`, written under `work_dir`); the stage's
  figure is the largest. DDP ranks are separate processes: each rank's own peak is listed. A process that left no
  probe record (killed) falls back to wait4's ru_maxrss of the stage process (`rss_source`).
- first step (train stages): the probe registers a global `torch.optim` step post-hook (when torch.optim.optimizer
  is imported; no Lightning callback) and records the time each rank finishes its first optimiser step: seconds
  from starting the subprocess, which covers interpreter and library imports, reading the data, BM25 candidates,
  building the model and the step-0 validation. `rss_first_step`: each rank's RssAnon / RssFile then.
  The exit record also holds the time of every optimiser step (`step_times`), CUDA's peak allocated bytes where the
  process used CUDA (`cuda_peak_bytes`) and, with `BENCH_SCALE_MARK=module:function` (or `module:Class.method`),
  the time and first argument's shape of every call of that function (`marks`; bench/bench_gpu_speed.py times
  steady-state batches by them). `BENCH_SCALE_CPROFILE=FROM:TO:PATH` profiles the main thread with cProfile from
  the end of optimiser step FROM to the end of step TO (the steady-state steps alone) into PATH.
- growth: each stage line ends with the cost per added passage against the previous size:
  (wall_b - wall_a) / (N_b - N_a) in microseconds and (peak_b - peak_a) / (N_b - N_a) in bytes.
- others_cores: CPU that other processes used meanwhile (bench_speed.Meter), as in every bench here.

A failing stage prints the tail of its stderr, is recorded with `ok: false`, and the bench goes on. The JSON (`out`,
written atomically after every stage) holds the machine, the settings, every record and the growth table.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import options
from bench.synthetic_msmarco import DATA_DIR, Spec, files

REPO = Path(__file__).resolve().parents[1]
WORK_DIR = REPO / "bench" / "results" / "scale-work"
ALL_STAGES = ("store", "bm25", "train", "train_ddp", "dense", "encode", "isotropy")
RESULT = "BENCH_SCALE_RESULT "  # a driver's last stdout line: this prefix and its JSON
MARKER = ".bench_scale"  # a work folder this bench made (and may empty)
GB = 1e9

# The probe: imported by every Python process of a stage as `sitecustomize` (PYTHONPATH), active only when
# BENCH_SCALE_PROBE names a folder. It writes <pid>-step1.json at the first torch optimiser step and
# <pid>-exit.json at interpreter exit, each with /proc/self/status memory figures.
PROBE = r'''
import atexit, importlib.util, json, os, sys, time

_DIR = os.environ.get("BENCH_SCALE_PROBE")
_MARK = os.environ.get("BENCH_SCALE_MARK")  # "module:function" or "module:Class.method": every call is timed
# "FROM:TO:PATH": cProfile of the main thread from the end of optimiser step FROM to the end of step TO, to PATH
_CPROFILE = os.environ.get("BENCH_SCALE_CPROFILE")
_KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def _status():
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in _KEYS:
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _rank():
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    value = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
    return int(value) if value and value.isdigit() else None


def _cuda_peak():
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return {"cuda_peak_bytes": torch.cuda.max_memory_allocated()}
    except Exception:
        pass
    return {}


def _write(kind, **extra):
    record = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:2], "t": time.time(), "rank": _rank(),
              **_status(), **_cuda_peak(), **extra}
    path = os.path.join(_DIR, "%d-%s.json" % (os.getpid(), kind))
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


_steps = [0]
_step_times = []
_marks = []


_profiler = [None]


def _window_profile(step):
    start, stop, path = _CPROFILE.split(":", 2)
    if step == int(start):
        import cProfile

        _profiler[0] = cProfile.Profile()
        _profiler[0].enable()
    elif step == int(stop) and _profiler[0] is not None:
        _profiler[0].disable()
        _profiler[0].dump_stats(path)
        _profiler[0] = None


def _on_step(optimizer, args, kwargs):
    _steps[0] += 1
    _step_times.append(time.time())
    if _steps[0] == 1:
        _write("step1")
    if _CPROFILE:
        _window_profile(_steps[0])


def _shape(x):
    if hasattr(x, "shape"):
        return list(x.shape)
    if isinstance(x, dict):
        return next((list(v.shape) for v in x.values() if hasattr(v, "shape")), None)
    if isinstance(x, (list, tuple)):
        return [len(x)]
    return None


def _mark(module, attr):
    """Wrap module.attr (a function, or Class.method) to record (time, shape of its first argument) per call."""
    owner, name = module, attr
    if "." in attr:
        cls, name = attr.split(".", 1)
        owner = getattr(module, cls)
    fn = getattr(owner, name)

    def marked(*args, **kwargs):
        rest = args[1:] if owner is not module else args
        _marks.append([time.time(), _shape(rest[0] if rest else next(iter(kwargs.values()), None))])
        return fn(*args, **kwargs)

    setattr(owner, name, marked)


_HOOKS = {"torch.optim.optimizer": lambda m: m.register_optimizer_step_post_hook(_on_step)}
if _MARK:
    _HOOKS[_MARK.split(":", 1)[0]] = lambda m: _mark(m, _MARK.split(":", 1)[1])


class _ImportHook:
    """Runs _HOOKS[name] on module `name` as it is imported: the optimiser step post-hook as torch.optim.optimizer
    is imported, the mark's wrapper as its module is (torch is never imported here)."""

    def find_spec(self, name, path=None, target=None):
        hook = _HOOKS.pop(name, None)
        if hook is None:
            return None
        if not _HOOKS:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                hook(module)

            spec.loader.exec_module = exec_module
        return spec


if _DIR:
    sys.meta_path.insert(0, _ImportHook())
    _pid = os.getpid()
    atexit.register(
        lambda: os.getpid() == _pid
        and _write("exit", steps=_steps[0], step_times=_step_times, **({"marks": _marks} if _MARK else {}))
    )
'''


@dataclass
class Options:
    sizes: str = "100000,1000000,8800000"  # passages, comma-separated
    # keep each size's work folder (its store, BM25 index and triples): rerun some stages against the caches an earlier
    # run built, instead of starting every size from empty caches
    keep_cache: bool = False
    stages: str = ",".join(ALL_STAGES)  # comma-separated, of: store, bm25, train, train_ddp, dense, encode, isotropy
    data_dir: Path = DATA_DIR
    work_dir: Path = WORK_DIR
    out: Path = REPO / "bench" / "results" / "scale.json"
    seed: int = 0
    # the synthetic files (bench/synthetic_msmarco.py)
    triples_per_passage: float = 4.5
    val_queries: int = 1000
    test_queries: int = 6980
    other_queries: int = 1000
    # bm25
    bm25_depth: int = 1000
    # train, train_ddp
    train_backbone: str = "tiny"  # tiny (random 2-layer BERT), minilm, or a model folder
    train_steps: int = 2
    train_batch_size: int = 16  # global: halved per rank under DDP
    train_eval_queries: int = 8
    train_candidate_depth: int = 100
    train_warm: bool = True
    ddp_devices: int = 2
    # dense (largest size), encode and isotropy (smallest size)
    dense_dim: int = 384
    dense_chunk: int = 65536
    dense_index_type: str = field(default="flat", metadata={"choices": ("flat", "hnsw", "ivf", "pq", "ivfpq")})
    dense_search_queries: int = 100
    dense_k: int = 100
    encode_passages: int = 10000
    isotropy_backbone: str = "minilm"
    isotropy_queries: int = 300
    isotropy_depth: int = 100
    stage_timeout: int | None = None  # seconds per subprocess; null: none


# ---- drivers: `python -c` entry points of the measured subprocesses ------------------------------------------
def emit(result: dict) -> None:
    print(RESULT + json.dumps(result), flush=True)


def driver_command(fn: str, **kwargs) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import json, sys; from bench.bench_scale import {fn}; {fn}(**json.loads(sys.argv[1]))",
        json.dumps(kwargs),
    ]


def drive_store(collection: str, cache_dir: str) -> None:
    """Load the collection through the tsv source (builds or opens its document store)."""
    t0 = time.perf_counter()
    from datamodules.sources import load_dataset
    from datamodules.sources.tsv import TsvConfig

    t1 = time.perf_counter()
    ds = load_dataset(TsvConfig(collection=collection, cache_dir=cache_dir), seed=0)
    t2 = time.perf_counter()
    emit(
        {
            "import_s": round(t1 - t0, 3),
            "load_s": round(t2 - t1, 3),
            "docs": len(ds.docs),
            "docs_type": type(ds.docs).__name__,
            **_lookups(ds.docs),
        }
    )


def _lookups(docs, n: int = 200_000, loop: int = 20_000) -> dict:
    """Microseconds per id of `docs.rows` over `n` sampled ids (how a run's candidates are mapped to store rows) and,
    in the same process, of a `row` call per id over the first `loop` of them (the lookup `rows` replaced)."""
    import numpy as np

    if not hasattr(docs, "rows"):
        return {}
    want = np.random.default_rng(0).integers(0, len(docs), min(n, len(docs)))
    ids = [docs.id_at(int(r)) for r in want]
    t = time.perf_counter()
    got = docs.rows(ids)
    vectorised = time.perf_counter() - t
    t = time.perf_counter()
    looped = [docs.row(d) for d in ids[:loop]]
    per_id = time.perf_counter() - t
    assert (got == want).all() and looped == want[:loop].tolist()
    return {
        "rows_us_per_id": round(vectorised / len(ids) * 1e6, 2),
        "row_loop_us_per_id": round(per_id / len(looped) * 1e6, 2),
    }


def drive_dense(n: int, dim: int, chunk: int, index_type: str, seed: int, search_queries: int, k: int) -> None:
    """Random unit vectors, `chunk` at a time, into the project's faiss builder; then a search."""
    import numpy as np

    from retrieval.dense import FaissBuilder, IndexOptions

    rng = np.random.default_rng([seed, 5])

    def unit(m: int):
        x = rng.standard_normal((m, dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    builder = FaissBuilder(IndexOptions.from_kwargs(index_type=index_type))
    gen_s = add_s = 0.0
    for a in range(0, n, chunk):
        t0 = time.perf_counter()
        x = unit(min(chunk, n - a))
        t1 = time.perf_counter()
        builder.add(x)
        gen_s, add_s = gen_s + t1 - t0, add_s + time.perf_counter() - t1
        del x
    t0 = time.perf_counter()
    index, params = builder.finish()
    finish_s = time.perf_counter() - t0
    q = unit(search_queries)
    t0 = time.perf_counter()
    index.search(q, k)
    search_s = time.perf_counter() - t0
    emit(
        {
            "vectors": int(index.ntotal),
            "dim": dim,
            "params": params,
            "gen_s": round(gen_s, 3),
            "add_s": round(add_s, 3),
            "finish_s": round(finish_s, 3),
            "search_s": round(search_s, 4),
            "search_queries": search_queries,
            "k": k,
            "vector_bytes": int(index.ntotal) * dim * 4,
        }
    )


def drive_encode(collection: str, n: int, batch_size: int, seed: int) -> None:
    """Encoding passages/s: DenseIndex.build of RepBERT on all-MiniLM-L6-v2 over the first n passages."""
    import torch

    from models.rankers import build_ranker, ranker_config
    from retrieval.dense import DenseIndex

    docs = {}
    with open(collection, encoding="utf-8") as f:
        for line in f:
            pid, text = line.rstrip("\n").split("\t", 1)
            docs[pid] = text
            if len(docs) == n:
                break
    torch.manual_seed(seed)
    ranker = build_ranker(ranker_config({"name": "repbert", "backbone": "minilm"})).eval()
    t0 = time.perf_counter()
    index = DenseIndex.build(ranker, docs, batch_size=batch_size, precision="fp32", index_type="flat")
    s = time.perf_counter() - t0
    emit(
        {
            "passages": len(docs),
            "seconds": round(s, 3),
            "passages_per_s": round(len(docs) / s, 2),
            "dim": int(index.index.d),
            "threads": torch.get_num_threads(),
            "batch_size": batch_size,
        }
    )


def make_tiny_bert(path: str) -> None:
    from models.rankers.backbone import save_random_bert

    save_random_bert(path, seed=0, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


# ---- running a stage ---------------------------------------------------------------------------------------------
def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _probe_records(folder: Path) -> dict[int, dict]:
    """pid -> {"step1": record, "exit": record} from the probe's files."""
    out: dict[int, dict] = {}
    for p in sorted(folder.glob("*.json")):
        pid, kind = p.stem.split("-", 1)
        try:
            out.setdefault(int(pid), {})[kind] = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
    return out


class Runner:
    def __init__(self, args: Options, result: dict, probe_dir: Path):
        self.args, self.result, self.probe_dir = args, result, probe_dir
        self.previous: dict[tuple[str, str], dict] = {}  # (stage, run) -> its record at the previous size

    def env(self, probe: Path, extra: dict | None = None) -> dict:
        path = os.pathsep.join(p for p in (str(self.probe_dir), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        return {
            **os.environ,
            **(extra or {}),
            "PYTHONPATH": path,
            "BENCH_SCALE_PROBE": str(probe),
            "WANDB_MODE": "disabled",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }

    def run(self, stage: str, run: str, size: int, cmd: list[str], work: Path, after=None, env=None, **extra) -> dict:
        """Run `cmd` as stage `stage`/`run` of `size`, print its line, add its record to the result; `after(rec)`
        adds figures read from the stage's files before the line is printed; `env`: variables added to the stage's
        environment (e.g. BENCH_SCALE_MARK)."""
        from bench.bench_speed import (
            Meter,
        )  # lazy: imports torch, which the drivers' measured processes must not inherit

        name = f"{stage}-{run}"
        probe = work / "probe" / name
        shutil.rmtree(probe, ignore_errors=True)
        probe.mkdir(parents=True)
        for arg in cmd:  # a stage's results folder is its own, never a cache: keep_cache=true reruns into a fresh one
            if arg.startswith("output_dir="):
                shutil.rmtree(arg.split("=", 1)[1], ignore_errors=True)
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out_log, err_log = logs / f"{name}.out", logs / f"{name}.err"
        rec = {"stage": stage, "run": run, "size": size, "command": cmd, "logs": [str(out_log), str(err_log)], **extra}
        timed_out = False
        with open(out_log, "w") as out, open(err_log, "w") as err, Meter() as meter:
            t_start = time.time()
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=self.env(probe, env), stdout=out, stderr=err, start_new_session=True
            )
            deadline = time.monotonic() + self.args.stage_timeout if self.args.stage_timeout else None
            while True:  # reaped here with wait4, for its rusage (the fallback peak RSS)
                pid, status, usage = os.wait4(proc.pid, 0 if deadline is None or timed_out else os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    os.killpg(proc.pid, 9)  # the stage's own process group (start_new_session): its ranks too
                else:
                    time.sleep(0.2)
            proc.returncode = os.waitstatus_to_exitcode(status)
        rec.update(
            wall_s=round(meter.wall, 3),
            others_cores=meter.others_cores,
            returncode=proc.returncode,
            ok=proc.returncode == 0 and not timed_out,
        )
        if timed_out:
            rec["error"] = f"timed out after {self.args.stage_timeout} s"
        elif proc.returncode != 0:
            rec["error"] = _tail(err_log) or _tail(out_log)
        # peak RSS: the probe's VmHWM at exit of every process; per rank for processes that stepped
        procs = _probe_records(probe)
        peaks, ranks = [], []
        for pid, r in procs.items():
            last = r.get("exit") or r.get("step1")
            if last and "VmHWM" in last:
                peaks.append(last["VmHWM"])
            if "step1" in r:
                s1 = r["step1"]
                ranks.append(
                    {
                        "rank": s1.get("rank"),
                        "pid": pid,
                        "peak_rss_gb": round(last["VmHWM"] / GB, 3),
                        "peak_at": "exit" if "exit" in r else "first step",
                        "first_step_s": round(s1["t"] - t_start, 3),
                        "rss_first_step_gb": {k: round(s1.get(k, 0) / GB, 3) for k in ("RssAnon", "RssFile")},
                    }
                )
        if peaks and all("exit" in r for r in procs.values()):
            rec.update(peak_rss_gb=round(max(peaks) / GB, 3), rss_source="VmHWM at exit", processes=len(procs))
        else:
            rec.update(
                peak_rss_gb=round(max([usage.ru_maxrss * 1024, *peaks]) / GB, 3),
                processes=len(procs),
                rss_source="wait4 ru_maxrss (a process left no exit record)",
            )
        if ranks:
            ranks.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0))
            rec["ranks"] = ranks
            rec["first_step_s"] = max(r["first_step_s"] for r in ranks)
        for line in out_log.read_text(errors="replace").splitlines() if out_log.exists() else []:
            if line.startswith(RESULT):
                rec["result"] = json.loads(line[len(RESULT) :])
        if after is not None:
            after(rec)
        self.growth(rec)
        self.result["records"].append(rec)
        print(line_of(rec), flush=True)
        if not rec["ok"]:
            print("  stderr tail:\n    " + rec.get("error", "").replace("\n", "\n    "), flush=True)
        self.save()
        return rec

    def growth(self, rec: dict) -> None:
        key = (rec["stage"], rec["run"])
        prev = self.previous.get(key)
        if rec["ok"] and rec["stage"] != "data":
            if prev is not None and rec["size"] > prev["size"]:
                dn = rec["size"] - prev["size"]
                rec["growth"] = {
                    "vs_size": prev["size"],
                    "wall_us_per_passage": round((rec["wall_s"] - prev["wall_s"]) / dn * 1e6, 3),
                    "rss_bytes_per_passage": round((rec["peak_rss_gb"] - prev["peak_rss_gb"]) * GB / dn, 1),
                }
            self.previous[key] = rec

    def save(self) -> None:
        from core.io import write_json

        write_json(self.args.out, self.result)


def line_of(rec: dict) -> str:
    head = f"{rec['stage'] + '/' + rec['run']:16s} {rec['size']:>11,d} passages"
    if not rec["ok"]:
        return f"{head}  FAILED after {rec['wall_s']:.1f} s (exit {rec['returncode']}; logs {rec['logs'][1]})"
    s = f"{head}  wall {rec['wall_s']:8.1f} s  peak RSS {rec['peak_rss_gb']:6.2f} GB"
    if "first_step_s" in rec:
        s += f"  first step {rec['first_step_s']:.1f} s"
    if len(rec.get("ranks", ())) > 1:
        s += "  ranks " + ", ".join(
            f"r{r['rank']} {r['peak_rss_gb']:.2f} GB / {r['first_step_s']:.1f} s" for r in rec["ranks"]
        )
    res = rec.get("result", {})
    keys = ("reused", "import_s", "load_s", "rows_us_per_id", "row_loop_us_per_id", "mrr_10", "recall_100")
    for key in (*keys, "passages_per_s", "add_s", "search_s"):
        if key in res:
            s += f"  {key} {res[key]}"
    if "growth" in rec:
        g = rec["growth"]
        s += (
            f"  ({g['wall_us_per_passage']:+.2f} us, {g['rss_bytes_per_passage']:+.0f} B per added passage "
            f"vs {g['vs_size']:,d})"
        )
    return s


# ---- the stages --------------------------------------------------------------------------------------------------
def tsv_args(f: dict[str, Path], cache: Path, train: bool, val: bool, test: str = "test") -> list[str]:
    """`data=tsv` overrides: the collection, the `test` query set as test split, and the train / val files if asked.

    An evaluation asks for neither: evaluate.py reads the test split alone and refuses the others' keys.
    """
    a = [
        "data=tsv",
        f"data.collection={f['collection']}",
        f"data.cache_dir={cache}",
        f"data.test_queries={f[f'queries.{test}']}",
        f"data.test_qrels={f[f'qrels.{test}']}",
    ]
    if train:
        a += [
            f"data.train_queries={f['queries.train']}",
            f"data.train_qrels={f['qrels.train']}",
            f"data.train_triples={f['triples']}",
            "data.triples_format=ids",
            "data.negatives=given",
        ]
    if val:
        a += [f"data.val_queries={f['queries.dev']}", f"data.val_qrels={f['qrels.dev']}"]
    return a


def _metrics(folder: Path) -> dict:
    try:
        return json.loads((folder / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


def _bm25_figures(out: Path):
    def after(rec: dict) -> None:
        m = _metrics(out)
        rec.setdefault("result", {}).update({k: round(m[k], 4) for k in ("mrr_10", "recall_100") if k in m})
        rec["result"].update({k: m["bm25"][k] for k in ("k", "docs", "queries") if k in m.get("bm25", {})})

    return after


def backbone_arg(name: str, tiny: Path) -> str:
    return str(tiny) if name == "tiny" else name


def train_command(
    args: Options,
    f: dict,
    cache: Path,
    out: Path,
    backbone: str,
    ddp: bool,
    steps: int,
    eval_queries: int,
    depth: int,
    extra: tuple[str, ...] = (),
) -> list[str]:
    per_rank = max(1, args.train_batch_size // args.ddp_devices) if ddp else args.train_batch_size
    cmd = [
        sys.executable,
        "train.py",
        "model=colbert",
        f"model.backbone={backbone}",
        *tsv_args(f, cache, True, True),
        f"data.batch_size={per_rank}",
        f"data.max_eval_queries={eval_queries}",
        f"data.candidate_depth={depth}",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",  # one validation of the trained model, at its last step
        "trainer.enable_progress_bar=false",
        "eval.before_training=false",
        "logger=none",
        f"seed={args.seed}",
        f"output_dir={out}",
        *extra,
    ]
    if ddp:
        cmd += ["trainer=ddp", "trainer.accelerator=cpu", f"trainer.devices={args.ddp_devices}"]
    return cmd


def run_size(runner: Runner, args: Options, size: int, stages: list[str], first: bool, last: bool, tiny: Path) -> None:
    work = args.work_dir / str(size)
    if work.exists():
        if not (work / MARKER).exists():
            raise SystemExit(
                f"error: work folder {work} exists and was not made by this bench; choose another work_dir"
            )
        if not args.keep_cache:
            shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by bench/bench_scale.py; emptied when the size runs again\n")
    cache = work / "cache"
    spec = Spec(
        passages=size,
        seed=args.seed,
        triples_per_passage=args.triples_per_passage,
        val_queries=args.val_queries,
        test_queries=args.test_queries,
        other_queries=args.other_queries,
    )
    folder = args.data_dir / spec.folder_name()
    gen = [
        sys.executable,
        "-m",
        "bench.synthetic_msmarco",
        f"passages={size}",
        f"seed={args.seed}",
        f"triples_per_passage={args.triples_per_passage}",
        f"val_queries={args.val_queries}",
        f"test_queries={args.test_queries}",
        f"other_queries={args.other_queries}",
        f"data_dir={args.data_dir}",
    ]
    rec = runner.run(
        "data",
        "generate",
        size,
        gen,
        work,
        folder=str(folder),
        after=lambda r: r.update(result=_last_json(Path(r["logs"][0]))),
    )
    if not rec["ok"]:
        print(f"  no data for {size} passages: skipping its stages", flush=True)
        return
    f = {k: str(v) for k, v in files(folder).items()}

    if "store" in stages:
        for run in ("build", "reuse"):
            runner.run(
                "store",
                run,
                size,
                driver_command("drive_store", collection=f["collection"], cache_dir=str(cache)),
                work,
            )
    if "bm25" in stages:
        for run, qset in (("build", "test"), ("reuse", "other")):
            out = work / f"bm25-{qset}"
            cmd = [
                sys.executable,
                "evaluate.py",
                "model=bm25",
                f"model.depth={args.bm25_depth}",
                "model.split=test",
                *tsv_args(f, cache, False, False, qset),
                "logger=none",
                f"output_dir={out}",
                f"seed={args.seed}",
            ]
            runner.run("bm25", run, size, cmd, work, after=_bm25_figures(out), queries=qset)
    backbone = backbone_arg(args.train_backbone, tiny)
    train_runs = [("train", "cold", False), ("train", "warm", False)] if "train" in stages else []
    if train_runs and not args.train_warm:
        train_runs = train_runs[:1]
    if "train_ddp" in stages:
        train_runs.append(("train_ddp", f"{args.ddp_devices}proc", True))
    for stage, run, ddp in train_runs:
        # the test after training is not what these stages measure: no isotropy protocol, no ATS there
        cmd = train_command(
            args,
            f,
            cache,
            work / f"{stage}-{run}",
            backbone,
            ddp,
            args.train_steps,
            args.train_eval_queries,
            args.train_candidate_depth,
            ("eval.isotropy_paper=false", "eval.ats_passages=0"),
        )
        runner.run(stage, run, size, cmd, work, backbone=backbone, steps=args.train_steps)
    if "dense" in stages and last:
        cmd = driver_command(
            "drive_dense",
            n=size,
            dim=args.dense_dim,
            chunk=args.dense_chunk,
            index_type=args.dense_index_type,
            seed=args.seed,
            search_queries=args.dense_search_queries,
            k=args.dense_k,
        )
        runner.run("dense", args.dense_index_type, size, cmd, work)
    if "encode" in stages and first:
        cmd = driver_command(
            "drive_encode", collection=f["collection"], n=args.encode_passages, batch_size=64, seed=args.seed
        )
        runner.run("encode", "minilm", size, cmd, work)
    if "isotropy" in stages and first:
        isotropy(runner, args, size, f, cache, work, backbone_arg(args.isotropy_backbone, tiny))


def _isotropy_figures(out: Path):
    def after(rec: dict) -> None:
        m = _metrics(out)
        rec.setdefault("result", {}).update(
            isotropy_paper_batches=m.get("isotropy_paper_batches"), ndcg_cut_10=m.get("ndcg_cut_10")
        )

    return after


def isotropy(runner: Runner, args: Options, size: int, f: dict, cache: Path, work: Path, backbone: str) -> None:
    prep_out = work / "isotropy-ckpt"
    cmd = train_command(
        args,
        f,
        cache,
        prep_out,
        backbone,
        False,
        1,
        2,
        args.isotropy_depth,
        ("eval.isotropy_paper=false", "eval.ats_passages=0"),
    )
    prep = runner.run("isotropy", "prep", size, cmd, work, backbone=backbone)
    ckpt = prep_out / "checkpoints" / "last.ckpt"
    walls = {}
    for run, flag in (("on", "true"), ("off", "false")):
        out = work / f"isotropy-{run}"
        cmd = [
            sys.executable,
            "evaluate.py",
            f"ckpt={ckpt}",
            *tsv_args(f, cache, False, False),
            f"data.max_eval_queries={args.isotropy_queries}",
            f"data.candidate_depth={args.isotropy_depth}",
            f"eval.isotropy_paper={flag}",
            "logger=none",
            f"output_dir={out}",
            f"seed={args.seed}",
        ]
        if not prep["ok"]:
            print(f"  isotropy/{run}: skipped, no checkpoint (prep failed)", flush=True)
            runner.result["records"].append(
                {"stage": "isotropy", "run": run, "size": size, "ok": False, "error": "no checkpoint: prep failed"}
            )
            continue
        rec = runner.run(
            "isotropy",
            run,
            size,
            cmd,
            work,
            after=_isotropy_figures(out),
            queries=args.isotropy_queries,
            depth=args.isotropy_depth,
            backbone=backbone,
        )
        if rec["ok"]:
            walls[run] = rec["wall_s"]
    if len(walls) == 2:
        ratio = {
            "stage": "isotropy",
            "run": "ratio",
            "size": size,
            "ok": True,
            "on_s": walls["on"],
            "off_s": walls["off"],
            "ratio": round(walls["on"] / walls["off"], 3),
            "extra_s": round(walls["on"] - walls["off"], 3),
        }
        runner.result["records"].append(ratio)
        print(
            f"{'isotropy/ratio':16s} {size:>11,d} passages  eval.isotropy_paper=true / false: {ratio['ratio']:.3f} "
            f"({walls['on']:.1f} s / {walls['off']:.1f} s, +{ratio['extra_s']:.1f} s)",
            flush=True,
        )
    runner.save()


def _last_json(path: Path) -> dict:
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


# ---- main --------------------------------------------------------------------------------------------------------
def machine() -> dict:
    from bench.bench_speed import machine_info

    info = machine_info(os.cpu_count() or 1)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem_total_gb"] = round(int(line.split()[1]) * 1024 / GB, 1)
    except OSError:
        pass
    return info


def parse_list(value: str, what: str, allowed=None) -> list[str]:
    items = [s.strip() for s in str(value).split(",") if s.strip()]
    bad = [s for s in items if allowed is not None and s not in allowed]
    if bad or not items:
        options.error(
            f"key '{what}': got {value!r}; expected a comma-separated list"
            + (f" of {list(allowed)}" if allowed else "")
        )
    return items


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)
    try:
        sizes = sorted({int(s.replace("_", "")) for s in parse_list(args.sizes, "sizes")})
    except ValueError:
        options.error(f"key 'sizes': got {args.sizes!r}; expected passage counts such as 100000,1000000")
    if sizes[0] < 2:
        options.error("key 'sizes': every size must be at least 2 passages")
    stages = parse_list(args.stages, "stages", ALL_STAGES)
    args.work_dir, args.data_dir, args.out = args.work_dir.resolve(), args.data_dir.resolve(), args.out.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    probe_dir = args.work_dir / "probe"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    result = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sizes": sizes,
        "stages": stages,
        "records": [],
    }
    runner = Runner(args, result, probe_dir)
    print(f"bench_scale: sizes {sizes}, stages {stages}, JSON {args.out}", flush=True)
    tiny = args.work_dir / "tiny-bert"
    if "tiny" in (args.train_backbone, args.isotropy_backbone) and not (tiny / "config.json").exists():
        subprocess.run(driver_command("make_tiny_bert", path=str(tiny)), cwd=REPO, check=True, capture_output=True)
    for i, size in enumerate(sizes):
        run_size(runner, args, size, stages, first=i == 0, last=i == len(sizes) - 1, tiny=tiny)
    result["growth"] = [
        {"stage": r["stage"], "run": r["run"], "size": r["size"], **r["growth"]}
        for r in result["records"]
        if "growth" in r
    ]
    result["failed"] = [f"{r['stage']}/{r['run']}@{r['size']}" for r in result["records"] if not r.get("ok")]
    runner.save()
    print(
        f"wrote {args.out}" + (f"; failed: {', '.join(result['failed'])}" if result["failed"] else "; every stage ran"),
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
