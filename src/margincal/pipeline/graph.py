"""The stage graph as data, and its one builder and one runner: a panel's cell and an audit are both a :class:`Graph`
built by :class:`GraphBuilder` and run by :func:`run_graph` through the store.

A node is (label, kind, role, resolved spec, key config, inputs). Its store key is the digest of its kind, its
config, the stage's code version and its inputs' keys (:func:`stage_key`), so a node whose inputs and settings
another plan already ran is read from the store. A model a panel makes is named in the config by its store entry,
as an audit of that stored model names it, so the nodes that made it run first but stay out of the key and an audit
reuses the panel's evaluations and attacks. A role's model comes from its :class:`ModelSource`: a frozen model
of the workspace (θ_ref, θ0), a checkpoint (a directory or a pinned hub id, with a LoRA adapter's base), or the
model a node stored (the unlearned model; the MC adapter over it).

To add a stage kind: its stage function and writer in :mod:`margincal.pipeline.stages`, its runner
``(run, node, tmp) → stage info`` registered here with the function and the modules it runs (:func:`stage_kind`, the
one registration: the runner, the store key's code version), and its nodes in the plans that use it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from margincal.config.settings import EvalSettings, MethodRun
from margincal.core.artifacts import code_tree, code_version, config_key, digest
from margincal.core.errors import InputError
from margincal.core.registry import Registry
from margincal.mc.bounds import LiftInstrument, coercivity_trace
from margincal.model.loading import clone_model, load_checkpoint, load_model
from margincal.pipeline.stages import (
    Workspace,
    attack_stage,
    evaluate_stage,
    margin_stage,
    polish_stage,
    quantize_stage,
    unlearn_stage,
    write_attack,
    write_evaluation,
    write_polished,
    write_quantized,
    write_unlearned,
)
from margincal.reporting.figures import trajectory_figure
from margincal.store.stage_store import Store
from margincal.training.curves import recording

REFERENCE, THETA0 = "reference", "theta0"  # the roles of θ_ref (the floor) and θ0 (the ceiling)
REFERENCE_EVAL = f"{REFERENCE}/evaluate"  # θ_ref's evaluation: every other model's margins are read against it
REFERENCE_MARGIN = f"{REFERENCE}/margin"  # θ_ref's m(D_f) alone, where a single stage reads no more of it


@dataclasses.dataclass(frozen=True)
class Node:
    """One stage of a plan: ``kind`` (a key of :data:`STAGE_KINDS`) about the model ``role``, run with the resolved
    ``spec``; ``config`` is what enters its store key with the keys of its ``inputs`` (node labels), except the
    nodes :meth:`GraphBuilder.add` was told to run ``after`` (listed first)."""

    label: str
    kind: str
    role: str
    spec: Any
    config: dict
    inputs: tuple[str, ...]
    key: str

    @property
    def steps(self) -> int | None:
        """Optimizer steps the stage trains for (None for evaluate and quantize)."""
        return self.spec.train.steps if hasattr(self.spec, "train") else None

    def schedule(self) -> str:
        """One line on what the stage runs (``panel --dry-run``)."""
        if self.kind in ("evaluate", "quantize"):
            return f"{self.kind} {self.role}" + (f" ({self.spec})" if self.kind == "quantize" else "")
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
class ModelSource:
    """Where a role's model comes from: the workspace's frozen model (``frozen``: ``ref`` or ``theta0``), a checkpoint
    (``path``: a directory, or a hub id with ``@revision``; ``base``: a LoRA adapter's base), the ``model/`` a node
    stored (``node``; ``base_node``: the node whose stored model an adapter goes onto), or a model the caller holds in
    memory (``held``: read as it is, copied before it is trained). A frozen model may also name its checkpoint (a
    quantizer loads it from there)."""

    frozen: str | None = None
    path: str | None = None
    base: str | None = None
    node: str | None = None
    base_node: str | None = None
    held: torch.nn.Module | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Graph:
    """The nodes of a plan in run order, each role's model source, the evaluation settings, and θ_ref's result when
    no node computes it (read from open-unlearning logs; None without a reference)."""

    nodes: tuple[Node, ...]
    sources: Mapping[str, ModelSource]
    eval: EvalSettings
    reference: dict | None = None

    def node(self, label: str) -> Node:
        return next(n for n in self.nodes if n.label == label)

    def keys(self) -> dict[str, tuple[str, str]]:
        """Label → (stage, key) of every node."""
        return {n.label: (n.kind, n.key) for n in self.nodes}


def stage_key(stage: str, config: dict, inputs: tuple[str, ...] = ()) -> str:
    """Store key of a stage: its resolved config, the stage's code version and the keys of its inputs."""
    return config_key(stage, {**config, "code": stage_version(stage)}, inputs)


class GraphBuilder:
    """Nodes added in run order; each key is computed as it is added, from its inputs' keys. ``settings``: the
    evaluation settings every evaluate and attack node scores with; ``data``: the evaluation data's identity
    (:func:`margincal.data.benchmarks.data_identity`); ``dtype``: the models' dtype; ``train``: the identity of the
    training data an attack on retain or probe records draws from (in those attacks' keys alone)."""

    def __init__(self, settings: EvalSettings, data: dict, dtype: str, train: dict | None = None) -> None:
        self.settings, self.data, self.train = settings, data, train
        self.eval = {**dataclasses.asdict(settings), "dtype": dtype}
        self._nodes: dict[str, Node] = {}

    def add(
        self,
        label: str,
        kind: str,
        role: str,
        spec: Any,
        config: dict,
        inputs: tuple[str, ...] = (),
        after: tuple[str, ...] = (),
    ) -> str:
        """Add a node (its inputs added before it) and return its store key. ``after``: nodes that run first but stay
        out of the key, because the config already names what they made (a stored model by its store entry)."""
        if label in self._nodes or kind not in STAGE_KINDS:
            raise ValueError(f"node {label!r} ({kind}): a label is added once, and its kind must have a runner")
        key = stage_key(kind, config, tuple(self._nodes[i].key for i in inputs))
        self._nodes[label] = Node(label, kind, role, spec, config, (*after, *inputs), key)
        return key

    def model_config(self, model: str, reference: dict | None = None) -> dict:
        """The key config every evaluation of a model shares: the model's identity, the reference when it is not a
        node (open-unlearning logs; θ_ref's evaluation node enters as an input instead), the data and the settings."""
        return {"model": model, "reference": reference, "data": self.data, "eval": self.eval}

    def reference_stage(self, model: str) -> str:
        """θ_ref's evaluation, every other model's margins read against it; returns its key."""
        return self.add(REFERENCE_EVAL, "evaluate", REFERENCE, self.settings, self.model_config(model))

    def model_stages(
        self,
        role: str,
        model: str,
        inputs: tuple[str, ...],
        attacks: Mapping[str, Any],
        quantizers: Mapping[str, dict] | None = None,
        reference: dict | None = None,
        makers: tuple[str, ...] = (),
    ) -> None:
        """What every model of a plan gets: ``<role>/evaluate`` (θ_ref's own is :meth:`reference_stage`),
        ``<role>/attack/<label>`` per resolved attack config and ``<role>/quantize/<name>`` per quantizer preset, all
        keyed by :meth:`model_config` of the identity ``model``. ``makers``: the nodes that make the model in this
        graph (a panel's unlearn and polish); they run first, and stay out of the keys, since the identity names the
        model by its store entry already: an audit of that stored model has the same keys and reuses the stages."""
        config = self.model_config(model, reference)
        if role != REFERENCE:
            self.add(f"{role}/evaluate", "evaluate", role, self.settings, config, inputs, makers)
        for label, attack in attacks.items():
            self.attack(f"{role}/attack/{label}", role, model, attack, inputs, reference, makers)
        for name, preset in (quantizers or {}).items():
            quantizer = {**config, "quantizer": preset}
            self.add(f"{role}/quantize/{name}", "quantize", role, name, quantizer, inputs, makers)

    def attack(
        self,
        label: str,
        role: str,
        model: str,
        attack: Any,
        inputs: tuple[str, ...],
        reference: dict | None = None,
        makers: tuple[str, ...] = (),
        instrument: bool = False,
    ) -> Node:
        """The attack node ``label`` of the resolved config ``attack`` on ``role``'s model (identity ``model``), keyed
        by :meth:`model_config` and the config; an attack on retain or probe data by that data's identity too;
        ``instrument``: with Theorem 3's lift measured at every step (:class:`margincal.mc.bounds.LiftInstrument`)."""
        extra: dict[str, Any] = {"instrument": True} if instrument else {}
        if attack.data != "forget":  # D_rel drawn from training data: its identity keys the attack too
            if self.train is None:
                raise InputError(f"attack {label} trains on {attack.data} data, and this plan has none")
            extra["train"] = self.train
        config = {**self.model_config(model, reference), "attack": dataclasses.asdict(attack), **extra}
        self.add(label, "attack", role, attack, config, inputs, makers)
        return self._nodes[label]

    def graph(self, sources: Mapping[str, ModelSource], reference: dict | None = None) -> Graph:
        """The frozen graph: the nodes added, each role's model source, θ_ref's result when no node computes it."""
        return Graph(tuple(self._nodes.values()), dict(sources), self.settings, reference)


class GraphRun:
    """One run of a graph: its workspace and store, the stored directory of every finished node, the loaded model."""

    def __init__(
        self, graph: Graph, ws: Workspace, store: Store, report_to: str = "none", keep: tuple[str, ...] = ()
    ) -> None:
        self.graph, self.ws, self.store, self.report_to, self.keep = graph, ws, store, report_to, keep
        self.paths: dict[str, Path] = {}
        self.made: dict[str, torch.nn.Module] = {}  # the models the nodes of ``keep`` trained, as they left training
        self._loaded: dict[str, torch.nn.Module] = {}

    def read(self, label: str, name: str) -> dict:
        return json.loads((self.paths[label] / name).read_text())

    def location(self, role: str) -> tuple[str | Path, str | Path | None]:
        """(checkpoint, adapter base) of ``role``'s model."""
        source = self.graph.sources[role]
        if source.node is not None:
            base = self.paths[source.base_node] / "model" if source.base_node else None
            return self.paths[source.node] / "model", base
        if source.path is None:
            raise ValueError(f"{role}'s model has no checkpoint to load from")
        return source.path, source.base

    def model(self, role: str) -> torch.nn.Module:
        """The model of ``role``: θ_ref and θ0 shared by the workspace, a held one as it is, any other loaded once
        (one at a time)."""
        source = self.graph.sources[role]
        if source.frozen is not None:
            return self.ws.frozen(source.frozen)
        if source.held is not None:
            return source.held
        if role not in self._loaded:
            self._loaded.clear()
            path, base = self.location(role)
            self._loaded[role] = load_checkpoint(path, base, self.ws.dtype, self.ws.device, **self.ws.load_options)
        return self._loaded[role]

    def trainable(self, role: str) -> torch.nn.Module:
        """A model of ``role`` to train: a copy of the held one (the caller's stays as it was), else loaded from its
        checkpoint."""
        held = self.graph.sources[role].held
        if held is not None:
            return clone_model(held)
        path, base = self.location(role)
        return load_checkpoint(path, base, self.ws.dtype, self.ws.device, **self.ws.load_options)

    def hold(self, node: Node, model: torch.nn.Module) -> None:
        """Keep the model ``node`` trained in memory when the run was asked to (``keep``)."""
        if node.label in self.keep:
            self.made[node.label] = model

    @functools.cached_property
    def reference(self) -> dict | None:
        """θ_ref's evaluation: its node's, else its margin node's (m(D_f) alone), else the graph's (open-unlearning
        logs), else None."""
        for label in (REFERENCE_EVAL, REFERENCE_MARGIN):
            if label in self.paths:
                return self.read(label, "eval.json")
        return self.graph.reference

    def reference_for(self, node: Node) -> dict | None:
        return None if node.role == REFERENCE else self.reference

    def m_ref(self) -> float | None:
        return (self.reference or {}).get("summary", {}).get("m")

    def execute(self, node: Node, log: Callable[[str], None] | None = None, where: str = "") -> Path:
        """Run ``node`` by its kind's runner (or read it from the store), record its stored directory, and log one
        line (``where``: its place in the run, such as ``[3/40]``)."""
        cached, start = self.store.done(node.kind, node.key), time.perf_counter()

        def build(tmp: Path) -> dict:
            with recording(tmp, self.report_to):  # training curves beside the stage (report_to)
                return STAGE_KINDS[node.kind].runner(self, node, tmp)

        self.paths[node.label] = self.store.run(node.kind, node.key, node.config, build)
        if log is not None:
            took = "cached" if cached else f"{time.perf_counter() - start:.1f} s"
            log(f"  {where}{' ' if where else ''}{node.label}: {took}")
        return self.paths[node.label]


@dataclasses.dataclass(frozen=True)
class StageKind:
    """A kind of stage: its ``runner`` ``(run, node, tmp) → stage info`` (what :meth:`GraphRun.execute` calls), the
    stage ``function`` it runs and the margincal ``modules`` whose code it runs; the function's code and the modules'
    (transitively) make its code version (:func:`stage_version`)."""

    runner: Callable[[GraphRun, Node, Path], dict]
    function: Callable
    modules: tuple[str, ...]


STAGE_KINDS: Registry[StageKind] = Registry("stage kind", "stage kinds")  # kind → how it runs (:func:`stage_kind`)


def stage_kind(kind: str, function: Callable, modules: tuple[str, ...]):
    """Register the decorated runner as the stage kind ``kind`` (its stage ``function``, the ``modules`` it runs):
    the one place a new kind is declared."""

    def register(runner: Callable[[GraphRun, Node, Path], dict]) -> Callable[[GraphRun, Node, Path], dict]:
        STAGE_KINDS.add(kind, StageKind(runner, function, tuple(modules)))
        return runner

    return register


@functools.cache
def stage_version(stage: str) -> str:
    """The code version of ``stage``: a digest of its stage function and of every margincal module it runs
    (:func:`margincal.core.artifacts.code_version`). Part of every store key, so results computed by other code are
    never served as current."""
    kind = STAGE_KINDS[stage]
    return digest([code_version(*kind.modules), code_tree(inspect.getsource(kind.function))[0]])


@stage_kind("evaluate", evaluate_stage, ("margincal.evaluation.evaluators",))
def _evaluate(run: GraphRun, node: Node, tmp: Path) -> dict:
    result = evaluate_stage(run.model(node.role), run.ws, node.spec, run.reference_for(node))
    return write_evaluation(tmp, result)


@stage_kind("margin", margin_stage, ("margincal.evaluation.evaluators",))
def _margin(run: GraphRun, node: Node, tmp: Path) -> dict:
    return write_evaluation(tmp, margin_stage(run.model(node.role), run.ws, node.spec))


@stage_kind("unlearn", unlearn_stage, ("margincal.training.unlearning", "margincal.training.monitors"))
def _unlearn(run: GraphRun, node: Node, tmp: Path) -> dict:
    m_ref = run.m_ref() if node.spec.monitor is not None else None
    model, result = unlearn_stage(node.spec, run.ws, node.config["seed"], m_ref)
    run.hold(node, model)
    return write_unlearned(tmp, model, run.ws.tokenizer, node.spec, result)


@stage_kind("polish", polish_stage, ("margincal.mc.polish", "margincal.training.monitors"))
def _polish(run: GraphRun, node: Node, tmp: Path) -> dict:
    """MC on the model its first input (a panel's unlearn node) stored, continuing that method's carried state, kept
    as a LoRA adapter over it; or, with no unlearn node (a single polish of a checkpoint, :func:`margincal.api.polish`),
    on a copy of its role's model with the method and state its config names, the weights merged, and with ``trace``
    the coercivity trace (:func:`margincal.mc.bounds.coercivity_trace`) and ``trajectory.png``."""
    first = run.graph.node(node.inputs[0]) if node.inputs else None
    if first is not None and first.kind == "unlearn":
        state = run.read(first.label, "method.json")["state"]
        base = load_model(run.paths[first.label] / "model", run.ws.dtype, run.ws.device, **run.ws.load_options)
        polished, result = polish_stage(base, first.spec, node.spec, run.ws, run.m_ref(), state, merge=False)
        return write_polished(tmp, polished, run.ws.tokenizer, result, state)
    method, state, trace = MethodRun(**node.config["method"]), node.config["state"], node.config["trace"]
    hook = coercivity_trace(run.ws, node.spec, run.m_ref()) if trace else None
    polished, result = polish_stage(run.trainable(node.role), method, node.spec, run.ws, run.m_ref(), state, hook)
    run.hold(node, polished)
    info = write_polished(tmp, polished, run.ws.tokenizer, result, state)
    if trace:
        trajectory_figure(result.history, tmp / "trajectory.png", f"{method.name}+MC")
    return info


@stage_kind("attack", attack_stage, ("margincal.training.attacks", "margincal.evaluation.evaluators"))
def _attack(run: GraphRun, node: Node, tmp: Path) -> dict:
    """The attack of its role's model; with ``instrument`` in its config, Theorem 3's lift measured at every step
    against its bound (``attack.json``'s ``instrument``: the summary and the trace)."""
    model, probes = run.model(node.role), []

    def instrument(held: list[int]) -> LiftInstrument:
        examples = [run.ws.attack_examples[i] for i in held]
        probes.append(LiftInstrument(model, examples, run.ws.tokenizer.pad_token_id, node.spec.beta))
        return probes[-1]

    measured = instrument if node.config.get("instrument") else None
    result = attack_stage(model, node.spec, run.ws, run.graph.eval, run.m_ref(), measured)
    if probes:
        result["instrument"] = {"summary": probes[0].summary(), "trace": probes[0].rows}
    return write_attack(tmp, result)


@stage_kind("quantize", quantize_stage, ("margincal.model.quantize", "margincal.evaluation.evaluators"))
def _quantize(run: GraphRun, node: Node, tmp: Path) -> dict:
    path, base = run.location(node.role)
    return write_quantized(tmp, quantize_stage(str(path), node.spec, run.ws, run.graph.eval, run.m_ref(), base))


STAGE_KINDS.freeze()  # every kind a plan runs is registered above

#: The stage kinds that train (their curves go to ``report_to``).
TRAINING_KINDS = ("unlearn", "polish", "attack")


def run_graph(
    graph: Graph,
    ws: Workspace,
    store: Store,
    log: Callable[[str], None] | None = None,
    report_to: str = "none",
    keep: tuple[str, ...] = (),
) -> GraphRun:
    """Run (or read from the store) every node of ``graph`` in order, by its kind's runner; with ``log``, one
    progress line per node; the training curves of every stage it runs to ``report_to``
    (:mod:`margincal.training.curves`); the models the training nodes ``keep`` name trained in ``run.made``. Returns
    the run (its ``paths``: label → stored directory)."""
    run = GraphRun(graph, ws, store, report_to, keep)
    stored = [node.label for node in graph.nodes if node.kind in TRAINING_KINDS and store.done(node.kind, node.key)]
    for i, node in enumerate(graph.nodes, 1):
        run.execute(node, log, f"[{i}/{len(graph.nodes)}]")
    bare = [label for label in stored if not (run.paths[label] / report_to).is_dir()]
    if report_to != "none" and bare:  # stored by a run that did not report: say so rather than write nothing silently
        logging.getLogger(__name__).info(
            f"report_to {report_to}: no training curve was written for {len(bare)} stage(s) read from the store "
            f"({', '.join(bare[:3])}{', ...' if len(bare) > 3 else ''}): they were trained before without "
            "report_to; run them again with another --store to record their curves"
        )
    return run
