"""The rules an audit card applies, fixed in ``configs/audit_rules.yaml`` before any audit result was read: when an
attack or quantizer row is valid at this scale (the sanity rule), when an answer is degenerate, and when the audit
reproduces a claimed metric."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

from margincal.config.files import CONFIG_DIR, build_file, read_yaml
from margincal.evaluation.metrics import repeated_ngrams
from margincal.results.cards import Sanity

RULES = CONFIG_DIR / "audit_rules.yaml"


@dataclasses.dataclass(frozen=True)
class DegenerateRule:
    """A generation is degenerate when at least ``repeated_share`` of its ≥ ``min_ngrams`` word ``ngram``-grams
    repeat an earlier one; a row is flagged at a degenerate share of ``flag_share``."""

    ngram: int
    repeated_share: float
    min_ngrams: int
    flag_share: float

    def __call__(self, text: str) -> bool:
        share, count = repeated_ngrams(text, self.ngram)
        return count >= self.min_ngrams and share >= self.repeated_share


@dataclasses.dataclass(frozen=True)
class ClaimedRule:
    """When the audit reproduces a claimed metric: |ours − claimed| ≤ the metric's tolerance (``tolerances``, else
    ``tolerance``; the metrics in ``log10`` compared as log10 values), or the claim inside the 95 % bootstrap
    interval of a per-sample mean."""

    tolerance: float
    tolerances: dict[str, float]
    log10: list[str]

    def within(self, name: str, ours: float, claimed: float, tolerance: float | None) -> tuple[float, float, bool]:
        """(the difference compared, the tolerance, whether it is within)."""
        tol = tolerance if tolerance is not None else self.tolerances.get(name, self.tolerance)
        if name in self.log10:
            if ours <= 0 or claimed <= 0:
                return math.inf, tol, False
            diff = math.log10(ours) - math.log10(claimed)
        else:
            diff = ours - claimed
        return diff, tol, abs(diff) <= tol


@dataclasses.dataclass(frozen=True)
class CardRules:
    """``configs/audit_rules.yaml``: the sanity rule (``ceiling_tolerance``, ``min_gap``), degenerate answers and
    reproduced claims."""

    ceiling_tolerance: float
    min_gap: float
    degenerate: DegenerateRule
    claimed: ClaimedRule

    def sanity(self, floor: float, ceiling: float, theta0: float) -> Sanity:
        """Whether an attack is valid at this scale: θ0 under it (``ceiling``) keeps its unattacked score
        (``theta0``) within the tolerance, and the floor stays ``min_gap`` below the ceiling; why not, in numbers."""
        problems = []
        if ceiling < theta0 - self.ceiling_tolerance:
            problems.append(
                f"it lowers θ0 from {theta0:.3f} to {ceiling:.3f} (more than the tolerance {self.ceiling_tolerance})"
            )
        if ceiling - floor < self.min_gap:
            problems.append(f"the floor {floor:.3f} is within {self.min_gap} of the ceiling {ceiling:.3f}")
        return Sanity(valid=not problems, why="; ".join(problems) or None)


@functools.cache
def card_rules(path: Path = RULES) -> CardRules:
    """The shipped card rules, read once."""
    return build_file(CardRules, read_yaml(path), path)
