"""Statistics: exact Clopper–Pearson intervals, paired win counts, bootstrap correlation intervals."""

import math

import numpy as np
import pytest

from margincal.results.stats import clopper_pearson, correlation, correlation_gap, mean_interval, win_count


def test_clopper_pearson_closed_forms():
    # all successes: lower bound (α/2)^(1/n); no successes: upper bound 1 − (α/2)^(1/n)
    low, high = clopper_pearson(15, 15)
    assert low == pytest.approx(0.025 ** (1 / 15), abs=1e-9) and high == 1.0
    low, high = clopper_pearson(0, 15)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 15), abs=1e-9)
    # one success in two: Beta(0.025; 1, 2) = 1 − sqrt(0.975), and by symmetry the upper bound is sqrt(0.975)
    low, high = clopper_pearson(1, 2)
    assert low == pytest.approx(1 - 0.975**0.5, abs=1e-9) and high == pytest.approx(0.975**0.5, abs=1e-9)


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [(15, 15, (0.78, 1.00)), (14, 14, (0.77, 1.00)), (0, 15, (0.00, 0.22)), (1, 14, (0.00, 0.34)), (5, 5, (0.48, 1.0))],
)
def test_clopper_pearson_matches_the_papers_table(k, n, expected):
    low, high = clopper_pearson(k, n)
    assert (round(low, 2), round(high, 2)) == expected


def test_clopper_pearson_empty():
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


def test_win_count_pairs_strict_and_skips_missing():
    pairs = [(0.5, 0.2), (0.3, 0.3), (0.4, None), (0.1, 0.6), (float("nan"), 0.1)]
    lower = win_count(pairs, lower_is_better=True)
    assert (lower.wins, lower.n) == (1, 3)  # a tie is not a win; missing or NaN pairs are not populated
    higher = win_count(pairs, lower_is_better=False)
    assert (higher.wins, higher.n) == (1, 3)
    assert str(lower) == f"1/3 [{lower.low:.2f}, {lower.high:.2f}]"
    assert str(win_count([], True)) == "—"


def test_correlation_values_and_ci():
    x = np.arange(1.0, 9.0)
    assert correlation(x, 2 * x + 1).r == pytest.approx(1.0)
    cubic = correlation(x - 4.5, (x - 4.5) ** 3, "spearman")
    assert cubic.r == pytest.approx(1.0)
    assert correlation(x - 4.5, (x - 4.5) ** 3, "pearson").r < 0.95
    rng = np.random.default_rng(3)
    a = rng.normal(size=40)
    b = a + rng.normal(size=40)
    c = correlation(a, b, "pearson", seed=0)
    assert c.low < c.r < c.high and c.n == 40
    assert correlation(a, b, "pearson", seed=0) == c  # seeded
    assert math.isnan(correlation([1, 2, 3], [5, 5, 5]).r)  # constant side: undefined, not an error
    from scipy import stats as sps

    boot = sps.bootstrap(
        (a, b),
        lambda u, v: sps.pearsonr(u, v).statistic,
        paired=True,
        vectorized=False,
        n_resamples=2000,
        method="percentile",
        random_state=np.random.default_rng(0),
    )
    assert c.degenerate == 0 and (c.low, c.high) == pytest.approx(tuple(boot.confidence_interval))
    small = correlation([0.1, 0.5, 0.2, 0.9], [0.3, 0.6, 0.2, 0.8], "spearman")  # n = 4: no interval
    assert small.r == pytest.approx(0.8) and math.isnan(small.low) and math.isnan(small.high)
    assert str(small) == "spearman +0.800 (n = 4; no interval below n = 10)"
    ten = correlation(a[:10], b[:10], "spearman", seed=1)
    assert ten.n == 10 and not math.isnan(ten.low) and ten.low <= ten.r <= ten.high
    with pytest.raises(ValueError, match="unknown correlation"):
        correlation(a, b, "kendall")


def test_correlation_gap_is_the_difference_with_a_paired_interval():
    # ranks: y1 follows x exactly (+1); y2 swaps the first two and the last two of 4: 1 - 6·(1+1+1+1)/(4·15) = +0.6
    x, y1, y2 = [1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [2.0, 1.0, 4.0, 3.0]
    small = correlation_gap(x, y1, y2)
    assert small.r == pytest.approx(0.4) and small.n == 4 and math.isnan(small.low)  # n = 4: no interval
    rng = np.random.default_rng(5)
    a = rng.normal(size=30)
    near, far = a + 0.1 * rng.normal(size=30), a + 2.0 * rng.normal(size=30)
    gap = correlation_gap(a, near, far, seed=0)
    assert gap.r == pytest.approx(correlation(a, near, "spearman").r - correlation(a, far, "spearman").r)
    assert 0 < gap.low < gap.r < gap.high and gap.degenerate == 0
    assert correlation_gap(a, near, near).r == 0.0 and correlation_gap(a, near, near).low == 0.0  # same target
    assert math.isnan(correlation_gap(x, y1, [5.0] * 4).r)  # a constant target: undefined, not an error


def test_mean_interval_is_the_student_t_interval():
    ci = mean_interval([1.0, 2.0, 3.0, None, math.nan])  # s = 1, n = 3: half-width t(0.975, 2) / sqrt(3)
    t2 = 0.95 * math.sqrt(2 / (4 * 0.975 * 0.025))  # Student t with 2 d.o.f.: t_p = (2p − 1) √(2 / (4p(1 − p)))
    assert (ci.n, ci.mean) == (3, 2.0)
    assert ci.high - ci.mean == pytest.approx(t2 / math.sqrt(3), abs=1e-12)
    assert ci.mean - ci.low == pytest.approx(ci.high - ci.mean, abs=1e-12)
    assert str(ci) == "+2.000 [-0.484, +4.484]"
    one = mean_interval([0.5])
    assert one.mean == 0.5 and math.isnan(one.low) and str(one) == "+0.500 (n = 1)"
    assert mean_interval([]).n == 0 and str(mean_interval([None])) == "—"


def test_an_interval_of_a_bounded_metric_is_cut_to_its_range_and_says_so():
    """ROUGE-L over three seeds 0.2, 0.9, 0.95: mean 0.683, half-width 4.303 · 0.4193 / √3 = 1.042, so the t-interval
    [−0.358, 1.725] is cut to [0, 1] and marked; an interval inside the range is left as it is."""
    ci = mean_interval([0.2, 0.9, 0.95], bounds=(0.0, 1.0))
    assert (ci.low, ci.high, ci.clipped) == (0.0, 1.0, True)
    assert ci.format(".3f") == "0.683 [0.000, 1.000]*"
    inside = mean_interval([0.4, 0.5, 0.6], bounds=(0.0, 1.0))
    assert not inside.clipped and inside.format(".3f") == "0.500 [0.252, 0.748]"
