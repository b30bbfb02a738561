"""Panels: a YAML matrix of (benchmark, model, tier, method, seed, MC variant) cells and their stage plans.

A panel file (``configs/panels/*.yaml``) names the axes; :func:`expand_cells` takes their product. Every cell runs
the stages unlearn → evaluate (with the margin diagnostic) → MC polish → evaluate → attacks, plus the evaluations
and attacks of θ0 and θ_ref. :class:`CellPlan` gives each stage a content key (``config_key`` of its config and the
keys of its inputs) computed from configuration alone, so ``--dry-run`` can say what is cached without loading a
model or a dataset, and stages shared between cells (θ_ref's evaluation, one unlearned base polished by several
variants, θ0's attacks) map to one store entry and run once.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from margincal.config import CONFIG_DIR, AttackConfig, MCConfig, apply_overrides, build, deep_merge, read_yaml
from margincal.pipeline.mini_models import MiniModelConfig
from margincal.pipeline.store import config_key


@dataclasses.dataclass
class EvalSettings:
    """Evaluation settings of every ``evaluate``/``attack`` stage (decoding length comes from the benchmark)."""

    batch_size: int = 32
    gradnorm: bool = True  # the gradient-norm MIA detector (one backward per sample)
    mmlu: str | None = None  # None | local (offline multiple-choice set) | mmlu (lm-eval, hub access)


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
    store: str | None = None  # default runs/store (shared by panels, so their common stages run once)
    cache_dir: str | None = None  # mini model cache (default $MARGINCAL_CACHE or ~/.cache/margincal)

    @property
    def out_dir(self) -> Path:
        return Path(self.out or f"runs/panels/{self.name}").resolve()

    @property
    def store_dir(self) -> Path:
        return Path(self.store or "runs/store").resolve()


def load_panel(path: str | Path, overrides: list[str] | None = None) -> PanelConfig:
    """Read a panel YAML (a path, or the name of a shipped panel) with ``key=value`` overrides."""
    path = Path(path)
    if not path.exists() and (CONFIG_DIR / "panels" / f"{path.stem}.yaml").exists():
        path = CONFIG_DIR / "panels" / f"{path.stem}.yaml"
    cfg = build(PanelConfig, apply_overrides(read_yaml(path), overrides or []))
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
    from margincal.polish import MC_VARIANTS

    out = []
    for item in cfg.variants:
        spec = {"name": item, "preset": item} if isinstance(item, str) else dict(item)
        spec.setdefault("preset", "reference")
        if spec["preset"] not in MC_VARIANTS:
            raise ValueError(f"unknown MC variant preset {spec['preset']!r}; known: {', '.join(MC_VARIANTS)}")
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
    from margincal.attacks import attack_preset
    from margincal.evaluate import benchmark_spec, fill_split

    if cfg.scale not in ("mini", "paper"):
        raise ValueError(f"unknown scale {cfg.scale!r}; use mini or paper")
    if cfg.executor not in ("local", "ray"):
        raise ValueError(f"unknown executor {cfg.executor!r}; use local or ray")
    spec = benchmark_spec(cfg.benchmark)
    for model in cfg.models:
        mspec = model_spec(model)
        for tier in cfg.tiers:
            for name in spec["splits"].values():
                fill_split(name, spec, tier)
            if mspec["kind"] != "mini" and tier not in mspec["references"]:
                raise ValueError(f"model family {model!r} has no reference for tier {tier!r}")
        if mspec.get("template"):
            from margincal.data.templates import load_template

            load_template(mspec["template"])
    unknown = sorted(set(cfg.method_overrides) - {m.lower() for m in method_names(cfg)} - set(method_names(cfg)))
    if unknown:
        raise ValueError(f"method_overrides for methods not in the panel: {unknown}")
    for v in variants(cfg):
        mc_config(cfg, v, seed=0)
    for a in attack_specs(cfg):
        attack_preset(a.preset, [f"{k}={v}" for k, v in a.set], cfg.scale)
    names = [v.name for v in variants(cfg)]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique: {names}")


def mc_config(cfg: PanelConfig, variant: Variant, seed: int) -> MCConfig:
    """configs/mc.yaml ← panel ``mc`` ← the variant's preset ← its ``set`` overrides, seeded with the cell seed."""
    from margincal.polish import MC_VARIANTS

    data = deep_merge(deep_merge(read_yaml(CONFIG_DIR / "mc.yaml"), cfg.mc), MC_VARIANTS[variant.preset])
    data = apply_overrides(data, [f"{k}={v}" for k, v in variant.set])
    mc = build(MCConfig, data)
    return dataclasses.replace(mc, train=dataclasses.replace(mc.train, seed=seed))


def method_override(cfg: PanelConfig, method: str) -> dict:
    return cfg.method_overrides.get(method) or cfg.method_overrides.get(method.lower()) or {}


class CellPlan:
    """The stage keys of one cell, from configuration only (no model or data is loaded)."""

    def __init__(self, cfg: PanelConfig, cell: Cell):
        from margincal.data.templates import load_template
        from margincal.evaluate import benchmark_spec

        self.cfg, self.cell = cfg, cell
        self.spec = benchmark_spec(cell.benchmark)
        self.model = model_spec(cell.model)
        self.variant = next(v for v in variants(cfg) if v.name == cell.variant)
        if self.model["kind"] == "mini":
            family = f"mini/{cfg.mini.cache_key()}"
            self.theta0_id, self.ref_id = f"{family}/theta0", f"{family}/ref_{cell.tier}"
            self.data_id = {"mini": dataclasses.asdict(cfg.mini.data)}
        else:
            self.theta0_id, self.ref_id = self.model["target"], self.model["references"][cell.tier]
            template = self.model.get("template")  # None: detected from the tokenizer at load time
            self.data_id = {"source": cfg.data or self.spec.get("source"), "template": template and
                            dataclasses.asdict(load_template(template))}  # fmt: skip
        self.data_id |= {"benchmark": self.spec, "tier": cell.tier}
        self.eval = {**dataclasses.asdict(cfg.eval), "dtype": self.dtype}

    @property
    def dtype(self) -> str:
        return self.cfg.dtype or self.model.get("dtype", "float32")

    def evaluate_config(self, model_key: str, reference_key: str | None) -> dict:
        return {"model": model_key, "reference": reference_key, "data": self.data_id, "eval": self.eval}

    def unlearn_config(self) -> dict:
        spec = read_yaml(CONFIG_DIR / "methods" / f"{self.cell.method.lower()}.yaml")
        return {
            "theta0": self.theta0_id,
            "method": self.cell.method,
            "hparams": spec.get("hparams", {}),
            "schedule": {self.cfg.scale: spec["train"][self.cfg.scale]},
            "overrides": method_override(self.cfg, self.cell.method),
            "seed": self.cell.seed,
            "data": self.data_id,
            "dtype": self.dtype,
        }

    def polish_config(self) -> dict:
        """The polish's own settings; its input (the unlearned base's key) enters the key as an input."""
        mc = mc_config(self.cfg, self.variant, self.cell.seed)
        return {"mc": dataclasses.asdict(mc), "anchors": {"ref": self.ref_id, "theta0": self.theta0_id},
                "data": self.data_id, "dtype": self.dtype}  # fmt: skip

    def attack(self, spec: AttackSpec) -> AttackConfig:
        from margincal.attacks import attack_preset

        cfg = attack_preset(spec.preset, [f"{k}={v}" for k, v in spec.set], self.cfg.scale)
        return dataclasses.replace(cfg, k=spec.k, train=dataclasses.replace(cfg.train, seed=self.cell.seed))

    def attack_config(self, model_key: str, spec: AttackSpec, reference_key: str) -> dict:
        return {"model": model_key, "attack": dataclasses.asdict(self.attack(spec)), "reference": reference_key,
                "data": self.data_id, "eval": self.eval}  # fmt: skip

    def keys(self) -> dict[str, tuple[str, str]]:
        """Label → (stage, key) for every stage of the cell."""
        ref_eval = config_key("evaluate", self.evaluate_config(self.ref_id, None))
        unlearn = config_key("unlearn", self.unlearn_config())
        polish = config_key("polish", self.polish_config(), [unlearn])
        models = {"reference": self.ref_id, "theta0": self.theta0_id, "baseline": unlearn, "mc": polish}
        out = {"reference/evaluate": ("evaluate", ref_eval), "baseline/unlearn": ("unlearn", unlearn),
               "mc/polish": ("polish", polish)}  # fmt: skip
        for role, key in models.items():
            if role != "reference":
                out[f"{role}/evaluate"] = ("evaluate", config_key("evaluate", self.evaluate_config(key, ref_eval)))
            for spec in attack_specs(self.cfg):
                attack = config_key("attack", self.attack_config(key, spec, ref_eval))
                out[f"{role}/attack/{spec.label}"] = ("attack", attack)
        return out
