"""Command-line interface: ``margincal <command> [--config FILE] [key=value ...]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from margincal.artifacts import (
    atomic_write_json,
    check_free_space,
    check_output,
    manifest,
    publish_dir,
    weights_bytes,
)
from margincal.checks import check_device
from margincal.config import CONFIG_DIR, read_yaml, resolve_attack, resolve_benchmark, resolve_mc, resolve_method
from margincal.errors import NonFiniteLossError

EPILOG = "Overrides use dotted keys, e.g. `seeds=[1] out=runs/seed1 mc.kappa=2.0`."


def _cmd_demo(args: argparse.Namespace) -> int:
    """The demo is the shipped panel ``configs/panels/demo.yaml`` plus its report."""
    from margincal.pipeline.executors import run_panel
    from margincal.pipeline.panel import load_panel
    from margincal.report.panel import write_report

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
    import dataclasses

    spec = resolve_benchmark(getattr(args, "benchmark", None) or "tofu")
    changes = {k: getattr(args, k) for k in ("max_length", "max_new_tokens", "aggregate")
               if getattr(args, k, None) is not None}  # fmt: skip
    return dataclasses.replace(spec, **changes)


def _records(path: str | None):
    """The records of a TOFU-format file given on the command line (None when the flag is absent)."""
    from margincal.data.tofu import load_qa_json

    return None if path is None else load_qa_json(path)


def _workspace(args: argparse.Namespace, model: str, eval_splits: dict | None = None, **train_records):
    """The command's workspace (:func:`margincal.stages.build_workspace`): ``model``'s tokenizer and context,
    ``eval_splits`` and the training records (``forget``/``retain`` may hold raw passages, chunked as
    open-unlearning's PretrainingDataset; ``probe``/``env`` are QA), with ``--theta0`` / ``--ref`` as the frozen
    models when the command has them."""
    from margincal.stages import build_workspace

    models = {role: getattr(args, role) for role in ("theta0", "ref") if getattr(args, role, None)}
    return build_workspace(model, _benchmark(args), eval_splits or {}, train_records, models=models,
                           template=args.template, dtype=args.dtype, device=args.device,
                           explicit_max_length=getattr(args, "max_length", None) is not None)  # fmt: skip


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
    from margincal.config import EvalSettings
    from margincal.margin import overlap_epsilon
    from margincal.stages import evaluate_stage

    check_device(args.device)
    _check_out(args, False, args.model, args.forget, args.ref, args.retain)
    records, retain = _records(args.forget), _records(args.retain)
    args.max_new_tokens = None
    args.benchmark = args.benchmark or ("muse-news" if args.aggregate == "median" else "tofu")
    settings = EvalSettings(batch_size=args.batch_size)
    reference = None
    if args.ref is not None:
        ws_ref = _workspace(args, args.ref, {"forget": records})
        reference = evaluate_stage(ws_ref.load(args.ref), ws_ref, settings, parts=("diagnosis",))
    ws = _workspace(args, args.model, {"forget": records})
    result = evaluate_stage(ws.load(args.model), ws, settings, reference, parts=("diagnosis",))["splits"]["forget"]
    out = {"model": args.model, "forget": str(args.forget), "n": len(records), "aggregate": ws.benchmark.aggregate,
           "diagnosis": result["diagnosis"], "diagnostic_margins": result["diagnostic_margins"]}  # fmt: skip
    if reference is not None:
        out["ref"] = {"model": args.ref, "m": reference["summary"]["m"]}
    d = out["diagnosis"]
    print(f"m(D_f) = {d['m']:+.3f}   ℓ = {d['log_odds']:+.3f}   (n = {d['n']}, {d['aggregate']})")
    if d["m_ref"] is not None:
        verdict = "crossed (Δ ≤ 0)" if d["crossed"] else "above the cliff (Δ > 0)"
        cert = "certified by ℓ > m_ref" if d["certified"] else "not certified by ℓ"
        print(f"m_ref = {d['m_ref']:+.3f}   Δ = {d['delta']:+.3f}: {verdict}; {cert}")
    if retain is not None:
        out["overlap_epsilon"] = overlap_epsilon(
            [f"{r.question} {r.answer}" for r in records], [f"{r.question} {r.answer}" for r in retain]
        )
        print(f"forget/retain bigram overlap ε = {out['overlap_epsilon']:.3f}")
    if args.out:
        _write(args.out, out, {"command": "diagnose", **{k: str(v) for k, v in vars(args).items() if k != "func"}})
        print(f"written to {args.out}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from margincal.methods import METHODS, get_method

    families = ["gradient", "preference", "distillation"]
    specs = {key: read_yaml(CONFIG_DIR / "methods" / f"{key}.yaml") for key in METHODS}
    # the YAML holds only overrides: list the resolved hyperparameters (dataclass defaults ← YAML hparams)
    resolved = {key: get_method(cls.name, **specs[key].get("hparams", {})) for key, cls in METHODS.items()}
    ordered = sorted(METHODS, key=lambda k: (families.index(resolved[k].family), k))
    print(f"{len(METHODS)} methods (configs/methods/<name>.yaml; `margincal unlearn --method NAME`)\n")
    for key in ordered:
        cls, method, spec = METHODS[key], resolved[key], specs[key]
        paper, mini = spec["train"]["paper"], spec["train"]["mini"]
        hparams = ", ".join(f"{k}={v}" for k, v in method.hparams().items())
        print(f"{cls.name:<11} {method.family:<13} {cls.source}")
        print(f"{'':<11} hparams: {hparams}")
        mini_hp = "".join(f", {k}={v}" for k, v in mini.get("hparams", {}).items())
        print(
            f"{'':<11} paper: lr {paper['lr']}, {paper.get('epochs', '?')} epochs;  mini: lr {mini['lr']}, "
            f"{mini['steps']} steps, batch {mini['batch_size']}{mini_hp}"
        )
    return 0


def _cmd_unlearn(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from margincal.methods.base import get_method
    from margincal.stages import unlearn_stage, write_unlearned
    from margincal.store import write_meta

    check_device(args.device)
    out = _check_out(args, True, args.model, args.forget, args.retain, args.env)
    forget, retain, env = _records(args.forget), _records(args.retain), _records(args.env)
    probe = resolve_method(args.method, args.scale, len(forget), overrides=args.overrides)
    get_method(probe.name, **probe.hparams)  # unknown hyperparameters stop here
    check_free_space(out, weights_bytes(args.model))
    args.theta0 = args.model
    ws = _workspace(args, args.model, forget=forget, retain=retain, env=env)
    # resolved once, at |D_f| as trained on (a raw-text split is chunked): the schedule run is the one recorded
    run = resolve_method(args.method, args.scale, len(ws.train["forget"]), overrides=args.overrides)
    start = time.perf_counter()
    model, result = unlearn_stage(run, ws, args.seed)
    config = {"model": args.model, "scale": args.scale, "env": args.env, "run": dataclasses.asdict(run),
              "seed": args.seed}  # fmt: skip
    with publish_dir(out) as tmp:
        info = write_unlearned(tmp, model, ws.tokenizer, run, result)
        write_meta(tmp, "unlearn", None, time.perf_counter() - start, info, config)
    last = result.history[-1]
    print(f"{run.name}: {len(result.history)} steps in {result.seconds:.1f} s, final loss {last['loss']:.4f}")
    print(f"saved to {out} (model/, method.json, history.json, stage.json)")
    return 0


SUMMARY_ORDER = (
    "forget_Q_A_Prob", "forget_Q_A_ROUGE", "exact_memorization", "extraction_strength", "F_agg", "forget_truth_ratio",
    "forget_quality", "model_utility", "m", "delta", "mia_loss_auc", "mia_min_k_auc", "mia_min_k_plus_plus_auc",
    "mia_zlib_auc", "mia_gradnorm_auc", "mia_agg", "mia_advantage", "privleak", "mmlu_acc",
)  # fmt: skip


def _read_json(path: str, flag: str) -> dict:
    """A JSON result file given by ``flag``, with a clear message when it is missing or not a JSON object."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{flag} {path}: no such file") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{flag} {path} is not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{flag} {path} is not a margincal result (a JSON object expected)")
    return data


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import dataclasses
    import functools
    import time

    from margincal.config import EvalSettings
    from margincal.data.benchmarks import load_benchmark_splits
    from margincal.stages import evaluate_stage

    check_device(args.device)
    _check_out(args, False, args.model, args.data, args.reference)
    spec = _benchmark(args)
    reference = _read_json(args.reference, "--reference") if args.reference else None
    if reference is not None and reference.get("benchmark") != spec.name:
        raise ValueError(f"reference {args.reference} is a {reference.get('benchmark')!r} result, not {spec.name!r}")
    source = args.data or spec.source
    if source is None:  # the mini benchmark, generated in-process with its default settings
        from margincal.mini.data import generate

        split = generate().split
    else:
        from margincal.data.tofu import load_split

        split = functools.partial(load_split, source)
    splits = load_benchmark_splits(spec, args.tier, split)
    ws = _workspace(args, args.model, splits)
    settings = EvalSettings(batch_size=args.batch_size, generation_batch_size=args.generation_batch_size,
                            gradnorm=not args.no_gradnorm, mmlu=args.mmlu)  # fmt: skip
    start = time.perf_counter()
    result = evaluate_stage(ws.load(args.model), ws, settings, reference)
    record = {"benchmark": spec.name, "model": args.model, "tier": args.tier, "seconds": time.perf_counter() - start,
              **result}  # fmt: skip
    config = {"model": args.model, "benchmark": spec.name, "data": str(source or "mini (generated, defaults)"),
              "tier": args.tier, "reference": str(args.reference), "settings": dataclasses.asdict(settings),
              "template": dataclasses.asdict(ws.tokenizer.margincal_template), "dtype": args.dtype}  # fmt: skip
    summary = record["summary"]
    keys = [k for k in SUMMARY_ORDER if k in summary] + sorted(k for k in summary if k not in SUMMARY_ORDER)
    print(f"{record['model']} on {record['benchmark']} {record['tier']} ({record['seconds']:.1f} s)")
    for key in keys:
        value = summary[key]
        print(f"  {key:<28} {value:.4f}" if isinstance(value, float) else f"  {key:<28} {value}")
    if args.out:
        _write(args.out, record, config)
        print(f"written to {args.out}")
    return 0


def _unlearned_method(args: argparse.Namespace, n_forget: int):
    """The polished model's method: name, hyperparameters and carried state (PDU's λ) from the ``method.json`` that
    the unlearn stage saved beside it (``margincal unlearn`` or a panel's store), else the method's resolution at
    ``--scale``; a ``--method`` other than the one that unlearned the checkpoint stops."""
    from margincal.config import MethodRun
    from margincal.stages import read_unlearned

    method = read_unlearned(args.model)
    if method is None:
        return resolve_method(args.method, args.scale, n_forget), {}
    if method["name"].lower() != args.method.lower():
        raise ValueError(f"--method {args.method}: {args.model} was unlearned with {method['name']} (its method.json); "
                         f"give --method {method['name']}")  # fmt: skip
    return MethodRun(name=method["name"], hparams=method["hparams"]), method.get("state", {})


def _cmd_polish(args: argparse.Namespace) -> int:
    import dataclasses

    from margincal.bounds import coercivity_hook, trajectory_figure
    from margincal.config import EvalSettings
    from margincal.methods.base import method_class
    from margincal.polish import anchor_tables, delta_check
    from margincal.stages import polish_stage, reference_margin, write_polished
    from margincal.store import write_meta

    check_device(args.device)
    out = _check_out(args, True, args.model, args.theta0, args.ref, args.forget, args.retain, args.probe)
    method_class(args.method)  # an unknown method stops here
    mc = resolve_mc(args.variant, args.scale, overrides=args.overrides)
    if args.ref is None and (mc.margin_anchor == "ref" or args.trace):
        why = "--trace measures Δ against θ_ref" if args.trace else f"the {args.variant!r} variant anchors at θ_ref"
        raise ValueError(f"give --ref (the retain-only reference): {why}")
    forget, retain, probe = _records(args.forget), _records(args.retain), _records(args.probe)
    check_free_space(out, weights_bytes(args.model))
    ws = _workspace(args, args.model, {"forget": forget}, forget=forget, retain=retain, probe=probe)
    run, state = _unlearned_method(args, len(ws.train["forget"]))
    m_ref = None
    if args.ref is not None:
        m_ref = reference_margin(ws, EvalSettings())
    hook = None
    if args.trace:
        anchor, anchor_id = ws.anchors()[mc.margin_anchor]
        pad = ws.tokenizer.pad_token_id
        tables = anchor_tables(anchor, anchor_id, ws.train["forget"], pad)
        check = delta_check(ws.tokenizer, ws.benchmark, ws.eval_splits["forget"], m_ref,  # Δ on D_f, as evaluated
                            ws.eval_splits.get("forget_icl", ()))  # fmt: skip
        hook = coercivity_hook(tables, ws.train["forget"], ws.train["retain"], ws.train["probe"], anchor, check,
                               mc.kappa, mc.token_weights, pad)  # fmt: skip
    polished, result = polish_stage(ws.load(args.model), run, mc, ws, m_ref, state, hook)
    config = {"model": args.model, "method": dataclasses.asdict(run), "theta0": args.theta0, "ref": args.ref,
              "variant": args.variant, "mc": dataclasses.asdict(mc)}  # fmt: skip
    with publish_dir(out) as tmp:
        info = write_polished(tmp, polished, ws.tokenizer, result, state)
        if args.trace:
            trajectory_figure(result.history, tmp / "trajectory.png", f"{run.name}+MC")
            info["trajectory"] = str(out / "trajectory.png")
        write_meta(tmp, "polish", None, result.seconds, info, {**config, "seed": mc.train.seed})
    last = result.history[-1]
    print(f"MC {args.variant} polish of {args.model}: {len(result.history)} steps in {result.seconds:.1f} s")
    print(f"  final loss {last['loss']:.4f}" + (f", stopped at step {result.stopped_at}" if result.stopped_at else ""))
    if "trajectory" in info:
        print(f"  coercivity trace: {info['trajectory']}")
    print(f"saved to {out} (model/ with the merged weights, history.json, stage.json)")
    return 0


def _cmd_attack(args: argparse.Namespace) -> int:
    import dataclasses

    from margincal.bounds import LiftInstrument
    from margincal.checks import check_budgets
    from margincal.config import EvalSettings
    from margincal.stages import attack_stage, reference_margin

    check_device(args.device)
    _check_out(args, False, args.model, args.forget, args.ref, args.shots)
    try:
        budgets = [int(k) for k in args.k_sweep.split(",")] if args.k_sweep else [args.k]
    except ValueError as err:
        raise ValueError(f"--k-sweep takes comma-separated integers, e.g. 1,3,5,10,20; got {args.k_sweep!r}") from err
    cfg = resolve_attack(args.attacker, args.scale, args.overrides)
    splits = {"forget": _records(args.forget)}
    check_budgets(budgets, len(splits["forget"]), "--k-sweep" if args.k_sweep else "--k")
    if args.shots:
        splits["forget_icl"] = _records(args.shots)
    ws = _workspace(args, args.model, splits)
    settings = EvalSettings(batch_size=args.batch_size)
    net = ws.load(args.model)
    m_ref = None
    if args.ref is not None:
        m_ref = reference_margin(ws, settings)
    results, instruments = {}, {}
    for k in budgets:
        probes: list = []

        def factory(held, probes=probes):
            probes.append(LiftInstrument(net, [ws.attack_examples[i] for i in held], ws.tokenizer.pad_token_id,
                                         cfg.beta))  # fmt: skip
            return probes[-1]

        res = attack_stage(net, dataclasses.replace(cfg, k=k), ws, settings, m_ref,
                           factory if args.instrument else None)  # fmt: skip
        results[k] = res
        delta, flips = res["diagnosis"].get("delta"), res["flips"]["flipped"]
        print(f"K={k:<4} held-out ROUGE-L {res['rouge_l']:.3f}" + (f"  Δ {delta:+.2f}" if delta is not None else "")
              + f"  margin flips {flips['n']}/{len(res['heldout'])}")  # fmt: skip
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


def _positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _scale_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """``--scale`` (``--schedule``, its older name, still works): the one name across commands, default paper."""
    parser.add_argument("--scale", "--schedule", dest="scale", choices=["paper", "mini"], default="paper",
                        help=f"{what}: paper (real models, the default) or mini")  # fmt: skip


def _max_length_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--max-length", type=_positive_int, default=None, help=what)


def _out_args(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    """``--out`` and ``--overwrite``: an existing result is replaced only when asked, and only if margincal wrote it."""
    parser.add_argument("--out", required=required, help=what)
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace an existing --out that margincal wrote (anything else is never replaced)",
    )  # fmt: skip


def _device_args(parser: argparse.ArgumentParser) -> None:
    """``--dtype``, ``--device`` and ``--template`` for commands that load a model (bfloat16 and cuda on a GPU)."""
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
        help="weights dtype (default float32; bfloat16 on a GPU)",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, mps")
    parser.add_argument(
        "--template",
        default=None,
        help="prompt template: a configs/templates name (llama3, phi3, qa, mini, chat) or a YAML file; "
        "default: detected from the tokenizer (open-unlearning's formatting for the paper's models)",
    )


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
            for node in plan.nodes:
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
    import dataclasses

    from margincal.config import apply_overrides, build
    from margincal.mini.data import generate
    from margincal.mini.models import MiniModelConfig, build_mini_models, retain_split
    from margincal.store import Store, default_store

    out = check_output(args.dir, directory=True, overwrite=args.overwrite, flag="DIR")
    cfg = build(MiniModelConfig, apply_overrides({}, args.overrides), "mini")
    retain = retain_split(args.tier)
    bench = generate(cfg.data)
    if args.tier not in bench.splits:
        raise ValueError(f"the mini benchmark has no tier {args.tier!r}; it has forget01, forget05 and forget10")
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
    print(f"  margincal unlearn --method NPO --model {paths.theta0} --forget {forget} --retain {retain_file} "
          "--scale mini --out runs/npo")  # fmt: skip
    print(f"  margincal polish --model runs/npo --method NPO --theta0 {paths.theta0} --ref {paths.ref} "
          f"--forget {forget} --retain {retain_file} --probe {out / 'probe.json'} --out runs/npo_mc")  # fmt: skip
    print(f"  margincal attack --model runs/npo_mc --forget {forget} --ref {paths.ref} --scale mini "
          "--k-sweep 1,3,5,10,20")  # fmt: skip
    print(f"  margincal evaluate --model runs/npo_mc --benchmark mini --data {out} --out npo_mc.json")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from margincal.report.panel import write_report

    path = write_report(args.results, args.out)
    print(f"report written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="margincal",
        description="Relearn-robust LLM unlearning: margin-cliff diagnostics and Margin Calibration (MC).",
        epilog=EPILOG,
    )
    from margincal import __version__

    parser.add_argument("--version", action="version", version=f"margincal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the whole pipeline on the built-in mini benchmark and write a report",
        description=(
            "Run the shipped demo panel (configs/panels/demo.yaml): build (or reuse) the mini benchmark's θ0 and "
            "θ_ref, unlearn with GradDiff and NPO, diagnose the margin cliff, polish each with MC, attack every model "
            "with K20-LoRA, evaluate everything, and write the panel report (report.md with the cliff figure and "
            "example generations) to runs/demo. Any panel key can be overridden."
        ),
        epilog="Overrides: seeds=[1] out=runs/seed1 mc.kappa=2.0 methods='[GradDiff, NPO, SimNPO]' mini.data.seed=1",
    )
    demo.add_argument("--config", help=f"panel YAML (default: {CONFIG_DIR / 'panels' / 'demo.yaml'})")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    demo.set_defaults(func=_cmd_demo)

    unl = sub.add_parser(
        "unlearn",
        help="unlearn a checkpoint with a registered method on TOFU-format forget/retain files",
        description=(
            "Apply a registered unlearning method (see `margincal methods`) to a checkpoint (HF id or directory) "
            "with its paper-scale or mini schedule from configs/methods/<method>.yaml, and save the unlearned "
            "model and its records to --out: model/ (safetensors), method.json (name, hyperparameters, the state "
            "the MC polish continues from), history.json (loss trace) and stage.json (config, manifest): the layout "
            "of a panel store's unlearn stage, so either can be polished."
        ),
        epilog="Overrides: hparams.beta=0.2 train.lr=2e-5 train.steps=100 retain_batch_size=8",
    )
    unl.add_argument("--method", required=True, help="a registered method (margincal methods), e.g. NPO")
    unl.add_argument("--model", required=True, help="θ0: HF id or local directory")
    unl.add_argument("--forget", required=True, help="forget split (TOFU-format JSON / JSON-lines)")
    unl.add_argument("--retain", required=True, help="retain split (TOFU-format JSON / JSON-lines)")
    _out_args(unl, "output directory for the unlearned model (new or empty)", required=True)
    unl.add_argument(
        "--env", help="auxiliary fine-tuning split (TOFU-format) for methods that read one: ILUNPO's environment"
    )
    _scale_arg(unl, "training schedule of configs/methods/<method>.yaml: paper (real models) or mini")
    _max_length_arg(unl, "max tokens per example (default 512, TOFU's; capped at the model's context)")
    _device_args(unl)
    unl.add_argument("--seed", type=int, default=0, help="seed of the data order and of any sampling (default 0)")
    unl.add_argument("overrides", nargs="*", metavar="key=value")
    unl.set_defaults(func=_cmd_unlearn)

    methods = sub.add_parser(
        "methods",
        help="list the registered unlearning methods with family, source and default hyperparameters",
        description="List every method in the registry with its family, source and configs/methods/*.yaml defaults.",
    )
    methods.set_defaults(func=_cmd_methods)

    pol = sub.add_parser(
        "polish",
        help="MC-polish an unlearned checkpoint (reference-anchored, deployment or an ablation variant)",
        description=(
            "Margin Calibration: a short LoRA polish of an unlearned checkpoint that keeps the base method's own "
            "loss running and adds the margin hinge (anchored at θ_ref's per-token margins, or θ0's for the "
            "deployment variant) and the KL probe. Saves the merged model (model/, safetensors), history.json and "
            "stage.json."
        ),
        epilog="Overrides of configs/mc.yaml: kappa=2 kl_weight=0.2 train.steps=40 token_weights=ref_gate ...",
    )
    pol.add_argument("--model", required=True, help="the unlearned checkpoint θ̂ (HF id or directory)")
    pol.add_argument("--method", required=True, help="its unlearning method (native loss kept running)")
    pol.add_argument(
        "--theta0", required=True, help="the pre-unlearning model θ0 (method reference; deployment anchor)"
    )
    pol.add_argument("--ref", help="the retain-only reference θ_ref (reference anchor; gives Δ)")
    pol.add_argument("--forget", required=True, help="forget split (TOFU-format file)")
    pol.add_argument("--retain", required=True, help="retain split (TOFU-format file)")
    pol.add_argument("--probe", required=True, help="probe corpus for the KL term (TOFU-format file, e.g. Alpaca)")
    _out_args(pol, "output directory for the polished model (new or empty)", required=True)
    pol.add_argument("--variant", default="reference", help="reference | deployment | two_sided | forget_only | ...")
    pol.add_argument("--trace", action="store_true", help="log the coercivity trace and draw trajectory.png")
    _scale_arg(pol, "configs/mc.yaml's scale section (mini: its mini learning rate) and the method's "
               "hyperparameters when --model has no method.json (written by margincal unlearn or a panel)")
    _max_length_arg(pol, "max tokens per example (default 512, TOFU's; capped at the model's context)")
    _device_args(pol)
    pol.add_argument("overrides", nargs="*", metavar="key=value")
    pol.set_defaults(func=_cmd_polish)

    att = sub.add_parser(
        "attack",
        help="relearn-attack a checkpoint (LoRA, FPFT, soft prompt, adaptive, linear probe) and score the held-out set",
        description=(
            "Train an attacker (configs/attacks.yaml preset) on a seeded D_rel of K forget samples and report "
            "held-out forget ROUGE-L, Δ (with --ref) and margin flips; --k-sweep runs several budgets on the one "
            "loaded model; --instrument records Theorem 3's constants along the attack."
        ),
        epilog="Overrides: train.lr=2e-4 train.steps=40 train.lora.r=16 n_soft=50",
    )
    att.add_argument("--model", required=True, help="checkpoint to attack (HF id or directory)")
    att.add_argument("--forget", required=True, help="forget split (TOFU-format file)")
    att.add_argument("--attacker", default="lora_r8", help="preset: lora_r8, lora_r32, fpft, soft_prompt_20, ...")
    att.add_argument("--k", type=_positive_int, default=20, help="relearn budget K, below |D_f| (default 20)")
    _scale_arg(att, "the attacker preset's learning rates")
    att.add_argument("--k-sweep", help="comma-separated budgets, e.g. 1,3,5,10,20,50,100")
    att.add_argument("--ref", help="θ_ref, for Δ before and after the attack")
    att.add_argument("--instrument", action="store_true", help="Theorem 3 instrumentation (step norms, ∇m_β, Λ̂)")
    _out_args(att, "output JSON file")
    att.add_argument(
        "--benchmark", default="tofu",
        help="evaluation protocol of the held-out set: tofu (ROUGE-L recall, mean m) or muse-news (few-shot with "
        "--shots, stop strings, ROUGE-L F1, median m); default tofu",
    )  # fmt: skip
    att.add_argument("--shots", help="few-shot QA pairs placed before each question (muse-news: knowmem forget_qa_icl)")
    _max_length_arg(att, "max prompt+answer tokens (default: benchmark's)")
    att.add_argument("--max-new-tokens", type=_positive_int, default=None,
                     help="greedy answer length (default: benchmark's)")  # fmt: skip
    att.add_argument("--batch-size", type=_positive_int, default=32, help="evaluation batch size (default 32)")
    _device_args(att)
    att.add_argument("overrides", nargs="*", metavar="key=value")
    att.set_defaults(func=_cmd_attack)

    ev = sub.add_parser(
        "evaluate",
        help="TOFU/MUSE metrics, five MIA AUCs, the margin diagnostic and MMLU of one checkpoint",
        description=(
            "Evaluate a checkpoint (HF id or directory) on a benchmark (configs/benchmarks/<name>.yaml: tofu, "
            "muse-news, mini) and write one JSON with a manifest. Evaluate θ_ref first and pass its JSON as "
            "--reference to the others (forget_quality, privleak and Δ reuse it)."
        ),
    )
    ev.add_argument("--model", required=True, help="checkpoint: HF id or local directory")
    ev.add_argument("--benchmark", default="tofu", help="tofu | muse-news | mini (default tofu)")
    ev.add_argument("--data", help="local directory (hub layout) or HF dataset id replacing the benchmark's source")
    ev.add_argument("--tier", default="forget10", help="forget01 | forget05 | forget10")
    ev.add_argument("--reference", help="θ_ref's evaluate JSON on the same benchmark and tier")
    _out_args(ev, "output JSON file")
    ev.add_argument(
        "--no-gradnorm", action="store_true", help="skip the per-sample gradient-norm MIA (one backward each)"
    )
    ev.add_argument(
        "--mmlu", choices=["mmlu", "local"], help="also run MMLU through lm-eval (mmlu: hub; local: offline set)"
    )
    ev.add_argument("--batch-size", type=_positive_int, default=32, help="scoring and gradnorm batch size (default 32)")
    ev.add_argument("--generation-batch-size", type=_positive_int, default=128,
                    help="greedy decoding batch size (default 128; halved on a CUDA out-of-memory error)")  # fmt: skip
    _device_args(ev)
    ev.set_defaults(func=_cmd_evaluate)

    diag = sub.add_parser(
        "diagnose",
        help="margin-cliff diagnostic of a checkpoint on a TOFU-format forget split",
        description=(
            "Score a checkpoint (HF id or local directory) on a forget split in one batched pass and report the "
            "margin diagnostic m(D_f) at each answer's max-entropy position and the log-odds level ℓ; with --ref, "
            "the cliff gap Δ = m − m_ref and the Theorem 1 certificate ℓ > m_ref; with --retain, the overlap ε."
        ),
    )
    diag.add_argument("--model", required=True, help="checkpoint to diagnose (HF id or directory)")
    diag.add_argument("--forget", required=True, help="forget split: TOFU-format JSON / JSON-lines file")
    diag.add_argument("--ref", help="retain-only reference checkpoint (gives Δ and the certificate)")
    diag.add_argument("--retain", help="retain split file (gives the overlap ε)")
    diag.add_argument(
        "--aggregate", choices=["mean", "median"], help="mean (TOFU) or median (MUSE); default: the benchmark's"
    )
    diag.add_argument("--benchmark", help="tofu (default) or muse-news: the scoring protocol and aggregate of m")
    _max_length_arg(diag, "max prompt+answer tokens (default: benchmark's)")
    diag.add_argument("--batch-size", type=_positive_int, default=16, help="scoring batch size (default 16)")
    _device_args(diag)
    _out_args(diag, "write the full result (per-sample margins included) to this JSON file")
    diag.set_defaults(func=_cmd_diagnose)

    pan = sub.add_parser(
        "panel",
        help="run a panel of (benchmark, model, tier, method, seed, MC variant) cells, resumably",
        description=(
            "Run every cell of a panel YAML (a path, or the name of a file in configs/panels) through unlearn → "
            "evaluate (margin diagnostic included) → MC polish → evaluate → relearn attacks, locally or on Ray "
            "(executor=ray). Every stage is cached in the store under a hash of its config and inputs, so a rerun "
            "(after a crash or kill) skips finished stages and stages shared by cells run once. Cell records go to "
            "<out>/cells/, a summary to <out>/panel.json."
        ),
        epilog="Overrides: seeds='[0,1,2]' executor=ray ray.num_cpus=2 store=runs/store out=runs/panels/x",
    )
    pan.add_argument("panel", help="panel YAML, e.g. configs/panels/mini-head2head.yaml or mini-head2head")
    pan.add_argument("--dry-run", action="store_true", help="list the cells and which stages are already cached")
    pan.add_argument("overrides", nargs="*", metavar="key=value", help="panel config overrides")
    pan.set_defaults(func=_cmd_panel)

    mini = sub.add_parser(
        "mini",
        help="the built-in mini benchmark: export its models and split files",
        description="Tools for the built-in mini benchmark (generated fictitious authors, a tiny Llama).",
    )
    mini_sub = mini.add_subparsers(dest="mini_command", metavar="SUBCOMMAND", required=True)
    exp = mini_sub.add_parser(
        "export",
        help="build the mini models if needed, write the mini splits (TOFU format) to DIR and print the model paths",
        description=(
            "Build (or reuse, from the store) the mini θ0 and the retain-only θ_ref of --tier, write every mini split "
            "as TOFU-format JSON to DIR (forget10.json, retain90.json, holdout.json, probe.json, ...) and print the "
            "model directories with the single-stage commands that run on them."
        ),
        epilog="Overrides of the mini settings: data.n_authors=100 arch.hidden_size=64 finetune.steps=300",
    )
    exp.add_argument("dir", metavar="DIR", help="output directory for the split files (new or empty)")
    exp.add_argument("--tier", default="forget10", help="forget01 | forget05 | forget10 (default forget10)")
    exp.add_argument("--store", help="store of the mini models (default $MARGINCAL_STORE or runs/store)")
    exp.add_argument(
        "--overwrite", action="store_true", help="replace an existing DIR that margincal mini export wrote"
    )
    exp.add_argument("overrides", nargs="*", metavar="key=value", help="mini settings (MiniModelConfig) overrides")
    exp.set_defaults(func=_cmd_mini_export)

    rep = sub.add_parser(
        "report",
        help="write the paper's tables and figures (Markdown, CSV, PNG) from a panel's results",
        description=(
            "Read <results>/cells/*.json (written by `margincal panel`) and write report.md, one CSV per table "
            "(T1 head-to-head, T2 cross-axis wins with Clopper-Pearson CIs, T3 ablations, K-sweep, MIA detectors) "
            "and the cliff, K-curve, bridge and Pareto figures. Every number names the cell JSON it came from."
        ),
    )
    rep.add_argument("results", help="a panel's results directory (holding cells/)")
    rep.add_argument("--out", help="output directory (default: the results directory; cells/ is copied along)")
    rep.set_defaults(func=_cmd_report)
    return parser


def _quiet_libraries() -> None:
    """Keep the terminal for margincal's own progress (INFO lines of the ``margincal`` loggers) and hide
    per-file HF progress bars, absl INFO lines and a known transformers deprecation warning."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    logging.getLogger("absl").setLevel(logging.WARNING)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("         %(message)s"))
    root = logging.getLogger("margincal")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run a command. Bad inputs (ValueError, a missing file, a non-finite loss) end with one line and exit 2; any
    other error (CUDA out of memory, a bug) keeps its full traceback."""
    _quiet_libraries()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # key=value overrides may follow an option (`panel demo --dry-run seeds=[1]`)
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"margincal {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, NonFiniteLossError) as err:  # bad inputs: one clear line
        print(f"margincal {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
