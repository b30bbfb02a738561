"""Margin Calibration (MC): a short LoRA polish of an already-unlearned model (paper Sec. 3.4).

    L_polish(θ) = L_native(θ) + L_forget(θ) + λ_KL · L_KL(θ)                                   (Eq. 6)

    L_forget(θ) = E_{D_f}[ (1/T) Σ_t (1/κ) softplus(κ (m_θ(t) − m_mar(t))) ]                     (Eq. 4)
    L_KL(θ)     = E_{x∈D_a}[ KL(p_anc(·|x) ‖ p_θ(·|x)) ] over the probe example's answer positions (Eq. 5)

``m_mar(t)`` are the per-token margins of the frozen margin anchor θ_mar on the forget pool, computed
once under ``no_grad`` and cached per (anchor, split) on disk. On a multiple-choice benchmark whose method trains on
a corpus (WMDP, ``hinge_on: questions``) the hinge has its own pool, the forget questions, and m_θ, m_mar are
answer-letter margins (one position: ll_gold − max_{L≠gold} ll_L; :func:`margincal.model.scoring.choice_logits`). The
reference-anchored variant sets θ_mar = θ_anc = θ_ref. ``L_native`` is the method's own loss (a strict plug-in,
``method.native_loss``). Deliberate choice: for the NPO defenses (SAM, RS, CR, SWA, ILU, LAT, RNA) the native loss is
the wrapped base objective without the defense's training-time perturbation, smoothing or averaging schedule (paper App.
"Loss-saturation verification": those terms do not change the leading-order saturation).

Variants are config switches of :class:`MCConfig` (``margincal.config.settings.MC_VARIANTS`` names the paper's presets):

* ``margin_anchor``: ``ref`` (θ_mar = θ_anc = θ_ref) or ``theta0`` (deployment: θ_mar = θ0, no retain-trained
  reference needed);
* ``forget_term``: ``hinge`` (Eq. 4) or ``ascent`` (the GradAscent polish, −NLL_f);
* ``token_weights`` w_t of the hinge, (1/T) Σ_t → Σ_t w_t: ``uniform`` (1/T), ``soft_entropy`` (stop-grad
  softmax of the current model's per-token entropies), ``top8`` (1/8 on the anchor's 8 highest-entropy positions),
  ``ref_gate`` ((1 − p_anc(y_t))/T, unnormalised);
* ``kl_weight`` λ_KL (0: forget-only hinge) and ``retain_hinge_weight`` λ_r, the retain-side hinge
  E_{D_r}[(1/T) Σ_t (1/κ) softplus(κ (m_anc(t) − m_θ(t)))] at the anchor's retain margins;
* ``native_forget``: false drops the native forget term (γ = 0), keeping only its retain part;
* ``stop_delta``: stop once Δ on a held-out check set of evaluation forget records reaches the target depth, Δ
  computed as the benchmark's evaluator diagnoses it (:func:`margincal.training.monitors.delta_check`: its encoding,
  few-shot prompts included, and its aggregate, so Δ is on the scale of m_ref). It is the Δ target of the one monitor
  hook (:class:`margincal.training.controller.MonitorHook`, Δ its only signal), the rule controlled MC's
  ``delta_target`` applies.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from margincal.config.settings import MCConfig
from margincal.core.errors import InputError
from margincal.data.records import EncodedQA
from margincal.mc.loss import FORGET_TERMS, anchor_tables, forget_hinge, mc_loss, probe_kl, retain_hinge
from margincal.methods.base import UnlearningMethod
from margincal.model.loading import merge_lora
from margincal.model.scoring import LazyStats
from margincal.training.controller import MonitorHook, Multiplier, delta_stop
from margincal.training.loop import TrainResult, chain_hooks, every, train
from margincal.training.monitors import DeltaCheck, Monitors
from margincal.training.streams import zip_streams


def polish_pool(forget: Sequence[EncodedQA], n_pool: int, seed: int) -> list[EncodedQA]:
    """The polish pool: all of D_f if |D_f| ≤ N_pol, else a seeded subset of N_pol samples."""
    if len(forget) <= n_pool:
        return list(forget)
    return random.Random(seed).sample(list(forget), n_pool)


def mc_objective(
    method: UnlearningMethod,
    anchor: torch.nn.Module,
    tables: dict[str, torch.Tensor],
    cfg: MCConfig,
    retain_tables: dict[str, torch.Tensor] | None = None,
    kl: Multiplier | None = None,
    hinge_stream: str = "forget",
):
    """The polish objective L_native + L_forget + λ_KL·L_KL (+ λ_r·L_retain-hinge) for the training loop, its terms
    and their sum from :mod:`margincal.mc.loss` (:func:`~margincal.mc.loss.mc_loss`); λ_KL is read from ``kl`` at
    every step when given (controlled MC's dual ascent moves it), else ``cfg.kl_weight``. The forget term reads the
    batches of ``hinge_stream``: the native forget stream, or ``hinge`` (the multiple-choice questions, at their
    answer-letter margins, where the method trains on a corpus)."""
    if cfg.retain_hinge_weight > 0 and retain_tables is None:
        raise InputError("a retain hinge (retain_hinge_weight > 0) needs the anchor's retain margins")
    if cfg.forget_term not in FORGET_TERMS:
        raise InputError(f"unknown forget_term {cfg.forget_term!r}; use hinge or ascent")

    def objective(model, batch):
        stats = LazyStats(model, batch)
        native, logs = method.native_loss(model, batch, stats, with_forget=cfg.native_forget)
        forget = stats[hinge_stream]
        if cfg.forget_term == "hinge":
            terms = {"hinge": forget_hinge(forget, tables, cfg.kappa, cfg.token_weights)}
        else:
            terms = {"ascent": -forget.token_mean_nll()}
        if cfg.kl_weight > 0:
            terms["kl"] = probe_kl(model, anchor, batch["probe"])
        if cfg.retain_hinge_weight > 0:
            terms["retain_hinge"] = retain_hinge(stats["retain"], retain_tables, cfg.kappa)
        loss = mc_loss(native, terms, kl.value if kl is not None else cfg.kl_weight, cfg.retain_hinge_weight)
        return loss, {"native": native.item(), **{k: v.item() for k, v in terms.items()}, **logs}

    return objective


@dataclasses.dataclass(frozen=True)
class PolishInput:
    """What one MC polish reads, resolved once (:func:`polish_input`): the ``method`` (prepared on θ0, its carried
    state loaded), the MC config, the margin/behaviour ``anchor`` with its forget ``tables`` (and ``retain_tables``
    when a retain hinge is on), the polish ``pool`` (drawn once: training draws from it, and the Δ ``check`` and the
    ``monitors`` hold its records out), the ``retain`` and ``probe`` examples and the pad id; ``hook`` an extra
    training-loop hook (e.g. the coercivity trace of :mod:`margincal.mc.bounds`). ``hinge``: the hinge's own pool when
    it is not the method's forget data (WMDP: the questions, the tables theirs; the pool stays the corpus the native
    loss trains on)."""

    method: UnlearningMethod
    cfg: MCConfig
    anchor: torch.nn.Module
    tables: dict[str, torch.Tensor]
    pool: Sequence[EncodedQA]
    retain: Sequence[EncodedQA]
    probe: Sequence[EncodedQA]
    pad_id: int
    retain_tables: dict[str, torch.Tensor] | None = None
    check: DeltaCheck | None = None
    monitors: Monitors | None = None
    hook: Callable | None = None
    hinge: Sequence[EncodedQA] | None = None


def polish_input(
    method: UnlearningMethod,
    cfg: MCConfig,
    anchors: dict[str, tuple[torch.nn.Module, str]],
    forget: Sequence[EncodedQA],
    retain: Sequence[EncodedQA],
    probe: Sequence[EncodedQA],
    pad_id: int,
    cache_dir: Path | None = None,
    hinge: Sequence[EncodedQA] | None = None,
) -> PolishInput:
    """The polish input with the anchor ``cfg.margin_anchor`` picks from ``anchors`` (``ref`` / ``theta0`` →
    (model, cache id)), its tables on ``forget`` (on ``hinge`` instead when given: the hinge's own examples, drawn
    to a pool as ``forget`` is; on ``retain`` too when a retain hinge is on; cached per anchor under ``cache_dir``)
    and the pool drawn from ``forget`` (:func:`polish_pool`). Add a check, monitors or a hook with
    :func:`dataclasses.replace`, built on its ``pool``."""
    if cfg.margin_anchor not in anchors:
        raise InputError(f"margin_anchor {cfg.margin_anchor!r} needs that model; available: {sorted(anchors)}")
    anchor, anchor_id = anchors[cfg.margin_anchor]
    hinge = polish_pool(hinge, cfg.n_pool, cfg.train.seed) if hinge is not None else None
    tables = anchor_tables(anchor, anchor_id, hinge if hinge is not None else forget, pad_id, cache_dir)
    retain_tables = anchor_tables(anchor, anchor_id, retain, pad_id, cache_dir) if cfg.retain_hinge_weight > 0 else None
    pool = polish_pool(forget, cfg.n_pool, cfg.train.seed)
    return PolishInput(method, cfg, anchor, tables, pool, retain, probe, pad_id, retain_tables, hinge=hinge)


def polish(model: torch.nn.Module, inp: PolishInput, merge: bool = True) -> tuple[torch.nn.Module, TrainResult]:
    """θ̂_MC: LoRA polish of ``model`` on ``inp``. ``model`` is consumed: the adapter is attached to it in place (no
    copy, so no second full model in memory); pass a copy to keep it. ``merge=False`` returns the unmerged peft model
    (to save only the adapter).

    With ``cfg.stop_delta`` and no monitors, ``inp.check`` (:func:`margincal.training.monitors.delta_check` on the
    pool's held-out records) stops the run at the Δ target. ``inp.monitors`` (with ``cfg.monitor``) run every
    ``cfg.monitor.every`` steps and at the start; with ``cfg.control`` they move λ_KL, stop and select the released step
    (:class:`margincal.training.controller.MonitorHook`); the result's ``trace`` holds their rows.
    """
    cfg, method = inp.cfg, inp.method
    splits = {"forget": inp.pool, "retain": inp.retain, "probe": inp.probe, "hinge": inp.hinge}
    sizes = {
        "forget": cfg.train.batch_size,
        "retain": cfg.retain_batch_size,
        "probe": cfg.probe_batch_size,
        "hinge": cfg.train.batch_size,
    }
    needs_retain = cfg.retain_hinge_weight > 0 and "retain" not in method.native_streams
    names = [*method.native_streams, *(["retain"] if needs_retain else []), *(["probe"] if cfg.kl_weight > 0 else [])]
    if inp.hinge is not None:
        names.append("hinge")
    stream = zip_streams({n: splits[n] for n in names}, sizes, inp.pad_id, cfg.train.seed)
    hooks = [inp.hook] if inp.hook is not None else []
    interval, steps, kl = cfg.check_every, cfg.train.steps, Multiplier(cfg.kl_weight)
    watcher = None
    if cfg.monitor is not None:
        if inp.monitors is None:
            raise ValueError(
                "MC monitors (monitor / control) need their samples (margincal.training.monitors.Monitors)"
            )
        control = cfg.control if cfg.stop_delta is None else delta_stop(cfg.stop_delta)
        select = cfg.control.select if cfg.control is not None else "last"
        watcher = MonitorHook(inp.monitors, cfg.monitor.every, steps, select, control, kl if cfg.control else None)
    elif cfg.stop_delta is not None:
        if inp.check is None:
            raise ValueError("Δ-stop (stop_delta) needs the reference margin m_ref and its Δ check (delta_check)")
        watcher = MonitorHook(inp.check.row, cfg.check_every, steps, "last", delta_stop(cfg.stop_delta))
    if watcher is not None:
        interval = math.gcd(interval, watcher.every)
        hooks = [every(h, cfg.check_every, steps) for h in hooks] + [watcher]
    inp.anchor.eval()
    hinge_stream = "hinge" if inp.hinge is not None else "forget"
    objective = mc_objective(method, inp.anchor, inp.tables, cfg, inp.retain_tables, kl, hinge_stream)
    polished, result = train(
        model,
        watcher.observe(objective) if watcher is not None else objective,
        stream,
        cfg.train,
        desc=f"MC {method.name}",
        hook=chain_hooks(hooks) if hooks else None,
        hook_every=interval,
        hook_at_start=watcher is not None,
        on_step=method.on_optimizer_step,
    )
    if watcher is not None:
        watcher.conclude(polished, result)
    return (merge_lora(polished) if merge else polished), result
