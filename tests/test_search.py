"""Searched attacks' parts by hand: the split of D_f and every family's D_rel inside its pool, the winner, the
history, the space's checks, the ragged bootstrap, the oracle-imitation loss (the end-to-end search runs in
tests/test_audit.py on the audit's fixture)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from margincal.auditing.card import pooled_bootstrap, ragged
from margincal.auditing.search import _param, history, resolve_searches, selection_score, split_for, winner
from margincal.config import AttackConfig
from margincal.data.draws import relearn_split, search_split
from margincal.typed import ConfigError


def test_the_split_is_three_disjoint_sets_of_fixed_sizes_and_seeded():
    split = search_split(50, 20, 1000)
    pool, select, report = set(split.pool), set(split.selection), set(split.report)
    assert pool | select | report == set(range(50)) and not (pool & select or pool & report or select & report)
    assert (len(pool), len(select), len(report)) == (20, 15, 15)  # the mini's forget10 at K = 20
    assert [len(x) for x in (search_split(200, 20, 1000).selection, search_split(200, 20, 1000).report)] == [90, 90]
    assert search_split(50, 20, 1000) == split and search_split(50, 20, 1001) != split
    assert len(search_split(11, 4, 1000).selection) == 4 and len(search_split(11, 0, 1000).report) == 5  # ⌈⌉, ⌊⌋
    assert split.selecting(True) == split.selection and set(split.selecting(False)) == select | pool
    with pytest.raises(ValueError, match="no room for both"):
        search_split(21, 20, 1000)


def test_draws_from_the_pool_hold_the_selection_and_report_sets_out_at_every_k():
    """Fails on the halves it replaced: draw 0's D_rel was the first K records of selection half A, so a K = 20 trial
    was selected on 5 of 50 records, and the reported draws 1 and 2 trained on records of report half B."""
    split = search_split(50, 20, 1000)
    kept = set(split.selection) | set(split.report)
    for k in range(1, 21):
        for draw in range(3):
            rel, held = relearn_split(50, k, draw, split.pool)
            assert len(rel) == k and set(rel) <= set(split.pool) and kept <= set(held)
    assert relearn_split(50, 20, 0, split.pool)[0] == list(split.pool)  # K = |pool|: D_rel is the pool
    assert relearn_split(50, 5, 0, split.pool) != relearn_split(50, 5, 1, split.pool)  # draws differ below it
    assert relearn_split(50, 20, 0) == relearn_split(50, 20, 0, ())  # without a pool: the budget's draws as before
    with pytest.raises(ValueError, match="outside the forget set"):
        relearn_split(10, 2, 0, (3, 12))
    assert AttackConfig(k=2, pool=[4, 1]).pool == [4, 1]
    for bad in ({"k": 1, "pool": [1, 1]}, {"k": 1, "pool": [1], "data": "retain"}):
        with pytest.raises(ConfigError, match="pool lists distinct D_f records"):
            AttackConfig(**bad)
    with pytest.raises(ConfigError, match="at most the relearn pool's 2 records, got 3"):
        AttackConfig(k=3, pool=[0, 1])


def test_every_family_that_trains_on_d_f_draws_inside_the_pool(monkeypatch):
    """Every searched family of the worst budget at the mini's K: those that train on D_f (LoRA, FPFT, soft prompt,
    in-context pairs) take every trial's and every reported draw's D_rel from the pool, so each is scored on the
    same selection set and reported on the whole report set; the others (retain, probe, format probe) draw nothing
    from D_f and select on the pool too."""
    from types import SimpleNamespace

    from margincal.auditing.plan import load_budget
    from margincal.config import resolve_benchmark
    from margincal.stages import attack_inputs

    spec = resolve_benchmark("mini")
    spaces = resolve_searches(load_budget("worst"), "mini", spec.utility, [])
    assert {p for p, s in spaces.items() if s.forget} == {"lora_r8", "fpft", "soft_prompt_20", "in_context"}
    split = split_for(spaces, 50)
    assert len(split.pool) == 20 and len(split.selection) == 15 == len(split.report)
    records = [SimpleNamespace(question=f"q{i}") for i in range(50)]
    ws = SimpleNamespace(
        eval_splits={"forget": records},
        attack_examples=list(range(50)),
        benchmark=spec,
        train={"retain": list(range(100)), "probe": list(range(100))},
    )
    for preset, space in spaces.items():
        pool = split.pool if space.forget else ()
        for k in sorted({1, space.k // 2, space.k}):
            for draw in range(3):
                values = {**space.preset_values("mini"), "k": k}
                cfg = space.config("mini", values, draw, (), pool)
                held, d_rel, _ = attack_inputs(ws, cfg)
                assert set(split.selecting(space.forget)) | set(split.report) <= set(held), (preset, k, draw)
                if space.forget:
                    assert set(d_rel) <= set(split.pool) and len(d_rel) == k


def test_the_winner_is_the_best_feasible_trial_on_the_selection_set():
    trials = [
        {"trial": 0, "value": 0.5, "feasible": True},
        {"trial": 1, "value": 0.9, "feasible": False},
        {"trial": 2, "value": 0.7, "feasible": True},
        {"trial": 3, "value": 0.7, "feasible": True},
    ]
    assert winner(trials)["trial"] == 2 and winner([trials[1]]) is None  # the earliest of ties; none within
    result = {"heldout": [1, 2, 4], "samples": [{"rouge_l": 0.0}, {"rouge_l": 0.5}, {"rouge_l": 1.0}]}
    assert selection_score(result, (2, 4), "rouge_l") == 0.75
    with pytest.raises(RuntimeError, match="trained on selection records"):
        selection_score(result, (2, 3), "rouge_l")


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
    from margincal.auditing.plan import load_budget
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
    from margincal.auditing.plan import load_budget

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


def test_a_searched_row_below_its_preset_says_why():
    """The card's reason for a searched row below its preset by more than its interval's half-width: the preset's own
    trial broke the utility bound (the search could not choose it), else a selection lead that did not carry over;
    within the half-width, no reason."""
    from margincal.auditing.worst_case import below_preset
    from margincal.cards import Estimate

    preset = {"train.lr": 0.002, "train.steps": 20}
    record = {
        "reported": {"preset": {"params": preset}},
        "trials": [{"params": preset, "value": 0.508, "utility": 0.694, "feasible": False}],
        "winner": {"value": 0.410},
        "split": {"selection": list(range(90))},
        "utility_bound": 0.737,
    }
    won = Estimate(value=0.20, ci=[0.10, 0.30])
    assert "preset itself breaks the utility bound (utility 0.694 against 0.737" in below_preset(record, won, 0.50)
    record["trials"][0].update(value=0.400, feasible=True, utility=0.90)
    assert "led on the 90 selection records (selection 0.410 against the preset's 0.400)" in below_preset(
        record, won, 0.50
    )
    assert below_preset(record, won, 0.29) is None
