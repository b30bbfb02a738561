"""The audit's figures: margins against θ_ref's, the K-sweep between floor and ceiling, the searched attacks' trial
histories, the population scatter."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from margincal.core.artifacts import inside
from margincal.pipeline.graph import REFERENCE
from margincal.reporting.figures import plt, save_figure
from margincal.results.cards import CheckpointCard, ScoreVerdict


def card_figures(builder, card: CheckpointCard, directory: Path) -> dict[str, Path]:
    """A checkpoint's figures: ``margins`` (its per-sample forget margins against θ_ref's) and one ``ksweep-<preset>``
    per attacker the budget runs at two K or more."""
    out, name = {}, card.name
    forget = builder.evals[name]["splits"]["forget"]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    mine = np.array(forget["diagnostic_margins"])
    bins = 30
    if REFERENCE in builder.evals:
        ref = np.array(builder.evals[REFERENCE]["splits"]["forget"]["diagnostic_margins"])
        bins = np.histogram_bin_edges(np.concatenate([mine, ref]), 30)
        ax.hist(ref, bins=bins, alpha=0.5, color="tab:red", label="θ_ref")
        ax.axvline(float(forget["diagnosis"]["m_ref"]), color="tab:red", ls="--", lw=1)
    ax.hist(mine, bins=bins, alpha=0.6, color="tab:blue", label=name)
    ax.axvline(float(forget["diagnosis"]["m"]), color="tab:blue", ls="--", lw=1)
    ax.set_xlabel("per-sample diagnostic margin (forget set)")
    ax.set_ylabel("samples")
    ax.legend(fontsize=8)
    out["margins"] = save_figure(fig, inside(directory, f"{name}-margins.png"))
    by_preset: dict[str, list[tuple[int, ScoreVerdict]]] = {}
    for v in card.attacks.values():
        if "rouge_l" in v.detail:  # none where the forget samples carry no score
            by_preset.setdefault(v.budget.preset, []).append((v.budget.k, v.detail["rouge_l"]))
    for preset, points in by_preset.items():
        if len(points) < 2:
            continue
        points.sort(key=lambda point: point[0])
        ks = [k for k, _ in points]
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        if all(p.floor is not None and p.ceiling is not None for _, p in points):
            ax.fill_between(
                ks,
                [p.floor for _, p in points],
                [p.ceiling for _, p in points],
                color="0.85",
                label="θ_ref floor – θ0 ceiling",
            )
        y = [p.attacked for _, p in points]
        lo = [p.ci[0] if p.ci else a for (_, p), a in zip(points, y, strict=True)]
        hi = [p.ci[1] if p.ci else a for (_, p), a in zip(points, y, strict=True)]
        ax.errorbar(ks, y, yerr=[np.subtract(y, lo), np.subtract(hi, y)], marker="o", color="tab:blue", label=name)
        ax.set_xscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()  # the log axis's own minor ticks (2, 3, ... × 10ⁿ) are not budgets
        ax.set_xlabel("relearn budget K (forget samples)")
        ax.set_ylabel(f"held-out {card.score} after the attack")
        ax.set_title(preset, fontsize=9)
        ax.legend(fontsize=8)
        out[f"ksweep-{preset}"] = save_figure(fig, inside(directory, f"{name}-ksweep-{preset}.png"))
    if card.searched:
        out["search"] = search_history(card, inside(directory, f"{name}-search.png"))
    return out


def search_history(card: CheckpointCard, path: Path) -> Path:
    """The searched attacks' trial histories, one panel per family: each trial's selection-set score (hollow:
    outside the utility bound; crossed: a candidate passed over for a broken constraint; ringed: the worst case)
    and the best-so-far within the bound, against the trial number; the unattacked level dashed; the title names
    the worst case's K and values, or says that no attack was valid."""
    families = card.searched
    fig, axes = plt.subplots(1, len(families), figsize=(2.6 * len(families), 2.8), squeeze=False, sharey=True)
    for ax, (preset, v) in zip(axes[0], families.items(), strict=True):
        rows = v.history
        x = [r.trial + 1 for r in rows]
        ok = [r.feasible for r in rows]
        ax.scatter(
            [a for a, f in zip(x, ok, strict=True) if f], [r.value for r in rows if r.feasible], s=12, label="trial"
        )
        ax.scatter(
            [a for a, f in zip(x, ok, strict=True) if not f],
            [r.value for r in rows if not r.feasible],
            s=12,
            facecolors="none",
            edgecolors="tab:red",
            label="outside the utility bound",
        )
        best = [(a, r.best_so_far) for a, r in zip(x, rows, strict=True) if r.best_so_far is not None]
        if best:
            ax.step(*zip(*best, strict=True), where="post", color="tab:blue", lw=1.2, label="best within the bound")
        ax.axhline(v.unattacked_selection, color="0.5", ls="--", lw=0.8, label="unattacked")
        value = {r.trial: r.value for r in rows}
        broken = [c.trial for c in v.candidates or [] if c.broken and c.trial in value]
        crossed = {"s": 40, "marker": "x", "color": "tab:red", "label": "broke a constraint"}
        ax.scatter([t + 1 for t in broken], [value[t] for t in broken], **crossed)
        chosen = (v.winner or {}).get("trial")
        if v.candidates is not None and chosen in value:
            ax.scatter([chosen + 1], [value[chosen]], s=70, facecolors="none", edgecolors="k", label="worst case")
        won = v.searched
        called = "worst case" if v.candidates is not None else "winner"  # cards before issue 73 named a winner
        winner = f"\n{called} {won.label.removeprefix(preset)}" if won and won.label else ""  # before labels: none
        if won is None and v.why_none:
            winner = "\nno valid attack"
        ax.set_title(f"{preset}@{v.k}{winner}", fontsize=7)
        ax.set_xlabel("trial")
    axes[0][0].set_ylabel(f"selection-set {card.score} ({v.selected_on} records)")
    axes[0][0].legend(fontsize=6)
    return save_figure(fig, path)


def population_scatter(
    rows: list[dict], predictors: dict[str, str], target: tuple[str, str], path: Path, stats: dict | None = None
) -> Path:
    """One panel per predictor (key → axis label): its value against the recovered fraction ``target`` (key, axis
    label), a point per checkpoint; each panel titled with its Spearman ρ and interval from ``stats`` (the population
    view's ``predictors``), Δ's panel with the cliff (Δ = 0) marked, and an axis whose values lie far outside their
    middle half drawn symmetric-log (:func:`_spread_out`) so the cluster stays readable."""
    fig, axes = plt.subplots(1, len(predictors), figsize=(3.3 * len(predictors), 3.4), squeeze=False)
    for ax, (key, label) in zip(axes[0], predictors.items(), strict=True):
        pts = [(r[key], r[target[0]]) for r in rows if r.get(key) is not None and r.get(target[0]) is not None]
        if pts:
            x, y = zip(*pts, strict=True)
            ax.scatter(x, y, s=14, color="tab:blue")
            _spread_out(ax, np.asarray(x, dtype=float))
        if key == "delta":
            ax.axvline(0, color="red", ls="--", lw=1, label="cliff: Δ = 0")
            ax.legend(fontsize=6, loc="best")
        rho = (stats or {}).get(key, {}).get("spearman")
        if rho is not None and rho.get("r") is not None:
            ci = f" [{rho['ci'][0]:+.2f}, {rho['ci'][1]:+.2f}]" if rho.get("ci") else ""
            ax.set_title(f"Spearman ρ {rho['r']:+.2f}{ci}, n = {rho['n']}", fontsize=7)
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel(target[1] if ax is axes[0][0] else "", fontsize=8)
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _spread_out(ax, x: np.ndarray) -> None:
    """A symmetric-log x axis (linear within the middle half's width of 0) when a value lies more than ten such widths
    from the median: a few far points no longer squash the rest."""
    low, mid, high = np.percentile(x, [25, 50, 75])
    width = max(high - low, 1e-12)
    if np.max(np.abs(x - mid)) > 10 * width:
        ax.set_xscale("symlog", linthresh=width)
        decades = range(int(np.ceil(np.log10(3 * width))), int(np.ceil(np.log10(np.max(np.abs(x))))) + 1)
        ticks = [0.0, *(s * 10.0**k for k in decades for s in (-1, 1))]  # 0 and whole decades clear of it
        ax.set_xticks([t for t in ticks if x.min() - abs(t) * 0.5 <= t <= x.max() + abs(t) * 0.5])
        ax.xaxis.set_major_formatter(plt.FormatStrFormatter("%g"))
