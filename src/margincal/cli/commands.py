"""The bodies of the ``margincal`` commands: each takes the parsed arguments, validates every input before the first
forward pass, runs the stage functions of :mod:`margincal.stages` and returns the exit code. Argument parsing lives
in :mod:`margincal.cli.parsers`."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from margincal.artifacts import atomic_write_json, check_free_space, check_output, manifest, publish_dir, weights_bytes
from margincal.checks import check_device
from margincal.config import (
    FAMILIES,
    EvalSettings,
    MethodRun,
    apply_overrides,
    build,
    given,
    resolve_attack,
    resolve_benchmark,
    resolve_mc,
    resolve_method,
)
from margincal.costs import metered
from margincal.curves import check_report_to, recording
from margincal.errors import InputError
from margincal.inputs import read_bytes


def _cmd_demo(args: argparse.Namespace) -> int:
    """The demo is the shipped panel ``configs/panels/demo.yaml`` plus its report."""
    from margincal.pipeline.executors import run_panel
    from margincal.pipeline.panel import load_panel
    from margincal.reporting.panel import write_report

    cfg = load_panel(args.config or "demo", args.overrides)
    print(f"margincal demo: {cfg.description} (a first run builds the mini models: about 2 min on 2 CPU cores)")
    summary = run_panel(cfg)
    report = write_report(cfg.out_dir)
    for row in summary["cells"]:
        if row["status"] == "failed":
            print(f"  FAILED {row['id']}: {row['error']}")
    print(f"\nReport: {report}")
    return 1 if summary["counts"]["failed"] else 0


def _benchmark(args: argparse.Namespace):
    """The command's benchmark spec, with ``--max-length`` / ``--max-new-tokens`` / ``--aggregate`` when given."""

    spec = resolve_benchmark(getattr(args, "benchmark", None) or "tofu")
    changes = {
        k: getattr(args, k) for k in ("max_length", "max_new_tokens", "aggregate") if getattr(args, k, None) is not None
    }
    return dataclasses.replace(spec, **changes)


def _records(path: str | None, forget: bool = False):
    """The records of a TOFU-format file given on the command line (None when the flag is absent); a ``forget`` file's
    records must be distinct (:func:`margincal.data.records.check_distinct`)."""
    from margincal.data.records import check_distinct
    from margincal.data.tofu import load_qa_json

    if path is None:
        return None
    records = load_qa_json(path)
    if forget:
        check_distinct(records, str(path))
    return records


def _workspace(args: argparse.Namespace, model: str, eval_splits: dict | None = None, **train_records):
    """The command's workspace (:func:`margincal.stages.build_workspace`): ``model``'s tokenizer and context,
    ``eval_splits`` and the training records (``forget``/``retain`` may hold raw passages, chunked as
    open-unlearning's PretrainingDataset; ``probe``/``env`` are QA), with ``--theta0`` / ``--ref`` as the frozen
    models when the command has them."""
    from margincal.stages import build_workspace

    models = {role: getattr(args, role) for role in ("theta0", "ref") if getattr(args, role, None)}
    return build_workspace(
        model,
        _benchmark(args),
        eval_splits or {},
        train_records,
        models=models,
        template=args.template,
        dtype=args.dtype,
        device=args.device,
        explicit_max_length=getattr(args, "max_length", None) is not None,
    )


def _write(path: str | Path, record: dict, config: dict, seed: int = 0) -> None:
    atomic_write_json(path, {**record, "manifest": manifest(config, seed)})


def _local_inputs(*paths: str | None) -> list[Path]:
    """The command's inputs that are local files or directories (an output must never replace one)."""
    return [Path(p) for p in paths if p is not None and Path(p).exists()]


def _check_out(args: argparse.Namespace, directory: bool, *inputs: str | None) -> Path | None:
    """``--out`` checked before any compute (:func:`margincal.artifacts.check_output`); None when not given."""
    if getattr(args, "out", None) is None:
        return None
    return check_output(args.out, directory=directory, overwrite=args.overwrite, inputs=_local_inputs(*inputs))


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from margincal.api import diagnose

    check_device(args.device)
    _check_out(args, False, args.model, args.forget, args.ref, args.retain)
    d = diagnose(
        args.model,
        args.forget,
        ref=args.ref,
        retain=args.retain,
        benchmark=args.benchmark,
        aggregate=args.aggregate,
        template=args.template,
        batch_size=args.batch_size,
        max_length=args.max_length,
        dtype=args.dtype,
        device=args.device,
    )
    print(f"m(D_f) = {d.m:+.3f}   ℓ = {d.log_odds:+.3f}   (n = {d.n}, {d.aggregate})")
    if d.m_ref is not None:
        print(f"m_ref = {d.m_ref:+.3f}   Δ = {d.delta:+.3f}: {d.label}")
    if d.overlap_epsilon is not None:
        print(f"forget/retain bigram overlap ε = {d.overlap_epsilon:.3f}")
    if args.out:
        d.save(args.out, {"command": "diagnose", **{k: str(v) for k, v in vars(args).items() if k != "func"}})
        print(f"written to {args.out}")
    return 0


def _cmd_anchors(args: argparse.Namespace) -> int:
    import hashlib

    from margincal.data.templates import template_of
    from margincal.objective import AnchorTable

    check_device(args.device)
    if not args.out.endswith(".safetensors"):
        raise InputError(f"--out {args.out}: an anchor table is a .safetensors file; give a path ending so")
    _check_out(args, False, args.ref, args.forget)
    records = _records(args.forget, forget=True)
    ws = _workspace(args, args.ref, forget=records)
    meta = {
        "anchor_model": args.ref,
        "forget": str(args.forget),
        "forget_sha256": hashlib.sha256(read_bytes(args.forget, "--forget")).hexdigest(),
    }
    template = template_of(ws.tokenizer).name
    table = AnchorTable.build(ws.frozen("ref"), ws.train["forget"], ws.tokenizer, template, **meta)
    table.save(args.out)
    print(
        f"anchor table of {len(records)} forget records ({table.tokens.size(1)} answer tokens at most, template "
        f"{table.meta['template']!r}, tokenizer {table.meta['tokenizer_digest']}) written to {args.out}"
    )
    return 0


PAPER_FORGET = 400  # |D_f| of TOFU forget10: the size `margincal methods` shows the paper schedules at


def _cmd_methods(args: argparse.Namespace) -> int:
    from margincal.methods import METHODS, get_method

    runs = {key: {s: resolve_method(key, s, n_forget=PAPER_FORGET) for s in ("paper", "mini")} for key in METHODS}
    hparams = {key: get_method(run["paper"].name, **run["paper"].hparams).hparams() for key, run in runs.items()}
    ordered = sorted(METHODS, key=lambda k: (FAMILIES.index(get_method(k).family), k))
    print(f"{len(METHODS)} methods (configs/methods/<name>.yaml; `margincal unlearn --method NAME`); schedules at")
    print(f"paper scale for TOFU forget10 (|D_f| = {PAPER_FORGET}), and at mini scale\n")
    for key in ordered:
        cls, paper, mini = METHODS[key], runs[key]["paper"], runs[key]["mini"]
        shown_hp = ", ".join(f"{k}={v}" for k, v in hparams[key].items())
        mini_hp = "".join(f", {k}={v}" for k, v in mini.hparams.items() if paper.hparams.get(k) != v)
        print(f"{cls.name:<11} {get_method(key).family:<13} {cls.source}")
        print(f"{'':<11} hparams: {shown_hp}")
        p, m = paper.train, mini.train
        print(
            f"{'':<11} paper: lr {p.lr:g}, {p.steps} steps, batch {p.batch_size}×{p.grad_accum};  "
            f"mini: lr {m.lr:g}, {m.steps} steps, batch {m.batch_size}{mini_hp}"
        )
    return 0


def _monitor_splits(args: argparse.Namespace, forget: list, monitored: bool) -> dict:
    """The evaluation splits the held-out monitors read (forget, ``--holdout``, ``--utility``); stops when
    monitors are on and either file is missing."""
    if not monitored:
        return {"forget": forget}
    missing = [f"--{name}" for name in ("holdout", "utility") if not getattr(args, name)]
    if missing:
        raise InputError(f"the held-out monitors need {' and '.join(missing)} (non-member and utility QA files)")
    return {
        "forget": forget,
        "holdout": _records(args.holdout),
        "utility": [r for f in args.utility for r in _records(f)],
    }


def _cmd_unlearn(args: argparse.Namespace) -> int:

    from margincal.methods.base import get_method
    from margincal.stages import unlearn_stage, write_unlearned
    from margincal.store import write_meta

    check_device(args.device)
    check_report_to(args.report_to, "--report-to")
    out = _check_out(
        args, True, args.model, args.forget, args.retain, args.env, args.ref, args.holdout, *(args.utility or ())
    )
    forget, retain, env = _records(args.forget, forget=True), _records(args.retain), _records(args.env)
    overrides = [*args.overrides, *([f"select={args.select}"] if args.select != "last" else [])]
    probe = resolve_method(args.method, args.scale, len(forget), overrides=overrides)
    method = get_method(probe.name, **probe.hparams)  # unknown hyperparameters stop here
    if method.prepares_with == "ref" and args.ref is None:
        raise InputError(f"{method.name} imitates θ_ref: give it with --ref RETAIN_MODEL")
    if probe.select != "last" and args.ref is None:
        what = {"delta": "Δ against θ_ref's margin", "privleak": "privleak against θ_ref's membership AUCs"}
        raise InputError(f"--select {probe.select} needs --ref ({what[probe.select]} is measured)")
    splits = _monitor_splits(args, forget, probe.monitor is not None)
    check_free_space(out, weights_bytes(args.model))
    args.theta0 = args.model
    ws = _workspace(args, args.model, splits, forget=forget, retain=retain, env=env)
    # resolved once, at |D_f| as trained on (a raw-text split is chunked): the schedule run is the one recorded
    run = resolve_method(args.method, args.scale, len(ws.train["forget"]), overrides=overrides)
    m_ref = None
    if run.monitor is not None and args.ref is not None:
        from margincal.stages import reference_margin

        m_ref = reference_margin(ws, EvalSettings())
    config = {
        "model": args.model,
        "scale": args.scale,
        "env": args.env,
        "run": dataclasses.asdict(run),
        "seed": args.seed,
        "ref": args.ref,
        "holdout": args.holdout,
        "utility": args.utility,
    }
    with publish_dir(out) as tmp:
        with metered() as cost, recording(tmp, args.report_to):
            model, result = unlearn_stage(run, ws, args.seed, m_ref)
        info = write_unlearned(tmp, model, ws.tokenizer, run, result)
        write_meta(tmp, "unlearn", None, cost["seconds"], info, config, cost)
    last = result.history[-1]
    print(f"{run.name}: {len(result.history)} steps in {result.seconds:.1f} s, final loss {last['loss']:.4f}")
    if result.selected is not None:
        print(f"  released the step selected by {run.select}: {result.selected} (trace.json, trace.png)")
    print(f"saved to {out} (model/, method.json, history.json, stage.json{', trace.json' if result.trace else ''})")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from margincal.api import evaluate
    from margincal.evaluation.metric_table import summary_order

    check_device(args.device)
    _check_out(args, False, args.model, args.data, args.reference)
    settings = given(
        EvalSettings,
        batch_size=args.batch_size,
        generation_batch_size=args.generation_batch_size,
        gradnorm=not args.no_gradnorm,
        mmlu=args.mmlu,
    )
    e = evaluate(
        args.model,
        benchmark=args.benchmark or "tofu",
        data=args.data,
        tier=args.tier,
        reference=args.reference,
        settings=settings,
        template=args.template,
        dtype=args.dtype,
        device=args.device,
        store=args.store,
        **{k: getattr(args, k, None) for k in ("max_length", "max_new_tokens", "aggregate")},
    )
    print(f"{e.model} on {e.benchmark} {e.tier} ({'read from the store' if e.cached else f'{e.seconds:.1f} s'})")
    for key in summary_order(e.summary):  # the metric table's headline metrics first
        value = e.summary[key]
        print(f"  {key:<28} {value:.4f}" if isinstance(value, float) else f"  {key:<28} {value}")
    if args.out:
        config = {"model": args.model, "data": str(args.data), "reference": str(args.reference), "dtype": args.dtype}
        e.save(args.out, {**config, "settings": dataclasses.asdict(settings)})
        print(f"written to {args.out}")
    return 0


def _unlearned_method(args: argparse.Namespace, n_forget: int):
    """The polished model's method: name, hyperparameters and carried state (PDU's λ) from the ``method.json`` that
    the unlearn stage saved beside it (``margincal unlearn`` or a panel's store), else the method's resolution at
    ``--scale``; a ``--method`` other than the one that unlearned the checkpoint stops."""
    from margincal.stages import read_unlearned

    method = read_unlearned(args.model)
    if method is None:
        print(
            f"{args.model} has no method.json (margincal did not unlearn it): its native loss is {args.method}'s "
            f"at --scale {args.scale}"
        )
        return resolve_method(args.method, args.scale, n_forget), {}
    if method["name"].lower() != args.method.lower():
        raise InputError(
            f"--method {args.method}: {args.model} was unlearned with {method['name']} (its method.json); "
            f"give --method {method['name']}"
        )
    return MethodRun(name=method["name"], hparams=method["hparams"]), method.get("state", {})


def _cmd_polish(args: argparse.Namespace) -> int:

    from margincal.bounds import coercivity_hook
    from margincal.data.benchmarks import shots_of
    from margincal.methods.base import method_class
    from margincal.monitors import delta_check
    from margincal.objective import anchor_tables
    from margincal.reporting.figures import trajectory_figure
    from margincal.stages import polish_stage, reference_margin, write_polished
    from margincal.store import write_meta

    check_device(args.device)
    check_report_to(args.report_to, "--report-to")
    out = _check_out(
        args,
        True,
        args.model,
        args.theta0,
        args.ref,
        args.forget,
        args.retain,
        args.probe,
        args.questions,
        args.holdout,
        *(args.utility or ()),
    )
    method_class(args.method)  # an unknown method stops here
    choices = _benchmark(args).hinge_on == "questions"  # WMDP: the hinge on --questions, the method on --forget
    if choices and (args.questions is None or args.trace):
        raise InputError(
            "--benchmark hinges on four-choice questions: give --questions FILE"
            if args.questions is None
            else "--trace reads the training forget split's per-token margins; a question hinge has none"
        )
    if args.questions is not None and not choices:
        raise InputError("--questions is for a benchmark whose MC hinges on four-choice questions (wmdp-cyber, ...)")
    mc = resolve_mc(args.variant, args.scale, overrides=args.overrides)
    needs_ref = [
        (mc.control is not None, "controlled MC stops at θ_ref's margin and membership signal"),
        (mc.stop_delta is not None, "Δ-stop (stop_delta) stops at a depth measured from θ_ref's margin"),
        (args.trace, "--trace measures Δ against θ_ref"),
        (mc.margin_anchor == "ref", f"the {args.variant!r} variant anchors at θ_ref"),
    ]
    why = next((why for needed, why in needs_ref if needed), None)
    if args.ref is None and why is not None:
        raise InputError(f"give --ref (the retain-only reference): {why}")
    forget, retain, probe = _records(args.forget, forget=True), _records(args.retain), _records(args.probe)
    check_free_space(out, weights_bytes(args.model))
    splits = _monitor_splits(args, _records(args.questions, forget=True) if choices else forget, mc.monitor is not None)
    ws = _workspace(args, args.model, splits, forget=forget, retain=retain, probe=probe)
    run, state = _unlearned_method(args, len(ws.train["forget"]))
    m_ref = None
    if args.ref is not None:
        m_ref = reference_margin(ws, EvalSettings())
    hook = None
    if args.trace:
        anchor, anchor_id = ws.anchors()[mc.margin_anchor]
        pad = ws.tokenizer.pad_token_id
        tables = anchor_tables(anchor, anchor_id, ws.train["forget"], pad)
        check = delta_check(
            ws.tokenizer,
            ws.benchmark,
            ws.eval_splits["forget"],
            m_ref,  # Δ on D_f, as evaluated
            shots_of(ws.benchmark, ws.eval_splits, "forget"),
        )
        hook = coercivity_hook(
            tables,
            ws.train["forget"],
            ws.train["retain"],
            ws.train["probe"],
            anchor,
            check,
            mc.kappa,
            mc.token_weights,
            pad,
        )
    config = {
        "model": args.model,
        "method": dataclasses.asdict(run),
        "theta0": args.theta0,
        "ref": args.ref,
        "variant": args.variant,
        "mc": dataclasses.asdict(mc),
    }
    with publish_dir(out) as tmp:
        with metered() as cost, recording(tmp, args.report_to):
            polished, result = polish_stage(ws.load(args.model), run, mc, ws, m_ref, state, hook)
        info = write_polished(tmp, polished, ws.tokenizer, result, state)
        if args.trace:
            trajectory_figure(result.history, tmp / "trajectory.png", f"{run.name}+MC")
            info["trajectory"] = str(out / "trajectory.png")
        write_meta(tmp, "polish", None, result.seconds, info, {**config, "seed": mc.train.seed}, cost)
    last = result.history[-1]
    print(f"MC {args.variant} polish of {args.model}: {len(result.history)} steps in {result.seconds:.1f} s")
    print(f"  final loss {last['loss']:.4f}" + (f", stopped at step {result.stopped_at}" if result.stopped_at else ""))
    if "trajectory" in info:
        print(f"  coercivity trace: {info['trajectory']}")
    if result.trace:
        chosen = f", released step {result.selected}" if result.selected is not None else ""
        print(f"  monitors: {len(result.trace)} passes{chosen} (trace.json, trace.png)")
    print(f"saved to {out} (model/ with the merged weights, history.json, stage.json)")
    return 0


def _cmd_attack(args: argparse.Namespace) -> int:

    from margincal.bounds import LiftInstrument
    from margincal.checks import check_budgets
    from margincal.stages import attack_stage, reference_margin

    check_device(args.device)
    _check_out(args, False, args.model, args.forget, args.ref, args.shots)
    try:
        sweep = [int(k) for k in args.k_sweep.split(",")] if args.k_sweep else None
    except ValueError as err:
        raise InputError(f"--k-sweep takes comma-separated integers, e.g. 1,3,5,10,20; got {args.k_sweep!r}") from err
    cfg = resolve_attack(args.attacker, args.scale, args.overrides)
    budgets = sweep or [args.k or cfg.k]
    splits = {"forget": _records(args.forget, forget=True)}
    check_budgets(budgets, len(splits["forget"]), "--k-sweep" if args.k_sweep else "--k")
    if args.shots:
        splits["forget_icl"] = _records(args.shots)
    ws = _workspace(args, args.model, splits)
    settings = given(EvalSettings, batch_size=args.batch_size, generation_batch_size=args.generation_batch_size)
    net = ws.load(args.model)
    m_ref = None
    if args.ref is not None:
        m_ref = reference_margin(ws, settings)
    results, instruments = {}, {}
    for k in budgets:
        probes: list = []

        def factory(held, probes=probes):
            probes.append(
                LiftInstrument(net, [ws.attack_examples[i] for i in held], ws.tokenizer.pad_token_id, cfg.beta)
            )
            return probes[-1]

        res = attack_stage(
            net, dataclasses.replace(cfg, k=k), ws, settings, m_ref, factory if args.instrument else None
        )
        results[k] = res
        delta, flips = res["diagnosis"].get("delta"), res["flips"]["flipped"]
        print(
            f"K={k:<4} held-out ROUGE-L {res['rouge_l']:.3f}"
            + (f"  Δ {delta:+.2f}" if delta is not None else "")
            + f"  margin flips {flips['n']}/{len(res['heldout'])}"
        )
        if probes:
            instruments[k] = {"summary": probes[0].summary(), "trace": probes[0].rows}
            t3 = instruments[k]["summary"]
            print(f"       Theorem 3: lift {t3['lift']:+.3f} ≤ Λ̂(N) {t3['Lambda_hat']:.3f}: {t3['bound_holds']}")
    if args.out:
        record = {"attacker": args.attacker, "m_ref": m_ref, "results": results, "theorem3": instruments}
        config = {"model": args.model, "benchmark": ws.benchmark.name, "attack": dataclasses.asdict(cfg)}
        _write(args.out, record, config)
        print(f"written to {args.out}")
    return 0


def _cmd_panel(args: argparse.Namespace) -> int:
    from margincal.pipeline.executors import dry_run, run_panel
    from margincal.pipeline.panel import load_panel

    cfg = load_panel(args.panel, args.overrides)
    if args.dry_run:
        rows = dry_run(cfg)
        print(f"panel {cfg.name}: {len(rows)} cells; store {cfg.store_dir}; out {cfg.out_dir}")
        if rows:
            print(f"models: {rows[0]['models']}")
        for row in rows:
            missing = [label for label, done in row["stages"].items() if not done]
            cached = len(row["stages"]) - len(missing)
            todo = f"to run: {', '.join(missing)}" if missing else "all cached"
            plan = row["plan"]
            size = f" (|D_f| = {plan.n_forget})" if plan.n_forget is not None else ""
            print(f"  {row['id']}{size}: {cached}/{len(row['stages'])} stages cached; {todo}")
            shown = set()  # an attacker's schedule is the same on every model: one line each
            for node in plan.graph.nodes:
                what = node.label.split("/", 1)[1] if node.kind == "attack" else node.label
                if node.kind != "evaluate" and what not in shown:
                    shown.add(what)
                    print(f"      {what:<24} {node.schedule()}")
        return 0
    summary = run_panel(cfg)
    counts = summary["counts"]
    print(f"\npanel {cfg.name}: {counts['done']} cells done, {counts['failed']} failed in {summary['seconds']:.0f}s")
    for row in summary["cells"]:
        if row["status"] == "failed":
            print(f"  FAILED {row['id']}: {row['error']}")
    print(f"results: {cfg.out_dir}  (report: margincal report {cfg.out_dir})")
    return 1 if counts["failed"] else 0


def _cmd_mini_export(args: argparse.Namespace) -> int:
    """Build (or reuse) the mini models of a tier, write the mini splits as TOFU-format files, print the paths."""

    from margincal.mini.data import generate
    from margincal.mini.models import MiniModelConfig, build_mini_models, retain_split
    from margincal.store import Store, default_store

    out = check_output(args.dir, directory=True, overwrite=args.overwrite, flag="DIR")
    if args.panel:
        from margincal.pipeline.panel import load_panel

        base = dataclasses.asdict(load_panel(args.panel).mini)
        cfg = build(MiniModelConfig, apply_overrides(base, args.overrides), f"panel {args.panel}: mini")
    else:
        cfg = build(MiniModelConfig, apply_overrides({}, args.overrides), "mini")
    retain = retain_split(args.tier)
    bench = generate(cfg.data)
    if args.tier not in bench.splits:
        raise InputError(f"the mini benchmark has no tier {args.tier!r}; it has forget01, forget05 and forget10")
    store = Store(args.store) if args.store else Store(default_store())
    paths = build_mini_models(cfg, args.tier, store, bench)
    with publish_dir(out) as tmp:
        bench.to_json_dir(tmp)
        record = {"theta0": str(paths.theta0), "ref": str(paths.ref), "tier": args.tier, "splits": sorted(bench.splits)}
        _write(tmp / "mini.json", record, {"mini": dataclasses.asdict(cfg), "tier": args.tier})
    forget, retain_file = out / f"{args.tier}.json", out / f"{retain}.json"
    print(f"θ0     {paths.theta0}\nθ_ref  {paths.ref}  (retain-only reference of {args.tier})")
    print(f"splits {out}: {', '.join(f'{n}.json' for n in sorted(bench.splits))}\n")
    print("The README's single-stage commands on the mini (its schedules, learning rates and context):")
    print(f"  margincal diagnose --model {paths.theta0} --ref {paths.ref} --forget {forget} --retain {retain_file}")
    print(
        f"  margincal unlearn --method NPO --model {paths.theta0} --forget {forget} --retain {retain_file} "
        "--scale mini --out runs/npo"
    )
    print(
        f"  margincal polish --model runs/npo --method NPO --theta0 {paths.theta0} --ref {paths.ref} "
        f"--forget {forget} --retain {retain_file} --probe {out / 'probe.json'} --out runs/npo_mc"
    )
    print(
        f"  margincal attack --model runs/npo_mc --forget {forget} --ref {paths.ref} --scale mini --k-sweep 1,3,5,10,20"
    )
    print(f"  margincal evaluate --model runs/npo_mc --benchmark mini --data {out} --out npo_mc.json")
    return 0


def _cmd_population(args: argparse.Namespace) -> int:
    import shlex
    import sys

    from margincal.auditing.merge import merge_population, read_audits

    audits = read_audits(args.audits, args.control)  # every input checked before --out
    out = _check_out(args, True, *args.audits)
    command = shlex.join(["margincal", *sys.argv[1:]])
    pop = merge_population(audits, args.control, out, command)
    print(f"population of {pop['n_checkpoints']} checkpoints written to {out}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from margincal.reporting.panel import write_report

    path = write_report(args.results, args.out)
    print(f"report written to {path}")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    import shlex
    import sys

    from margincal.api import audit

    settings = given(
        EvalSettings, batch_size=args.batch_size, generation_batch_size=args.generation_batch_size, mmlu=args.mmlu
    )
    card = audit(
        args.model,
        out=args.out,
        models_file=args.models,
        from_panel=args.from_panel,
        data=args.data,
        benchmark=args.benchmark,
        tier=args.tier,
        ref=args.ref,
        ref_logs=args.ref_logs,
        theta0=args.theta0,
        budget=args.budget,
        overrides=args.overrides,
        scale=args.scale,
        base=args.base,
        settings=settings,
        template=args.template,
        dtype=args.dtype,
        device=args.device,
        store=args.store,
        control=args.control,
        claimed=args.claimed or (),
        report_to=args.report_to,
        overwrite=args.overwrite,
        command="margincal " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        log=print,
    )
    for name in card.checkpoints:
        value, delta = card.recovered(name), card.delta(name)
        shown_delta = "—" if delta is None else f"{delta:+.3f}"
        print(f"  {name}: Δ {shown_delta}, {card.headline} recovered {'—' if value is None else f'{value:.2f}'}")
    print(f"card: {Path(card.out) / 'card.md'}")
    return 0
