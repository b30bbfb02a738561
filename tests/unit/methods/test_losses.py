import math

import pytest
import torch

from margincal.mc.loss import hinge_loss, uniform_weights
from margincal.methods import METHODS, get_method
from margincal.methods.distill import undial_loss, undial_target
from margincal.methods.preference import npo_loss, simnpo_loss
from margincal.model.scoring import kl_divergence


class FixedNLL:
    """Stand-in for LazyStats: each stream's token-mean NLL is a fixed number."""

    def __init__(self, **nll):
        self.nll = nll

    def __getitem__(self, stream):
        return type("S", (), {"token_mean_nll": lambda _self: torch.tensor(self.nll[stream])})()


def test_graddiff_and_gradascent_hand_values():
    stats = FixedNLL(forget=2.0, retain=3.0)
    assert float(get_method("GradDiff").loss(None, {}, stats)[0]) == 1.0  # −2 + 3
    assert float(get_method("GradDiff", gamma=0.5, alpha=2.0).loss(None, {}, stats)[0]) == 5.0  # −1 + 6
    assert float(get_method("GradAscent").loss(None, {}, stats)[0]) == -2.0  # no retain term


def test_npo_loss_hand_value():
    # S(θ) = 2, S(θ0) = 1, β = 0.1:  −(2/β) log σ(β (2 − 1)) = −20 log σ(0.1)
    value = float(npo_loss(torch.tensor([2.0]), torch.tensor([1.0]), beta=0.1))
    assert math.isclose(value, -20 * math.log(1 / (1 + math.exp(-0.1))), rel_tol=1e-6)
    # at θ = θ0 the loss is (2/β) log 2, and it decreases as the forget NLL rises (saturating)
    at_ref = float(npo_loss(torch.tensor([1.0, 5.0]), torch.tensor([1.0, 5.0]), beta=0.5))
    assert math.isclose(at_ref, 4 * math.log(2), rel_tol=1e-6)
    assert float(npo_loss(torch.tensor([50.0]), torch.tensor([1.0]), beta=0.5)) < 1e-9


def test_simnpo_loss_hand_value():
    # N = 1, δ = 0, β = 2:  −(2/2) log σ(2) = log(1 + e^−2); δ shifts the argument
    assert math.isclose(float(simnpo_loss(torch.tensor([1.0]), 2.0, 0.0)), math.log1p(math.exp(-2.0)), rel_tol=1e-6)
    assert math.isclose(float(simnpo_loss(torch.tensor([1.5]), 2.0, 0.5)), math.log1p(math.exp(-2.0)), rel_tol=1e-6)


def test_undial_target_and_loss_hand_values():
    # teacher uniform over 2 tokens, gold 0, β = ln 3: q = softmax(−ln 3, 0) = (1/4, 3/4)
    q = undial_target(torch.zeros(1, 1, 2), torch.tensor([[0]]), beta=math.log(3.0))
    assert torch.allclose(q, torch.tensor([[[0.25, 0.75]]]))
    mask = torch.tensor([[True]])
    assert math.isclose(float(undial_loss(torch.zeros(1, 1, 2), q, mask)), math.log(2.0), rel_tol=1e-6)
    student = torch.tensor([[[math.log(3.0), 0.0]]])  # p = (.75, .25)
    expected = -(0.25 * math.log(0.75) + 0.75 * math.log(0.25))
    assert math.isclose(float(undial_loss(student, q, mask)), expected, rel_tol=1e-6)
    # padding positions do not count
    two = torch.cat([student, torch.zeros(1, 1, 2)], dim=1)
    assert math.isclose(
        float(undial_loss(two, q.repeat(1, 2, 1), torch.tensor([[True, False]]))), expected, rel_tol=1e-6
    )


def test_hinge_hand_value_and_padding():
    margins = torch.tensor([[1.0, 2.0, 7.0]])
    anchor = torch.tensor([[1.0, 0.0, -3.0]])
    mask = torch.tensor([[True, True, False]])
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    expected = (softplus(0.0) / 5 + softplus(10.0) / 5) / 2
    assert math.isclose(float(hinge_loss(margins, anchor, uniform_weights(mask), kappa=5.0)), expected, rel_tol=1e-6)


def test_hinge_gradient_does_not_vanish_above_anchor():
    m = torch.tensor([[-8.0]], requires_grad=True)  # deeply suppressed, still above the anchor at -10
    hinge_loss(m, torch.tensor([[-10.0]]), uniform_weights(torch.tensor([[True]])), kappa=5.0).backward()
    assert math.isclose(float(m.grad), 1 / (1 + math.exp(-10.0)), rel_tol=1e-6)  # σ(κ gap) ≈ 1


def test_kl_divergence_hand_value():
    anchor = torch.zeros(1, 1, 2)  # p = (.5, .5)
    logits = torch.tensor([[[math.log(3.0), 0.0]]])  # q = (.75, .25)
    value = float(kl_divergence(anchor, logits, torch.tensor([[True]])))
    assert math.isclose(value, 0.5 * math.log(4 / 3), rel_tol=1e-6)
    assert float(kl_divergence(anchor, anchor, torch.tensor([[True]]))) == 0.0


def test_registry():
    assert {"gradascent", "graddiff", "npo", "simnpo", "undial"} <= set(METHODS)
    assert get_method("GradAscent").streams == ("forget",)
    assert get_method("npo", beta=0.2).beta == 0.2
    with pytest.raises(ValueError, match="unknown method"):
        get_method("nope")
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        get_method("GradDiff", beta=1.0)


def test_activation_mse_hand_value_and_mask():
    from margincal.methods.gradient import activation_mse

    acts = torch.tensor([[[1.0, 3.0], [0.0, 0.0], [9.0, 9.0]]])  # third position masked out
    target = torch.tensor([[[0.0, 1.0], [0.0, 2.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    # per-token mean over d: (1 + 4)/2 = 2.5 and (0 + 4)/2 = 2; mean over the two answer tokens = 2.25
    assert float(activation_mse(acts, target, mask)) == 2.25


def test_logit_flatness_and_pdu_dual_update():
    from margincal.methods.gradient import logit_flatness
    from margincal.model.scoring import LazyStats

    logits = torch.tensor([[[3.0, 0.0, 0.0], [1.0, 1.0, 1.0], [9.0, 0.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    assert float(logit_flatness(logits, mask)) == 2.0  # ((3 − 1)² + 0) / 2

    class Fixed(LazyStats):  # hand-set statistics instead of a model forward
        def __init__(self, retain_nll):
            self.retain_nll = retain_nll

        def answer(self, stream):
            return logits, None, mask

        def __getitem__(self, stream):
            return type("S", (), {"token_mean_nll": lambda _self: torch.tensor(self.retain_nll)})()

    pdu = get_method("PDU", alpha=0.5, retain_eps=1.0, dual_step_size=2.0, dual_warmup_steps=1)
    loss, logs = pdu.loss(None, {}, Fixed(3.0))
    assert float(loss) == 2.0 + 0.5 * 2.0 and pdu.dual == 0.5  # the loss call itself leaves λ alone
    pdu.on_optimizer_step()  # warm-up step: λ stays 0.5
    assert pdu.dual == 0.5
    pdu.loss(None, {}, Fixed(3.0))
    pdu.on_optimizer_step()  # λ ← 0.5 + 2·(3 − 1) = 4.5
    assert pdu.dual == 4.5
    pdu.loss(None, {}, Fixed(-5.0))
    pdu.on_optimizer_step()  # slack −6 would make λ negative: clipped at 0
    assert pdu.dual == 0.0 and pdu.steps_seen == 3
    pdu.loss(None, {}, Fixed(3.0))
    pdu.loss(None, {}, Fixed(1.0))
    assert pdu.dual == 0.0
    pdu.on_optimizer_step()  # one update from the step's mean slack (2 + 0)/2: λ ← 0 + 2·1 = 2
    assert pdu.dual == 2.0 and pdu.steps_seen == 4


def recorded_duals(pdu) -> list[tuple[float, float]]:
    """Record (λ used, slack) of every ``retain_term`` call, i.e. of every micro-batch, into the returned list."""
    calls, retain_term = [], pdu.retain_term

    def recording(model, batch, stats):
        term, logs = retain_term(model, batch, stats)
        calls.append((logs["dual"], logs["retain_slack"]))
        return term, logs

    pdu.retain_term = recording
    return calls


def expected_duals(calls: list[tuple[float, float]], accum: int, dual: float, warmup: int, eta: float) -> list[float]:
    """Hand count: λ_k for each micro-batch of optimizer step k = 1, 2, …, then the final λ; λ moves once per step
    after the first ``warmup`` steps, by η · the mean slack of the step's ``accum`` micro-batches."""
    out = []
    for k, i in enumerate(range(0, len(calls), accum), start=1):
        out += [dual] * accum
        if k > warmup:
            dual = max(0.0, dual + eta * sum(s for _, s in calls[i : i + accum]) / accum)
    return [*out, dual]


def test_pdu_dual_updates_once_per_optimizer_step_under_grad_accum(tiny_model, tiny_tokenizer, tiny_examples):
    """grad_accum = 4, warm-up 2 optimizer steps: λ_1 = λ_2 = λ_3 = α, λ_4 = α + η·mean slack of step 3's four
    micro-batches (the per-call update moved λ from the 3rd micro-batch on, four times per step)."""
    from margincal.config.settings import TrainConfig
    from margincal.training.unlearning import unlearn

    pdu = get_method("PDU", alpha=0.5, retain_eps=1.0, dual_step_size=0.5, dual_warmup_steps=2)
    calls = recorded_duals(pdu)
    cfg = TrainConfig(steps=4, batch_size=1, grad_accum=4, lr=1e-3)
    _, result = unlearn(tiny_model, pdu, tiny_examples, tiny_examples, cfg, tiny_tokenizer)
    assert len(calls) == 16 and pdu.steps_seen == 4 and pdu.state()["steps_seen"] == 4
    *used, final = expected_duals(calls, 4, 0.5, 2, 0.5)
    assert used[:12] == [0.5] * 12 and used[12] > 0.5  # warm-up in optimizer steps, then λ moves
    assert [d for d, _ in calls] == pytest.approx(used)
    assert pdu.dual == pytest.approx(final) and pdu.slacks == []
    assert [row["dual"] for row in result.history] == pytest.approx(used[::4])  # logged λ_k per step


def test_pdu_polish_updates_the_carried_dual_per_optimizer_step(tiny_model, tiny_tokenizer, tiny_examples):
    """The MC polish continues λ and ``steps_seen`` in optimizer steps too (grad_accum = 3, 3 steps)."""
    from margincal.config.settings import LoraSpec, MCConfig, TrainConfig
    from margincal.mc.loss import anchor_tables
    from margincal.mc.polish import PolishInput, polish
    from margincal.model.loading import clone_model

    pdu = get_method("PDU", alpha=0.5, retain_eps=1.0, dual_step_size=0.5, dual_warmup_steps=5)
    pdu.load_state({"dual": 2.0, "steps_seen": 4})  # the unlearning run's end: one warm-up step left
    calls = recorded_duals(pdu)
    pad = tiny_tokenizer.pad_token_id
    tables = anchor_tables(tiny_model, "tiny", tiny_examples, pad)
    train = TrainConfig(steps=3, batch_size=1, grad_accum=3, lr=1e-3, lora=LoraSpec(r=2, alpha=2))
    mc = MCConfig(kl_weight=0.0, train=train)
    polish(
        clone_model(tiny_model),
        PolishInput(pdu, mc, tiny_model, tables, tiny_examples, tiny_examples, tiny_examples, pad),
    )
    assert len(calls) == 9 and pdu.steps_seen == 7
    *used, final = expected_duals(calls, 3, 2.0, 1, 0.5)  # step 5 is the last warm-up step
    assert used[:6] == [2.0] * 6
    assert [d for d, _ in calls] == pytest.approx(used) and pdu.dual == pytest.approx(final)


def test_get_method_coerces_numeric_strings():
    assert get_method("NPO", beta="1e-1").beta == 0.1
    assert get_method("PDU", dual_warmup_steps="5").dual_warmup_steps == 5


def test_jensen_shannon_hand_values():
    from margincal.methods.distill import jensen_shannon

    mask = torch.tensor([[True]])
    # p = (½, ½), q = e_0: m = (¾, ¼); KL(p‖m) = ½ log(4/3), KL(q‖m) = log(4/3) → JS = ¾ log(4/3)
    value = float(jensen_shannon(torch.zeros(1, 1, 2), torch.tensor([[[1.0, 0.0]]]), mask))
    assert math.isclose(value, 0.75 * math.log(4 / 3), rel_tol=1e-6)
    # JS of disjoint supports is log 2 (its maximum); of equal distributions 0
    far = torch.tensor([[[0.0, -1e4]]])  # p ≈ e_0
    assert math.isclose(float(jensen_shannon(far, torch.tensor([[[0.0, 1.0]]]), mask)), math.log(2), rel_tol=1e-6)
    assert float(jensen_shannon(torch.zeros(1, 1, 2), torch.full((1, 1, 2), 0.5), mask)) == pytest.approx(0.0)


def test_jensun_targets_cycle_the_refusal_over_answer_positions(tiny_model, tiny_tokenizer, tiny_examples):
    from margincal.data.records import collate
    from margincal.methods.distill import refusal_targets
    from margincal.model.scoring import LazyStats

    assert refusal_targets(torch.tensor([7, 9]), 5).tolist() == [7, 9, 7, 9, 7]
    jensun = get_method("JensUn", target_text="Port Ivo")
    jensun.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    assert jensun.pattern.tolist() == tiny_tokenizer.encode("Port Ivo", add_special_tokens=False)
    batch = {s: collate(tiny_examples, tiny_tokenizer.pad_token_id) for s in ("forget", "retain")}
    loss, logs = jensun.loss(tiny_model, batch, LazyStats(tiny_model, batch))
    assert logs["retain_js"] == pytest.approx(0.0, abs=1e-6)  # θ = θ0: no retain divergence yet
    assert 0.0 < float(loss.detach()) <= math.log(2)  # bounded by log 2


def test_mc_loss_assembles_eq6_from_its_terms():
    """L = native + forget term + λ_KL·KL + λ_r·retain hinge, by hand; a forget term is required, and only one."""
    from margincal.mc.loss import mc_loss

    native, hinge, kl, rh = (torch.tensor(v) for v in (0.5, 0.25, 2.0, 4.0))
    assert mc_loss(native, {"hinge": hinge}, 0.1).item() == 0.75
    assert mc_loss(native, {"hinge": hinge, "kl": kl}, 0.1).item() == pytest.approx(0.95)
    assert mc_loss(native, {"ascent": -hinge, "kl": kl, "retain_hinge": rh}, 0.5, 0.25).item() == 2.25
    for terms in ({"kl": kl}, {"hinge": hinge, "ascent": hinge}, {"hinge": hinge, "klx": kl}):
        with pytest.raises(ValueError, match="MC's terms"):
            mc_loss(native, terms, 0.1)
