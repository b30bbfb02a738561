import math

import pytest
import torch

from margincal.model.margin import (
    aggregate,
    diagnose,
    diagnostic_log_odds,
    diagnostic_margins,
    diagnostic_positions,
    overlap_epsilon,
    smoothed_margin,
    smoothing_slack,
)
from margincal.model.scoring import stats_from_logits

LN2, LN3 = math.log(2), math.log(3)


def stats():
    logits = torch.tensor(
        [
            [[LN2, 0.0, 0.0], [0.0, 0.0, 0.0], [9.0, 0.0, 0.0]],  # entropies 1.5 ln2, ln3, small
            [
                [0.0, 0.0, 0.0],
                [0.0, 0.0, 0.0],
                [3.0, 3.0, 3.0],
            ],  # entropy tie at positions 0 and 1; pos 2 pad
        ]
    )
    targets = torch.tensor([[0, 2, 0], [1, 0, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return stats_from_logits(logits, targets, mask)


def test_diagnostic_position_is_max_entropy_first_on_ties_ignoring_padding():
    assert diagnostic_positions(stats()).tolist() == [1, 0]


def test_dataset_margin_log_odds_and_certificate():
    s = stats()
    # both diagnostic positions are uniform over 3 tokens: margin 0 (tie), p = 1/3, log-odds = ln(1/2)
    assert diagnostic_margins(s).tolist() == [0.0, 0.0]
    assert torch.allclose(diagnostic_log_odds(s), torch.tensor([-LN2, -LN2]))
    d = diagnose(s, m_ref=-1.0)
    assert d.m == 0.0 and d.delta == 1.0 and d.crossed is False
    assert math.isclose(d.log_odds, -LN2, rel_tol=1e-6)
    assert d.certified is True  # ℓ = -0.693 > m_ref = -1
    assert diagnose(s, m_ref=-0.5).certified is False
    assert d.m >= d.log_odds  # competitor-mass lemma


def test_log_odds_where_gold_probability_rounds_to_one_is_the_margin_not_infinity():
    # one position over 3 tokens with logits (40, 0, 0): p_gold = 1 − 2e^-40 rounds to 1 in float32
    s = stats_from_logits(torch.tensor([[[40.0, 0.0, 0.0]]]), torch.tensor([[0]]), torch.tensor([[True]]))
    assert float(s.gold[0, 0]) == 0.0
    assert diagnostic_log_odds(s).tolist() == pytest.approx([40.0])  # = the margin there, finite
    assert diagnose(s).log_odds <= diagnose(s).m


def test_aggregate_mean_median_and_errors():
    v = torch.tensor([1.0, 2.0, 10.0, 3.0])
    assert aggregate(v, "mean") == 4.0
    assert aggregate(v, "median") == 2.5
    with pytest.raises(ValueError):
        aggregate(torch.tensor([]))
    with pytest.raises(ValueError):
        aggregate(v, "mode")


def test_smoothed_margin_brackets_hard_margin():
    logits = torch.tensor([[0.0, 0.0, LN2]])  # p = (.25, .25, .5), gold 2, hard margin ln 2
    for beta in (1.0, 10.0, 120.0):
        m_beta = float(smoothed_margin(logits, torch.tensor([2]), beta))
        assert math.isclose(m_beta, LN2 - LN2 / beta, rel_tol=1e-5)
        assert m_beta <= LN2 <= m_beta + smoothing_slack(3, beta) + 1e-6
    assert math.isclose(smoothing_slack(128256, 120.0), math.log(128255) / 120)
    assert smoothing_slack(128256, 120.0) < 0.1  # the paper's c_β < 0.1 at Llama-3's vocabulary


def test_overlap_epsilon_bigram_types():
    assert overlap_epsilon(["A b c", "a b"], ["b c d"]) == 0.5  # forget {(a,b),(b,c)}, retain has (b,c)
    assert overlap_epsilon(["x y"], ["y x"]) == 0.0
    with pytest.raises(ValueError):
        overlap_epsilon(["single"], ["a b"])
