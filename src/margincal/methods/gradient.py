"""Gradient family: GradAscent, GradDiff, RMU, PDU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from margincal.core.errors import InputError
from margincal.methods.base import UnlearningMethod, register


def forget_ascent(stats) -> tuple[torch.Tensor, dict]:
    """The ascent term −NLL_f (token-mean answer NLL of the forget batch) shared by GradAscent and GradDiff."""
    forget_nll = stats["forget"].token_mean_nll()
    return -forget_nll, {"forget_nll": forget_nll.item()}


@register
@dataclass
class GradDiff(UnlearningMethod):
    """Gradient difference: L = γ·(−NLL_f) + α·NLL_r (ascend the forget NLL, descend the retain NLL).

    Source: Maini et al. 2024 (TOFU); open-unlearning ``src/trainer/unlearn/grad_diff.py`` with
    ``configs/trainer/GradDiff.yaml`` (γ = α = 1, retain loss NLL). NLL is HF-style: summed over the
    batch's answer tokens, divided by their count.
    """

    name = "GradDiff"
    family = "gradient"
    source = "Maini et al. 2024 (TOFU); open-unlearning grad_diff.py"
    gamma: float = 1.0
    alpha: float = 1.0

    def forget_loss(self, model, batch, stats):
        return forget_ascent(stats)


@register
@dataclass
class GradAscent(UnlearningMethod):
    """Gradient ascent on the forget NLL: L = −γ·NLL_f. Unbounded below, no retain term; it diverges and is the
    paper's counterexample, not a panel method (paper App. "Why GradAscent is excluded").

    Source: open-unlearning ``src/trainer/unlearn/grad_ascent.py`` (``-outputs.loss`` on the forget batch).
    """

    name = "GradAscent"
    family = "gradient"
    source = "open-unlearning grad_ascent.py"
    streams = ("forget",)
    gamma: float = 1.0

    def forget_loss(self, model, batch, stats):
        return forget_ascent(stats)


def activation_mse(acts: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """E_samples[(1/|ans|) Σ_{t ∈ ans} (1/d) ‖a_t − target_t‖²] over ``[B, L, d]`` activations, ``[B, L]`` mask."""
    per_token = (acts.float() - target.float()).pow(2).mean(-1)
    mask = mask.to(per_token.dtype)
    return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()


def decoder_layer(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The ``layer``-th decoder block (``...layers.<layer>``), also inside a peft wrapper."""
    matches = [m for name, m in model.named_modules() if name.endswith(f"layers.{layer}") and "lora" not in name]
    if len(matches) != 1:
        n = sum(1 for name, _ in model.named_modules() if name.rsplit(".", 1)[-1].isdigit() and ".layers." in name)
        raise InputError(f"RMU layer {layer} not found in the model ({n} decoder layers); set the method's layer")
    return matches[0]


@contextmanager
def capture_output(module: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record the hidden-state output of ``module`` during forward passes run inside the block."""
    cache: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        cache.append(output[0] if isinstance(output, tuple) else output)

    handle = module.register_forward_hook(hook)
    try:
        yield cache
    finally:
        handle.remove()


def layer_activations(model: torch.nn.Module, batch: dict, layer: int) -> torch.Tensor:
    """Output of decoder block ``layer`` for ``batch``, ``[B, L, d]``."""
    device = next(model.parameters()).device
    with capture_output(decoder_layer(model, layer)) as cache:
        model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    return cache[0]


@register
@dataclass
class RMU(UnlearningMethod):
    """Representation Misdirection for Unlearning: steer forget activations at one layer to c·u, keep retain
    activations at the frozen θ0's.

        L = γ·MSE(h_θ^ℓ(x_f), c·u) + α·MSE(h_θ^ℓ(x_r), h_θ0^ℓ(x_r))   over answer tokens (``activation_mse``)

    u = r/‖r‖ with r ~ U[0, 1)^d drawn once from ``seed``; only ``layers.(ℓ−2..ℓ).mlp.down_proj`` are trained
    (WMDP's choice; open-unlearning's TOFU config trains every parameter). Sources: Li et al. 2024 (WMDP,
    centerforaisafety/wmdp ``rmu/unlearn.py``); open-unlearning ``src/trainer/unlearn/rmu.py`` and
    ``configs/trainer/RMU.yaml``, whose values are our paper-scale defaults (ℓ = 7, c = 2, α = 1, γ = 1), with the
    activation retain loss (its ``EMBED_DIFF``). c = 300 with α = 1600 is WMDP's Mixtral command, not a TOFU
    setting. Deliberate difference: open-unlearning divides a per-sample ``[B]`` activation sum by a ``[B, 1]``
    token count, which broadcasts to ``[B, B]`` before the mean; we take the intended per-sample mean (the two agree
    when every answer in the batch has the same length).
    """

    name = "RMU"
    family = "gradient"
    source = "Li et al. 2024 (WMDP rmu/unlearn.py); open-unlearning rmu.py"
    layer: int = 7
    steering_coeff: float = 2.0
    gamma: float = 1.0
    alpha: float = 1.0
    trained_layers: int = 3
    seed: int = 0
    reference: torch.nn.Module | None = field(default=None, repr=False, compare=False)
    control: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def prepare(self, reference, forget, tokenizer):
        self.reference = reference.eval()
        decoder_layer(reference, self.layer)  # fail early on a layer the model does not have
        generator = torch.Generator().manual_seed(self.seed)
        r = torch.rand(reference.config.hidden_size, generator=generator)
        self.control = self.steering_coeff * r / r.norm()

    def select_trainable(self, model):
        wanted = {
            f"layers.{i}.mlp.down_proj.weight" for i in range(self.layer - self.trained_layers + 1, self.layer + 1)
        }
        for name, param in model.named_parameters():
            param.requires_grad = any(name.endswith(w) for w in wanted)

    def forget_loss(self, model, batch, stats):
        if self.reference is None or self.control is None:
            raise RuntimeError("RMU.prepare(θ0, forget) must run before the loss is used")
        forget = batch["forget"]
        acts = layer_activations(model, forget, self.layer)
        target = self.control.to(acts.device, acts.dtype).expand_as(acts)
        return activation_mse(acts, target, forget["labels"].to(acts.device) != -100), {}

    def retain_term(self, model, batch, stats):
        retain = batch["retain"]
        acts = layer_activations(model, retain, self.layer)
        with torch.no_grad():
            ref = layer_activations(self.reference, retain, self.layer)
        retain_loss = activation_mse(acts, ref, retain["labels"].to(acts.device) != -100)
        return self.alpha * retain_loss, {"retain_loss": retain_loss.item()}


def logit_flatness(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked positions of (max_v z_v − mean_v z_v)²: zero iff every logit vector is flat."""
    gap = (logits.float().max(-1).values - logits.float().mean(-1)).pow(2)
    return (gap * mask).sum() / mask.sum().clamp(min=1)


@register
@dataclass
class PDU(UnlearningMethod):
    """Primal-dual unlearning: flatten forget logits subject to a retain-loss constraint NLL_r ≤ ε.

        L = γ·E_t[(max_v z_v − mean_v z_v)²]_{D_f} + λ_k·(NLL_r − ε)                 (every micro-batch of step k)
        λ_{k+1} = max(0, λ_k + η·(1/M) Σ_m (NLL_r,m − ε)) if k > dual_warmup_steps, else λ_k

    with k the optimizer step (1-based) and m its M = ``grad_accum`` micro-batches; λ_1 = ``alpha`` (or the carried
    λ). λ is updated once per optimizer step (:meth:`on_optimizer_step`, called by the training loop) from the
    step's mean retain slack, so every micro-batch of a step sees the same λ. λ and ``steps_seen`` (optimizer steps) are
    :attr:`carried` state: the unlearning run saves them with the checkpoint and the MC polish continues from them.
    Source: Entesari et al. 2025; open-unlearning ``src/trainer/unlearn/pdu.py`` (``dual_update_upon="step"``; its
    forget term is masked to answer positions since commit 0e57336, as ours is). Difference: the reference updates
    λ in ``compute_loss``, i.e. once per micro-batch under gradient accumulation, and ends its warm-up at an epoch
    boundary; our schedule is stated in optimizer steps (``config.paper_schedule`` converts ``dual_warmup_epochs``
    into ``dual_warmup_steps`` optimizer steps), so the warm-up and the dual step are counted in optimizer steps
    too. The two coincide at ``grad_accum = 1``.
    """

    name = "PDU"
    family = "gradient"
    source = "Entesari et al. 2025; open-unlearning pdu.py"
    carried = ("dual", "steps_seen")
    gamma: float = 1.0
    alpha: float = 1.0
    retain_eps: float = 0.0
    dual_step_size: float = 1.0
    dual_warmup_steps: int = 0
    dual: float | None = field(default=None, repr=False, compare=False)
    steps_seen: int = field(default=0, repr=False, compare=False)
    slacks: list[float] = field(default_factory=list, repr=False, compare=False)  # NLL_r − ε of this step's calls

    def forget_loss(self, model, batch, stats):
        logits, _, mask = stats.answer("forget")
        return logit_flatness(logits, mask), {}

    def retain_term(self, model, batch, stats):
        """λ_k·(NLL_r − ε) at the step's λ_k; the slack is kept for the step's dual update."""
        if self.dual is None:
            self.dual = self.alpha
        slack = stats["retain"].token_mean_nll() - self.retain_eps
        self.slacks.append(slack.item())
        return self.dual * slack, {"retain_slack": slack.item(), "dual": self.dual}

    def on_optimizer_step(self) -> None:
        """Count optimizer step k; past the warm-up, λ ← max(0, λ + η·mean slack of the step's micro-batches)."""
        self.steps_seen += 1
        if self.slacks and self.steps_seen > self.dual_warmup_steps:
            self.dual = max(0.0, self.dual + self.dual_step_size * sum(self.slacks) / len(self.slacks))
        self.slacks.clear()
