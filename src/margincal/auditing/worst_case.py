"""The audit card's worst-case section: per searched family of a checkpoint, the preset's and the winner's rows on the
report set (:mod:`margincal.auditing.search` ran both on the same draws from the relearn pool), their gap, the utility
bound on every reported draw, the winner and the trial history."""

from __future__ import annotations

from margincal.auditing.search import SEARCHED, reported_label, searched_label
from margincal.results.cards import Candidate, Estimate, Gap, SearchedFamily, SearchedRow, Split, Trial, UtilityBound

COPIED = (
    "k",
    "epsilon",
    "sampler",
    "score",
    "unattacked_utility",
    "utility_bound",
    "space",
    "journal",
    "winner",
    "unattacked_selection",
    "trials_to_90",
)  # the search record's fields a searched family's card section shows as they are


def rows(builder, name: str) -> dict[str, SearchedFamily]:
    """Per searched family: the preset's row and the winner's row on the report set (records no selection and no
    D_rel touched; both run on the same draws from the relearn pool, θ_ref and θ0 attacked by the same configs,
    the sanity rule applied to each), the gap between their recovered fractions (and what each added), the
    utility bound on every reported draw, the winner and the trial history. A row names the K and values it ran
    at (:func:`margincal.auditing.search.searched_label`); ``builder``: the
    :class:`margincal.auditing.card.CardBuilder` whose verdicts and stored results it reads."""
    out = {}
    draws = range(builder.plan.budget.draws)
    for preset, record in builder.searches.get(name, {}).items():
        report = set(record["split"]["report"])
        verdicts, bounds, heads = {}, {}, {}
        for row, reported in record["reported"].items():
            label = searched_label(preset, reported["k"], reported["params"])
            paired = f"searched {preset}" if row == "winner" else f"preset {preset}@{record['k']}"  # one per family
            done = [reported_label(name, preset, reported.get("row", row), d) for d in draws]
            verdicts[row] = builder.verdict(name, SEARCHED, f"{paired} (report set)", done, report)
            bounds[row] = UtilityBound(**{k: reported[k] for k in ("utility_by_draw", "worst_utility", "within_bound")})
            heads[row] = SearchedRow(**builder.headline(verdicts[row]), label=label)
        won, gap = heads.get("winner"), None
        if won is not None:
            a, b = won.recovered_fraction.value, heads["preset"].recovered_fraction.value
            gap = Gap(
                recovered_fraction=a - b if a is not None and b is not None else None,
                added=won.added.value - heads["preset"].added.value,
                why_below=below_preset(record, won.recovered_fraction, b),
            )
        trials = record["trials"]
        checked = record.get("candidates")  # cards before issue 73 chose the winner on draw 0 alone
        out[preset] = SearchedFamily(
            **{k: record[k] for k in COPIED},
            split=Split(**record["split"]),
            selected_on=len(record["split"]["selection"]),
            trials=len(trials),
            feasible=sum(t["feasible"] for t in trials),
            history=[
                Trial(**{k: t[k] for k in ("trial", "params", "value", "utility", "feasible")}, best_so_far=b)
                for t, b in zip(trials, record["best_so_far"], strict=True)
            ],
            preset=heads["preset"],
            searched=won,
            bound=bounds,
            gap=gap,
            detail=verdicts,
            seed=record.get("seed"),
            candidates=None if checked is None else [Candidate(**c) for c in checked],
            why_none=record.get("why_none"),
        )
    return out


def below_preset(record: dict, won: Estimate, preset: float | None) -> str | None:
    """Why the worst case recovers less than its preset on the report set, wherever it does (a card never shows a
    weaker attack than a valid one it ran on the same records without saying so), or None where it does not: the
    preset broke a constraint on the selection records (so it could not be chosen), or the worst case led it on the
    selection records and that lead did not carry over to the report set. Cards before issue 73 (no candidates) chose
    on draw 0 alone and are explained only beyond the interval's half-width, as they were written."""
    if won.value is None or preset is None or won.ci is None or won.value >= preset:
        return None
    half = (won.ci[1] - won.ci[0]) / 2
    size = f"below the preset by {preset - won.value:.2f} ({'more' if preset - won.value > half else 'less'} than "
    size += f"its interval's half-width {half:.2f})"
    checked = record.get("candidates")
    if checked is not None:
        own = checked[0]  # the preset, always the first candidate
        if own["broken"]:
            return f"{size}: the preset broke {'; and '.join(own['broken'])}, so it could not be the worst case"
        return (
            f"{size}: the worst case led the preset on the {len(record['split']['selection'])} selection records "
            f"over every reported draw ({record['winner']['value']:.3f} against {own['selection']:.3f}), a lead that "
            "did not carry over to the report set (the two sets are disjoint; selection never reads the report set)"
        )
    if won.value - preset >= -half:
        return None
    values = record["reported"]["preset"]["params"]
    own = next((t for t in record["trials"] if t["params"] == values), None)
    if own is not None and not own["feasible"]:  # the preset's own trial broke the bound: the search could not pick it
        return (
            f"below the preset by {preset - won.value:.2f}, more than its interval's half-width {half:.2f}: the "
            f"preset itself breaks the utility bound (utility {own['utility']:.3f} against "
            f"{record['utility_bound']:.3f} on the selection draw), so the search could not choose it, and no trial "
            "as strong kept utility within ε"
        )
    lead = f" (selection {record['winner']['value']:.3f} against the preset's {own['value']:.3f})" if own else ""
    return (
        f"below the preset by {preset - won.value:.2f}, more than its interval's half-width {half:.2f}: the winner "
        f"led on the {len(record['split']['selection'])} selection records{lead}, a lead that did not carry over to "
        "the report set (selection noise, or a winner that fits the selection records' draws)"
    )
