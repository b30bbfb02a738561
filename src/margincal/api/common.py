"""What every public function shares: the kinds of model, data and settings it takes, each turned into what the
stages read and checked (:class:`~margincal.core.errors.InputError` on anything else)."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from margincal.model.loading import shown_model
from margincal.pipeline.graph import REFERENCE, REFERENCE_MARGIN, GraphBuilder, GraphRun, ModelSource, run_graph
from margincal.pipeline.stages import Workspace
from margincal.store.stage_store import Store, default_store

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


@dataclasses.dataclass(frozen=True)
class PlanRun:
    """A stage call's plan as run: the graph run, per node label whether the store held it, and whether the store was
    the call's own (``ephemeral``: a model in memory was among its inputs; nothing in it outlives the call)."""

    run: GraphRun
    cached: dict[str, bool]
    ephemeral: bool


def _source(model: Model, store: Store, identify: bool) -> tuple[ModelSource, str]:
    """Where the graph reads ``model`` from and its identity in store keys: a model in memory as it is held, named as
    messages name it; a checkpoint by its store entry, weights digest or pinned hub commit, or (``identify`` False:
    on a store of the call's own, whose keys no later call reads) by its resolved path, no digest computed."""
    if in_memory(model):
        return ModelSource(held=model), shown_model(model)
    ckpt = checkpoint(str(model), store=store, identify=identify)
    return ModelSource(path=ckpt.spec, base=ckpt.base), ckpt.identity if identify else f"path:{ckpt.spec}"


@contextlib.contextmanager
def stage_plan(
    model: Model,
    ws: Workspace,
    settings: EvalSettings,
    tier: str,
    add: Callable,
    store: str | Path | None,
    *,
    reference: dict | None = None,
    margin: bool = False,
    report_to: str = "none",
    keep: tuple[str, ...] = (),
) -> Iterator[PlanRun]:
    """The one path of every single-stage call: its stages on ``model`` run as a plan by the graph runner, in the
    ``with`` block. ``add(builder, ids, inputs)`` adds the nodes, keyed by ``ids`` (role → identity: ``model`` and
    the workspace's frozen models, :func:`_source`), the workspace's evaluation data and ``settings``, and taking
    ``inputs`` (with ``margin``, θ_ref's m(D_f) as a node of its own, ``reference/margin``); ``reference`` is θ_ref's
    result when the caller gives it. The store is ``store`` (default ``$MARGINCAL_STORE`` or ``runs/store``), where
    the same call again is read back; with a model in memory among the inputs it is the call's own, a new directory
    under ``<store>/held`` removed when the block ends, and the models the training nodes ``keep`` name stay in
    memory (``run.made``)."""
    root = Path(store or default_store())
    ephemeral = any(in_memory(m) for m in (model, *ws.models.values()))
    stages = Store(root / "held" / uuid.uuid4().hex[:12] if ephemeral else root)
    try:
        known: dict[int, tuple[ModelSource, str]] = {}  # each model identified once (θ0 is also unlearn's model)
        for m in (model, *ws.models.values()):
            known.setdefault(id(m), _source(m, stages, identify=not ephemeral))
        source, identity = known[id(model)]
        ids = {"model": identity, **{role: known[id(m)][1] for role, m in ws.models.items()}}
        template = dataclasses.asdict(ws.tokenizer.margincal_template)
        builder = GraphBuilder(settings, data_identity(ws.benchmark, tier, template, ws.eval_splits), ws.dtype)
        sources = {"model": source}
        if margin:
            builder.add(REFERENCE_MARGIN, "margin", REFERENCE, settings, builder.model_config(ids["ref"]))
            sources[REFERENCE] = ModelSource(frozen="ref")
        add(builder, ids, (REFERENCE_MARGIN,) if margin else ())
        graph = builder.graph(sources, reference)
        cached = {node.label: stages.done(node.kind, node.key) for node in graph.nodes}
        run = run_graph(graph, ws, stages, report_to=report_to, keep=keep if ephemeral else ())
        yield PlanRun(run, cached, ephemeral)
    finally:
        if ephemeral:
            shutil.rmtree(stages.root, ignore_errors=True)
            with contextlib.suppress(OSError):  # and <store>/held itself once no other call holds a folder there
                stages.root.parent.rmdir()
