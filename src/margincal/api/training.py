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
    stored_plan,
)
from margincal.auditing.plan import checkpoint
from margincal.config.settings import (
    DEFAULT_BENCHMARK,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
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
from margincal.mc.bounds import LiftInstrument, coercivity_trace
from margincal.mc.loss import AnchorTable
from margincal.methods.base import get_method, method_class
from margincal.model.loading import clone_model, shown_model
from margincal.pipeline.stages import (
    StageResult,
    Workspace,
    attack_stage,
    build_workspace,
    polish_stage,
    read_unlearned,
    reference_margin,
    unlearn_stage,
    write_polished,
    write_unlearned,
)
from margincal.reporting.figures import trajectory_figure
from margincal.results.outputs import AttackResult, Polished, Trained, Unlearned, trained
from margincal.store.costs import metered
from margincal.store.stage_store import Store, default_store, write_meta
from margincal.training.curves import check_report_to, recording


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


def _published(out: Path | None, stage: str, report_to: str, train: Callable, write: Callable, config: dict, seed: int):
    """Run ``train()`` and, with ``out``, write its directory atomically (``write(tmp, model, result) → info``, the
    stage's ``stage.json`` with its cost); returns (model, result, info)."""
    if out is None:
        model, result = train()
        return model, result, {}
    with publish_dir(out) as tmp:
        with metered() as cost, recording(tmp, report_to):
            model, result = train()
        info = write(tmp, model, result)
        write_meta(tmp, stage, None, cost["seconds"], info, {**config, "seed": seed}, cost)
    return model, result, info


def _trained(cls, run: MethodRun, result: StageResult, out: Path | None, model, state: dict, **extra):
    return cls(
        method=run.name,
        hparams=dict(run.hparams),
        state=dict(state),
        steps=len(result.history),
        seconds=result.seconds,
        history=result.history,
        selected=result.selected,
        stopped_at=result.stopped_at,
        out=None if out is None else str(out),
        model=model,
        **extra,
    )


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
    scale: str = "paper",
    overrides: Sequence[str] = (),
    select: str = "last",
    seed: int = 0,
    benchmark: str = DEFAULT_BENCHMARK,
    max_length: int | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    out: str | Path | None = None,
    overwrite: bool = False,
    report_to: str = "none",
    store: str | Path | None = None,
) -> Unlearned:
    """θ̂ = ``method`` (a registered method: ``margincal methods``) run on a copy of θ0 = ``model`` with the forget
    and retain splits, its schedule resolved once at ``scale`` (``paper`` or ``mini``) for |D_f| as trained on, with
    ``key=value`` ``overrides``. ``select``: ``last``, or the monitored step by ``delta`` / ``privleak`` (needs
    ``ref``, ``holdout`` and ``utility``). ``out``: the directory to write (``model/``, ``method.json``,
    ``history.json``, ``stage.json``). On θ0 named by path or hub id the run is a one-node plan through the store
    (``store``): the same run again is read back (``result.cached``), ``out`` gets a copy and the model stays on
    disk (``result.out``: ``out``, else the store entry); on θ0 in memory it is trained here and the result holds it
    (``result.model``).

    Example (four NPO steps)::

        u = margincal.unlearn(mini.theta0, "NPO", f"{mini.dir}/forget10.json", retain=f"{mini.dir}/retain90.json",
                              scale="mini", overrides=["train.steps=4"], out=f"{tmp}/npo")
        print(u.final_loss, u.out, u.cached)
    """
    check_device(device)
    out_dir = _out(out, overwrite, report_to, model, forget, retain, env, ref, holdout, *utility)
    forget_records, retain_records = records(forget, "forget", forget=True), records(retain, "retain")
    env_records = records(env, "env")
    overrides = [*overrides, *([f"select={select}"] if select != "last" else [])]
    probe = resolve_method(method, scale, len(forget_records), overrides=overrides)
    chosen = get_method(probe.name, **probe.hparams)  # unknown hyperparameters stop here
    if chosen.prepares_with == "ref" and ref is None:
        raise InputError(f"{chosen.name} imitates θ_ref: give it as ref (--ref), the retain-only model")
    if probe.select != "last" and ref is None:
        what = {"delta": "Δ against θ_ref's margin", "privleak": "privleak against θ_ref's membership AUCs"}
        raise InputError(f"select {probe.select} needs ref (--ref): {what[probe.select]} is measured")
    splits = _monitor_splits(forget_records, holdout, utility, probe.monitor is not None)
    frozen = {"theta0": model, **({"ref": ref} if ref is not None else {})}
    train_records = {"forget": forget_records, "retain": retain_records, "env": env_records}
    ws = _workspace(model, benchmark, max_length, splits, train_records, frozen, tokenizer, template, dtype, device)
    # resolved once, at |D_f| as trained on (a raw-text split is chunked): the schedule run is the one recorded
    run = resolve_method(method, scale, len(ws.train["forget"]), overrides=overrides)
    m_ref = reference_margin(ws, EvalSettings()) if run.monitor is not None and ref is not None else None
    if not in_memory(model) and not in_memory(ref):
        return _unlearn_stored(str(model), ws, run, seed, train_records, ref, m_ref, store, out_dir, report_to)
    config = {
        "model": shown_model(model),
        "scale": scale,
        "env": str(env),
        "run": dataclasses.asdict(run),
        "seed": seed,
    }
    config |= {"ref": None if ref is None else shown_model(ref), "holdout": str(holdout), "utility": str(utility)}
    unlearned, result, _ = _published(
        out_dir,
        "unlearn",
        report_to,
        lambda: unlearn_stage(run, ws, seed, m_ref),
        lambda tmp, m, res: write_unlearned(tmp, m, ws.tokenizer, run, res),
        config,
        seed,
    )
    return _trained(Unlearned, run, result, out_dir, unlearned, result.method_state)  # the state MC continues


def _unlearn_stored(model, ws, run, seed, train_records, ref, m_ref, store, out_dir, report_to) -> Unlearned:
    """:func:`unlearn` of a model named by path or hub id as a one-node plan through the store, keyed by θ0's
    identity, the method run as resolved, the seed, the evaluation and training data, the dtype and (monitored) θ_ref
    and its margin: the same run again is read back. ``out_dir`` gets a copy of the stored directory."""
    stages = Store(store or default_store())
    config = {"theta0": None, "run": dataclasses.asdict(run), "seed": seed}
    config["ref"] = None if ref is None else checkpoint(str(ref), store=stages).identity
    return _stored(model, ws, "unlearn", "theta0", run, config, train_records, m_ref, stages, out_dir, report_to)


def _stored(model, ws, stage, named, spec, config, train_records, m_ref, stages, out_dir, report_to) -> Trained:
    """The one-node plan of a single ``stage`` on ``model`` (a path or hub id) through the store: its node keyed by
    ``config`` with the model's identity under ``named``, the evaluation and training data (``train_records``'
    digests), the dtype and θ_ref's margin ``m_ref``; the record of the stored directory, which ``out_dir`` (if
    given) gets a copy of."""
    reference = None if m_ref is None else {"summary": {"m": m_ref}}
    train = {role: digest([evaluated_fields(r) for r in recs]) for role, recs in train_records.items() if recs}

    def add(builder, identity: str) -> None:
        data = {"data": {"eval": builder.data, "train": train}, "dtype": ws.dtype, "reference": reference}
        builder.add(f"model/{stage}", stage, "model", spec, {**config, named: identity, **data})

    graph_run, cached = stored_plan(model, ws, EvalSettings(), "given", reference, add, stages, report_to)
    stored = graph_run.paths[f"model/{stage}"]
    if out_dir is not None:
        with publish_dir(out_dir) as tmp:
            shutil.copytree(stored, tmp, dirs_exist_ok=True)
    return dataclasses.replace(trained(out_dir or stored), cached=cached[f"model/{stage}"])


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
    variant: str = "reference",
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
    scale: str = "paper",
    overrides: Sequence[str] = (),
    benchmark: str = DEFAULT_BENCHMARK,
    max_length: int | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    out: str | Path | None = None,
    overwrite: bool = False,
    report_to: str = "none",
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
    ``history.json``, ``stage.json``). On a model and θ0, θ_ref named by path or hub id (an :class:`Unlearned` result by
    the directory it wrote) the polish is a one-node plan through the store (``store``), keyed by the model's identity,
    the method and the state it continues, the resolved MC settings, the anchors' identities, the evaluation and
    training data, the dtype and θ_ref's margin: the same polish again is read back (``result.cached``) and ``out`` gets
    a copy; with a model in memory it is trained here (``result.model``).

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
    _check_reference(mc, variant, trace, ref)
    forget_records = records(forget, "forget", forget=True)
    train = {"forget": forget_records, "retain": records(retain, "retain"), "probe": records(probe, "probe")}
    hinged = records(questions, "questions", forget=True) if choices else forget_records
    splits = _monitor_splits(hinged, holdout, utility, mc.monitor is not None)
    frozen = {role: m for role, m in (("theta0", theta0), ("ref", ref)) if m is not None}
    stages = Store(store or default_store())
    ws = _workspace(held, benchmark, max_length, splits, train, frozen, tokenizer, template, dtype, device)
    run, state = _method_of(model, method, scale, len(ws.train["forget"]), log)
    needed = get_method(run.name, **run.hparams).prepares_with  # the frozen model the method's own loss reads
    if needed is not None and needed not in ws.models:
        flag = "theta0 (--theta0)" if needed == "theta0" else "ref (--ref)"
        raise InputError(f"{run.name}'s loss reads {'θ0' if needed == 'theta0' else 'θ_ref'}: give {flag}")
    m_ref = reference_margin(ws, EvalSettings()) if ref is not None else None
    if any(in_memory(m) for m in (held, theta0, ref)):
        return _polish_here(held, ws, run, state, mc, variant, trace, frozen, m_ref, out_dir, report_to)
    config = {"model": None, "method": {"name": run.name, "hparams": run.hparams}, "state": state}
    config |= {"variant": variant, "mc": dataclasses.asdict(mc), "trace": trace}
    config["anchors"] = {role: checkpoint(str(m), store=stages).identity for role, m in frozen.items()}
    return _stored(str(held), ws, "polish", "model", mc, config, train, m_ref, stages, out_dir, report_to)


def _mc_given(mc: MCConfig | Mapping[str, Any] | None, variant: str, kappa, kl_weight) -> list[tuple[str, dict]]:
    """:func:`polish`'s ``mc`` and its keywords as named layers of :func:`resolve_mc`: an MCConfig's every field (so
    it is taken whole; with a variant other than the default its settings would be lost, which stops), a mapping's
    fields, then κ and the KL weight where given."""
    given = []
    if isinstance(mc, MCConfig):
        if variant != "reference":
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


def _check_reference(mc, variant: str, trace: bool, ref: Model | None) -> None:
    """Stop without ``ref`` (θ_ref) where the polish reads it: a controlled run, a Δ-stop, the trace, or a variant
    anchored at θ_ref."""
    needs_ref = [
        (mc.control is not None, "controlled MC stops at θ_ref's margin and membership signal"),
        (mc.stop_delta is not None, "Δ-stop (stop_delta) stops at a depth measured from θ_ref's margin"),
        (trace, "the trace measures Δ against θ_ref"),
        (mc.margin_anchor == "ref", f"the {variant!r} variant anchors at θ_ref"),
    ]
    why = next((why for needed, why in needs_ref if needed), None)
    if ref is None and why is not None:
        raise InputError(f"give ref (--ref), the retain-only reference: {why}")


def _polish_here(held, ws, run, state, mc, variant, trace, frozen, m_ref, out_dir, report_to) -> Polished:
    """:func:`polish` with a model in memory (the model, θ0 or θ_ref): trained here on a copy of ``held``, written
    into ``out_dir`` if given, the polished model in the result."""
    hook = coercivity_trace(ws, mc, m_ref) if trace else None
    config = {"model": shown_model(held), "method": dataclasses.asdict(run), "variant": variant}
    config |= {role: shown_model(frozen[role]) if role in frozen else None for role in ("theta0", "ref")}

    def write(tmp: Path, polished, result: StageResult) -> dict:
        info = write_polished(tmp, polished, ws.tokenizer, result, state)
        if trace:
            trajectory_figure(result.history, tmp / "trajectory.png", f"{run.name}+MC")
            info["trajectory"] = str(out_dir / "trajectory.png")
        return info

    start = clone_model(held) if in_memory(held) else ws.load(held)  # the model given is left as it was
    polished, result, _ = _published(
        out_dir,
        "polish",
        report_to,
        lambda: polish_stage(start, run, mc, ws, m_ref, state, hook),
        write,
        {**config, "mc": dataclasses.asdict(mc)},
        mc.train.seed,
    )
    return _trained(Polished, run, result, out_dir, polished, state, variant=variant, mc=dataclasses.asdict(mc))


@checked_call
def attack(
    model: Model,
    forget: Records,
    *,
    attacker: str = "lora_r8",
    k: int | Sequence[int] | None = None,
    ref: Model | None = None,
    tokenizer: Any = None,
    shots: Records | None = None,
    instrument: bool = False,
    scale: str = "paper",
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
    with ``ref``, margin flips). ``instrument``: Theorem 3's lift against its bound Λ̂(N). On a model named by path
    or hub id the attacks run as a plan through the store (``store``; without ``instrument``): the same attack again
    is read from there (``cached``).

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
    m_ref = reference_margin(ws, evaluation) if ref is not None else None
    if not in_memory(model) and not instrument:  # a plan through the store: an attack run before is read back
        reference = None if m_ref is None else {"summary": {"m": m_ref}}

        def add(builder, identity: str) -> None:
            for budget in budgets:
                run = dataclasses.replace(cfg, k=budget)
                builder.attack(f"model/attack/{budget}", "model", identity, run, (), reference)

        stages = Store(store or default_store())
        run, cached = stored_plan(str(model), ws, evaluation, "given", reference, add, stages)
        results = {str(b): run.read(f"model/attack/{b}", "attack.json") for b in budgets}
        return AttackResult(attacker, shown_model(model), results, m_ref, {}, all(cached.values()))
    net = model if in_memory(model) else ws.load(model)
    results, instruments = {}, {}
    for budget in budgets:
        probes: list[LiftInstrument] = []

        def factory(held, probes=probes):
            examples = [ws.attack_examples[i] for i in held]
            probes.append(LiftInstrument(net, examples, ws.tokenizer.pad_token_id, cfg.beta))
            return probes[-1]

        run = dataclasses.replace(cfg, k=budget)
        results[str(budget)] = attack_stage(net, run, ws, evaluation, m_ref, factory if instrument else None)
        if probes:
            instruments[str(budget)] = {"summary": probes[0].summary(), "trace": probes[0].rows}
    return AttackResult(attacker, shown_model(model), results, m_ref, instruments)


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
