"""torch.profiler summary of our ColBERT training steps (MiniLM, 16 SQuAD triplets, query 32 / passage 180 tokens).

    python -m bench.profile_train [plain=true] [precision=bf16] [steps=2] [threads=2] [rows=12]
    python -m bench.profile_train ab=4      # no profiler: plain and default steps alternating, medians and ratio

plain=true profiles the path before the speed work of issue 9 (model.fast_dropout=false: PyTorch's Bernoulli dropout and
SDPA's math path; AdamW without fused=True; model.length_buckets=1), to set the two tables side by side. Prints
operators by self CPU time. ab=N times N steps of each path, alternating (fair under a shared machine's load).
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from bench import options
from bench.bench_speed import (
    DOC_MAX_LEN,
    QUERY_MAX_LEN,
    build_optimizer,
    load_corpus,
    train_step,
    triplet_texts,
)
from lightning_modules.module import RankingModule


@dataclass
class Options:
    plain: bool = False  # the path before issue 9's speed work
    precision: str = field(default="bf16", metadata={"choices": ("fp32", "bf16")})
    steps: int = 2
    threads: int = 2
    rows: int = 12
    ab: int = 0  # alternate N plain and N default steps, no profiler


def setup(plain: bool, a, texts):
    """(module, tokenised batches, optimiser, schedule) of the plain or the default path, warmed up by one step."""
    torch.manual_seed(0)
    extra = dict(fast_dropout=False, length_buckets=1) if plain else {}
    m = RankingModule(
        dict(name="colbert", backbone="minilm", query_max_len=QUERY_MAX_LEN, doc_max_len=DOC_MAX_LEN, **extra), dict()
    ).train()
    batches = [m.pair_tokenizer.triplets(*t) for t in texts]
    opt, sched, _ = build_optimizer(m, len(batches))
    if plain:  # the optimiser as it was: foreach AdamW
        groups = [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in opt.param_groups]
        opt = torch.optim.AdamW(groups, lr=opt.defaults["lr"])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    train_step(m, batches[0], 0, opt, sched, a.precision)  # warm-up
    return m, batches, opt, sched


def main(argv=None) -> None:
    a = options.parse(Options, argv, __doc__)
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging  # lazy: heavy, only model building needs it

    hf_logging.set_verbosity_error()
    paras, qs, _ = load_corpus(0)
    texts = triplet_texts(paras, qs, 1 + max(a.steps, a.ab), 16, 0)
    if a.ab:
        runs = [setup(plain, a, texts) for plain in (True, False)]
        times = {True: [], False: []}
        for i in range(1, 1 + a.ab):
            for plain, (m, batches, opt, sched) in zip((True, False), runs):
                t0 = time.perf_counter()
                train_step(m, batches[i], i, opt, sched, a.precision)
                times[plain].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{a.precision}, {a.ab} steps each, alternating: "
            f"plain {med[True]:.2f} s/step ({16 / med[True]:.2f} triplets/s), "
            f"default {med[False]:.2f} s/step ({16 / med[False]:.2f} triplets/s), "
            f"speed-up {med[True] / med[False]:.2f}x; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        return
    m, batches, opt, sched = setup(a.plain, a, texts)
    times = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i, b in enumerate(batches[1:], 1):
            t0 = time.perf_counter()
            train_step(m, b, i, opt, sched, a.precision)
            times.append(time.perf_counter() - t0)
    print(
        f"{'plain' if a.plain else 'default'} path, {a.precision}, steps {', '.join(f'{t:.2f}' for t in times)} s, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
