"""The NPO defenses: exact values on a quadratic toy forget loss, real perturbation, and reduction to the base."""

import math

import pytest
import torch

from margincal.config.settings import LoraSpec, PlateauStop, TrainConfig
from margincal.data.records import collate
from margincal.methods import get_method
from margincal.methods.base import UnlearningMethod
from margincal.methods.defenses import Defense, irm_penalty, project_per_token
from margincal.model.scoring import LazyStats
from margincal.training.unlearning import unlearn

A = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
W0 = torch.tensor([1.0, 2.0])


class Quadratic(torch.nn.Module):
    """forward() = ½ wᵀAw, so ∇ = Aw and the Hessian is A."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(W0.clone())

    def forward(self, **_):
        return 0.5 * self.w @ A @ self.w


class QuadraticBase(UnlearningMethod):
    """A base whose forget term is the toy model's output and whose retain term is zero."""

    name, family, source, streams, gamma = "toy", "test", "test", ("forget",), 1.0

    def forget_loss(self, model, batch, stats):
        return model(), {}


def toy_defense(name: str, **hparams) -> Defense:
    defense = get_method(name, **hparams)
    defense.inner, defense.streams, defense.gamma = QuadraticBase(), ("forget",), 1.0
    return defense


def loss_and_grad(method, model, batch=None):
    model.zero_grad()
    loss, logs = method.loss(model, batch or {}, None)
    loss.backward()
    return float(loss.detach()), model.w.grad.clone(), logs


def test_sam_takes_the_normalised_ascent_step():
    model = Quadratic()
    _, grad, _ = loss_and_grad(toy_defense("SAMNPO", rho=0.5), model)
    g = A @ W0
    shifted = W0 + 0.5 * g / g.norm()
    assert torch.allclose(grad, A @ shifted)  # ∇L_f(θ + ρ g/‖g‖)
    assert torch.equal(model.w.detach(), W0)  # the weights themselves are not moved


def test_rs_averages_the_loss_at_gaussian_weight_draws():
    torch.manual_seed(0)
    loss, _, _ = loss_and_grad(toy_defense("RSNPO", sigma=0.3, samples=3), Quadratic())
    torch.manual_seed(0)
    draws = [W0 + 0.3 * torch.randn(2) for _ in range(3)]
    assert loss == pytest.approx(sum(float(0.5 * w @ A @ w) for w in draws) / 3, rel=1e-6)
    assert loss != pytest.approx(float(0.5 * W0 @ A @ W0))


def test_cr_penalty_is_the_finite_difference_hessian_gradient_norm():
    loss, _, logs = loss_and_grad(toy_defense("CRNPO", curvature_weight=2.0, h=0.1), Quadratic())
    g = A @ W0
    penalty = float((A @ (0.1 * g / g.norm())).norm())  # ∇L(θ + h ĝ) − ∇L(θ) = A·h ĝ
    assert logs["curvature"] == pytest.approx(penalty, rel=1e-6)
    assert loss == pytest.approx(float(0.5 * W0 @ A @ W0) + 2.0 * penalty, rel=1e-6)


def test_swa_releases_the_mean_of_the_late_snapshots():
    swa = get_method("SWANPO", start=0.5, interval=2)
    model = Quadratic()
    for step in range(1, 11):  # steps 6, 8, 10 are averaged (≥ 0.5·10, even)
        with torch.no_grad():
            model.w.copy_(torch.tensor([float(step), -float(step)]))
        swa.after_step(step, 10, model)
    assert torch.allclose(swa.finish(model).w.detach(), torch.tensor([8.0, -8.0]))
    last = get_method("SWANPO", start=1.0)
    for step in range(1, 11):
        with torch.no_grad():
            model.w.copy_(torch.tensor([float(step), 0.0]))
        last.after_step(step, 10, model)
    assert torch.equal(last.finish(model).w.detach(), torch.tensor([10.0, 0.0]))  # start = 1: the base


def test_swa_under_a_stop_rule_averages_the_window_of_the_steps_run():
    swa = get_method("SWANPO", start=0.5, interval=2)
    model = Quadratic()
    for step in range(1, 8):  # stopped at 7 (cap unknown): steps 4, 6 (≥ 0.5·7, even) and the last iterate, 7
        with torch.no_grad():
            model.w.copy_(torch.tensor([float(step), 1.0]))
        logs = swa.after_step(step, None, model)
    assert logs == {"swa_snapshots": 2} and sorted(swa.window) == [4, 6]  # snapshot 2 < 0.5·7 was dropped
    assert torch.allclose(swa.finish(model).w.detach(), torch.tensor([17 / 3, 1.0]))
    assert swa.window == {} and swa.last_step == 0


def test_irm_penalty_hand_value():
    # one token, V = 2, z = (1, 0), gold 0: ∂/∂w CE(w z) at 1 = σ(1) − 1 = −σ(−1)
    value = float(irm_penalty(torch.tensor([[[1.0, 0.0]]]), torch.tensor([[0]]), torch.tensor([[True]])).detach())
    assert value == pytest.approx((1 / (1 + math.e)) ** 2, rel=1e-6)
    assert float(irm_penalty(torch.zeros(1, 1, 2), torch.tensor([[0]]), torch.tensor([[True]])).detach()) == 0.0


ZERO_STRENGTH = {
    "SAMNPO": {"rho": 0.0},
    "RSNPO": {"sigma": 0.0},
    "CRNPO": {"curvature_weight": 0.0},
    "ILUNPO": {"invariance_weight": 0.0},
    "LATNPO": {"epsilon": 0.0, "layer": 1},
    "RNANPO": {"kl_weight": 0.0, "layer": 1},
}
STRENGTH = {
    "SAMNPO": {"rho": 0.5},
    "RSNPO": {"sigma": 0.05},
    "CRNPO": {"curvature_weight": 1.0},
    "ILUNPO": {"invariance_weight": 1.0},
    "LATNPO": {"epsilon": 4.0, "layer": 1, "adv_steps": 3, "adv_lr": 0.5},
    "RNANPO": {"noise_std": 0.5, "layer": 1},
}


def _step_batch(examples, pad):
    return {s: collate(examples[:2], pad) for s in ("forget", "retain", "env")}


def _loss_and_grads(method, model, batch):
    model.zero_grad()
    loss, logs = method.loss(model, batch, LazyStats(model, batch))
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()], logs


@pytest.mark.parametrize("name", sorted(ZERO_STRENGTH))
def test_defense_is_its_base_at_zero_strength_and_differs_otherwise(name, tiny_model, tiny_tokenizer, tiny_examples):
    batch = _step_batch(tiny_examples, tiny_tokenizer.pad_token_id)
    base = get_method("NPO")
    base.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    base_loss, base_grads, _ = _loss_and_grads(base, tiny_model, batch)
    off = get_method(name, **ZERO_STRENGTH[name])
    off.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    loss, grads, _ = _loss_and_grads(off, tiny_model, batch)
    assert loss == base_loss and all(torch.equal(a, b) for a, b in zip(grads, base_grads, strict=True))
    on = get_method(name, **STRENGTH[name])
    on.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    torch.manual_seed(0)
    loss_on, grads_on, logs = _loss_and_grads(on, tiny_model, batch)
    assert not all(torch.allclose(a, b) for a, b in zip(grads_on, base_grads, strict=True))
    native = on.native_loss(tiny_model, batch, LazyStats(tiny_model, batch))[0]
    assert float(native.detach()) == base_loss  # what the MC polish keeps running


def test_lat_adversary_recalls_within_the_ball(tiny_model, tiny_tokenizer, tiny_examples):
    batch = _step_batch(tiny_examples, tiny_tokenizer.pad_token_id)
    lat = get_method("LATNPO", layer=1, epsilon=2.0, adv_steps=5, adv_lr=0.5)
    lat.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    _, logs = lat.loss(tiny_model, batch, LazyStats(tiny_model, batch))
    clean_nll = float(LazyStats(tiny_model, batch)["forget"].token_mean_nll().detach())
    assert logs["adv_forget_nll"] < clean_nll  # the latent perturbation makes the forget answers more likely
    assert logs["adv_delta_norm"] <= 2.0 + 1e-5  # per-token L2 ball


def test_rna_noise_reaches_the_reference_logits(tiny_model, tiny_tokenizer, tiny_examples):
    rna = get_method("RNANPO", layer=1, noise_std=0.5)
    rna.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    retain = collate(tiny_examples, tiny_tokenizer.pad_token_id)
    assert not torch.equal(rna.noisy_reference_logits(retain), rna.noisy_reference_logits(retain))
    rna.noise_std = 0.0
    assert torch.equal(rna.noisy_reference_logits(retain), rna.noisy_reference_logits(retain))


def test_defense_composes_with_other_bases_and_rejects_defenses():
    sam = get_method("SAMNPO", base="GradDiff", base_hparams={"alpha": 2.0}, rho=0.1)
    assert sam.inner.name == "GradDiff" and sam.hparams()["base_hparams"] == {"gamma": 1.0, "alpha": 2.0}
    assert get_method("ILUNPO").streams == ("forget", "retain", "env")
    assert get_method("ILUNPO").native_streams == ("forget", "retain")
    with pytest.raises(ValueError, match="not the defense"):
        get_method("SAMNPO", base="RSNPO")


def test_defense_family_follows_its_base():
    from dataclasses import dataclass

    from margincal.methods.base import method_class
    from margincal.methods.defenses import SAMNPO

    assert get_method("SAMNPO").family == method_class("SAMNPO").family == "preference"  # base NPO
    assert get_method("SAMNPO", base="GradDiff").family == "gradient"
    assert get_method("RNANPO", base="UNDIAL").family == "distillation"

    @dataclass
    class SAMGradDiff(SAMNPO):  # a defense whose default base is a gradient method (not registered)
        name = "SAMGradDiff"
        base: str = "GradDiff"

    assert SAMGradDiff.family == SAMGradDiff().family == "gradient"
    assert SAMGradDiff(base="NPO").family == "preference"


def test_lat_projection_onto_the_per_token_ball():
    delta = torch.tensor([[[3.0, 4.0], [0.3, 0.4]]])  # norms 5 and 0.5; ε = 2
    assert torch.allclose(project_per_token(delta, 2.0), torch.tensor([[[1.2, 1.6], [0.3, 0.4]]]))


@pytest.mark.parametrize("lora", [None, LoraSpec(r=2, alpha=2)])
def test_swa_in_the_unlearning_loop_averages_only_when_asked(lora, tiny_model, tiny_tokenizer, tiny_examples):
    cfg = TrainConfig(steps=4, batch_size=2, lr=1e-2, lora=lora)

    def run(name, **hp):
        model, _ = unlearn(tiny_model, get_method(name, **hp), tiny_examples, tiny_examples, cfg, tiny_tokenizer)
        return model.state_dict()

    npo, last_only, averaged = run("NPO"), run("SWANPO", start=1.0), run("SWANPO", start=0.5, interval=1)
    assert all(torch.equal(npo[k], last_only[k]) for k in npo)  # no snapshot but the last: the base
    assert any(not torch.equal(npo[k], averaged[k]) for k in npo)  # the mean of steps 2–4 is released


def test_swa_averages_under_the_plateau_rule(tiny_model, tiny_tokenizer, tiny_examples):
    """A plateau-stopped run ends long before 0.8 of its step cap: SWA still averages its own last 20 %."""
    cfg = TrainConfig(steps=1000, batch_size=2, lr=1e-2, scheduler="constant")
    stop = PlateauStop(tol=0.5, min_epochs=3)

    def run(name):
        model, result = unlearn(
            tiny_model, get_method(name), tiny_examples, tiny_examples, cfg, tiny_tokenizer, stop=stop
        )
        return model.state_dict(), result

    (npo, npo_run), (swa, swa_run) = run("NPO"), run("SWANPO")
    assert npo_run.stopped_at == swa_run.stopped_at < 0.8 * cfg.steps
    assert any(not torch.equal(npo[k], swa[k]) for k in npo)
