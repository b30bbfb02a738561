"""Theory instruments: the coercivity logger of the polish and the Theorem 3 attack-lift instrumentation (paper
App. "Full proofs" (Fig. traj) and "Measured constants for Theorem 3").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from margincal.data.benchmarks import shots_of
from margincal.data.records import EncodedQA, collate
from margincal.mc.loss import anchor_tables, forget_hinge
from margincal.model.margin import diagnostic_positions, smoothed_margin, smoothing_slack
from margincal.model.scoring import answer_token_stats, forward_answer, kl_divergence, score_dataset
from margincal.training.monitors import DeltaCheck, delta_check


def _trainable(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().float().reshape(-1) for t in tensors])


def coercivity_trace(ws, mc, m_ref: float | None):
    """The coercivity trace's hook (:func:`coercivity_hook`) of an MC polish ``mc`` in the stage workspace ``ws``:
    the margin anchor's per-token margins on the training forget split, Δ on D_f as the benchmark evaluates it
    against ``m_ref``, MC's κ and token weights."""
    anchor, anchor_id = ws.anchors()[mc.margin_anchor]
    pad = ws.tokenizer.pad_token_id
    tables = anchor_tables(anchor, anchor_id, ws.train["forget"], pad)
    shots = shots_of(ws.benchmark, ws.eval_splits, "forget")
    check = delta_check(ws.tokenizer, ws.benchmark, ws.eval_splits["forget"], m_ref, shots)
    train = ws.train
    return coercivity_hook(
        tables, train["forget"], train["retain"], train["probe"], anchor, check, mc.kappa, mc.token_weights, pad
    )


def coercivity_hook(
    tables: dict[str, torch.Tensor],
    forget: Sequence[EncodedQA],
    retain: Sequence[EncodedQA],
    probe: Sequence[EncodedQA],
    anchor: torch.nn.Module,
    check: DeltaCheck,
    kappa: float,
    weights: str,
    pad_id: int,
    batch_size: int = 8,
):
    """Polish hook logging ‖∇ L_forget‖ (Eq. 4's hinge alone, :func:`margincal.mc.loss.forget_hinge`, on a fixed
    batch of the training ``forget`` examples), Δ by ``check`` (:func:`margincal.training.monitors.delta_check`: the
    evaluation forget records as the benchmark's evaluator encodes and aggregates them, against m_ref), retain NLL and
    probe KL (fixed batches) at each logged step: the coercivity premise's on-trajectory signature (paper Fig.
    traj)."""
    f_batch, r_batch, p_batch = (collate(list(s[:batch_size]), pad_id) for s in (forget, retain, probe))
    with torch.no_grad():
        anchor_probe = forward_answer(anchor, p_batch)[0]

    def hook(step: int, model) -> dict:
        with torch.enable_grad():
            hinge = forget_hinge(answer_token_stats(model, f_batch), tables, kappa, weights)
            grads = torch.autograd.grad(hinge, _trainable(model), allow_unused=True)
        norm = float(_flat([g for g in grads if g is not None]).norm())
        delta = check(model)
        retain_nll = float(answer_token_stats(model, r_batch).token_mean_nll())
        probe_logits, _, probe_mask, _ = forward_answer(model, p_batch)
        kl = float(kl_divergence(anchor_probe, probe_logits, probe_mask))
        return {"hinge_grad_norm": norm, "delta": delta, "retain_nll": retain_nll, "probe_kl": kl}

    return hook


class LiftInstrument:
    """Theorem 3 instrumentation of an attack run (a training-loop hook, called at step 0 and after each step).

    At the defender's diagnostic positions t̂ of the held-out samples (frozen at the pre-attack model) it records
    m_β(θ^n) (β-smoothed, mean over samples), ‖∇m_β(θ^n)‖, the step norm ‖δ^n‖ = ‖θ^{n+1} − θ^n‖ and the segment
    curvature ‖∇m_β(θ^{n+1}) − ∇m_β(θ^n)‖ / ‖δ^n‖, all over the attacker's trainable parameters; then
    G_m^sup, L_m^sup, Λ̂(N) = G_m^sup Σ‖δ‖ + ½ L_m^sup Σ‖δ‖² + c_β and the measured lift m_β(θ_N) − m_β(θ_0).
    """

    def __init__(self, defender: torch.nn.Module, heldout: Sequence[EncodedQA], pad_id: int, beta: float = 120.0):
        self.batch = collate(list(heldout), pad_id)
        stats = score_dataset(defender, heldout, pad_id)
        self.positions = diagnostic_positions(stats)
        self.beta = beta
        self.slack = smoothing_slack(defender.config.vocab_size, beta)
        self.rows: list[dict] = []
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    def m_beta(self, model) -> torch.Tensor:
        logits, targets, _, _ = forward_answer(model, self.batch)
        rows = torch.arange(logits.size(0), device=logits.device)
        cols = self.positions.to(logits.device)
        return smoothed_margin(logits[rows, cols], targets[rows, cols], self.beta).mean()

    def __call__(self, step: int, model) -> dict:
        params = _trainable(model)
        with torch.enable_grad():
            value = self.m_beta(model)
            grads = torch.autograd.grad(value, params, allow_unused=True)
        grad = _flat([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)])
        theta = _flat(params)
        row = {"step": step, "m_beta": float(value), "grad_norm": float(grad.norm())}
        if self._last is not None:
            step_norm = float((theta - self._last[0]).norm())
            row["step_norm"] = step_norm
            row["curvature"] = float((grad - self._last[1]).norm()) / step_norm if step_norm > 0 else 0.0
        self._last = (theta, grad)
        self.rows.append(row)
        return {"m_beta": row["m_beta"]}

    def summary(self) -> dict:
        """Sup constants, the realised-trajectory budget Λ̂(N) and the measured lift."""
        steps = [r for r in self.rows if "step_norm" in r]
        g_sup = max(r["grad_norm"] for r in self.rows)
        l_sup = max((r["curvature"] for r in steps), default=0.0)
        total = sum(r["step_norm"] for r in steps)
        squares = sum(r["step_norm"] ** 2 for r in steps)
        budget = g_sup * total + 0.5 * l_sup * squares + self.slack
        lift = self.rows[-1]["m_beta"] - self.rows[0]["m_beta"]
        return {
            "G_m_sup": g_sup,
            "L_m_sup": l_sup,
            "sum_step_norm": total,
            "c_beta": self.slack,
            "Lambda_hat": budget,
            "lift": lift,
            "bound_holds": lift <= budget,
            "steps": len(steps),
        }
