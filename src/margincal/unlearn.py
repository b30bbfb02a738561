"""Run an unlearning method from the registry through the shared training loop."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from margincal.config import TrainConfig
from margincal.data.records import EncodedQA
from margincal.methods.base import UnlearningMethod
from margincal.models import clone_model, merge_lora
from margincal.scoring import LazyStats
from margincal.streams import zip_streams
from margincal.training import TrainResult, train


def method_objective(method: UnlearningMethod):
    """Adapt a method's ``loss(model, batch, stats)`` to the training loop's objective signature."""

    def objective(model, batch):
        return method.loss(model, batch, LazyStats(model, batch))

    return objective


def unlearn(
    theta0: torch.nn.Module,
    method: UnlearningMethod,
    forget: Sequence[EncodedQA],
    retain: Sequence[EncodedQA],
    cfg: TrainConfig,
    pad_id: int,
    retain_batch_size: int | None = None,
) -> tuple[torch.nn.Module, TrainResult]:
    """θ̂ = method applied to a copy of θ0 (θ0 itself is left untouched and serves as the reference).

    Forget batches have ``cfg.batch_size`` samples; retain batches ``retain_batch_size`` (default: the same).
    """
    method.prepare(theta0, forget, pad_id)
    splits = {"forget": forget, "retain": retain}
    sizes = {"forget": cfg.batch_size, "retain": retain_batch_size or cfg.batch_size}
    stream = zip_streams({s: splits[s] for s in method.streams}, sizes, pad_id, cfg.seed)
    model = clone_model(theta0)
    method.select_trainable(model)
    model, result = train(model, method_objective(method), stream, cfg, desc=f"unlearn {method.name}")
    return merge_lora(model), result
