"""Results tables in the papers' layout, from a grid's `results.json` (grid/engine.py).

One block per (training data, evaluation data); in a block one row per method (the grid's `rows`, baseline first)
and one column per measure. A cell reads `0.8282 (+3.1%)**`:

- the mean over the seeds / folds (the mean of the runs' test means);
- in brackets the relative change against the baseline row's mean, in %;
- `*` p <= 0.05, `**` p <= 0.01: the grid's test (metrics/significance.py) of method against baseline, on per-query
  values (each query's mean over the runs that tested it; `paired_by: query`) or on the runs' means paired by seed /
  fold (`paired_by: replicate`); an unpaired test (the isotropy paper's Student t-test) takes every run's mean of
  each row (`paired_by: replicate`).

With `compare_to` ({row: reference row}) each row compares with its own reference row (position-bias paper Table 5:
transfer rows against their model's row) instead of the baseline, and the rows keep the grid's order.

Run-level measures (`RUN_LEVEL`: I(W) and avgcos of the isotropy callback, MATS / ATS(0) of the ATS callback) have one
value per run and no per-query values: their cells show the mean over the runs only, untested.

With `delta_eval: [first, second]` (two evaluation data) a further block has the position-bias paper's Tables 3-4
layout: per (row, training data) each measure on both, the change Δ from the first to the second and the grid's test
of second against first (`summarize_delta`).

`summarize(results)` gives the numbers, `render_markdown(results)` the text, `write_table(results, path)` writes it
atomically, and `log_wandb_table(results)` logs it as a `wandb.Table` when a W&B run is active (no-op otherwise).
"""

from __future__ import annotations

import math
import os
from typing import Any

from core.io import atomic_open
from metrics.significance import (
    UNPAIRED,
    check_test,
    p_value,
    pair_by_query,
    pair_by_replicate,
    per_query_means,
    significance_mark,
)

__all__ = [
    "summarize",
    "summarize_delta",
    "render_markdown",
    "write_table",
    "log_wandb_table",
    "TEST_NAMES",
    "RUN_LEVEL",
]

# metrics.json keys that are one number per run, usable as table columns: I(W) and avgcos of callbacks/isotropy.py,
# by the `probe` protocol (iw, avgcos, iw_sequence, ...) and the `paper` one (iw_paper, iw_paper_query_std, ...: the
# mean over the test batches and its `_std`), with `_raw` for the vectors under a head
_PROBE = ("iw", "avgcos", "iw_sequence", "avgcos_sequence")
_PAPER = tuple(
    f"{m}_paper{side}{kind}"
    for m in ("iw", "avgcos")
    for kind in ("", "_sequence")
    for side in ("", "_query", "_passage")
)
ISOTROPY_LEVEL = tuple(
    f"{k}{raw}{std}"
    for k in _PROBE + _PAPER
    for raw in ("", "_raw")
    for std in ("", "_std")
    if not (std and k in _PROBE)
)
ATS_LEVEL = ("mats", "mats_std", "ats0")  # callbacks/ats.py
# the step of the tested checkpoint (validation.json): a learning-rate x steps sweep's steps axis; the re-ranking
# depth chosen on validation (eval.rerank_depths, metrics/rerank_depth.py)
STEP_LEVEL = ("best_step", "rerank_depth")
RUN_LEVEL = ISOTROPY_LEVEL + ATS_LEVEL + STEP_LEVEL

TEST_NAMES = {
    "t_test_one_tailed": "one-tailed paired t-test (method > baseline)",
    "t_test_two_tailed": "two-tailed paired t-test",
    "wilcoxon": "two-sided Wilcoxon signed-rank test",
    "wilcoxon_one_tailed": "one-sided Wilcoxon signed-rank test (method > baseline)",
    "student_t_one_tailed": (
        "one-tailed Student's t-test with equal variances (method > baseline; the isotropy paper's test)"
    ),
}


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _test_cells(mine: list[dict], base: list[dict], m: str, test: str, paired_by: str) -> tuple[float | None, int]:
    """Return (p, pairs) of the test of `mine`'s cells against `base`'s on measure m.

    Per query or per replicate; for an unpaired test `pairs` counts the runs of the smaller side.
    """
    if test in UNPAIRED:  # grid_config allows these with paired_by: replicate only
        a = [c["metrics"][m] for c in mine if m in c["metrics"]]
        b = [c["metrics"][m] for c in base if m in c["metrics"]]
        return (p_value(a, b, test) if a and b else None), min(len(a), len(b))
    if paired_by == "replicate":
        a, b, ids = pair_by_replicate(
            {c["replicate"]: c["metrics"][m] for c in mine if m in c["metrics"]},
            {c["replicate"]: c["metrics"][m] for c in base if m in c["metrics"]},
        )
    else:
        a, b, ids = pair_by_query(
            per_query_means([c["per_query"] for c in mine], m), per_query_means([c["per_query"] for c in base], m)
        )
    return (p_value(a, b, test) if ids else None), len(ids)


def summarize(results: dict, test: str | None = None, paired_by: str | None = None) -> list[dict[str, Any]]:
    """Summarise a grid's results: per (train, eval) pair, each row's mean per measure against its baseline.

    [{train, eval, rows: [{row, baseline, runs, measures: {m: {mean, change_pct, p, pairs, mark}}}]}], one block per
    (train, eval) pair of the grid. Only finished cells (status "done") count; a row without any has mean None.
    """
    test = check_test(test or results["test"])
    paired_by = paired_by or results.get("paired_by", "query")
    measures = list(results["measures"])
    baseline = results["baseline"]
    compare_to = results.get("compare_to") or {}
    train_on = results.get("train_on") or {}
    done = [c for c in results["cells"] if c.get("status") == "done"]
    blocks = []
    for train in results["train_data"]:
        for ev in results["eval_data"]:
            cells = {
                r: [c for c in done if c["row"] == r and c["train"] == train and c["eval"] == ev]
                for r in results["rows"]
            }
            rows = []
            # with per-row comparisons (compare_to) the grid's row order keeps each row next to the row it compares with
            order = list(results["rows"]) if compare_to else [baseline] + [r for r in results["rows"] if r != baseline]
            for r in order:
                if train not in train_on.get(r, [train]):
                    continue  # the row does not train on this data (grid key train_on)
                mine = cells[r]
                target = compare_to.get(r, baseline)
                base = cells.get(target, [])
                entry = {"row": r, "baseline": r == target, "compare_to": target, "runs": len(mine), "measures": {}}
                for m in measures:
                    mean = _mean([c["metrics"][m] for c in mine if m in c["metrics"]])
                    base_mean = _mean([c["metrics"][m] for c in base if m in c["metrics"]])
                    change = None
                    if mean is not None and base_mean not in (None, 0.0) and r != target and m not in RUN_LEVEL:
                        change = 100.0 * (mean - base_mean) / base_mean
                    p, pairs = None, 0
                    if r != target and mine and base and m not in RUN_LEVEL:
                        p, pairs = _test_cells(mine, base, m, test, paired_by)
                    entry["measures"][m] = {
                        "mean": mean,
                        "change_pct": change,
                        "p": p,
                        "pairs": pairs,
                        "mark": significance_mark(p),
                        "run_level": m in RUN_LEVEL,
                        "step": m in STEP_LEVEL,
                    }
                rows.append(entry)
            blocks.append({"train": train, "eval": ev, "rows": rows})
    return blocks


def _cell(v: dict, is_baseline: bool) -> str:
    if v["mean"] is None:
        return "–"
    text = f"{v['mean']:g}" if v.get("step") else f"{v['mean']:.4f}"
    if not is_baseline and not v.get("run_level"):
        text += f" ({v['change_pct']:+.1f}%)" if v["change_pct"] is not None else " (n/a)"
        text += v["mark"]
    return text


def render_markdown(results: dict, test: str | None = None, paired_by: str | None = None) -> str:
    """Render a grid's results as the Markdown table the grid writes: a block per (train, eval) pair.

    Each row's mean per measure, its change against the baseline (or its `compare_to` row) with the significance
    mark, the paper's figures where the grid gives them, and the original-vs-rotated section with `delta_eval`.
    """
    test = test or results["test"]
    paired_by = paired_by or results.get("paired_by", "query")
    blocks = summarize(results, test, paired_by)
    reps = results["replicates"]
    kind = "folds" if results.get("folds") else "seeds"
    unit = (
        "per-query values (each query's mean over the runs that tested it)"
        if paired_by == "query"
        else f"the runs' means ({len(reps)} {kind} a side)"
        if test in UNPAIRED
        else f"the runs' means paired by {kind[:-1]}"
    )
    lines = [
        f"## {results['grid']}",
        "",
        f"Mean over {len(reps)} runs per cell ({', '.join(reps)}). In brackets: change against "
        f"{'the row named after the method' if results.get('compare_to') else results['baseline']}. "
        f"\\* p <= 0.05, \\*\\* p <= 0.01: {TEST_NAMES[test]} on {unit}.",
    ]
    measures = list(results["measures"])
    if any(m in ISOTROPY_LEVEL for m in measures):
        lines[-1] += (
            " iw (I(W), Eq. 3) and avgcos (Eq. 4) of the isotropy paper: one value per run, mean over the runs,"
            " untested; iw_paper* / avgcos_paper* by the paper's protocol (the mean over the test batches),"
            " iw / avgcos by the fixed `probe` (docs/isotropy.md)."
        )
    if results.get("paper"):
        lines[-1] += " ↳ paper: the figure the paper reports for that row (grid key `paper`), under its own setting" + (
            f": {results['paper_note']}." if results.get("paper_note") else "."
        )
    if any(m in ATS_LEVEL for m in measures):
        lines[-1] += (
            " mats (MATS, position-bias paper Eq. 9; lower = less position bias) and ats0 (ATS(0), Eq. 8) of the"
            " test passages' term vectors: one value per run, mean over the runs, untested."
        )
    if "rerank_depth" in measures:
        lines[-1] += (
            " rerank_depth: the re-ranking depth chosen on validation (best nDCG@10) and applied to the test,"
            " mean over the runs, untested."
        )
    if results.get("deviations"):
        lines += ["", "Deviations from the paper's setting (grid key `deviations`):", ""]
        lines += [f"- {d}" for d in results["deviations"]]
    for block in blocks:
        title = (
            block["eval"]
            if block["train"] == block["eval"]
            else f"trained on {block['train']}, evaluated on {block['eval']}"
        )
        lines += [
            "",
            f"### {title}",
            "",
            "| method | " + " | ".join(measures) + " |",
            "|---|" + "---:|" * len(measures),
        ]
        for row in block["rows"]:
            name = row["row"] + (
                " (baseline)" if row["baseline"] else f" (vs {row['compare_to']})" if results.get("compare_to") else ""
            )
            if row["runs"] < len(reps):
                name += f" [{row['runs']}/{len(reps)} runs]"
            lines.append(
                f"| {name} | " + " | ".join(_cell(row["measures"][m], row["baseline"]) for m in measures) + " |"
            )
            paper = results.get("paper") or {}
            figures = paper.get(f"{block['train']}/{block['eval']}", {}).get(row["row"]) or paper.get(
                block["eval"], {}
            ).get(row["row"])
            if figures:
                lines.append(
                    "| ↳ paper | " + " | ".join(f"{figures[m]:.4f}" if m in figures else "" for m in measures) + " |"
                )
    if results.get("delta_eval"):
        lines += render_delta(results, test, paired_by)
    return "\n".join(lines) + "\n"


def _delta_on_second(results: dict) -> bool:
    """Whether the delta block's Δ is the paper's, relative to the second evaluation data (grid key `delta_base`)."""
    return results.get("delta_base", "second") == "second"


def summarize_delta(results: dict, test: str | None = None, paired_by: str | None = None) -> list[dict[str, Any]]:
    """Summarise a grid's results in the position-bias paper's Table 3-4 layout.

    For each (row, training data), each measure on the two evaluation data of `delta_eval` (original and rotated
    test), the relative change from the first to the second, and the grid's paired test of second against first
    (the same queries: rotation changes only the passages). The change is the paper's Delta, (second - first) /
    second, unless `results["delta_base"]` is "first": (second - first) / first.
    [{row, train, runs, measures: {m: {first, second, change_pct, p, pairs, mark}}}].
    """
    test = check_test(test or results["test"])
    paired_by = paired_by or results.get("paired_by", "query")
    first, second = results["delta_eval"]
    on_second = _delta_on_second(results)
    train_on = results.get("train_on") or {}
    done = [c for c in results["cells"] if c.get("status") == "done"]
    out = []
    for row in results["rows"]:
        for train in results["train_data"]:
            if train not in train_on.get(row, [train]):
                continue
            a = [c for c in done if c["row"] == row and c["train"] == train and c["eval"] == first]
            b = [c for c in done if c["row"] == row and c["train"] == train and c["eval"] == second]
            entry = {"row": row, "train": train, "runs": min(len(a), len(b)), "measures": {}}
            for m in results["measures"]:
                ma = _mean([c["metrics"][m] for c in a if m in c["metrics"]])
                mb = _mean([c["metrics"][m] for c in b if m in c["metrics"]])
                base = mb if on_second else ma
                change = (
                    100.0 * (mb - ma) / base
                    if base not in (None, 0.0) and None not in (ma, mb) and m not in RUN_LEVEL
                    else None
                )
                p, pairs = _test_cells(b, a, m, test, paired_by) if a and b and m not in RUN_LEVEL else (None, 0)
                entry["measures"][m] = {
                    "first": ma,
                    "second": mb,
                    "change_pct": change,
                    "p": p,
                    "pairs": pairs,
                    "mark": significance_mark(p),
                    "run_level": m in RUN_LEVEL,
                }
            out.append(entry)
    return out


def render_delta(results: dict, test: str | None = None, paired_by: str | None = None) -> list[str]:
    """Render `summarize_delta` as Markdown lines: each measure on both test data and the change Δ between them."""
    first, second = results["delta_eval"]
    test = test or results["test"]
    lines = [
        "",
        f"### {first} vs {second} test (position-bias paper Tables 3-4 layout)",
        "",
        f"Each measure on the {first} and the {second} test data and the change between them, "
        + (
            f"Δ = ({second} - {first}) / {second} (the paper's Delta, relative to the {second} value)"
            if _delta_on_second(results)
            else f"Δ = ({second} - {first}) / {first} (grid key delta_base=first; the paper's is relative to {second})"
        )
        + f"; \\* / \\*\\*: {TEST_NAMES[test]} of {second} against {first}, p <= 0.05 / 0.01.",
        "",
    ]
    measures = list(results["measures"])
    head = ["method", "training"]
    for m in measures:
        head += [f"{m} {first}", f"{m} {second}"] + ([] if m in RUN_LEVEL else [f"{m} Δ"])
    lines += ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    fmt = lambda v: "–" if v is None else f"{v:.4f}"  # noqa: E731
    for e in summarize_delta(results, test, paired_by):
        cols = [e["row"], e["train"]]
        for m in measures:
            v = e["measures"][m]
            cols += [fmt(v["first"]), fmt(v["second"])]
            if not v["run_level"]:
                cols.append("–" if v["change_pct"] is None else f"{v['change_pct']:+.1f}%{v['mark']}")
        lines.append("| " + " | ".join(cols) + " |")
    return lines


def write_table(results: dict, path: str | os.PathLike, test: str | None = None, paired_by: str | None = None) -> str:
    """Write `render_markdown` of the results to `path`, atomically, and return the text."""
    text = render_markdown(results, test, paired_by)
    with atomic_open(path) as f:
        f.write(text)
    return text


def log_wandb_table(
    results: dict, key: str = "results_table", test: str | None = None, paired_by: str | None = None
) -> bool:
    """Log the summary as a wandb.Table to the active W&B run; False (nothing done) when none is active."""
    try:
        import wandb  # lazy: heavy, only W&B logging needs it
    except ImportError:
        return False
    if getattr(wandb, "run", None) is None:
        return False
    measures = list(results["measures"])
    columns = ["train", "eval", "method"]
    for m in measures:
        columns += [m, f"{m} change %", f"{m} p", f"{m} text"]
    data = []
    for block in summarize(results, test, paired_by):
        for row in block["rows"]:
            line = [block["train"], block["eval"], row["row"]]
            for m in measures:
                v = row["measures"][m]
                line += [v["mean"], v["change_pct"], v["p"], _cell(v, row["baseline"])]
            data.append(line)
    wandb.log({key: wandb.Table(columns=columns, data=data)})
    return True
