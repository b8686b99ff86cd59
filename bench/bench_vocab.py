"""Vocabulary projections and lexical enrichment over a ~10k-passage collection: the time of each stage, with peers
measured in the same run.

    python -m bench.bench_vocab mlm_head=PATH [data=vaswani|cranfield|squad] [data_dir=../shared/data] [ckpt=PATH]
                                [depth=30] [batch_size=64] [threads=2] [peer_items=32] [out=bench/results/vocab.json]

Default: Vaswani/NPL (11,429 abstracts, 93 queries), MiniLM RepBERT (untrained unless `ckpt`; the cost does not
depend on the weights) through the MLM head `mlm_head` (from `python evaluate.py analysis=fit_mlm_head`). It runs
`analysis=vocab_projections` (every query, split `all`; collection IDF and BM25 over the whole collection; each
query's BM25 top-`depth` re-ranked for token amnesia) and `analysis=lexical_enrichment` (lambda on val, test
compared; s_t optimised for the vocabulary of the texts, no cache) as evaluate.py does, without writing figures,
and prints each stage's seconds.

Peers:
- the floor: encoding the passages once (what any analysis of a ranker's vectors pays): whole analysis / encoding;
- Eq. 4 batched over the vocabulary (ours, items leaving the computation when they reach the threshold) vs one
  item at a time (the same optimisation per item), on `peer_items` items: seconds per item and the ratio (the
  vectors agree; checked).

The CPU may be shared: each timing records the CPU other processes used meanwhile (cores, /proc/stat). The JSON
(written atomically) holds machine info, settings and every number.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from analyses.vocab import analysis as vp
from analyses.vocab import lexical_enrichment as le
from analyses.vocab.enrichment import single_token_embeddings
from analyses.vocab.mlm_head import load_mlm_head
from bench import options
from bench.bench_retrieval import machine
from bench.bench_speed import Meter
from bench.bench_whitebox import (  # importing it also sets the offline environment
    DATA,
    PATHS,
)
from core.io import write_json
from pipeline.config import compose

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Options:
    mlm_head: str | None = None  # required: an MLM head file (python evaluate.py analysis=fit_mlm_head)
    data: str = field(default="vaswani", metadata={"choices": tuple(sorted(PATHS))})
    data_dir: Path = DATA
    ckpt: str | None = None  # a RepBERT / BERT_DOT checkpoint (default: MiniLM RepBERT untrained)
    depth: int = 30  # BM25 candidates re-ranked per query
    batch_size: int = 64
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    peer_items: int = 32
    out: Path = REPO / "bench" / "results" / "vocab.json"


def peer_single_tokens(head, n: int, lr: float, threshold: float, max_steps: int) -> dict:
    ids = list(range(2000, 2000 + 97 * n, 97))[:n]
    init = head.embeddings[ids]
    with Meter() as batched:
        ours = single_token_embeddings(head, ids, init, lr, threshold, max_steps, batch_size=n)
    with Meter() as single:
        each = [
            single_token_embeddings(head, [t], init[i : i + 1], lr, threshold, max_steps, batch_size=1)
            for i, t in enumerate(ids)
        ]
    diff = max(float((e.vectors[0] - ours.vectors[i]).abs().max()) for i, e in enumerate(each))
    return {
        "items": n,
        "batched_s": batched.wall,
        "batched_others_cores": batched.others_cores,
        "one_at_a_time_s": single.wall,
        "one_at_a_time_others_cores": single.others_cores,
        "one_at_a_time_over_batched": single.wall / max(batched.wall, 1e-9),
        "max_abs_vector_difference": diff,
        "reached": int(ours.reached(threshold).sum()),
    }


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)
    if not args.mlm_head:
        options.error("mlm_head: required (an MLM head file from python evaluate.py analysis=fit_mlm_head)")
    torch.set_num_threads(args.threads)

    cache = tempfile.mkdtemp(prefix="bench-vocab-")  # BM25 and s_t computed afresh, both timed
    common = [
        f"data={args.data}",
        f"data.path={args.data_dir / PATHS[args.data]}",
        f"data.cache_dir={cache}",
        "logger=none",
        "output_dir=outputs/bench-vocab",
        f"data.candidate_depth={args.depth}",
    ]
    common += [f"ckpt={args.ckpt}"] if args.ckpt else ["model=repbert", "model.backbone=minilm"]
    cfg = compose(
        [
            *common,
            "analysis=vocab_projections",
            f"analysis.mlm_head={args.mlm_head}",
            "analysis.split=all",
            f"analysis.batch_size={args.batch_size}",
        ]
    )
    with Meter() as t_vp:
        res_vp = vp.analyse(
            cfg, vp.VocabProjectionsConfig(**{k: v for k, v in cfg.analysis.items() if k != "name"}), not args.ckpt
        )
    cfg_le = compose(
        [
            *common,
            "analysis=lexical_enrichment",
            f"analysis.mlm_head={args.mlm_head}",
            f"analysis.batch_size={args.batch_size}",
        ]
    )
    with Meter() as t_le:
        res_le = le.analyse(
            cfg_le,
            le.LexicalEnrichmentConfig(**{k: v for k, v in cfg_le.analysis.items() if k != "name"}),
            not args.ckpt,
        )
    head, _ = load_mlm_head("minilm" if not args.ckpt else res_le["settings"]["ranker"]["backbone"], args.mlm_head)
    peer = peer_single_tokens(head, args.peer_items, 0.01, 0.1, 1000)

    label, m = next(iter(res_vp["models"].items()))
    s = res_vp["settings"]
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "threads": args.threads,
        "settings": {
            "dataset": s["dataset"],
            "collection_passages": s["collection_passages"],
            "queries": s["queries"],
            "pairs": s["pairs"],
            "candidate_depth": s["candidate_depth"],
        },
        "vocab_projections": {
            "total_s": t_vp.wall,
            "others_cores": t_vp.others_cores,
            "stages_s": {**res_vp["timings_s"], **m["timings_s"]},
            "passages_encoded": m["passages_encoded"],
            "over_encoding": t_vp.wall / max(m["timings_s"]["encode_s"], 1e-9),
        },
        "lexical_enrichment": {
            "total_s": t_le.wall,
            "others_cores": t_le.others_cores,
            "stages_s": res_le["timings_s"],
            "passages_encoded": res_le["settings"]["passages_encoded"],
            "vocabulary_items": res_le["settings"]["vocabulary_items"],
            "single_tokens": res_le["single_tokens"],
            "over_encoding": t_le.wall / max(res_le["timings_s"]["encode_s"], 1e-9),
            "test": res_le["results"]["le"]["test"],
            "lambda": res_le["results"]["le"]["lambda"],
        },
        "single_token_peer": peer,
    }
    write_json(args.out, report)
    print(
        f"vocabulary bench: {s['dataset']} ({s['collection_passages']:,} passages), {s['queries']} queries, "
        f"BM25 top-{s['candidate_depth']}, "
        f"{args.threads} threads"
    )
    for name in ("vocab_projections", "lexical_enrichment"):
        r = report[name]
        print(
            f"  {name}: {r['total_s']:.1f} s ({r['total_s'] / 60:.1f} min; others used {r['others_cores']} cores), "
            f"{r['passages_encoded']:,} passages encoded, whole / encoding {r['over_encoding']:.2f}"
        )
        for k, v in r["stages_s"].items():
            print(f"    {k:<28}{v:>9.1f} s")
    st = report["lexical_enrichment"]["single_tokens"]
    print(f"  s_t: {st['items']:,} items, {st['reached_threshold']:,} reached CE <= 0.1, {st['seconds']:.1f} s")
    print(
        f"  Eq. 4 on {peer['items']} items: batched {peer['batched_s']:.2f} s, "
        f"one at a time {peer['one_at_a_time_s']:.2f} s, "
        f"ratio {peer['one_at_a_time_over_batched']:.1f}x (max |difference| {peer['max_abs_vector_difference']:.1e})"
    )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
