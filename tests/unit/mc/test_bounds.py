"""Theory instruments: coercivity trace and figure, and Theorem 3's Λ̂(N) ≥ measured lift."""

import dataclasses
import json
import math

import pytest

from margincal.config.settings import AttackConfig, EvalSettings, LoraSpec, MCConfig, TrainConfig, resolve_benchmark
from margincal.data.records import encode_qa
from margincal.data.tofu import load_qa_json
from margincal.evaluation.evaluators import evaluate
from margincal.mc.bounds import LiftInstrument, coercivity_hook
from margincal.mc.loss import anchor_tables
from margincal.mc.polish import polish, polish_input
from margincal.methods import get_method
from margincal.model.loading import load_model, load_tokenizer
from margincal.reporting.figures import trajectory_figure
from margincal.training.monitors import delta_check


@pytest.fixture(scope="module")
def mini(smoke_mini):
    tok = load_tokenizer(smoke_mini.paths.theta0)
    bench_dir = smoke_mini.data
    enc = {s: encode_qa(tok, load_qa_json(bench_dir / f"{s}.json"), 96) for s in ("forget10", "retain90", "probe")}
    theta0, ref = load_model(smoke_mini.paths.theta0), load_model(smoke_mini.paths.ref)
    return tok, enc, theta0, ref


def test_coercivity_trace_logs_every_quantity_and_draws_the_figure(mini, smoke_mini, tmp_path):
    tok, enc, theta0, ref = mini
    pad = tok.pad_token_id
    npo = get_method("NPO")
    npo.prepare(theta0, enc["forget10"], tok)
    tables = anchor_tables(ref, "ref", enc["forget10"], pad)
    spec = dataclasses.replace(resolve_benchmark("mini"), max_length=96)
    records = load_qa_json(smoke_mini.data / "forget10.json")
    m_ref = evaluate(ref, tok, spec, {"forget": records}, EvalSettings(), parts=("diagnosis",))["summary"]["m"]
    check = delta_check(tok, spec, records, m_ref)  # Δ on all of D_f, as the evaluator diagnoses it
    assert check(ref) == pytest.approx(0.0, abs=1e-6)
    cfg = dataclasses.replace(
        MCConfig(train=TrainConfig(steps=4, batch_size=1, lr=1e-3, lora=LoraSpec(r=4, alpha=4))), check_every=2
    )
    hook = coercivity_hook(tables, enc["forget10"], enc["retain90"], enc["probe"], ref, check, 5.0, "uniform", pad)
    inp = polish_input(npo, cfg, {"ref": (ref, "ref")}, enc["forget10"], enc["retain90"], enc["probe"], pad)
    _, result = polish(theta0, dataclasses.replace(inp, hook=hook))
    logged = [r for r in result.history if "delta" in r]
    assert len(logged) == 2
    assert all(r["hinge_grad_norm"] > 0 and r["retain_nll"] >= 0 and r["probe_kl"] >= 0 for r in logged)
    png = trajectory_figure(result.history, tmp_path / "traj.png", "NPO")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_lift_is_within_the_measured_theorem3_budget(mini):
    tok, enc, theta0, _ = mini
    cfg = AttackConfig(k=5, train=TrainConfig(steps=6, batch_size=5, lr=1e-3, lora=LoraSpec(r=8, alpha=16)))
    instruments = []

    def instrument(held):
        instruments.append(LiftInstrument(theta0, [enc["forget10"][i] for i in held], tok.pad_token_id))
        return instruments[-1]

    from margincal.data.draws import relearn_split
    from margincal.training.attacks import get_attacker

    rel, held = relearn_split(len(enc["forget10"]), cfg.k, cfg.train.seed)
    get_attacker(cfg.name)(theta0, [enc["forget10"][i] for i in rel], cfg, tok, hook=instrument(held))
    summary = instruments[0].summary()
    assert summary["steps"] == 6 and summary["sum_step_norm"] > 0 and summary["G_m_sup"] > 0
    assert summary["lift"] <= summary["Lambda_hat"] and summary["bound_holds"]
    assert summary["c_beta"] == pytest.approx(math.log(theta0.config.vocab_size - 1) / 120)


def test_polish_and_attack_clis_on_the_mini(smoke_mini, tmp_path, capsys):
    from margincal.cli import main

    data, paths = smoke_mini.data, smoke_mini.paths
    ref = str(paths.ref)
    files = ["--forget", str(data / "forget10.json"), "--retain", str(data / "retain90.json")]
    out = tmp_path / "polished"
    args = ["polish", "--model", str(paths.theta0), "--method", "NPO", "--theta0", str(paths.theta0), "--ref", ref]
    args += [*files, "--probe", str(data / "probe.json"), "--store", str(tmp_path / "store"), "--max-length", "96"]
    args += ["--out", str(out), "--trace"]
    assert main([*args, "train.steps=4", "check_every=2"]) == 0
    history = json.loads((out / "history.json").read_text())
    assert (out / "trajectory.png").exists() and sum("hinge_grad_norm" in r for r in history) == 2
    # a polish is a stage of the store: the same polish again is read back into its --out, not rerun
    assert "steps in" in capsys.readouterr().out
    again = tmp_path / "again"
    assert main([*args[:-3], "--out", str(again), "--trace", "train.steps=4", "check_every=2"]) == 0
    assert "read from the store" in capsys.readouterr().out and (again / "trajectory.png").exists()
    weights = [(d / "model" / "model.safetensors").read_bytes() for d in (out, again)]
    assert weights[0] == weights[1] and json.loads((again / "history.json").read_text()) == history
    assert main([*args[:-1], "--variant", "deployment", "--overwrite", "train.steps=2"]) == 0  # replaces its own result
    attack_out = tmp_path / "attack.json"
    args = ["attack", "--model", str(out), "--forget", str(data / "forget10.json"), "--ref", ref, "--k-sweep", "1,3"]
    assert main([*args, "--instrument", "--max-length", "96", "--out", str(attack_out), "train.steps=3"]) == 0
    result = json.loads(attack_out.read_text())
    assert set(result["results"]) == {"1", "3"} and result["theorem3"]["3"]["summary"]["bound_holds"]
    assert "Theorem 3: lift" in capsys.readouterr().out
    # without --instrument the attack is a stage of the store: the same attack again is read back, not rerun
    plain = [*args[:-2], "--k", "3", "--max-length", "96", "--store", str(tmp_path / "store"), "train.steps=3"]
    runs = []
    for name in ("first.json", "again.json"):
        assert main([*plain, "--out", str(tmp_path / name)]) == 0
        runs.append((json.loads((tmp_path / name).read_text()), capsys.readouterr().out))
    assert not runs[0][0]["cached"] and runs[1][0]["cached"] and "read from the store" in runs[1][1]
    assert runs[0][0]["results"] == runs[1][0]["results"] and set(runs[0][0]["results"]) == {"3"}
    assert main(["attack", "--model", str(out), "--forget", str(data / "forget10.json"), "--attacker", "nope"]) == 2
