"""The diagnostic and the benchmark evaluation as library functions: :func:`diagnose`, :func:`evaluate`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from margincal.api.common import (
    Model,
    Records,
    benchmark_spec,
    in_memory,
    records,
    settings_of,
    stage_plan,
)
from margincal.config.settings import DEFAULT_BENCHMARK, DEFAULT_DEVICE, DEFAULT_DTYPE, EvalSettings
from margincal.config.typed import checked_call
from margincal.core.artifacts import digest
from margincal.core.errors import InputError
from margincal.data.benchmarks import load_benchmark_splits
from margincal.data.checks import check_device
from margincal.data.records import QARecord
from margincal.data.templates import describe_template, template_identity
from margincal.data.tofu import benchmark_source, load_split
from margincal.mini.data import generate
from margincal.model.loading import shown_model
from margincal.model.margin import overlap_epsilon
from margincal.pipeline.stages import build_workspace, evaluate_stage
from margincal.results.base import Diagnosis
from margincal.results.outputs import Evaluation, load


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


@checked_call
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
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
) -> Diagnosis:
    """The margin diagnostic of ``model`` on the forget split (paper Sec. 3.1): m(D_f), the log-odds level ℓ and,
    with ``ref`` (θ_ref, the retain-only reference), m_ref, Δ = m − m_ref and the certificate ℓ > m_ref (Thm. 1);
    with ``retain``, the forget/retain word-bigram overlap ε (Asm. 1). ``aggregate``: ``mean`` (TOFU) or
    ``median`` (MUSE); ``benchmark`` sets the scoring context (default ``tofu``, ``muse-news`` for the median).

    Example::

        d = margincal.diagnose(mini.theta0, f"{mini.dir}/forget10.json", ref=mini.ref)
        print(d.delta, d.certified, d.label)
    """
    check_device(device)
    forget_records, retain_records = records(forget, "forget", forget=True), records(retain, "retain")
    spec = benchmark_spec(
        benchmark or ("muse-news" if aggregate == "median" else DEFAULT_BENCHMARK), max_length, None, aggregate
    )
    settings = EvalSettings(**({"batch_size": batch_size} if batch_size else {}))
    loading = {"template": template, "dtype": dtype, "device": device, "explicit_max_length": max_length is not None}
    splits = {"forget": forget_records}
    # the model and θ_ref as one checked pair (one vocabulary) before either is read: θ_ref is scored first
    frozen = {"ref": ref} if ref is not None else None
    ws = build_workspace(model, spec, splits, {}, models=frozen, tokenizer=tokenizer, **loading)
    reference = None
    if ref is not None:
        ws_ref = build_workspace(ref, spec, splits, {}, tokenizer=tokenizer if in_memory(ref) else None, **loading)
        loaded = ref if in_memory(ref) else ws_ref.load(ref)
        reference = evaluate_stage(loaded, ws_ref, settings, parts=("diagnosis",))
    loaded = model if in_memory(model) else ws.load(model)
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


@checked_call
def evaluate(
    model: Model,
    *,
    tokenizer: Any = None,
    benchmark: str = DEFAULT_BENCHMARK,
    data: str | Path | None = None,
    tier: str | None = None,
    reference: Evaluation | str | Path | None = None,
    settings: EvalSettings | Mapping[str, Any] | Sequence[str] | None = None,
    template: str | None = None,
    max_length: int | None = None,
    max_new_tokens: int | None = None,
    aggregate: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    store: str | Path | None = None,
) -> Evaluation:
    """Every metric of ``benchmark``'s evaluator on ``model`` (TOFU, MUSE and WMDP as open-unlearning and lm-eval
    compute them; the mini benchmark as TOFU) on its ``tier`` of ``data`` (a TOFU-format directory; default the
    benchmark's own source, the mini benchmark generated in-process). ``reference``: θ_ref's evaluation, for Δ,
    forget quality and privleak. The evaluation is a one-stage plan through the store (``store``, default
    ``$MARGINCAL_STORE`` or ``runs/store``): of a model named by path or hub id, the same evaluation again is read
    from there (``cached``), and so is θ_ref's when a panel or audit on the same data stored it; of a model in
    memory, through a store of the call's own (:func:`~margincal.api.common.stage_plan`).

    Example::

        e = margincal.evaluate(mini.theta0, benchmark="mini", data=mini.dir, settings={"gradnorm": False})
        print(e.summary["forget_Q_A_ROUGE"], e.summary["model_utility"], e.cached)
    """
    check_device(device)
    spec = benchmark_spec(benchmark, max_length, max_new_tokens, aggregate)
    tier = tier or spec.tier
    ref = _reference(reference, spec.name)
    evaluation = settings_of(EvalSettings, settings, "settings")
    if data is None and spec.source is None:  # the mini benchmark, generated in-process with its default settings
        split = generate().split
    else:
        source = spec.source if data is None else benchmark_source(data)

        def split(name: str) -> list[QARecord]:
            return load_split(source, name)

    splits = load_benchmark_splits(spec, tier, split)
    explicit = max_length is not None
    ws = build_workspace(
        model,
        spec,
        splits,
        {},
        tokenizer=tokenizer,
        template=template,
        dtype=dtype,
        device=device,
        explicit_max_length=explicit,
    )
    if ref is not None:
        _check_template(ref, ws.tokenizer)
    start = time.perf_counter()
    shown = None if ref is None else {"digest": digest({k: v for k, v in ref.items() if k != "where"})}

    def add(builder, ids: dict[str, str], inputs: tuple[str, ...]) -> None:
        builder.add("model/evaluate", "evaluate", "model", evaluation, builder.model_config(ids["model"], shown))

    with stage_plan(model, ws, evaluation, tier, add, store, reference=ref) as plan:
        result, cached = plan.run.read("model/evaluate", "eval.json"), plan.cached["model/evaluate"]
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
