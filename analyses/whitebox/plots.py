"""Draw Figures 1-3 of the white-box paper as scatter plots against IDF.

One colour per model (fine-tuned ColBERT, its untrained backbone), Pearson r in the legend, stopwords hollow, a
least-squares line per model. Figure 1 has a panel per tau_AP variant (tau_AP,a and tau_AP,b, tau_ap.py: the paper
does not say which it used), on a shared y axis.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.io import save_figure

FIGURES = {
    # statistic: (file, rows ("words" / "subwords"), panels: ((y key = correlation key, y label, panel title), ...),
    #             x label, title)
    "term_importance": (
        "whitebox_term_importance.png",
        "words",
        (
            ("tau_ap_a", "mean tau_AP,a", "tau_AP,a (accuracy; Yilmaz et al.'s tau_AP if no ties)"),
            ("tau_ap_b", "mean tau_AP,b", "tau_AP,b (agreement; symmetric)"),
        ),
        "IDF (word)",
        "Figure 1: tau_AP of the ranking without the word vs IDF",
    ),
    "delta_es": (
        "whitebox_delta_es.png",
        "words",
        (("delta_es", "Delta_ES(w) (Eq. 2, summed over subwords)", ""),),
        "IDF (word)",
        "Figure 2: exact vs soft matches vs IDF",
    ),
    "spectral": (
        "whitebox_spectral.png",
        "subwords",
        (("spectral_ratio", "lambda_1 / sum lambda", ""),),
        "IDF (subword)",
        "Figure 3: spectral ratio of contextual embeddings vs subword IDF",
    ),
}
# the correlation of a y key, where the two differ
CORRELATION_OF = {"spectral_ratio": "spectral"}
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


def scatter(statistic: str, models: dict[str, dict], out: str | Path, subtitle: str = "") -> Path:
    """`models`: label -> that model's result (with "words", "subwords", "correlations")."""
    import matplotlib  # lazy: heavy, only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only figures need it

    name, rows_key, panels, xlabel, title = FIGURES[statistic]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.8), sharey=True, squeeze=False)
    for ax, (ykey, ylabel, panel_title) in zip(axes[0], panels):
        for colour, (label, res) in zip(COLOURS, models.items()):
            rows = [r for r in res[rows_key] if r.get(ykey) is not None]
            if not rows:
                continue
            x = np.array([r["idf"] for r in rows])
            y = np.array([r[ykey] for r in rows])
            stop = np.array([bool(r.get("stopword")) for r in rows])
            r = res["correlations"][CORRELATION_OF.get(ykey, ykey)]["pearson_r"]
            tag = f"{label} (r = {r:.3f}, n = {len(rows)})" if r is not None else f"{label} (n = {len(rows)})"
            ax.scatter(x[~stop], y[~stop], s=10, alpha=0.5, color=colour, label=tag)
            if stop.any():
                ax.scatter(x[stop], y[stop], s=18, facecolors="none", edgecolors=colour, alpha=0.8)
            if len(rows) > 2 and np.ptp(x) > 0:
                slope, icpt = np.polyfit(x, y, 1)
                xs = np.linspace(x.min(), x.max(), 2)
                ax.plot(xs, slope * xs + icpt, color=colour, lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if panel_title:
            ax.set_title(panel_title, fontsize=9)
        ax.legend(fontsize=8, loc="best")
        ax.grid(alpha=0.3)
        ax.yaxis.set_tick_params(labelleft=True)  # shared y: keep the numbers on every panel
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, Path(out) / name)
