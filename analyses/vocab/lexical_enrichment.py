"""Lexical enrichment of a single-vector ranker's query and passage vectors at inference.

`python evaluate.py analysis=lexical_enrichment ckpt=... data=cranfield analysis.mlm_head=PATH`: lexical
enrichment (Ram et al., section 6.2, Eq. 4-5; enrichment.py) of a single-vector ranker's (RepBERT, BERT_DOT) query
and passage vectors at inference, on any collection (zero-shot when the checkpoint was trained elsewhere).

Each query of `val_split` and `test_split` re-ranks its candidate set (the source's lists, else the BM25
top-`candidate_depth`, as evaluation does) with the ranker's own score (RepBERT's cosine, BERT_DOT's dot) of the
enriched vectors e' = e + lambda e_lex / ||e_lex||. lambda is the value of `lambdas` with the best mean
`measure` on `val_split` (ties: the smaller), unless `lam` fixes it; lambda = 0 is the ranker as it is. The test
split then compares the chosen lambda with lambda = 0 per query (`significance` test). `ablations` repeat this for
the paper's section 6.4 variants (no_idf, static, no_whitening, no_normalization), each with its own lambda.

s_t (Eq. 4) is optimised for the vocabulary items of the texts analysed only (on a CPU the whole 30k vocabulary costs
hours), cached under `data.cache_dir/single_tokens/` (keyed by the head: its weights, activation and epsilon, and the
optimisation settings; `<key>.pt.sha256` beside it is its record, and a file that no longer matches it is optimised
again with a warning); the whitening is fitted on those s_t.
Writes `lexical_enrichment_lambda.png` (validation measure vs lambda per variant), then `lexical_enrichment.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import types
import warnings
from pathlib import Path
from typing import ClassVar

import torch

from analyses.loading import analysed_model_config
from analyses.outputs import analysis_set, log_analysis, write_result
from analyses.registry import ANALYSES, AnalysisConfig, analysis_options
from analyses.vocab.analysis import check_ranker, encode, load_models
from analyses.vocab.enrichment import (
    enrich,
    idf_weights,
    lexical_vectors,
    single_token_embeddings,
    text_tokens,
    vocabulary_of,
    whiten,
)
from analyses.vocab.mlm_head import check_head_source, load_mlm_head
from analyses.whitebox.analysis import queries_and_candidates
from analyses.whitebox.idf import collection_idf
from core.digests import sidecar_problem, write_sidecar
from core.errors import InputError, check_choice
from core.inputs import input_path
from core.io import atomic_open, save_figure
from core.ranges import COUNT, NON_NEGATIVE, POSITIVE, check_ranges
from datamodules.sources import data_config, load_dataset, used_splits
from metrics.ir import check_measures, evaluate_run
from metrics.significance import check_test, p_value, significance_mark
from models.rankers import ranker_capabilities, rankers_with

JSON_NAME = "lexical_enrichment.json"
ABLATIONS = ("no_idf", "static", "no_whitening", "no_normalization")


@dataclasses.dataclass
class LexicalEnrichmentConfig(AnalysisConfig):
    """configs/analysis/lexical_enrichment.yaml."""

    name: str = "lexical_enrichment"
    takes_eval_sample: ClassVar[bool] = True  # its questions: the re-rankers' sample under data.max_eval_queries
    # a head from fit_mlm_head; null = the backbone checkpoint's own MLM head
    mlm_head: str | None = input_path("file", "a head written by python evaluate.py analysis=fit_mlm_head")
    lambdas: list[float] = dataclasses.field(
        default_factory=lambda: [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0]
    )
    lam: float | None = None  # a fixed lambda (no selection on validation)
    idf: bool = True
    single_token: str = "optimised"  # optimised (Eq. 4) | static (the input embeddings v_t)
    whitening: bool = True
    normalize: bool = True
    ablations: list[str] = dataclasses.field(default_factory=list)
    val_split: str = "val"
    test_split: str = "test"
    measure: str = "ndcg_cut_10"
    significance: str = "t_test_two_tailed"
    candidate_depth: int | None = None
    st_lr: float = 0.01
    st_threshold: float = 0.1
    st_max_steps: int = 1000
    st_batch_size: int = 1024
    batch_size: int = 64

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the splits it tunes and tests on (`val_split`, `test_split`)."""
        return used_splits(self.val_split, self.test_split)

    def candidate_depth_unread(self) -> str | None:
        """Its candidate lists (the source's or BM25's) are cut at data.candidate_depth unless its own is set."""
        return None if self.candidate_depth is None else f"analysis.candidate_depth={self.candidate_depth} replaces it"

    def __post_init__(self):
        check_choice("analysis.single_token", self.single_token, ("optimised", "static"))
        check_test(self.significance, "analysis.significance", paired=True)
        check_measures([self.measure], "config key 'analysis.measure'")  # at compose, as eval.measures
        if not self.lambdas or 0.0 not in [float(x) for x in self.lambdas] or any(float(x) < 0 for x in self.lambdas):
            raise InputError(
                "config key 'analysis.lambdas'",
                f"is {list(self.lambdas)}; expected non-negative values including 0 (the ranker as it is)",
            )
        bad = [a for a in self.ablations if a not in ABLATIONS]
        if bad:
            raise InputError("config key 'analysis.ablations'", f"has {bad}; expected a subset of {list(ABLATIONS)}")
        for key in ("val_split", "test_split"):
            check_choice(f"analysis.{key}", getattr(self, key), ("train", "val", "test"))
        check_ranges(
            "analysis",
            self,
            st_max_steps=COUNT,
            st_batch_size=COUNT,
            batch_size=COUNT,
            st_lr=POSITIVE,
            st_threshold=POSITIVE,
            lam=NON_NEGATIVE,
            candidate_depth=COUNT,
        )

    def variant(self, ablation: str | None) -> dict:
        """Return the enrichment switches (idf, single_token, whitening, normalize) of one section 6.4 ablation.

        `ablation` None: the configured ones; otherwise the configured ones with that ablation's switch changed
        (`no_idf`: w = 1, `static`: v_t for s_t, `no_whitening`, `no_normalization`).
        """
        v = {
            "idf": self.idf,
            "single_token": self.single_token,
            "whitening": self.whitening,
            "normalize": self.normalize,
        }
        if ablation == "no_idf":
            v["idf"] = False
        elif ablation == "static":
            v["single_token"] = "static"
        elif ablation == "no_whitening":
            v["whitening"] = False
        elif ablation == "no_normalization":
            v["normalize"] = False
        return v


def _say(msg: str) -> None:
    print(f"[lexical enrichment] {msg}", flush=True)


def _head_digest(head) -> str:
    # the activation and LayerNorm epsilon too: a backbone's own MLM head takes them from its config.json, so a
    # same-size edit there ("gelu" -> "relu") is another head with the same tensors
    h = hashlib.sha256(f"{head.act_name}|{head.norm.eps!r}|".encode())
    for t in (head.dense.weight, head.dense.bias, head.norm.weight, head.norm.bias, head.bias, head.embeddings):
        h.update(t.detach().float().numpy().tobytes())
    return h.hexdigest()[:24]


def cached_single_tokens(
    head, token_ids: list[int], opts: LexicalEnrichmentConfig, cache_dir
) -> tuple[torch.Tensor, dict]:
    """Return s_t (Eq. 4) of `token_ids` [n, d] in that order, and a summary (items, reached, steps).

    Only items not in the cache are optimised; the cache is keyed by the head (its weights, activation and LayerNorm
    epsilon) and the optimisation settings.
    """
    key = f"{_head_digest(head)}-lr{opts.st_lr}-ce{opts.st_threshold}-max{opts.st_max_steps}"
    path = Path(cache_dir) / "single_tokens" / f"{key}.pt" if cache_dir else None
    store = {"ids": [], "vectors": None, "ce": None, "steps": None}
    if path is not None and path.exists():
        # its record beside it (core.digests: bytes, SHA-256, stat when written): a changed file is optimised again
        problem = sidecar_problem(path)
        if problem is None:
            try:
                store = torch.load(path, weights_only=False)
            except Exception as e:  # noqa: BLE001 - a damaged file of any kind is recomputed
                problem = f"it is unreadable ({type(e).__name__})"
        if problem is not None:
            warnings.warn(f"single-token cache '{path}': {problem}; optimising its items again", stacklevel=2)
    have = {t: i for i, t in enumerate(store["ids"])}
    missing = [t for t in token_ids if t not in have]
    t0 = time.perf_counter()
    if missing:
        _say(f"optimising s_t (Eq. 4) for {len(missing):,} vocabulary items ({len(token_ids) - len(missing):,} cached)")
        st = single_token_embeddings(
            head,
            missing,
            head.embeddings[missing],
            opts.st_lr,
            opts.st_threshold,
            opts.st_max_steps,
            opts.st_batch_size,
            log=_say,
        )
        cat = lambda a, b: b if a is None else torch.cat([a, b])  # noqa: E731
        store = {
            "ids": store["ids"] + missing,
            "vectors": cat(store["vectors"], st.vectors),
            "ce": cat(store["ce"], st.cross_entropy),
            "steps": cat(store["steps"], st.steps),
        }
        if path is not None:
            with atomic_open(path, "wb") as f:
                torch.save(store, f)
            write_sidecar(path)
        have = {t: i for i, t in enumerate(store["ids"])}
    rows = torch.tensor([have[t] for t in token_ids], dtype=torch.long)
    ce, steps = store["ce"][rows], store["steps"][rows]
    reached = ce <= opts.st_threshold
    return store["vectors"][rows], {
        "items": len(token_ids),
        "optimised_now": len(missing),
        "reached_threshold": int(reached.sum()),
        "max_cross_entropy": float(ce.max()),
        "median_steps_reached": float(steps[reached].float().median()) if reached.any() else None,
        "seconds": round(time.perf_counter() - t0, 2),
        "cache": str(path) if path else None,
    }


def _split_queries(ds, dc, split: str, depth: int | None, seed: int, key: str) -> tuple[list[str], dict, dict, dict]:
    """Return the judged questions of `split` (chosen by the config key `key`), their texts, candidates and qrels.

    Under `data.max_eval_queries`, the re-rankers' sample of them (drawn with the run `seed`).
    """
    shim = types.SimpleNamespace(split=split, candidate_depth=depth, max_queries=None)
    qids, texts, cands, _ = queries_and_candidates(ds, dc, shim, 0, seed, key)
    qrels = ds.split(split).qrels
    qids = [q for q in qids if any(g > 0 for g in qrels.get(q, {}).values())]
    if not qids:
        raise InputError(
            key,
            f"split '{split}' of {ds.name} has no judged query with candidates",
        )
    return qids, texts, cands, {q: qrels[q] for q in qids}


def _evaluate(ranker, eq, ep, qids, cands, prow, qrels, measure) -> tuple[float, dict[str, float]]:
    qv, pv = ranker.scoring_vectors(eq), ranker.scoring_vectors(ep)
    run = {}
    for k, q in enumerate(qids):
        rows = [prow[d] for d in cands[q]]
        scores = (pv[rows] @ qv[k]).double().numpy()
        run[q] = {d: float(s) for d, s in zip(cands[q], scores)}
    means, per_query = evaluate_run(run, qrels, [measure])
    return means[measure], {q: v[measure] for q, v in per_query.items()}


def analyse(cfg, opts: LexicalEnrichmentConfig, model_from_cli: bool = False) -> dict:
    """Run lexical enrichment (Eq. 4-5) and each ablation: choose lambda on validation, compare with lambda = 0 on test.

    Reads and checks all input (the data before the head and the model), computes s_t once, and returns per
    variant the validation curve, the chosen lambda and the test measure without and with enrichment, with the
    paired test's p-value and per-query values; nothing is written here.
    """
    timings = {}
    t0 = time.perf_counter()
    model_cfg = analysed_model_config(cfg)  # what ckpt records, read without its tensors
    check_ranker(model_cfg)
    if ranker_capabilities(model_cfg["name"]).vectors != "single":
        single = " or ".join(rankers_with(lambda c: c.vectors == "single"))
        raise InputError(
            "model.name",
            f"is '{model_cfg['name']}'; lexical enrichment (Eq. 5) adds to one vector per text: {single}",
        )
    check_head_source(model_cfg["backbone"], opts.mlm_head)  # from the files, before the data
    dc = data_config(cfg)  # the data before the head and the model: bad data is a one-line error before any loading
    ds = load_dataset(dc, int(cfg.seed), opts.splits_read())
    # one entry per split (val_split = test_split: one), named in errors by the key that chose it
    keys = {opts.val_split: "analysis.val_split", opts.test_split: "analysis.test_split"}
    splits = {s: _split_queries(ds, dc, s, opts.candidate_depth, int(cfg.seed), key) for s, key in keys.items()}
    head, head_source = load_mlm_head(model_cfg["backbone"], opts.mlm_head)
    loaded = next(iter(load_models(cfg, model_from_cli, False).values()))
    ranker, c = loaded.ranker, loaded.config
    tok = ranker.tokenizer
    doc_ids = sorted({d for qids, _, cands, _ in splits.values() for q in qids for d in cands[q]})
    prow = {d: i for i, d in enumerate(doc_ids)}
    idf = collection_idf(tok, [ds.docs[d] for d in sorted(ds.docs)])
    timings["load_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _say(f"encoding {len(doc_ids):,} passages and {sum(len(v[0]) for v in splits.values()):,} queries")
    p_tok = text_tokens(tok, [ds.docs[d] for d in doc_ids], c.doc_max_len)
    ep = encode(
        ranker,
        tok([ds.docs[d] for d in doc_ids], truncation=True, max_length=c.doc_max_len)["input_ids"],
        "doc",
        opts.batch_size,
        tok.pad_token_id,
    ).sequence
    enc_q, q_tok = {}, {}
    for s, (qids, texts, _, _) in splits.items():
        qt = [texts[q] for q in qids]
        q_tok[s] = text_tokens(tok, qt, c.query_max_len)
        enc_q[s] = encode(
            ranker,
            tok(qt, truncation=True, max_length=c.query_max_len)["input_ids"],
            "query",
            opts.batch_size,
            tok.pad_token_id,
        ).sequence
    timings["encode_s"] = time.perf_counter() - t0

    vocab = vocabulary_of(p_tok + [x for v in q_tok.values() for x in v])
    table = {t: i for i, t in enumerate(vocab)}
    w = idf_weights(idf, vocab)
    variants = [None, *opts.ablations]
    need_opt = any(opts.variant(a)["single_token"] == "optimised" for a in variants)
    t0 = time.perf_counter()
    st_vectors, st_summary = cached_single_tokens(head, vocab, opts, dc.cache_dir) if need_opt else (None, None)
    timings["single_tokens_s"] = time.perf_counter() - t0

    results = {}
    for a in variants:
        v = opts.variant(a)
        base = st_vectors if v["single_token"] == "optimised" else head.embeddings[vocab].float()
        S = whiten(base)[0] if v["whitening"] else base
        weights = w if v["idf"] else None
        lex_p = lexical_vectors(p_tok, table, S, weights)
        lex_q = {s: lexical_vectors(q_tok[s], table, S, weights) for s in splits}
        grid = [float(opts.lam)] if opts.lam is not None else sorted({float(x) for x in opts.lambdas})
        val_qids, _, val_cands, val_qrels = splits[opts.val_split]
        curve = {}
        for lam in grid:
            curve[lam], _ = _evaluate(
                ranker,
                enrich(enc_q[opts.val_split], lex_q[opts.val_split], lam, v["normalize"]),
                enrich(ep, lex_p, lam, v["normalize"]),
                val_qids,
                val_cands,
                prow,
                val_qrels,
                opts.measure,
            )
        best = grid[0] if opts.lam is not None else max(grid, key=lambda x: (curve[x], -x))
        tq, _, t_cands, t_qrels = splits[opts.test_split]
        m0, pq0 = _evaluate(ranker, enc_q[opts.test_split], ep, tq, t_cands, prow, t_qrels, opts.measure)
        m1, pq1 = _evaluate(
            ranker,
            enrich(enc_q[opts.test_split], lex_q[opts.test_split], best, v["normalize"]),
            enrich(ep, lex_p, best, v["normalize"]),
            tq,
            t_cands,
            prow,
            t_qrels,
            opts.measure,
        )
        qs = sorted(pq0)
        p = p_value([pq1[q] for q in qs], [pq0[q] for q in qs], opts.significance) if best != 0 else None
        results[a or "le"] = {
            "variant": v,
            "validation": {str(k): val for k, val in curve.items()},
            "lambda": best,
            "test": {
                "without_le": m0,
                "with_le": m1,
                "delta": m1 - m0,
                "p_value": p,
                "mark": significance_mark(p),
                "queries": len(qs),
            },
            "per_query": {q: {"without_le": pq0[q], "with_le": pq1[q]} for q in qs},
        }
    return {
        "definition": {
            "eq5": "e' = e + lambda e_lex / ||e_lex||, e_lex = 1/n sum_i IDF(x_i) s_{x_i} "
            "over the text's WordPiece tokens (specials excluded)",
            "eq4": f"s_t = argmin CE(MLM-Head(s), t), Adam lr {opts.st_lr}, from v_t, "
            f"kept at CE <= {opts.st_threshold} (max {opts.st_max_steps} steps)",
            "lambda": f"best validation {opts.measure} over lambdas on split '{opts.val_split}' (ties: smaller)",
            "score": "the ranker's own (RepBERT: cosine of e'; BERT_DOT: dot) over each query's candidates",
        },
        "settings": {
            **{k: v for k, v in dataclasses.asdict(opts).items() if k != "name"},
            "mlm_head_source": head_source,
            "dataset": ds.name,
            "passages_encoded": len(doc_ids),
            "vocabulary_items": len(vocab),
            "checkpoint": cfg.ckpt,
            "ranker": dataclasses.asdict(c),
        },
        "single_tokens": st_summary,
        "results": results,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }


def plot(result: dict, out: Path) -> Path:
    """Draw the validation measure against lambda per variant into `out/lexical_enrichment_lambda.png`; return it."""
    import matplotlib  # lazy: heavy, only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only figures need it

    s = result["settings"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in result["results"].items():
        xs = sorted(float(k) for k in r["validation"])
        ax.plot(xs, [r["validation"][str(x)] for x in xs], marker="o", label=f"{name} (lambda = {r['lambda']})")
    ax.set_xlabel("lambda")
    ax.set_ylabel(f"validation {s['measure']}")
    ax.set_title(f"Lexical enrichment (Eq. 5) on {s['dataset']} {s['val_split']}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out / "lexical_enrichment_lambda.png")


def run(cfg, opts: LexicalEnrichmentConfig, model_from_cli: bool = False) -> dict:
    """Run the lexical-enrichment analysis: compute, write the figure and the JSON as a set, log, print.

    Returns the result that `lexical_enrichment.json` holds.
    """
    result = analyse(cfg, opts, model_from_cli)
    out = Path(cfg.output_dir)
    with analysis_set(out, JSON_NAME) as stage:
        png = out / plot(result, stage).name
        write_result(stage, JSON_NAME, result)
    js = out / JSON_NAME
    rows = [
        [n, r["lambda"], r["test"]["without_le"], r["test"]["with_le"], r["test"]["p_value"], r["test"]["mark"]]
        for n, r in result["results"].items()
    ]
    log_analysis(
        cfg,
        "lexical_enrichment",
        scalars={f"le/{n}/{k}": r["test"][k] for n, r in result["results"].items() for k in ("without_le", "with_le")},
        tables={"le/results": (["variant", "lambda", "without_le", "with_le", "p_value", "mark"], rows)},
        images={"le/lambda": png},
    )
    s = result["settings"]
    print(
        f"lexical enrichment on {s['dataset']} ({s['measure']}, {s['test_split']}; lambda on {s['val_split']}), "
        f"head {s['mlm_head_source']}"
    )
    if result["single_tokens"]:
        st = result["single_tokens"]
        print(
            f"s_t: {st['reached_threshold']:,} of {st['items']:,} items reached CE <= {opts.st_threshold} "
            f"(max CE {st['max_cross_entropy']:.3f})"
        )
    for row in rows:
        print(
            f"{row[0]:>18}: lambda {row[1]:<5} without {row[2]:.4f}  with {row[3]:.4f}{row[5]}  "
            f"p {'-' if row[4] is None else format(row[4], '.3g')}"
        )
    print(f"wrote {js} and {png}")
    return result


@ANALYSES.register("lexical_enrichment", schema=LexicalEnrichmentConfig)
def _from_config(cfg, model_from_cli: bool = False) -> dict:
    return run(cfg, analysis_options(cfg), model_from_cli)
