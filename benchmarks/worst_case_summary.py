"""The readings of a searched audit that its card and population print nowhere in one place (issue 73's Addendum 6,
results/audit/testbed-worst/PLAN.md).

    .venv/bin/python benchmarks/worst_case_summary.py results/audit/testbed-worst/valid/d_f [--control NAME]

Reads ``card.json`` and ``population.json`` of the audit and prints, per searched family: how many rows show a worst
case, how many are empty although some candidate was valid (by construction 0), how many worst cases fail the card's
sanity check on the report set although they passed on the selection records, the mean worst case − preset recovered
fraction on the report set over checkpoints with its Student-t 95 % interval, how many are above +0.05 and below
−0.05, the rows below their preset and whether each says why, the distinct configurations run and the trials spent;
then the plan's questions Q1–Q3 from ``population.json`` with their numbers of pairs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from margincal.results.stats import mean_interval


def family_rows(cards: dict, family: str) -> dict:
    """One family's counts and gaps over the audit's checkpoints (see the module docstring)."""
    shown, empty_with_valid, report_invalid, gaps, below, unexplained = 0, [], [], [], [], []
    configs, spent = set(), []
    for name, card in cards.items():
        row = card["searched"].get(family)
        if row is None:
            continue
        won, pre = row["searched"], row["preset"]["recovered_fraction"]["value"]
        checked = row.get("candidates") or []
        if won is None and any(not c["broken"] for c in checked):
            empty_with_valid.append(name)
        if won is not None:
            shown += 1
            if won["sanity"] is not None and not won["sanity"]["valid"]:
                report_invalid.append(name)
            value = won["recovered_fraction"]["value"]
            if value is not None and pre is not None:
                gaps.append(value - pre)
                if value < pre:
                    below.append(name)
                    if not (row["gap"] and row["gap"]["why_below"]):
                        unexplained.append(name)
        configs |= {json.dumps(t["params"], sort_keys=True) for t in row["history"]}
        spent.append(len(row["history"]))
    interval = mean_interval(gaps)
    return {
        "checkpoints": len(spent),
        "shown": shown,
        "empty_with_valid": empty_with_valid,
        "report_invalid": report_invalid,
        "gap": (interval.mean, interval.low, interval.high, interval.n),
        "above": sum(g > 0.05 for g in gaps),
        "below_005": sum(g < -0.05 for g in gaps),
        "below": below,
        "unexplained": unexplained,
        "configurations": len(configs),
        "trials": sum(spent),
    }


def question(entry: dict | None) -> tuple | None:
    """A paired difference of population.json: mean, interval, pairs lower in the first, pairs."""
    if entry is None or entry.get("n", 0) == 0:
        return None
    lo, hi = entry["ci"] if entry.get("ci") else (float("nan"), float("nan"))
    return round(entry["mean"], 2), round(lo, 2), round(hi, 2), entry["first_lower"], entry["n"]


def readings(audit: Path, control: str | None) -> dict:
    """Every reading of the module docstring, from the audit's records."""
    cards = json.loads((audit / "card.json").read_text())["checkpoints"]
    pop = json.loads((audit / "population.json").read_text())
    families = sorted({f for card in cards.values() for f in card["searched"]})
    out = {"families": {f: family_rows(cards, f) for f in families}}
    paired = pop.get("paired", {})
    out["q1"] = {t: question(paired.get("MC − baseline", {}).get(t)) for t in ("worst_case", "preset_report")}
    if control is not None:
        out["q2"] = {t: question(paired.get(f"MC − {control}", {}).get(t)) for t in ("worst_case", "preset_report")}
    gap = pop.get("worst_case", {}).get("spearman_gap", {}).get("delta")
    if gap is None or gap.get("r") is None:
        out["q3"] = None
    else:  # too few checkpoints for a bootstrap: r alone
        out["q3"] = (round(gap["r"], 2), *(round(x, 2) for x in gap["ci"] or (float("nan"), float("nan"))))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audit", type=Path)
    parser.add_argument("--control", default=None)
    args = parser.parse_args(argv)
    out = readings(args.audit, args.control)
    for family, r in out["families"].items():
        mean, lo, hi, n = r["gap"]
        print(
            f"{family}: worst case shown {r['shown']}/{r['checkpoints']}; empty with a valid candidate "
            f"{len(r['empty_with_valid'])} {r['empty_with_valid']}; invalid on the report set "
            f"{len(r['report_invalid'])} {r['report_invalid']}; worst − preset {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] "
            f"(n = {n}), above +0.05 {r['above']}, below −0.05 {r['below_005']}; below the preset {len(r['below'])}, "
            f"without a reason {len(r['unexplained'])}; {r['configurations']} distinct configurations in "
            f"{r['trials']} trials"
        )
    for key in ("q1", "q2"):
        if key in out:
            print(f"{key}: worst case {out[key]['worst_case']}; preset, report set {out[key]['preset_report']}")
    print(f"q3: Δ's Spearman gap, worst case − preset {out['q3']}")


if __name__ == "__main__":
    main()
