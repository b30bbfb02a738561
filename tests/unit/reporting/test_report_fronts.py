"""Pareto fronts of the polish configurations (margincal.reporting.fronts), on hand-checked points."""

import math
from collections import Counter

import pytest

from margincal.reporting.fronts import dominates, dominators, front, placement, seed_placements
from margincal.reporting.rows import paired_change

# costs: (−MU, K20)
FIXED = {"reference": (-0.5, 0.2), "kl02": (-0.4, 0.1), "steps20": (-0.3, 0.3), "baseline": (-0.5, 0.2)}


def test_dominance_needs_one_strict_improvement():
    assert dominates((-0.5, 0.2), (-0.3, 0.3)) and not dominates((-0.5, 0.2), (-0.5, 0.2))
    assert not dominates((-0.5, 0.2), (-0.4, 0.1)) and not dominates((-0.4, 0.1), (-0.5, 0.2))


def test_front_keeps_the_non_dominated_and_ties():
    assert front(FIXED) == ["reference", "kl02", "baseline"]  # steps20 is beaten by reference (and baseline)


def test_placement_below_on_above():
    assert placement((-0.3, 0.25), FIXED) == "below"  # reference has more MU and less K20
    assert placement((-0.45, 0.15), FIXED) == "on"  # between reference and kl02
    assert placement((-0.6, 0.1), FIXED) == "above"  # beats reference, kl02 and baseline
    assert placement((-0.5, 0.2), FIXED) == "on"  # equal to a front point: not beaten, beats nothing on the front


def test_dominators_and_per_seed_placements():
    assert dominators((-0.3, 0.25), FIXED) == ["reference", "kl02", "baseline"]  # steps20 (−0.3, 0.3): worse K20
    assert dominators((-0.6, 0.1), FIXED) == []
    seeds = {0: {**FIXED, "controlled": (-0.3, 0.25)}, 1: {**FIXED, "controlled": (-0.6, 0.1)}, 2: dict(FIXED)}
    assert seed_placements(seeds, "controlled") == Counter({"below": 1, "above": 1})  # seed 2 has no candidate


def test_paired_change_is_the_per_seed_difference_over_seeds_with_both():
    values = [
        (0, "controlled", 0.5),
        (0, "reference", 0.4),
        (1, "controlled", 0.6),
        (1, "reference", 0.3),
        (2, "controlled", 0.9),
        (3, "reference", 0.1),
        (4, "controlled", None),
        (4, "reference", 0.2),
    ]
    rows = [{"seed": s, "configuration": c, "mu": v} for s, c, v in values]
    change = paired_change(rows, "controlled", "reference", "mu")  # seeds 0 and 1 only: +0.1 and +0.3
    assert change.n == 2 and change.mean == pytest.approx(0.2)
    assert change.high == pytest.approx(0.2 + math.tan(0.475 * math.pi) * 0.1)  # t(0.975, 1) · s/√2, s = √0.02
