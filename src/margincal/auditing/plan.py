"""The audit plan: every input resolved and checked once, before the first forward pass, into stage nodes.

A checkpoint is named by its content (``local@<sha256 of its weight files>``, an adapter by its own digest and its
base's, a hub id by its resolved commit), so auditing it again, or auditing another checkpoint against the same
θ_ref and θ0, reuses every finished stage of the store. The nodes, per model role (each audited checkpoint, the
``reference`` θ_ref and ``theta0``):

* ``<role>/evaluate``: the benchmark's evaluator (against θ_ref's evaluation, or open-unlearning retain logs);
* ``<role>/attack/<preset>@<K>/d<draw>``: every budget attack on D_rel draw ``draw`` (seed = draw), scored on the
  held-out forget set; θ_ref's is the floor and θ0's the ceiling of the audited checkpoint's;
* ``<role>/quantize/<preset>``: the whole forget set scored under a bitsandbytes quantizer.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from margincal.auditing.spaces import TRIAL_EXECUTORS, max_trials
from margincal.config.files import CONFIG_DIR, read_yaml, shown
from margincal.config.settings import AttackConfig, BenchmarkSpec, EvalSettings
from margincal.config.typed import (
    MAX_DRAWS,
    apply_overrides,
    at_most,
    build_sourced,
    check_fields,
    one_of,
    override_layers,
)
from margincal.core.artifacts import check_name, weights_digest
from margincal.core.errors import InputError
from margincal.core.inputs import read_json
from margincal.data.draws import SearchSplit
from margincal.data.hub import pinned, split_revision
from margincal.model.loading import _resolve_name, check_adapter, check_checkpoint, load_checkpoint
from margincal.model.quantize import resolve_quantizer
from margincal.pipeline.graph import REFERENCE, REFERENCE_EVAL, THETA0, Graph, GraphBuilder, ModelSource, Node
from margincal.pipeline.panel import AttackerEntry, AttackSpec, entry_specs
from margincal.store.stage_store import Store

BUDGETS = CONFIG_DIR / "audit.yaml"


@dataclasses.dataclass
class SearchBlock:
    """A budget's ``search:`` block: per attacker preset with a space in ``configs/search.yaml``, ``trials`` searched
    attacks (at most its ``max_trials``) bounded by a utility drop of at most ``epsilon`` (in (0, 1]); ``workers``
    trials asked at once and run on the ``executor`` (:mod:`margincal.auditing.trials`: ``serial``, ``processes``,
    ``ray``). The trials a search runs depend on ``workers``, never on the executor."""

    epsilon: float
    trials: int = 20
    workers: int = 1
    executor: str = "serial"

    def __post_init__(self) -> None:
        check_fields(
            self,
            epsilon=(lambda v: 0 < v <= 1, "in (0, 1]"),
            trials=at_most(max_trials()),
            workers=at_most(64),
            executor=one_of(*TRIAL_EXECUTORS),
        )


@dataclasses.dataclass
class AuditBudget:
    """One ``configs/audit.yaml`` budget: attackers (presets and K), quantizer presets, D_rel draws, headline, and
    an optional ``search`` block (:mod:`margincal.auditing.search`)."""

    description: str
    draws: int
    attackers: list[AttackerEntry]
    quantizers: list[str]
    headline: str
    search: SearchBlock | None = None

    def __post_init__(self) -> None:
        check_fields(self, draws=at_most(MAX_DRAWS))

    def specs(self) -> list[AttackSpec]:
        return [spec for entry in self.attackers for spec in entry_specs(entry)]


def load_budget(name: str, overrides: list[str] | tuple[str, ...] = ()) -> AuditBudget:
    """The budget ``name`` of ``configs/audit.yaml`` with ``key=value`` overrides (``draws=5``)."""
    budgets = read_yaml(BUDGETS)
    if name not in budgets:
        raise InputError(f"unknown audit budget {name!r}; known: {', '.join(budgets)} ({shown(BUDGETS)})")
    layers = [(f"{shown(BUDGETS)}: {name}", budgets[name]), *override_layers(list(overrides))]
    budget = build_sourced(AuditBudget, apply_overrides(budgets[name], list(overrides)), layers)
    if budget.headline not in {s.label for s in budget.specs()}:
        raise InputError(f"budget {name}: headline {budget.headline!r} is not one of its attacks")
    return budget


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """An audited model: a display ``name``, where it loads from (``path``: a directory or hub id, ``revision``),
    the ``base`` of a LoRA adapter, its content ``identity`` in store keys, and what the card calls it when not its
    path (``held``: a model the caller held in memory, audited from a temporary copy)."""

    name: str
    path: str
    identity: str
    revision: str | None = None
    base: str | None = None
    held: str | None = None

    def load(self, dtype: str, device: str):
        return load_checkpoint(self.spec, self.base, dtype, device)

    @property
    def spec(self) -> str:
        """What the loaders take: ``path``, with ``@revision`` for a pinned hub id."""
        return f"{self.path}@{self.revision}" if self.revision else self.path

    @property
    def shown(self) -> str:
        """What messages and the card call it: the model held in memory, else :attr:`spec`."""
        return self.held or self.spec


def derived_name(text: str) -> str:
    """A checkpoint's name when none is given, from its directory or hub id: every run of characters outside the name
    rule (:data:`margincal.core.artifacts.NAME`; ``/`` of a hub id, spaces) becomes ``_``, leading dots go."""
    name = re.sub(r"[^A-Za-z0-9._+@-]+", "_", text).lstrip(".-+@")[:100]
    return name or "checkpoint"


def checkpoint(
    spec: str, name: str | None = None, base: str | None = None, store: Store | None = None, identify: bool = True
) -> Checkpoint:
    """A ``--model`` value resolved: a local directory (a margincal stage directory stands for its ``model/``), a
    LoRA adapter (its base from ``base`` or its ``adapter_config.json``; a missing base, or one without the adapter's
    target modules, stops here) or a hub id with an optional ``@revision`` (pinned to the commit it resolves to). A
    ``name`` given must be a valid name (:func:`margincal.core.artifacts.check_name`: it names the card's folder);
    without one it is derived from the directory or hub id (:func:`derived_name`). ``identify=False`` runs the checks
    alone (no digest is computed or cached, no hub is asked): an audit checks every checkpoint before it identifies one.

    Identity: a model ``store`` holds (a panel's θ_ref, θ0, unlearned or polished model) by its entry there, as its
    panel names it (:meth:`margincal.store.stage_store.Store.entry`), so the audit shares that panel's stored stages;
    any other local directory by the digest of its weights (cached under ``<store>/digests``)."""
    if name is not None:
        check_name(name, "audit checkpoint name")
    local = Path(spec).expanduser()
    if local.exists() or spec.startswith((".", "/", "~")):
        path = Path(_resolve_name(local))
        check_checkpoint(path)
        folder = Path(os.path.abspath(local))  # `..` normalised, symbolic links kept (their name shows)
        shown_name = name or derived_name(folder.name if folder.name != "model" else folder.parent.name)
        adapter = path / "adapter_config.json"
        digests = store.root / "digests" if store is not None else None
        digest = (lambda: weights_digest(path, digests)) if identify else (lambda: "unidentified")
        entry = store.entry(path) if identify and store is not None else None
        if not adapter.is_file():
            return Checkpoint(shown_name, str(path), entry or f"local@{digest()}")
        if base is None:
            config = read_json(adapter)
            base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
            if base is not None and not isinstance(base, str):
                raise InputError(f"{adapter}: base_model_name_or_path must be a string, got {type(base).__name__}")
        if not base or (base.startswith((".", "/", "~")) and not Path(base).expanduser().exists()):
            raise InputError(
                f"{path} is a LoRA adapter whose base model ({base or 'not named'}) is missing; give it with --base DIR"
            )
        base_id = checkpoint(base, store=store, identify=identify).identity
        check_adapter(path, base)
        return Checkpoint(shown_name, str(path), entry or f"adapter@{digest()}+{base_id}", base=base)
    repo, revision = split_revision(spec)
    identity = pinned(repo, revision) if identify else repo
    commit = identity.partition("@")[2] or revision
    return Checkpoint(name or derived_name(spec), repo, identity, revision=commit or None)


@dataclasses.dataclass(frozen=True)
class AuditPlan:
    """Everything an audit runs, resolved once: models by role, data, budget, attack configs and its stage graph."""

    models: dict[str, Checkpoint]  # role -> checkpoint: the audited ones by name, and reference / theta0 if given
    audited: list[str]
    spec: BenchmarkSpec
    tier: str
    data_id: dict  # margincal.data.benchmarks.data_identity: the one a panel's cell on the same data has
    missing: list[str]  # the benchmark's utility splits the data does not hold (left out, named in the card)
    scale: str
    budget_name: str
    budget: AuditBudget
    attacks: dict[str, AttackConfig]  # "<label>/d<draw>" -> resolved config
    eval: EvalSettings
    dtype: str
    device: str
    ref_logs: dict | None  # open-unlearning retain logs, read into a reference result
    graph: Graph
    templates: dict[str, dict]  # role -> the prompt template it is scored under (one for all: checked)
    builder: GraphBuilder  # the graph's builder: a searched attack's trials and winners are nodes added to it
    searches: dict = dataclasses.field(default_factory=dict)  # preset -> its resolved search (audit/search.py)
    control: str | None = None  # an audited control checkpoint the population pairs every other one with
    split: SearchSplit | None = None  # the searches' one split of D_f: relearn pool, selection, report (data/draws.py)

    @property
    def floor_and_ceiling(self) -> bool:
        return REFERENCE in self.models and THETA0 in self.models

    def attack_node(self, role: str, label: str, cfg: AttackConfig) -> Node:
        """An attack node on ``role``'s model keyed as the graph's own (θ_ref's evaluation as input, or the
        open-unlearning logs' digest), added to the plan's builder: a searched trial or winner."""
        inputs, reference = reference_keys(self.models, self.ref_logs)
        return self.builder.attack(label, role, self.models[role].identity, cfg, inputs, reference)


def reference_keys(models: dict[str, Checkpoint], ref_logs: dict | None) -> tuple[tuple[str, ...], dict | None]:
    """What keys every model's stages against the reference: θ_ref's evaluation node as input when θ_ref is given,
    else the open-unlearning logs' digest in the config (else nothing)."""
    if REFERENCE in models:
        return (REFERENCE_EVAL,), None
    return (), {"open-unlearning logs": ref_logs["digest"]} if ref_logs is not None else None


def audit_graph(
    models: dict[str, Checkpoint],
    audited: list[str],
    data_id: dict,
    settings: EvalSettings,
    dtype: str,
    attacks: dict[str, AttackConfig],
    quantizers: list[str],
    ref_logs: dict | None,
    train: dict | None = None,
) -> tuple[Graph, GraphBuilder]:
    """The stage graph of an audit, by the builder a panel's cell uses: θ_ref's evaluation first, then per model
    (θ_ref, θ0, each audited checkpoint; each loaded once) its evaluation, budget attacks and quantizers. The builder
    too: a search adds its trials' and winners' nodes to it."""
    graph = GraphBuilder(settings, data_id, dtype, train)
    ref_inputs, reference = reference_keys(models, ref_logs)
    if REFERENCE in models:
        graph.reference_stage(models[REFERENCE].identity)
    presets = {name: dataclasses.asdict(resolve_quantizer(name)) for name in quantizers}
    for role in [r for r in (REFERENCE, THETA0) if r in models] + audited:
        graph.model_stages(role, models[role].identity, ref_inputs, attacks, presets, reference)
    frozen = {REFERENCE: "ref", THETA0: "theta0"}
    sources = {role: ModelSource(frozen.get(role), ckpt.spec, ckpt.base) for role, ckpt in models.items()}
    return graph.graph(sources, ref_logs["reference"] if ref_logs else None), graph
