"""Preference family: NPO and SimNPO (the NPO defenses of ``defenses.py`` wrap their forget terms)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from margincal.methods.base import UnlearningMethod, register
from margincal.model.scoring import score_dataset


def npo_loss(nll_sum: torch.Tensor, ref_nll_sum: torch.Tensor, beta: float) -> torch.Tensor:
    """L_f = −(2/β)·E[log σ(β·(S(θ) − S(θ0)))] with S the per-sample summed answer NLL.

    Equivalent to NPO's −(2/β) log σ(−β log(π_θ(y|x)/π_θ0(y|x))).
    """
    return -(2.0 / beta) * F.logsigmoid(beta * (nll_sum - ref_nll_sum)).mean()


def simnpo_loss(nll_mean: torch.Tensor, beta: float, delta: float) -> torch.Tensor:
    """L_f = −(2/β)·E[log σ(β·(N(θ) − δ))] with N the per-sample mean answer NLL (reference-free, length-normalised)."""
    return -(2.0 / beta) * F.logsigmoid(beta * (nll_mean - delta)).mean()


@register
@dataclass
class NPO(UnlearningMethod):
    """Negative Preference Optimization with a retain NLL term: L = γ·L_f + α·NLL_r.

    Source: Zhang et al. 2024; open-unlearning ``src/trainer/unlearn/npo.py`` and ``compute_dpo_loss`` in
    ``src/trainer/utils.py`` (sequence-summed log-probs, reference = frozen θ0, β = 0.1, γ = α = 1).
    The reference sums S(θ0) are computed once per forget sample in :meth:`prepare` (θ0 is frozen, so
    caching them is exact).
    """

    name = "NPO"
    family = "preference"
    source = "Zhang et al. 2024; open-unlearning npo.py"
    beta: float = 0.1
    gamma: float = 1.0
    alpha: float = 1.0
    ref_nll_sum: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def prepare(self, reference, forget, tokenizer):
        stats = score_dataset(reference, forget, tokenizer.pad_token_id)
        table = torch.zeros(max(e.index for e in forget) + 1)
        table[stats.index] = stats.nll_sum()
        self.ref_nll_sum = table

    def forget_loss(self, model, batch, stats):
        if self.ref_nll_sum is None:
            raise RuntimeError("NPO.prepare(θ0, forget) must run before the loss is used")
        forget = stats["forget"]
        index = batch["forget"]["index"]
        ref = self.ref_nll_sum.to(index.device)[index].to(forget.gold.device)
        return npo_loss(forget.nll_sum(), ref, self.beta), {}


@register
@dataclass
class SimNPO(UnlearningMethod):
    """SimNPO: L = γ·L_f + α·NLL_r with the reference-free, length-normalised NPO loss of :func:`simnpo_loss`.

    Source: Fan et al. 2024 (OPTML-Group/Unlearn-Simple); open-unlearning ``src/trainer/unlearn/simnpo.py``
    (N = summed answer NLL / answer-token count, EOS included). Defaults per the paper's panel (methods.md):
    β = 4.5, δ = 0, γ = 0.125, α = 1.
    """

    name = "SimNPO"
    family = "preference"
    source = "Fan et al. 2024; open-unlearning simnpo.py"
    beta: float = 4.5
    delta: float = 0.0
    gamma: float = 0.125
    alpha: float = 1.0

    def forget_loss(self, model, batch, stats):
        return simnpo_loss(stats["forget"].nll_mean(), self.beta, self.delta), {}
