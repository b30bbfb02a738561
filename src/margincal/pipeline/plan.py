"""A plan is a value: one cell resolved once into frozen specs and the list of its stage nodes.

:func:`plan_panel` resolves every cell of a panel once, reading configuration and, at paper scale, the size of each
(model family, tier)'s training forget split (the epoch-based schedules become optimizer steps at the real |D_f|;
no model is loaded). A :class:`CellPlan` holds the benchmark spec (``max_length`` capped at the model's context),
the model and data identities, the method run, the MC config, the attacks and the evaluation settings, and its
:attr:`~CellPlan.nodes`: the stage graph as data. Store keys, ``panel --dry-run``, execution
(:func:`margincal.pipeline.cell.run_cell`) and the cell record all read that one list; nothing after the plan calls
a resolver.

A node is (label, kind, role, resolved spec, key config, inputs). To add a stage: append its node in
:func:`_graph` (the loop in :mod:`margincal.pipeline.cell` runs it by its ``kind`` through
:data:`margincal.stages.STAGE_RUNNERS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from margincal.artifacts import config_key
from margincal.config import AttackConfig, BenchmarkSpec, EvalSettings, MCConfig, MethodRun
from margincal.families import ModelFamily
from margincal.pipeline.panel import (
    AttackSpec,
    Cell,
    PanelConfig,
    attack_specs,
    expand_cells,
    load_family,
    mc_config,
    method_spec,
    variants,
)


@dataclasses.dataclass(frozen=True)
class Node:
    """One stage of a plan: ``kind`` (unlearn | polish | evaluate | attack) about the model ``role``, run with the
    resolved ``spec``; ``config`` is what enters its store key with the keys of its ``inputs`` (node labels)."""

    label: str
    kind: str
    role: str
    spec: Any
    config: dict
    inputs: tuple[str, ...]
    key: str

    @property
    def steps(self) -> int | None:
        """Optimizer steps the stage trains for (None for evaluate)."""
        return self.spec.train.steps if hasattr(self.spec, "train") else None

    def schedule(self) -> str:
        """One line on what the stage runs (``panel --dry-run``)."""
        if self.kind == "evaluate":
            return f"evaluate {self.role}"
        t = self.spec.train
        what = {
            "unlearn": lambda: self.spec.name,
            "polish": lambda: "MC",
            "attack": lambda: f"{self.spec.name} K={self.spec.k}",
        }[self.kind]()
        hparams = self.spec.hparams if self.kind == "unlearn" else {}
        extra = "".join(f", {k} {v}" for k, v in hparams.items() if "warmup" in k)
        return (
            f"{what}: {t.steps} steps × batch {t.batch_size}×{t.grad_accum}, lr {t.lr:g} {t.scheduler}, "
            f"warm-up {t.warmup_ratio:g}{extra}"
        )


@dataclasses.dataclass(frozen=True)
class CellPlan:
    """One cell resolved once: every spec its stages run with, and its stage graph."""

    cfg: PanelConfig
    cell: Cell
    family: ModelFamily
    spec: BenchmarkSpec
    theta0_id: str
    ref_id: str
    data_id: dict
    dtype: str
    device: str  # auto: cuda when the machine that runs the cell has one (resolved by the workspace there)
    n_forget: int | None  # |D_f| as trained on (paper scale); None at mini scale, whose schedules are step-based
    method: MethodRun
    mc: MCConfig
    attacks: tuple[tuple[AttackSpec, AttackConfig], ...]
    eval: EvalSettings
    nodes: tuple[Node, ...]

    def node(self, label: str) -> Node:
        return next(n for n in self.nodes if n.label == label)

    def keys(self) -> dict[str, tuple[str, str]]:
        """Label → (stage, key) of every node."""
        return {n.label: (n.kind, n.key) for n in self.nodes}


def stage_key(stage: str, config: dict, inputs: tuple[str, ...] = ()) -> str:
    """Store key of a stage: its resolved config, the stage's code version and the keys of its inputs."""
    from margincal.stages import stage_version

    return config_key(stage, {**config, "code": stage_version(stage)}, inputs)


def _graph(plan: dict) -> tuple[Node, ...]:
    """The stage nodes of a cell: θ_ref's evaluation; unlearn → polish; each model evaluated (against θ_ref's
    evaluation) and attacked by every attacker."""
    nodes: dict[str, Node] = {}
    data, ev = plan["data_id"], {**dataclasses.asdict(plan["eval"]), "dtype": plan["dtype"]}

    def add(label: str, kind: str, role: str, spec: Any, config: dict, inputs: tuple[str, ...] = ()) -> str:
        key = stage_key(kind, config, tuple(nodes[i].key for i in inputs))
        nodes[label] = Node(label, kind, role, spec, config, inputs, key)
        return key

    ref_eval = add(
        "reference/evaluate",
        "evaluate",
        "reference",
        plan["eval"],
        {"model": plan["ref_id"], "reference": None, "data": data, "eval": ev},
    )
    monitored = plan["method"].monitor is not None  # its monitors read θ_ref (m_ref, membership AUCs)
    unlearn = add(
        "baseline/unlearn",
        "unlearn",
        "baseline",
        plan["method"],
        {
            "theta0": plan["theta0_id"],
            "run": dataclasses.asdict(plan["method"]),
            "seed": plan["seed"],
            "data": data,
            "dtype": plan["dtype"],
        },
        ("reference/evaluate",) if monitored else (),
    )
    polish = add(
        "mc/polish",
        "polish",
        "mc",
        plan["mc"],
        {
            "mc": dataclasses.asdict(plan["mc"]),
            "anchors": {"ref": plan["ref_id"], "theta0": plan["theta0_id"]},
            "data": data,
            "dtype": plan["dtype"],
        },
        ("baseline/unlearn", "reference/evaluate"),
    )
    models = {"reference": plan["ref_id"], "theta0": plan["theta0_id"], "baseline": unlearn, "mc": polish}
    makers = {"baseline": ("baseline/unlearn",), "mc": ("mc/polish", "baseline/unlearn")}
    for role, model in models.items():
        if role != "reference":
            add(
                f"{role}/evaluate",
                "evaluate",
                role,
                plan["eval"],
                {"model": model, "reference": ref_eval, "data": data, "eval": ev},
                (*makers.get(role, ()), "reference/evaluate"),
            )
        for spec, attack in plan["attacks"]:
            add(
                f"{role}/attack/{spec.label}",
                "attack",
                role,
                attack,
                {"model": model, "attack": dataclasses.asdict(attack), "reference": ref_eval, "data": data, "eval": ev},
                (*makers.get(role, ()), "reference/evaluate"),
            )
    return tuple(nodes.values())


class _Facts:
    """What the plans of one panel read beyond configuration, each read once: the benchmark spec per model family
    (max_length capped at its context) and the training |D_f| per (family, tier)."""

    def __init__(self, cfg: PanelConfig):
        from margincal.config import resolve_benchmark

        self.cfg, self.bench = cfg, resolve_benchmark(cfg.benchmark)
        self.families: dict[str, ModelFamily] = {}
        self.specs: dict[str, BenchmarkSpec] = {}
        self.sizes: dict[tuple[str, str], int] = {}

    def family(self, model: str) -> ModelFamily:
        if model not in self.families:
            self.families[model] = load_family(model, self.cfg)
        return self.families[model]

    def spec(self, model: str) -> BenchmarkSpec:
        if model not in self.specs:
            from margincal.checks import context_length

            family = self.family(model)
            max_length = context_length(self.bench.max_length, family.context(), False, family.name)
            self.specs[model] = dataclasses.replace(self.bench, max_length=max_length)
        return self.specs[model]

    def n_forget(self, model: str, tier: str) -> int:
        if (model, tier) not in self.sizes:
            self.sizes[model, tier] = training_forget_size(self.family(model), self.spec(model), tier)
        return self.sizes[model, tier]


def training_forget_size(family: ModelFamily, spec: BenchmarkSpec, tier: str) -> int:
    """|D_f| as the unlearn stage trains on it: the records of the benchmark's training forget split, or the
    number of chunks of a raw-text split (read with the family's tokenizer, which is then needed)."""
    from margincal.data.benchmarks import fill_split
    from margincal.data.records import encode_records, is_passage

    records = family.splits()(fill_split(spec.train_splits["forget"], spec, tier))
    if records and all(is_passage(r) for r in records):
        from margincal.models import load_tokenizer

        tokenizer = load_tokenizer(family.tokenizer_source(tier), template=family.template)
        return len(encode_records(tokenizer, records, spec.max_length))
    return len(records)


def plan_cell(cfg: PanelConfig, cell: Cell, facts: _Facts | None = None) -> CellPlan:
    """Resolve ``cell`` once (:func:`plan_panel` shares the facts it reads between cells)."""
    facts = facts or _Facts(cfg)
    family, spec = facts.family(cell.model), facts.spec(cell.model)
    theta0_id, ref_id = family.ids(cell.tier)
    n_forget = facts.n_forget(cell.model, cell.tier) if cfg.scale == "paper" else None
    plan = {
        "data_id": {**family.data_id(cell.tier), "benchmark": dataclasses.asdict(spec), "tier": cell.tier},
        "theta0_id": theta0_id,
        "ref_id": ref_id,
        "dtype": cfg.dtype or family.dtype,
        "seed": cell.seed,
        "eval": cfg.eval,
        "method": method_spec(cfg, cell.method, n_forget or 0),
        "mc": mc_config(cfg, next(v for v in variants(cfg) if v.name == cell.variant), cell.seed),
        "attacks": tuple((a, a.resolve(cfg.scale, cell.seed)) for a in attack_specs(cfg)),
    }
    return CellPlan(
        cfg=cfg,
        cell=cell,
        family=family,
        spec=spec,
        theta0_id=theta0_id,
        ref_id=ref_id,
        data_id=plan["data_id"],
        dtype=plan["dtype"],
        device=cfg.device,
        n_forget=n_forget,
        method=plan["method"],
        mc=plan["mc"],
        attacks=plan["attacks"],
        eval=cfg.eval,
        nodes=_graph(plan),
    )


def plan_panel(cfg: PanelConfig) -> list[CellPlan]:
    """Every cell of the panel, resolved once."""
    facts = _Facts(cfg)
    return [plan_cell(cfg, cell, facts) for cell in expand_cells(cfg)]


def check_data(plans: list[CellPlan]) -> None:
    """The checks that read the data (no model is loaded), once per (model family, tier): every split exists, and
    every attack budget K leaves held-out forget samples (1 ≤ K < |D_f|). Run by ``--dry-run`` and before the first
    cell; data only on the hub is checked when its cell loads it."""
    from margincal.checks import check_budgets
    from margincal.data.benchmarks import fill_split

    seen = set()
    for plan in plans:
        model, tier, spec = plan.cell.model, plan.cell.tier, plan.spec
        if (model, tier) in seen:
            continue
        seen.add((model, tier))
        split = plan.family.local_splits()  # the mini's: its whole benchmark generated, so once per (family, tier)
        if split is None:
            continue
        names = [*spec.splits.values(), *(n for n in spec.train_splits.values() if isinstance(n, str))]
        for name in names:
            split(fill_split(name, spec, tier))
        n_forget = len(split(fill_split(spec.splits["forget"], spec, tier)))
        budgets = sorted({a.k for _, a in plan.attacks})
        check_budgets(budgets, n_forget, f"the attackers of panel {plan.cfg.name} ({model}, {tier})")
