"""The one training loop, shared by model building, unlearning, MC polish and relearn attacks.

``train(model, objective, stream, cfg)`` runs ``cfg.steps`` AdamW steps (full-parameter, or LoRA via
peft when ``cfg.lora`` is set), each over ``cfg.grad_accum`` accumulated micro-batches, with a ``transformers``
schedule, gradient clipping, a non-finite-loss guard that stops with a clear error, seeded initialisation and a tqdm
progress bar. On a GPU it can trade compute for memory (``gradient_checkpointing``) and use bitsandbytes' 8-bit / paged
AdamW (``optimizer``), which is what lets an 8B full-parameter attack fit one 80 GB GPU; CUDA AdamW runs fused. An
*objective* maps ``(model, step_batch) -> (loss, logs)``; a *stream* yields one ``step_batch`` (any structure the
objective understands, usually ``{"forget": batch, "retain": batch, ...}``) per step. Every step's row (loss, its terms,
gradient norm, learning rate, the hook's monitors) also goes to :func:`margincal.training.curves.emit` (TensorBoard
under ``report_to=tensorboard``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from margincal.config.settings import LoraSpec, TrainConfig
from margincal.core.errors import InputError, NonFiniteLossError, require
from margincal.model.scoring import answer_token_stats
from margincal.store.costs import add_tokens
from margincal.training import curves

log = logging.getLogger(__name__)
PROGRESS_SECONDS = 20.0  # without a terminal (CI logs, nohup): one progress line this often

Objective = Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict]]
StepHook = Callable[[int, torch.nn.Module], dict | None]


@dataclass
class TrainResult:
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    stopped_at: int | None = None  # the step an early-stopping hook ended training at
    trace: list[dict] = field(default_factory=list)  # monitor rows (margincal.training.controller.MonitorHook)
    selected: int | None = None  # the monitored step whose parameters were released (None: the last)
    reference_auc: dict[str, float] | None = None  # θ_ref's membership AUCs on the monitors' samples

    def last(self, key: str) -> float | None:
        for row in reversed(self.history):
            if key in row:
                return row[key]
        return None


def attach_lora(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """Wrap ``model`` with a fresh LoRA adapter (base weights frozen)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


BNB_OPTIMIZERS = {
    "adamw_8bit": "AdamW8bit",
    "paged_adamw_8bit": "PagedAdamW8bit",
    "paged_adamw_32bit": "PagedAdamW32bit",
}


def make_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (``torch``; fused on CUDA) or one of bitsandbytes' 8-bit / paged AdamW implementations."""
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=params[0].is_cuda)
    if cfg.optimizer not in BNB_OPTIMIZERS:
        raise InputError(f"unknown optimizer {cfg.optimizer!r}; use adamw or one of {sorted(BNB_OPTIMIZERS)}")
    bnb = require("bitsandbytes", f"the optimizer {cfg.optimizer}", "pip install 'bitsandbytes>=0.50'")
    return getattr(bnb.optim, BNB_OPTIMIZERS[cfg.optimizer])(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Turn activation checkpointing on (non-reentrant, cache off) or back off (cache on for generation)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "activation_checkpointing_enable"):  # transformers 5 names
        prefix, kwargs = "activation_checkpointing", {"activation_checkpointing_kwargs": {"use_reentrant": False}}
    elif hasattr(base, "gradient_checkpointing_enable"):
        prefix, kwargs = "gradient_checkpointing", {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    else:
        return
    if on:
        getattr(base, f"{prefix}_enable")(**kwargs)
        base.config.use_cache = False
    elif getattr(base, f"is_{prefix}"):
        getattr(base, f"{prefix}_disable")()
        base.config.use_cache = True


def nll_objective(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    """Fine-tuning loss: mean answer-token NLL over the batch (model building and relearn attacks)."""
    loss = answer_token_stats(model, batch).token_mean_nll()
    return loss, {"nll": loss.item()}


def attended_tokens(batch) -> int:
    """The tokens a (possibly nested) batch attends to: the sum of every ``attention_mask`` in it."""
    if isinstance(batch, dict):
        if "attention_mask" in batch and isinstance(batch["attention_mask"], torch.Tensor):
            return int(batch["attention_mask"].sum())
        return sum(attended_tokens(v) for v in batch.values())
    return 0


def _accumulate(model, objective: Objective, stream, n: int, desc: str, step: int, lr: float):
    """Forward and backward ``n`` micro-batches; the gradient is that of their mean loss. Returns the mean loss and
    the mean of each numeric log entry (the last micro-batch's value for other entries)."""
    total, rows = 0.0, []
    for _ in range(n):
        batch = next(stream)
        add_tokens(attended_tokens(batch))
        loss, logs = objective(model, batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"{desc}: loss is {loss.item()} at step {step}; nothing was saved. "
                f"Lower the learning rate (lr={lr}) or check the inputs."
            )
        (loss / n if n > 1 else loss).backward()
        total += loss.item()
        rows.append(logs)
    if n == 1:
        return loss, logs
    logs = {k: sum(r.get(k, v) for r in rows) / n if isinstance(v, float) else v for k, v in rows[-1].items()}
    return torch.tensor(total / n), logs


def chain_hooks(hooks: list[StepHook]) -> StepHook:
    """One hook running ``hooks`` in order and merging their log dicts (``stop`` if any asks for it)."""

    def hook(step: int, model) -> dict:
        out: dict = {}
        for h in hooks:
            row = h(step, model) or {}
            stop = out.get("stop", False) or row.get("stop", False)
            scalars = {**out.get("curves", {}), **row.get("curves", {})}
            out.update(row)
            out["stop"] = stop
            if scalars:
                out["curves"] = scalars
        return out

    return hook


def every(hook: StepHook, n: int, last: int) -> StepHook:
    """``hook`` run only at step 0 and at multiples of ``n`` or ``last`` (hooks called at a finer interval)."""

    def wrapped(step: int, model) -> dict | None:
        return hook(step, model) if step == 0 or step % n == 0 or step == last else None

    return wrapped


def _prepared(model: torch.nn.Module, cfg: TrainConfig, desc: str):
    """What a run trains and with what: ``model`` (with its LoRA adapter where ``cfg.lora`` asks for one), its
    trainable parameters, the optimizer and the learning-rate schedule over ``cfg.steps``; gradient checkpointing on
    where asked. Stops on a model with nothing to train and on ``grad_accum`` below 1."""
    if cfg.grad_accum < 1:
        raise InputError(f"{desc}: grad_accum must be ≥ 1, got {cfg.grad_accum}")
    if cfg.lora is not None:
        model = attach_lora(model, cfg.lora)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError(f"{desc}: the model has no trainable parameters")
    optimizer = make_optimizer(params, cfg)
    if cfg.gradient_checkpointing:
        _checkpointing(model, True)
    from transformers import get_scheduler  # imports peft (2 s): only when training

    warmup = int(cfg.warmup_ratio * cfg.steps)
    scheduler = get_scheduler(cfg.scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=cfg.steps)
    return model, params, optimizer, scheduler


def train(
    model: torch.nn.Module,
    objective: Objective,
    stream: Iterator[dict],
    cfg: TrainConfig,
    desc: str = "train",
    hook: StepHook | None = None,
    hook_every: int = 0,
    hook_at_start: bool = False,
    stop_rule: Callable[[list[dict]], bool] | None = None,
    on_step: Callable[[], None] | None = None,
) -> tuple[torch.nn.Module, TrainResult]:
    """Optimise ``objective`` for ``cfg.steps`` steps; returns the (possibly LoRA-wrapped) model and logs.

    ``hook(step, model)`` runs every ``hook_every`` steps (and after the last) under ``no_grad``; its
    returned dict is merged into that step's log row (used by tracing/instrumentation), except its ``curves``
    entry (scalars for :mod:`margincal.training.curves` alone, such as the monitors' Δ), and a true ``stop`` entry ends
    training after that step (early stopping). ``hook_at_start`` also runs it once as ``hook(0, model)``
    before the first step (instruments that need the starting point). ``stop_rule(history)`` is asked after every
    step and a true answer ends training there (the plateau rule of :func:`margincal.training.unlearning.plateau_rule`).
    ``on_step()`` is called right after every optimizer step, once per ``cfg.grad_accum`` objective calls (the
    objective's per-optimizer-step bookkeeping, e.g. :meth:`UnlearningMethod.on_optimizer_step`).
    """
    torch.manual_seed(cfg.seed)
    model, params, optimizer, scheduler = _prepared(model, cfg, desc)
    result = TrainResult()
    start, run = time.perf_counter(), curves.begin(desc)
    logged = start
    if hook is not None and hook_at_start:
        model.eval()
        with torch.no_grad():
            curves.emit(run, 0, (hook(0, model) or {}).get("curves", {}))
    model.train()
    terminal = sys.stderr.isatty()
    bar = tqdm(range(cfg.steps), desc=desc, leave=False, disable=not terminal)
    for step in bar:
        optimizer.zero_grad(set_to_none=True)
        loss, logs = _accumulate(model, objective, stream, cfg.grad_accum, desc, step, cfg.lr)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        if not math.isfinite(grad_norm.item()):
            raise NonFiniteLossError(f"{desc}: gradient norm is {grad_norm.item()} at step {step}; nothing was saved.")
        lr = scheduler.get_last_lr()[0]  # the rate this step's update used
        optimizer.step()
        scheduler.step()
        if on_step is not None:
            on_step()
        row = {"step": step, "loss": loss.item(), "grad_norm": grad_norm.item(), **logs}
        if hook is not None and hook_every and ((step + 1) % hook_every == 0 or step + 1 == cfg.steps):
            model.eval()
            with torch.no_grad():
                row.update(hook(step + 1, model) or {})
            model.train()
        scalars = {**{k: v for k, v in row.items() if k not in ("step", "curves")}, "lr": lr, **row.pop("curves", {})}
        result.history.append(row)
        curves.emit(run, step + 1, scalars)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if not terminal and time.perf_counter() - logged >= PROGRESS_SECONDS:  # a log line instead of the bar
            logged = time.perf_counter()
            log.info("%s: step %d/%d, loss %.4f, %.0f s", desc, step + 1, cfg.steps, loss.item(), logged - start)
        if row.pop("stop", False) or (stop_rule is not None and stop_rule(result.history)):
            result.stopped_at = step + 1
            break
    model.eval()
    if cfg.gradient_checkpointing:
        _checkpointing(model, False)
    result.seconds = time.perf_counter() - start
    return model, result
