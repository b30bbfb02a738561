"""Pareto fronts of the polish configurations (margincal.report.fronts), on hand-checked points."""

from margincal.report.fronts import dominates, front, placement

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
