"""Panel statistics (paper Sec. 4.1 "MC and statistics"): paired win counts with exact Clopper–Pearson intervals,
Pearson/Spearman correlations with percentile bootstrap intervals (and the gap between two targets' correlations),
and Student-t intervals of a mean over seeds or pairs (scipy).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats

from margincal.core.errors import InputError


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for k successes in n trials: [B(α/2; k, n−k+1), B(1−α/2; k+1, n−k)]."""
    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


@dataclasses.dataclass
class WinCount:
    """MC wins among populated paired cells, with the exact 95 % interval of the win rate."""

    wins: int
    n: int
    low: float
    high: float

    def __str__(self) -> str:
        if self.n == 0:
            return "—"
        return f"{self.wins}/{self.n} [{self.low:.2f}, {self.high:.2f}]"


def win_count(pairs: Sequence[tuple[float | None, float | None]], lower_is_better: bool) -> WinCount:
    """Paired (baseline, MC) values; a win is a strict improvement, a pair with a missing side is not populated."""
    populated = [(b, m) for b, m in pairs if b is not None and m is not None and not (math.isnan(b) or math.isnan(m))]
    wins = sum((m < b) if lower_is_better else (m > b) for b, m in populated)
    return WinCount(wins, len(populated), *clopper_pearson(wins, len(populated)))


@dataclasses.dataclass
class MeanInterval:
    """A mean over ``n`` independent runs (seeds) with its two-sided Student-t interval (NaN below two runs);
    ``clipped``: the interval was cut to the metric's range (shown with ``*``)."""

    mean: float
    low: float
    high: float
    n: int
    clipped: bool = False

    def format(self, spec: str = "+.3f") -> str:
        if self.n == 0:
            return "—"
        if math.isnan(self.low):
            return f"{self.mean:{spec}} (n = {self.n})"
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]" + ("*" if self.clipped else "")

    def __str__(self) -> str:
        return self.format()


def mean_interval(
    values: Sequence[float | None], confidence: float = 0.95, bounds: tuple[float, float] | None = None
) -> MeanInterval:
    """x̄ ± t_{(1+c)/2, n−1} · s / √n over the values present (None and NaN left out); s is the sample standard
    deviation (ddof 1). With three seeds t = 4.303: the interval is wide, as three runs warrant, and of a metric
    with a range (``bounds``, e.g. [0, 1] for ROUGE-L or MU) it is cut to that range and marked ``clipped``."""
    xs = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    n = len(xs)
    if n == 0:
        return MeanInterval(math.nan, math.nan, math.nan, 0)
    mean = float(xs.mean())
    if n < 2:
        return MeanInterval(mean, math.nan, math.nan, n)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1) * xs.std(ddof=1) / math.sqrt(n))
    low, high = mean - half, mean + half
    if bounds is None or bounds[0] <= low <= high <= bounds[1]:
        return MeanInterval(mean, low, high, n)
    return MeanInterval(mean, max(low, bounds[0]), min(high, bounds[1]), n, clipped=True)


MIN_BOOTSTRAP_N = 10  # pairs needed for a bootstrap correlation interval


@dataclasses.dataclass
class Correlation:
    """A correlation coefficient with its percentile bootstrap interval over resampled (x, y) pairs."""

    method: str
    r: float
    low: float
    high: float
    n: int
    degenerate: int = 0  # resamples with a constant side (no coefficient), left out of the interval

    def __str__(self) -> str:
        if math.isnan(self.r):
            return f"{self.method} undefined (n = {self.n})"
        if math.isnan(self.low):
            return f"{self.method} {self.r:+.3f} (n = {self.n}; no interval below n = {MIN_BOOTSTRAP_N})"
        left_out = f"; {self.degenerate} constant resamples left out" if self.degenerate else ""
        return f"{self.method} {self.r:+.3f} [{self.low:+.2f}, {self.high:+.2f}] (n = {self.n}{left_out})"


def _coefficient(method: str):
    fn = stats.pearsonr if method == "pearson" else stats.spearmanr

    def statistic(x, y):
        return fn(x, y).statistic

    return statistic


def correlation(
    x: Sequence[float], y: Sequence[float], method: str = "pearson", n_resamples: int = 2000, seed: int = 0
) -> Correlation:
    """Pearson or Spearman r of paired samples and its 95 % percentile bootstrap CI (paired resampling), from
    ``MIN_BOOTSTRAP_N`` pairs on: below that most resamples hold two or three distinct points, whose coefficients pile
    up at ±1, and the interval would claim a precision the data do not have (4 points gave Spearman [+1.00, +1.00]), so
    none is given (NaN). A resample with a constant side has no coefficient; the interval is taken over the others and
    their number is reported (``degenerate``)."""
    if method not in ("pearson", "spearman"):
        raise InputError(f"unknown correlation {method!r}; use pearson or spearman")
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return Correlation(method, math.nan, math.nan, math.nan, n)
    statistic = _coefficient(method)
    r = float(statistic(x, y))
    if n < MIN_BOOTSTRAP_N:
        return Correlation(method, r, math.nan, math.nan, n)
    low, high, degenerate = _paired_bootstrap((x, y), statistic, n_resamples, seed)
    return Correlation(method, r, low, high, n, degenerate)


def _paired_bootstrap(samples: tuple, statistic, n_resamples: int, seed: int) -> tuple[float, float, int]:
    """The 95 % percentile interval of ``statistic`` over units resampled together (scipy's paired bootstrap),
    and how many resamples had no value (a constant side): left out of the interval, counted."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # resamples with a constant side have no coefficient (NaN, reported as such)
        boot = stats.bootstrap(
            samples,
            statistic,
            paired=True,
            vectorized=False,
            n_resamples=n_resamples,
            method="percentile",
            random_state=np.random.default_rng(seed),
        )
    dist = boot.bootstrap_distribution
    finite = dist[np.isfinite(dist)]
    low, high = np.percentile(finite, [2.5, 97.5]) if len(finite) else (math.nan, math.nan)
    return float(low), float(high), int(len(dist) - len(finite))


def correlation_gap(
    x: Sequence[float],
    y1: Sequence[float],
    y2: Sequence[float],
    method: str = "spearman",
    n_resamples: int = 2000,
    seed: int = 0,
) -> Correlation:
    """r(x, y1) − r(x, y2) over the same units (one predictor, two targets: a searched and a preset attack's recovered
    fraction), with the 95 % percentile bootstrap interval of that difference, units resampled together (paired, the
    dependence between the two coefficients kept). Below ``MIN_BOOTSTRAP_N`` units no interval, as for
    :func:`correlation`; resamples where either coefficient is undefined are left out and counted."""
    x, y1, y2 = (np.asarray(v, dtype=float) for v in (x, y1, y2))
    n = len(x)
    if n < 3 or np.ptp(x) == 0 or np.ptp(y1) == 0 or np.ptp(y2) == 0:
        return Correlation(method, math.nan, math.nan, math.nan, n)
    statistic = _coefficient(method)
    gap = float(statistic(x, y1) - statistic(x, y2))
    if n < MIN_BOOTSTRAP_N:
        return Correlation(method, gap, math.nan, math.nan, n)
    low, high, degenerate = _paired_bootstrap(
        (x, y1, y2), lambda a, b, c: statistic(a, b) - statistic(a, c), n_resamples, seed
    )
    return Correlation(method, gap, low, high, n, degenerate)
