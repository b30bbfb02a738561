"""Searched attacks' parts by hand: the split of D_f and every family's D_rel inside its pool, the winner, the
history, the space's checks, the ragged bootstrap, the oracle-imitation loss (the end-to-end search runs in
tests/integration/test_audit.py on the audit's fixture)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from margincal.auditing.candidates import choose, constraints_broken, ranked, why_none
from margincal.auditing.card import pooled_bootstrap, ragged
from margincal.auditing.search import selection_score
from margincal.auditing.spaces import Param, SearchSpace, _param, resolve_searches, split_for
from margincal.auditing.study import completed_trials, history, search_seed, start_design
from margincal.config.settings import AttackConfig
from margincal.config.typed import ConfigError
from margincal.data.draws import relearn_split, search_split


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
    from margincal.config.settings import resolve_benchmark
    from margincal.pipeline.stages import attack_inputs

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


def test_trials_within_the_bound_are_ranked_by_selection_score():
    trials = [
        {"trial": 0, "value": 0.5, "feasible": True},
        {"trial": 1, "value": 0.9, "feasible": False},
        {"trial": 2, "value": 0.7, "feasible": True},
        {"trial": 3, "value": 0.7, "feasible": True},
    ]
    assert [t["trial"] for t in ranked(trials)] == [2, 3, 0] and ranked([trials[1]]) == []  # the earliest of ties
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
    from margincal.config.settings import resolve_benchmark

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
    from margincal.results.cards import Estimate

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


def _trials(*rows):
    """Search trials by hand: (number, lr, draw-0 selection score, within the bound on draw 0)."""
    return [{"trial": n, "params": {"train.lr": lr}, "value": v, "feasible": f} for n, lr, v, f in rows]


def _evaluator(outcomes: dict):
    """A candidate evaluation by hand: lr → (selection pooled over draws, constraints broken); logs what it ran."""
    ran = []

    def evaluate(row, params, trial):
        ran.append(row)
        selection, broken = outcomes[params["train.lr"]]
        return {"row": row, "trial": trial, "params": params, "selection": selection, "broken": broken}

    return evaluate, ran


def test_the_strongest_configuration_breaking_theta0_gives_way_to_the_next_valid_one():
    """Planted (fails at a8a2fda, which reported the strongest trial and then vetoed it): the strongest trial on the
    selection records lowers θ0's own answers, the second does not; the worst case is the second, valid, and the
    walk stops there (the third is never run). A trial outside the utility bound on draw 0 is never a candidate."""
    trials = _trials((0, 2e-3, 0.50, True), (1, 9e-3, 0.95, False), (2, 5e-3, 0.80, True), (3, 4e-3, 0.70, True),
                     (4, 3e-3, 0.60, True))  # fmt: skip
    theta0 = ["the sanity rule on the selection records: it lowers θ0 from 1.000 to 0.850"]
    evaluate, ran = _evaluator({2e-3: (0.5, []), 5e-3: (0.8, theta0), 4e-3: (0.7, []), 3e-3: (0.6, [])})
    best, checked = choose(trials, {"train.lr": 2e-3}, evaluate)
    assert best["row"] == "t3" and best["broken"] == [] and ran == ["preset", "t2", "t3"]
    assert [c["row"] for c in checked] == ["preset", "t2", "t3"]
    # with one draw the pooled score is draw 0's: a trial no stronger than a valid candidate is never run
    evaluate, ran = _evaluator({2e-3: (0.75, []), 5e-3: (0.8, theta0), 4e-3: (0.7, []), 3e-3: (0.6, [])})
    best, _ = choose(trials, {"train.lr": 2e-3}, evaluate, draws=1)
    assert best["row"] == "preset" and ran == ["preset", "t2"]


def test_a_preset_stronger_than_every_valid_trial_is_the_worst_case():
    """Planted: the preset is the strongest valid attack over every reported draw (the draw-0 leader, valid, scores
    less when pooled): the worst case is the preset itself; on a tie the preset too."""
    trials = _trials((0, 2e-3, 0.60, True), (1, 5e-3, 0.70, True))
    evaluate, _ = _evaluator({2e-3: (0.66, []), 5e-3: (0.64, [])})
    assert choose(trials, {"train.lr": 2e-3}, evaluate)[0]["row"] == "preset"
    evaluate, _ = _evaluator({2e-3: (0.66, []), 5e-3: (0.66, [])})
    assert choose(trials, {"train.lr": 2e-3}, evaluate)[0]["row"] == "preset"
    evaluate, _ = _evaluator({2e-3: (0.66, ["the utility bound"]), 5e-3: (0.64, [])})  # an invalid preset never wins
    assert choose(trials, {"train.lr": 2e-3}, evaluate)[0]["row"] == "t1"


def test_a_family_with_no_valid_attack_says_which_constraint_every_trial_broke():
    trials = _trials((0, 2e-3, 0.5, True), (1, 9e-3, 0.9, False), (2, 5e-3, 0.8, True))
    evaluate, ran = _evaluator({2e-3: (0.5, ["the utility bound 0.900 (utility 0.850 on 1 of 3 draws)"]),
                                5e-3: (0.8, ["the sanity rule on the selection records: it lowers θ0"])})  # fmt: skip
    best, checked = choose(trials, {"train.lr": 2e-3}, evaluate)
    assert best is None and ran == ["preset", "t2"]  # every trial within the bound on draw 0 was checked
    assert why_none(trials, checked) == (
        "no valid attack in this family at this scale: 1 of 3 trials broke the utility bound on the selection draw; "
        "the preset broke the utility bound 0.900 (utility 0.850 on 1 of 3 draws); trial 3 broke the sanity rule on "
        "the selection records: it lowers θ0"
    )


def test_the_constraints_a_candidate_breaks_by_hand():
    """Utility below the bound on any draw; the cards' sanity rule (tolerance 0.10, gap 0.05) on the selection
    records; nothing without θ_ref and θ0."""
    assert constraints_broken([0.80, 0.79], 0.75, 0.30, 0.95, 1.00) == []
    assert constraints_broken([0.80, 0.70], 0.75, 0.30, 0.95, 1.00) == [
        "the utility bound 0.750 (utility 0.700 on 1 of 2 draws)"
    ]
    assert constraints_broken([0.80], 0.75, 0.30, 0.85, 1.00) == [
        "the sanity rule on the selection records: it lowers θ0 from 1.000 to 0.850 (more than the tolerance 0.1)"
    ]
    assert constraints_broken([0.80], 0.75, 0.93, 0.95, 1.00)[0].endswith("the floor 0.930 is within 0.05 of the "
                                                                           "ceiling 0.950")  # fmt: skip
    assert constraints_broken([0.80], 0.75, None, None, None) == []


def test_the_start_design_covers_every_range_and_each_search_has_its_own_seed():
    """Five Latin-hypercube points: each parameter's five strata hold one point each (lr log-scaled, steps, the rank
    choices, K); another seed draws other points, the same seed the same; two checkpoints of one audit get two
    seeds (the code version does not enter it)."""
    space = SearchSpace("lora_r8", 20, (Param("train.lr", 2e-4, 2e-2, log=True), Param("train.steps", 5, 60),
                                        Param("train.lora.r", choices=(4, 8, 16, 32)), Param("k", 1, 20)))  # fmt: skip
    points = start_design(space, 5, 7)
    strata = sorted(int(5 * math.log(p["train.lr"] / 2e-4) / math.log(100)) for p in points)
    assert strata == [0, 1, 2, 3, 4]
    assert sorted((p["train.steps"] - 5) * 5 // 56 for p in points) == [0, 1, 2, 3, 4]
    assert sorted(p["k"] for p in points) == sorted(set(p["k"] for p in points))  # five distinct K
    assert {p["train.lora.r"] for p in points} <= {4, 8, 16, 32} and start_design(space, 5, 7) == points
    assert start_design(space, 5, 8) != points and start_design(space, 0, 7) == []
    one = {"model": {"digest": "a"}, "family": "lora_r8", "epsilon": 0.05, "code": ["x"]}
    assert search_seed(one) != search_seed({**one, "model": {"digest": "b"}})
    assert search_seed(one) == search_seed({**one, "code": ["y"]}) < 2**28


def test_no_configuration_is_tried_twice_and_a_resumed_search_draws_the_same():
    """A space of 6 configurations searched for 5 trials (not enumerated): every completed trial has its own
    configuration; a repeat is never run (its trial failed, naming the earlier one). Run again from its journal with
    one trial more, the search reads its first 5 back and adds a sixth unseen one; the same seed in a new study
    draws the same 5."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SearchSpace("in_context", 6, (Param("k", 1, 3), Param("train.lora.r", choices=(4, 8))), forget=True)
    ran = []

    def objective(trial, values):
        ran.append(dict(values))
        trial.set_user_attr("utility", 1.0)
        trial.set_constraint("utility", -1.0)
        trial.set_user_attr("key", "k")
        return float(values["k"])

    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"k": 1, "train.lora.r": 4})
    study.enqueue_trial({"k": 1, "train.lora.r": 4})  # a planted repeat
    done = completed_trials(study, space, "mini", False, 5, 11, objective)
    configs = [tuple(sorted(t["params"].items())) for t in done]
    assert len(done) == 5 and len(set(configs)) == 5 and len(ran) == 5
    repeats = [t for t in study.trials if "repeats" in t.user_attrs]
    assert repeats and all(t.state.name == "FAIL" for t in repeats) and repeats[0].user_attrs["repeats"] == 0
    more = completed_trials(study, space, "mini", False, 6, 11, objective)
    assert [t["params"] for t in more[:5]] == [t["params"] for t in done] and len(ran) == 6
    assert len({tuple(sorted(t["params"].items())) for t in more}) == 6
    assert len(completed_trials(study, space, "mini", False, 9, 11, objective)) == 6  # the space is used up
