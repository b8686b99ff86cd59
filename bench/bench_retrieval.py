"""Full-ranking speed on MiniLM: index building passages/s (fp32, bf16) and search queries/s (flat, hnsw).

    python -m bench.bench_retrieval [docs=2000] [queries=93] [ranker=repbert] [precision=fp32,bf16]
                                    [index_types=flat,hnsw] [k=100] [batch_size=64] [threads=2]
                                    [repeats=3] [colbert=true] [out=bench/results/retrieval.json]

Data: the Vaswani (NPL) abstracts and queries (../shared/data/vaswani_npl, read by the pipeline's own source
parser `datamodules.sources.classic.load_vaswani`), the first `docs` passages in DOCNO order.
Model: `ranker` (repbert: cosine, or bert_dot) on the packaged all-MiniLM-L6-v2 (`backbone="minilm"`, offline),
untrained heads; speed does not depend on the weights.

Measured, in one process:
1. Index building, per precision: `DenseIndex.build(ranker, docs, index_type="flat")` end to end (streamed
   tokenisation, encoding under inference_mode, +bf16 autocast for bf16, normalisation, faiss add) -> passages/s.
   Then, per other index type, the faiss-only build time from the fp32 vectors (HNSW graph construction, IVF
   training...), since encoding is the same for every type.
2. Search, per index type (fp32 vectors): `index.search(queries, k)` end to end (query encoding + faiss) and
   faiss alone on pre-encoded query vectors -> queries/s; median of `repeats`. For approximate types, recall@k
   against the flat index's top k; for bf16, the top-10 overlap with fp32.
3. `colbert=true`: ColBERT end-to-end on the same passages: `ColBERTIndex.build` passages/s and `search` queries/s
   (k_tokens 64, depth 256, k 100).

The CPU may be shared: each timing records the CPU that *other* processes used meanwhile (cores, from /proc/stat).
The JSON (written atomically) holds machine info, settings and every number.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench import options
from bench.bench_speed import Meter  # wall time and the CPU other processes used meanwhile
from core.io import write_json
from core.versions import library_versions
from datamodules.sources.classic import load_vaswani as parse
from models.rankers import build_ranker, ranker_config
from retrieval.colbert_e2e import ColBERTIndex
from retrieval.dense import DenseIndex, FaissBuilder, IndexOptions

REPO = Path(__file__).resolve().parents[1]
VASWANI = REPO.parent / "shared" / "data" / "vaswani_npl"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def machine() -> dict:
    info = {
        "cpu_model": "unknown",
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import faiss  # lazy: faiss-cpu or faiss-gpu, only dense retrieval needs it
    import transformers  # lazy: heavy, only model building needs it

    info.update(
        faiss=getattr(faiss, "__version__", "?"),
        transformers=transformers.__version__,
        faiss_gpus=faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0,
        cuda=torch.cuda.is_available(),
        versions=library_versions(),  # every library's exact version (core/versions.py), as results/ records carry
    )
    return info


# ---- helpers ---------------------------------------------------------------------------------------------------
def load_vaswani(folder: Path, n_docs: int, n_queries: int):
    docs, queries, _, _ = parse(folder)
    order = sorted(docs, key=lambda d: (0, int(d), d) if d.isdigit() else (1, 0, d))
    qorder = sorted(queries, key=lambda q: (0, int(q), q) if q.isdigit() else (1, 0, q))
    return {d: docs[d] for d in order[:n_docs]}, {q: queries[q] for q in qorder[:n_queries]}


def overlap(a: dict, b: dict, k: int) -> float:
    """Mean |top-k(a) & top-k(b)| / k over queries."""
    vals = []
    for q in a:
        ta = sorted(a[q], key=lambda d: -a[q][d])[:k]
        tb = sorted(b.get(q, {}), key=lambda d: -b[q][d])[:k]
        vals.append(len(set(ta) & set(tb)) / max(1, min(k, len(ta))))
    return float(np.mean(vals)) if vals else float("nan")


def median_timing(fn, repeats: int) -> tuple[float, list[float], list]:
    walls, others, out = [], [], None
    for _ in range(repeats):
        with Meter() as m:
            out = fn()
        walls.append(m.wall)
        others.append(m.others_cores)
    return statistics.median(walls), others, out


# ---- main ------------------------------------------------------------------------------------------------------
@dataclass
class Options:
    docs: int = 2000  # passages indexed (the first N by DOCNO)
    queries: int = 93  # queries searched (Vaswani has 93)
    ranker: str = field(default="repbert", metadata={"choices": ("repbert", "bert_dot")})
    precision: str = "fp32,bf16"  # comma-separated
    index_types: str = "flat,hnsw"  # comma-separated
    k: int = 100
    batch_size: int = 64
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    repeats: int = 3
    colbert: bool = False  # also ColBERT end-to-end
    data: Path = VASWANI
    out: Path = REPO / "bench" / "results" / "retrieval.json"


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)

    import faiss  # lazy: faiss-cpu or faiss-gpu, only dense retrieval needs it

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    if not args.data.exists():
        sys.exit(
            f"error: data: '{args.data}' does not exist; "
            "expected the Vaswani folder (doc-text.trec.gz, query-text.trec)"
        )
    docs, queries = load_vaswani(args.data, args.docs, args.queries)
    precisions = [p for p in args.precision.split(",") if p]
    types = [t for t in args.index_types.split(",") if t]
    print(f"{len(docs)} passages, {len(queries)} queries, {args.ranker} on MiniLM, {args.threads} threads", flush=True)

    torch.manual_seed(0)
    ranker = build_ranker(ranker_config({"name": args.ranker, "backbone": "minilm"})).eval()
    result: dict = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "n_docs": len(docs),
            "n_queries": len(queries),
            "doc_max_len": ranker.cfg.doc_max_len,
            "query_max_len": ranker.cfg.query_max_len,
        },
        "build": {},
        "faiss_build": {},
        "search": {},
    }

    # 1. index building, end to end, per precision (flat)
    flat_by_prec: dict[str, DenseIndex] = {}
    for prec in precisions:
        with Meter() as m:
            index = DenseIndex.build(ranker, docs, batch_size=args.batch_size, precision=prec, index_type="flat")
        flat_by_prec[prec] = index
        pps = len(docs) / m.wall
        result["build"][prec] = {
            "seconds": round(m.wall, 3),
            "passages_per_s": round(pps, 2),
            "others_cores": m.others_cores,
        }
        print(
            f"build flat {prec:5s}: {pps:8.1f} passages/s  ({m.wall:.1f} s, other processes {m.others_cores} cores)",
            flush=True,
        )

    base_prec = "fp32" if "fp32" in flat_by_prec else precisions[0]
    flat = flat_by_prec[base_prec]
    vecs = flat.index.reconstruct_n(0, len(flat))

    # faiss-only build of the other types from the same vectors
    indexes = {"flat": flat}
    for t in types:
        if t == "flat":
            continue
        opts = IndexOptions.from_kwargs(index_type=t)
        with Meter() as m:
            b = FaissBuilder(opts)
            for s in range(0, len(vecs), 4096):
                b.add(vecs[s : s + 4096])
            faiss_index, params = b.finish()
        manifest = {**flat.manifest, "index_type": t, "params": params}
        indexes[t] = DenseIndex(faiss_index, flat.doc_ids, manifest, ranker, flat.pair_tokenizer, b.placement)
        result["faiss_build"][t] = {
            "seconds": round(m.wall, 4),
            "vectors_per_s": round(len(vecs) / m.wall, 1),
            "params": params,
            "others_cores": m.others_cores,
        }
        print(f"faiss build {t:5s}: {m.wall:.3f} s for {len(vecs)} vectors {params}", flush=True)

    # 2. search
    qvecs = np.concatenate(
        [v for _, v in flat.encode_queries(queries, batch_size=args.batch_size, precision=base_prec)]
    )
    runs = {}
    for t, index in indexes.items():
        wall, others, run = median_timing(
            lambda index=index: index.search(queries, k=args.k, batch_size=args.batch_size, precision=base_prec),
            args.repeats,
        )
        fwall, _, _ = median_timing(lambda index=index: index.search_vectors(qvecs, args.k), max(args.repeats, 5))
        runs[t] = run
        entry = {
            "end_to_end_queries_per_s": round(len(queries) / wall, 2),
            "faiss_only_queries_per_s": round(len(queries) / fwall, 1),
            "end_to_end_seconds": round(wall, 4),
            "faiss_only_seconds": round(fwall, 5),
            "others_cores": others,
        }
        if t != "flat":
            entry[f"recall_at_{args.k}_vs_flat"] = round(overlap(runs["flat"], run, args.k), 4)
        result["search"][t] = entry
        print(
            f"search {t:5s}: {entry['end_to_end_queries_per_s']:8.1f} queries/s end to end, "
            f"{entry['faiss_only_queries_per_s']:10.1f} queries/s faiss only"
            + (f", recall@{args.k} vs flat {entry[f'recall_at_{args.k}_vs_flat']:.3f}" if t != "flat" else ""),
            flush=True,
        )
    for prec, index in flat_by_prec.items():
        if prec != base_prec:
            run = index.search(queries, k=10, batch_size=args.batch_size, precision=prec)
            result["build"][prec]["top10_overlap_with_" + base_prec] = round(overlap(runs["flat"], run, 10), 4)
            print(
                f"{prec} index + queries: top-10 overlap with {base_prec} "
                f"{result['build'][prec]['top10_overlap_with_' + base_prec]:.3f}"
            )

    # 3. ColBERT end-to-end
    if args.colbert:
        torch.manual_seed(0)
        colbert = build_ranker(ranker_config({"name": "colbert", "backbone": "minilm"})).eval()
        with Meter() as m:
            cidx = ColBERTIndex.build(colbert, docs, batch_size=args.batch_size, precision=base_prec)
        wall, others, _ = median_timing(
            lambda: cidx.search(queries, k=args.k, k_tokens=64, depth=256, batch_size=args.batch_size), args.repeats
        )
        result["colbert_e2e"] = {
            "build_passages_per_s": round(len(docs) / m.wall, 2),
            "build_seconds": round(m.wall, 3),
            "tokens": cidx.n_tokens,
            "queries_per_s": round(len(queries) / wall, 2),
            "k_tokens": 64,
            "depth": 256,
            "others_cores": [m.others_cores, *others],
        }
        print(
            f"colbert e2e: build {len(docs) / m.wall:.1f} passages/s ({cidx.n_tokens} tokens), "
            f"search {len(queries) / wall:.1f} queries/s",
            flush=True,
        )

    write_json(args.out, result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
