"""Relearning defenses as wrappers around a base objective: SAM, RS, SWA, CR, ILU, LAT, RNA (+ NPO by default).

A defense keeps the base method's objective L = γ·L_forget + R and changes how the forget term is taken (SAM,
RS, CR, LAT), adds a regulariser (ILU, RNA) or changes the released weights (SWA). ``base`` names any registered
method and ``base_hparams`` its hyperparameters; the paper's panel uses NPO, hence the registry names
``SAMNPO`` … ``RNANPO``. Each defense with strength 0 (ρ, σ, h·λ, λ, ε, α_rna = 0, or no averaged snapshots
besides the last) is exactly its base.

For the MC polish, ``native_loss`` is the base objective alone: the defenses' training-time perturbation,
smoothing and averaging schedules are not replayed (paper App. "Loss-saturation verification").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from margincal.core.errors import InputError
from margincal.methods.base import UnlearningMethod, frozen_logits, get_method, method_class, register
from margincal.methods.gradient import decoder_layer
from margincal.model.scoring import LazyStats, kl_divergence


class ShiftedModel(torch.nn.Module):
    """``model`` evaluated at weights θ + δ (``shifts``: parameter name → δ, constants), via ``functional_call``.

    Gradients flow to θ through θ + δ, so ∇_θ L(ShiftedModel) = ∇L(θ + δ): the first-order SAM/RS gradient.
    Forward hooks on ``model``'s submodules still fire (the same modules run).
    """

    def __init__(self, model: torch.nn.Module, shifts: dict[str, torch.Tensor]):
        super().__init__()
        self.inner = model
        self.shifts = shifts

    def forward(self, **kwargs):
        params = {n: p + self.shifts[n] for n, p in self.inner.named_parameters() if n in self.shifts}
        return functional_call(self.inner, params, args=(), kwargs=kwargs, strict=False)


def trainable(model: torch.nn.Module) -> tuple[list[str], list[torch.nn.Parameter]]:
    """Names and tensors of the parameters being trained."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, _ in named], [p for _, p in named]


def global_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """‖(t_1, …, t_k)‖₂ over all entries of all tensors."""
    return torch.sqrt(sum((t.float() ** 2).sum() for t in tensors))


def dense_grads(loss: torch.Tensor, params: list[torch.nn.Parameter], create_graph: bool = False) -> list[torch.Tensor]:
    """∇``loss`` with respect to each of ``params``, a zero tensor for a parameter ``loss`` does not depend on
    (``create_graph`` keeps the graph for a double backward)."""
    grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@contextmanager
def add_to_layer_output(module: torch.nn.Module, delta_fn) -> Iterator[None]:
    """Add ``delta_fn(hidden)`` to the hidden-state output of ``module`` during forward passes in the block."""

    def hook(_module, _inputs, output):
        if isinstance(output, tuple):
            return (output[0] + delta_fn(output[0]), *output[1:])
        return output + delta_fn(output)

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def project_per_token(delta: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Project each position's vector δ_t (last axis) onto the L2 ball of radius ε: δ_t · min(1, ε/‖δ_t‖)."""
    return delta / (delta.norm(dim=-1, keepdim=True) / epsilon).clamp(min=1.0)


class BaseFamily:
    """``Defense.family``: the loss family of the base method, the configured ``base`` on an instance and the
    class's default ``base`` on the class (``method_class("SAMNPO").family``: NPO's, preference)."""

    def __get__(self, obj: Defense | None, owner: type[Defense]) -> str:
        return method_class((owner if obj is None else obj).base).family


@dataclass
class Defense(UnlearningMethod):
    """A base objective with a relearning defense; subclasses override :meth:`defended_forget` or add terms.

    ``family`` follows the base method (a defense of GradDiff is a gradient method)."""

    family = BaseFamily()
    base: str = "NPO"
    base_hparams: dict = field(default_factory=dict)
    inner: UnlearningMethod | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if issubclass(method_class(self.base), Defense):
            raise InputError(f"{self.name}: the base must be a plain method, not the defense {self.base}")
        self.inner = get_method(self.base, **self.base_hparams)
        self.streams = self.inner.streams
        self.gamma = self.inner.gamma

    def hparams(self) -> dict:
        own = super().hparams()
        return {**own, "base_hparams": self.inner.hparams()}

    def prepare(self, reference, forget, tokenizer):
        self.inner.prepare(reference, forget, tokenizer)

    def state(self) -> dict:
        return self.inner.state()

    def load_state(self, state: dict) -> None:
        self.inner.load_state(state)

    def on_optimizer_step(self) -> None:
        self.inner.on_optimizer_step()  # the base's per-step bookkeeping (PDU's dual update)

    def select_trainable(self, model):
        self.inner.select_trainable(model)

    def forget_loss(self, model, batch, stats):
        return self.inner.forget_loss(model, batch, stats)

    def retain_term(self, model, batch, stats):
        return self.inner.retain_term(model, batch, stats)

    def native_loss(self, model, batch, stats, with_forget=True):
        return self.inner.native_loss(model, batch, stats, with_forget)

    @property
    def native_streams(self) -> tuple[str, ...]:
        return self.inner.streams

    def forget_at(self, model, batch, shifts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The base forget term at weights θ + δ."""
        shifted = ShiftedModel(model, shifts)
        return self.inner.forget_loss(shifted, batch, LazyStats(shifted, batch))[0]

    def defended_forget(self, model, batch, stats) -> tuple[torch.Tensor, dict]:
        """The forget term whose gradient the update uses (default: the base's)."""
        return self.forget_loss(model, batch, stats)

    def loss(self, model, batch, stats):
        forget, logs = self.defended_forget(model, batch, stats)
        retain, retain_logs = self.retain_term(model, batch, stats)
        loss = self.gamma * forget + retain.to(forget.device)
        return loss, {"forget_loss": forget.item(), **logs, **retain_logs}


@register
@dataclass
class SAMNPO(Defense):
    """Sharpness-aware unlearning: the forget gradient is taken at the worst-case nearby weights.

        ε = ρ·g/‖g‖, g = ∇L_f(θ);   update gradient = γ·∇L_f(θ + ε) + ∇R(θ)

    (ε constant, one global L2 norm over the trained parameters; the retain part at the clean θ).
    Source: Fan et al. 2025, OPTML-Group/Unlearn-Smooth ``WMDP/src/unlearn/base.py`` ``SAMTrainer`` and
    ``MUSE/baselines/baselines/sam_iterative.py`` (ρ = 0.01 in both run scripts, ``run_wmdp_unlearn.sh`` and
    ``run_muse_unlearn.sh``).
    """

    name = "SAMNPO"
    source = "Fan et al. 2025; OPTML-Group/Unlearn-Smooth SAMTrainer"
    rho: float = 0.01

    def defended_forget(self, model, batch, stats):
        forget, logs = self.forget_loss(model, batch, stats)
        if self.rho == 0:
            return forget, logs
        names, params = trainable(model)
        grads = dense_grads(forget, params)
        scale = self.rho / (global_norm(grads) + 1e-12)
        shifts = {n: (scale * g).to(g.dtype).detach() for n, g in zip(names, grads, strict=True)}
        return self.forget_at(model, batch, shifts), {**logs, "forget_loss_clean": forget.item()}


@register
@dataclass
class RSNPO(Defense):
    """Randomized smoothing of the forget term in weight space:

        L = γ·(1/n) Σ_i L_f(θ + ξ_i) + R(θ),   ξ_i ~ N(0, σ² I) over the trained parameters

    Source: Fan et al. 2025, OPTML-Group/Unlearn-Smooth ``WMDP/src/unlearn/base.py`` ``RSTrainer`` (n = 3, σ =
    ``sam_rho`` = 1e-4 in ``run_wmdp_unlearn.sh``). Choice: the update is clipped like every other step (the
    source's RS step skips clipping as a side effect of calling ``optimizer.step`` itself).
    """

    name = "RSNPO"
    source = "Fan et al. 2025; OPTML-Group/Unlearn-Smooth RSTrainer"
    sigma: float = 1e-4
    samples: int = 3

    def defended_forget(self, model, batch, stats):
        if self.sigma == 0:
            return self.forget_loss(model, batch, stats)
        names, params = trainable(model)
        total = 0.0
        for _ in range(self.samples):
            shifts = {n: self.sigma * torch.randn_like(p) for n, p in zip(names, params, strict=True)}
            total = total + self.forget_at(model, batch, shifts)
        return total / self.samples, {}


@register
@dataclass
class CRNPO(Defense):
    """Curvature regularisation of the forget term (finite-difference Hessian–gradient penalty):

        L = γ·L_f(θ) + R(θ) + λ·‖∇L_f(θ + h·g/‖g‖) − ∇L_f(θ)‖₂,   g = ∇L_f(θ) (direction held constant)

    Source: Fan et al. 2025, OPTML-Group/Unlearn-Smooth ``WMDP/src/unlearn/GA.py`` ``NPO_FT_CR`` (h = 0.01,
    λ = ``gnr_rho`` = 10 in ``run_wmdp_unlearn.sh``). Choice: the penalty keeps its graph (double backward, math
    attention kernel), as the method intends; the released code detaches it with ``.item()`` (so it has no effect
    there) and is not reachable from its run script.
    """

    name = "CRNPO"
    source = "Fan et al. 2025; OPTML-Group/Unlearn-Smooth NPO_FT_CR"
    curvature_weight: float = 10.0
    h: float = 0.01

    def loss(self, model, batch, stats):
        if self.curvature_weight == 0 or self.h == 0:
            return super().loss(model, batch, stats)
        with sdpa_kernel(SDPBackend.MATH):  # fused attention kernels have no double backward
            return self._penalised_loss(model, batch, stats)

    def _penalised_loss(self, model, batch, stats):
        loss, logs = super().loss(model, batch, stats)
        names, params = trainable(model)
        forget, _ = self.forget_loss(model, batch, stats)
        grads = dense_grads(forget, params, create_graph=True)
        scale = self.h / (global_norm(grads).detach() + 1e-12)
        shifts = {n: (scale * g).detach() for n, g in zip(names, grads, strict=True)}
        moved = dense_grads(self.forget_at(model, batch, shifts), params, create_graph=True)
        penalty = global_norm([a - b for a, b in zip(moved, grads, strict=True)])
        return loss + self.curvature_weight * penalty, {**logs, "curvature": penalty.item()}


@register
@dataclass
class SWANPO(Defense):
    """Stochastic weight averaging: the released model is the uniform average of the iterates θ_s at steps
    s ≥ ``start``·S with s ≡ 0 (mod ``interval``) (S = the steps run; the last step is always included).

    With a planned S (``total``) the average is kept running. Under a stop rule S is known only at the end
    (``total`` None), so the snapshots that can still fall in the window (s ≥ ``start``·current step) are kept, on
    the CPU in float32: about (1 − ``start``)·S/``interval`` copies of the trainable weights.

    Source: Fan et al. 2025, OPTML-Group/Unlearn-Smooth ``WMDP/src/model/unlearn.py`` ``WeightAveragingCallback``
    (steps 100, 105, …, 125 of 125, i.e. the last 20 %: ``start`` = 0.8, ``interval`` = 5). ``start`` = 1 keeps
    only the last iterate (the base method).
    """

    name = "SWANPO"
    source = "Fan et al. 2025; OPTML-Group/Unlearn-Smooth WeightAveragingCallback"
    start: float = 0.8
    interval: int = 5
    average: dict[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)
    snapshots: int = field(default=0, repr=False, compare=False)
    window: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False, compare=False)
    last_step: int = field(default=0, repr=False, compare=False)

    @staticmethod
    def _weights(model, device: str | None = None) -> dict[str, torch.Tensor]:
        return {
            n: p.detach().float().to(device or p.device, copy=True)
            for n, p in model.named_parameters()
            if p.requires_grad
        }

    def after_step(self, step, total, model):
        if total is None:
            self.last_step = step
            self.window = {s: w for s, w in self.window.items() if s >= self.start * step}
            if step % self.interval == 0:
                self.window[step] = self._weights(model, "cpu")
            return {"swa_snapshots": len(self.window)}
        if step < self.start * total or (step % self.interval and step != total):
            return None
        current = self._weights(model)
        if self.average is None:
            self.average = current
        else:
            for n, value in current.items():
                self.average[n] += (value - self.average[n]) / (self.snapshots + 1)
        self.snapshots += 1
        return {"swa_snapshots": self.snapshots}

    def finish(self, model):
        if self.last_step:  # a stop-rule run: the window of the steps actually run, and the last iterate
            members = [w for s, w in self.window.items() if s >= self.start * self.last_step]
            if self.last_step not in self.window:
                members.append(self._weights(model, "cpu"))
            self.average = {n: torch.stack([w[n] for w in members]).mean(0) for n in members[0]}
        if self.average is not None:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if n in self.average:
                        p.copy_(self.average[n].to(p.device, p.dtype))
        self.average, self.snapshots, self.window, self.last_step = None, 0, {}, 0
        return model


def irm_penalty(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """IRMv1 penalty (∂/∂w CE(w·z, y) at w = 1)², CE the token-mean answer cross-entropy of the batch."""
    scale = torch.ones((), device=logits.device, requires_grad=True)
    logp = F.log_softmax(logits.float() * scale, dim=-1)
    nll = -torch.gather(logp, -1, targets[..., None]).squeeze(-1)
    mask = mask.to(nll.dtype)
    ce = (nll * mask).sum() / mask.sum().clamp(min=1)
    (grad,) = torch.autograd.grad(ce, scale, create_graph=True)
    return grad**2


@register
@dataclass
class ILUNPO(Defense):
    """Invariant LLM unlearning: the base objective plus an IRM invariance penalty on a fine-tuning environment,

        L = γ·L_f + R + λ·(∂/∂w ℓ_env(w·f_θ) |_{w=1})²

    with ℓ_env the fine-tuning (answer NLL) loss on a batch of the ``env`` split, an auxiliary task unrelated
    to D_f (the paper's best is one environment, GSM8K; the mini benchmark uses its world-fact Q&A). The
    environment is only penalised, never trained on. Source: Wang et al. 2025 (ICML, arXiv 2506.01339); the
    repository OPTML-Group/Unlearn-ILU holds no ILU code yet, so this follows the paper's Eq. (IRM form with a
    dummy scalar predictor). λ = 0.1 is our reading of the paper's λ ablation (0.05 too weak, larger hurts).
    """

    name = "ILUNPO"
    source = "Wang et al. 2025 (ILU, arXiv 2506.01339), paper equation"
    invariance_weight: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        self.streams = (*self.inner.streams, "env")

    def loss(self, model, batch, stats):
        loss, logs = super().loss(model, batch, stats)
        if self.invariance_weight == 0:
            return loss, logs
        penalty = irm_penalty(*stats.answer("env"))
        return loss + self.invariance_weight * penalty, {**logs, "irm_penalty": penalty.item()}


@register
@dataclass
class LATNPO(Defense):
    """Latent adversarial training: the forget term is taken under a worst-case perturbation δ of the residual
    stream at decoder layer ``layer`` that makes the model recall the forget answers.

        δ* ≈ argmin_{‖δ_t‖₂ ≤ ε ∀t} NLL_f(θ; h^ℓ + δ)   (``adv_steps`` Adam steps at ``adv_lr``, projected per token)
        L = γ·L_f(θ; h^ℓ + δ*) + R(θ)

    δ acts on every non-padding token of the forget batch. Source: Sheshadri et al. 2024,
    aengusl/latent-adversarial-training ``latent_at/lat_methods.py`` and ``laa/attacks.py`` (layer 7 of 32,
    ε = 2, 16 Adam steps at lr 5e-2, per-token L2 projection). Choices: the adversary optimises the "toward"
    (recall the forget answer) term only and the retain term is computed without δ, as in the repository's
    RMU+LAT variant; the outer loss is the base's forget term (NPO's) rather than the repository's log(1 − p).
    """

    name = "LATNPO"
    source = "Sheshadri et al. 2024; aengusl/latent-adversarial-training"
    layer: int = 7
    epsilon: float = 2.0
    adv_steps: int = 16
    adv_lr: float = 5e-2

    def defended_forget(self, model, batch, stats):
        if self.epsilon == 0 or self.adv_steps == 0:
            return self.forget_loss(model, batch, stats)
        forget = batch["forget"]
        block = decoder_layer(model, self.layer)
        device = next(model.parameters()).device
        token_mask = forget["attention_mask"].to(device)[..., None].float()
        delta = torch.zeros(*forget["input_ids"].shape, model.config.hidden_size, device=device, requires_grad=True)
        optimizer = torch.optim.Adam([delta], lr=self.adv_lr)

        def perturb(hidden):
            return (delta * token_mask).to(hidden.dtype)

        with add_to_layer_output(block, perturb):
            for _ in range(self.adv_steps):
                nll = LazyStats(model, batch)["forget"].token_mean_nll()
                (grad,) = torch.autograd.grad(nll, delta)
                optimizer.zero_grad()
                delta.grad = grad
                optimizer.step()
                with torch.no_grad():
                    delta.copy_(project_per_token(delta, self.epsilon))
            delta = delta.detach()
            adversarial, logs = self.inner.forget_loss(model, batch, LazyStats(model, batch))
        radius = float((delta * token_mask).norm(dim=-1).max())
        return adversarial, {**logs, "adv_forget_nll": nll.item(), "adv_delta_norm": radius}


@register
@dataclass
class RNANPO(Defense):
    """Random noise augmentation: the base objective plus a KL term to a noise-perturbed frozen θ0 on retain,

        L = γ·L_f + R + α_rna·E_{t ∈ ans(D_r)}[KL(p̃_θ0(·|x_r, y_<t) ‖ p_θ(·|x_r, y_<t))]

    where p̃_θ0 is θ0 with i.i.d. N(0, ν²) noise added to the output of decoder layer ``layer`` (every position)
    of the retain inputs. Source: Dang et al. 2025 (arXiv 2501.19202), huutiendang/llmu-robustness
    ``baselines/po/npo/unlearn.py`` and ``baselines/losses.py`` (ν = 0.01, layer 7, KL weight 50, noise on
    retain only). Choice: the noisy-reference KL is added to the base's retain term rather than replacing it,
    so that α_rna = 0 is exactly the base.
    """

    name = "RNANPO"
    source = "Dang et al. 2025 (RNA); huutiendang/llmu-robustness"
    layer: int = 7
    noise_std: float = 0.01
    kl_weight: float = 50.0
    reference: torch.nn.Module | None = field(default=None, repr=False, compare=False)

    def prepare(self, reference, forget, tokenizer):
        super().prepare(reference, forget, tokenizer)
        decoder_layer(reference, self.layer)  # fail early on a layer the model does not have
        self.reference = reference.eval()

    def noisy_reference_logits(self, retain: dict) -> torch.Tensor:
        """θ0's answer logits on ``retain`` with N(0, ν²) noise on decoder layer ``layer``'s output."""
        layer = decoder_layer(self.reference, self.layer)
        with add_to_layer_output(layer, lambda h: self.noise_std * torch.randn_like(h)):
            return frozen_logits(self.reference, retain)

    def retain_term(self, model, batch, stats):
        retain, logs = super().retain_term(model, batch, stats)
        if self.kl_weight == 0:
            return retain, logs
        if self.reference is None:
            raise RuntimeError("RNANPO.prepare(θ0, forget, tokenizer) must run before the loss is used")
        logits, _, mask = stats.answer("retain")
        kl = kl_divergence(self.noisy_reference_logits(batch["retain"]), logits, mask)
        return retain.to(kl.device) + self.kl_weight * kl, {**logs, "noisy_kl": kl.item()}
