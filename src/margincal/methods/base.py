"""The unlearning-method registry and the interface every method implements.

A method is a small dataclass of hyperparameters plus pure losses on model outputs. Every objective has the
form

    L(θ) = γ · L_forget(θ) + R(θ)

where ``forget_loss`` gives the unweighted forget term and ``retain_term`` the already-weighted retain part R
(``α·NLL_r`` by default; RMU and PDU define their own). ``batch`` maps stream names (``forget``, ``retain``) to
collated batches and ``stats`` (a :class:`LazyStats`) gives each stream's token statistics from one forward
pass. Splitting the two terms lets a defense (``methods/defenses.py``) wrap the forget term of any base method.

``prepare`` precomputes anything the loss needs from the frozen pre-unlearning model θ0 (e.g. NPO's reference
log-likelihoods), once per (θ0, forget split), or from θ_ref for a method whose ``prepares_with`` is ``ref`` (the
oracle-imitation control); ``after_step`` runs after every optimizer step of the unlearning
run (weight averaging); ``on_optimizer_step`` after every optimizer step of any run that trains the method's loss
(unlearning and MC polish: PDU's dual update); ``finish`` turns the trained model into the released one. Register
with ``@register``; a new method is one small class in its family module.
"""

from __future__ import annotations

import abc
import dataclasses
import typing
from collections.abc import Sequence
from typing import ClassVar

import torch

from margincal.config.typed import coerce
from margincal.core.errors import InputError
from margincal.core.registry import Registry
from margincal.data.records import EncodedQA
from margincal.model.scoring import LazyStats, forward_answer

METHODS: Registry[type[UnlearningMethod]] = Registry("method", "methods", fold_case=True)


class UnlearningMethod(abc.ABC):
    """Base class: subclasses are dataclasses whose fields are the method's hyperparameters.

    Subclasses declare ``gamma`` (forget weight) and, when they use the default retain term, ``alpha``.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    source: ClassVar[str]
    streams: ClassVar[tuple[str, ...]] = ("forget", "retain")
    carried: ClassVar[tuple[str, ...]] = ()  # run-time state (JSON scalars) the MC polish continues from
    prepares_with: ClassVar[str] = "theta0"  # the frozen model `prepare` reads: θ0, or θ_ref ("ref") for an oracle
    control: ClassVar[bool] = False  # a control, not an unlearning method: a panel's `methods: [all]` leaves it out
    gamma: float

    def prepare(self, reference: torch.nn.Module, forget: Sequence[EncodedQA], tokenizer) -> None:
        """Precompute reference quantities from θ0 and the tokenizer (default: nothing)."""
        return None

    def select_trainable(self, model: torch.nn.Module) -> None:
        """Restrict which parameters the unlearning run trains (default: all of them)."""
        return None

    @abc.abstractmethod
    def forget_loss(self, model: torch.nn.Module, batch: dict, stats: LazyStats) -> tuple[torch.Tensor, dict]:
        """The unweighted forget term L_forget on ``batch["forget"]`` and its log entries."""

    def retain_term(self, model: torch.nn.Module, batch: dict, stats: LazyStats) -> tuple[torch.Tensor, dict]:
        """The weighted retain part R = α·NLL_r (token-mean answer NLL); zero when ``alpha`` is 0."""
        alpha = getattr(self, "alpha", 0.0)
        if not alpha or "retain" not in self.streams:
            return torch.zeros(()), {}
        retain_nll = stats["retain"].token_mean_nll()
        return alpha * retain_nll, {"retain_nll": retain_nll.item()}

    def loss(self, model: torch.nn.Module, batch: dict, stats: LazyStats) -> tuple[torch.Tensor, dict]:
        """The training objective L = γ·L_forget + R on one step's batches."""
        forget, logs = self.forget_loss(model, batch, stats)
        retain, retain_logs = self.retain_term(model, batch, stats)
        return self.gamma * forget + retain.to(forget.device), {"forget_loss": forget.item(), **logs, **retain_logs}

    def native_loss(
        self, model: torch.nn.Module, batch: dict, stats: LazyStats, with_forget: bool = True
    ) -> tuple[torch.Tensor, dict]:
        """The loss the MC polish keeps running (strict plug-in); defenses drop their perturbations here.

        ``with_forget=False`` keeps only the retain part R (the "native forget term off", γ = 0, variant)."""
        if with_forget:
            return self.loss(model, batch, stats)
        return self.retain_term(model, batch, stats)

    @property
    def native_streams(self) -> tuple[str, ...]:
        """The streams ``native_loss`` reads (default: ``streams``)."""
        return self.streams

    def after_step(self, step: int, total: int | None, model: torch.nn.Module) -> dict | None:
        """Runs under ``no_grad`` after optimizer step ``step`` of ``total`` (1-based; ``None`` when a stop rule
        ends the run at a step not known in advance) (default: nothing)."""
        return None

    def on_optimizer_step(self) -> None:
        """Runs once after every optimizer step of a run training this method's loss (the unlearning run and the MC
        polish), i.e. after the ``grad_accum`` micro-batches the step accumulated; updates run-time state kept per
        optimizer step rather than per loss call (default: nothing)."""
        return None

    def finish(self, model: torch.nn.Module) -> torch.nn.Module:
        """The released model at the end of an unlearning run (default: the last iterate)."""
        return model

    def state(self) -> dict:
        """The run-time state of ``carried`` fields at the end of an unlearning run (saved with the checkpoint)."""
        return {name: getattr(self, name) for name in self.carried}

    def load_state(self, state: dict) -> None:
        """Continue from an unlearning run's :meth:`state` (PDU's dual variable λ); unknown keys are ignored."""
        for name in self.carried:
            if name in state:
                setattr(self, name, state[name])

    def hparams(self) -> dict:
        """The hyperparameters (dataclass fields that are not run-time state)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}


def frozen_logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """The answer logits of a frozen model (θ0, θ_ref) on one stream's ``batch``
    (:func:`margincal.model.scoring.forward_answer`), taken without gradients."""
    with torch.no_grad():
        logits, _, _, _ = forward_answer(model, batch)
    return logits


def register(cls: type[UnlearningMethod]) -> type[UnlearningMethod]:
    """Class decorator adding ``cls`` to the registry under ``cls.name`` (case-insensitive)."""
    return METHODS.add(cls.name, cls)


def method_class(name: str) -> type[UnlearningMethod]:
    """The registered class for ``name`` (case-insensitive); unknown names stop with the valid choices. The registry
    is full whenever this module is importable: importing it runs the package's ``__init__`` first, which imports
    every family module."""
    return METHODS.lookup(name)


def get_method(name: str, **hparams) -> UnlearningMethod:
    """Instantiate a registered method; unknown names and hyperparameters stop with the valid choices."""
    cls = method_class(name)
    valid = {f.name for f in dataclasses.fields(cls) if f.compare}
    unknown = sorted(set(hparams) - valid)
    if unknown:
        raise InputError(f"unknown hyperparameter(s) {unknown} for {cls.name}; valid: {sorted(valid)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: coerce(v, hints[k], f"{cls.name}.{k}") for k, v in hparams.items()})
