"""Typed configs (dataclasses) and the one config resolution.

Every stage setting is resolved here, in one layering order, into a typed config:

    dataclass defaults  →  shipped YAML (configs/…)  →  panel file  →  ``key=value`` overrides

The dataclasses are the only source of defaults; the shipped YAML files hold overrides with their provenance
(``configs/mc.yaml``, ``configs/methods/<name>.yaml``, ``configs/attacks.yaml`` presets, ``configs/benchmarks``).
:func:`resolve_method`, :func:`resolve_mc`, :func:`resolve_attack` and :func:`resolve_benchmark` are the only
readers of those files; the single-stage CLI commands and the panel cells both call them. Dotted overrides
(``mc.kappa=2.0``) are parsed as YAML scalars; unknown keys stop with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

CONFIG_DIR = Path(os.environ.get("MARGINCAL_CONFIGS", Path(__file__).resolve().parent / "configs"))


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
    # memory/speed only: activation recomputation, and the optimizer implementation
    gradient_checkpointing: bool = False
    # micro-batches of ``batch_size`` per optimizer step; the step's loss is their mean (effective batch
    # batch_size × grad_accum in the memory of one micro-batch)
    grad_accum: int = 1
    optimizer: str = "adamw"  # adamw | adamw_8bit | paged_adamw_8bit | paged_adamw_32bit (the last three: bitsandbytes)

    def __post_init__(self) -> None:
        """Ranges a run cannot work outside of (checked when the config is built, before any model is loaded)."""
        for name in ("steps", "batch_size", "grad_accum"):
            _require(name, getattr(self, name), getattr(self, name) >= 1, "an integer ≥ 1")
        _require("lr", self.lr, math.isfinite(self.lr) and self.lr > 0, "a positive number")
        _require("weight_decay", self.weight_decay, self.weight_decay >= 0, "≥ 0")
        _require("warmup_ratio", self.warmup_ratio, 0 <= self.warmup_ratio <= 1, "in [0, 1]")
        _require("max_grad_norm", self.max_grad_norm, self.max_grad_norm > 0, "a positive number")
        _require("scheduler", self.scheduler, self.scheduler in SCHEDULERS, f"one of {', '.join(SCHEDULERS)}")
        _require("optimizer", self.optimizer, self.optimizer in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}")


SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial")
OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")


def _require(name: str, value: Any, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {what}, got {value!r}")


@dataclasses.dataclass
class MCConfig:
    """Margin Calibration polish (paper Sec. 3.4 and 4.1); defaults are the frozen configuration.

    The paper fixes (κ, λ_KL, r, N_pol) = (5.0, 0.05, 32, 200) and 80 single-sample optimizer steps, and
    gives no learning rate or LoRA alpha. ``lr`` = 1e-4 (constant) and ``lora.alpha`` = r = 32 (LoRA scale 1) are
    our choices for real-scale models (provenance in configs/mc.yaml); AdamW, weight decay 0.01, clipping at 1.0.
    """

    kappa: float = 5.0
    kl_weight: float = 0.05
    n_pool: int = 200
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=80, batch_size=1, lr=1e-4, warmup_ratio=0.0, scheduler="constant", lora=LoraSpec(r=32, alpha=32)
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
    stop_batch: int = 16  # Δ-stop check batch: evaluation forget records outside the polish pool, encoded as evaluated
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
class EvalSettings:
    """Evaluation settings of every evaluate/attack stage (decoding length and splits come from the benchmark)."""

    batch_size: int = 32  # scoring and gradnorm batches
    generation_batch_size: int = 128  # greedy decoding rows per batch (measured: 1.5x faster than 32 at 100M on CPU)
    gradnorm: bool = True  # the gradient-norm MIA detector (per-sample gradient norms, batched)
    mmlu: str | None = None  # None | local (offline multiple-choice set) | mmlu (lm-eval, hub access)


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark's evaluation protocol (``configs/benchmarks/<name>.yaml``): data source, splits and their roles,
    and how the evaluator of its ``kind`` scores them.

    ``splits``/``train_splits`` map roles to split names (``{tier}``, ``{pct}``, ``{retain_pct}`` are filled per
    tier); a ``train_splits`` entry may instead be a sampled corpus ``{source, name, n}`` (the probe D_a, ILU's
    environment). ``few_shot``: each QA role ``r`` is prompted with the pairs of role ``r_icl`` before the
    question (MUSE knowmem). ``rouge``: the headline ROUGE-L (``recall``, TOFU; ``f1``, MUSE). ``aggregate``: of the
    margin diagnostic m(D) (``mean``, TOFU; ``median``, MUSE).
    """

    name: str
    kind: str  # tofu | muse: which evaluator
    splits: dict
    train_splits: dict
    source: str | None = None  # HF dataset id or local directory; None: the mini benchmark, generated in-process
    aggregate: str = "mean"
    rouge: str = "recall"
    few_shot: bool = False
    max_length: int = 512
    max_new_tokens: int = 200
    stop: tuple[str, ...] = ()
    retain_n: int | None = None  # a seeded subset of the retain split (None: all of it)

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        for field, value, allowed in (
            ("kind", self.kind, ("tofu", "muse")),
            ("rouge", self.rouge, ("recall", "f1")),
            ("aggregate", self.aggregate, ("mean", "median")),
        ):
            if value not in allowed:
                raise ValueError(f"benchmark {self.name}: {field} must be one of {allowed}, got {value!r}")


@dataclasses.dataclass
class PlateauStop:
    """Stop unlearning at a plateau of the method's own (native) loss, ``train.steps`` being the cap.

    An epoch is ⌈|D_f| / batch_size⌉ steps and L̄_e the mean native loss of epoch e. Training stops at the end of the
    first epoch e ≥ ``min_epochs`` whose improvement is a small share of the improvement so far:
    L̄_{e−1} − L̄_e ≤ ``tol`` · |L̄_1 − L̄_e|. Scale-free, so it serves losses near zero (NPO) and unbounded ones
    (GradDiff, which never meets it and runs to the cap). Use it with a constant learning rate: a decaying schedule
    makes any loss flatten."""

    tol: float = 0.05
    min_epochs: int = 3

    def __post_init__(self) -> None:
        _require("tol", self.tol, 0 < self.tol < 1, "in (0, 1)")
        _require("min_epochs", self.min_epochs, self.min_epochs >= 2, "an integer ≥ 2")


@dataclasses.dataclass
class MethodRun:
    """One unlearning method's registry hyperparameters and training schedule (``stop``: an optional plateau rule)."""

    name: str = ""
    hparams: dict = dataclasses.field(default_factory=dict)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    retain_batch_size: int | None = None
    stop: PlateauStop | None = None


# MC variant presets: sets of MCConfig switches (paper appendices on the entropy-weighted and reference-gated hinges,
# the stopping-rule sweep and the ablation matrix).
MC_VARIANTS: dict[str, dict] = {
    "reference": {},
    "deployment": {"margin_anchor": "theta0", "kl_weight": 0.0, "retain_hinge_weight": 1.0},
    "forget_only": {"kl_weight": 0.0},
    "two_sided": {"kl_weight": 0.0, "retain_hinge_weight": 1.0},
    "gradascent": {"forget_term": "ascent", "kl_weight": 0.0},
    "soft_entropy": {"token_weights": "soft_entropy"},
    "top8": {"token_weights": "top8"},
    "ref_gate": {"token_weights": "ref_gate"},
    "no_native_forget": {"native_forget": False},
    "delta_stop": {"stop_delta": -2.0},
}


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
    try:
        return cls(**kwargs)
    except ValueError as err:  # a range check of the dataclass: name the config section
        raise ValueError(f"config key {path}.{err}" if path else f"config key {err}") from err


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert YAML scalars to a numeric field's type (YAML 1.1 reads ``1e-4`` as a string) and stop on a value of
    the wrong type (``steps=2.5``, ``lr=fast``)."""
    if value is None:
        return value
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
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"config key {where} expects an integer, got {value!r}")
    if tp is float and not isinstance(value, int | float) or tp is bool and not isinstance(value, bool):
        raise ValueError(f"config key {where} expects {'true or false' if tp is bool else 'a number'}, got {value!r}")
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


def _shipped(kind: str, name: str) -> Path:
    """``configs/<kind>/<name>.yaml``, or ``name`` itself when it is a YAML path; unknown names stop with the
    shipped ones."""
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else CONFIG_DIR / kind / f"{str(name).lower()}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))
        raise ValueError(f"unknown {kind.rstrip('s')} {name!r}; known: {', '.join(known)}")
    return path


def _without_provenance(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "provenance"}


def paper_schedule(paper: dict, n_forget: int) -> tuple[TrainConfig, dict]:
    """Step-based equivalent of an epoch-based paper schedule (``configs/methods/*.yaml`` ``train.paper``) and the
    hyperparameters it sets (``dual_warmup_epochs`` → PDU's ``dual_warmup_steps``).

    One optimizer step sees ``per_device_batch_size × gradient_accumulation_steps`` forget samples, accumulated over
    ``gradient_accumulation_steps`` micro-batches; steps = epochs × ⌈|D_f| / effective batch⌉; warm-up
    ``warmup_epochs / epochs`` of them; ``optimizer`` (e.g. ``paged_adamw_32bit``) as given.
    """
    per_device = int(paper.get("per_device_batch_size", 4))
    accum = int(paper.get("gradient_accumulation_steps", 1))
    per_epoch = math.ceil(max(n_forget, 1) / (per_device * accum))
    epochs = int(paper["epochs"])
    train = TrainConfig(
        steps=epochs * per_epoch,
        batch_size=per_device,
        grad_accum=accum,
        lr=float(paper["lr"]),
        weight_decay=float(paper.get("weight_decay", 0.0)),
        warmup_ratio=float(paper.get("warmup_epochs", 0)) / epochs,
        scheduler="linear",
        optimizer=paper.get("optimizer", "adamw"),
    )
    if "dual_warmup_epochs" in paper:
        return train, {"dual_warmup_steps": int(paper["dual_warmup_epochs"]) * per_epoch}
    return train, {}


def resolve_method(
    name: str, scale: str, n_forget: int = 0, panel: dict | None = None, overrides: Sequence[str] = ()
) -> MethodRun:
    """MethodRun defaults ← ``configs/methods/<name>.yaml`` (hparams + the ``scale`` schedule) ← ``panel``
    (a panel's ``method_overrides`` entry) ← ``key=value`` overrides (``hparams.beta=0.2 train.lr=2e-5``).

    ``scale``: ``mini`` (the calibrated step-based mini schedule; its section may adapt hparams and the retain batch)
    or ``paper`` (the epoch-based open-unlearning schedule, converted by :func:`paper_schedule` for ``n_forget``)."""
    spec = read_yaml(_shipped("methods", name))
    hparams = dict(spec.get("hparams", {}))
    if scale == "paper":
        train, extra = paper_schedule(spec["train"]["paper"], n_forget)
        data = {"hparams": {**hparams, **extra}, "train": dataclasses.asdict(train)}
    elif scale == "mini":
        mini = _without_provenance(spec["train"]["mini"])
        data = {
            "hparams": deep_merge(hparams, mini.pop("hparams", {})),
            "retain_batch_size": mini.pop("retain_batch_size", None),
            "train": mini,
        }
    else:
        raise ValueError(f"unknown scale {scale!r}; use 'paper' or 'mini'")
    data = apply_overrides(deep_merge(deep_merge(data, panel or {}), {"name": spec.get("name", name)}), overrides)
    return build(MethodRun, data)


def _at_scale(spec: dict, scale: str, what: str) -> dict:
    """A shipped YAML section without provenance, its ``mini`` subsection layered on top at ``scale=mini``."""
    if scale not in ("paper", "mini"):
        raise ValueError(f"unknown {what} scale {scale!r}; use paper or mini")
    spec = _without_provenance(dict(spec))
    mini = _without_provenance(spec.pop("mini", {}))
    return deep_merge(spec, mini) if scale == "mini" else spec


def resolve_mc(
    variant: str, scale: str, panel: dict | None = None, overrides: Sequence[str] = (), seed: int | None = None
) -> MCConfig:
    """MCConfig defaults ← ``configs/mc.yaml`` (its ``mini`` section on top at ``scale=mini``) ← ``panel`` (a panel's
    ``mc`` section) ← the variant preset (:data:`MC_VARIANTS`) ← ``key=value`` overrides; ``seed`` (a cell's seed)
    sets ``train.seed``."""
    if variant not in MC_VARIANTS:
        raise ValueError(f"unknown MC variant preset {variant!r}; known: {', '.join(MC_VARIANTS)}")
    shipped = _at_scale(read_yaml(CONFIG_DIR / "mc.yaml"), scale, "MC")
    data = deep_merge(deep_merge(shipped, panel or {}), MC_VARIANTS[variant])
    data = apply_overrides(data, [*overrides, *([f"train.seed={seed}"] if seed is not None else [])])
    return build(MCConfig, data)


def resolve_attack(
    preset: str, scale: str, overrides: Sequence[str] = (), k: int | None = None, seed: int | None = None
) -> AttackConfig:
    """AttackConfig defaults ← ``configs/attacks.yaml`` preset (its ``mini`` section on top at ``scale=mini``) ←
    ``key=value`` overrides (``train.lr=2e-4``); ``k`` and ``seed`` (the D_rel draw and attacker init) last."""
    presets = read_yaml(CONFIG_DIR / "attacks.yaml")
    if preset not in presets:
        raise ValueError(f"unknown attacker preset {preset!r}; known: {', '.join(presets)}")
    spec = _at_scale(presets[preset], scale, "attack")
    extra = [*([f"k={k}"] if k is not None else []), *([f"train.seed={seed}"] if seed is not None else [])]
    return build(AttackConfig, apply_overrides(spec, [*overrides, *extra]))


def resolve_benchmark(name: str) -> BenchmarkSpec:
    """``configs/benchmarks/<name>.yaml`` (or a benchmark YAML file of one's own) as a :class:`BenchmarkSpec`."""
    path = _shipped("benchmarks", name)
    try:
        return build(BenchmarkSpec, read_yaml(path))
    except TypeError as err:  # a required field is missing
        raise ValueError(f"{path}: {err}") from err
