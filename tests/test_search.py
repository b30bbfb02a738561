"""Searched attacks' parts by hand: the halves, the history, the space's checks, the ragged bootstrap, the
oracle-imitation loss (the end-to-end search runs in tests/test_audit.py on the audit's fixture)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from margincal.attacks import halves
from margincal.audit.card import pooled_bootstrap, ragged
from margincal.audit.search import _param, history, resolve_searches
from margincal.config import ConfigError


def test_halves_split_every_record_once_and_are_seeded():
    a, b = halves(10, 0)
    assert a | b == set(range(10)) and not a & b and len(a) == 5
    assert halves(10, 0) == (a, b) and halves(10, 1) != (a, b)
    assert len(halves(7, 0)[0]) == 4  # ⌈7/2⌉ select, the rest report


def test_history_best_so_far_and_trials_to_90():
    trials = [
        {"value": 0.5, "feasible": True},
        {"value": 0.9, "feasible": False},  # outside the bound: never the best
        {"value": 0.7, "feasible": True},
        {"value": 0.8, "feasible": True},
    ]
    out = history(trials, unattacked=0.3)
    assert out["best_so_far"] == [0.5, 0.5, 0.7, 0.8]
    assert out["trials_to_90"] == 4  # 0.3 + 0.9 * (0.8 - 0.3) = 0.75: first reached at trial 4
    assert history(trials, unattacked=-0.5)["trials_to_90"] == 3  # -0.5 + 0.9 * 1.3 = 0.67: reached by 0.7
    # a search whose best stays below the unattacked level reaches its best at once
    assert history([{"value": 0.1, "feasible": True}], unattacked=0.5)["trials_to_90"] == 1
    assert history([{"value": 0.1, "feasible": False}], unattacked=0.5) == {"best_so_far": [None], "trials_to_90": None}


def test_a_space_entry_is_checked():
    assert _param("p", "train.lr", {"low": 1e-4, "high": 1e-2, "log": True}, 20, "f").log
    assert _param("p", "k", {"low": 1}, 20, "f").high == 20  # K up to the budget's
    assert _param("p", "train.lora.r", [4, 8], 20, "f").size() == 2
    with pytest.raises(ConfigError, match=r"spaces.p.train.lr is an empty range: low 0.1 is above high 0.01"):
        _param("p", "train.lr", {"low": 0.1, "high": 0.01}, 20, "f")
    with pytest.raises(ConfigError, match="low 5 is above the budget's K = 4"):
        _param("p", "k", {"low": 5}, 4, "f")
    with pytest.raises(ConfigError, match="takes low only"):
        _param("p", "k", {"low": 1, "high": 3}, 4, "f")
    with pytest.raises(ConfigError, match="empty list"):
        _param("p", "n_soft", [], 4, "f")
    with pytest.raises(ConfigError, match="log-scaled and needs low > 0"):
        _param("p", "train.lr", {"low": 0.0, "high": 1.0, "log": True}, 4, "f")


def test_every_shipped_space_resolves_at_both_scales():
    from margincal.audit.plan import load_budget
    from margincal.config import resolve_benchmark

    budget = load_budget("worst")
    utility = resolve_benchmark("mini").utility
    for scale in ("mini", "paper"):
        spaces = resolve_searches(budget, scale, utility, [])
        assert set(spaces) == {e.preset for e in budget.attackers}  # every family of the budget is searched
        assert spaces["in_context"].size() == 2 and spaces["format_probe"].size() == 4 and spaces["fpft"].size() is None
    assert resolve_searches(load_budget("standard"), "mini", utility, []) == {}
    with pytest.raises(ValueError, match="utility proxy reads the world_facts split"):
        resolve_searches(budget, "mini", utility, ["world_facts"])


def test_the_preset_is_the_first_trial_and_a_rank_keeps_alpha_over_r():
    from margincal.audit.plan import load_budget

    spaces = resolve_searches(load_budget("worst"), "mini", ("real_authors",), [])
    assert spaces["lora_r8"].preset_values("mini") == {"train.lr": 2e-3, "train.steps": 20, "train.lora.r": 8, "k": 20}
    # LoRA on D_f and on retain records share a space; their searches are still two (their journals' keys differ)
    assert spaces["lora_r8"].as_dict() == spaces["lora_r8_retain"].as_dict()
    assert spaces["lora_r8"].identity("mini") != spaces["lora_r8_retain"].identity("mini")
    cfg = spaces["lora_r8"].config("mini", {"train.lora.r": 32, "k": 7, "train.lr": 1e-3}, 2, ("real_authors",))
    assert (cfg.train.lora.r, cfg.train.lora.alpha, cfg.k, cfg.train.seed, cfg.utility) == (
        32,
        64,
        7,
        2,
        ["real_authors"],
    )


def test_the_ragged_bootstrap_resamples_only_each_draws_own_records():
    full = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    assert np.array_equal(ragged([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]), full)
    padded = ragged([[1.0, 1.0], [2.0, 2.0, 2.0]])
    assert np.isnan(padded[0, 2])
    means = pooled_bootstrap([padded], lambda x: x, n_boot=200)
    # every resample pools 2 ones and 3 twos in some mix of draws: (2·1 + 3·2)/5, (2+2)/4 ... never the NaN
    assert np.isfinite(means).all() and set(np.round(means, 6)) <= {1.0, 2.0, 1.6}
    # a full array gives what the rectangular bootstrap gave (same indices, same pooling)
    rng = np.random.default_rng(0)
    d, n, a = 2, 3, full
    draws = rng.integers(0, d, size=(50, d))
    samples = rng.integers(0, n, size=(50, d, n))
    assert np.allclose(pooled_bootstrap([a], lambda x: x, n_boot=50), a[draws[:, :, None], samples].mean(axis=(1, 2)))


def test_forward_kl_by_hand_and_the_oracle_imitation_reads_theta_ref():
    from margincal.methods.base import get_method
    from margincal.methods.distill import forward_kl

    teacher = torch.log(torch.tensor([[[0.5, 0.5]]]))
    student = torch.log(torch.tensor([[[0.25, 0.75]]]))
    mask = torch.ones(1, 1)
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert math.isclose(float(forward_kl(student, teacher, mask)), expected, rel_tol=1e-6)
    assert float(forward_kl(teacher, teacher, mask)) == pytest.approx(0.0, abs=1e-7)
    method = get_method("OracleImitation")
    assert method.prepares_with == "ref" and get_method("NPO").prepares_with == "theta0"
    assert method.family == "distillation" and (method.gamma, method.alpha) == (1.0, 1.0)
