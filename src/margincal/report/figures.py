"""Figures (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

KIND_STYLE = {
    "target": ("black", "s", "θ0 (target)"),
    "reference": ("red", "D", "θ_ref"),
    "baseline": ("gray", "o", "baseline"),
    "mc": ("tab:blue", "^", "MC"),
}


def cliff_figure(models: dict[str, dict], m_ref: float, path: str | Path) -> Path:
    """Forget-set margin diagnostic per model against m_ref (shape of the paper's fig:cliff).

    Large markers are m(D_f) (mean over samples of the margin at each sample's max-entropy position); faint
    dots are the per-sample diagnostic margins; the red dashed line is m_ref and the shaded band the cliff
    gap of each baseline.
    """
    labels = [k for k, v in models.items() if v["kind"] != "reference"]
    fig, ax = plt.subplots(figsize=(1.3 * len(labels) + 2.5, 4.2))
    rng = np.random.default_rng(0)
    for x, label in enumerate(labels):
        row = models[label]
        color, marker, _ = KIND_STYLE[row["kind"]]
        per_sample = np.asarray(row["forget"]["diagnostic_margins"])
        ax.scatter(x + rng.uniform(-0.15, 0.15, per_sample.size), per_sample, s=6, color=color, alpha=0.25)
        m = row["forget"]["diagnosis"]["m"]
        ax.scatter([x], [m], s=90, color=color, marker=marker, edgecolor="black", zorder=3)
        if row["kind"] == "baseline" and m > m_ref:
            ax.fill_between([x - 0.3, x + 0.3], m_ref, m, color="red", alpha=0.12, lw=0)
        ax.annotate(f"{m:+.2f}", (x, m), textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.axhline(m_ref, color="red", ls="--", lw=1.2)
    ax.text(len(labels) - 0.5, m_ref, f"m_ref = {m_ref:+.2f}", color="red", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=20)
    ax.set_ylabel("forget-set margin diagnostic m(D_f)")
    ax.set_title("Margin cliff: forget margins at max-entropy positions vs the retain reference")
    handles = [
        plt.Line2D([], [], color=c, marker=mk, ls="", markeredgecolor="black", label=lab)
        for kind, (c, mk, lab) in KIND_STYLE.items()
        if kind != "reference" and any(models[k]["kind"] == kind for k in labels)
    ]
    ax.legend(handles=handles, loc="best", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    tmp.replace(path)
    return path
