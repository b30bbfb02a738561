"""Gradient family: GradAscent, GradDiff (RMU and PDU to come)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from margincal.methods.base import UnlearningMethod, register


def graddiff_loss(forget_nll: torch.Tensor, retain_nll: torch.Tensor, gamma: float, alpha: float) -> torch.Tensor:
    """L = γ·(−NLL_f) + α·NLL_r (both token-mean answer NLL over the batch)."""
    return -gamma * forget_nll + alpha * retain_nll


@register
@dataclass
class GradDiff(UnlearningMethod):
    """Gradient difference: ascend the forget NLL, descend the retain NLL.

    Source: Maini et al. 2024 (TOFU); open-unlearning ``src/trainer/unlearn/grad_diff.py`` with
    ``configs/trainer/GradDiff.yaml`` (γ = α = 1, retain loss NLL). NLL is HF-style: summed over the
    batch's answer tokens, divided by their count.
    """

    name = "GradDiff"
    family = "gradient"
    source = "Maini et al. 2024 (TOFU); open-unlearning grad_diff.py"
    gamma: float = 1.0
    alpha: float = 1.0

    def loss(self, model, batch, stats):
        forget = stats["forget"].token_mean_nll()
        retain = stats["retain"].token_mean_nll()
        loss = graddiff_loss(forget, retain, self.gamma, self.alpha)
        return loss, {"forget_nll": forget.item(), "retain_nll": retain.item()}


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

    def loss(self, model, batch, stats):
        forget = stats["forget"].token_mean_nll()
        return -self.gamma * forget, {"forget_nll": forget.item()}
