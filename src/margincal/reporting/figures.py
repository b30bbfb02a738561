"""Figures (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from margincal.config.settings import FAMILIES  # noqa: E402
from margincal.core.artifacts import atomic_path  # noqa: E402
from margincal.reporting.records import DoneRecord  # noqa: E402
from margincal.results.metric_table import MODEL_UTILITY  # noqa: E402


def save_figure(fig, path: str | Path, dpi: int = 130) -> Path:
    """Write the figure atomically (:func:`margincal.core.artifacts.atomic_path`) and close it: every figure margincal
    writes goes through here. A PNG is stored with a palette of 256 colours (Pillow's median cut, no dithering):
    a plot's flat colours survive it, and the file is about a third of matplotlib's RGBA one, which keeps result
    folders (and the working tree a GPU run carries) small."""
    from PIL import Image

    fig.tight_layout()
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi)
            if path.suffix.lower() == ".png":
                with Image.open(tmp) as image:
                    rgb = image.convert("RGB")
                rgb.quantize(256, Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(tmp, "PNG", optimize=True)
    finally:
        plt.close(fig)
    return path


FAMILY_COLORS = dict(zip(FAMILIES, ("tab:orange", "tab:green", "tab:purple"), strict=True))


def panel_cliff(cells: list[DoneRecord], path: str | Path) -> Path:
    """fig:cliff for a panel: m(D_f) of each method's baseline (gray circle) and MC checkpoint (blue triangle),
    ordered by loss family, against m_ref (red dashed); the shaded band is the baseline's cliff gap; MU annotated."""
    cells = sorted(cells, key=lambda r: (list(FAMILY_COLORS).index(r.family), r.cell.method))
    m_ref = cells[0].m_ref
    fig, ax = plt.subplots(figsize=(0.55 * len(cells) + 2.5, 4.2))
    for x, rec in enumerate(cells):
        b, m = rec.models["baseline"].summary, rec.models["mc"].summary
        if b["m"] > m_ref:
            ax.fill_between([x - 0.3, x + 0.3], m_ref, b["m"], color="red", alpha=0.10, lw=0)
        ax.scatter([x], [b["m"]], s=60, color="gray", marker="o", edgecolor="black", zorder=3)
        ax.scatter([x], [m["m"]], s=70, color="tab:blue", marker="^", edgecolor="black", zorder=3)
        for v, summary, lift in ((b["m"], b, 3), (m["m"], m, -7)):  # MC's number below the baseline's
            if summary.get(MODEL_UTILITY.name) is not None:
                ax.annotate(
                    f"{summary['model_utility']:.2f}",
                    (x, v),
                    textcoords="offset points",
                    xytext=(6, lift),
                    fontsize=6,
                    color="dimgray",
                )
    ax.axhline(m_ref, color="red", ls="--", lw=1.2, label=f"m_ref = {m_ref:+.2f}")
    ax.set_xticks(range(len(cells)), [r.cell.method for r in cells], rotation=60, fontsize=8)
    for tick, rec in zip(ax.get_xticklabels(), cells, strict=True):
        tick.set_color(FAMILY_COLORS[rec.family])
    ax.set_ylabel("forget-set margin diagnostic m(D_f)")
    ax.set_xlabel("unlearning method (label colour: its loss family)")
    ax.scatter([], [], color="gray", marker="o", edgecolor="black", label="baseline")
    ax.scatter([], [], color="tab:blue", marker="^", edgecolor="black", label="MC")
    for family in dict.fromkeys(rec.family for rec in cells):  # only the families the panel ran
        ax.plot([], [], ls="", marker="s", color=FAMILY_COLORS[family], label=f"{family} family")
    ax.legend(fontsize=7, loc="best")
    ax.set_title("Margin cliff: m(D_f) against θ_ref's margin\n(small numbers: model utility MU)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def k_curve(cells: list[DoneRecord], labels: list[str], path: str | Path, score: str = "ROUGE-L") -> Path:
    """Held-out ROUGE-L vs the attack budget K: per-method thin lines and the panel mean (thick) for baseline and
    MC, with θ0's recovery ceiling (red dashed) and θ_ref (red dotted)."""
    ks = [int(lab.rsplit("@", 1)[1]) for lab in labels]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for role, color, marker in (("baseline", "gray", "o"), ("mc", "tab:blue", "^")):
        curves = np.array([[r.models[role].attacks[lab].rouge_l for lab in labels] for r in cells])
        for curve in curves:
            ax.plot(ks, curve, color=color, alpha=0.2, lw=0.8)
        ax.plot(ks, curves.mean(0), color=color, marker=marker, lw=2.2, label=f"{role} (mean of {len(cells)})")
    for role, style, name in (("theta0", "--", "θ0"), ("reference", ":", "θ_ref")):
        ax.plot(
            ks,
            [cells[0].models[role].attacks[lab].rouge_l for lab in labels],
            color="red",
            ls=style,
            label=name,
        )
    ax.set_xscale("log")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("attack budget K (forget samples relearned)")
    ax.set_ylabel(f"held-out forget {score} after the attack")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def bridge(points: list[tuple], pearson, spearman, path: str | Path, score: str = "ROUGE-L") -> Path:
    """Cliff gap Δ (x) vs post-attack ROUGE-L (y): circles baselines, triangles MC, colored by loss family."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for delta, rouge, role, family in points:
        ax.scatter(
            [delta],
            [rouge],
            marker="o" if role == "baseline" else "^",
            color=FAMILY_COLORS[family],
            edgecolor="black",
            s=45,
        )
    ax.axvline(0, color="red", ls="--", lw=1, label="the cliff (Δ = 0)")
    for family in dict.fromkeys(family for *_, family in points):  # only the families the panel ran
        ax.scatter([], [], color=FAMILY_COLORS[family], label=f"{family} family")
    _role_legend(ax)
    ax.legend(fontsize=7)
    ax.set_xlabel("cliff gap Δ = m(D_f) − m_ref")
    ax.set_ylabel(f"held-out {score} after the attack")
    ax.set_title(f"{pearson}\n{spearman}", fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def pareto(cells: list[DoneRecord], label: str, path: str | Path, score: str = "ROUGE-L") -> Path | None:
    """Per-method arrows from baseline to MC in the (post-attack ROUGE-L, model utility) plane."""
    if cells[0].models["mc"].summary.get(MODEL_UTILITY.name) is None:
        return None  # benchmarks without TOFU MU (MUSE)
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for rec in cells:
        b, m = rec.models["baseline"], rec.models["mc"]
        xb, xm = b.attacks[label].rouge_l, m.attacks[label].rouge_l
        yb, ym = b.summary[MODEL_UTILITY.name], m.summary[MODEL_UTILITY.name]
        color = FAMILY_COLORS[rec.family]
        ax.annotate("", (xm, ym), (xb, yb), arrowprops={"arrowstyle": "->", "color": color, "alpha": 0.6})
        ax.scatter([xb], [yb], marker="o", color=color, edgecolor="black", s=35)
        ax.scatter([xm], [ym], marker="^", color=color, edgecolor="black", s=40)
    _method_labels(ax, [(rec.cell.method, rec.models["baseline"], label) for rec in cells])
    for role, marker, name in (("reference", "*", "θ_ref"), ("theta0", "s", "θ0")):
        r = cells[0].models[role]
        ax.scatter(
            [r.attacks[label].rouge_l],
            [r.summary[MODEL_UTILITY.name]],
            marker=marker,
            color="red",
            s=90,
            label=name,
            edgecolor="black",
        )
    ax.set_xlabel(f"held-out {score} after the attack (↓ safer)")
    ax.set_ylabel("model utility (↑)")
    for family in dict.fromkeys(rec.family for rec in cells):  # only the families the panel ran
        ax.plot([], [], ls="", marker="s", color=FAMILY_COLORS[family], label=f"{family} family")
    _role_legend(ax)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _role_legend(ax) -> None:
    """Legend entries for the two markers: a circle is a baseline, a triangle its MC polish."""
    ax.scatter([], [], marker="o", color="white", edgecolor="black", label="baseline")
    ax.scatter([], [], marker="^", color="white", edgecolor="black", label="MC")


def _method_labels(ax, rows: list[tuple[str, Any, str]]) -> None:
    """Each method's name beside its baseline point, stacked upward where points crowd (no two labels of points
    within 8 % of the axes' span share a line)."""
    placed: list[tuple[float, float]] = []
    x_span = np.ptp([m.attacks[label].rouge_l for _, m, label in rows]) or 1.0
    y_span = np.ptp([m.summary[MODEL_UTILITY.name] for _, m, _ in rows]) or 1.0
    for name, model, label in sorted(rows, key=lambda r: (r[1].summary[MODEL_UTILITY.name], r[0])):
        x, y = model.attacks[label].rouge_l, model.summary[MODEL_UTILITY.name]
        near = sum(abs(x - px) < 0.08 * x_span and abs(y - py) < 0.08 * y_span for px, py in placed)
        placed.append((x, y))
        ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3 + 7 * near), textcoords="offset points")


def trace_figure(trace: list[dict], path: str | Path, reference_auc: dict[str, float] | None = None) -> Path:
    """A monitored run's curves (:mod:`margincal.training.monitors`) against optimizer steps: Δ, each detector's
    membership AUC (dotted: θ_ref's, where privleak = 0), the utility proxy and, for a polish, the probe KL of its
    training batches and (controlled MC) λ_KL, those the rows hold (Δ-stop's: Δ alone); the released step marked by a
    vertical line."""
    steps = [r["step"] for r in trace]
    panels = [
        ("delta", "Δ (forget)"),
        ("auc/", "membership AUC"),
        ("utility", "utility NLL (held out)"),
        ("probe_kl", "probe KL (training)"),
        ("kl_weight", "λ_KL"),
    ]
    panels = [(k, label) for k, label in panels if any(name.startswith(k) for r in trace for name in r)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8))
    for ax, (key, label) in zip(np.atleast_1d(axes), panels, strict=True):
        keys = sorted({k for r in trace for k in r if k.startswith(key)}) if key.endswith("/") else [key]
        for k in keys:
            xs = [s for s, r in zip(steps, trace, strict=True) if k in r]
            line = ax.plot(xs, [r[k] for r in trace if k in r], marker="o", ms=3, label=k.removeprefix(key))[0]
            if key == "auc/" and reference_auc and k.removeprefix(key) in reference_auc:
                ax.axhline(reference_auc[k.removeprefix(key)], color=line.get_color(), ls=":", lw=1)
        if key == "delta":
            ax.axhline(0.0, color="tab:red", ls=":", lw=1)
        if len(keys) > 1:
            ax.legend(fontsize=7)
        for r in trace:
            if r.get("selected"):
                ax.axvline(r["step"], color="grey", ls="--", lw=1)
        ax.set_xlabel("optimizer step")
        ax.set_title(label, fontsize=9)
    return save_figure(fig, path)


def fronts(rows: list[dict], path: str | Path) -> Path | None:
    """One row of panels per base: each configuration's seed mean in the (MU, K20) and (MIA advantage, K20) planes,
    labelled (configurations at the same point under one label, joined by "="); ``controlled`` as a star, ``baseline``
    as a circle, the fixed MC configurations as triangles."""
    bases = list(dict.fromkeys(r["base"] for r in rows))
    if not bases:
        return None
    planes = (("mu", "model utility (MU)"), ("mia_advantage", "MIA advantage"))
    fig, axes = plt.subplots(len(bases), 2, figsize=(9, 3.0 * len(bases)), squeeze=False)
    for row_axes, base in zip(axes, bases, strict=True):
        configs = list(dict.fromkeys(r["configuration"] for r in rows if r["base"] == base))
        for ax, (key, label) in zip(row_axes, planes, strict=True):
            names: dict[tuple[float, float], list[str]] = {}  # configurations at the same point share one label
            for c in configs:
                pts = [
                    (r[key], r["k20_rouge_l"])
                    for r in rows
                    if r["base"] == base
                    and r["configuration"] == c
                    and r[key] is not None
                    and r["k20_rouge_l"] is not None
                ]
                if not pts:
                    continue
                x, y = float(np.mean([p[0] for p in pts])), float(np.mean([p[1] for p in pts]))
                marker = {"controlled": "*", "baseline": "o"}.get(c, "^")
                ax.scatter([x], [y], marker=marker, s=90 if marker == "*" else 40, zorder=3)
                names.setdefault((round(x, 6), round(y, 6)), []).append(c)
            for (x, y), same in names.items():
                ax.annotate(" = ".join(same), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xlabel(label)
            ax.set_ylabel("K20 held-out ROUGE-L")
            ax.set_title(base, fontsize=9)
    return save_figure(fig, path)


def trajectory_figure(history: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Four panels over polish steps from the coercivity trace (:func:`margincal.mc.bounds.coercivity_hook`): Δ
    (symlog), retain NLL, probe KL, hinge gradient norm (paper Fig. traj)."""
    rows = [r for r in history if "delta" in r]
    steps = [r["step"] + 1 for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    panels = [
        ("delta", "(a) cliff gap Δ"),
        ("retain_nll", "(b) retain NLL"),
        ("probe_kl", "(c) probe KL"),
        ("hinge_grad_norm", "(d) ‖∇L_forget‖ (probe batch)"),
    ]
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.plot(steps, [r[key] for r in rows], marker="o", ms=3)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("polish step")
    axes[0].set_yscale("symlog")
    axes[0].axhline(0.0, color="red", ls="--", lw=1, label="the cliff (Δ = 0)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path, dpi=120)
