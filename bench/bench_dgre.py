"""Cost of a DGRe training step against a BERT_CAT step on the same batch (issue 6: target <= 2x).

    python -m bench.bench_dgre [data_path=../shared/data/cranfield] [batch=8] [steps=6] [rounds=3]
                               [precision=fp32,bf16] [threads=2] [profile=true] [out=bench/results/dgre.json]

Both rankers on all-MiniLM-L6-v2, query 32 / document 180 tokens, optim.loss=hinge (DGRe: Eq. 25 on sigmoid
outputs plus lambda x (triangle distance + MINE terms), every switch at its default). A step is what the trainer
does: `RankingModule.training_step` (forward, losses), backward, AdamW step (the module's own optimiser groups),
schedule step, zero_grad. The batches are tokenised once and are the SAME tensors for both rankers: `batch`
triplets = 2 x batch (query, document) pairs, sampled from the collection's judged queries (a relevant and a random
document; Cranfield by default, the seeded synthetic collection when the folder is missing). The two alternate:
BERT_CAT for `steps` steps, DGRe for `steps` steps, `rounds` times (the first step of each block is a
warm-up and not timed); the medians and their ratio are printed. For every timing the JSON records the CPU time that
other processes used meanwhile (a shared machine inflates both arms, not necessarily alike). `profile=true` adds
torch.profiler's table of the most expensive operators of one DGRe step.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench import options
from bench.bench_speed import (
    Meter,
    autocast,
    build_optimizer,
    machine_info,
)
from core.io import write_json
from datamodules.sources import load_dataset
from datamodules.sources.classic import CranfieldConfig
from datamodules.sources.synthetic import SyntheticConfig
from lightning_modules.module import RankingModule

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RANKERS = ("bert_cat", "dgre")


@dataclass
class Options:
    data_path: str = field(default_factory=lambda: str(REPO.parent / "shared" / "data" / "cranfield"))
    batch: int = 8  # triplets per step (2x as many pairs)
    steps: int = 6  # steps per block (the first is not timed)
    rounds: int = 3
    precision: str = "fp32,bf16"  # comma-separated
    threads: int = 2
    seed: int = 0
    profile: bool = False
    out: str = field(default_factory=lambda: str(REPO / "bench" / "results" / "dgre.json"))


def sample_triplets(data_path: str, n_batches: int, batch: int, seed: int) -> tuple[list, str]:
    if Path(data_path).is_dir():
        ds, source = load_dataset(CranfieldConfig(path=data_path), seed), f"cranfield ({data_path})"
    else:
        print(f"NOTICE: {data_path} not found: using the synthetic collection", flush=True)
        ds, source = load_dataset(SyntheticConfig(), seed), "synthetic"
    rng = random.Random(seed)
    doc_ids = sorted(ds.docs)
    judged = [
        (split.queries[q], [d for d, g in rel.items() if g > 0])
        for split in ds.splits.values()
        for q, rel in split.qrels.items()
    ]
    judged = [(q, rel) for q, rel in judged if rel]
    out = []
    for _ in range(n_batches):
        picked = rng.sample(judged, batch)
        pos = [ds.docs[rng.choice(rel)] for _, rel in picked]
        neg = [ds.docs[rng.choice(doc_ids)] for _ in picked]
        out.append(([q for q, _ in picked], pos, neg))
    return out, source


def build(name: str, seed: int):
    torch.manual_seed(seed)
    m = RankingModule(
        model=dict(name=name, backbone="minilm", query_max_len=32, doc_max_len=180),
        optim=dict(loss="hinge", margin=1.0),
    )
    m.log = lambda *a, **k: None  # no trainer to log to
    return m.train()


def run_block(
    module, opt, sched, batches, precision: str, first_index: int
) -> tuple[list[float], list[float], list[float]]:
    times, others, losses = [], [], []
    for i, batch in enumerate(batches):
        with Meter() as m:
            with autocast(precision):
                loss = module.training_step(batch, first_index + i)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if not torch.isfinite(loss.detach()):
            raise RuntimeError(f"non-finite loss {float(loss)} at step {first_index + i}")
        if i > 0:  # the first step of a block warms caches after the other ranker ran
            times.append(m.wall)
            others.append(m.others_cores)
    return times, others, losses


def profile_step(module, opt, batch, precision: str, rows: int = 25) -> str:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with autocast(precision):
            loss = module.training_step(batch, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return prof.key_averages().table(sort_by="cpu_time_total", row_limit=rows)


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)
    torch.set_num_threads(args.threads)
    texts, source = sample_triplets(args.data_path, args.steps * args.rounds, args.batch, args.seed)
    result = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(args.threads),
        "data": source,
        "batch_triplets": args.batch,
        "steps": args.steps,
        "rounds": args.rounds,
        "precisions": {},
    }
    for precision in args.precision.split(","):
        modules = {name: build(name, args.seed) for name in RANKERS}
        batches = [modules["dgre"].pair_tokenizer.triplets(*t) for t in texts]
        opts = {name: build_optimizer(m, len(batches))[:2] for name, m in modules.items()}
        per = {name: {"times": [], "others": [], "losses": []} for name in RANKERS}
        for r in range(args.rounds):
            block = batches[r * args.steps : (r + 1) * args.steps]
            for name in RANKERS:
                t, o, losses = run_block(modules[name], *opts[name], block, precision, r * args.steps)
                per[name]["times"] += t
                per[name]["others"] += [x for x in o if x is not None]
                per[name]["losses"] += losses
        entry = {}
        for name in RANKERS:
            ts = per[name]["times"]
            entry[name] = {
                "step_s_median": statistics.median(ts),
                "step_s_min": min(ts),
                "step_s_max": max(ts),
                "n": len(ts),
                "others_cores_mean": statistics.mean(per[name]["others"]) if per[name]["others"] else None,
                "losses": per[name]["losses"],
            }
        entry["ratio_dgre_over_bert_cat"] = entry["dgre"]["step_s_median"] / entry["bert_cat"]["step_s_median"]
        entry["pairs_shape"] = list(batches[0]["input_ids"].shape)
        result["precisions"][precision] = entry
        print(
            f"[{precision}] {args.batch} triplets ({2 * args.batch} pairs, "
            f"padded length {batches[0]['input_ids'].shape[1]} in the first batch): "
            f"bert_cat {entry['bert_cat']['step_s_median']:.3f} s/step, "
            f"dgre {entry['dgre']['step_s_median']:.3f} s/step, "
            f"ratio {entry['ratio_dgre_over_bert_cat']:.2f}x (target <= 2x); other processes used "
            f"{entry['bert_cat']['others_cores_mean'] or 0:.2f} / {entry['dgre']['others_cores_mean'] or 0:.2f} cores",
            flush=True,
        )
        if args.profile:
            table = profile_step(modules["dgre"], opts["dgre"][0], batches[0], precision)
            result["precisions"][precision]["profile"] = table
            print(table, flush=True)
        del modules, opts
    write_json(Path(args.out), result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
