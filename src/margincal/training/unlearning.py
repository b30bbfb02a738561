"""Run an unlearning method from the registry through the shared training loop."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from margincal.config.settings import PlateauStop, TrainConfig
from margincal.core.errors import InputError
from margincal.data.records import EncodedQA
from margincal.methods.base import UnlearningMethod
from margincal.model.loading import clone_model, merge_lora
from margincal.model.scoring import LazyStats
from margincal.training.controller import MonitorHook
from margincal.training.loop import TrainResult, chain_hooks, train
from margincal.training.streams import zip_streams

EXTRA_SPLITS_HELP = (
    "'env' is an auxiliary fine-tuning corpus unrelated to the forget set (e.g. GSM8K; on the mini benchmark "
    "its world_facts split), given to `margincal unlearn` with --env FILE"
)


def method_objective(method: UnlearningMethod):
    """Adapt a method's ``loss(model, batch, stats)`` to the training loop's objective signature."""

    def objective(model, batch):
        return method.loss(model, batch, LazyStats(model, batch))

    return objective


def epoch_steps(n_forget: int, cfg: TrainConfig) -> int:
    """Optimizer steps per pass over D_f: ⌈|D_f| / (batch_size · grad_accum)⌉ (the plateau rule's epoch)."""
    return math.ceil(n_forget / (cfg.batch_size * cfg.grad_accum))


def plateau_rule(rule: PlateauStop, epoch_steps: int) -> Callable[[list[dict]], bool]:
    """The training loop's stop rule for :class:`~margincal.config.settings.PlateauStop`: true at the end of the first
    epoch e ≥ ``rule.min_epochs`` with L̄_{e−1} − L̄_e ≤ ``rule.tol`` · |L̄_1 − L̄_e| (L̄ the epoch-mean ``loss``)."""

    def reached(history: list[dict]) -> bool:
        if len(history) % epoch_steps or len(history) < rule.min_epochs * epoch_steps:
            return False
        means = [
            sum(r["loss"] for r in history[i : i + epoch_steps]) / epoch_steps
            for i in range(0, len(history), epoch_steps)
        ]
        return means[-2] - means[-1] <= rule.tol * abs(means[0] - means[-1])

    return reached


def unlearn(
    theta0: torch.nn.Module,
    method: UnlearningMethod,
    forget: Sequence[EncodedQA],
    retain: Sequence[EncodedQA],
    cfg: TrainConfig,
    tokenizer,
    retain_batch_size: int | None = None,
    extra: Mapping[str, Sequence[EncodedQA]] | None = None,
    stop: PlateauStop | None = None,
    monitors: Callable[[torch.nn.Module], dict] | None = None,
    monitor_every: int = 0,
    select: str = "last",
    teacher: torch.nn.Module | None = None,
) -> tuple[torch.nn.Module, TrainResult]:
    """θ̂ = method applied to a copy of θ0 (θ0 itself is left untouched and serves as the reference; ``teacher``,
    when given, is the frozen model the method's ``prepare`` reads instead: θ_ref for the oracle-imitation control).

    Forget batches have ``cfg.batch_size`` samples; retain batches ``retain_batch_size`` (default: the same);
    ``extra`` holds further named splits a method reads (ILU's ``env``), batched like forget. The method's
    ``after_step`` and ``on_optimizer_step`` run after every optimizer step and its ``finish`` gives the released
    model. ``stop``: end at a plateau of the native loss (epochs of ⌈|D_f| / (batch_size · grad_accum)⌉ steps),
    ``cfg.steps`` the cap. ``monitors`` (:class:`margincal.training.monitors.Monitors`) run at the start and every
    ``monitor_every`` steps; ``select`` names the criterion (:data:`margincal.training.controller.CRITERIA`) of the
    released step, ``last`` by default. The method's ``finish`` applies to the selected parameters, and its carried
    state is the last step's.
    """
    splits = {"forget": forget, "retain": retain, **(extra or {})}
    missing = [s for s in method.streams if not splits.get(s)]
    if missing:
        raise InputError(f"{method.name} needs the split(s) {missing}; {EXTRA_SPLITS_HELP}")
    method.prepare(theta0 if teacher is None else teacher, forget, tokenizer)
    sizes = {s: cfg.batch_size for s in splits} | {"retain": retain_batch_size or cfg.batch_size}
    stream = zip_streams({s: splits[s] for s in method.streams}, sizes, tokenizer.pad_token_id, cfg.seed)
    model = clone_model(theta0)
    method.select_trainable(model)
    hooks = [lambda step, m: method.after_step(step, None if stop else cfg.steps, m) if step else None]
    watcher = None
    if monitors is not None:
        watcher = MonitorHook(monitors, monitor_every, cfg.steps, select)
        hooks.append(watcher)
    elif select != "last":
        raise InputError(f"selecting the {select!r} step needs monitors (MethodRun.monitor)")
    model, result = train(
        model,
        method_objective(method),
        stream,
        cfg,
        desc=f"unlearn {method.name}",
        hook=chain_hooks(hooks),
        hook_every=1,
        hook_at_start=watcher is not None,
        stop_rule=plateau_rule(stop, epoch_steps(len(forget), cfg)) if stop else None,
        on_step=method.on_optimizer_step,
    )
    if watcher is not None:
        watcher.conclude(model, result)
    return merge_lora(method.finish(model)), result
