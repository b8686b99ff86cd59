"""The answer-position histogram in the layout of the position-bias paper's Figure 1.

Figure 1: "QA collection in-passage relative answer positions". Per training set one panel, the original passages
against the rotated (debiased, Eq. 7) ones, as the share of answers per equal-width bin of relative start position,
with the uniform share dashed. Drawn with matplotlib's Agg backend (no display) and written atomically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.io import atomic_open

# series name -> (label, style) in a panel
STYLES = {
    "original": ("original", dict(color="C0", linewidth=2.0)),
    "rotated": ("rotated (Eq. 7)", dict(color="C1", linewidth=2.0, linestyle="-.")),
}


def plot_histograms(panels: list[tuple[str, dict[str, dict]]], path: str | Path, bins: int, title: str) -> Path:
    """Draw the answer-position histograms (Figure 1 layout) and write them as a PNG to `path`, atomically.

    `panels`: (panel title, {"original": summary, "rotated": summary}) with summaries from position_stats;
    one panel per entry, side by side, same y axis. Returns the path written.
    """
    import matplotlib  # lazy: heavy, only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only figures need it

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), sharey=True, squeeze=False)
    edges = np.linspace(0.0, 1.0, bins + 1)
    for ax, (panel_title, series) in zip(axes[0], panels):
        for name, (label, style) in STYLES.items():
            summary = series.get(name)
            if not summary or not summary.get("count"):
                continue
            frac = summary["histogram"]["fraction"]
            ax.stairs(frac, edges, label=f"{label}: n={summary['count']:,}, mean={summary['mean']:.2f}", **style)
        ax.axhline(1.0 / bins, color="grey", linestyle="--", linewidth=1.0, label="uniform")
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("relative answer start (word index / passage words)")
        ax.set_xlim(0, 1)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"share of answers per bin (1/{bins} of the passage)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
    return path
