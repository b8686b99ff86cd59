"""Vocabulary projections of a ranker's query and passage representations and the statistics built on them.

`python evaluate.py analysis=vocab_projections [ckpt=...] [data=...] analysis.mlm_head=PATH`: vocabulary
projections of a ranker's query and passage representations (Ram et al., section 3, Eq. 1-3) and the statistics
of sections 5-6 (projections.py) for the checkpoint's ranker and, with `with_backbone`, its untrained backbone:

- Table 1: the top-k tokens of Q and P for a seeded sample of (query, gold passage) pairs, shared tokens marked
  `*`, query-expansion tokens `+`;
- Figure 3: coverage of the shared tokens in the top-k of Q and P vs k; Table 2: token MRR in P of shared vs other
  passage tokens; Figure 4: queries with an expansion token in the top-k of Q vs k;
- Figure 5 (token amnesia): over the queries whose gold passage is in BM25's top-5, max / median rank of the shared
  content tokens in P and Q, split by whether the ranker puts the passage in its top-5 when re-ranking the query's
  candidate set (the BM25 top-`candidate_depth` the evaluation re-ranks, or the source's lists).

The gold passage of a query is its relevant passage of the highest grade (ties: the best BM25 rank, then doc id).
Writes `vocab_projections_coverage.png`, `vocab_projections_expansion.png`, `vocab_projections_amnesia.png`, then
`vocab_projections.json`; logs the scalars, and on W&B Table 1, the curves and the amnesia rows as tables.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from analyses.loading import analysed_model_config, analysed_rankers
from analyses.outputs import analysis_set, log_analysis, placed, write_result
from analyses.registry import ANALYSES, AnalysisConfig, analysis_options
from analyses.vocab.mlm_head import check_head_source, load_mlm_head
from analyses.vocab.projections import (
    PairStats,
    amnesia_row,
    amnesia_summary,
    coverage,
    expansion,
    is_content,
    project,
    rank_in,
    ranks_of,
    token_mrr,
    top_tokens,
)
from analyses.whitebox.analysis import queries_and_candidates
from core.errors import InputError, check_choice
from core.inputs import input_path
from core.io import save_figure
from datamodules.sources import data_config, load_dataset, used_splits
from models.encoding import encode_collection
from models.rankers import ranker_capabilities, rankers_with
from models.rankers.base import EncodedTexts
from models.rankers.capabilities import capabilities_of
from models.rankers.maxsim import c_star

JSON_NAME = "vocab_projections.json"


@dataclasses.dataclass
class VocabProjectionsConfig(AnalysisConfig):
    """configs/analysis/vocab_projections.yaml."""

    name: str = "vocab_projections"
    takes_eval_sample: ClassVar[bool] = True  # its questions: the re-rankers' sample under data.max_eval_queries
    # a head from fit_mlm_head; null = the backbone checkpoint's own MLM head
    mlm_head: str | None = input_path("file", "a head written by python evaluate.py analysis=fit_mlm_head")
    split: str = "test"
    max_queries: int | None = None
    candidate_depth: int | None = None
    k_values: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])
    top_k: int = 20  # tokens per side in Table 1
    table_pairs: int = 10  # pairs in Table 1
    amnesia_top: int = 5  # "retrieved" = in the top-this of BM25 (selection) and of the ranker (split)
    with_backbone: bool = True
    batch_size: int = 64
    seed: int | None = None

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the split whose queries and candidates it projects (`split`)."""
        return used_splits(self.split)

    def candidate_depth_unread(self) -> str | None:
        """Its candidate lists (the source's or BM25's) are cut at data.candidate_depth unless its own is set."""
        return None if self.candidate_depth is None else f"analysis.candidate_depth={self.candidate_depth} replaces it"

    def __post_init__(self):
        check_choice("analysis.split", self.split, ("train", "val", "test", "all"))
        if not self.k_values or any(int(k) < 1 for k in self.k_values):
            raise InputError(
                "config key 'analysis.k_values'",
                f"is {list(self.k_values)}; expected a non-empty list of positive ranks",
            )
        for key in ("top_k", "table_pairs", "amnesia_top", "batch_size"):
            if getattr(self, key) < 1:
                raise InputError(f"config key 'analysis.{key}'", f"is {getattr(self, key)}; expected >= 1")
        for key in ("max_queries", "candidate_depth"):
            v = getattr(self, key)
            if v is not None and v < (2 if key == "candidate_depth" else 1):
                raise InputError(
                    f"config key 'analysis.{key}'", f"is {v}; expected a positive count (candidate_depth >= 2), or null"
                )


def _say(msg: str) -> None:
    print(f"[vocab] {msg}", flush=True)


def check_ranker(model, where: str = "model.name") -> None:
    """Check that Eq. 3 applies to the ranker of the `model` config, else raise InputError at `where`.

    That is a bi-encoder with an index family (one pooled vector, or Eq. 1 over token vectors, as `candidate_scores`
    scores them) whose vectors have the backbone's width (no compression layer).
    """
    name = model["name"]
    if ranker_capabilities(name).index is None:
        raise InputError(
            where,
            f"is '{name}'; vocabulary projections read {rankers_with(lambda c: c.index is not None)} "
            "(single-vector or per-token bi-encoders with an index family)",
        )
    if model.get("compress_dim"):
        raise InputError(
            "model.compress_dim",
            f"is {model['compress_dim']}; the MLM head reads vectors of the backbone's width (compress_dim null)",
        )


def load_models(cfg, model_from_cli: bool, with_backbone: bool) -> dict:
    """Label -> the loaded ranker: the checkpoint's (or the untrained one), and with a checkpoint its backbone."""
    return analysed_rankers(cfg, model_from_cli, with_backbone=with_backbone, check=check_ranker)


def encode(ranker, ids: list[list[int]], side: str, batch_size: int, pad_id: int) -> EncodedTexts:
    """Encode `ids` into the vectors Eq. 3 projects.

    As `encode` returns them: ColBERT's token vectors, the pooled vector of the single-vector rankers (their token
    vectors are not kept).
    """
    return encode_collection(
        ranker,
        ids,
        side,
        batch_size=batch_size,
        pad_id=pad_id,
        scoring=False,
        keep_tokens=capabilities_of(ranker).vectors == "multi",
    )


def project_texts(head, enc: EncodedTexts, rows) -> torch.Tensor:
    """Eq. 3 of texts `rows`: their pooled vectors, or ColBERT's token vectors max-pooled (`project`)."""
    if enc.sequence is not None:
        return project(head, enc.sequence[torch.as_tensor(rows, dtype=torch.long)])
    p = enc.padded(rows)
    return project(head, p.tokens, p.mask)


def candidate_scores(ranker, q: EncodedTexts, k: int, docs: EncodedTexts, index: list[int]) -> np.ndarray:
    """Return the ranker's scores of query k against passages `index`.

    The dot of the scoring vectors (RepBERT's cosine, BERT_DOT's dot), or ColBERT's sum over query tokens of the
    max cosine over passage tokens.
    """
    if q.sequence is not None:
        idx = torch.as_tensor(index, dtype=torch.long)
        return (ranker.scoring_vectors(docs.sequence[idx]) @ ranker.scoring_vectors(q.sequence[k])).double().numpy()
    d = docs.padded(index)
    dv = ranker.scoring_vectors(d.tokens) * d.mask[..., None]
    best = c_star(torch.einsum("id,pjd->pij", ranker.scoring_vectors(q.tokens(k)), dv), d.mask[:, None, :])  # [n, Lq]
    return best.sum(-1).double().numpy()


def gold_passages(ds, qids, cands) -> dict[str, str]:
    """Qid -> its relevant passage of the highest grade (ties: the best candidate rank, then doc id)."""
    qrels = {}
    for split in ds.splits.values():
        for q, rel in split.qrels.items():
            qrels.setdefault(q, {}).update(rel)
    out = {}
    for q in qids:
        rel = {d: g for d, g in qrels.get(q, {}).items() if g > 0 and d in ds.docs}
        if rel:
            pos = {d: i for i, d in enumerate(cands.get(q, []))}
            out[q] = min(rel, key=lambda d: (-rel[d], pos.get(d, len(pos)), d))
    return out


def analyse_model(loaded, head, qids, qtexts, gold, cands, ds, opts: VocabProjectionsConfig, label: str) -> dict:
    """Compute one model's vocabulary-projection statistics (Ram et al., sections 5-6) on the (query, gold) pairs.

    Encodes the queries and the candidate and gold passages once, projects each pair with Eq. 3 and returns Table 1's
    rows, the coverage (Figure 3), the token MRR (Table 2), the expansion shares (Figure 4), the token-amnesia rows
    and summary (Figure 5, re-ranking each BM25-top query's candidates) and the timings.
    """
    ranker, c = loaded.ranker, loaded.config
    tok = ranker.tokenizer
    special = set(tok.all_special_ids)
    timings = {}
    pairs_q = [q for q in qids if q in gold]
    doc_ids = sorted({d for q in qids for d in cands[q]} | set(gold.values()))
    row_of = {d: i for i, d in enumerate(doc_ids)}
    t0 = time.perf_counter()
    q_ids = tok([qtexts[q] for q in qids], truncation=True, max_length=c.query_max_len)["input_ids"]
    d_ids = tok([ds.docs[d] for d in doc_ids], truncation=True, max_length=c.doc_max_len)["input_ids"]
    _say(f"encoding {len(doc_ids):,} passages and {len(qids):,} queries ({label})")
    docs = encode(ranker, d_ids, "doc", opts.batch_size, tok.pad_token_id)
    queries = encode(ranker, q_ids, "query", opts.batch_size, tok.pad_token_id)
    timings["encode_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    qrow = {q: i for i, q in enumerate(qids)}
    k_max = max(max(opts.k_values), opts.top_k)
    names = tok.convert_ids_to_tokens(list(range(len(tok))))
    pairs, table = [], []
    gold_rows = [row_of[gold[q]] for q in pairs_q]
    q_rows = [qrow[q] for q in pairs_q]
    for s in range(0, len(pairs_q), opts.batch_size):
        sl = slice(s, s + opts.batch_size)
        qi, di = q_rows[sl], gold_rows[sl]
        Q, P = project_texts(head, queries, qi), project_texts(head, docs, di)
        for j, q in enumerate(pairs_q[sl]):
            tq = set(q_ids[qi[j]]) - special
            tp = set(d_ids[di[j]]) - special
            both = tq | tp
            ps = PairStats(
                q,
                tq,
                tp,
                ranks_of(Q[j], both),
                ranks_of(P[j], both),
                top_tokens(Q[j], k_max),
                {t for t in both if is_content(names[t])},
            )
            pairs.append(ps)
            if len(table) < opts.table_pairs:
                top_p = top_tokens(P[j], opts.top_k)

                def mark(t, ps=ps, tp=tp):
                    return names[t] + ("*" if t in ps.shared else "+" if t in tp and t in ps.content else "")

                table.append(
                    {
                        "qid": q,
                        "query": qtexts[q],
                        "passage_id": gold[q],
                        "passage": ds.docs[gold[q]][:400],
                        "top_Q": " ".join(mark(t) for t in ps.top_q[: opts.top_k]),
                        "top_P": " ".join(mark(t) for t in top_p),
                    }
                )
    timings["project_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    amnesia_rows, bm25_hits = [], 0
    by_qid = {p.qid: p for p in pairs}
    for q in pairs_q:
        cand = cands[q]
        if gold[q] not in cand[: opts.amnesia_top]:
            continue
        bm25_hits += 1
        scores = candidate_scores(ranker, queries, qrow[q], docs, [row_of[d] for d in cand])
        row = amnesia_row(by_qid[q], rank_in(scores, cand.index(gold[q])), opts.amnesia_top)
        if row is not None:
            amnesia_rows.append(row)
    timings["amnesia_s"] = time.perf_counter() - t0
    ks = sorted(set(int(k) for k in opts.k_values))
    return {
        "ranker": dataclasses.asdict(c),
        "pairs": len(pairs),
        "table1": table,
        "coverage": {str(k): v for k, v in coverage(pairs, ks).items()},
        "token_mrr": token_mrr(pairs),
        "expansion": {
            **(e := expansion(pairs, ks)),
            "queries_with_expansion": {str(k): v for k, v in e["queries_with_expansion"].items()},
        },
        "amnesia": {
            "bm25_top_queries": bm25_hits,
            "queries": len(amnesia_rows),
            **amnesia_summary(amnesia_rows),
            "rows": amnesia_rows,
        },
        "passages_encoded": len(doc_ids),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }


def analyse(cfg, opts: VocabProjectionsConfig, model_from_cli: bool = False) -> dict:
    """Read and check all input, run every model and return the result; nothing is written here."""
    seed = int(cfg.seed if opts.seed is None else opts.seed)
    model = analysed_model_config(cfg)  # what ckpt records, read without its tensors
    check_ranker(model)
    check_head_source(model["backbone"], opts.mlm_head)  # from the files, before the data
    t0 = time.perf_counter()
    # the data and the head first: bad data or a missing head is a one-line error before any model is loaded
    dc = data_config(cfg)
    ds = load_dataset(dc, int(cfg.seed), opts.splits_read())
    qids, qtexts, cands, depth = queries_and_candidates(ds, dc, opts, seed, int(cfg.seed))
    gold = gold_passages(ds, qids, cands)
    if not gold:
        raise InputError("analysis.split", f"no query of split '{opts.split}' of {ds.name} has a relevant passage")
    timings = {"data_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    head, head_source = load_mlm_head(model["backbone"], opts.mlm_head)
    models = load_models(cfg, model_from_cli, opts.with_backbone)
    timings["load_models_s"] = time.perf_counter() - t0
    per_model = {}
    for label, loaded in models.items():
        t0 = time.perf_counter()
        per_model[label] = analyse_model(loaded, head, qids, qtexts, gold, cands, ds, opts, label)
        timings[f"model_{label}_s"] = time.perf_counter() - t0
    return {
        "definition": {
            "projection": "Eq. 3: log-softmax of the MLM head (Eq. 1) applied to the pooled vector (RepBERT mean, "
            "BERT_DOT [CLS]); ColBERT: max over the text's tokens of the per-token log-probabilities",
            "rank": "1 + number of vocabulary items with a larger log-probability",
            "tokens": "WordPiece ids of the text as encoded (truncated), special tokens excluded; content tokens: "
            "no stopword (Lucene's 33), not punctuation only",
            "gold": "the query's relevant passage of the highest grade (ties: best candidate rank, then doc id)",
            "coverage": "share of shared tokens (pooled over pairs) with rank <= k in Q / in P",
            "token_mrr": "mean over (pair, token) of 1 / rank_P(t)",
            "expansion": "share of queries with a content token of the gold passage, absent from the query, "
            "in Q's top-k",
            "amnesia": f"queries whose gold passage is in BM25's top-{opts.amnesia_top}; shared content tokens' max / "
            f"median rank in P and Q; retrieved = the ranker ranks the passage in its top-{opts.amnesia_top} "
            "of the query's candidates",
        },
        "settings": {
            **{k: v for k, v in dataclasses.asdict(opts).items() if k != "name"},
            "mlm_head_source": head_source,
            "dataset": ds.name,
            "queries": len(qids),
            "pairs": len(gold),
            "candidate_depth": depth,
            "collection_passages": len(ds.docs),
            "seed": seed,
            "checkpoint": cfg.ckpt,
        },
        "models": per_model,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }


def plots(result: dict, out: Path) -> list[Path]:
    """Draw Figures 3, 4 and 5 (coverage, query expansion, token amnesia) of every model into `out`.

    Returns the PNG paths written.
    """
    import matplotlib  # lazy: heavy, only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only figures need it

    s = result["settings"]
    sub = f"{s['dataset']} {s['split']}, {s['pairs']} pairs"
    models = result["models"]
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, side in zip(axes, ("Q", "P")):
        for label, res in models.items():
            ks = [int(k) for k in res["coverage"]]
            ax.plot(ks, [res["coverage"][str(k)][side] for k in ks], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("k")
        ax.set_title(f"shared tokens in the top-k of {side}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("coverage")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Figure 3: coverage of shared query/passage tokens ({sub})", fontsize=9)
    paths.append(save_figure(fig, out / "vocab_projections_coverage.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, res in models.items():
        e = res["expansion"]["queries_with_expansion"]
        ks = [int(k) for k in e]
        ax.plot(ks, [e[str(k)] for k in ks], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("k")
    ax.set_ylabel("share of queries")
    ax.set_title(f"Figure 4: queries with a query-expansion token in the top-k of Q\n{sub}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    paths.append(save_figure(fig, out / "vocab_projections_expansion.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, side in zip(axes, ("P", "Q")):
        data, labels = [], []
        for label, res in models.items():
            for g, flag in (("top", True), ("missed", False)):
                data.append(
                    [r[f"max_rank_{side}"] for r in res["amnesia"]["rows"] if r["retrieved"] == flag] or [np.nan]
                )
                labels.append(f"{label}\n{g}-{s['amnesia_top']}")
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel(f"max rank in {side} of shared tokens")
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Figure 5: token amnesia, queries with the gold passage in BM25's top-{s['amnesia_top']} ({s['dataset']})",
        fontsize=9,
    )
    paths.append(save_figure(fig, out / "vocab_projections_amnesia.png"))
    return paths


def log_result(cfg, result: dict, pngs: list[Path]) -> None:
    """Log coverage @20 / @100 and token MRR per model to the configured logger; on W&B also tables and figures.

    The W&B tables: Table 1, the coverage and expansion curves and the amnesia rows; nothing with logger=none.
    """
    scalars, tables = {}, {}
    for label, res in result["models"].items():
        for k in ("20", "100"):
            if k in res["coverage"]:
                for side in ("Q", "P"):
                    if res["coverage"][k][side] is not None:
                        scalars[f"vocab/{label}/coverage_{side}@{k}"] = res["coverage"][k][side]
        for g, v in res["token_mrr"].items():
            if v["mrr"] is not None:
                scalars[f"vocab/{label}/token_mrr_{g}"] = v["mrr"]
        rows = res["table1"]
        if rows:
            cols = list(rows[0])
            tables[f"vocab/{label}/table1"] = (cols, [[r[c] for c in cols] for r in rows])
        tables[f"vocab/{label}/coverage"] = (
            ["k", "Q", "P"],
            [[int(k), v["Q"], v["P"]] for k, v in res["coverage"].items()],
        )
        e = res["expansion"]["queries_with_expansion"]
        tables[f"vocab/{label}/expansion"] = (["k", "share"], [[int(k), v] for k, v in e.items()])
        am = res["amnesia"]["rows"]
        if am:
            tables[f"vocab/{label}/amnesia"] = (list(am[0]), [list(r.values()) for r in am])
    images = {f"vocab/{Path(p).stem.removeprefix('vocab_projections_')}": p for p in pngs}
    log_analysis(cfg, "vocab_projections", scalars=scalars, tables=tables, images=images)


def print_summary(result: dict, written: list[Path]) -> None:
    """Print per model the coverage, token MRR, expansion shares and token amnesia, then the timings and files."""
    s = result["settings"]
    print(
        f"vocabulary projections: {s['dataset']}, split {s['split']}, {s['pairs']} pairs, head {s['mlm_head_source']}"
    )
    for label, res in result["models"].items():
        cov = res["coverage"]
        cv = " ".join(
            f"@{k} Q {v['Q']:.3f} P {v['P']:.3f}"
            for k, v in cov.items()
            if k in ("5", "20", "100") and v["Q"] is not None
        )
        m = res["token_mrr"]
        fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        print(
            f"{label:>10}: coverage {cv}; token MRR in P shared {fmt(m['shared']['mrr'])} "
            f"passage-only {fmt(m['passage_only']['mrr'])}"
        )
        e = res["expansion"]["queries_with_expansion"]
        print(
            f"{'':>10}  queries with an expansion token in Q's top-k: "
            + " ".join(f"@{k} {fmt(v)}" for k, v in e.items())
        )
        a = res["amnesia"]
        print(
            f"{'':>10}  amnesia ({a['queries']} of {a['bm25_top_queries']} BM25-top queries): median max rank P "
            f"retrieved {a['retrieved']['median_max_rank_P']} / missed {a['missed']['median_max_rank_P']} "
            f"({a['retrieved']['queries']} / {a['missed']['queries']} queries)"
        )
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result["timings_s"].items()))
    print("wrote " + ", ".join(str(p) for p in written))


def run(cfg, opts: VocabProjectionsConfig, model_from_cli: bool = False) -> dict:
    """Run the vocabulary-projection analysis: compute, write the figures and the JSON as a set, log, print.

    Returns the result that `vocab_projections.json` holds.
    """
    result = analyse(cfg, opts, model_from_cli)
    out = Path(cfg.output_dir)
    with analysis_set(out, JSON_NAME) as stage:
        pngs = placed(out, plots(result, stage))
        write_result(stage, JSON_NAME, result)
    js = out / JSON_NAME
    log_result(cfg, result, pngs)
    print_summary(result, [js, *pngs])
    return result


@ANALYSES.register("vocab_projections", schema=VocabProjectionsConfig)
def _from_config(cfg, model_from_cli: bool = False) -> dict:
    return run(cfg, analysis_options(cfg), model_from_cli)
