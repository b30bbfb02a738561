"""Pareto fronts of polish configurations per base (the paper's stopping-rule and budget sweep, issue 27).

A point is a configuration's mean over seeds in a plane of two costs, both lower-is-better (MU enters as −MU).
Point a dominates b when a ≤ b on both axes and a < b on one. The front of a set is its non-dominated points.
A candidate (controlled MC) is placed against the front of the fixed configurations:

* ``below``: some fixed configuration dominates it (worse on one axis, not better on the other);
* ``above``: it dominates at least one point of the front (it moves the front);
* ``on``: neither (a trade-off the front does not contain).

With seeds, the placement is made on the seed means and, as a check of its stability, in each seed on that seed's
points (:func:`seed_placements`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

Point = tuple[float, float]


def dominates(a: Point, b: Point) -> bool:
    """a ≤ b on both costs and a < b on at least one."""
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def front(points: Mapping[str, Point]) -> list[str]:
    """The names of the non-dominated points, in the mapping's order."""
    return [n for n, p in points.items() if not any(dominates(q, p) for m, q in points.items() if m != n)]


def dominators(candidate: Point, fixed: Mapping[str, Point]) -> list[str]:
    """The names of the fixed points that dominate ``candidate``, in the mapping's order."""
    return [n for n, p in fixed.items() if dominates(p, candidate)]


def placement(candidate: Point, fixed: Mapping[str, Point]) -> str:
    """``below`` / ``above`` / ``on`` the front of ``fixed`` (see the module docstring)."""
    if dominators(candidate, fixed):
        return "below"
    if any(dominates(candidate, fixed[n]) for n in front(fixed)):
        return "above"
    return "on"


def seed_placements(points: Mapping[object, Mapping[str, Point]], candidate: str) -> Counter:
    """How often ``candidate`` is below / above / on the front of the other points, one placement per seed
    (``points``: seed → name → point; seeds without the candidate are left out)."""
    return Counter(
        placement(by_name[candidate], {n: p for n, p in by_name.items() if n != candidate})
        for by_name in points.values()
        if candidate in by_name
    )
