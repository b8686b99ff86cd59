"""White-box ColBERT analyses over a ~10k-passage collection: the time of each stage, and the per-word removal on
the max-sim matrix against re-scoring through the ranker.

    python -m bench.bench_whitebox [data=vaswani|squad|cranfield] [data_dir=../shared/data] [ckpt=PATH] [queries=N]
                                   [depth=100] [spectral_passages=collection|candidates] [batch_size=64] [threads=2]
                                   [peer_queries=10] [out=bench/results/whitebox.json]

Default: Vaswani/NPL (11,429 abstracts, 93 queries, ../shared/data/vaswani_npl), MiniLM ColBERT (untrained unless
`ckpt`; the cost does not depend on the weights), all three statistics, BM25 top-100 candidates, and the spectral
ratio over the contextual vectors of the WHOLE collection (`spectral_passages: collection`, so every passage is
encoded once). It runs `analyses.whitebox.analysis.analyse` as `python evaluate.py analysis=whitebox` does (without
writing figures) and prints each stage's seconds: model and data loading, BM25 candidates, collection IDF,
tokenisation, passage encoding, query encoding, the per-query statistics (C*/exact matrices, every word's tau_AP,
every Eq. 2 term) and the spectral ratios.

Peers, measured in the same run on the same encoded vectors:
- the floor: encoding the collection once (what any analysis of its contextual vectors pays); the script prints the
  whole analysis / that encoding.
- per-word removal: ours computes each query's [Lq, |S_q|] max-sim matrix once and subtracts a word's rows; the
  peer re-scores the candidates through the ranker's `score_all` with the word's query tokens masked out, once per
  word (already without re-encoding anything). On `peer_queries` queries; the script prints both per query and
  their ratio (the scores agree; checked).

The CPU may be shared: each timing records the CPU that other processes used meanwhile (cores, /proc/stat). The
JSON (written atomically) holds machine info, settings and every number.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from analyses.registry import analysis_options
from analyses.whitebox.analysis import _models, analyse, queries_and_candidates
from analyses.whitebox.collect import encode_texts, query_maxsim
from analyses.whitebox.words import query_words
from bench import options as bench_options
from bench.bench_retrieval import machine
from bench.bench_speed import Meter
from core.io import write_json
from datamodules.sources import data_config, load_dataset
from models.rankers.base import Encoded
from pipeline.config import compose

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
PATHS = {"vaswani": "vaswani_npl", "cranfield": "cranfield", "squad": "squad_v1.1_dev/dev-v1.1.json.gz"}
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")


def peer_removal(loaded, qids, qtexts, cands, ds, n_queries: int) -> dict:
    """Per-word removal on a few queries, ours (one max-sim matrix, rows subtracted) vs the ranker's score_all
    with the word's tokens masked (passages encoded once for both)."""
    ranker, c, tok = loaded.ranker, loaded.config, loaded.ranker.tokenizer
    qids = qids[:n_queries]
    q_ids, q_words = query_words(tok, [qtexts[q] for q in qids], c.query_max_len)
    used = sorted({d for q in qids for d in cands[q]})
    index = {d: i for i, d in enumerate(used)}
    d_tok = tok([ds.docs[d] for d in used], truncation=True, max_length=c.doc_max_len)["input_ids"]
    docs = encode_texts(ranker, d_tok, "doc")
    queries = encode_texts(ranker, q_ids, "query")
    words = sum(len(ws) for ws in q_words)
    with Meter() as ours:
        for k, q in enumerate(qids):
            ms = query_maxsim(queries, k, docs, [index[d] for d in cands[q]])
            for w in q_words[k]:
                ms.without(w.positions)
    max_diff = 0.0
    with Meter() as peer, torch.inference_mode():
        for k, q in enumerate(qids):
            d_enc = docs.padded([index[d] for d in cands[q]])
            qv = queries.tokens(k)
            for w in q_words[k]:
                mask = torch.ones(1, len(qv), dtype=torch.bool)
                mask[0, w.positions] = False
                s = ranker.score_all(Encoded(qv[None], mask), d_enc)[0]
                if k == 0:
                    ref = query_maxsim(queries, k, docs, [index[d] for d in cands[q]]).without(w.positions)
                    max_diff = max(max_diff, float((s - ref).abs().max()))
    return {
        "queries": len(qids),
        "words": words,
        "ours_s": ours.wall,
        "ours_others_cores": ours.others_cores,
        "rescoring_s": peer.wall,
        "rescoring_others_cores": peer.others_cores,
        "rescoring_over_ours": peer.wall / max(ours.wall, 1e-9),
        "max_abs_score_difference": max_diff,
    }


@dataclass
class Options:
    data: str = field(default="vaswani", metadata={"choices": tuple(sorted(PATHS))})
    data_dir: Path = DATA  # the shared data folder (default ../shared/data)
    ckpt: str | None = None  # a ColBERT checkpoint (default: MiniLM untrained)
    queries: int | None = None  # analysed queries (default: all of `split`)
    split: str = field(default="all", metadata={"choices": ("train", "val", "test", "all")})
    depth: int = 100  # |S_q|, BM25 top-k
    spectral_passages: str = field(default="collection", metadata={"choices": ("collection", "candidates")})
    batch_size: int = 64
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    peer_queries: int = 10
    out: Path = REPO / "bench" / "results" / "whitebox.json"


def main(argv=None) -> dict:
    args = bench_options.parse(Options, argv, __doc__)
    torch.set_num_threads(args.threads)

    overrides = [
        f"data={args.data}",
        f"data.path={args.data_dir / PATHS[args.data]}",
        "analysis=whitebox",
        f"analysis.split={args.split}",
        f"analysis.candidate_depth={args.depth}",
        f"analysis.spectral_passages={args.spectral_passages}",
        f"analysis.batch_size={args.batch_size}",
        "logger=none",
        "output_dir=outputs/bench-whitebox",
    ]
    if args.queries:
        overrides.append(f"analysis.max_queries={args.queries}")
    overrides += [f"ckpt={args.ckpt}"] if args.ckpt else ["model=colbert", "model.backbone=minilm"]
    cfg = compose(overrides)
    opts = analysis_options(cfg)
    with Meter() as total:
        result = analyse(cfg, opts, model_from_cli=not args.ckpt)
    label, res = next(iter(result["models"].items()))
    s = result["settings"]

    # peer: the removal through the ranker, on the same queries and candidates
    loaded = next(iter(_models(cfg, not args.ckpt, False).values()))
    dc = data_config(cfg)
    ds = load_dataset(dc, int(cfg.seed))
    qids, qtexts, cands, _ = queries_and_candidates(ds, dc, opts, s["seed"], int(cfg.seed))
    peer = peer_removal(loaded, qids, qtexts, cands, ds, args.peer_queries)

    stages = {**result["timings_s"], **{f"{label}: {k}": v for k, v in res["timings_s"].items()}}
    stages.pop(f"model_{label}_s", None)
    encode = res["timings_s"]["encode_passages_s"]
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "threads": args.threads,
        "settings": {
            k: s[k] for k in ("dataset", "collection_passages", "queries", "candidate_depth", "spectral_passages")
        },
        "passages_encoded": res["passages_encoded"],
        "tokens_encoded": res["tokens_encoded"],
        "total_s": total.wall,
        "total_others_cores": total.others_cores,
        "stages_s": stages,
        "analysis_over_encoding": total.wall / max(encode, 1e-9),
        "removal": peer,
        "pearson_r": {k: v["pearson_r"] for k, v in res["correlations"].items()},
    }
    print(
        f"white-box ColBERT bench: {s['dataset']} ({s['collection_passages']:,} passages), {s['queries']} queries, "
        f"|S_q| <= {s['candidate_depth']}, spectral over {s['spectral_passages']}, {args.threads} threads "
        f"(others used {total.others_cores} cores meanwhile)"
    )
    for k, v in stages.items():
        print(f"  {k:<36}{v:>9.1f} s")
    print(
        f"  {'total':<36}{total.wall:>9.1f} s  ({total.wall / 60:.1f} min; {res['passages_encoded']:,} passages, "
        f"{res['tokens_encoded']:,} tokens encoded)"
    )
    print(f"  whole analysis / encoding the passages once: {report['analysis_over_encoding']:.2f}")
    print(
        f"  per-word removal, {peer['queries']} queries, {peer['words']} words: max-sim rows {peer['ours_s']:.2f} s, "
        f"ranker re-scoring {peer['rescoring_s']:.2f} s, ratio {peer['rescoring_over_ours']:.1f}x "
        f"(max |score difference| {peer['max_abs_score_difference']:.1e})"
    )
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
