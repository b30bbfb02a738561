"""Panels: a YAML matrix of (benchmark, model, tier, method, seed, MC variant) cells.

A panel file (``configs/panels/*.yaml``) names the axes; :func:`expand_cells` takes their product and
:func:`validate` stops on anything a cell would fail on, from configuration alone. Each cell is then resolved once
into a plan (:mod:`margincal.pipeline.plan`): its specs and its stage graph, whose content keys make stages shared
between cells (θ_ref's evaluation, one unlearned base polished by several variants, θ0's attacks) run once.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from margincal.config import (
    CONFIG_DIR,
    AttackConfig,
    EvalSettings,
    MCConfig,
    MethodRun,
    apply_overrides,
    build,
    deep_merge,
    read_yaml,
    resolve_attack,
    resolve_benchmark,
    resolve_mc,
    resolve_method,
)
from margincal.data.benchmarks import fill_split
from margincal.families import HFFamily, ModelFamily
from margincal.mini.family import MiniFamily
from margincal.mini.models import MiniModelConfig
from margincal.store import Store, default_store


@dataclasses.dataclass
class RaySettings:
    """Ray executor: cluster address (None starts a local instance) and the resources each cell task requests."""

    address: str | None = None
    num_cpus: int | None = None  # CPUs of a local instance (None: all)
    cell_cpus: float = 1.0
    cell_gpus: float = 0.0


@dataclasses.dataclass
class PanelConfig:
    """One panel file. ``methods: [all]`` is every registered method; ``variants`` are MC presets
    (:data:`margincal.polish.MC_VARIANTS`) or ``{name, preset, set: {key: value}}`` mappings; ``attackers`` are
    ``{preset, k: [..], set: {..}}`` mappings over ``configs/attacks.yaml`` presets."""

    name: str = "panel"
    description: str = ""
    benchmark: str = "mini"
    models: list[str] = dataclasses.field(default_factory=lambda: ["mini"])
    tiers: list[str] = dataclasses.field(default_factory=lambda: ["forget10"])
    methods: list[str] = dataclasses.field(default_factory=lambda: ["all"])
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0])
    variants: list = dataclasses.field(default_factory=lambda: ["reference"])
    attackers: list = dataclasses.field(default_factory=lambda: [{"preset": "lora_r8", "k": [20]}])
    scale: str = "mini"  # training schedules of configs/methods and configs/attacks: mini | paper
    method_overrides: dict[str, dict] = dataclasses.field(default_factory=dict)
    mc: dict = dataclasses.field(default_factory=dict)  # overrides of configs/mc.yaml under every variant
    data: str | None = None  # replaces the benchmark's data source (a local directory or hub id)
    eval: EvalSettings = dataclasses.field(default_factory=EvalSettings)
    mini: MiniModelConfig = dataclasses.field(default_factory=MiniModelConfig)
    executor: str = "local"  # local | ray
    ray: RaySettings = dataclasses.field(default_factory=RaySettings)
    dtype: str | None = None  # None: the model config's dtype
    device: str = "auto"  # auto: cuda when available
    out: str | None = None  # default runs/panels/<name>
    store: str | None = None  # default $MARGINCAL_STORE or runs/store (shared by panels and the mini models)

    @property
    def out_dir(self) -> Path:
        return Path(self.out or f"runs/panels/{self.name}").resolve()

    @property
    def store_dir(self) -> Path:
        return Path(self.store).resolve() if self.store else default_store()


def _panel_path(name: str | Path) -> Path:
    """A panel YAML path, or the shipped ``configs/panels/<name>.yaml``; an unknown one lists the shipped panels."""
    path = Path(name)
    if not path.exists() and (CONFIG_DIR / "panels" / f"{path.stem}.yaml").exists():
        path = CONFIG_DIR / "panels" / f"{path.stem}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (CONFIG_DIR / "panels").glob("*.yaml"))
        raise ValueError(f"unknown panel {str(name)!r}; shipped panels: {', '.join(known)}")
    return path


def read_panel(name: str | Path, seen: tuple[Path, ...] = ()) -> dict:
    """A panel file's mapping; ``extends: <panel>`` layers it on that panel's (mappings merged key by key, every
    other value replaced), so panels on one benchmark share its settings instead of copying them."""
    path = _panel_path(name).resolve()
    if path in seen:
        raise ValueError(f"panel {path.stem!r} extends itself: {' -> '.join(p.stem for p in (*seen, path))}")
    data = read_yaml(path)
    parent = data.pop("extends", None)
    return deep_merge(read_panel(parent, (*seen, path)), data) if parent else data


def load_panel(path: str | Path, overrides: list[str] | None = None) -> PanelConfig:
    """Read a panel YAML (a path, or the name of a shipped panel) with ``key=value`` overrides: PanelConfig defaults
    ← the panels it extends ← the panel file ← overrides (the one layering of :mod:`margincal.config`)."""
    cfg = build(PanelConfig, apply_overrides(read_panel(path), overrides or []))
    validate(cfg)
    return cfg


def model_spec(name: str) -> dict:
    """``configs/models/<name>.yaml``, or a model-family YAML file of one's own (``kind: hf``, ``target``,
    ``references: {tier: id or directory}``, ``dtype``, optional ``template`` (configs/templates; default: detected),
    ``attn_implementation`` and ``device_map``); an unknown name stops with the shipped families."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else CONFIG_DIR / "models" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (CONFIG_DIR / "models").glob("*.yaml"))
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(known)}")
    return read_yaml(path)


FAMILY_KINDS = {  # kind → the family of a model YAML in this panel
    "hf": lambda spec, cfg, bench: HFFamily(spec, cfg.data or bench.source, bench.name, cfg.store_dir / "digests"),
    "mini": lambda spec, cfg, bench: MiniFamily(spec, cfg.mini, Store(cfg.store_dir)),
}


def load_family(name: str, cfg: PanelConfig) -> ModelFamily:
    """The model family ``name`` (:func:`model_spec`) with the panel's data source, mini settings and store."""
    spec = model_spec(name)
    kind = spec.get("kind")
    if kind not in FAMILY_KINDS:
        raise ValueError(f"model family {name!r} has unknown kind {kind!r}; use one of {', '.join(FAMILY_KINDS)}")
    return FAMILY_KINDS[kind](spec, cfg, resolve_benchmark(cfg.benchmark))


def method_names(cfg: PanelConfig) -> list[str]:
    from margincal.methods import METHODS

    if cfg.methods == ["all"]:
        return [METHODS[k].name for k in sorted(METHODS, key=lambda k: (METHODS[k].family, k))]
    return [METHODS[_known_method(m)].name for m in cfg.methods]


def _known_method(name: str) -> str:
    from margincal.methods import METHODS

    if name.lower() not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))} (or 'all')")
    return name.lower()


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    preset: str = "reference"
    set: tuple[tuple[str, object], ...] = ()


def variants(cfg: PanelConfig) -> list[Variant]:
    out = []
    for item in cfg.variants:
        spec = {"name": item, "preset": item} if isinstance(item, str) else dict(item)
        spec.setdefault("preset", "reference")
        out.append(Variant(spec["name"], spec["preset"], tuple(sorted((spec.get("set") or {}).items()))))
    return out


@dataclasses.dataclass(frozen=True)
class AttackSpec:
    preset: str
    k: int
    set: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.preset}@{self.k}"

    def resolve(self, scale: str, seed: int | None = None) -> AttackConfig:
        """The attack config at ``scale`` with this spec's overrides, K and (a cell's) seed."""
        return resolve_attack(self.preset, scale, [f"{k}={v}" for k, v in self.set], self.k, seed)


def attack_specs(cfg: PanelConfig) -> list[AttackSpec]:
    out = []
    for item in cfg.attackers:
        item = {"preset": item} if isinstance(item, str) else dict(item)
        ks = item.get("k", [20])
        for k in ks if isinstance(ks, list) else [ks]:
            out.append(AttackSpec(item["preset"], int(k), tuple(sorted((item.get("set") or {}).items()))))
    return out


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (benchmark, model, tier, method, seed, MC variant) cell; its attackers come from the panel."""

    benchmark: str
    model: str
    tier: str
    method: str
    seed: int
    variant: str

    @property
    def id(self) -> str:
        bench, model = (Path(x).stem if x.endswith((".yaml", ".yml")) else x for x in (self.benchmark, self.model))
        return f"{bench}_{model}_{self.tier}_{self.method}_s{self.seed}_{self.variant}"


def expand_cells(cfg: PanelConfig) -> list[Cell]:
    axes = (cfg.models, cfg.tiers, method_names(cfg), cfg.seeds, [v.name for v in variants(cfg)])
    return [Cell(cfg.benchmark, m, t, meth, s, v) for m, t, meth, s, v in itertools.product(*axes)]


def validate(cfg: PanelConfig) -> None:
    """Stop early, with a clear message, on anything a cell would fail on later."""
    from margincal.methods.base import get_method

    if cfg.scale not in ("mini", "paper"):
        raise ValueError(f"unknown scale {cfg.scale!r}; use mini or paper")
    if cfg.executor not in ("local", "ray"):
        raise ValueError(f"unknown executor {cfg.executor!r}; use local or ray")
    spec = resolve_benchmark(cfg.benchmark)
    for model in cfg.models:
        family = load_family(model, cfg)
        for tier in cfg.tiers:
            for name in spec.splits.values():
                fill_split(name, spec, tier)
            family.ids(tier)
            family.data_id(tier)  # an unknown template stops here
    names = {"*", *method_names(cfg), *(m.lower() for m in method_names(cfg))}
    unknown = sorted(set(cfg.method_overrides) - names)
    if unknown:
        raise ValueError(f"method_overrides for methods not in the panel: {unknown}")
    for name in method_names(cfg):
        run = method_spec(cfg, name)
        get_method(run.name, **run.hparams)  # unknown hyperparameters stop here
    for v in variants(cfg):
        mc_config(cfg, v, seed=0)
    for a in attack_specs(cfg):
        a.resolve(cfg.scale)
    names = [v.name for v in variants(cfg)]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique: {names}")


def mc_config(cfg: PanelConfig, variant: Variant, seed: int) -> MCConfig:
    """The cell's MC config: :func:`margincal.config.resolve_mc` at the panel's scale with its ``mc`` section, the
    variant's preset and its ``set`` overrides, seeded with the cell seed."""
    return resolve_mc(variant.preset, cfg.scale, cfg.mc, [f"{k}={v}" for k, v in variant.set], seed)


def method_override(cfg: PanelConfig, method: str) -> dict:
    """The panel's ``method_overrides`` of ``method``: its ``"*"`` entry (every method) with the method's own on top."""
    own = cfg.method_overrides.get(method) or cfg.method_overrides.get(method.lower()) or {}
    return deep_merge(cfg.method_overrides.get("*") or {}, own)


def method_spec(cfg: PanelConfig, method: str, n_forget: int = 0) -> MethodRun:
    """The cell's method run: :func:`margincal.config.resolve_method` at the panel's scale with its override.
    Paper-scale steps follow |D_f| (``n_forget``: the plan passes the real one; validation passes 0)."""
    return resolve_method(method, cfg.scale, n_forget, method_override(cfg, method))
