"""What every public function shares: the kinds of model, data and settings it takes, each turned into what the
stages read and checked (:class:`~margincal.core.errors.InputError` on anything else)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from margincal.auditing.plan import checkpoint
from margincal.config.settings import EvalSettings, resolve_benchmark
from margincal.config.typed import apply_overrides, build
from margincal.core.errors import InputError
from margincal.data.benchmarks import data_identity
from margincal.data.records import QARecord, check_distinct
from margincal.data.tofu import load_qa_json, records_from_rows
from margincal.pipeline.graph import GraphBuilder, GraphRun, ModelSource, run_graph
from margincal.pipeline.stages import Workspace
from margincal.store.stage_store import Store

Model = str | Path | torch.nn.Module
Records = str | Path | Sequence[QARecord] | Sequence[dict]
T = TypeVar("T")


def records(data: Records | None, what: str, forget: bool = False) -> list[QARecord] | None:
    """The QA records ``data`` names: a TOFU-format file, or a list of records or TOFU rows; a forget split's must be
    distinct (:func:`margincal.data.records.check_distinct`). None stays None."""
    if data is None:
        return None
    if isinstance(data, str | Path):
        out = load_qa_json(data)
        what = f"{what} {data}"
    elif isinstance(data, Sequence) and all(isinstance(r, QARecord) for r in data):
        out = list(data)
    elif isinstance(data, Sequence) and all(isinstance(r, Mapping) for r in data):
        out = records_from_rows([dict(r) for r in data], what)
    else:
        raise InputError(f"{what}: give a TOFU-format file or a list of QARecord or of TOFU rows (dicts)")
    if not out:
        raise InputError(f"{what} holds no QA records")
    if forget:
        check_distinct(out, what)
    return out


def settings_of(cls: type[T], value: T | Mapping[str, Any] | Sequence[str] | None, where: str) -> T:
    """Settings of type ``cls`` from an instance, a mapping of its fields or ``key=value`` overrides (None: its
    defaults), checked by its own rules."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return build(cls, dict(value), where)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return build(cls, apply_overrides({}, list(value)), where)
    raise InputError(f"{where}: give a {cls.__name__}, a mapping of its fields or key=value overrides")


def benchmark_spec(name: str, max_length=None, max_new_tokens=None, aggregate=None):
    """The benchmark ``name``'s spec with the given context, generation length and aggregate replacing its own."""
    changes = {"max_length": max_length, "max_new_tokens": max_new_tokens, "aggregate": aggregate}
    return dataclasses.replace(resolve_benchmark(name), **{k: v for k, v in changes.items() if v is not None})


def local_paths(*paths: object) -> list[Path]:
    """The given inputs that are local files or directories (an output must never replace one); models in memory
    and hub ids are skipped."""
    return [Path(p) for p in paths if isinstance(p, str | Path) and Path(p).exists()]


def in_memory(model: Model) -> bool:
    """Whether ``model`` is a model in memory (not a path or hub id)."""
    return isinstance(model, torch.nn.Module)


def stored_plan(
    model: str,
    ws: Workspace,
    settings: EvalSettings,
    tier: str,
    reference: dict | None,
    add: Callable,
    store: Store,
    report_to: str = "none",
) -> tuple[GraphRun, dict[str, bool]]:
    """Stages of ``model`` (a path or hub id) run as a plan through the store by the graph runner: ``add(builder,
    identity)`` adds the nodes, keyed by the model's identity (its store entry, weights digest or pinned hub commit)
    as a panel's or audit's nodes of it are, the workspace's evaluation data and ``settings``; ``reference`` is
    θ_ref's result when no node computes it; the training curves of a stage it runs go to ``report_to``. Returns the
    run and, per node label, whether the store held it."""
    ckpt = checkpoint(model, store=store)
    template = dataclasses.asdict(ws.tokenizer.margincal_template)
    builder = GraphBuilder(settings, data_identity(ws.benchmark, tier, template, ws.eval_splits), ws.dtype)
    add(builder, ckpt.identity)
    graph = builder.graph({"model": ModelSource(path=ckpt.spec, base=ckpt.base)}, reference)
    cached = {node.label: store.done(node.kind, node.key) for node in graph.nodes}
    return run_graph(graph, ws, store, report_to=report_to), cached
