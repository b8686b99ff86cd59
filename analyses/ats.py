"""ATS per positional delta and MATS of a ranker's passage term vectors.

`python evaluate.py analysis=ats ckpt=PATH [analysis.compare.LABEL=PATH ...] [data=...]`: ATS per positional delta
and MATS (position-bias paper section 5, Eq. 8-9, Table 2, Figure 2) of a ranker's passage term vectors.

Passages: a seeded sample of `analysis.passages` passages of the collection (all with `passages: null`), as the
evaluation sees them (Eq. 7-rotated with `data.rotate_eval=true`, one cut per passage). Term vectors:
`models/rankers/terms.py` (TK's p^ of its Eq. 4, the BERT bi-encoders' last layer, BERT_CAT's
passage-side tokens with a query of `analysis.split`, cycled). ATS and MATS: metrics/ats.py (seeded cap of
`max_occurrences` per term); MATS as `eval.mats` says, the key the training-time callback reads: `paper` (default,
Eq. 9 as printed) or `mean`.
`analysis.compare` adds further checkpoints (e.g. {debiased: PATH}) measured on the same passages and overlaid
in the figure, as the paper's Figure 2 compares original and debiased training.

Writes into `output_dir`: `ats.png` (ATS vs delta with a +-1 standard deviation band per model, MATS in the legend),
then `ats.json` (definition, settings, and per model the curve, std, terms and pairs per delta, MATS); logs MATS per
model (any logger), and on W&B the curves as a table and the figure.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from analyses.loading import analysed_rankers
from analyses.outputs import analysis_set, log_analysis, write_result
from analyses.registry import ANALYSES, AnalysisConfig, analysis_options
from core.errors import InputError, check_choice
from core.inputs import input_path
from core.io import save_figure
from datamodules.datamodule import passage_text, rotation_draw
from datamodules.sources import data_config, load_dataset, used_splits
from metrics.ats import average_term_similarity
from metrics.results import print_table
from models.loading import load_ranker
from models.rankers.terms import passage_terms

JSON_NAME = "ats.json"
PNG_NAME = "ats.png"
DEFINITION = (
    "ATS(da) (position-bias paper Eq. 8): mean over terms of the mean cosine of the term's occurrence pairs "
    "in different passages at positional distance da (positions counted over the passage's WordPiece terms, "
    "special tokens excluded). MATS (Eq. 9), over the K deltas da >= 1 with a value: mats_mode 'paper' = "
    "sum of ATS(0) - ATS(da) / (K - 1) (as printed, 1/(max da - 1) x a sum of max da terms), 'mean' = their "
    "mean. std: standard deviation of the pooled pair cosines per da (Figure 2's band); mats_std: std over "
    "da of ATS(0) - ATS(da)."
)


@dataclasses.dataclass
class ATSConfig(AnalysisConfig):
    """configs/analysis/ats.yaml."""

    applies_data: ClassVar[tuple[str, ...]] = ("rotate_eval",)  # its passages as evaluation sees them
    reads_eval: ClassVar[tuple[str, ...]] = ("mats",)  # MATS read as the training-time callback reads it

    name: str = "ats"
    passages: int | None = 2000  # seeded sample of the collection's passages; null = all
    max_occurrences: int = 100  # seeded cap on the occurrences per term
    max_delta: int | None = None  # deltas above are dropped; null = all
    split: str = "test"  # cross-encoders: whose queries are paired with the passages (train | val | test)
    compare: dict[str, str] = input_path("checkpoints", "a ranker checkpoint", factory=dict)  # {label: path}
    label: str | None = None  # the label of `ckpt` in the outputs; null = "trained" (or "untrained" without ckpt)
    batch_size: int = 64  # passages per forward pass
    seed: int | None = None  # passage, query and occurrence samples; null = the run seed

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the split whose queries it pairs with the passages (`split`)."""
        return used_splits(self.split)

    def __post_init__(self):
        check_choice("analysis.split", self.split, ("train", "val", "test"))
        if self.passages is not None and self.passages < 2:
            raise InputError(
                "config key 'analysis.passages'",
                f"is {self.passages}; expected >= 2 (pairs are across passages) or null",
            )
        if self.max_occurrences < 2:
            raise InputError("config key 'analysis.max_occurrences'", f"is {self.max_occurrences}; expected >= 2")
        if self.max_delta is not None and self.max_delta < 1:
            raise InputError("config key 'analysis.max_delta'", f"is {self.max_delta}; expected >= 1 or null")
        if self.batch_size < 1:
            raise InputError("config key 'analysis.batch_size'", f"is {self.batch_size}; expected >= 1")


def _models(cfg, opts: ATSConfig, model_from_cli: bool) -> dict:
    """{label: LoadedRanker}: `ckpt` (or the untrained `model`), then each `compare` checkpoint (any ranker)."""
    first = opts.label or ("trained" if cfg.ckpt else "untrained")
    models = {first: next(iter(analysed_rankers(cfg, model_from_cli).values()))}
    for label, path in opts.compare.items():
        if label in models:
            raise InputError(f"config key 'analysis.compare.{label}'", f"label '{label}' is already used")
        try:
            models[label] = load_ranker(str(path), key="ckpt")
        except InputError as e:
            raise InputError(f"config key 'analysis.compare.{label}'", str(e)) from e
    for label, loaded in models.items():
        if getattr(loaded.ranker, "kind", None) not in ("bi", "cross"):
            raise InputError("analysis=ats", f"model '{label}' ({loaded.name}) has no term representations")
    return models


def analyse(cfg, opts: ATSConfig, model_from_cli: bool = False) -> dict:
    """Compute ATS per positional delta (Eq. 8) and MATS (Eq. 9) of each model on the same sampled passages.

    The data is loaded before the models, so bad data fails before any weights load. Returns the definition, the
    settings, and per model label the curve, std, pairs per delta, MATS, token counts and timings (`ats.json`).
    """
    seed = int(cfg.seed if opts.seed is None else opts.seed)
    dc = data_config(cfg)
    ds = load_dataset(dc, int(cfg.seed), opts.splits_read())  # the data before the models: bad data fails first
    models = _models(cfg, opts, model_from_cli)
    doc_ids = sorted(ds.docs)
    rng = np.random.default_rng([seed, 8])
    if opts.passages is not None and opts.passages < len(doc_ids):
        doc_ids = [doc_ids[i] for i in np.sort(rng.permutation(len(doc_ids))[: opts.passages])]
    texts = [
        passage_text(ds.docs[d], dc.rotate_eval, int(cfg.seed), *rotation_draw(dc.rotation, 0, d)) for d in doc_ids
    ]
    split = ds.split(opts.split)
    qids = sorted(split.queries)
    queries = [split.queries[qids[i]] for i in rng.permutation(len(qids))]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for label, loaded in models.items():
        t0 = time.perf_counter()
        loaded.to(device)
        terms = passage_terms(
            loaded.ranker,
            loaded.tokenizer,
            texts,
            queries=queries if loaded.ranker.kind == "cross" else None,
            batch_size=opts.batch_size,
            device=device,
        )
        t1 = time.perf_counter()
        result = average_term_similarity(
            terms.vectors,
            terms.terms,
            terms.positions,
            terms.passages,
            opts.max_occurrences,
            seed,
            opts.max_delta,
            mats=str(cfg.eval.mats),
        )
        loaded.to("cpu")
        out[label] = {
            "model": loaded.name,
            **result.to_dict(),
            "tokens": len(terms.terms),
            "timings_s": {"encode": t1 - t0, "ats": time.perf_counter() - t1},
        }
    settings = {
        **dataclasses.asdict(opts),
        "seed": seed,
        "data": cfg.data.get("source"),
        "rotate_eval": bool(dc.rotate_eval),
        "mats": str(cfg.eval.mats),
        "ckpt": cfg.ckpt,
        "passages_used": len(texts),
    }
    return {"definition": DEFINITION, "settings": settings, "models": out}


def plot(result: dict):
    """Return the figure of ATS against the positional delta: a line and a +-1 std band per model, MATS in the legend.

    The layout of the position-bias paper's Figure 2.
    """
    import matplotlib  # lazy: heavy, only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only figures need it

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in result["models"].items():
        d = np.array(r["delta"])
        ats = np.array([np.nan if v is None else v for v in r["ats"]], dtype=float)
        std = np.array([np.nan if v is None else v for v in r["std"]], dtype=float)
        ok = np.isfinite(ats)
        mats = r["mats"]
        (line,) = ax.plot(d[ok], ats[ok], label=f"{label} (MATS {mats:.3f})" if mats is not None else label)
        ax.fill_between(d[ok], (ats - std)[ok], (ats + std)[ok], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("positional delta (Δa)")
    ax.set_ylabel("ATS (cosine)")
    ax.set_title("Average term similarity per positional delta (Eq. 8)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def run(cfg, opts: ATSConfig, model_from_cli: bool = False) -> dict:
    """Run the ATS analysis: compute, write `ats.png` then `ats.json` into `cfg.output_dir`, log and print MATS.

    Returns the result that `ats.json` holds.
    """
    result = analyse(cfg, opts, model_from_cli)
    out = Path(cfg.output_dir)
    with analysis_set(out, JSON_NAME) as stage:
        save_figure(plot(result), stage / PNG_NAME)
        result["figure"] = PNG_NAME
        write_result(stage, JSON_NAME, result)
    png, js = out / PNG_NAME, out / JSON_NAME
    models = result["models"]
    rows = [
        [label, d, a, s, n]
        for label, r in models.items()
        for d, a, s, n in zip(r["delta"], r["ats"], r["std"], r["pairs"])
        if a is not None
    ]
    log_analysis(
        cfg,
        f"ats-{out.name}",
        scalars={f"ats/{k}/mats": r["mats"] for k, r in models.items() if r["mats"] is not None},
        tables={"ats/curves": (["model", "delta", "ats", "std", "pairs"], rows)},
        images={"ats/figure": png},
    )
    # the measures under the names a fine-tuning run's metrics.json gives them, in the table every job prints
    print_table(
        {f"{label} ({r['model']})": {k: r[k] for k in ("mats", "mats_std", "ats0")} for label, r in models.items()},
        title="ATS / MATS (position-bias paper Eq. 8-9)",
    )
    for label, r in models.items():
        print(
            f"{label}: {r['tokens']:,} term occurrences, {r['occurrences']:,} after the cap, "
            f"{r['vocabulary']:,} terms with pairs"
        )
    print(f"wrote {png} and {js}")
    return result


@ANALYSES.register("ats", schema=ATSConfig)
def _from_config(cfg, model_from_cli: bool = False) -> dict:
    return run(cfg, analysis_options(cfg), model_from_cli)
