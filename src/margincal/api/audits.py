"""The audit as a library function: :func:`audit`."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from margincal.api.common import local_paths, settings_of
from margincal.auditing import inputs as audit_inputs
from margincal.auditing.merge import merge_population, read_audits
from margincal.auditing.plan import derived_name
from margincal.auditing.prepare import AuditRequest, prepare_audit, weight_distances
from margincal.auditing.report import write_audit
from margincal.auditing.search import run_searches
from margincal.config.settings import DEFAULT_BUDGET, DEFAULT_DEVICE, DEFAULT_DTYPE, EvalSettings
from margincal.config.typed import checked_call
from margincal.core.artifacts import check_name, check_output
from margincal.core.errors import InputError
from margincal.data.checks import check_device
from margincal.model.loading import check_in_memory, load_tokenizer, save_model
from margincal.pipeline.graph import run_graph
from margincal.results.outputs import AuditCard
from margincal.store.stage_store import Store, default_store
from margincal.training.curves import DEFAULT_REPORT_TO, check_report_to

Held = torch.nn.Module | tuple[torch.nn.Module, Any]  # a model in memory, alone or with its tokenizer
Audited = str | Path | Held


@checked_call
def audit(
    models: Audited | Sequence[Audited] | Mapping[str, Audited] = (),
    *,
    out: str | Path,
    models_file: str | None = None,
    from_panel: str | None = None,
    data: str | None = None,
    benchmark: str | None = None,
    tier: str | None = None,
    ref: str | None = None,
    ref_logs: str | None = None,
    theta0: str | None = None,
    budget: str = DEFAULT_BUDGET,
    overrides: Sequence[str] = (),
    scale: str | None = None,
    base: str | None = None,
    settings: EvalSettings | Mapping[str, Any] | Sequence[str] | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    store: str | Path | None = None,
    control: str | None = None,
    claimed: Sequence[str] = (),
    report_to: str = DEFAULT_REPORT_TO,
    model_card: bool = False,
    overwrite: bool = False,
    command: str = "margincal.audit(...)",
    log: Callable[[str], None] | None = None,
) -> AuditCard:
    """The relearn robustness card of ``models``: checkpoints (``[NAME=]CKPT``: a directory or hub id) or models
    held in memory (alone, scored with θ0's tokenizer, or ``(model, tokenizer)``), one, a list or a mapping name →
    either, with ``models_file`` lines and ``from_panel``'s cells: Δ with a bootstrap interval, the certificate,
    forget metrics, the five MIA detectors, utility, and the ``budget``'s relearn attacks and quantizers
    (``configs/audit.yaml``; ``worst*`` search attacks under a utility bound), each verdict the fraction of the θ_ref
    floor to θ0 ceiling gap it recovers. ``data``: a TOFU-format directory, or a mini export (its θ_ref, θ0 and tier
    the defaults). Every stage runs through the store; a held model is saved into a temporary directory there,
    keyed by its weights' digest (its card is its saved directory's). ``out`` gets ``card.json``, ``card.md``, the
    figures and, with ``model_card``, each checkpoint's Hugging Face model card (``<out>/<name>/README.md``,
    :mod:`margincal.auditing.modelcard`); ``log`` a line per stage.

    Example (the polished model of :func:`~margincal.api.polish`'s example, one LoRA attack at K = 4)::

            card = margincal.audit({"npo_mc": p.out}, data=mini.dir, out=f"{tmp}/audit", overrides=[
                "attackers=[{preset: lora_r8, k: [4], set: {train.steps: 4}}]", "headline=lora_r8@4", "quantizers=[]"])
            print(card.delta("npo_mc"), card.recovered("npo_mc"))
    """
    check_device(device)
    check_report_to(report_to)
    resolved, held = _audited(models, models_file, from_panel)
    floor = audit_inputs.floor_and_ceiling(data, benchmark, tier, ref, ref_logs, theta0)
    if floor.note and log is not None:
        log(floor.note)
    _check_held(held, [name for _, name in resolved], floor.theta0)  # then out, every input it must not replace known
    claims = audit_inputs.claimed(claimed)
    named = (data, floor.ref, ref_logs, floor.theta0, models_file, from_panel, base, *(m for m, _ in resolved))
    named += tuple(claim["path"] for _, claim in claims)
    out = check_output(out, directory=True, overwrite=overwrite, inputs=local_paths(*named))
    stages = Store(store or default_store())
    request = AuditRequest(
        models=resolved,
        data=data,
        benchmark=floor.benchmark,
        tier=floor.tier,
        ref=floor.ref,
        ref_logs=ref_logs,
        theta0=floor.theta0,
        budget=budget,
        overrides=overrides,
        scale=scale,
        base=base,
        settings=settings_of(EvalSettings, settings, "settings"),
        dtype=dtype,
        device=device,
        template=template,
        control=control,
    )
    with _saved(held, floor.theta0, stages) as copies:
        shown = {str(path): f"{type(held[name][0]).__name__} held in memory" for name, path in copies.items()}
        request = dataclasses.replace(request, models=[*resolved, *_entries_of(copies)], held=shown)
        return _run(request, stages, claims, log, report_to, out, command, model_card)


def _entries_of(copies: Mapping[str, Path]) -> list[tuple[str, str]]:
    """The held models' temporary copies as (checkpoint, name) entries."""
    return [(str(path), name) for name, path in copies.items()]


def _run(
    request: AuditRequest, stages: Store, claims, log, report_to, out: Path, command: str, card: bool
) -> AuditCard:
    """The audit asked for, every input checked: prepared, its graph and searches run, its card written."""
    plan, ws = prepare_audit(request, stages)
    claimed_by = audit_inputs.match_claims(claims, plan.audited)
    if log is not None:
        log(_planned(plan, stages, request.budget))
    run = run_graph(plan.graph, ws, stages, log, report_to)
    searches = run_searches(plan, ws, run, log)
    return write_audit(plan, run.paths, weight_distances(plan, ws), out, command, searches, claimed_by, card)


def _planned(plan, stages: Store, budget: str) -> str:
    """The audit's plan in one line: checkpoints, stages, how many the store holds, and where."""
    cached = sum(stages.done(n.kind, n.key) for n in plan.graph.nodes)
    nodes = len(plan.graph.nodes)
    return f"audit ({budget}): {len(plan.audited)} checkpoint(s), {nodes} stages ({cached} cached) in {stages.root}"


def _audited(models, models_file: str | None, from_panel: str | None) -> tuple[list, dict]:
    """(checkpoint, name) of every entry, ``models_file`` line and ``from_panel`` cell (:func:`_entries`), and the
    models held in memory by name; with only held models there are no entries to resolve."""
    entries, held = _entries(models)
    if entries or models_file or from_panel or not held:
        return audit_inputs.audited(entries, models_file, from_panel), held
    return [], held


def _entries(models) -> tuple[list[str], dict[str, tuple[torch.nn.Module, Any]]]:
    """``models`` split into ``[NAME=]CKPT`` entries and the models held in memory by name (a mapping's key, else
    the name their config gives, ``_name_or_path``'s last part, else their class's), each as (model, tokenizer or
    None); a ``(model, tokenizer)`` pair is one model."""
    if isinstance(models, Mapping):
        items = list(models.items())
    elif _is_held(models) or isinstance(models, str | Path):
        items = [(None, models)]
    else:
        items = [(None, m) for m in models]
    entries, held = [], {}
    for name, model in items:
        if not _is_held(model):
            entries.append(f"{name}={model}" if name is not None else str(model))
            continue
        pair = model if isinstance(model, tuple) else (model, None)
        if name is None:
            source = str(getattr(getattr(pair[0], "config", None), "_name_or_path", "") or "")
            name = derived_name(Path(source).name if source else type(pair[0]).__name__)
        if name in held:
            raise InputError(f"two models held in memory are named {name!r}: pass a mapping of names to models")
        held[name] = pair
    return entries, held


def _is_held(model: Any) -> bool:
    """A model in memory, or a (model, tokenizer) pair."""
    return isinstance(model, torch.nn.Module) or (
        isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], torch.nn.Module)
    )


def _check_held(held: Mapping[str, tuple[torch.nn.Module, Any]], names: list, theta0: str | None) -> None:
    """Every held model runnable (:func:`~margincal.model.loading.check_in_memory`), its name valid and no path
    entry's, and θ0 given where one comes without its tokenizer (it is then scored with θ0's)."""
    for name, (model, tokenizer) in held.items():
        check_name(name, "audit checkpoint name")
        if name in names:
            raise InputError(f"two audited checkpoints are named {name!r}; name them (a mapping of names to models)")
        check_in_memory(model)
        if tokenizer is None and theta0 is None:
            raise InputError(f"{name} is held without its tokenizer and no θ0 gives one: pass (model, tokenizer)")


@contextlib.contextmanager
def _saved(held: Mapping[str, tuple[torch.nn.Module, Any]], theta0: str | None, store: Store) -> Iterator[dict]:
    """Each held model saved (safetensors; its tokenizer, else θ0's) into a new directory under ``<store>/held``:
    name → directory, all removed on exit, whatever happens."""
    root = store.root / "held" / uuid.uuid4().hex[:12]
    copies = {name: root / name for name in held}
    try:
        for name, (model, tokenizer) in held.items():
            copies[name].parent.mkdir(parents=True, exist_ok=True)
            save_model(model, tokenizer if tokenizer is not None else load_tokenizer(theta0), copies[name])
        yield copies
    finally:
        shutil.rmtree(root, ignore_errors=True)


@checked_call
def population(
    audits: Sequence[str | Path],
    *,
    out: str | Path,
    control: str | None = None,
    overwrite: bool = False,
    command: str = "margincal.api.population(...)",
) -> dict[str, Any]:
    """Merge several audits of one benchmark, data and floor/ceiling into one population view (``population.json``
    in ``out``: Δ and the other pre-attack signals against what the attacks recovered, with ``control`` named);
    returns the population.

    Example (not run by the tests as written: it needs audits of three checkpoints or more;
    ``tests/integration/test_audit.py`` merges some)::

        population = margincal.api.population(["runs/audit-a", "runs/audit-b"], out="runs/population")
        print(population["n_checkpoints"])
    """
    checked = read_audits(audits, control)  # every input checked before out
    target = check_output(out, directory=True, overwrite=overwrite, inputs=local_paths(*audits))
    return merge_population(checked, control, target, command)
