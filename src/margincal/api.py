"""margincal as a library: the public functions ``import margincal`` exposes, each returning a typed result
(:mod:`margincal.results`). The CLI parses its arguments and calls one of them.

A model is a local directory, a hub id (``org/name@revision``) or a model in memory (any ``torch.nn.Module`` with
a transformers ``config``, such as a ``PreTrainedModel``) with its tokenizer; data are TOFU-format files or lists of
records (:class:`~margincal.data.records.QARecord` or TOFU rows as dicts); settings are the typed config
dataclasses, mappings of their fields, or ``key=value`` overrides. Every input is checked before the first forward
pass (:class:`~margincal.errors.InputError`, one line). A stage on a model named by path or hub id runs as a plan
through the store (:func:`margincal.pipeline.graph.run_graph`), so a repeated call, or a panel or audit that needs
the same stage, reads it from there; a model in memory is computed on directly.

Example (the mini benchmark: ``margincal mini export DIR`` writes its models and files)::

    import margincal

    d = margincal.diagnose("runs/mini/theta0", "runs/mini/forget10.json", ref="runs/mini/ref")
    print(d.delta, d.label)
    e = margincal.evaluate("runs/mini/theta0", benchmark="mini", data="runs/mini")
    print(e.summary["forget_rouge_l"])
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from margincal.artifacts import check_output, digest
from margincal.auditing import inputs as audit_inputs
from margincal.auditing.plan import checkpoint
from margincal.auditing.report import write_audit
from margincal.auditing.run import prepare_audit, weight_distances
from margincal.auditing.search import run_searches
from margincal.checks import check_device
from margincal.config import EvalSettings, apply_overrides, build, resolve_benchmark
from margincal.curves import check_report_to
from margincal.data.benchmarks import data_identity, load_benchmark_splits
from margincal.data.records import QARecord, check_distinct
from margincal.data.templates import describe_template, template_identity
from margincal.data.tofu import load_qa_json, load_split, records_from_rows
from margincal.errors import InputError
from margincal.margin import overlap_epsilon
from margincal.mini.data import generate
from margincal.models import shown_model
from margincal.pipeline.graph import GraphBuilder, ModelSource, run_graph
from margincal.results import AuditCard, Diagnosis, Evaluation, Result, load
from margincal.stages import build_workspace, evaluate_stage
from margincal.store import Store, default_store

Model = str | Path | torch.nn.Module
Records = str | Path | Sequence[QARecord] | Sequence[dict]
T = TypeVar("T")

__all__ = ["AuditCard", "Diagnosis", "Evaluation", "Result", "audit", "diagnose", "evaluate", "load"]


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


def _reference(reference: Evaluation | str | Path | Mapping | None, benchmark: str) -> dict | None:
    """θ_ref's evaluation (an :class:`Evaluation`, its saved file or its dict), of the benchmark evaluated."""
    if reference is None:
        return None
    where = f"reference {reference}" if isinstance(reference, str | Path) else "the reference"
    if isinstance(reference, str | Path):
        reference = load(reference)
        if not isinstance(reference, Evaluation):
            raise InputError(f"{where} is a {reference.KIND}, not an evaluation (margincal evaluate --out)")
    if isinstance(reference, Mapping):
        reference = Evaluation.from_dict({"kind": "evaluation", "schema_version": 1, **reference}, where)
    if reference.benchmark != benchmark:
        raise InputError(f"{where} is a {reference.benchmark!r} result, not {benchmark!r}")
    if reference.template is None:
        raise InputError(f"{where} does not name the prompt template it was scored under: evaluate θ_ref again")
    return {**reference.to_dict(), "where": where}


def _check_template(reference: dict, tokenizer) -> None:
    """θ_ref's result was scored under the prompt template this evaluation uses, or the comparison is refused."""
    mine = template_identity(tokenizer)
    if reference["template"] != mine:
        raise InputError(
            f"{reference['where']} was scored with template {describe_template(reference['template'])}, this model "
            f"with {describe_template(mine)}: save both with the same tokenizer files, or evaluate θ_ref again"
        )


def diagnose(
    model: Model,
    forget: Records,
    *,
    ref: Model | None = None,
    retain: Records | None = None,
    tokenizer: Any = None,
    benchmark: str | None = None,
    aggregate: str | None = None,
    template: str | None = None,
    batch_size: int | None = None,
    max_length: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
) -> Diagnosis:
    """The margin diagnostic of ``model`` on the forget split (paper Sec. 3.1): m(D_f), the log-odds level ℓ and,
    with ``ref`` (θ_ref, the retain-only reference), m_ref, Δ = m − m_ref and the certificate ℓ > m_ref (Thm. 1);
    with ``retain``, the forget/retain word-bigram overlap ε (Asm. 1). ``aggregate``: ``mean`` (TOFU) or
    ``median`` (MUSE); ``benchmark`` sets the scoring context (default ``tofu``, ``muse-news`` for the median).

    >>> d = margincal.diagnose(model, "forget10.json", ref="runs/mini/ref", tokenizer=tokenizer)
    >>> d.delta > 0, d.certified, d.label
    """
    forget_records, retain_records = records(forget, "forget", forget=True), records(retain, "retain")
    spec = benchmark_spec(benchmark or ("muse-news" if aggregate == "median" else "tofu"), max_length, None, aggregate)
    settings = EvalSettings(**({"batch_size": batch_size} if batch_size else {}))
    explicit = max_length is not None
    common = {"template": template, "dtype": dtype, "device": device, "explicit_max_length": explicit}
    splits = {"forget": forget_records}
    reference = None
    if ref is not None:
        ws_ref = build_workspace(ref, spec, splits, {}, tokenizer=tokenizer if _in_memory(ref) else None, **common)
        loaded = ref if _in_memory(ref) else ws_ref.load(ref)
        reference = evaluate_stage(loaded, ws_ref, settings, parts=("diagnosis",))
    ws = build_workspace(model, spec, splits, {}, tokenizer=tokenizer, **common)
    loaded = model if _in_memory(model) else ws.load(model)
    result = evaluate_stage(loaded, ws, settings, reference, parts=("diagnosis",))["splits"]["forget"]
    overlap = None
    if retain_records is not None:
        texts = [[f"{r.question} {r.answer}" for r in rs] for rs in (forget_records, retain_records)]
        overlap = overlap_epsilon(*texts)
    return Diagnosis(
        **result["diagnosis"],
        model=shown_model(model),
        forget=str(forget) if isinstance(forget, str | Path) else f"{len(forget_records)} records given",
        ref=None if ref is None else shown_model(ref),
        diagnostic_margins=result["diagnostic_margins"],
        overlap_epsilon=overlap,
    )


def evaluate(
    model: Model,
    *,
    tokenizer: Any = None,
    benchmark: str = "tofu",
    data: str | Path | None = None,
    tier: str | None = None,
    reference: Evaluation | str | Path | None = None,
    settings: EvalSettings | Mapping[str, Any] | Sequence[str] | None = None,
    template: str | None = None,
    max_length: int | None = None,
    max_new_tokens: int | None = None,
    aggregate: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    store: str | Path | None = None,
) -> Evaluation:
    """Every metric of ``benchmark``'s evaluator on ``model`` (TOFU, MUSE and WMDP as open-unlearning and lm-eval
    compute them; the mini benchmark as TOFU) on its ``tier`` of ``data`` (a TOFU-format directory; default the
    benchmark's own source, the mini benchmark generated in-process). ``reference``: θ_ref's evaluation, for Δ,
    forget quality and privleak. A model named by path or hub id is evaluated as a one-stage plan through the store
    (``store``, default ``$MARGINCAL_STORE`` or ``runs/store``): the same evaluation again is read from there
    (``cached``), and so is θ_ref's when a panel or audit on the same data stored it.

    >>> e = margincal.evaluate("runs/mini/theta0", benchmark="mini", data="runs/mini")
    >>> e.summary["forget_rouge_l"], e.cached
    """
    spec = benchmark_spec(benchmark, max_length, max_new_tokens, aggregate)
    tier = tier or spec.tier
    ref = _reference(reference, spec.name)
    evaluation = settings_of(EvalSettings, settings, "settings")
    if data is None and spec.source is None:  # the mini benchmark, generated in-process with its default settings
        split = generate().split
    else:
        source = data or spec.source

        def split(name: str) -> list[QARecord]:
            return load_split(source, name)

    splits = load_benchmark_splits(spec, tier, split)
    ws = build_workspace(
        model,
        spec,
        splits,
        {},
        tokenizer=tokenizer,
        template=template,
        dtype=dtype,
        device=device,
        explicit_max_length=max_length is not None,
    )
    if ref is not None:
        _check_template(ref, ws.tokenizer)
    start, cached = time.perf_counter(), False
    if _in_memory(model):
        result = evaluate_stage(model, ws, evaluation, ref)
    else:
        result, cached = _evaluate_stored(str(model), ws, evaluation, ref, tier, Store(store or default_store()))
    return Evaluation(
        benchmark=spec.name,
        model=shown_model(model),
        tier=tier,
        summary=result["summary"],
        splits=result["splits"],
        template=template_identity(ws.tokenizer),
        seconds=time.perf_counter() - start,
        mmlu=result.get("mmlu"),
        cached=cached,
    )


def _evaluate_stored(model: str, ws, settings: EvalSettings, reference: dict | None, tier: str, store: Store):
    """``model``'s evaluation as a one-node plan through the store: keyed as a panel's or audit's evaluation of the
    same model (its store entry, weights digest or pinned hub commit), data and settings, with θ_ref's result by
    its digest. Returns (the result, whether the store held it)."""
    ckpt = checkpoint(model, store=store)
    template = dataclasses.asdict(ws.tokenizer.margincal_template)
    builder = GraphBuilder(settings, data_identity(ws.benchmark, tier, template, ws.eval_splits), ws.dtype)
    shown = None if reference is None else {"digest": digest({k: v for k, v in reference.items() if k != "where"})}
    builder.add("model/evaluate", "evaluate", "model", settings, builder.model_config(ckpt.identity, shown))
    graph = builder.graph({"model": ModelSource(path=ckpt.spec, base=ckpt.base)}, reference)
    (node,) = graph.nodes
    cached = store.done(node.kind, node.key)
    return run_graph(graph, ws, store).read(node.label, "eval.json"), cached


def _in_memory(model: Model) -> bool:
    return isinstance(model, torch.nn.Module)


def local_paths(*paths: str | Path | None) -> list[Path]:
    """The given inputs that are local files or directories (an output must never replace one)."""
    return [Path(p) for p in paths if p is not None and Path(p).exists()]


def audit(
    models: str | Sequence[str] | Mapping[str, str] = (),
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
    budget: str = "quick",
    overrides: Sequence[str] = (),
    scale: str | None = None,
    base: str | None = None,
    settings: EvalSettings | Mapping[str, Any] | Sequence[str] | None = None,
    template: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    store: str | Path | None = None,
    control: str | None = None,
    claimed: Sequence[str] = (),
    report_to: str = "none",
    overwrite: bool = False,
    command: str = "margincal.audit(...)",
    log: Callable[[str], None] | None = None,
) -> AuditCard:
    """Will these checkpoints relearn? The robustness card of ``models`` (``[NAME=]CKPT`` entries or a mapping
    name → checkpoint; also ``models_file`` lines and ``from_panel``'s cells): Δ with a bootstrap interval, the
    certificate, forget metrics, the five MIA detectors, utility, and the ``budget``'s relearn attacks and
    quantizers (``configs/audit.yaml``; ``worst*`` search attacks under a utility bound), each verdict the fraction
    of the θ_ref floor to θ0 ceiling gap it recovers. ``data``: a TOFU-format directory, or a mini export (its
    θ_ref, θ0 and tier are then the defaults). Every stage runs through the store; ``out`` gets ``card.json``,
    ``card.md`` and the figures. ``log``: a progress line per stage (``print`` in the CLI).

    >>> card = margincal.audit({"npo": "runs/npo"}, data="runs/mini", out="runs/audit-npo")
    >>> card.delta("npo"), card.recovered("npo")
    """
    check_device(device)
    check_report_to(report_to)
    entries = [f"{k}={v}" for k, v in models.items()] if isinstance(models, Mapping) else models
    entries = [entries] if isinstance(entries, str) else list(entries)
    resolved = audit_inputs.audited(entries, models_file, from_panel)
    floor = audit_inputs.floor_and_ceiling(data, benchmark, tier, ref, ref_logs, theta0)
    if floor.note and log is not None:
        log(floor.note)
    # every input known (the export's θ_ref and θ0, the models file, the panel's results) before out is checked
    claims = audit_inputs.claimed(claimed)
    named = (data, floor.ref, ref_logs, floor.theta0, models_file, from_panel, base, *(m for m, _ in resolved))
    inputs = local_paths(*named, *(claim["path"] for _, claim in claims))
    out = check_output(out, directory=True, overwrite=overwrite, inputs=inputs)
    stages = Store(store or default_store())
    plan, ws = prepare_audit(
        resolved,
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
        store=stages,
        control=control,
    )
    claimed_by = audit_inputs.match_claims(claims, plan.audited)
    if log is not None:
        cached = sum(stages.done(n.kind, n.key) for n in plan.graph.nodes)
        nodes = len(plan.graph.nodes)
        log(f"audit ({budget}): {len(plan.audited)} checkpoint(s), {nodes} stages ({cached} cached) in {stages.root}")
    run = run_graph(plan.graph, ws, stages, log, report_to)
    searches = run_searches(plan, ws, run, log)
    top = write_audit(plan, run.paths, weight_distances(plan, ws), out, command, searches, claimed_by)
    return AuditCard.from_card(top, out)
