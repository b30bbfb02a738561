"""Distillation family: UNDIAL (JensUn to come)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from margincal.methods.base import UnlearningMethod, register
from margincal.scoring import forward_answer


def undial_target(teacher_logits: torch.Tensor, targets: torch.Tensor, beta: float) -> torch.Tensor:
    """q = softmax(z_θ0 − β·e_{y_t}): the frozen teacher's distribution with the gold logit lowered by β."""
    lowered = teacher_logits.float().scatter_add(
        -1, targets[..., None], torch.full_like(targets[..., None], -beta, dtype=torch.float)
    )
    return F.softmax(lowered, dim=-1)


def undial_loss(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the batch's answer tokens of CE(p_θ, q) = −Σ_v q_v log p_θ(v)."""
    ce = -(target * F.log_softmax(logits.float(), dim=-1)).sum(-1)
    return (ce * mask).sum() / mask.sum().clamp(min=1)


@register
@dataclass
class UNDIAL(UnlearningMethod):
    """UNDIAL: self-distillation towards the frozen θ0 with the gold logit lowered by β, plus α·NLL_r.

    Source: Dong et al. 2024; open-unlearning ``compute_undial_loss`` in ``src/trainer/utils.py`` and
    ``configs/trainer/UNDIAL.yaml`` (β = 10, γ = 1, α = 0, lr 1e-4). Choice: the loss is averaged over the
    answer tokens, as the method is defined; open-unlearning averages the soft-label CE over every shifted
    position of the batch (prompt and padding included).
    """

    name = "UNDIAL"
    family = "distillation"
    source = "Dong et al. 2024; open-unlearning compute_undial_loss"
    beta: float = 10.0
    gamma: float = 1.0
    alpha: float = 0.0
    teacher: torch.nn.Module | None = field(default=None, repr=False, compare=False)

    def prepare(self, reference, forget, pad_id):
        self.teacher = reference.eval()

    def hparams(self) -> dict:
        return {"beta": self.beta, "gamma": self.gamma, "alpha": self.alpha}

    def loss(self, model, batch, stats):
        if self.teacher is None:
            raise RuntimeError("UNDIAL.prepare(θ0, forget) must run before the loss is used")
        logits, targets, mask = stats.answer("forget")
        with torch.no_grad():
            teacher_logits, _, _, _ = forward_answer(self.teacher, batch["forget"])
        forget_loss = undial_loss(logits, undial_target(teacher_logits, targets, self.beta), mask)
        loss = self.gamma * forget_loss
        logs = {"forget_loss": forget_loss.item()}
        if self.alpha:
            retain_nll = stats["retain"].token_mean_nll()
            loss = loss + self.alpha * retain_nll
            logs["retain_nll"] = retain_nll.item()
        return loss, logs
