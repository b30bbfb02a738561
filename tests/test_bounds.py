"""Theory instruments: certificate table, coercivity trace and figure, and Theorem 3's Λ̂(N) ≥ measured lift."""

import dataclasses
import json
import math

import pytest

from margincal.bounds import LiftInstrument, certificate_rows, certificate_table, coercivity_hook, trajectory_figure
from margincal.config import AttackConfig, LoraSpec, MCConfig, TrainConfig
from margincal.data.records import encode_qa
from margincal.methods import get_method
from margincal.models import load_model, load_tokenizer
from margincal.polish import anchor_tables, polish
from margincal.scoring import score_dataset


@pytest.fixture(scope="module")
def mini(smoke_mini):
    tok = load_tokenizer(smoke_mini.paths.theta0)
    bench_dir = smoke_mini.data
    from margincal.data.tofu import load_qa_json

    enc = {s: encode_qa(tok, load_qa_json(bench_dir / f"{s}.json"), 96) for s in ("forget10", "retain90", "probe")}
    theta0, ref = load_model(smoke_mini.paths.theta0), load_model(smoke_mini.paths.ref)
    return tok, enc, theta0, ref


def test_certificate_table_marks_certified_checkpoints(mini):
    tok, enc, theta0, ref = mini
    stats = {name: score_dataset(m, enc["forget10"], tok.pad_token_id) for name, m in (("θ0", theta0), ("θ_ref", ref))}
    m_ref = certificate_rows({"θ_ref": stats["θ_ref"]}, 0.0)[0]["m"]
    rows = certificate_rows(stats, m_ref)
    assert all(r["m_ge_log_odds"] for r in rows)  # m ≥ ℓ always (competitor-mass lemma)
    assert rows[0]["certified"] is (rows[0]["log_odds"] > m_ref) and rows[1]["delta"] == pytest.approx(0.0)
    table = certificate_table(rows, m_ref)
    assert "| θ0 |" in table and "certified" in table


def test_coercivity_trace_logs_every_quantity_and_draws_the_figure(mini, tmp_path):
    tok, enc, theta0, ref = mini
    pad = tok.pad_token_id
    npo = get_method("NPO")
    npo.prepare(theta0, enc["forget10"], tok)
    tables = anchor_tables(ref, "ref", enc["forget10"], pad)
    m_ref = certificate_rows({"ref": score_dataset(ref, enc["forget10"], pad)}, 0.0)[0]["m"]
    cfg = dataclasses.replace(
        MCConfig(train=TrainConfig(steps=4, batch_size=1, lr=1e-3, lora=LoraSpec(r=4, alpha=4))), check_every=2
    )
    hook = coercivity_hook(tables, enc["forget10"], enc["retain90"], enc["probe"], ref, m_ref, 5.0, "uniform", pad)
    _, result = polish(theta0, npo, ref, tables, enc["forget10"], enc["retain90"], enc["probe"], cfg, pad, hook=hook)
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

    from margincal.attacks import get_attacker, relearn_split

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
    args += [*files, "--probe", str(data / "probe.json"), "--out", str(out), "--max-length", "96", "--trace"]
    assert main([*args, "train.steps=4", "check_every=2"]) == 0
    history = json.loads((out / "history.json").read_text())
    assert (out / "trajectory.png").exists() and sum("hinge_grad_norm" in r for r in history) == 2
    assert main([*args[:-1], "--variant", "deployment", "--overwrite", "train.steps=2"]) == 0  # replaces its own result
    attack_out = tmp_path / "attack.json"
    args = ["attack", "--model", str(out), "--forget", str(data / "forget10.json"), "--ref", ref, "--k-sweep", "1,3"]
    assert main([*args, "--instrument", "--max-length", "96", "--out", str(attack_out), "train.steps=3"]) == 0
    result = json.loads(attack_out.read_text())
    assert set(result["results"]) == {"1", "3"} and result["theorem3"]["3"]["summary"]["bound_holds"]
    assert "Theorem 3: lift" in capsys.readouterr().out
    assert main(["attack", "--model", str(out), "--forget", str(data / "forget10.json"), "--attacker", "nope"]) == 2
