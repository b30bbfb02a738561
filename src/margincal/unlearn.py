"""Run an unlearning method from the registry through the shared training loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from margincal.config import TrainConfig
from margincal.data.records import EncodedQA
from margincal.methods.base import UnlearningMethod
from margincal.models import clone_model, merge_lora
from margincal.scoring import LazyStats
from margincal.streams import zip_streams
from margincal.training import TrainResult, train

EXTRA_SPLITS_HELP = (
    "'env' is an auxiliary fine-tuning corpus unrelated to the forget set (e.g. GSM8K; on the mini benchmark "
    "its world_facts split), given to `margincal unlearn` with --env FILE"
)


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
    tokenizer,
    retain_batch_size: int | None = None,
    extra: Mapping[str, Sequence[EncodedQA]] | None = None,
) -> tuple[torch.nn.Module, TrainResult]:
    """θ̂ = method applied to a copy of θ0 (θ0 itself is left untouched and serves as the reference).

    Forget batches have ``cfg.batch_size`` samples; retain batches ``retain_batch_size`` (default: the same);
    ``extra`` holds further named splits a method reads (ILU's ``env``), batched like forget. The method's
    ``after_step`` runs after every optimizer step and its ``finish`` gives the released model.
    """
    splits = {"forget": forget, "retain": retain, **(extra or {})}
    missing = [s for s in method.streams if not splits.get(s)]
    if missing:
        raise ValueError(f"{method.name} needs the split(s) {missing}; {EXTRA_SPLITS_HELP}")
    method.prepare(theta0, forget, tokenizer)
    sizes = {s: cfg.batch_size for s in splits} | {"retain": retain_batch_size or cfg.batch_size}
    stream = zip_streams({s: splits[s] for s in method.streams}, sizes, tokenizer.pad_token_id, cfg.seed)
    model = clone_model(theta0)
    method.select_trainable(model)
    model, result = train(
        model,
        method_objective(method),
        stream,
        cfg,
        desc=f"unlearn {method.name}",
        hook=lambda step, m: method.after_step(step, cfg.steps, m),
        hook_every=1,
    )
    return merge_lora(method.finish(model)), result
