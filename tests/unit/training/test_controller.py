"""Held-out monitors and controlled MC (issue 27): dual ascent, the MIA stop, best-checkpoint selection, and
monitored runs equal to unmonitored ones when nothing controls them."""

import dataclasses
import json

import pytest
import torch

from margincal.config.settings import ControlConfig, LoraSpec, MCConfig, MonitorConfig, TrainConfig, resolve_method
from margincal.data.records import QARecord
from margincal.model.loading import clone_model
from margincal.pipeline.stages import StageResult, polish_stage, unlearn_stage, write_trace
from margincal.training.controller import MonitorHook, Multiplier, dual_ascent, mia_reached
from tests.conftest import RECORDS, make_workspace, tensorboard_scalars

CONTROL = ControlConfig(budget=0.1, dual_lr=2.0, kl_max=1.0)


def test_dual_ascent_raises_the_kl_weight_over_budget_and_lowers_it_back():
    # u0 = 1.0, budget 0.1: u = 1.3 is 0.2 over → λ + 2 · 0.2; u = 1.0 is 0.1 under → λ − 2 · 0.1, floored at λ0
    assert dual_ascent(0.05, 1.3, 1.0, CONTROL, floor=0.05) == pytest.approx(0.45)
    assert dual_ascent(0.45, 1.0, 1.0, CONTROL, floor=0.05) == pytest.approx(0.25)
    assert dual_ascent(0.25, 1.0, 1.0, CONTROL, floor=0.05) == pytest.approx(0.05)
    assert dual_ascent(0.05, 1.0, 1.0, CONTROL, floor=0.05) == 0.05  # never below the frozen λ_KL
    assert dual_ascent(0.9, 2.0, 1.0, CONTROL, floor=0.05) == 1.0  # capped at kl_max


def scripted(rows: list[dict]):
    """A monitors stub returning the next scripted row on each call."""
    it = iter(rows)
    return lambda model: dict(next(it))


def run_hook(hook: MonitorHook, model: torch.nn.Module, steps: list[int], moves=None) -> list[dict]:
    """Call ``hook`` at ``steps`` as the training loop does; ``moves[i]`` is added to the weights before call i."""
    outs = []
    for i, step in enumerate(steps):
        if moves is not None:
            with torch.no_grad():
                model.weight.add_(moves[i])
        outs.append(hook(step, model) or {})
    return outs


def test_dual_ascent_moves_the_objectives_kl_weight_through_the_hook():
    utilities = [1.0, 1.3, 1.3, 1.0]  # over budget twice, then back within it
    rows = [{"delta": 1.0, "auc/loss": 0.9, "utility": u} for u in utilities]
    kl = Multiplier(0.05)
    control = dataclasses.replace(CONTROL, mia_stop=False, delta_target=None)
    hook = MonitorHook(scripted(rows), 10, 40, "last", control, kl)
    run_hook(hook, torch.nn.Linear(1, 1), [0, 10, 20, 30])
    assert [r["kl_weight"] for r in hook.trace] == pytest.approx([0.05, 0.05, 0.45, 0.85])
    assert kl.value == pytest.approx(0.65)  # the last pass lowered it: u back at u0


def test_mia_stop_fires_where_the_scripted_auc_reaches_the_reference():
    reference = {"loss": 0.6, "min_k": 0.55}
    aucs = [(0.95, 0.9), (0.8, 0.7), (0.62, 0.5), (0.6, 0.54), (0.4, 0.3)]  # both ≤ reference first at step 30
    rows = [{"delta": 2.0, "utility": 1.0, "auc/loss": a, "auc/min_k": b} for a, b in aucs]
    control = dataclasses.replace(CONTROL, delta_target=None)
    hook = MonitorHook(scripted(rows), 10, 40, "last", control, Multiplier(0.05), reference)
    outs = run_hook(hook, torch.nn.Linear(1, 1), [0, 10, 20, 30, 40])
    assert [o.get("stop", False) for o in outs] == [False, False, False, True, True]
    assert hook.trace[3]["stop_reason"] == "mia" and not mia_reached(rows[2], reference)


def test_mia_stop_is_never_asked_of_the_start_and_needs_a_reference():
    rows = [{"delta": 2.0, "utility": 1.0, "auc/loss": 0.1}]
    hook = MonitorHook(scripted(rows), 10, 40, "last", CONTROL, Multiplier(0.05), {"loss": 0.6})
    start = {"delta": 2.0, "utility": 1.0, "auc/loss": 0.1, "kl_weight": 0.05}  # the row, for the training curves
    assert run_hook(hook, torch.nn.Linear(1, 1), [0]) == [{"stop": False, "curves": start}]  # AUC below θ_ref: no stop
    with pytest.raises(ValueError, match="reference"):
        MonitorHook(scripted(rows), 10, 40, "last", CONTROL, Multiplier(0.05), None)


def test_delta_target_stops_and_selection_returns_the_best_step_within_budget():
    # step:      0    10    20    30 (over budget)   40
    deltas = [3.0, 1.5, 0.4, -1.0, -0.5]
    utilities = [1.0, 1.05, 1.08, 1.3, 1.09]
    rows = [{"delta": d, "utility": u, "auc/loss": 0.9} for d, u in zip(deltas, utilities, strict=True)]
    control = dataclasses.replace(CONTROL, mia_stop=False, dual_lr=0.0, delta_target=0.0)
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    hook = MonitorHook(scripted(rows), 10, 40, "controlled", control, Multiplier(0.05))
    outs = run_hook(hook, model, [0, 10, 20, 30, 40], moves=[0.0, 1.0, 1.0, 1.0, 1.0])
    assert [o.get("stop", False) for o in outs] == [False, False, False, True, True]
    # step 30 crosses the target but is over budget; step 40 (Δ −0.5 → counted as 0) is the best within budget
    assert hook.restore(model) == 40 and model.weight.item() == 4.0
    assert [r["selected"] for r in hook.trace] == [False, False, False, False, True]


def test_selection_prefers_the_earliest_of_equal_steps_and_restores_its_weights():
    control = dataclasses.replace(CONTROL, mia_stop=False, dual_lr=0.0, delta_target=None)
    rows = [{"delta": d, "utility": 1.0} for d in (2.0, -0.3, -1.0, 0.5)]
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    hook = MonitorHook(scripted(rows), 10, 30, "controlled", control, Multiplier(0.05))
    run_hook(hook, model, [0, 10, 20, 30], moves=[0.0, 1.0, 1.0, 1.0])
    assert hook.restore(model) == 20 and model.weight.item() == 2.0  # no target: the lowest Δ
    rows = [{"delta": d, "utility": 1.0} for d in (2.0, 0.5, -0.5, 1.0)]  # |Δ| ties at steps 10 and 20
    hook = MonitorHook(scripted(rows), 10, 30, "delta")
    run_hook(hook, model, [0, 10, 20, 30], moves=[0.0, 1.0, 1.0, 1.0])
    assert hook.restore(model) == 10 and model.weight.item() == 3.0  # the earliest: weights 2 + 1 at step 10


def with_monitor_splits(ws):
    """The tiny workspace with the evaluation splits the monitors read (holdout, real authors, world facts)."""
    holdout = [QARecord(f"Where was {n} born?", f"{n} was born in Port Ivo.") for n in ("Eda Fal", "Gus Hol")]
    ws.eval_splits.update(holdout=holdout, real_authors=RECORDS[:2], world_facts=RECORDS[2:])
    return ws


def tiny_mc(**changes) -> MCConfig:
    train = TrainConfig(steps=6, batch_size=1, lr=5e-3, lora=LoraSpec(r=2, alpha=2))
    return MCConfig(train=train, **changes)


def test_a_monitored_polish_equals_an_unmonitored_one_bit_for_bit(tiny_model, tiny_tokenizer, tmp_path):
    ws = with_monitor_splits(make_workspace(tiny_model, tiny_tokenizer))
    run = resolve_method("NPO", "mini")
    plain, res_plain = polish_stage(clone_model(tiny_model), run, tiny_mc(), ws, 0.5)
    watched, res = polish_stage(clone_model(tiny_model), run, tiny_mc(monitor=MonitorConfig(every=2, n=4)), ws, 0.5)
    assert all(
        torch.equal(a, b) for a, b in zip(plain.state_dict().values(), watched.state_dict().values(), strict=True)
    )
    assert [r["loss"] for r in res.history] == [r["loss"] for r in res_plain.history]
    assert [r["step"] for r in res.trace] == [0, 2, 4, 6] and res.selected is None
    assert {"delta", "auc/loss", "auc/min_k", "auc/zlib", "privleak/loss", "utility"} <= set(res.trace[0])
    assert res.trace[0]["privleak/loss"] == pytest.approx(0.0, abs=1e-6)  # θ_ref = the start here
    kl = [r["kl"] for r in res.history]  # the probe KL the loss computed: each pass records its mean since the last
    assert "probe_kl" not in res.trace[0] and [r["probe_kl"] for r in res.trace[1:]] == [
        sum(kl[i : i + 2]) / 2 for i in (0, 2, 4)
    ]
    info = write_trace(tmp_path, res)
    assert set(info["monitor_seconds"]) == {"forget", "mia", "utility"}
    assert json.loads((tmp_path / "trace.json").read_text())["rows"][0]["step"] == 0
    assert (tmp_path / "trace.png").stat().st_size > 0
    assert write_trace(tmp_path / "none", StageResult([], 0.0)) == {}
    # Δ-stop is the same hook with Δ as its only signal: a target never reached leaves training as it was
    stopper, res = polish_stage(clone_model(tiny_model), run, tiny_mc(stop_delta=-1e9, check_every=2), ws, 0.5)
    assert all(
        torch.equal(a, b) for a, b in zip(plain.state_dict().values(), stopper.state_dict().values(), strict=True)
    )
    assert {k for r in res.trace for k in r} == {"step", "delta", "probe_kl"}  # Δ, and the loss's own probe KL
    assert [r["step"] for r in res.trace] == [0, 2, 4, 6]
    assert write_trace(tmp_path / "dstop", res) == {"selected": None, "monitor_seconds": {}}
    with pytest.raises(ValueError, match="set control.delta_target instead of stop_delta"):
        tiny_mc(stop_delta=-2.0, control=ControlConfig())


def test_delta_stop_with_monitors_on_stops_on_the_monitors_delta(tiny_model, tiny_tokenizer):
    ws = with_monitor_splits(make_workspace(tiny_model, tiny_tokenizer))
    mc = tiny_mc(monitor=MonitorConfig(every=2, n=4), stop_delta=1e6)  # reached at the first pass after the start
    _, res = polish_stage(clone_model(tiny_model), resolve_method("NPO", "mini"), mc, ws, 0.5)
    assert res.stopped_at == 2 and [r["step"] for r in res.trace] == [0, 2] and res.trace[-1]["stop_reason"] == "delta"
    assert "auc/loss" in res.trace[-1] and "kl_weight" not in res.trace[-1]  # the full monitors; no λ_KL moved
    controlled = tiny_mc(control=ControlConfig(mia_stop=False))  # controlled MC's Δ target (0) is the same rule
    for needs_m_ref in (mc, controlled):
        with pytest.raises(ValueError, match="needs the reference margin"):
            polish_stage(clone_model(tiny_model), resolve_method("NPO", "mini"), needs_m_ref, ws, None)


def test_a_monitored_unlearning_run_equals_an_unmonitored_one_and_selects_by_delta(tiny_model, tiny_tokenizer):
    ws = with_monitor_splits(make_workspace(tiny_model, tiny_tokenizer))
    overrides = ["train.steps=4", "train.batch_size=2"]
    run = resolve_method("GradDiff", "mini", overrides=overrides)
    plain, _ = unlearn_stage(run, ws, seed=0)
    watched, res = unlearn_stage(dataclasses.replace(run, monitor=MonitorConfig(every=2, n=4)), ws, 0, m_ref=0.0)
    assert all(
        torch.equal(a, b) for a, b in zip(plain.state_dict().values(), watched.state_dict().values(), strict=True)
    )
    chosen, res = unlearn_stage(resolve_method("GradDiff", "mini", overrides=[*overrides, "select=delta"]), ws, 0,
                                m_ref=0.0)  # fmt: skip
    best = min(res.trace, key=lambda r: (abs(r["delta"]), r["step"]))
    assert res.selected == best["step"] and [r["selected"] for r in res.trace].count(True) == 1


def test_controlled_polish_runs_stops_and_releases_a_monitored_step(tiny_model, tiny_tokenizer):
    ws = with_monitor_splits(make_workspace(tiny_model, tiny_tokenizer))
    mc = tiny_mc(control=ControlConfig(mia_stop=False, delta_target=None))
    assert mc.monitor == MonitorConfig()  # control turns the monitors on
    mc = dataclasses.replace(mc, monitor=MonitorConfig(every=2, n=4))
    _, res = polish_stage(clone_model(tiny_model), resolve_method("NPO", "mini"), mc, ws, 0.5)
    assert res.selected in {r["step"] for r in res.trace}
    assert all("kl_weight" in r for r in res.trace)
    with pytest.raises(ValueError, match="kl_weight > 0"):
        tiny_mc(kl_weight=0.0, control=ControlConfig())


def test_a_run_stopped_between_passes_gets_its_last_step_monitored():
    rows = [{"delta": d, "utility": 1.0} for d in (2.0, 1.0, 0.5)]
    hook = MonitorHook(scripted(rows), 10, 100, "delta")
    model = torch.nn.Linear(1, 1)
    run_hook(hook, model, [0, 10, 13])  # step 13 is not a pass
    hook.finish(model, 10)  # already monitored: nothing added
    assert [r["step"] for r in hook.trace] == [0, 10]
    hook.finish(model, 13)
    assert [r["step"] for r in hook.trace] == [0, 10, 13] and hook.restore(model) == 13


def test_a_panel_selects_unlearning_steps_by_method_override_and_keys_them_on_the_reference():
    from margincal.pipeline.panel import load_panel
    from margincal.pipeline.plan import plan_panel

    plain = {p.cell.method: p for p in plan_panel(load_panel("demo", ["variants=[reference]"]))}
    chosen = load_panel("demo", ["variants=[reference]", 'method_overrides={"*": {select: delta}}'])
    for plan in plan_panel(chosen):
        node = next(n for n in plan.graph.nodes if n.label == "baseline/unlearn")
        assert node.spec.select == "delta" and node.spec.monitor == MonitorConfig()
        assert node.inputs == ("reference/evaluate",)  # Δ and privleak read θ_ref: its evaluation is an input
        assert node.key != plain[plan.cell.method].graph.keys()["baseline/unlearn"]
        assert next(n for n in plain[plan.cell.method].graph.nodes if n.label == "baseline/unlearn").inputs == ()


def test_cli_unlearn_select_and_controlled_polish_on_the_smoke_mini(smoke_mini, tmp_path, capsys):
    from margincal.cli import main

    theta0, ref, data = str(smoke_mini.paths.theta0), str(smoke_mini.paths.ref), smoke_mini.data
    files = ["--forget", str(data / "forget10.json"), "--retain", str(data / "retain90.json")]
    watch = ["--holdout", str(data / "holdout.json"), "--utility", str(data / "real_authors.json")]
    base = ["unlearn", "--method", "GradDiff", "--model", theta0, "--schedule", "mini", *files]
    assert main([*base, "--select", "delta", "--out", str(tmp_path / "x"), "train.steps=2"]) == 2  # no --ref
    assert main([*base, "--ref", ref, "--select", "delta", "--out", str(tmp_path / "y"), "train.steps=2"]) == 2
    out = tmp_path / "unlearned"
    args = [*base, "--ref", ref, "--select", "delta", "--out", str(out), "train.steps=4", "monitor.every=2", *watch,
            "--report-to", "tensorboard"]  # fmt: skip
    assert main(args) == 0
    stage = json.loads((out / "stage.json").read_text())["info"]
    trace = json.loads((out / "trace.json").read_text())
    assert [r["step"] for r in trace["rows"]] == [0, 2, 4] and stage["selected"] == trace["selected"]
    best = min(trace["rows"], key=lambda r: (abs(r["delta"]), r["step"]))
    assert trace["selected"] == best["step"] and (out / "trace.png").exists()
    curves = tensorboard_scalars(out / "tensorboard")  # the loss every step, Δ where the monitors ran, read back
    history = json.loads((out / "history.json").read_text())
    assert [s for s, _ in curves["unlearn GradDiff/loss"]] == [1, 2, 3, 4] == [r["step"] + 1 for r in history]
    delta = {r["step"]: r["delta"] for r in trace["rows"]}
    assert curves["unlearn GradDiff/delta"] == [(s, pytest.approx(delta[s], rel=1e-6)) for s in (0, 2, 4)]
    capsys.readouterr()
    assert main([a if a != str(out) else str(tmp_path / "again") for a in args]) == 0  # read from the store
    assert (tmp_path / "again" / "tensorboard").is_dir() and "no training curve" not in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "quiet"), "train.steps=2"]) == 0  # stored without curves
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "loud"), "train.steps=2", "--report-to", "tensorboard"]) == 0
    assert not (tmp_path / "loud" / "tensorboard").exists()
    assert (
        "report_to tensorboard: no training curve was written for 1 stage(s) read from the store (model/unlearn)"
        in (" ".join(capsys.readouterr().err.split()))
    )
    polished = tmp_path / "controlled"
    args = ["polish", "--variant", "controlled", "--model", str(out), "--method", "GradDiff", "--theta0", theta0,
            "--ref", ref, *files, "--probe", str(data / "probe.json"), "--schedule", "mini", "--out", str(polished),
            "train.steps=4", "monitor.every=2", *watch, "--report-to", "tensorboard"]  # fmt: skip
    assert main(args) == 0
    trace = json.loads((polished / "trace.json").read_text())
    assert trace["selected"] in {r["step"] for r in trace["rows"]} and all("kl_weight" in r for r in trace["rows"])
    curves = tensorboard_scalars(polished / "tensorboard")  # MC's terms every step, λ_KL where the controller ran
    assert {"MC GradDiff/loss", "MC GradDiff/lr", "MC GradDiff/kl_weight"} <= set(curves)
    assert curves["MC GradDiff/kl_weight"] == [(r["step"], pytest.approx(r["kl_weight"])) for r in trace["rows"]]
