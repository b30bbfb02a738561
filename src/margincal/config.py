"""Typed configs (dataclasses), YAML loading and ``key=value`` overrides.

A config file is a nested YAML mapping; ``load_config(Cls, path, overrides)`` reads it, applies dotted
overrides such as ``seed=3`` or ``mc.kappa=2.0`` (values parsed as YAML scalars), and builds the
dataclass tree, rejecting unknown keys with the list of valid ones. Frozen defaults (the paper's MC
configuration) live in the dataclass defaults and are restated in ``configs/mc.yaml``; a test keeps the
two identical.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

CONFIG_DIR = Path(os.environ.get("MARGINCAL_CONFIGS", Path(__file__).resolve().parents[2] / "configs"))


@dataclasses.dataclass
class LoraSpec:
    """LoRA adapter shape (peft ``LoraConfig``)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = dataclasses.field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclasses.dataclass
class TrainConfig:
    """One optimisation run of the shared training loop (AdamW + schedule + clipping + NaN guard)."""

    steps: int = 100
    batch_size: int = 8
    lr: float = 1e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.0
    scheduler: str = "linear"  # linear | cosine | constant (transformers.get_scheduler names)
    max_grad_norm: float = 1.0
    lora: LoraSpec | None = None  # None = full-parameter training
    seed: int = 0
    # memory/speed only (the objective is unchanged): activation recomputation, and the optimizer implementation
    gradient_checkpointing: bool = False
    optimizer: str = "adamw"  # adamw | adamw_8bit | paged_adamw_8bit | paged_adamw_32bit (the last three: bitsandbytes)


@dataclasses.dataclass
class MCConfig:
    """Margin Calibration polish (paper Sec. 3.4 and 4.1); defaults are the frozen configuration.

    The paper fixes (κ, λ_KL, r, N_pol) = (5.0, 0.05, 32, 200) and 80 single-sample optimizer steps, and
    gives no learning rate or LoRA alpha. ``lr`` and ``lora.alpha`` are our choices (documented in
    configs/mc.yaml).
    """

    kappa: float = 5.0
    kl_weight: float = 0.05
    n_pool: int = 200
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=80,
            batch_size=1,
            lr=1e-4,
            warmup_ratio=0.0,
            scheduler="constant",
            lora=LoraSpec(r=32, alpha=32),
        )
    )
    probe_batch_size: int = 1
    retain_batch_size: int = 1  # retain samples per step for the native loss's retain term
    # variant switches (margincal.polish.MC_VARIANTS names the paper's presets); defaults = reference-anchored MC
    margin_anchor: str = "ref"  # ref (θ_mar = θ_anc = θ_ref) | theta0 (deployment)
    forget_term: str = "hinge"  # hinge | ascent (GradAscent polish)
    token_weights: str = "uniform"  # uniform | soft_entropy | top8 | ref_gate
    retain_hinge_weight: float = 0.0  # λ_r of the retain-side hinge (two-sided / deployment: 1.0)
    native_forget: bool = True  # false: native forget term off (γ = 0)
    stop_delta: float | None = None  # Δ-stop: stop once Δ on a held-out check batch ≤ this target
    stop_batch: int = 16  # Δ-stop check batch size (forget samples outside the polish pool)
    check_every: int = 10  # steps between Δ-stop checks / trace rows


@dataclasses.dataclass
class AttackConfig:
    """Relearn attack: fine-tune on D_rel ⊂ D_f (|D_rel| = k, seeded), evaluate on D_f \\ D_rel."""

    name: str = "lora"  # lora | fpft | soft_prompt | adaptive | linear_probe (margincal.attacks)
    k: int = 20
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=20, batch_size=10, lr=1e-4, scheduler="constant", lora=LoraSpec(r=8, alpha=16)
        )
    )
    n_soft: int = 20  # soft_prompt: virtual tokens
    beta: float = 120.0  # adaptive: inverse temperature of the smoothed margin m_β


@dataclasses.dataclass
class EvalConfig:
    """Evaluation settings: greedy decoding length and batch sizes."""

    max_new_tokens: int = 48
    batch_size: int = 32
    retain_eval_n: int = 100  # retain samples scored/generated (TOFU evaluates a 400-sample retain subset)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _unwrap_optional(tp: Any) -> Any:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def build(cls: type[T], data: dict | None, path: str = "") -> T:
    """Build dataclass ``cls`` from a nested dict, recursing into dataclass-typed fields."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = path or cls.__name__
        raise ValueError(f"unknown config key(s) {unknown} in {where}; valid keys: {sorted(names)}")
    kwargs = {}
    for name, value in data.items():
        tp = _unwrap_optional(hints[name])
        if _is_dataclass_type(tp) and isinstance(value, dict):
            default = _default_of(cls, name)
            merged = deep_merge(dataclasses.asdict(default) if default is not None else {}, value)
            kwargs[name] = build(tp, merged, f"{path}.{name}" if path else name)
        else:
            kwargs[name] = coerce(value, tp, f"{path}.{name}" if path else name)
    return cls(**kwargs)


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert YAML scalars to a numeric field's type (YAML 1.1 reads ``1e-4`` as a string)."""
    if tp is float and isinstance(value, str | int) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError as err:
            raise ValueError(f"config key {where} expects a number, got {value!r}") from err
    if tp is int and isinstance(value, str):
        try:
            return int(value)
        except ValueError as err:
            raise ValueError(f"config key {where} expects an integer, got {value!r}") from err
    return value


def _default_of(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


def deep_merge(base: dict, update: dict) -> dict:
    """Recursive dict merge: ``update`` wins, nested mappings are merged key by key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a nested dict (values parsed with ``yaml.safe_load``)."""
    out = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {part!r} is not a mapping")
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from err


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Read YAML (optional), apply overrides, build the typed config."""
    data = read_yaml(path) if path is not None else {}
    return build(cls, apply_overrides(data, overrides or []))


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)
