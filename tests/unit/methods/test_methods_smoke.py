"""Every registered method runs a few unlearning steps and an MC polish on a tiny model."""

import pytest
import torch

from margincal.config.settings import FAMILIES, LoraSpec, MCConfig, TrainConfig
from margincal.mc.polish import polish, polish_input
from margincal.methods import METHODS, get_method
from margincal.training.unlearning import unlearn

SMOKE_HPARAMS = {  # the tiny model has two decoder layers; LAT runs fewer inner steps
    "rmu": {"layer": 1, "trained_layers": 2},
    "latnpo": {"layer": 1, "adv_steps": 2},
    "rnanpo": {"layer": 1},
}


def test_registry_holds_the_papers_fifteen_methods_and_the_oracle_imitation_control():
    assert sorted(METHODS) == sorted(
        m.lower()
        for m in ["GradAscent", "GradDiff", "RMU", "PDU", "NPO", "SimNPO", "SAMNPO", "RSNPO", "SWANPO", "CRNPO"]
        + ["ILUNPO", "LATNPO", "RNANPO", "UNDIAL", "JensUn", "OracleImitation"]
    )
    families = {cls.family for cls in METHODS.values()}
    assert families == set(FAMILIES)  # every family declared in config is used, and only those


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_unlearns_and_polishes(name, tiny_model, tiny_tokenizer, tiny_examples):
    pad = tiny_tokenizer.pad_token_id
    method = get_method(name, **SMOKE_HPARAMS.get(name, {}))
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    cfg = TrainConfig(steps=2, batch_size=2)
    extra = {"env": tiny_examples}
    model, result = unlearn(tiny_model, method, tiny_examples, tiny_examples, cfg, tiny_tokenizer, extra=extra)
    assert len(result.history) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history)
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())  # θ0 untouched
    cfg = MCConfig(train=TrainConfig(steps=2, batch_size=1, lr=1e-3, lora=LoraSpec(r=2, alpha=2)))
    inp = polish_input(method, cfg, {"ref": (tiny_model, "tiny")}, tiny_examples, tiny_examples, tiny_examples, pad)
    _, polished = polish(model, inp)
    assert {"native", "hinge", "kl"} <= set(polished.history[0])


def test_the_oracle_imitation_learns_from_the_teacher_it_is_given(tiny_model, tiny_tokenizer, tiny_examples):
    """unlearn's ``teacher`` is what ``prepare`` reads (the stage passes θ_ref for OracleImitation); θ0 is copied."""
    from margincal.model.loading import clone_model

    oracle = clone_model(tiny_model)
    method = get_method("OracleImitation")
    cfg = TrainConfig(steps=1, batch_size=2)
    unlearn(tiny_model, method, tiny_examples, tiny_examples, cfg, tiny_tokenizer, teacher=oracle)
    assert method.oracle is oracle
    unlearn(tiny_model, method, tiny_examples, tiny_examples, cfg, tiny_tokenizer)
    assert method.oracle is tiny_model


def test_rmu_trains_only_down_proj_and_steers_forget_activations(tiny_model, tiny_tokenizer, tiny_examples):
    from margincal.methods.gradient import layer_activations

    pad = tiny_tokenizer.pad_token_id
    method = get_method("RMU", layer=1, trained_layers=1, steering_coeff=5.0, alpha=1.0)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    model, _ = unlearn(
        tiny_model, method, tiny_examples, tiny_examples, TrainConfig(steps=5, batch_size=2, lr=1e-2), tiny_tokenizer
    )
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"model.layers.1.mlp.down_proj.weight"}
    assert float(method.control.norm()) == pytest.approx(5.0) and bool((method.control >= 0).all())
    with pytest.raises(ValueError, match="layer 7 not found"):
        get_method("RMU", layer=7).prepare(tiny_model, tiny_examples, tiny_tokenizer)
    from margincal.data.records import collate

    batch = collate(tiny_examples, pad)
    assert layer_activations(model, batch, 1).shape == (len(tiny_examples), batch["input_ids"].size(1), 32)


def test_a_method_missing_its_split_stops_with_a_clear_error(tiny_model, tiny_tokenizer, tiny_examples):
    with pytest.raises(ValueError, match=r"ILUNPO needs the split\(s\) \['env'\]"):
        unlearn(tiny_model, get_method("ILUNPO"), tiny_examples, tiny_examples, TrainConfig(steps=1), tiny_tokenizer)
