"""GPU speed: train.py and evaluate.py against a bare PyTorch loop of the same model, loss, optimiser and shapes, and
PyLate's ColBERT training step, on the GPU at hand (issue 47, item 6).

    python -m bench.bench_gpu_speed [only=colbert-train,repbert-train,bertcat-train,dense-encode,colbert-encode]
                                    [shapes=minilm,bert-base] [batches=32,256] [steps=50] [warmup=10]
                                    [passages=100000] [budget_s=540] [peers=pylate] [pylate_wheelhouse=null]
                                    [ours_overrides=key=value,...] [profile=simple] [record_dir=results]
                                    [work_dir=outputs/bench-gpu-speed]
    python -m bench.bench_gpu_speed tiny=true      # every task at toy sizes on the CPU (~2-3 min); record to /tmp

Configurations: each task (below) x shape x batch. Shapes are random BERTs built on the machine from a BertConfig
(models/rankers/backbone.save_random_bert, the all-MiniLM-L6-v2 tokenizer; no weights travel): `minilm` (6
layers, 384 wide, 12 heads, FFN 1536) and `bert-base` (12, 768, 12, 3072), BERT's default dropout 0.1. Query 32 /
passage 180 tokens at most (model.query_max_len / doc_max_len), bf16 autocast on CUDA (fp32 on the CPU: `precision`).
Data: a synthetic MS MARCO-shaped collection (bench/synthetic_msmarco.py: `passages` passages, 4.5 id triples per
passage, each judged query with one relevant passage) in the `data=tsv` layout, given id triples
(`data.negatives=given`), candidate lists as given TREC runs (no BM25), validation off
(`trainer.limit_val_batches=0`), the isotropy protocol and ATS off.

Tasks; "ours" is a subprocess of the entry script (its command is in the JSON and the record):
- `colbert-train`, `repbert-train`, `bertcat-train`: `python train.py model=<colbert|repbert|bert_cat>
  trainer.precision=bf16-mixed trainer.max_steps=warmup+steps data.batch_size=B data.num_workers=<data_workers>
  ...`; unit: triples (query, positive, negative). The loss is the module's: ColBERT MaxSim and RepBERT
  mean-pool cosine (temperature 0.05) scores of every query against every passage of the batch, cross-entropy with
  in-batch negatives; BERT_CAT cross-entropy over (positive, negative). AdamW (fused), gradient clipping at 1.0.
  After the timed steps train.py saves last.ckpt and tests a 4-query sample: outside the timed window.
- `dense-encode`: `python evaluate.py retrieval=dense model=repbert retrieval.device=cuda retrieval.precision=bf16
  retrieval.batch_size=B retrieval.k=10`: the whole collection encoded (retrieval/encode.py), indexed (faiss flat),
  searched for the test queries; unit: passages.
- `colbert-encode`: `python evaluate.py model=colbert data.eval_batch_size=B trainer.precision=bf16-mixed`: the
  re-ranking test of `rerank_queries` queries x `candidates` given candidates, each candidate passage encoded once
  in chunks of B passages (DocChunkDataset) and MaxSim-scored against its query; unit: passages. Nothing in this
  loop reads a value back per chunk, so the CPU may run a chunk or two ahead of the GPU: over the 60-300 timed chunks
  of the default sizes that overstates the rate by a few per cent at most.

Steady state, ours: the subprocess carries bench/bench_scale.py's probe (a `sitecustomize` on PYTHONPATH, nothing
changed in the pipeline): the time of every optimiser step (a global torch.optim step post-hook) for the training
tasks; for the encoding tasks the time of every call of `models.encoding.pad_batch` (dense: once per batch of
passages, before its forward) or `RankingModule.test_step` (re-ranking: once per chunk). The first `warmup`
steps (or batches) are dropped; the rate is the units of the rest over the time they span, so imports, data
loading, model building, DataLoader workers' start, checkpointing and the test after training are all outside it.
A training step of ours does not wait for the GPU (docs/performance.md, no host sync), but the host cannot run more
than about a step ahead of it: each step reads the previous step's non-finite flags (core/host_reads.py), and a
dense batch's vectors are copied to the host a batch later; the marks of `pad_batch` come from the thread that pads
up to 2 batches ahead. Such a lead is the same at both ends of a steady window, so over its 50 steps (or hundreds of
batches) the rate is the GPU's to within a step.

Bare: an in-process loop, no Lightning, no DataLoader: the backbone loaded as the pipeline loads it
(models.rankers.backbone.load_backbone), random token ids generated on the device beforehand with the data's lengths
(below), autocast bf16, the same loss (models.rankers.maxsim.maxsim_all, masked mean, cosine, cross-entropy),
`torch.optim.AdamW(fused=True)` at lr 5e-5, weight decay 0.01, `clip_grad_norm_(1.0)`; `warmup` steps, then
`steps` timed between two `torch.cuda.synchronize()`. Bare encoding: forward, pooling (RepBERT:
the vectors copied to the host, as an index needs them) or normalisation (ColBERT), no scoring.

Shapes of the bare batches (`bare_lengths`): `data` (default): each text's length drawn from the token lengths of the
synthetic texts (a tokenised sample of `length_sample` passages and queries), padded to the batch's longest, as a
plain loop pads; ours pads the same way (model.length_buckets=auto is one block on a GPU; on the CPU, tiny=true, 4
length groups, which pad less). `max`: every query 32 and every passage 180 tokens (the upper bound).

Figures per configuration: units/s of ours and bare and their ratio; TFLOP/s: the useful FLOPs of a unit (forward
FLOPs of BERT's matrices per real token plus attention, bench_peers.forward_flops, averaged over the sampled
lengths: padding not counted, the same for ours and bare; training x3) times the rate; GPU busy %: the mean of
`nvidia-smi --query-gpu=utilization.gpu -lms 100` samples (or pynvml) within the timed window (the driver's own
sampling period is 1/6 to 1 s, so short windows read coarsely); peak GPU memory: `torch.cuda.max_memory_allocated`
(ours: the probe's reading at the subprocess's exit, which covers everything it ran).

PyLate peer (`peers=pylate`): bench/peers/pylate_driver.py's colbert_train on the GPU (PyLate 1.6.0's ColBERT, its
Contrastive loss with in-batch negatives, the optimiser its trainer builds by default: fused AdamW, weight decay
0, no clipping, where ours clips at 1.0; queries padded with [MASK] to 32 and passages to 180 tokens, as its
collator does; tokenisation inside the timed step; its own 384/768 -> 128 projection), at the same batch, shape
and precision, on the same backbone folder and the synthetic triples' texts. It runs with its own interpreter
(`pylate_python`, default bench_peers' /work/venvs/pylate). A missing one or a failing import is recorded as
`not run: <why>`, never a failure. On a machine without internet, carry a wheelhouse (`python -m bench.gpu_carry`
makes one, .gpu/pylate-wheelhouse) and give `pylate_wheelhouse=<folder>`: the bench then installs every wheel of it
offline (`pip install --no-index --no-deps --target`) into a folder that a wrapper script puts first on this
interpreter's path (the machine's torch, with its CUDA, stays visible; `ensure_pylate`), and the record lists what
it installed.

On the lent GPU machine (no internet, its own torch and transformers): `python -m bench.gpu_carry` here prepares
.gpu/ (the project's packages that machine lacks as wheels, PyLate's wheelhouse, the MiniLM tokenizer, the commit),
and `bash bench/gpu_session.sh [key=value ...]` there installs them and runs this bench into $OUT (docs/performance.md).
`tokenizer`: the tokenizer of the random backbones (a folder or a backbone name; default MiniLM's, from the
`minilm` wheel). `carried`: a folder of wheels installed beyond the machine's packages, listed in the record.

`budget_s`: configurations start only while the run's elapsed time is under it (shapes and batches in the given
order, minilm first); the rest are recorded as not run. The record goes to `record_dir` (results/ by default;
`tiny=true`: /tmp/bench-gpu-speed) as `<date>-gpu-speed.md` + `.tsv`; the JSON with every subprocess's probe
figures to `<work_dir>/gpu-speed.json`.

`tiny=true` (for a CPU): every task on a 1-layer, 32-wide BERT in fp32, batches 4 and 8, 6 timed steps after 2,
2,000 passages, no DataLoader workers, one CPU thread per process (each unset key takes its tiny value; keys given on
the command line win). About 2 minutes on a quiet 2-core CPU (4-5 minutes on this project's CPU shared with other
jobs); its figures only show that every path runs.

Time on an H200 (2026-11-29, results/2026-11-29-gpu-speed-h200.md): a configuration of ours takes 23-91 s of wall
time (imports, CUDA, data, a first step of 18-60 s, checkpointing and the test after training; the timed steps are
seconds); `only=colbert-train,dense-encode budget_s=450` ran 6 of its 8 configurations and 3
of PyLate's 4 in 489 s, so the bar's grid takes two commands. A configuration starts only under `budget_s`, and its
subprocess (and PyLate's) is stopped 2 minutes past it, so `budget_s=450` ends inside a 10-minute limit; the other
tasks go in another command (docs/performance.md: the lent machine's sessions).

`profile=simple|advanced|pytorch` runs ours under Lightning's profiler (`trainer.profiler`; not dense-encode, which
has no trainer), `profile=cprofile` under cProfile (the main thread, whose host work a GPU waits for: for training
the timed steps alone, started and stopped by the probe's optimiser-step hook, `BENCH_SCALE_CPROFILE`; for encoding
the whole process, `python -m cProfile`; its overhead slows the run, so its rate is no figure), and appends each
run's report, condensed
(`profile_report`, `cprofile_report`), to `gpu-speed-profiles.txt` beside the record: where the host's time goes.
`profile=pyspy` samples ours from outside with py-spy (`py-spy record --idle --threads --subprocesses --nonblocking`,
200 Hz; the binary on PATH or in a `bin/` beside a PYTHONPATH folder, where bench/gpu_session.sh installs the carried
wheel): every thread and the DataLoader workers, waiting or not, without stopping the process; `pyspy_report`
condenses it: the main thread's frames while it trains or encodes (samples under `PYSPY_INSIDE`'s frame), then each
other thread and process of the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench import options, record
from bench.bench_peers import TOOLS, forward_flops, run_driver
from bench.bench_scale import Options as ScaleOptions
from bench.bench_scale import Runner, _probe_records, parse_list, tsv_args
from bench.bench_speed import Meter, machine_info
from bench.synthetic_msmarco import Spec, ensure, files

REPO = Path(__file__).resolve().parents[1]
TASKS = ("colbert-train", "repbert-train", "bertcat-train", "dense-encode", "colbert-encode")
MODEL = {
    "colbert-train": "colbert",
    "repbert-train": "repbert",
    "bertcat-train": "bert_cat",
    "dense-encode": "repbert",
    "colbert-encode": "colbert",
}
SHAPES = {
    "minilm": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
}
TINY_SHAPES = {  # the toy stand-ins of tiny=true
    "minilm": dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64),
    "bert-base": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128),
}
QUERY_MAX_LEN, DOC_MAX_LEN = 32, 180
GIB = 2**30
LIGHTNING_PROFILERS = ("simple", "advanced", "pytorch")  # trainer.profiler


@dataclass
class Options:
    only: str = ",".join(TASKS)  # comma-separated tasks
    shapes: str = "minilm,bert-base"
    batches: str = "32,256"
    steps: int = 50  # timed optimiser steps (training) or batches (bare encoding)
    warmup: int = 10  # steps / batches before the timed ones
    passages: int = 100_000
    rerank_queries: int = 100  # colbert-encode: test queries ...
    candidates: int = 200  # ... x given candidates each (~20k distinct passages: 78 chunks of 256)
    length_sample: int = 4000  # texts tokenised for the lengths of the bare batches and the FLOP counts
    bare_lengths: str = dataclasses.field(default="data", metadata={"choices": ("data", "max")})
    device: str = "auto"  # auto: cuda when torch sees one, else cpu
    precision: str = dataclasses.field(default="auto", metadata={"choices": ("auto", "bf16", "fp32")})
    data_workers: int = 4  # ours: data.num_workers
    ours_overrides: str = ""  # comma-separated key=value added to every command of ours (an A/B of one key)
    # ours under Lightning's profiler (trainer.profiler: training and colbert-encode; dense-encode has no trainer) or
    # cProfile (every task, the main thread): each run's report, condensed, into <record_dir or
    # work_dir>/gpu-speed-profiles.txt as it finishes
    profile: str | None = dataclasses.field(
        default=None, metadata={"choices": (None, *LIGHTNING_PROFILERS, "cprofile", "pyspy")}
    )
    cpu_threads: int | None = None  # torch / OpenMP threads of every process; null: their defaults (tiny: 1)
    budget_s: float = 540.0
    peers: str | None = "pylate"  # comma-separated, or empty (`peers=`: none)
    pylate_python: str | None = None  # null: bench_peers' venv if there, else <work_dir>/pylate-python
    pylate_wheelhouse: str | None = ".gpu/pylate-wheelhouse"  # makes a missing pylate_python offline, if it exists
    tokenizer: str = "minilm"  # the random backbones' tokenizer: a folder or a backbone name
    carried: str | None = None  # a folder of wheels installed beyond the machine's packages (listed in the record)
    tiny: bool = False
    seed: int = 0
    work_dir: str = "outputs/bench-gpu-speed"
    data_dir: str | None = None  # null: <work_dir>/data
    record_dir: str | None = None  # null: results/ (tiny: /tmp/bench-gpu-speed)


TINY = dict(
    shapes="minilm",
    batches="4,8",
    steps=6,
    warmup=2,
    passages=2000,
    rerank_queries=10,
    candidates=20,
    length_sample=500,
    data_workers=0,
    cpu_threads=1,
    device="cpu",
    work_dir="/tmp/bench-gpu-speed/work",
    record_dir="/tmp/bench-gpu-speed",
)


def parse_args(argv: list[str] | None = None) -> Options:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    opts = options.parse(Options, argv, __doc__)
    if opts.tiny:
        given = {a.split("=", 1)[0] for a in argv}
        for key, value in TINY.items():
            if key not in given:
                setattr(opts, key, value)
    parse_list(opts.only, "only", TASKS)
    parse_list(opts.shapes, "shapes", SHAPES)
    if any(not b.isdigit() or int(b) < 2 for b in parse_list(opts.batches, "batches")):
        options.error(f"key 'batches': got {opts.batches!r}; expected batch sizes >= 2, e.g. 32,256")
    if opts.steps < 2 or opts.warmup < 1:
        options.error("steps must be >= 2 and warmup >= 1 (the first step is never timed)")
    if opts.peers and set(parse_list(opts.peers, "peers", ("pylate",))) - {"pylate"}:
        options.error("key 'peers': only pylate")
    return opts


# ---- GPU busy ----------------------------------------------------------------------------------------------------
class GpuSampler:
    """Samples of GPU utilisation (%) every `period_ms`, stamped with time.time(), for the whole run: nvidia-smi in a
    background process, else pynvml polled by a thread, else none (`source` says which)."""

    def __init__(self, index: int = 0, period_ms: int = 100):
        self.index, self.period_ms = index, period_ms
        self.samples: list[tuple[float, float]] = []
        self.source: str | None = None
        self._proc = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", "-i", str(self.index), "--query-gpu=utilization.gpu"]
            cmd += ["--format=csv,noheader,nounits", "-lms", str(self.period_ms)]
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read_smi, daemon=True)
            self.source = "nvidia-smi -lms " + str(self.period_ms)
        else:
            try:
                import pynvml  # lazy: optional, only where the machine has it

                pynvml.nvmlInit()
                handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            except Exception:
                return self
            self._thread = threading.Thread(target=self._poll_nvml, args=(pynvml, handle), daemon=True)
            self.source = f"pynvml every {self.period_ms} ms"
        self._thread.start()
        return self

    def _read_smi(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append((time.time(), float(line.strip().split(",")[0])))
            except ValueError:
                continue

    def _poll_nvml(self, pynvml, handle) -> None:
        while not self._stop.wait(self.period_ms / 1000):
            self.samples.append((time.time(), float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)))

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def busy(self, t0: float | None, t1: float | None) -> float | None:
        """Mean utilisation of the samples in [t0, t1]; None with fewer than 2 (or no sampler)."""
        if t0 is None or t1 is None:
            return None
        vals = [v for t, v in list(self.samples) if t0 <= t <= t1]
        return round(statistics.fmean(vals), 1) if len(vals) >= 2 else None


# ---- data --------------------------------------------------------------------------------------------------------
def candidate_run(qrels: dict, n_docs: int, depth: int, seed: int) -> dict[str, dict[str, float]]:
    """Each judged query's relevant passages then random others, `depth` in all, as a TREC run (scores descending)."""
    rng = np.random.default_rng([seed, 47])
    run = {}
    for qid, judged in qrels.items():
        docs = list(dict.fromkeys([d for d, g in judged.items() if g > 0]))
        while len(docs) < min(depth, n_docs):
            docs.extend(str(d) for d in rng.integers(0, n_docs, depth) if str(d) not in docs)
            docs = list(dict.fromkeys(docs))[:depth]
        run[qid] = {d: float(depth - i) for i, d in enumerate(docs)}
    return run


def prepare_data(
    work: Path, passages: int, seed: int, test_queries: int, candidates: int, data_dir: str | None = None
) -> dict:
    """The synthetic files (in `data_dir`, default <work>/data), given candidate runs (validation: 10 per query,
    test: `candidates` per query), and the texts PyLate and the length sample need."""
    from datamodules.textfiles import read_id_text_tsv, read_trec_qrels
    from metrics.trec import write_trec_run

    spec = Spec(passages=passages, seed=seed, val_queries=20, test_queries=test_queries, other_queries=1)
    folder, manifest, reused = ensure(Path(data_dir) if data_dir else work / "data", spec, log=lambda *_: None)
    f = {k: str(v) for k, v in files(folder).items()}
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for split, qset, depth in (("val", "dev", 10), ("test", "test", candidates)):
        run = candidate_run(read_trec_qrels(Path(f[f"qrels.{qset}"])), passages, depth, seed)
        write_trec_run(runs / f"run.{split}.trec", run, "bench")
    docs = read_id_text_tsv(Path(f["collection"]), "collection")
    queries = read_id_text_tsv(Path(f["queries.train"]), "queries")
    return {
        "folder": str(folder),
        "reused": reused,
        "files": f,
        "val_run": str(runs / "run.val.trec"),
        "test_run": str(runs / "run.test.trec"),
        "docs": docs,
        "queries": queries,
        "passages": manifest["passages"],
        "triples": manifest["triples"],
    }


def data_args(data: dict, cache: Path, train: bool, test_run: bool = True) -> list[str]:
    """`data=tsv` overrides of the synthetic files: with `train`, the triples and the validation run too; with
    `test_run`, the test split's candidates are the given run (no BM25)."""
    args = tsv_args({k: Path(v) for k, v in data["files"].items()}, cache, train, train)
    if train:
        args.append(f"data.val_run={data['val_run']}")
    return args + ([f"data.test_run={data['test_run']}"] if test_run else [])


def triple_texts(data: dict, n: int) -> list[tuple[str, str, str]]:
    """The first n given triples as texts (query, positive, negative)."""
    out = []
    with open(data["files"]["triples"], encoding="utf-8") as fh:
        for line in fh:
            q, p, neg = line.split()
            out.append((data["queries"][q], data["docs"][p], data["docs"][neg]))
            if len(out) == n:
                break
    return out


def token_lengths(tokenizer, data: dict, n: int, seed: int) -> dict[str, np.ndarray]:
    """Token lengths (special tokens included, truncated as the rankers truncate) of a seeded sample of the
    collection's passages and the train queries; `pair`: a cross-encoder's input, as PairTokenizer._cross builds it."""
    rng = np.random.default_rng([seed, 48])
    docs, queries = list(data["docs"].values()), list(data["queries"].values())
    d = [docs[i] for i in rng.choice(len(docs), min(n, len(docs)), replace=False)]
    q = [queries[i] for i in rng.choice(len(queries), min(n, len(d)), replace=len(queries) < min(n, len(d)))]
    dl = np.array([len(x) for x in tokenizer(d, truncation=True, max_length=DOC_MAX_LEN)["input_ids"]])
    ql = np.array([len(x) for x in tokenizer(q, truncation=True, max_length=QUERY_MAX_LEN)["input_ids"]])
    pair = np.minimum(ql[: len(dl)] - 2 + dl[: len(ql)] + 1, QUERY_MAX_LEN + DOC_MAX_LEN + 3)
    return {"query": ql, "doc": dl, "pair": pair}


def unit_flops(shape: dict, task: str, lengths: dict[str, np.ndarray]) -> float:
    """Useful FLOPs of one unit (a training triple, an encoded passage) at the sampled real lengths."""

    def mean_forward(side: str) -> float:
        ls, counts = np.unique(lengths[side], return_counts=True)
        return float(sum(c * forward_flops(shape, int(n)) for n, c in zip(ls, counts)) / counts.sum())

    if task == "bertcat-train":
        return 3 * 2 * mean_forward("pair")
    if task.endswith("-train"):
        return 3 * (mean_forward("query") + 2 * mean_forward("doc"))
    return mean_forward("doc")


# ---- ours: train.py / evaluate.py subprocesses -------------------------------------------------------------------
def ours_command(task: str, backbone: str, batch: int, opts: Options, data: dict, cache: Path, out: Path) -> dict:
    """The entry-script command of a configuration, the probe's mark, and how its steady state is read."""
    gpu = opts.device.startswith("cuda")
    extra = [a for a in opts.ours_overrides.split(",") if a]  # last: they win
    common = [
        f"model={MODEL[task]}",
        f"model.backbone={backbone}",
        f"model.query_max_len={QUERY_MAX_LEN}",
        f"model.doc_max_len={DOC_MAX_LEN}",
        "logger=none",
        f"seed={opts.seed}",
        f"output_dir={out}",
    ]
    lightning = [
        f"trainer.accelerator={'gpu' if gpu else 'cpu'}",
        "trainer.devices=1",
        f"trainer.precision={'bf16-mixed' if opts.precision == 'bf16' else '32-true'}",
        "trainer.enable_progress_bar=false",
        "eval.isotropy_paper=false",
        "eval.ats_passages=0",
        f"data.num_workers={opts.data_workers}",
        *([f"trainer.profiler={opts.profile}"] if opts.profile in LIGHTNING_PROFILERS else []),
    ]
    if task.endswith("-train"):
        cmd = [
            "train.py",
            *common,
            *data_args(data, cache, train=True),
            f"data.batch_size={batch}",
            "data.max_eval_queries=4",
            f"trainer.max_steps={opts.warmup + opts.steps}",
            "trainer.limit_val_batches=0",
            "eval.before_training=false",
            *lightning,
        ]
        return {"cmd": cmd + extra, "mark": None, "read": "steps"}
    if task == "dense-encode":
        cmd = [
            "evaluate.py",
            "retrieval=dense",
            *common,
            *data_args(data, cache, train=False, test_run=False),
            f"retrieval.device={opts.device}",
            f"retrieval.precision={opts.precision}",
            f"retrieval.batch_size={batch}",
            "retrieval.k=10",
        ]
        return {"cmd": cmd + extra, "mark": "models.encoding:pad_batch", "read": "marks", "limit": data["passages"]}
    cmd = [
        "evaluate.py",
        *common,
        *data_args(data, cache, train=False),
        f"data.eval_batch_size={batch}",
        *lightning,
    ]
    return {"cmd": cmd + extra, "mark": "lightning_modules.module:RankingModule.test_step", "read": "marks"}


def steady_window(times: list[float], units: list[float], skip: int) -> dict | None:
    """Rate over the intervals after the first `skip`: interval i runs from times[i] to times[i + 1] and does
    units[i] units. None when fewer than 2 intervals remain."""
    if len(times) - 1 - skip < 2:
        return None
    t0, t1 = times[skip], times[-1]
    done = float(sum(units[skip : len(times) - 1]))
    # the intervals' spread: steps of even length (a steady cost in each) or short ones with stalls (a periodic cost)
    gaps = 1000 * np.diff(np.asarray(times[skip:], dtype=np.float64))
    spread = {k: round(float(v), 2) for k, v in zip(("median", "p90", "max"), np.percentile(gaps, [50, 90, 100]))}
    return {
        "t0": t0,
        "t1": t1,
        "window_s": round(t1 - t0, 4),
        "units": done,
        "rate": done / (t1 - t0),
        "interval_ms": spread,
    }


def ours_figures(probe: Path, how: dict, batch: int, warmup: int) -> dict:
    """Steady-state rate, window and peak GPU memory of one subprocess from its probe records."""
    procs = [r["exit"] for r in _probe_records(probe).values() if "exit" in r]
    if not procs:
        return {"error": "no probe record (the process did not exit normally)"}
    main = max(procs, key=lambda r: (r.get("steps", 0), len(r.get("marks", ()))))
    if how["read"] == "steps":
        times = main.get("step_times", [])
        win = steady_window(times, [batch] * max(0, len(times) - 1), warmup - 1)
        events = len(times)
    else:
        marks = [m for m in main.get("marks", []) if m[1]]
        times, rows = [m[0] for m in marks], [m[1][0] for m in marks]
        if "limit" in how:  # the passages' batches only: the test queries' follow them
            # batches 0..n hold the passages; batch n's end is not marked (indexing and the queries follow), so the
            # intervals are those of batches 0..n-1
            n = int(np.searchsorted(np.cumsum(rows), how["limit"]))
            times, rows = times[: n + 1], rows[: n + 1]
        win = steady_window(times, rows, warmup)
        events = len(times)
    peak = main.get("cuda_peak_bytes")
    return {
        **(win or {"error": f"too few timed events ({events}) for warmup {warmup}"}),
        "events": events,
        "peak_gib": round(peak / GIB, 2) if peak else None,
    }


def profiles_file(opts: Options, work: Path) -> Path:
    """Where `profile=` puts the runs' reports: beside the record (record_dir), else in the work folder."""
    return Path(opts.record_dir or work) / "gpu-speed-profiles.txt"


def profile_report(run_dir: Path, rows: int = 40) -> str | None:
    """The Lightning profiler's report of `run_dir` (an attempt's folder too), condensed; None when it wrote none.

    The fit stage's where the run trained (the test's report repeats the fit's actions: one profiler serves both),
    else the test's. The simple profiler's table becomes `total s  calls  mean ms  action` lines by total time (its
    rows are padded to ~300 characters); other reports give their first `rows` lines as they are.
    """
    row = re.compile(r"^\|\s+(.+?)\s+\|\s+([-\d.e]+)\s+\|\s+(\d+)\s+\|\s+([\d.e]+)\s+\|\s+([\d.e]+)\s+\|")
    out = []
    reports = sorted(run_dir.rglob("profile/*-profile*.txt"), key=lambda f: f.stat().st_mtime)
    for report in [f for f in reports if f.name.startswith("fit-")] or reports:
        text = report.read_text(errors="replace")
        found = [m.groups() for m in map(row.match, text.splitlines()) if m and m.group(2) != "-"]
        out.append(f"-- {report.name}")
        if not found:
            out += text.splitlines()[:rows]
            continue
        found.sort(key=lambda g: -float(g[3]))
        out.append(f"{'total s':>9} {'calls':>6} {'mean ms':>9}  action")
        for name, mean, calls, total, _ in found[:rows]:
            name = re.sub(r"\{.*\}", "", name)  # a callback's state dict (ModelCheckpoint's) is no part of its name
            out.append(f"{float(total):9.3f} {int(calls):6d} {1000 * float(mean):9.2f}  {name}")
    return "\n".join(out) or None


def cprofile_report(stats: Path, rows: int = 30) -> str:
    """The main thread's functions of a cProfile file: the `rows` with the most own time, then the `rows` with the
    most time including what they call (pstats' tables), then the project's own functions (the repository's, not
    bench/'s) by time including what they call, which a whole process's start-up (imports) does not crowd out."""
    import io
    import pstats

    out = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(str(stats), stream=out).strip_dirs().sort_stats(key).print_stats(rows)
    root, skip = f"{REPO}{os.sep}", f"{REPO / 'bench'}{os.sep}"
    own = sorted(
        (
            (cum, tot, calls, f"{os.path.relpath(file, REPO)}:{line}({func})")
            for (file, line, func), (_, calls, tot, cum, _) in pstats.Stats(str(stats)).stats.items()
            if file.startswith(root) and not file.startswith(skip)
        ),
        reverse=True,
    )[:rows]
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    lines += [f"-- the project's functions by time including what they call ({len(own)} of the most)"]
    lines += [f"{'cum s':>9} {'own s':>9} {'calls':>8}  function"]
    lines += [f"{cum:9.3f} {tot:9.3f} {calls:8d}  {name}" for cum, tot, calls, name in own]
    return "\n".join(lines)


# the frame of the main thread's steady work (function, file): the training loop's step, or the encoding loop
PYSPY_INSIDE = {
    "steps": ("advance", "loops/training_epoch_loop.py"),
    "marks": ("encode_batches", "models/encoding.py"),
}
PYSPY_RATE = 200  # samples a second


def pyspy_binary() -> str | None:
    """The py-spy executable that runs: in a `bin/` inside a PYTHONPATH folder (where pip --target put the carried
    wheel's), else on PATH (a pyenv shim there may stand for no installed py-spy: each is tried)."""
    folders = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
    for candidate in [*(str(Path(f) / "bin" / "py-spy") for f in folders), shutil.which("py-spy")]:
        if candidate and os.access(candidate, os.X_OK):
            try:
                ok = subprocess.run([candidate, "--version"], capture_output=True, timeout=30).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                return candidate
    return None


_PROCESS = re.compile(r"process (\d+):")
_THREAD = re.compile(r"thread \((\d+)\)(?:: (.*))?")


def _pyspy_sample(line: str) -> tuple[int, bool, str, list[str], int] | None:
    """(depth of processes, main thread?, thread name, Python frames, samples) of a line of py-spy's raw output.

    A line is `process PID:"cmd";[process ...;]thread (TID)[: NAME];frame;...;frame COUNT`; the main thread is the
    one whose id is its process' (Linux). None for a line that is not such.
    """
    stack, _, count = line.rstrip().rpartition(" ")
    if not stack or not count.isdigit():
        return None
    frames = stack.split(";")
    pids = [m.group(1) for m in map(_PROCESS.match, frames) if m]
    rest = frames[len(pids) :]
    main, name = False, "?"
    if rest and (t := _THREAD.match(rest[0])):
        main = bool(pids) and t.group(1) == pids[-1]
        name = t.group(2) or ("MainThread" if main else f"thread {t.group(1)}")
        rest = rest[1:]
    return len(pids), main, name, rest, int(count)


def pyspy_report(raw: Path, inside: tuple[str, str], rows: int = 25) -> str | None:
    """Condense py-spy's raw samples: the main thread while under the frame `inside` (function, file): its innermost
    frames by samples, then every frame on those stacks (a frame's share includes what it calls); then every other
    thread and process of the run, whole.

    The samples include waiting (`--idle`): a main thread that waits for the loader or a copy shows the waiting frame.
    """
    samples = [x for x in map(_pyspy_sample, raw.read_text(errors="replace").splitlines()) if x]
    if not samples:
        return None
    top = min(depth for depth, *_ in samples)  # the run's own process: the shortest chain of process frames
    func, file = inside

    def is_inside(frame: str) -> bool:  # `Class.func (path/file.py:line)` or `func (path/file.py:line)`
        name, _, where = frame.partition(" (")
        return (name == func or name.endswith(f".{func}")) and file in where

    leaf, incl, others, other_leaf = Counter(), Counter(), Counter(), {}
    total = outside = 0
    for depth, main, name, frames, n in samples:
        if depth == top and main:
            if any(map(is_inside, frames)):
                total += n
                leaf[frames[-1] if frames else "?"] += n
                for f in set(frames):
                    incl[f] += n
            else:
                outside += n
            continue
        where = name if depth == top else "child processes (DataLoader workers)"
        others[where] += n
        other_leaf.setdefault(where, Counter())[frames[-1] if frames else "(no Python frame)"] += n
    out = [
        f"-- main thread under {func} ({file}): {total} samples ({total / PYSPY_RATE:.1f} s; "
        f"{outside / PYSPY_RATE:.1f} s outside it), innermost frames"
    ]
    out += [f"{n:7d} {100 * n / max(total, 1):5.1f} %  {f}" for f, n in leaf.most_common(rows)]
    out += ["-- the same samples by every frame on their stack but the trunk all share (a frame's share includes what"]
    out[-1] += " it calls)"
    branches = Counter({f: n for f, n in incl.items() if n < total})
    out += [f"{n:7d} {100 * n / max(total, 1):5.1f} %  {f}" for f, n in branches.most_common(rows)]
    out += ["-- other threads and processes, the whole run (samples; their 5 innermost frames)"]
    for where, n in others.most_common():
        frames = ", ".join(f"{f} {k}" for f, k in other_leaf[where].most_common(5))
        out.append(f"{n:7d}  {where}: {frames}")
    return "\n".join(out)


def run_ours(
    runner: Runner, task: str, shape: str, batch: int, how: dict, work: Path, opts: Options, passages: int
) -> dict:
    stats = work / "probe" / f"cprofile-{task}-{shape}-b{batch}.out"
    stats.unlink(missing_ok=True)
    env = {"BENCH_SCALE_MARK": how["mark"]} if how["mark"] else {}
    # training: the timed steps alone (the probe's optimiser-step hook); other tasks: the whole process
    windowed = opts.profile == "cprofile" and how["read"] == "steps"
    if windowed:
        env["BENCH_SCALE_CPROFILE"] = f"{opts.warmup}:{opts.warmup + opts.steps}:{stats}"
    profiled = ["-m", "cProfile", "-o", str(stats)] if opts.profile == "cprofile" and not windowed else []
    cmd = [sys.executable, *profiled, *how["cmd"]]
    raw = work / "probe" / f"pyspy-{task}-{shape}-b{batch}.txt"
    raw.unlink(missing_ok=True)
    spy = pyspy_binary() if opts.profile == "pyspy" else None
    if spy:
        cmd = [spy, "record", "--idle", "--threads", "--subprocesses", "--nonblocking", "--rate", str(PYSPY_RATE)]
        cmd += ["--format", "raw", "-o", str(raw), "--", sys.executable, *how["cmd"]]
    if opts.cpu_threads:
        env["OMP_NUM_THREADS"] = str(opts.cpu_threads)
    rec = runner.run(task, f"{shape}-b{batch}", passages, cmd, work, env=env)
    figs = ours_figures(work / "probe" / f"{task}-{shape}-b{batch}", how, batch, opts.warmup)
    if opts.profile:
        if opts.profile == "cprofile":
            report = cprofile_report(stats) if stats.exists() else None
        elif opts.profile == "pyspy":
            report = (
                pyspy_report(raw, PYSPY_INSIDE[how["read"]])
                if raw.exists()
                else (
                    "py-spy not found (PATH, or bin/ in a PYTHONPATH folder)" if spy is None else "py-spy wrote nothing"
                )
            )
        else:
            report = profile_report(Path(next(a for a in how["cmd"] if a.startswith("output_dir=")).split("=", 1)[1]))
        if report:
            extra = f", {opts.ours_overrides}" if opts.ours_overrides else ""
            what = f"trainer.profiler={opts.profile}"
            if opts.profile == "cprofile":
                steps = f"optimiser steps {opts.warmup + 1}-{opts.warmup + opts.steps}"
                what = f"cProfile of the main thread, {steps if windowed else 'the whole process'}"
            elif opts.profile == "pyspy":
                what = f"py-spy samples at {PYSPY_RATE} Hz, waiting included"
            head = f"== {task} {shape} b{batch}: {what}{extra}"
            print(head + "\n" + "\n".join(report.splitlines()[:14]), flush=True)
            with open(profiles_file(opts, work), "a") as f:
                f.write(f"{head}\n{report}\n\n")
    if not rec["ok"]:
        figs["error"] = rec.get("error", "failed")[-600:]
    return {
        **figs,
        "wall_s": rec["wall_s"],
        "others_cores": rec.get("others_cores"),
        "command": record.relative(" ".join(["python", *how["cmd"]])),
    }


# ---- bare: the same model, loss and optimiser in a plain loop ----------------------------------------------------
def random_batch(lengths: np.ndarray, n: int, rng, vocab: int, device, fixed: int | None) -> tuple:
    """n random-id texts with lengths drawn from `lengths` (or all `fixed` long), padded to the longest."""
    ls = np.full(n, fixed) if fixed else rng.choice(lengths, n)
    width = int(ls.max())
    ids = torch.from_numpy(rng.integers(1000, vocab, (n, width))).to(device)
    mask = (torch.arange(width)[None, :] < torch.from_numpy(ls)[:, None]).long().to(device)
    return ids, mask


def bare_autocast(device: torch.device, precision: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(task: str, backbone: str, batch: int, opts: Options, lengths: dict) -> tuple:
    """(step, batches) of the bare loop of `task` on `opts.device`: `step(b)` runs one training step (or encodes one
    batch) of the `warmup + steps` batches, made beforehand on the device. bench/bench_ops.py counts its operators."""
    import torch.nn.functional as F

    from models.rankers.backbone import load_backbone
    from models.rankers.base import cosine_normalize, masked_mean
    from models.rankers.maxsim import maxsim_all

    device = torch.device(opts.device)
    torch.manual_seed(opts.seed)
    rng = np.random.default_rng([opts.seed, 49])
    encoder, tokenizer = load_backbone(backbone)
    encoder.to(device)
    vocab = encoder.config.vocab_size
    fixed = opts.bare_lengths == "max"
    n = opts.warmup + opts.steps

    def texts(side: str, count: int):
        full = {"query": QUERY_MAX_LEN, "doc": DOC_MAX_LEN, "pair": QUERY_MAX_LEN + DOC_MAX_LEN + 3}[side]
        return random_batch(lengths[side], count, rng, vocab, device, full if fixed else None)

    def hidden(ids, mask):
        return encoder(input_ids=ids, attention_mask=mask).last_hidden_state

    if task.endswith("-train"):
        encoder.train()
        head = torch.nn.Linear(encoder.config.hidden_size, 1).to(device) if task == "bertcat-train" else None
        params = [p for m in (encoder, head) if m is not None for p in m.parameters()]
        opt = torch.optim.AdamW(params, lr=5e-5, weight_decay=0.01, fused=True)
        if task == "bertcat-train":
            batches = [texts("pair", 2 * batch) for _ in range(n)]
        else:
            batches = [(texts("query", batch), texts("doc", 2 * batch)) for _ in range(n)]
        target = torch.arange(batch, device=device)
        zeros = torch.zeros(batch, dtype=torch.long, device=device)

        def step(b):
            with bare_autocast(device, opts.precision):
                if task == "bertcat-train":
                    s = head(hidden(*b)[:, 0]).squeeze(-1)
                    loss = F.cross_entropy(torch.stack([s[:batch], s[batch:]], 1).float(), zeros)
                else:
                    (qi, qm), (di, dm) = b
                    q, d = hidden(qi, qm), hidden(di, dm)
                    if task == "colbert-train":
                        scores = maxsim_all(cosine_normalize(q), qm.bool(), cosine_normalize(d), dm.bool())
                        loss = F.cross_entropy(scores.float(), target)
                    else:
                        qv, dv = (
                            cosine_normalize(masked_mean(q, qm.bool())),
                            cosine_normalize(masked_mean(d, dm.bool())),
                        )
                        loss = F.cross_entropy((qv @ dv.T).float() / 0.05, target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

    else:
        encoder.eval()
        batches = [texts("doc", batch) for _ in range(n)]

        @torch.inference_mode()
        def step(b):
            with bare_autocast(device, opts.precision):
                out = hidden(*b)
                if task == "dense-encode":
                    return masked_mean(out, b[1].bool()).float().cpu()
                return cosine_normalize(out)

    return step, batches


def bare_run(task: str, backbone: str, batch: int, opts: Options, lengths: dict) -> dict:
    """The bare loop of `task`: `warmup` steps, then `steps` timed between two synchronisations."""
    device = torch.device(opts.device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step, batches = bare_loop(task, backbone, batch, opts, lengths)
    units = batch
    for b in batches[: opts.warmup]:
        step(b)
    sync(device)
    with Meter() as meter:
        t0 = time.time()
        for b in batches[opts.warmup :]:
            last = step(b)
        sync(device)
        t1 = time.time()
    float(last.detach().float().sum())
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    done = units * opts.steps
    return {
        "t0": t0,
        "t1": t1,
        "window_s": round(t1 - t0, 4),
        "units": float(done),
        "rate": done / (t1 - t0),
        "peak_gib": round(peak / GIB, 2) if peak else None,
        "others_cores": meter.others_cores,
    }


# ---- the PyLate peer ---------------------------------------------------------------------------------------------
def carried_wheels(folder: str) -> list[str]:
    """`name version` of each wheel in `folder` (what a session carried to the machine and installed there)."""
    path = Path(folder) if Path(folder).is_absolute() else REPO / folder
    return [" ".join(w.name.split("-")[:2]) for w in sorted(path.glob("*.whl"))] or [f"no wheels in {folder}"]


def venv_packages(python: str) -> list[str]:
    """What the venv holds beyond the machine's packages (`pip freeze --local`)."""
    p = subprocess.run([python, "-m", "pip", "freeze", "--local", "--all"], capture_output=True, text=True)
    return [ln for ln in p.stdout.splitlines() if ln and not ln.startswith("#")] if p.returncode == 0 else []


def _text(path: Path) -> str:
    """A small script's text; empty for a binary (an interpreter), a folder or nothing there."""
    try:
        return path.read_text() if path.is_file() and path.stat().st_size < 4096 else ""
    except (OSError, UnicodeDecodeError):
        return ""


def ensure_pylate(opts: Options, work: Path) -> tuple[str | None, str | None, list[str]]:
    """(python, None, its packages) when PyLate imports there; (None, why, installed) when it cannot run.

    The interpreter: `pylate_python`, else bench_peers' venv when it exists, else <work>/pylate-python made from
    `pylate_wheelhouse` (when that folder exists): every wheel installed, none of their dependencies (the wheelhouse
    holds what the machine lacks, bench/requirements-gpu-pylate.txt; pip's resolver would look for the rest offline
    and fail), into <work>/pylate-site, and a script that runs this interpreter with that folder first on its path.
    Not a venv: `venv --system-site-packages` made from a venv's interpreter (the GPU machine's python3 is one) sees
    the base interpreter's packages, not that venv's torch.
    """
    python = opts.pylate_python or TOOLS["pylate"][1]
    if not opts.pylate_python and not Path(python).exists():
        python = str(work / "pylate-python")
    installed: list[str] = []
    wheelhouse = Path(opts.pylate_wheelhouse) if opts.pylate_wheelhouse else None
    if wheelhouse is not None and not wheelhouse.is_absolute():
        wheelhouse = REPO / wheelhouse
    if not Path(python).exists() and wheelhouse is not None and wheelhouse.is_dir():
        site = work / "pylate-site"
        shutil.rmtree(site, ignore_errors=True)
        wheels = [str(w) for w in sorted(wheelhouse.glob("*.whl"))]
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site), *wheels]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0 or not wheels:
            tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-2:]) or "no wheels there"
            return None, f"installing PyLate from {wheelhouse} failed: {tail}", installed
        script = Path(python)
        script.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
        script.chmod(0o755)
        installed = carried_wheels(str(wheelhouse))
    elif wheelhouse is not None and wheelhouse.is_dir() and str(work / "pylate-site") in _text(Path(python)):
        installed = carried_wheels(str(wheelhouse))  # the wrapper an earlier run made here: these wheels, not the env
    if not Path(python).exists():
        return (
            None,
            f"no PyLate venv at {python} and no wheelhouse at {wheelhouse} (python -m bench.gpu_carry makes one)",
            [],
        )
    check = "import pylate, sentence_transformers, transformers, torch; print(pylate.__version__, torch.__version__)"
    p = subprocess.run([python, "-c", check], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        tail = " | ".join(p.stderr.strip().splitlines()[-2:])
        return None, f"PyLate does not import with {python}: {tail}", installed
    return python, None, installed or venv_packages(python)


def run_pylate(python: str, backbone: str, batch: int, opts: Options, data: dict, work: Path, timeout: float) -> dict:
    n = opts.warmup + opts.steps
    trip = triple_texts(data, n * batch)
    if len(trip) < n * batch:
        return {"error": f"only {len(trip)} triples for {n} steps of {batch}"}
    batches = [tuple(list(col) for col in zip(*trip[i * batch : (i + 1) * batch])) for i in range(n)]
    work.mkdir(parents=True, exist_ok=True)
    data_path = work / f"pylate-data-b{batch}.json"
    data_path.write_text(json.dumps({"triplets": batches}))
    spec = {
        "task": "colbert_train",
        "backbone": backbone,
        "query_max_len": QUERY_MAX_LEN,
        "doc_max_len": DOC_MAX_LEN,
        "precision": opts.precision,
        "device": opts.device,
        "threads": opts.cpu_threads or min(8, os.cpu_count() or 1),
        "lr": 5e-5,
        "warmup": opts.warmup,
        "seed": opts.seed,
        "data": str(data_path),
    }
    res = run_driver("pylate", python, spec, work, timeout=timeout)
    if "error" in res:
        return {"error": res["error"]}
    times = res["times"]
    span = float(sum(times))
    peak = res.get("cuda_peak_bytes")
    return {
        "t0": res["t_end"] - span if "t_end" in res else None,
        "t1": res.get("t_end"),
        "window_s": round(span, 4),
        "units": float(res["units"] * len(times)),
        "rate": res["units"] * len(times) / span,
        "peak_gib": round(peak / GIB, 2) if peak else None,
        "wall_s": round(res["process_s"], 1),
        "others_cores": res.get("others_cores"),
        "optimizer": res.get("optimizer"),
    }


# ---- the record --------------------------------------------------------------------------------------------------
def machine_facts(device: str) -> dict:
    info = machine_info(torch.get_num_threads())
    import pytorch_lightning as pl  # lazy: heavy; only the record names its version

    facts = {
        "cpu": f"{info['cpu_model']}, {info['logical_cpus']} logical CPUs",
        "software": f"torch {info['torch']}, transformers {info['transformers']}, pytorch-lightning {pl.__version__}, "
        f"Python {info['python']}",
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        facts["gpu"] = (
            f"{torch.cuda.get_device_name(torch.device(device))}, {props.total_memory / GIB:.0f} GiB, "
            f"CUDA {torch.version.cuda}"
        )
    else:
        facts["gpu"] = "none (CPU run)"
    return facts


ROW_COLUMNS = [
    ("task", "task"),
    ("shape", "shape"),
    ("batch", "batch"),
    ("unit", "unit"),
    ("ours", "ours /s"),
    ("bare", "bare /s"),
    ("ratio", "ours / bare"),
    ("ours_tflops", "ours TFLOP/s"),
    ("bare_tflops", "bare TFLOP/s"),
    ("ours_busy", "ours GPU busy %"),
    ("bare_busy", "bare GPU busy %"),
    ("ours_peak", "ours peak GiB"),
    ("bare_peak", "bare peak GiB"),
    ("pylate", "PyLate /s"),
    ("ours_pylate", "ours / PyLate"),
    ("pylate_tflops", "PyLate TFLOP/s"),
    ("pylate_busy", "PyLate GPU busy %"),
    ("pylate_peak", "PyLate peak GiB"),
]
TSV_COLUMNS = [
    "task",
    "shape",
    "batch",
    "side",
    "status",
    "unit",
    "rate_per_s",
    "tflops",
    "gpu_busy_pct",
    "peak_gib",
    "window_s",
    "timed_units",
    "unit_gflop",
    "wall_s",
    "others_cores",
    "command",
]


def summary_rows(measured: list[dict]) -> list[dict]:
    """One table row per configuration from the per-side measurements."""
    rows: dict[tuple, dict] = {}
    for m in measured:
        key = (m["task"], m["shape"], m["batch"])
        row = rows.setdefault(key, {"task": m["task"], "shape": m["shape"], "batch": m["batch"], "unit": m["unit"]})
        side = m["side"]
        if m.get("rate_per_s") is None:
            row[side] = "not run" if m["status"].startswith("not run") else "failed"  # why: under the table
            continue
        row[side] = round(m["rate_per_s"], 1)
        row[f"{side}_tflops"] = m.get("tflops")
        row[f"{side}_busy"] = m.get("gpu_busy_pct")
        row[f"{side}_peak"] = m.get("peak_gib")
    for row in rows.values():
        for other, key in (("bare", "ratio"), ("pylate", "ours_pylate")):
            a, b = row.get("ours"), row.get(other)
            if isinstance(a, float) and isinstance(b, float) and b > 0:
                row[key] = round(a / b, 2)
    return list(rows.values())


def markdown_body(result: dict, rows: list[dict]) -> str:
    o = result["options"]
    lens = result["lengths"]
    notes = [m for m in result["measured"] if m["status"] != "ok"]
    lines = [
        "## Figures",
        "",
        record.markdown_table(rows, ROW_COLUMNS),
        "",
        "Units: triples/s for the training tasks, passages/s for the encoding tasks. TFLOP/s count the useful FLOPs "
        "of a unit at the data's real lengths (padding not counted; training 3x forward): "
        + "; ".join(f"{k} {v}" for k, v in result["unit_gflop"].items())
        + " GFLOP.",
        f"Data: {result['data']['passages']:,} synthetic passages ({result['data']['triples']:,} triples); token "
        f"lengths of a {o['length_sample']}-text sample, mean (max): query {lens['query_mean']:.1f} "
        f"({lens['query_max']}), passage {lens['doc_mean']:.1f} ({lens['doc_max']}), {lens['doc_at_max_pct']:.0f} % of "
        f"passages at {DOC_MAX_LEN}. Bare batches: `bare_lengths={o['bare_lengths']}`.",
        f"GPU busy: {result['gpu_sampler'] or 'no sampler (no nvidia-smi or pynvml, or no GPU)'}.",
        "",
        "## Commands of ours (one configuration each)",
        "",
    ]
    seen = set()
    for m in result["measured"]:
        if m["side"] == "ours" and m.get("command") and m["task"] not in seen:
            seen.add(m["task"])
            lines.append(f"- {m['task']} ({m['shape']}, batch {m['batch']}): `{m['command']}`")
    lines += ["", "## How it is measured", "", HOW, ""]
    if notes:
        lines += ["## Not run or failed", ""]
        lines += [f"- {m['task']} {m['shape']} b{m['batch']} {m['side']}: {m['status']}" for m in notes]
        lines.append("")
    return "\n".join(lines)


HOW = (
    "Ours: the entry script as a subprocess carrying bench/bench_scale.py's probe; the time of every optimiser step "
    "(training) or of every `pad_batch` / `RankingModule.test_step` call (encoding) is recorded, the first `warmup` "
    "dropped, and the rate is the units of the rest over the time they span (imports, data loading, model building, "
    "worker start, checkpointing and the test after training fall outside it). Bare: the same backbone, loss, fused "
    "AdamW (lr 5e-5, weight decay 0.01, gradient clipping at 1.0) and autocast in a plain in-process loop over random "
    "token ids made on the device beforehand, `steps` timed between two synchronisations after `warmup`. GPU busy: "
    "the mean of the utilisation samples within each timed window. Peak memory: torch.cuda.max_memory_allocated "
    "(ours: at the subprocess's exit). PyLate: bench/peers/pylate_driver.py's colbert_train on the device, "
    "tokenisation inside each timed step, queries padded to 32 and passages to 180 tokens as its collator does, the "
    "mean over its timed steps. The bench's module docstring has the details."
)


def measurement(task, shape, batch, side, status, figs=None, flops=None, busy=None, command=None) -> dict:
    figs = figs or {}
    rate = figs.get("rate") if status == "ok" else None
    return {
        "task": task,
        "shape": shape,
        "batch": batch,
        "side": side,
        "status": status,
        "unit": "triples" if task.endswith("-train") else "passages",
        "rate_per_s": rate,
        "tflops": round(rate * flops / 1e12, 4) if rate and flops else None,
        "gpu_busy_pct": busy,
        "peak_gib": figs.get("peak_gib"),
        "window_s": figs.get("window_s"),
        "interval_ms": figs.get("interval_ms"),  # ours: each step's (or batch's) time: median, p90, max
        "timed_units": figs.get("units"),
        "unit_gflop": round(flops / 1e9, 3) if flops else None,
        "wall_s": figs.get("wall_s"),
        "others_cores": figs.get("others_cores"),
        "command": command,
    }


# ---- main --------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    opts = parse_args(argv)
    started = record.utc_now()
    t_start = time.time()
    if opts.device == "auto":
        opts.device = "cuda" if torch.cuda.is_available() else "cpu"
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        options.error(f"device={opts.device}: torch sees no CUDA device here; tiny=true runs on the CPU")
    if opts.precision == "auto":
        opts.precision = "bf16" if opts.device.startswith("cuda") else "fp32"
    if opts.cpu_threads:
        torch.set_num_threads(opts.cpu_threads)
    from transformers.utils import logging as hf_logging  # lazy: heavy, only model building needs it

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    work = Path(opts.work_dir)
    work = (work if work.is_absolute() else REPO / work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    probe_dir = work / "probe"
    probe_dir.mkdir(exist_ok=True)
    from bench.bench_scale import PROBE

    (probe_dir / "sitecustomize.py").write_text(PROBE)
    sampler = GpuSampler(torch.device(opts.device).index or 0).start() if opts.device.startswith("cuda") else None
    if opts.profile:  # this run's reports only
        profiles_file(opts, work).parent.mkdir(parents=True, exist_ok=True)
        profiles_file(opts, work).write_text("")
    tasks = parse_list(opts.only, "only", TASKS)
    shapes = parse_list(opts.shapes, "shapes", SHAPES)
    batches = [int(b) for b in parse_list(opts.batches, "batches")]
    print(f"bench_gpu_speed: {opts.device} ({opts.precision}), tasks {tasks}, shapes {shapes}, batches {batches}")

    data = prepare_data(work, opts.passages, opts.seed, opts.rerank_queries, opts.candidates, opts.data_dir)
    print(f"data: {data['passages']:,} passages in {data['folder']} ({'reused' if data['reused'] else 'made'})")
    from models.rankers.backbone import save_random_bert

    shape_cfg = TINY_SHAPES if opts.tiny else SHAPES
    backbones = {}
    for s in shapes:
        folder = work / f"backbone-{s}{'-tiny' if opts.tiny else ''}"
        if not (folder / "config.json").exists():
            save_random_bert(folder, seed=opts.seed, tokenizer=opts.tokenizer, **shape_cfg[s])
        backbones[s] = str(folder)
    from transformers import AutoTokenizer  # lazy: heavy, only model building needs it

    lengths = token_lengths(AutoTokenizer.from_pretrained(backbones[shapes[0]]), data, opts.length_sample, opts.seed)
    flops = {(t, s): unit_flops(shape_cfg[s], t, lengths) for t in tasks for s in shapes}

    result = {
        "started": started.isoformat(timespec="seconds"),
        "command": record.command_line("bench.bench_gpu_speed", argv),
        "commit": record.git_commit(),
        "options": dataclasses.asdict(opts),
        "machine": machine_facts(opts.device),
        "data": {k: data[k] for k in ("folder", "passages", "triples", "reused")},
        "lengths": {
            "query_mean": float(lengths["query"].mean()),
            "query_max": int(lengths["query"].max()),
            "doc_mean": float(lengths["doc"].mean()),
            "doc_max": int(lengths["doc"].max()),
            "doc_at_max_pct": float(100 * (lengths["doc"] == DOC_MAX_LEN).mean()),
        },
        "unit_gflop": {f"{t} {s}": round(v / 1e9, 3) for (t, s), v in flops.items()},
        "gpu_sampler": sampler.source if sampler else None,
        "measured": [],
        "records": [],
    }
    runner = Runner(ScaleOptions(out=work / "gpu-speed.json"), result, probe_dir)
    cache = work / "cache"

    pylate_python, pylate_why, installed = None, None, []
    if "pylate" in (opts.peers or "") and "colbert-train" in tasks:
        pylate_python, pylate_why, installed = ensure_pylate(opts, work)
        result["pylate"] = {"python": pylate_python, "why_not": pylate_why, "venv_packages": installed}
        print(f"PyLate: {pylate_why or pylate_python}")

    def over_budget() -> str | None:
        spent = time.time() - t_start
        return f"not run: budget_s={opts.budget_s:g} spent ({spent:.0f} s)" if spent > opts.budget_s else None

    for s in shapes:
        for b in batches:
            for t in tasks:
                unit_flops_ = flops[(t, s)]
                late = over_budget()
                if late:
                    result["measured"].append(measurement(t, s, b, "ours", late))
                    result["measured"].append(measurement(t, s, b, "bare", late))
                    continue
                runner.args.stage_timeout = int(max(120, opts.budget_s - (time.time() - t_start) + 120))
                how = ours_command(t, backbones[s], b, opts, data, cache, work / "runs" / f"{t}-{s}-b{b}")
                figs = run_ours(runner, t, s, b, how, work, opts, data["passages"])
                status = "ok" if "error" not in figs else f"failed: {figs['error']}"
                busy = sampler.busy(figs.get("t0"), figs.get("t1")) if sampler else None
                result["measured"].append(
                    measurement(t, s, b, "ours", status, figs, unit_flops_, busy, figs["command"])
                )
                try:
                    bare = bare_run(t, backbones[s], b, opts, lengths)
                    status = "ok"
                except Exception as e:  # recorded, the bench goes on (e.g. out of memory at bert-base b256)
                    bare, status = {}, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                busy = sampler.busy(bare.get("t0"), bare.get("t1")) if sampler else None
                result["measured"].append(measurement(t, s, b, "bare", status, bare, unit_flops_, busy))
                gaps = figs.get("interval_ms") or {}
                spread = (
                    f"  (ours' intervals: median {gaps['median']} ms, p90 {gaps['p90']}, max {gaps['max']})"
                    if gaps
                    else ""
                )
                print(
                    f"  {t:15s} {s:9s} b{b:<4d} ours {figs.get('rate', 0):9.1f}/s  bare {bare.get('rate', 0):9.1f}/s"
                    + spread,
                    flush=True,
                )
                if t == "colbert-train" and "pylate" in (opts.peers or ""):
                    late = over_budget()
                    if pylate_python is None or late:
                        result["measured"].append(measurement(t, s, b, "pylate", late or f"not run: {pylate_why}"))
                        continue
                    # as the stages: at most 2 minutes past the budget, so that a run under a time limit ends inside it
                    left = max(120.0, opts.budget_s - (time.time() - t_start) + 120)
                    pl = run_pylate(pylate_python, backbones[s], b, opts, data, work / "pylate", left)
                    status = "ok" if "error" not in pl else f"failed: {pl['error'][-600:]}"
                    busy = sampler.busy(pl.get("t0"), pl.get("t1")) if sampler else None
                    how_pl = f"python -m bench.peers.pylate_driver (colbert_train; {pl.get('optimizer')})"
                    result["measured"].append(measurement(t, s, b, "pylate", status, pl, unit_flops_, busy, how_pl))
                    print(f"  {t:15s} {s:9s} b{b:<4d} PyLate {pl.get('rate', 0):9.1f}/s", flush=True)
                runner.save()
    if sampler:
        sampler.stop()
    result["wall_s"] = round(time.time() - t_start, 1)
    rows = summary_rows(result["measured"])
    result["rows"] = rows
    runner.save()
    facts = [
        ("Date", f"{started.date().isoformat()}, {started:%H:%M}-{record.utc_now():%H:%M} UTC"),
        ("Command", f"`{record.relative(result['command'])}`"),
        ("Commit", result["commit"]),
        ("Machine", "; ".join(f"{k}: {v}" for k, v in result["machine"].items())),
        (
            "Settings",
            f"device {opts.device}, precision {opts.precision}, {opts.warmup} warm-up + {opts.steps} timed steps, "
            f"data.num_workers={opts.data_workers}, colbert-encode {opts.rerank_queries} queries x "
            f"{opts.candidates} candidates"
            + (f", ours with {opts.ours_overrides}" if opts.ours_overrides else "")
            + (", tiny (toy shapes: " + json.dumps(TINY_SHAPES) + ")" if opts.tiny else ""),
        ),
        (
            "Installed beyond the machine's packages",
            (
                f"for ours and bare, from {opts.carried}: {', '.join(carried_wheels(opts.carried))}"
                if opts.carried
                else "nothing for ours and bare"
            )
            + (
                f"; PyLate ({pylate_python}): {', '.join(installed)}"
                if installed
                else "; PyLate not run" + (f" ({pylate_why})" if pylate_why else "")
            ),
        ),
        ("Wall time", f"{result['wall_s']:.0f} s"),
        (
            "Load",
            "other processes used at most "
            + record.cell(max((m["others_cores"] or 0.0 for m in result["measured"]), default=0.0))
            + " CPU cores on average during a measurement (`others_cores` in the TSV)",
        ),
        ("Raw figures", f"{record.relative(str(work / 'gpu-speed.json'))} (not in git)"),
    ]
    folder = Path(opts.record_dir) if opts.record_dir else record.RESULTS
    md, tsv = record.write_record(
        folder,
        "gpu-speed",
        "GPU speed: train.py / evaluate.py against a bare PyTorch loop and PyLate (bench_gpu_speed)",
        facts,
        markdown_body(result, rows),
        result["measured"],
        TSV_COLUMNS,
        started,
    )
    result["record"] = [str(md), str(tsv)]
    runner.save()
    print()
    print(record.markdown_table(rows, ROW_COLUMNS))
    print(f"\n{result['wall_s']:.0f} s; record {md} + {tsv.name}; JSON {work / 'gpu-speed.json'}")
    return result


if __name__ == "__main__":
    main()
