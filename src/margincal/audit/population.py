"""The population view: many audited checkpoints ranked by how much the headline attack recovers, and each pre-attack
signal tested as a predictor of that recovered fraction (the paper's bridge claim, against simple competitors).

Predictors, all read before any attack: Δ (the margin cliff gap), forget ROUGE-L, the mean MIA advantage and the
relative weight distance to θ0, ‖θ̂ − θ0‖ / ‖θ0‖. Spearman and Pearson r with 95 % percentile bootstrap intervals
over checkpoints (:func:`margincal.evaluation.stats.correlation`)."""

from __future__ import annotations

import dataclasses

from margincal.evaluation.metric_table import FORGET_ROUGE, read
from margincal.evaluation.stats import correlation
from margincal.report.tables import markdown_table

POPULATION_MIN = 3  # checkpoints from which an audit also writes the population view
PREDICTORS = {
    "delta": lambda c: c["delta"]["value"],
    "forget_rouge_l": lambda c: read(FORGET_ROUGE.name, c["forget"]),  # MUSE: its knowmem F1 stands in
    "mia_advantage": lambda c: c["mia"]["advantage"],
    "weight_distance": lambda c: c["weight_distance"],
}


def population(cards: dict[str, dict], headline: str) -> dict:
    """Ranking and correlations of every predictor with the ``headline`` attack's recovered fraction."""
    rows = []
    for name, card in cards.items():
        row = {"name": name, **{key: get(card) for key, get in PREDICTORS.items()}}
        row["recovered_fraction"] = card["attacks"][headline]["recovered_fraction"]["value"]
        row["why_none"] = card["attacks"][headline]["recovered_fraction"].get("why")
        row["attacked_rouge_l"] = card["attacks"][headline]["rouge_l"]
        rows.append(row)
    family = headline.rpartition("@")[0]
    searched = any(family in card.get("searched", {}) for card in cards.values())
    if searched:  # the worst case: the headline family's searched winner, and its preset, both on half B
        for row, card in zip(rows, cards.values(), strict=True):
            entry = card.get("searched", {}).get(family) or {}
            row["worst_case"] = ((entry.get("searched") or {}).get("recovered_fraction") or {}).get("value")
            row["preset_half_b"] = ((entry.get("preset") or {}).get("recovered_fraction") or {}).get("value")
    rows.sort(key=lambda r: (r["recovered_fraction"] is None, -(r["recovered_fraction"] or 0.0)))
    out = {
        "n_checkpoints": len(rows),
        "target": f"recovered_fraction of {headline} (held-out ROUGE-L)",
        "predictors": _stats(rows, "recovered_fraction"),
        "checkpoints": rows,
    }
    if searched:
        out["worst_case"] = {
            "target": f"recovered_fraction of {family}'s searched winner, report half B",
            "predictors": _stats(rows, "worst_case"),
            "preset_on_half_b": _stats(rows, "preset_half_b"),
        }
    return out


def _stats(rows: list[dict], target: str) -> dict:
    """Spearman and Pearson r of every predictor with ``target`` over the checkpoints that have both."""
    stats = {}
    for key in PREDICTORS:
        pairs = [(r[key], r[target]) for r in rows if r[key] is not None and r.get(target) is not None]
        x, y = [p[0] for p in pairs], [p[1] for p in pairs]
        stats[key] = {method: _corr(x, y, method) for method in ("spearman", "pearson")}
    return stats


def _corr(x: list[float], y: list[float], method: str) -> dict:
    c = correlation(x, y, method)
    out = {k: (None if v != v else v) for k, v in dataclasses.asdict(c).items() if k in ("r", "n", "degenerate")}
    out["ci"] = None if c.low != c.low else [c.low, c.high]
    return out


def population_markdown(pop: dict, figure: str) -> list[str]:
    from margincal.audit.card import fmt

    def cell(entry: dict) -> str:
        return fmt(entry["r"], "+.2f") + (f" [{entry['ci'][0]:+.2f}, {entry['ci'][1]:+.2f}]" if entry["ci"] else "")

    rows = [
        [key, cell(v["spearman"]), cell(v["pearson"]), str(v["spearman"]["n"])] for key, v in pop["predictors"].items()
    ]
    ranking = [
        [
            str(i + 1),
            r["name"],
            fmt(r["recovered_fraction"], ".2f"),
            fmt(r["delta"], "+.2f"),
            fmt(r["forget_rouge_l"]),
            fmt(r["mia_advantage"]),
            fmt(r["weight_distance"], ".4f"),
        ]
        for i, r in enumerate(pop["checkpoints"])
    ]
    whys = sorted({r["why_none"] for r in pop["checkpoints"] if r["recovered_fraction"] is None and r["why_none"]})
    worst = []
    if "worst_case" in pop:
        w = pop["worst_case"]
        table = [
            [key, cell(w["predictors"][key]["spearman"]), cell(w["preset_on_half_b"][key]["spearman"])]
            for key in w["predictors"]
        ]
        worst = [
            f"Worst case: Spearman r with the {w['target']}, beside the same with the preset on the same records:",
            "",
            markdown_table(["predictor", "searched (worst case)", "preset, half B"], table),
            "",
        ]
    return [
        "## Population",
        "",
        f"{pop['n_checkpoints']} checkpoints; target: {pop['target']}.",
        "",
        *[f"- no recovered fraction to rank by: {why}" for why in whys],
        *([""] if whys else []),
        markdown_table(["predictor", "Spearman [95 % CI]", "Pearson [95 % CI]", "n"], rows),
        "",
        *worst,
        f"![population]({figure})",
        "",
        markdown_table(["rank", "checkpoint", "recovered", "Δ", "F-ROUGE", "MIA adv.", "weight dist."], ranking),
        "",
    ]
