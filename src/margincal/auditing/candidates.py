"""The worst case of a searched family: the strongest attack the audit ran that meets every constraint a reported row
must meet, chosen on the selection records only (configs/search.yaml states the rule; issue 73).

A *candidate* is one configuration run on every D_rel draw the budget reports (draws d = 0 … D − 1 from the relearn
pool) on the audited checkpoint (its utility proxy scored on each), on θ_ref and on θ0. Read on the selection set S
only (never the report set R, which judges the row), a candidate c has

* its selection score s(c) = mean over draws and over S of the checkpoint's attacked headline score (pooled over
  every draw the card reports, not draw 0 alone);
* the utility constraint: u_d(c) ≥ u_0 − ε on every draw d;
* the sanity rule of the cards (:meth:`margincal.auditing.rules.CardRules.sanity`) on S: θ0 under the attack keeps
  its unattacked score on S within the tolerance, and θ_ref's attacked score (the floor) stays ``min_gap`` below
  θ0's (the ceiling), each pooled over draws and S.

The candidates are the preset and the searched trials, walked in order of their draw-0 selection score (the search's
objective; the earliest on ties) among the trials within the utility bound on draw 0, until the first that meets every
constraint. The worst case is the valid candidate with the highest pooled selection score (the earlier on ties, the
preset first). Since a later trial of the walk can only be reached when every earlier one failed, this is the best
valid trial on draw 0's ranking and never a weaker valid attack than the preset on S; a row is empty only when every
trial broke a constraint, and then each one's reason is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from margincal.auditing.rules import card_rules


def ranked(trials: Sequence[dict]) -> list[dict]:
    """The trials within the utility bound on draw 0, by selection score, highest first (the earliest on ties)."""
    return sorted((t for t in trials if t["feasible"]), key=lambda t: (-t["value"], t["trial"]))


def constraints_broken(
    utility_by_draw: Sequence[float],
    bound: float,
    floor: float | None,
    ceiling: float | None,
    ceiling_unattacked: float | None,
) -> list[str]:
    """What a candidate breaks, in numbers: the utility bound on any draw, and the cards' sanity rule on the selection
    records (θ0's ceiling kept, the floor below it); nothing for a rule whose models the audit lacks."""
    broken = []
    low = [f"{u:.3f}" for u in utility_by_draw if u < bound]
    if low:
        shown = ", ".join(low)
        broken.append(f"the utility bound {bound:.3f} (utility {shown} on {len(low)} of {len(utility_by_draw)} draws)")
    if floor is not None and ceiling is not None and ceiling_unattacked is not None:
        sanity = card_rules().sanity(floor, ceiling, ceiling_unattacked)
        if not sanity.valid:
            broken.append(f"the sanity rule on the selection records: {sanity.why}")
    return broken


def choose(
    trials: Sequence[dict], preset: dict, evaluate: Callable[[str, dict, int | None], dict], draws: int = 1
) -> tuple[dict | None, list[dict]]:
    """The worst case and every candidate checked (module docstring). ``trials``: the search's trials (number,
    params, draw-0 selection score ``value``, ``feasible`` within the bound on draw 0); ``preset``: the preset's
    searched values; ``evaluate(row, params, trial)``: runs a candidate on every reported draw and returns its
    record, with ``selection`` (pooled over draws) and ``broken`` (the constraints it breaks, empty when valid);
    ``draws``: how many it is run on. With one draw the pooled score is the draw-0 score, so a trial scoring no more
    than a valid candidate already checked cannot win and is not run. Returns (the chosen candidate or None, the
    candidates in the order they were checked)."""
    own = next((t["trial"] for t in trials if t["params"] == preset), None)
    checked = [evaluate("preset", preset, own)]
    for t in ranked(trials):
        if t["trial"] == own:
            continue
        if any(not c["broken"] for c in checked[1:]):
            break
        if draws == 1 and any(not c["broken"] and c["selection"] >= t["value"] for c in checked):
            break
        checked.append(evaluate(f"t{t['trial']}", t["params"], t["trial"]))
    valid = [c for c in checked if not c["broken"]]
    best = max(valid, key=lambda c: c["selection"], default=None)  # max keeps the first of ties: the preset first
    return best, checked


def why_none(trials: Sequence[dict], checked: Sequence[dict]) -> str:
    """Why a family has no worst case: which constraint every trial broke."""
    outside = sum(not t["feasible"] for t in trials)
    parts = [f"{outside} of {len(trials)} trials broke the utility bound on the selection draw"] if outside else []
    for c in checked:
        which = "the preset" if c["row"] == "preset" else f"trial {c['trial'] + 1}"
        parts.append(f"{which} broke {'; and '.join(c['broken'])}")
    return "no valid attack in this family at this scale: " + "; ".join(parts)
