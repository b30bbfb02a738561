"""Every MC variant is reachable from config and changes the polish objective as specified."""

import dataclasses
import math

import pytest
import torch
from conftest import RECORDS

from margincal.config.settings import (
    MC_VARIANTS,
    ControlConfig,
    LoraSpec,
    MCConfig,
    MonitorConfig,
    TrainConfig,
    resolve_benchmark,
)
from margincal.config.typed import apply_overrides, build
from margincal.data.records import collate
from margincal.mc.loss import anchor_tables, hinge_loss, token_weights, uniform_weights
from margincal.mc.polish import mc_objective, polish, polish_input
from margincal.methods import get_method
from margincal.model.scoring import LazyStats, TokenStats, score_dataset
from margincal.training.monitors import delta_check


@pytest.fixture
def setup(tiny_model, tiny_tokenizer, tiny_examples):
    pad = tiny_tokenizer.pad_token_id
    npo = get_method("NPO")
    npo.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    anchor = type(tiny_model)(tiny_model.config).eval()  # a different frozen model as the anchor
    tables = anchor_tables(anchor, "anchor", tiny_examples, pad)
    batch = {s: collate(tiny_examples[:2], pad) for s in ("forget", "retain", "probe")}
    return npo, anchor, tables, batch


def objective_logs(cfg, setup, model):
    npo, anchor, tables, batch = setup
    loss, logs = mc_objective(npo, anchor, tables, cfg, retain_tables=tables)(model, batch)
    return float(loss.detach()), logs


def variant(name: str) -> MCConfig:
    return build(MCConfig, apply_overrides({}, [f"{k}={v}" for k, v in MC_VARIANTS[name].items()]))


def test_every_preset_is_reachable_from_config_overrides():
    for name, overrides in MC_VARIANTS.items():
        cfg = variant(name)
        assert all(getattr(cfg, k) == v for k, v in overrides.items() if not isinstance(v, dict)), name
    assert variant("deployment").margin_anchor == "theta0" and variant("deployment").retain_hinge_weight == 1.0
    assert variant("controlled").control == ControlConfig() and variant("controlled").monitor == MonitorConfig()


def test_reference_forget_only_two_sided_and_ascent_objectives(setup, tiny_model):
    npo, _, tables, batch = setup
    loss, logs = objective_logs(MCConfig(), setup, tiny_model)
    assert loss == pytest.approx(logs["native"] + logs["hinge"] + 0.05 * logs["kl"], rel=1e-5)
    loss, logs = objective_logs(variant("forget_only"), setup, tiny_model)
    assert "kl" not in logs and loss == pytest.approx(logs["native"] + logs["hinge"], rel=1e-5)
    loss, logs = objective_logs(variant("two_sided"), setup, tiny_model)
    retain = LazyStats(tiny_model, batch)["retain"]
    width, idx = retain.mask.size(1), batch["retain"]["index"]
    expected = hinge_loss(tables["margin"][idx, :width], retain.margin, uniform_weights(retain.mask), 5.0)
    assert logs["retain_hinge"] == pytest.approx(float(expected.detach()), rel=1e-5)
    assert loss == pytest.approx(logs["native"] + logs["hinge"] + logs["retain_hinge"], rel=1e-5)
    loss, logs = objective_logs(variant("gradascent"), setup, tiny_model)
    nll = float(LazyStats(tiny_model, batch)["forget"].token_mean_nll().detach())
    assert logs["ascent"] == pytest.approx(-nll, rel=1e-5) and loss == pytest.approx(logs["native"] - nll, rel=1e-5)


def test_native_forget_off_keeps_only_the_retain_part(setup, tiny_model):
    _, _, _, batch = setup
    _, logs = objective_logs(variant("no_native_forget"), setup, tiny_model)
    retain_nll = float(LazyStats(tiny_model, batch)["retain"].token_mean_nll().detach())
    assert logs["native"] == pytest.approx(1.0 * retain_nll, rel=1e-5)  # α·NLL_r, NPO's forget term dropped


def test_token_weights_exact_values():
    mask = torch.tensor([[True] * 10 + [False] * 2])
    entropy = torch.arange(12, dtype=torch.float)[None]
    stats = TokenStats(torch.zeros(1, 12), torch.zeros(1, 12), entropy, mask, torch.zeros(1), torch.zeros(1, 12))
    gold = torch.full((1, 12), math.log(0.25))
    anchor = {"entropy": entropy.flip(1), "gold": gold}  # anchor entropies 11, 10, ..., 0
    assert torch.allclose(token_weights("uniform", stats, anchor), mask / 10)
    top8 = token_weights("top8", stats, anchor)  # the anchor's 8 highest-entropy answer positions: 0..7
    assert torch.allclose(top8, torch.tensor([[1 / 8] * 8 + [0.0] * 4]))
    soft = token_weights("soft_entropy", stats, anchor)
    assert torch.allclose(soft[0, :10], torch.softmax(torch.arange(10.0), 0)) and float(soft[0, 10:].sum()) == 0
    assert torch.allclose(token_weights("ref_gate", stats, anchor), 0.75 * mask / 10)  # (1 − p_anc(y_t)) / T
    with pytest.raises(ValueError, match="unknown token_weights"):
        token_weights("nope", stats, anchor)


def test_deployment_uses_theta0_as_anchor_and_delta_stop_stops(tiny_model, tiny_tokenizer, tiny_examples):
    pad = tiny_tokenizer.pad_token_id
    npo = get_method("NPO")
    npo.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    train = TrainConfig(steps=6, batch_size=1, lr=1e-3, lora=LoraSpec(r=2, alpha=2))
    only_theta0 = {"theta0": (tiny_model, "theta0")}
    args = (tiny_examples, tiny_examples, tiny_examples, pad)
    deployment = dataclasses.replace(variant("deployment"), train=train)
    _, result = polish(tiny_model, polish_input(npo, deployment, only_theta0, *args))
    assert "retain_hinge" in result.history[0] and "kl" not in result.history[0]
    with pytest.raises(ValueError, match="margin_anchor 'ref' needs that model"):
        polish_input(npo, MCConfig(train=train), only_theta0, *args)
    m_ref = float(score_dataset(tiny_model, tiny_examples, pad).margin.mean())  # any reference level
    stop = dataclasses.replace(MCConfig(train=train), stop_delta=1e6, check_every=2)  # reached at the first check
    check = delta_check(tiny_tokenizer, dataclasses.replace(resolve_benchmark("tofu"), max_length=64), RECORDS, m_ref)
    inp = polish_input(npo, stop, {"ref": (tiny_model, "ref")}, *args)
    _, result = polish(tiny_model, dataclasses.replace(inp, check=check))
    assert result.stopped_at == 2 and len(result.history) == 2
    assert [r["step"] for r in result.trace] == [0, 2] and result.trace[-1]["stop_reason"] == "delta"
    with pytest.raises(ValueError, match="needs the reference margin"):
        polish(tiny_model, inp)
