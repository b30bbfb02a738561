"""Run an unlearning method from the registry through the shared training loop."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from margincal.config import CONFIG_DIR, TrainConfig, build, deep_merge, read_yaml
from margincal.data.records import EncodedQA
from margincal.methods.base import UnlearningMethod, get_method
from margincal.models import clone_model, merge_lora
from margincal.scoring import LazyStats
from margincal.streams import zip_streams
from margincal.training import TrainResult, train

EXTRA_SPLITS_HELP = (
    "'env' is an auxiliary fine-tuning corpus unrelated to the forget set (e.g. GSM8K; on the mini benchmark "
    "its world_facts split), given to `margincal unlearn` with --env FILE"
)


@dataclasses.dataclass
class MethodRun:
    """One unlearning method's registry hyperparameters and training schedule."""

    hparams: dict = dataclasses.field(default_factory=dict)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    retain_batch_size: int | None = None


def method_run(name: str, overrides: dict | None = None, schedule: str = "mini", n_forget: int = 0) -> MethodRun:
    """Hyperparameters and training schedule from ``configs/methods/<name>.yaml`` plus ``overrides``.

    ``schedule``: ``mini`` (the calibrated step-based mini schedule; its section may adapt hparams) or ``paper``
    (the epoch-based paper schedule converted by :func:`paper_schedule` for ``n_forget`` forget samples)."""
    get_method(name)  # unknown names stop here with the list of registered methods
    spec = read_yaml(CONFIG_DIR / "methods" / f"{name.lower()}.yaml")
    hparams = spec.get("hparams", {})
    if schedule == "paper":
        data = {"hparams": hparams, "train": dataclasses.asdict(paper_schedule(spec["train"]["paper"], n_forget))}
    elif schedule == "mini":
        mini = {k: v for k, v in spec["train"]["mini"].items() if k != "provenance"}
        hparams = deep_merge(hparams, mini.pop("hparams", {}))
        data = {"hparams": hparams, "retain_batch_size": mini.pop("retain_batch_size", None), "train": mini}
    else:
        raise ValueError(f"unknown schedule {schedule!r}; use 'paper' or 'mini'")
    return build(MethodRun, deep_merge(data, overrides or {}))


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


def paper_schedule(paper: dict, n_forget: int) -> TrainConfig:
    """Step-based equivalent of an epoch-based paper schedule (``configs/methods/*.yaml`` ``train.paper``).

    One step sees ``per_device_batch_size × gradient_accumulation_steps`` forget samples (the effective batch;
    the loop does not accumulate, so this must fit in memory); steps = epochs × ⌈|D_f| / batch⌉.
    """
    batch = int(paper.get("per_device_batch_size", 4)) * int(paper.get("gradient_accumulation_steps", 1))
    steps = int(paper["epochs"]) * math.ceil(n_forget / batch)
    return TrainConfig(
        steps=steps,
        batch_size=batch,
        lr=float(paper["lr"]),
        weight_decay=float(paper.get("weight_decay", 0.0)),
        warmup_ratio=float(paper.get("warmup_epochs", 0)) / float(paper["epochs"]),
        scheduler="linear",
    )


def unlearn_checkpoint(
    method_name: str,
    model: str,
    forget: str | Path,
    retain: str | Path,
    out: str | Path,
    schedule: str = "paper",
    overrides: list[str] | None = None,
    max_length: int = 512,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    env: str | Path | None = None,
    template: str | None = None,
) -> dict:
    """Unlearn ``model`` (HF id or directory) on TOFU-format files and save the result (safetensors) to ``out``.

    ``schedule`` picks the ``paper`` (epoch-based, converted by :func:`paper_schedule`) or ``mini`` training
    schedule of ``configs/methods/<method>.yaml``; ``overrides`` (``hparams.beta=0.2``, ``train.lr=2e-5``,
    ``retain_batch_size=8``) adjust it. ``env`` is the auxiliary fine-tuning split a method may read (ILU's
    environment). Writes ``unlearn.json`` (config, loss trace, time, manifest) beside the model.
    """
    from margincal.config import apply_overrides
    from margincal.data.records import encode_qa, encode_records
    from margincal.data.tofu import load_qa_json
    from margincal.models import load_model, load_tokenizer, save_model
    from margincal.pipeline.store import atomic_write_json, manifest

    tok = load_tokenizer(model, template)
    enc_f = encode_records(tok, load_qa_json(forget), max_length)  # QA pairs, or raw passages chunked (MUSE)
    enc_r = encode_records(tok, load_qa_json(retain), max_length)
    run = method_run(method_name, schedule=schedule, n_forget=len(enc_f))
    data = apply_overrides(dataclasses.asdict(run), overrides or [])
    run = build(MethodRun, data)
    train_cfg = dataclasses.replace(run.train, seed=seed)
    method = get_method(method_name, **run.hparams)
    theta0 = load_model(model, dtype, device)
    start = time.perf_counter()
    extra = {"env": encode_qa(tok, load_qa_json(env), max_length)} if env is not None else None
    unlearned, result = unlearn(theta0, method, enc_f, enc_r, train_cfg, tok, run.retain_batch_size, extra)
    seconds = time.perf_counter() - start
    out = save_model(unlearned, tok, out)
    record = {
        "manifest": manifest(
            {"method": method_name, "model": model, "schedule": schedule, "env": str(env) if env else None, **data},
            seed,
        ),
        "seconds": seconds,
        "history": result.history,
    }
    atomic_write_json(out / "unlearn.json", record)
    return record
