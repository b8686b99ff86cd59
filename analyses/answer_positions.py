"""Answer-position analysis (position-bias paper, Sec. 4.1 and Figure 1).

The distribution of relative answer start positions in the relevant passages of a split, before and after rotation
(Eq. 7), and of the position-biased training split when one is configured.

    python evaluate.py analysis=answer_positions data=squad_biased output_dir=outputs/answer-positions-squad
                       [analysis.split=train] [analysis.epochs=1] [analysis.bins=20] [analysis.spans=all|first]

Any source with answer spans (`squad`, `synthetic`, `ir_datasets` with answer strings such as msmarco-qna); the keys
are configs/analysis/answer_positions.yaml, validated like every group's. Series, for the chosen split:

- `original`: the passages as they are, with `data.answer_bias_keep_first` switched off (the whole split);
- `rotated`: the same units, rotated as training (`data.rotate_train`) or evaluation (`data.rotate_eval`) rotates
  them, with the run `seed`: with `data.rotation=per_passage` (default, the paper's one debiased instance per
  passage) one cut per doc id in training and evaluation alike; with `per_epoch` training cuts per triple and epoch;
- `biased`, `biased_rotated` (train split, when `data.answer_bias_keep_first` is set): the position-biased training
  split of datamodules/answer_bias.py, as is ("original (biased)" training) and rotated ("debiased" training:
  the same config with data.rotate_train=true).

`analysis.epochs` pools the rotated series of epochs 0..epochs-1. Only `per_epoch` training differs between epochs:
with `data.rotation=per_passage` (default), and for val/test under either setting, every epoch is identical to
epoch 0, so `epochs=N` repeats each position N times (counts scale by N; the shape and every share are unchanged).

Definitions: analyses/positions.py (word-based relative start, all spans vs first, units) and
analyses/position_stats.py (statistics, KS / chi-square / KL against uniform). Writes into `output_dir`, each file
atomically: `answer_positions.png` (Figure 1 layout: one panel per training set, original vs rotated), then
`answer_positions.json` (definitions, settings, the filter's counts and every series' statistics). With
`logger=wandb` (offline without a key) or `logger=csv`, the statistics are logged as `answer_positions/<series>/
<stat>`, and the PNG as the W&B image `answer_positions/histogram`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from analyses.outputs import analysis_set, log_analysis, placed
from analyses.position_plot import plot_histograms
from analyses.position_stats import summarize
from analyses.positions import SPAN_MODES, eval_units, relative_starts, train_units
from analyses.registry import ANALYSES, AnalysisConfig, analysis_options
from core.errors import InputError
from core.io import write_json
from datamodules.answer_bias import apply_answer_bias, describe
from datamodules.corpus import SPLITS
from datamodules.datamodule import RankingDataModule
from datamodules.sources import data_config, load_dataset, used_splits

JSON_NAME = "answer_positions.json"
PNG_NAME = "answer_positions.png"
SCALARS = ("count", "mean", "median", "share_first_10", "share_first_25", "share_first_k", "kl_uniform_nats")


@dataclasses.dataclass
class Options:
    """What `analyse` computes: the split, rotated epochs to pool, histogram bins and which answer spans count.

    The same keys as `AnswerPositionsConfig` (configs/analysis/answer_positions.yaml), without the analysis name.
    """

    split: str = "train"
    epochs: int = 1
    bins: int = 20
    spans: str = "all"

    def splits_read(self) -> tuple[str, ...]:
        """Return the splits `analyse` loads: `split`."""
        return used_splits(self.split)

    def check(self, prefix: str = "analysis.") -> None:
        """`prefix`: how the options are named in errors (the config keys `analysis.split`, ...)."""
        if self.split not in SPLITS:
            raise InputError(f"{prefix}split", f"is '{self.split}'; expected one of {list(SPLITS)}")
        if self.epochs < 1:
            raise InputError(
                f"{prefix}epochs", f"is {self.epochs}; expected the number of rotated epochs to pool, >= 1"
            )
        if self.bins < 1:
            raise InputError(f"{prefix}bins", f"is {self.bins}; expected a number of histogram bins >= 1")
        if self.spans not in SPAN_MODES:
            raise InputError(f"{prefix}spans", f"is '{self.spans}'; expected one of {list(SPAN_MODES)}")


@dataclasses.dataclass
class AnswerPositionsConfig(AnalysisConfig):
    """`python evaluate.py analysis=answer_positions data=...` (configs/analysis/answer_positions.yaml)."""

    needs_answers: ClassVar[bool] = True
    reads_training_triples: ClassVar[bool] = True  # the triples' positives, cut as data.rotate_train cuts them

    name: str = "answer_positions"
    split: str = "train"
    epochs: int = 1
    bins: int = 20
    spans: str = "all"

    def __post_init__(self):
        self.options().check("analysis.")

    def options(self) -> Options:
        """Return the config's keys as the `Options` that `analyse` and `run` take."""
        return Options(self.split, self.epochs, self.bins, self.spans)

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the split whose answers it reads (`split`), as `analyse` loads it."""
        return self.options().splits_read()


def _units(dc, ds, split: str, seed: int):
    if split != "train":
        return eval_units(ds, split)
    # the triples training builds (BM25 or random negatives, max_train_triples), so the rotation keys match
    return train_units(ds, RankingDataModule(dc, tokenizer=None, seed=seed).train_triples(ds), dc.rotation)


def analyse(cfg, opts: Options) -> dict:
    """Every series' statistics (module doc); reads and checks all input before anything is written."""
    opts.check()
    dc = data_config(cfg)
    seed = int(cfg.seed)
    k = dc.answer_bias_keep_first
    plain = dataclasses.replace(dc, answer_bias_keep_first=None, answer_bias_late_keep=0.0)
    ds = load_dataset(plain, seed, opts.splits_read())
    if not ds.answers:
        raise InputError(
            "data.source",
            f"dataset {ds.name} has no answer spans; expected a source with answers "
            "(squad, synthetic, ir_datasets with answer strings)",
        )
    sets = {"": (plain, ds)}
    bias_counts = None
    if k is not None and opts.split == "train":
        biased = apply_answer_bias(ds, float(k), float(dc.answer_bias_late_keep), int(dc.answer_bias_seed))
        sets["biased"] = (dc, biased)
        bias_counts = biased.answer_bias
    series: dict[str, dict] = {}
    for prefix, (conf, data) in sets.items():
        units = _units(conf, data, opts.split, seed)
        if not units:
            raise InputError(
                "data.source", f"split '{opts.split}' of dataset {data.name} has no relevant passage with answer spans"
            )
        for rotate in (False, True):
            name = "_".join(p for p in (prefix, "rotated" if rotate else "") if p) or "original"
            values = relative_starts(data, units, opts.spans, rotate=rotate, seed=seed, epochs=opts.epochs)
            series[name] = {
                **summarize(values, opts.bins, k),
                "units": len(units),
                "questions": len({u.qid for u in units}),
            }
    return {
        "definition": {
            "relative_start": "index of the whitespace word holding the answer span's first character / "
            "number of words of the whitespace-normalized passage, in [0, 1) (analyses/positions.py)",
            "spans": opts.spans,
            "units": (
                "training triples' positives with answer spans, rotated as data.rotate_train rotates them: "
                + (
                    "one cut per doc id, the same at every epoch (data.rotation=per_passage)"
                    if dc.rotation == "per_passage"
                    else "a cut per triple and epoch (data.rotation=per_epoch)"
                )
            )
            if opts.split == "train"
            else "(question, relevant passage) pairs with answer spans, one cut per doc id (data.rotate_eval)",
            "uniform_tests": "ks_uniform: Kolmogorov-Smirnov D to U(0,1); "
            "chi2_uniform: Pearson chi-square of the bin counts; "
            "kl_uniform_nats: KL(binned || uniform)",
        },
        "settings": {
            "source": dc.source,
            "dataset": ds.name,
            "split": opts.split,
            "seed": seed,
            "rotation": dc.rotation,
            "epochs": opts.epochs,
            "bins": opts.bins,
            "answer_bias_keep_first": k,
            "answer_bias_late_keep": dc.answer_bias_late_keep if k is not None else None,
        },
        "answer_bias": bias_counts,
        "series": series,
        "figure": PNG_NAME,
    }


def write_outputs(result: dict, out: str | Path) -> tuple[Path, Path]:
    """Write the PNG, then the JSON (last, so a JSON means a finished analysis), both atomically."""
    out = Path(out)
    s, settings = result["series"], result["settings"]
    split = settings["split"]
    panels = [(f"{settings['dataset']} {split}: all questions", {"original": s["original"], "rotated": s["rotated"]})]
    if "biased" in s:
        c = result["answer_bias"]
        panels.append(
            (
                f"biased split: answer in the first {c['keep_first']:g} "
                f"({c['kept']:,} of {c['questions']:,} questions)",
                {"original": s["biased"], "rotated": s["biased_rotated"]},
            )
        )
    png = plot_histograms(
        panels,
        out / PNG_NAME,
        settings["bins"],
        "Relative answer start positions "
        f"({settings['dataset']}, {split} split, {result['definition']['spans']} spans)",
    )
    js = out / JSON_NAME
    write_json(js, result)
    return png, js


def flat_metrics(result: dict) -> dict[str, float]:
    """answer_positions/<series>/<stat> -> value, for the logger."""
    out = {}
    for name, summary in result["series"].items():
        for stat in SCALARS:
            if stat in summary:
                out[f"answer_positions/{name}/{stat}"] = float(summary[stat])
        if "ks_uniform" in summary:
            out[f"answer_positions/{name}/ks_statistic"] = summary["ks_uniform"]["statistic"]
    return out


def log_result(cfg, result: dict, png: Path) -> None:
    """Statistics (and, on W&B, the figure) to the configured logger; nothing with logger=none."""
    log_analysis(
        cfg,
        "answer_positions",
        scalars=flat_metrics(result),
        images={"answer_positions/histogram": png},
        summary={"answer_positions": result["series"]},
    )


def print_summary(result: dict) -> None:
    """Print a table of every series' count, mean, median, shares in the first 10% / 25% and KS D to uniform.

    When the split was position-biased, the bias filter's counts follow.
    """
    print(f"{'series':<16}{'count':>8}{'mean':>8}{'median':>8}{'<0.10':>8}{'<0.25':>8}{'KS D':>8}")
    for name, s in result["series"].items():
        print(
            f"{name:<16}{s['count']:>8,}{s['mean']:>8.3f}{s['median']:>8.3f}{s['share_first_10']:>8.3f}"
            f"{s['share_first_25']:>8.3f}{s['ks_uniform']['statistic']:>8.3f}"
        )
    if result["answer_bias"]:
        print(describe(result["answer_bias"]))


def run(cfg, opts: Options) -> dict:
    """Run the answer-position analysis: compute, write the PNG and JSON into `cfg.output_dir`, log, print.

    Returns the result that `answer_positions.json` holds.
    """
    result = analyse(cfg, opts)
    with analysis_set(cfg.output_dir, JSON_NAME) as stage:
        png, js = placed(cfg.output_dir, list(write_outputs(result, stage)))
    log_result(cfg, result, png)
    print_summary(result)
    print(f"wrote {js} and {png}")
    return result


@ANALYSES.register("answer_positions", schema=AnswerPositionsConfig)
def _from_config(cfg, model_from_cli: bool = False) -> dict:
    return run(cfg, analysis_options(cfg).options())
