"""The unlearning-method registry and the interface every method implements.

A method is a small dataclass of hyperparameters plus a pure loss on model outputs:
``loss(model, batch) -> (loss, logs)`` where ``batch`` maps stream names (``forget``, ``retain``) to
collated batches. ``prepare`` precomputes anything the loss needs from the frozen pre-unlearning model θ0
(e.g. NPO's reference log-likelihoods), once per (θ0, forget split). Register with ``@register``; a new
method is one small class in the family module.
"""

from __future__ import annotations

import abc
import dataclasses
import typing
from collections.abc import Sequence
from typing import ClassVar

import torch

from margincal.config import coerce
from margincal.data.records import EncodedQA
from margincal.scoring import LazyStats

METHODS: dict[str, type[UnlearningMethod]] = {}


class UnlearningMethod(abc.ABC):
    """Base class: subclasses are dataclasses whose fields are the method's hyperparameters."""

    name: ClassVar[str]
    family: ClassVar[str]
    source: ClassVar[str]
    streams: ClassVar[tuple[str, ...]] = ("forget", "retain")

    def prepare(self, reference: torch.nn.Module, forget: Sequence[EncodedQA], pad_id: int) -> None:
        """Precompute reference quantities from θ0 (default: nothing)."""
        return None

    def select_trainable(self, model: torch.nn.Module) -> None:
        """Restrict which parameters the unlearning run trains (default: all of them)."""
        return None

    @abc.abstractmethod
    def loss(self, model: torch.nn.Module, batch: dict[str, dict], stats: LazyStats) -> tuple[torch.Tensor, dict]:
        """The method's objective on one step's batches; ``stats[stream]`` gives (cached) token statistics."""

    def hparams(self) -> dict:
        return dataclasses.asdict(self)


def register(cls: type[UnlearningMethod]) -> type[UnlearningMethod]:
    """Class decorator adding ``cls`` to the registry under ``cls.name`` (case-insensitive)."""
    key = cls.name.lower()
    if key in METHODS:
        raise ValueError(f"method {cls.name!r} is registered twice")
    METHODS[key] = cls
    return cls


def get_method(name: str, **hparams) -> UnlearningMethod:
    """Instantiate a registered method; unknown names and hyperparameters stop with the valid choices."""
    from margincal import methods as _  # noqa: F401  (imports the family modules, filling the registry)

    cls = METHODS.get(name.lower())
    if cls is None:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(hparams) - valid)
    if unknown:
        raise ValueError(f"unknown hyperparameter(s) {unknown} for {cls.name}; valid: {sorted(valid)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: coerce(v, hints[k], f"{cls.name}.{k}") for k, v in hparams.items()})
