"""The training stages as library functions: :func:`unlearn`, :func:`polish` (Margin Calibration) and
:func:`attack` (relearn attacks), on a model named by path or hub id or held in memory."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from margincal.api.common import (
    Model,
    Records,
    benchmark_spec,
    in_memory,
    local_paths,
    records,
    settings_of,
    stage_plan,
)
from margincal.config.settings import (
    DEFAULT_ATTACKER,
    DEFAULT_BENCHMARK,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_SCALE,
    DEFAULT_SELECT,
    DEFAULT_VARIANT,
    EvalSettings,
    MCConfig,
    MethodRun,
    resolve_attack,
    resolve_mc,
    resolve_method,
)
from margincal.config.typed import checked_call
from margincal.core.artifacts import check_free_space, check_output, digest, publish_dir, weights_bytes
from margincal.core.errors import InputError
from margincal.core.inputs import read_bytes
from margincal.data.checks import check_budgets, check_device
from margincal.data.records import evaluated_fields
from margincal.data.templates import template_of
from margincal.mc.loss import AnchorTable
from margincal.methods.base import get_method, method_class
from margincal.model.loading import shown_model
from margincal.pipeline.stages import Workspace, build_workspace, read_unlearned
from margincal.results.outputs import AttackResult, Polished, Trained, Unlearned, trained
from margincal.training.curves import DEFAULT_REPORT_TO, check_report_to


def _out(out: str | Path | None, overwrite: bool, report_to: str, model: Model, *inputs) -> Path | None:
    """``out`` checked before any compute (a new or margincal-owned directory with room for the weights)."""
    check_report_to(report_to)
    if out is None:
        if report_to != "none":
            raise InputError(f"report_to {report_to} writes beside the stage: give out (--out)")
        return None
    path = check_output(out, directory=True, overwrite=overwrite, inputs=local_paths(model, *inputs))
    check_free_space(path, weights_bytes(model) if not in_memory(model) else 0)
    return path


def _monitor_splits(forget: list, holdout: Records | None, utility: Sequence[Records], monitored: bool) -> dict:
    """The evaluation splits the held-out monitors read (forget, ``holdout``, ``utility``)."""
    if not monitored:
        return {"forget": forget}
    missing = [name for name, given in (("holdout", holdout), ("utility", utility)) if not given]
    if missing:
        raise InputError(
            f"the held-out monitors need {' and '.join(f'--{m}' for m in missing)} (non-member and utility QA files)"
        )
    return {
        "forget": forget,
        "holdout": records(holdout, "holdout"),
        "utility": [r for u in utility for r in records(u, "utility")],
    }


@checked_call
def unlearn(
    model: Model,
    method: str,
    forget: Records,
    *,
    retain: Records,
    env: Records | None = None,
    tokenizer: Any = None,
    ref: Model | None = None,
    holdout: Records | None = None,
    utility: Sequence[Records] = (),
    scale: str = DEFAULT_SCALE,
    overrides: Sequence[str] = (),
    select: str = DEFAULT_SELECT,
    seed: int = 0,
    benchmark: str = DEFAULT_BENCHMARK,
    max_length: int | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    out: str | Path | None = None,
    overwrite: bool = False,
    report_to: str = DEFAULT_REPORT_TO,
    store: str | Path | None = None,
) -> Unlearned:
    """θ̂ = ``method`` (a registered method: ``margincal methods``) run on a copy of θ0 = ``model`` with the forget
    and retain splits, its schedule resolved once at ``scale`` (``paper`` or ``mini``) for |D_f| as trained on, with
    ``key=value`` ``overrides``. ``select``: ``last``, or the monitored step by ``delta`` / ``privleak`` (needs
    ``ref``, ``holdout`` and ``utility``). ``out``: the directory to write (``model/``, ``method.json``,
    ``history.json``, ``stage.json``). The run is a one-node plan through the store (``store``;
    :func:`~margincal.api.common.stage_plan`): on θ0 named by path or hub id the same run again is read back
    (``result.cached``), ``out`` gets a copy and the model stays on disk (``result.out``: ``out``, else the store
    entry); with a model in memory among the inputs the store is the call's own and the result holds the model
    (``result.model``; ``result.out``: ``out``, else None).

    Example (four NPO steps)::

        u = margincal.unlearn(mini.theta0, "NPO", f"{mini.dir}/forget10.json", retain=f"{mini.dir}/retain90.json",
                              scale="mini", overrides=["train.steps=4"], out=f"{tmp}/npo")
        print(u.final_loss, u.out, u.cached)
    """
    check_device(device)
    out_dir = _out(out, overwrite, report_to, model, forget, retain, env, ref, holdout, *utility)
    forget_records, retain_records = records(forget, "forget", forget=True), records(retain, "retain")
    env_records = records(env, "env")
    overrides = [*overrides, *([f"select={select}"] if select != DEFAULT_SELECT else [])]
    probe = resolve_method(method, scale, len(forget_records), overrides=overrides)
    chosen = get_method(probe.name, **probe.hparams)  # unknown hyperparameters stop here
    if chosen.prepares_with == "ref" and ref is None:
        raise InputError(f"{chosen.name} imitates θ_ref: give it as ref (--ref), the retain-only model")
    if probe.select != DEFAULT_SELECT and ref is None:
        what = {"delta": "Δ against θ_ref's margin", "privleak": "privleak against θ_ref's membership AUCs"}
        raise InputError(f"select {probe.select} needs ref (--ref): {what[probe.select]} is measured")
    splits = _monitor_splits(forget_records, holdout, utility, probe.monitor is not None)
    frozen = {"theta0": model, **({"ref": ref} if ref is not None else {})}
    train_records = {"forget": forget_records, "retain": retain_records, "env": env_records}
    ws = _workspace(model, benchmark, max_length, splits, train_records, frozen, tokenizer, template, dtype, device)
    # resolved once, at |D_f| as trained on (a raw-text split is chunked): the schedule run is the one recorded
    run = resolve_method(method, scale, len(ws.train["forget"]), overrides=overrides)
    config = {"run": dataclasses.asdict(run), "seed": seed}
    margin = run.monitor is not None and ref is not None  # the monitors' Δ reads θ_ref's margin
    return _trained_by_plan("unlearn", model, ws, run, config, train_records, margin, store, out_dir, report_to)


def _trained_by_plan(stage, model, ws, spec, config, train_records, margin, store, out_dir, report_to) -> Trained:
    """A training ``stage`` on ``model`` as a one-node plan (:func:`~margincal.api.common.stage_plan`): its node
    keyed by ``config``, the identities of the model and the workspace's frozen models, the evaluation and training
    data (``train_records``' digests) and the dtype, taking θ_ref's margin node with ``margin``; the record of the
    stored directory, which ``out_dir`` (if given) gets a copy of; the trained model in the result when a model in
    memory was among the inputs (the store was then the call's own, and only ``out_dir`` keeps the directory)."""
    train = {role: digest([evaluated_fields(r) for r in recs]) for role, recs in train_records.items() if recs}
    label = f"model/{stage}"

    def add(builder, ids: dict[str, str], inputs: tuple[str, ...]) -> None:
        frozen = {role: ids[role] for role in sorted(ws.models)}
        data = {"data": {"eval": builder.data, "train": train}, "dtype": ws.dtype}
        builder.add(label, stage, "model", spec, {**config, "model": ids["model"], "frozen": frozen, **data}, inputs)

    options = {"margin": margin, "report_to": report_to, "keep": (label,)}
    with stage_plan(model, ws, EvalSettings(), "given", add, store, **options) as plan:
        stored = plan.run.paths[label]
        if out_dir is not None:
            with publish_dir(out_dir) as tmp:
                shutil.copytree(stored, tmp, dirs_exist_ok=True)
        record = trained(out_dir or stored)
        kept = None if out_dir is None and plan.ephemeral else str(out_dir or stored)
        made = plan.run.made.get(label)
        return dataclasses.replace(record, out=kept, cached=plan.cached[label], model=made)


def _workspace(
    model, benchmark, max_length, splits, train, frozen, tokenizer, template, dtype, device, max_new_tokens=None
) -> Workspace:
    """The workspace of a single stage on ``benchmark`` (:func:`~margincal.pipeline.stages.build_workspace`; a
    ``max_length`` given is explicit: beyond the model's context it stops)."""
    spec = benchmark_spec(benchmark, max_length, max_new_tokens)
    explicit = max_length is not None
    return build_workspace(
        model,
        spec,
        splits,
        train,
        models=frozen,
        tokenizer=tokenizer,
        template=template,
        dtype=dtype,
        device=device,
        explicit_max_length=explicit,
    )


def _method_of(model: Model | Unlearned, method: str | None, scale: str, n_forget: int, log) -> tuple[MethodRun, dict]:
    """The polished model's method: name, hyperparameters and carried state (PDU's λ) from an :class:`Unlearned`
    result or the ``method.json`` the unlearn stage saved beside a checkpoint, else ``method``'s resolution at
    ``scale``; a ``method`` other than the one that unlearned the checkpoint stops."""
    if isinstance(model, Unlearned):
        saved = {"name": model.method, "hparams": model.hparams, "state": model.state}
    else:
        saved = None if in_memory(model) else read_unlearned(model)
    if saved is None:
        if method is None:
            raise InputError("give method (the model's unlearning method, whose native loss MC keeps running)")
        if log is not None:
            log(f"{shown_model(model)} has no method.json: its native loss is {method}'s at scale {scale}")
        return resolve_method(method, scale, n_forget), {}
    if method is not None and saved["name"].lower() != method.lower():
        raise InputError(f"method {method}: {shown_model(model)} was unlearned with {saved['name']}; give that")
    return MethodRun(name=saved["name"], hparams=saved["hparams"]), dict(saved.get("state", {}))


@checked_call
def polish(
    model: Model | Unlearned,
    forget: Records,
    *,
    retain: Records,
    probe: Records,
    method: str | None = None,
    variant: str = DEFAULT_VARIANT,
    mc: MCConfig | Mapping[str, Any] | None = None,
    kappa: float | None = None,
    kl_weight: float | None = None,
    theta0: Model | None = None,
    ref: Model | None = None,
    tokenizer: Any = None,
    questions: Records | None = None,
    holdout: Records | None = None,
    utility: Sequence[Records] = (),
    trace: bool = False,
    scale: str = DEFAULT_SCALE,
    overrides: Sequence[str] = (),
    benchmark: str = DEFAULT_BENCHMARK,
    max_length: int | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    out: str | Path | None = None,
    overwrite: bool = False,
    report_to: str = DEFAULT_REPORT_TO,
    store: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Polished:
    """Margin Calibration: a short LoRA polish of the unlearned ``model`` (a checkpoint, a model in memory or an
    :class:`Unlearned` result) whose loss is the method's own plus a softplus hinge anchored at the reference's
    per-token margins, L_hinge = E_t softplus(κ (m_θ(t) − m_anchor(t))) / κ, and a KL probe on the disjoint ``probe``
    corpus (paper Sec. 4). The settings, later ones winning: ``variant``, an MC preset (``reference``, ``controlled``,
    ...); ``mc``, an :class:`~margincal.config.settings.MCConfig` (taken whole: give no other ``variant``) or a mapping
    of the fields to change (``{"kappa": 2, "train": {"steps": 10}}``); ``kappa`` (κ) and ``kl_weight`` (the KL probe's
    weight); ``overrides``, ``key=value`` strings. ``ref`` (θ_ref) anchors the reference variant and gives Δ; ``trace``:
    the coercivity trace and ``trajectory.png``. ``out``: the directory to write (``model/`` with the merged weights,
    ``history.json``, ``stage.json``). The polish is a one-node plan through the store (``store``;
    :func:`~margincal.api.common.stage_plan`), keyed by the model's identity, the method and the state it continues,
    the resolved MC settings, the anchors' identities, the evaluation and training data, the dtype and θ_ref's margin
    node: on a model and θ0, θ_ref named by path or hub id (an :class:`Unlearned` result by the directory it wrote)
    the same polish again is read back (``result.cached``) and ``out`` gets a copy; with a model in memory among them
    the store is the call's own and the result holds the polished model (``result.model``).

    Example (four MC steps on the unlearned model of :func:`unlearn`'s example, ``u``)::

        p = margincal.polish(u, f"{mini.dir}/forget10.json", retain=f"{mini.dir}/retain90.json",
                             probe=f"{mini.dir}/probe.json", theta0=mini.theta0, ref=mini.ref, scale="mini",
                             overrides=["train.steps=4"], out=f"{tmp}/npo_mc")
        print(p.final_loss, p.out)
    """
    check_device(device)
    held = _held(model, tokenizer)
    out_dir = _out(out, overwrite, report_to, held, theta0, ref, forget, retain, probe, questions, holdout, *utility)
    if method is not None:
        method_class(method)  # an unknown method stops here
    choices = _question_hinge(benchmark, questions, trace)
    mc = resolve_mc(variant, scale, overrides=overrides, given=_mc_given(mc, variant, kappa, kl_weight))
    _check_anchors(mc, variant, trace, ref, theta0)
    forget_records = records(forget, "forget", forget=True)
    train = {"forget": forget_records, "retain": records(retain, "retain"), "probe": records(probe, "probe")}
    hinged = records(questions, "questions", forget=True) if choices else forget_records
    splits = _monitor_splits(hinged, holdout, utility, mc.monitor is not None)
    frozen = {role: m for role, m in (("theta0", theta0), ("ref", ref)) if m is not None}
    ws = _workspace(held, benchmark, max_length, splits, train, frozen, tokenizer, template, dtype, device)
    run, state = _method_of(model, method, scale, len(ws.train["forget"]), log)
    needed = get_method(run.name, **run.hparams).prepares_with  # the frozen model the method's own loss reads
    if needed is not None and needed not in ws.models:
        flag = "theta0 (--theta0)" if needed == "theta0" else "ref (--ref)"
        raise InputError(f"{run.name}'s loss reads {'θ0' if needed == 'theta0' else 'θ_ref'}: give {flag}")
    config = {"method": {"name": run.name, "hparams": run.hparams}, "state": state}
    config |= {"variant": variant, "mc": dataclasses.asdict(mc), "trace": trace}
    return _trained_by_plan("polish", held, ws, mc, config, train, ref is not None, store, out_dir, report_to)


def _mc_given(mc: MCConfig | Mapping[str, Any] | None, variant: str, kappa, kl_weight) -> list[tuple[str, dict]]:
    """:func:`polish`'s ``mc`` and its keywords as named layers of :func:`resolve_mc`: an MCConfig's every field (so
    it is taken whole; with a variant other than the default its settings would be lost, which stops), a mapping's
    fields, then κ and the KL weight where given."""
    given = []
    if isinstance(mc, MCConfig):
        if variant != DEFAULT_VARIANT:
            raise InputError(
                f"mc: an MCConfig is taken whole; give variant={variant!r}'s settings in it, or pass a mapping"
            )
        given.append(("mc=MCConfig(...)", dataclasses.asdict(mc)))
    elif mc is not None:
        given.append(("mc", dict(mc)))
    keywords = (("kappa", kappa), ("kl_weight", kl_weight))
    return given + [(f"{name}={value}", {name: value}) for name, value in keywords if value is not None]


def _held(model: Model | Unlearned, tokenizer: Any) -> Model:
    """The model to polish: ``model``, or the model an :class:`Unlearned` result holds, or (without it or without
    ``tokenizer``) the directory it wrote, where the tokenizer is saved beside it."""
    held = model.model if isinstance(model, Unlearned) else model
    if isinstance(model, Unlearned) and (held is None or tokenizer is None) and model.out is not None:
        held = model.out
    if held is None:
        raise InputError("this Unlearned result holds no model in memory and wrote none: unlearn again with out=DIR")
    return held


def _question_hinge(benchmark: str, questions: Records | None, trace: bool) -> bool:
    """Whether MC hinges on four-choice ``questions`` (WMDP: the hinge on questions, the method on the forget
    corpus): they are then required and the trace (per-token margins of the training forget split) is refused;
    elsewhere they are refused."""
    choices = benchmark_spec(benchmark).hinge_on == "questions"
    if choices and (questions is None or trace):
        raise InputError(
            f"{benchmark} hinges on four-choice questions: give questions (--questions FILE)"
            if questions is None
            else "trace reads the training forget split's per-token margins; a question hinge has none"
        )
    if questions is not None and not choices:
        raise InputError("questions are for a benchmark whose MC hinges on four-choice questions (wmdp-cyber, ...)")
    return choices


def _check_anchors(mc, variant: str, trace: bool, ref: Model | None, theta0: Model | None) -> None:
    """Stop without ``ref`` (θ_ref) where the polish reads it: a controlled run, a Δ-stop, the trace, or a variant
    anchored at θ_ref; and without ``theta0`` where the variant anchors at θ0 (deployment)."""
    needs_ref = [
        (mc.control is not None, "controlled MC stops at θ_ref's margin and membership signal"),
        (mc.stop_delta is not None, "Δ-stop (stop_delta) stops at a depth measured from θ_ref's margin"),
        (trace, "the trace measures Δ against θ_ref"),
        (mc.margin_anchor == "ref", f"the {variant!r} variant anchors at θ_ref"),
    ]
    why = next((why for needed, why in needs_ref if needed), None)
    if ref is None and why is not None:
        raise InputError(f"give ref (--ref), the retain-only reference: {why}")
    if theta0 is None and mc.margin_anchor == "theta0":
        raise InputError(f"give theta0 (--theta0), the model before unlearning: the {variant!r} variant anchors at θ0")


@checked_call
def attack(
    model: Model,
    forget: Records,
    *,
    attacker: str = DEFAULT_ATTACKER,
    k: int | Sequence[int] | None = None,
    ref: Model | None = None,
    tokenizer: Any = None,
    shots: Records | None = None,
    instrument: bool = False,
    scale: str = DEFAULT_SCALE,
    overrides: Sequence[str] = (),
    settings: EvalSettings | Mapping[str, Any] | Sequence[str] | None = None,
    benchmark: str = DEFAULT_BENCHMARK,
    max_length: int | None = None,
    max_new_tokens: int | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    store: str | Path | None = None,
) -> AttackResult:
    """Relearn attacks on ``model`` (left untouched): for each budget ``k`` (one or several; default the preset's),
    the ``attacker`` preset (``configs/attacks.yaml``, or a preset file) fine-tunes a copy on a seeded D_rel of k
    forget records and the forget records it did not train on are scored before and after (held-out ROUGE-L, Δ
    with ``ref``, margin flips). ``instrument``: Theorem 3's lift against its bound Λ̂(N). The attacks run as a plan
    through the store (``store``; :func:`~margincal.api.common.stage_plan`): on a model named by path or hub id the
    same attack again is read from there (``cached``); on a model in memory through a store of the call's own.

    Example (the polished model of :func:`polish`'s example, ``p``, saved to ``p.out``)::

        a = margincal.attack(p.out, f"{mini.dir}/forget10.json", k=4, ref=mini.ref, scale="mini",
                             overrides=["train.steps=4"])
        print(a.rouge_l(4))
    """
    check_device(device)
    cfg = resolve_attack(attacker, scale, overrides)
    budgets = [cfg.k] if k is None else [k] if isinstance(k, int) else list(k)
    forget_records = records(forget, "forget", forget=True)
    check_budgets(budgets, len(forget_records), "k (--k, --k-sweep)")
    splits = {"forget": forget_records}
    if shots is not None:
        splits["forget_icl"] = records(shots, "shots")
    frozen = {"ref": ref} if ref is not None else {}
    ws = _workspace(
        model, benchmark, max_length, splits, {}, frozen, tokenizer, template, dtype, device, max_new_tokens
    )
    evaluation = settings_of(EvalSettings, settings, "settings")
    labels = {str(budget): f"model/attack/{budget}" for budget in budgets}

    def add(builder, ids: dict[str, str], inputs: tuple[str, ...]) -> None:
        for budget, label in labels.items():
            run = dataclasses.replace(cfg, k=int(budget))
            builder.attack(label, "model", ids["model"], run, inputs, instrument=instrument)

    with stage_plan(model, ws, evaluation, "given", add, store, margin=ref is not None) as plan:
        results = {budget: plan.run.read(label, "attack.json") for budget, label in labels.items()}
        m_ref, cached = plan.run.m_ref(), all(plan.cached[label] for label in labels.values())
    instruments = {budget: r.pop("instrument") for budget, r in results.items() if "instrument" in r}
    return AttackResult(attacker, shown_model(model), results, m_ref, instruments, cached)


@checked_call
def anchors(
    ref: Model,
    forget: str | Path,
    *,
    out: str | Path,
    tokenizer: Any = None,
    benchmark: str = DEFAULT_BENCHMARK,
    max_length: int | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    overwrite: bool = False,
) -> AnchorTable:
    """The anchor table MC's hinge reads: θ_ref's (``ref``) per-token margins on every answer token of the forget
    file, with the template, tokenizer and the file's digest it was made with, saved to ``out`` (a
    ``.safetensors`` file) so a polish elsewhere checks it matches.

    Example::

        table = margincal.api.anchors(mini.ref, f"{mini.dir}/forget10.json", out=f"{tmp}/anchors.safetensors")
        print(table.meta["template"])
    """
    check_device(device)
    if not str(out).endswith(".safetensors"):
        raise InputError(f"--out {out}: an anchor table is a .safetensors file; give a path ending so")
    check_output(out, directory=False, overwrite=overwrite, inputs=local_paths(ref, forget))
    forget_records = records(forget, "forget", forget=True)
    frozen = {"ref": ref}
    ws = _workspace(
        ref, benchmark, max_length, {}, {"forget": forget_records}, frozen, tokenizer, template, dtype, device
    )
    meta = {
        "anchor_model": shown_model(ref),
        "forget": str(forget),
        "forget_sha256": hashlib.sha256(read_bytes(forget, "--forget")).hexdigest(),
    }
    name = template_of(ws.tokenizer).name
    table = AnchorTable.build(ws.frozen("ref"), ws.train["forget"], ws.tokenizer, name, **meta)
    table.save(out)
    return table
