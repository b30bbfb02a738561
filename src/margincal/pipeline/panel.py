"""Panels: a YAML matrix of (benchmark, model, tier, method, seed, MC variant) cells.

A panel file (``configs/panels/*.yaml``) names the axes; :func:`expand_cells` takes their product and
:func:`validate` stops on anything a cell would fail on, from configuration alone. Each cell is then resolved once
into a plan (:mod:`margincal.pipeline.plan`): its specs and its stage graph, whose content keys make stages shared
between cells (θ_ref's evaluation, one unlearned base polished by several variants, θ0's attacks) run once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from margincal.config.files import build_file, read_yaml, shipped, shown
from margincal.config.settings import (
    DTYPE_NAMES,
    AttackConfig,
    EvalSettings,
    MCConfig,
    MethodRun,
    resolve_attack,
    resolve_benchmark,
    resolve_mc,
    resolve_method,
)
from margincal.config.typed import (
    MAX_BUDGETS,
    MAX_CELLS,
    MAX_K,
    MAX_SEEDS,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    ConfigError,
    Layer,
    Rule,
    apply_overrides,
    at_most,
    brief,
    build,
    check_fields,
    check_items,
    deep_merge,
    one_of,
    override_layers,
    sourced,
)
from margincal.core.artifacts import NAME, NAME_RULE, check_name, check_owned_dir
from margincal.core.errors import InputError, require
from margincal.core.inputs import path_kind
from margincal.data.benchmarks import fill_split
from margincal.methods import METHODS
from margincal.methods.base import get_method
from margincal.mini.family import MiniFamily
from margincal.mini.models import MiniModelConfig
from margincal.pipeline.families import HFFamily, ModelFamily
from margincal.reporting.records import Cell
from margincal.store.stage_store import Store, default_store
from margincal.training.curves import check_report_to

RAY_EXECUTOR, RAY_INSTALL = "the Ray executor (executor: ray)", "pip install 'margincal[ray]', or use executor: local"
SLURM_EXECUTOR = "the SLURM executor (executor: slurm)"
SLURM_INSTALL = "pip install 'margincal[slurm]', or use executor: local"
EXECUTORS = ("local", "ray", "slurm")


@dataclasses.dataclass
class RaySettings:
    """Ray executor: cluster address (None starts a local instance) and the resources each cell task requests."""

    address: str | None = None
    num_cpus: int | None = None  # CPUs of a local instance (None: all)
    cell_cpus: float = 1.0
    cell_gpus: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self, num_cpus=at_most(4096), cell_cpus=POSITIVE, cell_gpus=NON_NEGATIVE)


SBATCH_OPTION = re.compile(r"[a-z][a-z0-9_-]{0,63}")  # an sbatch long option's name, as submitit writes it
ONE_LINE: Rule = (lambda v: "\n" not in str(v) and "\r" not in str(v), "a value on one line")


@dataclasses.dataclass
class SlurmSettings:
    """SLURM executor, on submitit: the cells become a job array of at most ``array_parallelism`` jobs at once, each
    job running ``cells_per_job`` cells (packing: one after another, or spread over ``tasks_per_job`` processes that
    share the job's ``gpus_per_job`` GPUs), each cell with ``cpus_per_cell`` CPUs (its torch threads). A preempted
    job is requeued and a timed-out one too, at most ``max_requeues`` times: its cells run again and resume from the
    store, so no finished stage reruns. The store and ``out`` must be on a file system the compute nodes share, and the
    nodes must run this Python environment (``setup``: shell lines each job runs first, e.g. ``module load cuda``).
    ``backend: local`` runs the same jobs as local processes through submitit's local executor (a workstation, or a
    test of the cluster path). Job files and submitit's logs go to ``<out>/slurm/jobs/``, each cell's log to
    ``<out>/slurm/cells/<cell id>.log``."""

    backend: str = "slurm"  # slurm | local
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_min: int = 240  # each job's time limit
    cpus_per_cell: int = 4
    gpus_per_job: int = 1
    mem_gb: float | None = None  # each job's memory (None: the partition's default)
    cells_per_job: int = 1
    tasks_per_job: int = 1
    array_parallelism: int = 32  # jobs running at once (local backend: also no more than the machine's CPUs hold)
    max_requeues: int = 3  # requeues after a time-out (preemptions are always requeued)
    setup: list[str] = dataclasses.field(default_factory=list)
    additional: dict[str, Any] = dataclasses.field(default_factory=dict)  # more sbatch options: {gres: gpu:a100:1}

    def __post_init__(self) -> None:
        check_fields(
            self,
            backend=one_of("slurm", "local"),
            partition=ONE_LINE,
            account=ONE_LINE,
            qos=ONE_LINE,
            constraint=ONE_LINE,
            time_min=at_most(60 * 24 * 365),
            cpus_per_cell=at_most(4096),
            gpus_per_job=at_most(64, low=0),
            mem_gb=POSITIVE,
            cells_per_job=at_most(MAX_CELLS),
            tasks_per_job=at_most(self.cells_per_job),
            array_parallelism=at_most(MAX_CELLS),
            max_requeues=at_most(100, low=0),
        )
        check_items("setup", self.setup, ONE_LINE)
        for key, value in self.additional.items():
            if not SBATCH_OPTION.fullmatch(str(key)):
                raise ConfigError(f"additional.{key}", "must name an sbatch option (lowercase letters, digits, - or _)")
            if not ONE_LINE[0](value):
                raise ConfigError(f"additional.{key}", f"must be {ONE_LINE[1]}, got {brief(value)}")


@dataclasses.dataclass
class PanelConfig:
    """One panel file. ``methods: [all]`` is every registered unlearning method (a control is named on its own);
    ``variants`` are MC presets (:data:`margincal.config.settings.MC_VARIANTS`) or ``{name, preset, set: {key: value}}``
    mappings; ``attackers`` are ``{preset, k: [..], set: {..}}`` mappings over ``configs/attacks.yaml`` presets."""

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
    executor: str = "local"  # local | ray | slurm
    ray: RaySettings = dataclasses.field(default_factory=RaySettings)
    slurm: SlurmSettings = dataclasses.field(default_factory=SlurmSettings)
    dtype: str | None = None  # None: the model config's dtype
    device: str = "auto"  # auto: cuda when available
    out: str | None = None  # default runs/panels/<name>
    store: str | None = None  # default $MARGINCAL_STORE or runs/store (shared by panels and the mini models)
    report_to: str = "none"  # training curves of every stage run: none | tensorboard (margincal.training.curves)

    def __post_init__(self) -> None:
        nonempty = (bool, "a non-empty list")
        check_fields(
            self,
            name=(NAME.fullmatch, f"{NAME_RULE} (it names the output directory)"),
            models=nonempty,
            tiers=nonempty,
            methods=nonempty,
            seeds=nonempty,
            variants=nonempty,
            attackers=nonempty,
            scale=one_of("mini", "paper"),
            executor=one_of(*EXECUTORS),
        )
        check_items("seeds", self.seeds, SEED, MAX_SEEDS)
        check_report_to(self.report_to)

    @property
    def out_dir(self) -> Path:
        return Path(self.out or f"runs/panels/{self.name}").resolve()

    @property
    def store_dir(self) -> Path:
        return Path(os.path.abspath(self.store)) if self.store else default_store()  # Store() checks, then resolves


def _panel_path(name: str | Path) -> Path:
    """A panel YAML path, or the shipped ``configs/panels/<name>.yaml``; an unknown one lists the shipped panels."""
    return shipped("panels", name, "panel")


def panel_layers(name: str | Path, seen: tuple[Path, ...] = ()) -> list[Layer]:
    """A panel file and the panels it ``extends``, root first, each as (its path, its mapping): the panel is their
    merge (mappings merged key by key, every other value replaced), so panels on one benchmark share its settings
    instead of copying them."""
    path = _panel_path(name).resolve()
    if path in seen:
        raise InputError(f"panel {path.stem!r} extends itself: {' -> '.join(p.stem for p in (*seen, path))}")
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is not None and not isinstance(parent, str):
        raise ConfigError("extends", f"expects a panel name or path, got {brief(parent)}", shown(path))
    return [*(panel_layers(_parent(parent, path), (*seen, path)) if parent else []), (shown(path), data)]


def _parent(parent: str, child: Path) -> str | Path:
    """An ``extends:`` value: a path (a ``.yaml``/``.yml`` name, or one with a separator) is read beside the file that
    names it (an absolute one as it is); a bare name is a shipped panel."""
    if not parent.endswith((".yaml", ".yml")) and "/" not in parent:
        return parent
    found = child.parent / Path(parent).expanduser()
    if not found.is_file():
        what = f"names {parent!r}, but there is no file {found} (read beside {child.name})"
        raise ConfigError("extends", what, shown(child))
    return found


def load_panel(path: str | Path, overrides: list[str] | None = None) -> PanelConfig:
    """Read a panel YAML (a path, or the name of a shipped panel) with ``key=value`` overrides: PanelConfig defaults
    ← the panels it extends ← the panel file ← overrides (the one layering of :mod:`margincal.config.settings`), checked
    whole (:func:`validate`); an error names the file or override that set the offending key."""
    files, overrides = panel_layers(path), overrides or []
    data: dict = {}
    for _, layer in files:
        data = deep_merge(data, layer)
    try:
        cfg = build(PanelConfig, apply_overrides(data, overrides))
        validate(cfg)
    except ConfigError as err:
        raise sourced(err, [*files, *override_layers(overrides)]) from None
    return cfg


@dataclasses.dataclass
class ModelSpec:
    """The typed spec of a model-family YAML (checked, then read as the mapping it is by the family): ``kind`` (a
    key of :data:`FAMILY_KINDS`); an ``hf`` family's ``target`` and ``references`` (tier → hub id or directory);
    optional ``dtype``, ``template``, ``attn_implementation``, ``device_map``."""

    kind: str
    name: str | None = None
    target: str | None = None
    references: dict[str, str] | None = None
    dtype: str | None = None
    template: str | None = None
    attn_implementation: str | None = None
    device_map: Any = None

    def __post_init__(self) -> None:
        check_fields(self, kind=one_of(*FAMILY_KINDS), dtype=one_of(*DTYPE_NAMES, "auto"))
        if self.kind == "hf" and not (self.target and self.references):
            raise ConfigError("", "an hf model family needs target (θ0) and references (tier: θ_ref)")


def model_spec(name: str) -> dict:
    """``configs/models/<name>.yaml``, or a model-family YAML file of one's own (:class:`ModelSpec`); an unknown
    name stops with the shipped families."""
    path = shipped("models", name, "model family")
    data = read_yaml(path)
    build_file(ModelSpec, data, path)
    return data


FAMILY_KINDS = {  # kind → the family of a model YAML in this panel
    "hf": lambda spec, cfg, bench: HFFamily(spec, cfg.data or bench.source, bench.name, cfg.store_dir / "digests"),
    "mini": lambda spec, cfg, bench: MiniFamily(spec, cfg.mini, Store(cfg.store_dir)),
}


def load_family(name: str, cfg: PanelConfig) -> ModelFamily:
    """The model family ``name`` (:func:`model_spec`) with the panel's data source, mini settings and store."""
    spec = model_spec(name)
    return FAMILY_KINDS[spec["kind"]](spec, cfg, resolve_benchmark(cfg.benchmark))


def method_names(cfg: PanelConfig) -> list[str]:
    if cfg.methods == ["all"]:  # every unlearning method; a control (OracleImitation) is named on its own
        methods = [k for k in METHODS if not METHODS[k].control]
        return [METHODS[k].name for k in sorted(methods, key=lambda k: (METHODS[k].family, k))]
    return [METHODS[_known_method(m)].name for m in cfg.methods]


def _known_method(name: str) -> str:
    if name.lower() not in METHODS:
        raise InputError(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))} (or 'all')")
    return name.lower()


@dataclasses.dataclass
class VariantEntry:
    """A ``variants`` entry of a panel file: an MC preset under a name of its own, with ``set`` overrides."""

    name: str
    preset: str = "reference"
    set: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, name=(NAME.fullmatch, f"{NAME_RULE} (it becomes part of cell ids and their files)"))


@dataclasses.dataclass
class AttackerEntry:
    """An ``attackers`` entry of a panel file: a ``configs/attacks.yaml`` preset, its budgets K and ``set``
    overrides."""

    preset: str
    k: list[int] = dataclasses.field(default_factory=lambda: [20])
    set: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, k=(bool, "a non-empty list of budgets"))
        check_items("k", self.k, at_most(MAX_K), MAX_BUDGETS)


def _entry(cls: type, item: object, key: str, shorthand: dict) -> object:
    """A ``variants``/``attackers`` entry: a preset name (``shorthand``), or a mapping checked as ``cls``."""
    return build(cls, shorthand if isinstance(item, str) else item, key)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    preset: str = "reference"
    set: tuple[tuple[str, object], ...] = ()


def variants(cfg: PanelConfig) -> list[Variant]:
    out = []
    for i, item in enumerate(cfg.variants):
        entry = _entry(VariantEntry, item, f"variants[{i}]", {"name": item, "preset": item})
        out.append(Variant(entry.name, entry.preset, tuple(sorted(entry.set.items()))))
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
        return resolve_attack(self.preset, scale, list(self.set), self.k, seed)


def attack_specs(cfg: PanelConfig) -> list[AttackSpec]:
    out = []
    for i, item in enumerate(cfg.attackers):
        if isinstance(item, dict) and "k" in item and not isinstance(item["k"], list):
            item = {**item, "k": [item["k"]]}  # one budget: `k: 20`
        out += entry_specs(_entry(AttackerEntry, item, f"attackers[{i}]", {"preset": item}))
    return out


def entry_specs(entry: AttackerEntry) -> list[AttackSpec]:
    """One attack spec per budget K of an attackers entry (a panel's or an audit budget's)."""
    return [AttackSpec(entry.preset, k, tuple(sorted(entry.set.items()))) for k in entry.k]


def expand_cells(cfg: PanelConfig) -> list[Cell]:
    """The panel's cells, the product of its axes (at most :data:`~margincal.config.typed.MAX_CELLS`), each id a valid
    name (:func:`~margincal.core.artifacts.check_name`: it names the cell's record file)."""
    axes = (cfg.models, cfg.tiers, method_names(cfg), cfg.seeds, [v.name for v in variants(cfg)])
    count = math.prod(len(axis) for axis in axes)
    if count > MAX_CELLS:
        sizes = " × ".join(str(len(axis)) for axis in axes)
        raise ConfigError("", f"the panel has {sizes} = {count:,} cells; a panel may have at most {MAX_CELLS:,}")
    cells = [Cell(cfg.benchmark, m, t, meth, s, v) for m, t, meth, s, v in itertools.product(*axes)]
    for cell in cells:
        check_name(cell.id, "cell id")
    return cells


def validate(cfg: PanelConfig) -> None:
    """Stop early, with a clear message, on anything a cell would fail on later: every section resolved as a cell
    would resolve it, an error keyed by the panel section it came from; and the output and store locations."""
    kind = path_kind(cfg.store_dir)
    if kind not in ("directory", "missing"):  # before a model family opens the store
        raise ConfigError("store", f"must be a directory, got the {kind} {cfg.store_dir}")
    with _section("methods"):
        names = method_names(cfg)
    expand_cells(cfg)  # the panel's size and its cell ids (file names) first: nothing below loops over a huge axis
    with _section("benchmark", nested=False):  # the benchmark file's own errors name that file
        spec = resolve_benchmark(cfg.benchmark)
    for i, model in enumerate(cfg.models):
        with _section(f"models[{i}]", nested=False):  # a model-family file's own errors name that file
            family = load_family(model, cfg)
        for j, tier in enumerate(cfg.tiers):
            with _section(f"tiers[{j}]"):
                for name in spec.splits.values():
                    fill_split(name, spec, tier)
                family.ids(tier)
            with _section(f"models[{i}]"):
                family.data_id(tier)  # an unknown template stops here
    unknown = sorted(set(cfg.method_overrides) - {"*", *names, *(m.lower() for m in names)})
    if unknown:
        raise ConfigError("method_overrides", f"names methods not in the panel: {unknown}")
    for name in names:
        own = next((k for k in (name, name.lower()) if k in cfg.method_overrides), "*")
        with _section(f"method_overrides.{own}"):
            run = method_spec(cfg, name)
            get_method(run.name, **run.hparams)  # unknown hyperparameters stop here
    for i, v in enumerate(variants(cfg)):
        where = {"preset": f"variants[{i}]", **{k: f"variants[{i}].set" for k, _ in v.set}}
        with _section(lambda key, where=where: where.get(key, "mc")):
            mc_config(cfg, v, seed=0)
    attack_specs(cfg)  # every entry's shape, keys and budgets
    for i, item in enumerate(cfg.attackers):
        with _section(lambda key, i=i: f"attackers[{i}]" if key == "preset" else f"attackers[{i}].set"):
            for a in attack_specs(dataclasses.replace(cfg, attackers=[item])):
                a.resolve(cfg.scale)
    names = [v.name for v in variants(cfg)]
    if len(set(names)) != len(names):
        raise ConfigError("variants", f"must have unique names, got {names}")
    check_owned_dir(cfg.out_dir, "out")  # results go only where margincal alone writes
    if cfg.executor == "ray":
        require("ray", RAY_EXECUTOR, RAY_INSTALL)  # a missing optional package: one line, before any cell runs
    if cfg.executor == "slurm":
        require("submitit", SLURM_EXECUTOR, SLURM_INSTALL)
        node_local = [k for k, d in (("store", cfg.store_dir), ("out", cfg.out_dir)) if d.is_relative_to("/tmp")]
        if cfg.slurm.backend == "slurm" and node_local:
            raise ConfigError(node_local[0], "must be on a file system the compute nodes share, not under /tmp")


@contextlib.contextmanager
def _section(prefix: str | Callable[[str], str], nested: bool = True) -> Iterator[None]:
    """Errors of a panel section resolved on its own (a method's overrides, a variant, an attacker, a model) keyed
    by the section that holds it; ``prefix`` may depend on the failing key's head. ``nested=False``: the section
    names a file of its own, whose errors keep their keys."""
    try:
        yield
    except ConfigError as err:
        if not nested:
            raise
        head = err.key.split(".")[0].split("[")[0]
        raise err.within(prefix(head) if callable(prefix) else prefix) from None
    except InputError as err:  # a value the section's own reader refused (an unknown family, template, tier)
        key = prefix("") if callable(prefix) else prefix
        raise ConfigError(key, str(err), named=False) from None


def mc_config(cfg: PanelConfig, variant: Variant, seed: int) -> MCConfig:
    """The cell's MC config: :func:`margincal.config.settings.resolve_mc` at the panel's scale with its ``mc`` section,
    the variant's preset and its ``set`` overrides, seeded with the cell seed."""
    return resolve_mc(variant.preset, cfg.scale, cfg.mc, list(variant.set), seed)


def method_override(cfg: PanelConfig, method: str) -> dict:
    """The panel's ``method_overrides`` of ``method``: its ``"*"`` entry (every method) with the method's own on top."""
    own = cfg.method_overrides.get(method) or cfg.method_overrides.get(method.lower()) or {}
    return deep_merge(cfg.method_overrides.get("*") or {}, own)


def method_spec(cfg: PanelConfig, method: str, n_forget: int = 0) -> MethodRun:
    """The cell's method run: :func:`margincal.config.settings.resolve_method` at the panel's scale with its override.
    Paper-scale steps follow |D_f| (``n_forget``: the plan passes the real one; validation passes 0)."""
    return resolve_method(method, cfg.scale, n_forget, method_override(cfg, method))
