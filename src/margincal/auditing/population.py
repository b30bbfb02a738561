"""The population view: many audited checkpoints ranked by how much the headline attack recovers, and each pre-attack
signal tested as a predictor of that recovered fraction (the paper's bridge claim, against simple competitors).

Predictors, all read before any attack: Δ (the margin cliff gap), forget ROUGE-L, the mean MIA advantage and the
relative weight distance to θ0, ‖θ̂ − θ0‖ / ‖θ0‖. Spearman and Pearson r with 95 % percentile bootstrap intervals
over checkpoints (:func:`margincal.results.stats.correlation`); with a searched attack, each predictor's Spearman
with the worst case minus its Spearman with the preset on the same records, with a paired bootstrap interval
(:func:`margincal.results.stats.correlation_gap`).

Paired differences over checkpoints (:func:`paired_differences`): every audited ``B+V`` (a panel's polish ``V`` of
baseline ``B``, e.g. ``NPO+MC``) against ``B``, and with a control ``C`` (``--control``) every checkpoint against
``C``, in each recovered fraction the population holds: d = f(first) − f(second) per pair, their mean with its
Student-t interval over pairs (:func:`margincal.results.stats.mean_interval`) and how many pairs the first
recovers less in, with its exact interval (:func:`margincal.results.stats.win_count`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from margincal.reporting.tables import markdown_table
from margincal.results.cards import CheckpointCard
from margincal.results.metric_table import FORGET_ROUGE, read
from margincal.results.stats import Correlation, correlation, correlation_gap, mean_interval, win_count

SEED_TAG = re.compile(r"_s\d+$")  # what --from-panel appends to every name of a panel of several seeds (seed_tag)
POPULATION_MIN = 3  # checkpoints from which an audit also writes the population view
TARGETS = {  # the recovered fractions a population holds, as its tables name them
    "recovered_fraction": "headline preset, all held-out",
    "worst_case": "searched, report set",
    "preset_report": "preset, report set",
}
PREDICTORS: dict[str, Callable[[CheckpointCard], float | None]] = {
    "delta": lambda c: c.delta.value,
    "forget_rouge_l": lambda c: read(FORGET_ROUGE.name, c.forget),  # MUSE: its knowmem F1 stands in
    "mia_advantage": lambda c: c.mia.advantage,
    "weight_distance": lambda c: c.weight_distance,
}
PREDICTOR_LABELS = {  # how a figure's axis names each predictor
    "delta": "Δ = m(D_f) − m_ref",
    "forget_rouge_l": "forget ROUGE-L (unattacked)",
    "mia_advantage": "MIA advantage (mean |AUC − 0.5|)",
    "weight_distance": "weight distance to θ0",
}


def population(cards: dict[str, CheckpointCard], headline: str, control: str | None = None) -> dict:
    """Ranking and correlations of every predictor with the ``headline`` attack's recovered fraction, and the
    paired differences (:func:`paired_differences`; ``control``: the audited control checkpoint, if any)."""
    rows = []
    for name, card in cards.items():
        row = {"name": name, **{key: get(card) for key, get in PREDICTORS.items()}}
        verdict = card.attacks[headline]
        row["recovered_fraction"] = verdict.recovered_fraction.value
        row["why_none"] = verdict.recovered_fraction.why
        row["attacked_rouge_l"] = verdict.rouge_l
        rows.append(row)
    family = headline.rpartition("@")[0]
    searched = any(family in card.searched for card in cards.values())
    if searched:  # the worst case: the headline family's strongest valid attack within the bound, and its preset, on R
        for row, card in zip(rows, cards.values(), strict=True):
            entry = card.searched.get(family)
            bound, won = (entry.bound.get("winner"), entry.searched) if entry else (None, None)
            within = bound is None or bound.within_bound
            row["worst_case"] = won.recovered_fraction.value if won is not None and within else None
            row["outside_bound"] = not within
            row["preset_report"] = entry.preset.recovered_fraction.value if entry else None
    rows.sort(key=lambda r: (r["recovered_fraction"] is None, -(r["recovered_fraction"] or 0.0)))
    out = {
        "n_checkpoints": len(rows),
        "target": f"recovered_fraction of {headline} (held-out ROUGE-L)",
        "predictors": _stats(rows, "recovered_fraction"),
        "checkpoints": rows,
    }
    targets = ["recovered_fraction"]
    if searched:
        out["worst_case"] = {
            "target": f"recovered_fraction of {family}'s worst case (strongest valid attack), report set",
            "predictors": _stats(rows, "worst_case"),
            "preset_on_report_set": _stats(rows, "preset_report"),
            "spearman_gap": _gaps(rows, "worst_case", "preset_report"),
            "outside_bound": [r["name"] for r in rows if r["outside_bound"]],  # set aside: a draw broke the bound
        }
        targets += ["worst_case", "preset_report"]
    by_name = {r["name"]: r for r in rows}
    out["paired"] = paired_differences({name: by_name[name] for name in cards}, targets, control)  # the cards' order
    return out


def pairings(names: list[str], control: str | None) -> dict[str, list[tuple[str, str]]]:
    """Groups of (first, second) checkpoint pairs: ``"V − baseline"`` pairs every ``B+V`` with ``B`` when both are
    audited (a seed tag ``_s<n>``, which ``--from-panel`` appends to both when a panel ran several seeds, pairs
    ``B+V_s1`` with ``B_s1``); with a control ``C``, ``"baseline − C"`` pairs every other name without a ``+`` with
    ``C`` and ``"V − C"`` every ``B+V`` with ``C``."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for name in names:
        core, tag = _split_seed_tag(name)
        base, plus, variant = core.rpartition("+")
        if plus and base + tag in names:
            groups.setdefault(f"{variant} − baseline", []).append((name, base + tag))
    if control is not None:
        for name in names:
            if name != control:
                core = _split_seed_tag(name)[0]
                variant = core.rpartition("+")[2] if "+" in core else "baseline"
                groups.setdefault(f"{variant} − {control}", []).append((name, control))
    return groups


def seed_tag(seed: int) -> str:
    """The tag ``--from-panel`` appends to a checkpoint's name when its panel ran several seeds (:data:`SEED_TAG`)."""
    return f"_s{seed}"


def _split_seed_tag(name: str) -> tuple[str, str]:
    """(``name`` without its seed tag, the tag): ``("NPO+MC", "_s1")`` for ``NPO+MC_s1``; no tag: ``(name, "")``."""
    match = SEED_TAG.search(name)
    return (name[: match.start()], match.group(0)) if match else (name, "")


def paired_differences(rows: dict[str, dict], targets: list[str], control: str | None) -> dict:
    """Per group of :func:`pairings` and per target: the pairs' differences f(first) − f(second) (None where either
    fraction is missing: an invalid row), their mean with its Student-t interval over populated pairs, and the pairs
    in which the first recovers less (a win for it) with the exact interval."""
    out = {}
    for group, pairs in pairings(list(rows), control).items():
        entry: dict = {"pairs": [list(p) for p in pairs]}
        for target in targets:
            values = [(rows[second].get(target), rows[first].get(target)) for first, second in pairs]
            diffs = [None if b is None or a is None else a - b for b, a in values]
            mean, wins = mean_interval(diffs), win_count(values, lower_is_better=True)
            entry[target] = {
                "differences": diffs,
                "mean": None if mean.n == 0 else mean.mean,
                "ci": None if mean.low != mean.low else [mean.low, mean.high],
                "n": mean.n,
                "first_lower": wins.wins,
                "first_lower_ci": None if wins.n == 0 else [wins.low, wins.high],
            }
        out[group] = entry
    return out


def _gaps(rows: list[dict], target: str, other: str) -> dict:
    """Each predictor's Spearman with ``target`` minus with ``other``, over the checkpoints that have all three."""
    gaps = {}
    for key in PREDICTORS:
        kept = [r for r in rows if r[key] is not None and r.get(target) is not None and r.get(other) is not None]
        gaps[key] = _entry(correlation_gap([r[key] for r in kept], [r[target] for r in kept], [r[other] for r in kept]))
    return gaps


def _stats(rows: list[dict], target: str) -> dict:
    """Spearman and Pearson r of every predictor with ``target`` over the checkpoints that have both."""
    stats = {}
    for key in PREDICTORS:
        pairs = [(r[key], r[target]) for r in rows if r[key] is not None and r.get(target) is not None]
        x, y = [p[0] for p in pairs], [p[1] for p in pairs]
        stats[key] = {method: _corr(x, y, method) for method in ("spearman", "pearson")}
    return stats


def _corr(x: list[float], y: list[float], method: str) -> dict:
    return _entry(correlation(x, y, method))


def _entry(c: Correlation) -> dict:
    """A correlation as JSON: r, n, degenerate resamples and the interval."""
    out = {k: (None if v != v else v) for k, v in dataclasses.asdict(c).items() if k in ("r", "n", "degenerate")}
    out["ci"] = None if c.low != c.low else [c.low, c.high]
    return out


def population_markdown(pop: dict, figure: str) -> list[str]:
    from margincal.auditing.card import fmt  # lazy: torch

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
            [
                key,
                cell(w["predictors"][key]["spearman"]),
                cell(w["preset_on_report_set"][key]["spearman"]),
                cell(w["spearman_gap"][key]),
            ]
            for key in w["predictors"]
        ]
        worst = [
            f"Worst case: Spearman r with the {w['target']}, beside the same with the preset on the same records, and "
            "their difference (paired bootstrap over checkpoints):",
            "",
            markdown_table(["predictor", "searched (worst case)", "preset, report set", "searched − preset"], table),
            "",
        ]
        if w.get("outside_bound"):
            worst += [
                f"Set aside from the worst case: {', '.join(w['outside_bound'])} (the searched winner broke the "
                "utility bound on a reported draw; its card gives the utility per draw).",
                "",
            ]
    paired = []
    for group, entry in pop.get("paired", {}).items():
        for target, v in entry.items():
            if target != "pairs" and v["n"]:
                interval = f" [{v['ci'][0]:+.2f}, {v['ci'][1]:+.2f}]" if v["ci"] else ""
                paired.append(
                    [group, TARGETS[target], fmt(v["mean"], "+.2f") + interval, f"{v['first_lower']}/{v['n']}"]
                )
    if paired:
        paired = [
            "Paired differences in recovered fraction (first − second; mean with its Student-t interval over pairs, "
            "and in how many pairs the first recovers less):",
            "",
            markdown_table(["pairs", "recovered fraction", "mean difference [95 % CI]", "first lower"], paired),
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
        *paired,
        f"![population]({figure})",
        "",
        markdown_table(["rank", "checkpoint", "recovered", "Δ", "F-ROUGE", "MIA adv.", "weight dist."], ranking),
        "",
    ]
