"""A plan is a value: one cell resolved once into frozen specs and the list of its stage nodes.

:func:`plan_panel` resolves every cell of a panel once, reading configuration and, at paper scale, the size of each
(model family, tier)'s training forget split (the epoch-based schedules become optimizer steps at the real |D_f|;
no model is loaded). A :class:`CellPlan` holds the benchmark spec (``max_length`` capped at the model's context),
the model and data identities, the method run, the MC config, the attacks and the evaluation settings, and its
:attr:`~CellPlan.graph`: the stage graph as data, built by the builder an audit's plan uses
(:mod:`margincal.pipeline.graph`). Store keys, ``panel --dry-run``, execution (:func:`margincal.pipeline.cell.run_cell`,
through :func:`margincal.pipeline.graph.run_graph`) and the cell record all read that one graph; nothing after the
plan calls a resolver. To add a stage to a cell: its node in :func:`_graph` (and its kind registered with
:func:`margincal.pipeline.graph.stage_kind` if the kind is new).
"""

from __future__ import annotations

import dataclasses

from margincal.config.settings import AttackConfig, BenchmarkSpec, EvalSettings, MCConfig, MethodRun, resolve_benchmark
from margincal.data.benchmarks import data_identity, fill_split, load_benchmark_splits
from margincal.data.checks import check_budgets, context_length
from margincal.data.records import encode_records, is_passage
from margincal.model.loading import load_tokenizer
from margincal.pipeline.families import ModelFamily
from margincal.pipeline.graph import REFERENCE, REFERENCE_EVAL, THETA0, Graph, GraphBuilder, ModelSource
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
    graph: Graph


SOURCES = {  # where a cell's models come from: θ_ref and θ0 frozen in the workspace, the others from the store
    REFERENCE: ModelSource(frozen="ref"),
    THETA0: ModelSource(frozen="theta0"),
    "baseline": ModelSource(node="baseline/unlearn"),
    "mc": ModelSource(node="mc/polish", base_node="baseline/unlearn"),
}


def _graph(plan: dict) -> Graph:
    """The stage graph of a cell: θ_ref's evaluation; unlearn → polish; each model evaluated (against θ_ref's
    evaluation) and attacked by every attacker."""
    graph = GraphBuilder(plan["eval"], plan["data_id"]["eval"], plan["dtype"], plan["data_id"]["train"])
    data = plan["data_id"]  # what the unlearn and polish stages read: the evaluation data and the training data
    graph.reference_stage(plan["ref_id"])
    monitored = plan["method"].monitor is not None  # its monitors read θ_ref (m_ref, membership AUCs)
    unlearn = graph.add(
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
        (REFERENCE_EVAL,) if monitored else (),
    )
    polish = graph.add(
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
        ("baseline/unlearn", REFERENCE_EVAL),
    )
    # a stored model is named by its store entry, as an audit of that directory names it
    # (margincal.store.stage_store.Store.entry)
    models = {
        REFERENCE: plan["ref_id"],
        THETA0: plan["theta0_id"],
        "baseline": f"unlearn/{unlearn}",
        "mc": f"polish/{polish}",
    }
    makers = {"baseline": ("baseline/unlearn",), "mc": ("mc/polish", "baseline/unlearn")}
    attacks = {spec.label: attack for spec, attack in plan["attacks"]}
    for role, model in models.items():
        graph.model_stages(role, model, (REFERENCE_EVAL,), attacks, makers=makers.get(role, ()))
    return graph.graph(SOURCES)


class _Facts:
    """What the plans of one panel read beyond configuration, each read once: the benchmark spec per model family
    (max_length capped at its context), the data identity and the training |D_f| per (family, tier)."""

    def __init__(self, cfg: PanelConfig):
        self.cfg, self.bench = cfg, resolve_benchmark(cfg.benchmark)
        self.families: dict[str, ModelFamily] = {}
        self.specs: dict[str, BenchmarkSpec] = {}
        self.sizes: dict[tuple[str, str], int] = {}
        self.identities: dict[tuple[str, str], dict] = {}

    def family(self, model: str) -> ModelFamily:
        if model not in self.families:
            self.families[model] = load_family(model, self.cfg)
        return self.families[model]

    def spec(self, model: str) -> BenchmarkSpec:
        if model not in self.specs:
            family = self.family(model)
            max_length = context_length(self.bench.max_length, family.context(), False, family.name)
            self.specs[model] = dataclasses.replace(self.bench, max_length=max_length)
        return self.specs[model]

    def data(self, model: str, tier: str) -> dict:
        """The data identity of (family, tier): ``eval``, what evaluations and attacks read
        (:func:`margincal.data.benchmarks.data_identity` of the evaluation splits: an audit on the same data shares
        them; for data only on the hub, the source instead, as it is not read before its cell runs) and ``train``,
        what training reads besides (the family's data settings or source)."""
        if (model, tier) not in self.identities:
            family, spec = self.family(model), self.spec(model)
            train = family.data_id(tier)
            split = family.local_splits()
            if split is None:
                evaluation = {"benchmark": dataclasses.asdict(spec), "tier": tier, **train}
            else:
                splits = load_benchmark_splits(spec, tier, split)
                evaluation = data_identity(spec, tier, train["template"], splits)
            self.identities[model, tier] = {"eval": evaluation, "train": train}
        return self.identities[model, tier]

    def n_forget(self, model: str, tier: str) -> int:
        if (model, tier) not in self.sizes:
            self.sizes[model, tier] = training_forget_size(self.family(model), self.spec(model), tier)
        return self.sizes[model, tier]


def training_forget_size(family: ModelFamily, spec: BenchmarkSpec, tier: str) -> int:
    """|D_f| as the unlearn stage trains on it: the records of the benchmark's training forget split, or the
    number of chunks of a raw-text split (read with the family's tokenizer, which is then needed)."""
    records = family.splits()(fill_split(spec.train_splits["forget"], spec, tier))
    if records and all(is_passage(r) for r in records):
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
        "data_id": facts.data(cell.model, cell.tier),
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
        graph=_graph(plan),
    )


def plan_panel(cfg: PanelConfig) -> list[CellPlan]:
    """Every cell of the panel, resolved once."""
    facts = _Facts(cfg)
    return [plan_cell(cfg, cell, facts) for cell in expand_cells(cfg)]


def check_data(plans: list[CellPlan]) -> None:
    """The checks that read the data (no model is loaded), once per (model family, tier): every split exists, and
    every attack budget K leaves held-out forget samples (1 ≤ K < |D_f|). Run by ``--dry-run`` and before the first
    cell; data only on the hub is checked when its cell loads it."""
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
        budgets, where = (
            sorted({a.k for _, a in plan.attacks}),
            f"the attackers of panel {plan.cfg.name} ({model}, {tier})",
        )
        if spec.relearn_from == "corpus":  # D_rel: chunks of the forget corpus (read with the family's tokenizer)
            if plan.n_forget is None and not plan.family.tokenizer_ready(tier):
                continue  # the mini's tokenizer is a store stage: the cell checks K against the chunks before compute
            chunks = plan.n_forget or training_forget_size(plan.family, spec, tier)
            check_budgets(budgets, chunks, where, corpus=True)
        else:
            check_budgets(budgets, len(split(fill_split(spec.splits["forget"], spec, tier))), where)
