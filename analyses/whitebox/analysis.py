"""The white-box ColBERT analyses (Formal et al., sections 3-4) on a re-ranking setting.

`python evaluate.py analysis=whitebox [ckpt=...] [data=...] [analysis.key=value]`: the white-box ColBERT analyses
(Formal et al., sections 3-4) on a re-ranking setting: for each query of a split, its candidate set S_q (the
source's candidate lists, else the BM25 top-`candidate_depth`, the run the data module re-ranks), scored by the
ranker's own Eq. 1.

- term importance (section 3, Figure 1): per query word, tau_AP between the ranking of S_q and the ranking with the
  word's subword rows removed from Eq. 1, averaged per word over queries, vs word IDF; in both of Urbano & Marrero's
  variants, tau_AP,a (`tau_ap_a`) and tau_AP,b (`tau_ap_b`), since the paper does not say which (tau_ap.py);
- exact vs soft matches (section 4, Eq. 2, Figure 2): Delta_ES(w) = sum of Delta_ES(t) over the word's subwords, vs
  word IDF (delta_es.py);
- spectral ratio (section 4, Figure 3): lambda_1 / sum(lambda) of each query subword's contextual vectors in the
  encoded passages (the candidates, or the whole collection with `spectral_passages: collection`), a seeded sample
  of at most `spectral_max_occurrences`, vs subword IDF (spectral.py); also over exactly
  `spectral_equal_occurrences` vectors, which removes the small-sample floor of the ratio (1/n).

Pearson r of each against IDF (idf.py: BM25's IDF over the collection) next to the paper's -0.4, 0.667 and 0.77.
The model is the checkpoint's ranker (`ckpt=`) or `model=colbert` untrained (the backbone as pre-trained);
`with_backbone: true` adds the untrained backbone (no projection layer, as the paper's "non fine-tuned version")
to the same run, on the same queries and candidates, and the figures overlay both.

Writes into `output_dir`: `whitebox_term_importance.png` (a panel per tau_AP variant), `whitebox_delta_es.png`,
`whitebox_spectral.png`, then `whitebox.json` (definitions, settings, timings, and per model: correlations, every
word, every subword, every query's per-word values); logs the r values (any logger: `whitebox/<model>/<statistic>/
pearson_r` and `/n`, statistics `tau_ap_a`, `tau_ap_b`, `delta_es`, `spectral`), and on W&B the word and subword
tables and the figures.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

from analyses.loading import analysed_model_config, analysed_rankers
from analyses.outputs import analysis_set, log_analysis, placed, write_result
from analyses.registry import ANALYSES, AnalysisConfig, analysis_options
from analyses.whitebox.aggregate import (
    TAU_AP_KEYS,
    correlations,
    delta_es_of,
    subword_rows,
    word_rows,
)
from analyses.whitebox.collect import (
    QueryResult,
    analyse_query,
    encode_texts,
    query_maxsim,
    spectral_by_subword,
)
from analyses.whitebox.idf import collection_idf
from analyses.whitebox.plots import scatter
from analyses.whitebox.words import query_words
from core.errors import InputError, check_choice
from datamodules.bm25 import bm25_candidates
from datamodules.sources import data_config, load_dataset, used_splits
from models.rankers import ranker_capabilities, rankers_with

JSON_NAME = "whitebox.json"
STATISTICS = ("term_importance", "delta_es", "spectral")
SPLIT_CHOICES = ("train", "val", "test", "all")
# The correlations (keys of "correlations", "paper_pearson_r", W&B's whitebox/<model>/<key>/...) of each statistic.
CORRELATIONS = {"term_importance": tuple(TAU_AP_KEYS.values()), "delta_es": ("delta_es",), "spectral": ("spectral",)}
# The paper's Pearson r (TREC DL 2019+2020, BERT-base ColBERT): Figure 1 (one tau_AP, variant unstated), 2 and 3.
PAPER_R = {"tau_ap_a": -0.4, "tau_ap_b": -0.4, "delta_es": 0.667, "spectral": 0.77}
LABELS = {
    "tau_ap_a": "tau_AP,a vs IDF (words)",
    "tau_ap_b": "tau_AP,b vs IDF (words)",
    "delta_es": "Delta_ES vs IDF (words)",
    "spectral": "spectral ratio vs IDF (subwords)",
}


@dataclasses.dataclass
class WhiteboxConfig(AnalysisConfig):
    """configs/analysis/whitebox.yaml."""

    name: str = "whitebox"
    takes_eval_sample: ClassVar[bool] = True  # its questions: the re-rankers' sample under data.max_eval_queries
    statistics: list[str] = dataclasses.field(default_factory=lambda: list(STATISTICS))
    split: str = "test"  # train | val | test | all (every split's queries)
    max_queries: int | None = None  # a seeded sample of the split's queries; null = all
    candidate_depth: int | None = None  # |S_q|; null = data.candidate_depth
    skip_punctuation: bool = True  # punctuation-only words are not analysed (their rows stay in Eq. 1)
    spectral_passages: str = "candidates"  # candidates (the union of the S_q) | collection (every passage)
    spectral_max_occurrences: int = 1000
    spectral_min_occurrences: int = 5
    spectral_equal_occurrences: int | None = 20
    with_backbone: bool = False
    batch_size: int = 64  # passages per forward pass
    seed: int | None = None  # occurrence and query samples; null = the run seed

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the split whose queries it reads (`split`; `all`: every split)."""
        return used_splits(self.split)

    def candidate_depth_unread(self) -> str | None:
        """Its candidate lists (the source's or BM25's) are cut at data.candidate_depth unless its own is set."""
        return None if self.candidate_depth is None else f"analysis.candidate_depth={self.candidate_depth} replaces it"

    def __post_init__(self):
        if not self.statistics or any(s not in STATISTICS for s in self.statistics):
            raise InputError(
                "config key 'analysis.statistics'",
                f"is {list(self.statistics)}; expected a non-empty subset of {list(STATISTICS)}",
            )
        check_choice("analysis.split", self.split, SPLIT_CHOICES)
        check_choice("analysis.spectral_passages", self.spectral_passages, ("candidates", "collection"))
        for key in ("max_queries", "candidate_depth"):
            v = getattr(self, key)
            if v is not None and v < (2 if key == "candidate_depth" else 1):
                raise InputError(
                    f"config key 'analysis.{key}'",
                    f"is {v}; expected a positive count"
                    f"{' >= 2 (a ranking needs two passages)' if key == 'candidate_depth' else ''}, or null",
                )
        if self.spectral_max_occurrences < 2 or self.spectral_min_occurrences < 1 or self.batch_size < 1:
            raise InputError(
                "config key 'analysis.spectral_max_occurrences'",
                f"is {self.spectral_max_occurrences} (min {self.spectral_min_occurrences}, batch {self.batch_size}); "
                "expected max >= 2, min >= 1, batch_size >= 1",
            )
        eq = self.spectral_equal_occurrences
        if eq is not None and not 2 <= eq <= self.spectral_max_occurrences:
            raise InputError(
                "config key 'analysis.spectral_equal_occurrences'",
                f"is {eq}; expected 2..spectral_max_occurrences ({self.spectral_max_occurrences}), or null",
            )


# ---- input --------------------------------------------------------------------------------------------------
def queries_and_candidates(
    ds, dc, opts: WhiteboxConfig, seed: int, run_seed: int, split_key: str = "analysis.split"
) -> tuple[list[str], dict[str, str], dict[str, list[str]], int]:
    """Return the analysed queries, their texts, their candidate sets S_q and the candidate depth.

    (qids, qid -> text, qid -> candidate doc ids, depth): the split's queries with at least two candidates, sorted;
    under `data.max_eval_queries` only those of the re-rankers' sample (`IRDataset.eval_sample`, drawn with
    `run_seed`), so that an analysis sees a grid's questions. `analysis.max_queries` then keeps a sample of them drawn
    with `seed`, so an analysis can take fewer questions than the re-rankers, never others.
    """
    depth = int(opts.candidate_depth or dc.candidate_depth)
    sample = ds.eval_sample(opts.split, dc, run_seed, split_key)
    names = [s for s in ("train", "val", "test") if s in ds.splits] if opts.split == "all" else [opts.split]
    texts: dict[str, str] = {}
    cands: dict[str, list[str]] = {}
    for name in names:
        split = ds.split(name)
        queries = split.queries if sample is None else {q: split.queries[q] for q in sample}
        if split.candidates is not None:
            got = {q: list(c)[:depth] for q, c in split.candidates.items() if q in queries}
        else:  # the data module's BM25 run (same cache key), so the candidates are the ones evaluation re-ranks
            got = bm25_candidates(ds.docs, queries, depth, dc.cache_dir, f"{ds.name}-{name}")
        for q, c in got.items():
            c = list(dict.fromkeys(c))
            if len(c) >= 2:
                texts[q], cands[q] = split.queries[q], c
    qids = sorted(cands)
    if not qids:
        raise InputError(
            "analysis.split", f"split '{opts.split}' of dataset {ds.name} has no query with two or more candidates"
        )
    if opts.max_queries is not None and len(qids) > opts.max_queries:
        pick = np.random.default_rng([seed, 7]).permutation(len(qids))[: opts.max_queries]
        qids = sorted(qids[i] for i in pick)
    return qids, texts, cands, depth


def _check_eq1(name: str) -> None:
    """Raise InputError unless the ranker `name` scores by ColBERT's Eq. 1 (its index family is `colbert`)."""
    if ranker_capabilities(name).index != "colbert":
        raise InputError(
            "model.name",
            f"is '{name}'; the white-box analysis reads ColBERT's Eq. 1, a ranker of index family colbert "
            f"({' or '.join(rankers_with(lambda c: c.index == 'colbert'))}, or a checkpoint of one)",
        )


def _models(cfg, model_from_cli: bool, with_backbone: bool) -> dict:
    """Label -> the loaded ranker: the checkpoint's (or the untrained one), and with a checkpoint the backbone."""
    if with_backbone and not cfg.ckpt:
        _say("analysis.with_backbone: no ckpt given, so the analysed model is already the untrained backbone")

    def plain(model: dict) -> dict:
        if "compress_dim" in model:  # the paper's backbone has no projection; rankers without one have no such key
            model["compress_dim"] = None
        return model

    return analysed_rankers(
        cfg,
        model_from_cli,
        trained_label="fine-tuned",
        with_backbone=with_backbone,
        check=lambda model: _check_eq1(model["name"]),
        backbone=plain,
    )


# ---- one model ----------------------------------------------------------------------------------------------
def analyse_model(
    loaded, qids, qtexts, cands, doc_ids: list[str], ds, idf, opts: WhiteboxConfig, seed: int, label: str = ""
) -> dict:
    """Every statistic for one ranker (rows, correlations, per-query values, timings)."""
    ranker, c = loaded.ranker, loaded.config
    tok = ranker.tokenizer
    stats = list(opts.statistics)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    q_ids, q_words = query_words(tok, [qtexts[q] for q in qids], c.query_max_len)
    if opts.skip_punctuation:
        q_words = [[w for w in ws if not w.punctuation] for ws in q_words]
    d_tok = tok([ds.docs[d] for d in doc_ids], truncation=True, max_length=c.doc_max_len)["input_ids"]
    timings["tokenize_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _say(f"encoding {len(doc_ids):,} passages and {len(qids):,} queries ({label})")
    docs = encode_texts(ranker, d_tok, "doc", opts.batch_size, tok.pad_token_id)
    timings["encode_passages_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    queries = encode_texts(ranker, q_ids, "query", opts.batch_size, tok.pad_token_id)
    timings["encode_queries_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _say(f"per-query statistics ({label})")
    index = {d: i for i, d in enumerate(doc_ids)}
    results, per_query = [], []
    need_matches = "term_importance" in stats or "delta_es" in stats
    for k, q in enumerate(qids):
        if not need_matches:
            break
        cand = [index[d] for d in cands[q]]
        res = analyse_query(
            query_maxsim(queries, k, docs, cand), q_words[k], "term_importance" in stats, "delta_es" in stats
        )
        results.append(res)
        per_word_diff: dict[str, float] = {}
        for key, _pos, _tid, diff in res.differences:
            per_word_diff[key] = per_word_diff.get(key, 0.0) + diff  # NaN stays NaN
        per_query.append(
            {
                "qid": q,
                "query": qtexts[q],
                "candidates": len(cand),
                "words": [
                    {
                        "word": key,
                        **{name: _num(res.tau[v].get(key)) for v, name in TAU_AP_KEYS.items()},
                        "delta_es": _num(per_word_diff.get(key)),
                        "exact_match_share": res.exact_share[key],
                    }
                    for key in dict.fromkeys(w.key for w in q_words[k])
                ],
            }
        )
    timings["per_query_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    query_subwords: dict[int, int] = {}
    for ws in q_words:
        for w in ws:
            for t in w.subwords:
                query_subwords[t] = query_subwords.get(t, 0) + 1
    spectral = None
    if "spectral" in stats:
        spectral = spectral_by_subword(
            docs,
            query_subwords,
            opts.spectral_max_occurrences,
            opts.spectral_min_occurrences,
            opts.spectral_equal_occurrences,
            seed,
        )
    timings["spectral_s"] = time.perf_counter() - t0

    dES = delta_es_of(results) if "delta_es" in stats else None
    tokens = dict(zip(query_subwords, tok.convert_ids_to_tokens(list(query_subwords))))
    words = word_rows(q_words, results if need_matches else [QueryResult() for _ in qids], idf, tokens, dES)
    subwords = subword_rows(query_subwords, idf, tokens, query_subwords, dES, spectral)
    return {
        "ranker": {k: v for k, v in dataclasses.asdict(c).items()},
        "passages_encoded": len(doc_ids),
        "tokens_encoded": docs.n_tokens,
        "correlations": correlations(words, subwords, stats, per_query),
        "words": words,
        "subwords": subwords,
        "queries": per_query,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }


def _say(msg: str) -> None:
    print(f"[whitebox] {msg}", flush=True)


def _num(v):
    return None if v is None or v != v else float(v)


# ---- the whole analysis -------------------------------------------------------------------------------------
def analyse(cfg, opts: WhiteboxConfig, model_from_cli: bool = False) -> dict:
    """Read and check all input, run every model and return the result; nothing is written here."""
    seed = int(cfg.seed if opts.seed is None else opts.seed)
    timings: dict[str, float] = {}
    _check_eq1(analysed_model_config(cfg)["name"])  # before reading anything (ckpt: its recorded config)
    t0 = time.perf_counter()
    dc = data_config(cfg)
    ds = load_dataset(dc, int(cfg.seed), opts.splits_read())
    timings["load_data_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()  # the questions before the models: a bad sample is a one-line error before any loading
    qids, qtexts, cands, depth = queries_and_candidates(ds, dc, opts, seed, int(cfg.seed))
    timings["candidates_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    models = _models(cfg, model_from_cli, opts.with_backbone)
    timings["load_models_s"] = time.perf_counter() - t0
    if opts.spectral_passages == "collection" and "spectral" in opts.statistics:
        doc_ids = sorted(ds.docs)
    else:
        doc_ids = sorted({d for q in qids for d in cands[q]})
    first = next(iter(models.values()))
    t0 = time.perf_counter()
    idf = collection_idf(first.ranker.tokenizer, [ds.docs[d] for d in sorted(ds.docs)])
    timings["idf_s"] = time.perf_counter() - t0
    per_model = {}
    for label, loaded in models.items():
        t0 = time.perf_counter()
        per_model[label] = analyse_model(loaded, qids, qtexts, cands, doc_ids, ds, idf, opts, seed, label)
        timings[f"model_{label}_s"] = time.perf_counter() - t0
    return {
        "definition": {
            "score": "Eq. 1: s(q, d) = sum over query tokens ([CLS], words, [SEP]) of max over passage tokens of the "
            "cosine of the ranker's token vectors; no [Q]/[D] markers",
            "words": "pre-tokens of the backbone tokenizer (lower-cased, split at whitespace and punctuation), keyed "
            "by their WordPiece subwords joined; [CLS]/[SEP] never analysed"
            + ("; punctuation-only words not analysed" if opts.skip_punctuation else ""),
            "term_importance": "tau_AP between the ranking of S_q and the ranking with every occurrence of the word's "
            "subword rows removed from Eq. 1, mean over queries, in both of Urbano & Marrero's "
            "variants (the paper does not say which): tau_ap_a = tau_AP,a (the original ranking as "
            "the truth, its ties broken by candidate order; the expectation over orders of the "
            "masked ranking's ties; Yilmaz et al.'s tau_AP when there are no ties), tau_ap_b = "
            "tau_AP,b (symmetric, ties in both; without ties the mean of Yilmaz's tau_AP in both "
            "directions)",
            "delta_es": "Eq. 2 per subword type (mean over its query occurrences with both exact and soft matches in "
            "S_q), summed over the word's subwords",
            "spectral": f"lambda_1 / sum(lambda), singular values of the subword's unit contextual vectors in the "
            f"{opts.spectral_passages} passages, <= {opts.spectral_max_occurrences} sampled, "
            f"subwords with >= {opts.spectral_min_occurrences}; spectral_ratio_equal over exactly "
            f"{opts.spectral_equal_occurrences} vectors",
            "idf": "ln(1 + (N - df + 0.5) / (df + 0.5)) over every passage of the collection (full text)",
            "correlation": "Pearson r (scipy.stats.pearsonr) against IDF, one point per word (subword for spectral)",
        },
        "settings": {
            **{k: v for k, v in dataclasses.asdict(opts).items() if k != "name"},
            "source": dc.source,
            "dataset": ds.name,
            "queries": len(qids),
            "candidate_depth": depth,
            "collection_passages": len(ds.docs),
            "seed": seed,
            "checkpoint": cfg.ckpt,
        },
        "paper_pearson_r": PAPER_R,
        "models": per_model,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }


def write_outputs(result: dict, out: str | Path) -> tuple[list[Path], Path]:
    """Write the figures, then the JSON (last, so a JSON means a finished analysis), each atomically."""
    out = Path(out)
    s = result["settings"]
    sub = f"{s['dataset']} {s['split']}, {s['queries']} queries, |S_q| <= {s['candidate_depth']}"
    stats = [k for k in STATISTICS if k in s["statistics"]]
    pngs = [scatter(k, result["models"], out, sub) for k in stats]
    return pngs, write_result(out, JSON_NAME, result)


def log_result(cfg, result: dict, pngs: list[Path]) -> None:
    """Log each model's Pearson r against IDF (and n) to the configured logger; on W&B also the tables and figures.

    Keys: `whitebox/<model>/<statistic>/pearson_r` and `/n`; nothing with logger=none.
    """
    scalars, tables = {}, {}
    for label, res in result["models"].items():
        for stat, c in res["correlations"].items():
            if c["pearson_r"] is not None:
                scalars[f"whitebox/{label}/{stat}/pearson_r"] = c["pearson_r"]
                scalars[f"whitebox/{label}/{stat}/n"] = c["n"]
        for kind in ("words", "subwords"):
            rows = res[kind]
            if rows:
                cols = list(rows[0])
                tables[f"whitebox/{label}/{kind}"] = (cols, [[_cell(r[c]) for c in cols] for r in rows])
    images = {f"whitebox/{Path(p).stem.removeprefix('whitebox_')}": p for p in pngs}
    log_analysis(
        cfg,
        "whitebox",
        scalars=scalars,
        tables=tables,
        images=images,
        summary={"whitebox": {m: r["correlations"] for m, r in result["models"].items()}},
    )


def _cell(v):
    return " ".join(v) if isinstance(v, list) else v


def print_summary(result: dict) -> None:
    """Print the setting, each statistic's correlations with IDF per model beside the paper's r, and the timings."""
    s = result["settings"]
    print(
        f"white-box ColBERT: {s['dataset']} ({s['collection_passages']:,} passages), split {s['split']}, "
        f"{s['queries']} queries, |S_q| <= {s['candidate_depth']}"
    )
    print(f"{'statistic':<34}{'model':<12}{'n':>6}{'Pearson r':>11}{'p':>10}{'Spearman':>10}{'paper r':>9}")
    for stat in (key for s in STATISTICS for key in CORRELATIONS[s]):
        for label, res in result["models"].items():
            c = res["correlations"].get(stat)
            if c is None:
                continue
            fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
            print(
                f"{LABELS[stat]:<34}{label:<12}{c['n']:>6}{fmt(c['pearson_r'], '.3f'):>11}"
                f"{fmt(c['p_value'], '.1e'):>10}"
                f"{fmt(c['spearman_rho'], '.3f'):>10}{PAPER_R[stat]:>9}"
            )
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result["timings_s"].items()))


def run(cfg, opts: WhiteboxConfig, model_from_cli: bool = False) -> dict:
    """Run the white-box analysis: compute, write the figures and `whitebox.json` into `cfg.output_dir`, log, print.

    Returns the result that `whitebox.json` holds.
    """
    result = analyse(cfg, opts, model_from_cli)
    with analysis_set(cfg.output_dir, JSON_NAME) as stage:
        pngs, js = write_outputs(result, stage)
    pngs, (js,) = placed(cfg.output_dir, pngs), placed(cfg.output_dir, [js])
    log_result(cfg, result, pngs)
    print_summary(result)
    print(f"wrote {js} and {', '.join(str(p) for p in pngs)}")
    return result


@ANALYSES.register("whitebox", schema=WhiteboxConfig)
def _from_config(cfg, model_from_cli: bool = False) -> dict:
    return run(cfg, analysis_options(cfg), model_from_cli)
