"""The bodies of the ``margincal`` commands: each takes the parsed arguments, calls one function of the library
(:mod:`margincal.api`, which checks every input before the first forward pass), prints what it returned and returns
the exit code. Argument parsing lives in :mod:`margincal.cli.parsers`."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from margincal.config.settings import EvalSettings
from margincal.config.typed import given
from margincal.core.artifacts import check_output
from margincal.core.errors import InputError
from margincal.core.terminal import say
from margincal.results.base import Result  # the results a command prints: torch-free (layer 2), so --help stays light
from margincal.results.metric_table import summary_order
from margincal.results.outputs import Trained

T = TypeVar("T")


def _cmd_demo(args: argparse.Namespace) -> int:
    """The demo is the shipped panel ``configs/panels/demo.yaml`` plus its report."""
    from margincal.api import run_panel  # lazy: help

    say("margincal demo: the mini benchmark's panel on its shipped mini models (timings: benchmarks/RESULTS.md)")
    result = run_panel(args.config or "demo", args.overrides, report=True)
    _print_failed(result.failed)
    say(f"\nReport: {result.report}")
    return 1 if result.failed else 0


def _print_failed(failed: list[dict]) -> None:
    """One line for each failed cell of a panel run: its id and error."""
    for row in failed:
        say(f"  FAILED {row['id']}: {row['error']}")


def _check_out(args: argparse.Namespace, directory: bool, *inputs: str | None) -> Path | None:
    """``--out`` checked before any compute (:func:`margincal.core.artifacts.check_output`); None when not given."""
    from margincal.api.common import local_paths  # lazy: help

    if getattr(args, "out", None) is None:
        return None
    return check_output(args.out, directory=directory, overwrite=args.overwrite, inputs=local_paths(*inputs))


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from margincal.api import diagnose  # lazy: help

    _check_out(args, False, args.model, args.forget, args.ref, args.retain)
    d = _call(diagnose, args)
    say(f"m(D_f) = {d.m:+.3f}   ℓ = {d.log_odds:+.3f}   (n = {d.n}, {d.aggregate})")
    if d.m_ref is not None:
        say(f"m_ref = {d.m_ref:+.3f}   Δ = {d.delta:+.3f}: {d.label}")
    if d.overlap_epsilon is not None:
        say(f"forget/retain bigram overlap ε = {d.overlap_epsilon:.3f}")
    _save(args, d, {"command": "diagnose", **{k: str(v) for k, v in vars(args).items() if k != "func"}})
    return 0


def _cmd_anchors(args: argparse.Namespace) -> int:
    from margincal.api import anchors  # lazy: help

    table = _call(anchors, args)
    say(
        f"anchor table of {table.tokens.size(0)} forget records ({table.tokens.size(1)} answer tokens at most, "
        f"template {table.meta['template']!r}, tokenizer {table.meta['tokenizer_digest']}) written to {args.out}"
    )
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from margincal.cli.show import methods_table  # lazy: help

    say(methods_table())
    return 0


def _cmd_unlearn(args: argparse.Namespace) -> int:
    from margincal.api import unlearn  # lazy: help

    u = _call(unlearn, args)
    say(f"{u.method}: {u.steps} steps {_when(u)}, final loss {u.final_loss:.4f}")
    if u.selected is not None:
        say(f"  released the step selected by {args.select}: {u.selected} (trace.json, trace.png)")
    monitored = ", trace.json" if u.selected is not None or args.select != "last" else ""
    say(f"saved to {u.out} (model/, method.json, history.json, stage.json{monitored})")
    return 0


def _call(function: Callable[..., T], args: argparse.Namespace, **more: object) -> T:
    """``function`` of the library called with every parsed flag that bears the name of one of its parameters (a
    flag's destination is the keyword it sets, its default the keyword's: ``tests/house/test_options.py``), and
    ``more`` on top (what a command's flags make together: the evaluation settings, several budgets)."""
    parameters = inspect.signature(function).parameters
    return function(**{**{k: v for k, v in vars(args).items() if k in parameters}, **more})


def _when(result: Trained) -> str:
    """How a trained result came: read back from the store, or trained in so many seconds."""
    return "read from the store" if result.cached else f"in {result.seconds:.1f} s"


def _eval_settings(args: argparse.Namespace, **more: object) -> EvalSettings:
    """The evaluation settings of ``--batch-size``, ``--generation-batch-size`` and ``more`` (None: the default)."""
    return given(EvalSettings, batch_size=args.batch_size, generation_batch_size=args.generation_batch_size, **more)


def _save(args: argparse.Namespace, result: Result, config: dict) -> None:
    """With ``--out``, ``result`` saved there with ``config`` (replacing one only with ``--overwrite``), and said."""
    if args.out:
        result.save(args.out, config, overwrite=args.overwrite)
        say(f"written to {args.out}")


def _command_line() -> str:
    """The command line as typed, shell-quoted (what an audit or a population records)."""
    return "margincal " + shlex.join(sys.argv[1:])


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from margincal.api import evaluate  # lazy: help

    _check_out(args, False, args.model, args.data, args.reference)
    settings = _eval_settings(args, gradnorm=not args.no_gradnorm, mmlu=args.mmlu)
    e = _call(evaluate, args, settings=settings)
    say(f"{e.model} on {e.benchmark} {e.tier} ({'read from the store' if e.cached else f'{e.seconds:.1f} s'})")
    for key in summary_order(e.summary):  # the metric table's headline metrics first
        value = e.summary[key]
        say(f"  {key:<28} {value:.4f}" if isinstance(value, float) else f"  {key:<28} {value}")
    config = {"model": args.model, "data": str(args.data), "reference": str(args.reference), "dtype": args.dtype}
    _save(args, e, {**config, "settings": dataclasses.asdict(settings)})
    return 0


def _cmd_polish(args: argparse.Namespace) -> int:
    from margincal.api import polish  # lazy: help

    p = _call(polish, args, log=say)
    say(f"MC {args.variant} polish of {args.model}: {p.steps} steps {_when(p)}")
    say(f"  final loss {p.final_loss:.4f}" + (f", stopped at step {p.stopped_at}" if p.stopped_at else ""))
    if args.trace:
        say(f"  coercivity trace: {Path(p.out) / 'trajectory.png'}")
    if (Path(p.out) / "trace.json").is_file():
        chosen = f", released step {p.selected}" if p.selected is not None else ""
        say(f"  monitors: passes{chosen} (trace.json, trace.png)")
    say(f"saved to {p.out} (model/ with the merged weights, history.json, stage.json)")
    return 0


def _cmd_attack(args: argparse.Namespace) -> int:
    from margincal.api import attack  # lazy: help

    _check_out(args, False, args.model, args.forget, args.ref, args.shots)
    try:
        sweep = [int(k) for k in args.k_sweep.split(",")] if args.k_sweep else None
    except ValueError as err:
        raise InputError(f"--k-sweep takes comma-separated integers, e.g. 1,3,5,10,20; got {args.k_sweep!r}") from err
    a = _call(attack, args, k=sweep or args.k, settings=_eval_settings(args))
    if a.cached:
        say("(every attack read from the store)")
    for k, res in a.results.items():
        delta, flips = res["diagnosis"].get("delta"), res["flips"]["flipped"]
        shown = f"  Δ {delta:+.2f}" if delta is not None else ""
        say(f"K={k:<4} held-out ROUGE-L {res['rouge_l']:.3f}{shown}  margin flips {flips['n']}/{len(res['heldout'])}")
        if k in a.theorem3:
            t3 = a.theorem3[k]["summary"]
            say(f"       Theorem 3: lift {t3['lift']:+.3f} ≤ Λ̂(N) {t3['Lambda_hat']:.3f}: {t3['bound_holds']}")
    _save(args, a, {"command": "attack", "model": args.model, "attacker": args.attacker})
    return 0


def _cmd_panel(args: argparse.Namespace) -> int:
    from margincal import api  # lazy: help
    from margincal.pipeline.panel import load_panel  # lazy: help

    if args.dry_run:  # the plan, read from the store: nothing runs
        from margincal.cli.show import dry_run_table  # lazy: help

        say(dry_run_table(load_panel(args.panel, args.overrides)))
        return 0
    result = api.run_panel(args.panel, args.overrides)
    counts = result.counts
    say(f"\npanel {result.name}: {counts['done']} cells done, {counts['failed']} failed in {result.seconds:.0f}s")
    _print_failed(result.failed)
    say(f"results: {result.out}  (report: margincal report {result.out})")
    return 1 if result.failed else 0


def _cmd_mini_export(args: argparse.Namespace) -> int:
    """Build (or reuse) the mini models of a tier, write the mini splits as TOFU-format files, print the paths."""
    from margincal.api import mini_export  # lazy: help

    e = _call(mini_export, args)
    out, forget, retain = Path(e.dir), Path(e.dir) / f"{e.tier}.json", Path(e.dir) / f"{e.retain}.json"
    say(f"θ0     {e.theta0}\nθ_ref  {e.ref}  (retain-only reference of {e.tier})")
    say(f"splits {out}: {', '.join(f'{n}.json' for n in e.splits)}\n")
    say("The single-stage commands on the mini (docs/guides/mini-commands.md: schedules, learning rates, context):")
    say(f"  margincal diagnose --model {e.theta0} --ref {e.ref} --forget {forget} --retain {retain}")
    say(
        f"  margincal unlearn --method NPO --model {e.theta0} --forget {forget} --retain {retain} --scale mini "
        "--out runs/npo"
    )
    say(
        f"  margincal polish --model runs/npo --method NPO --theta0 {e.theta0} --ref {e.ref} "
        f"--forget {forget} --retain {retain} --probe {out / 'probe.json'} --out runs/npo_mc"
    )
    say(f"  margincal attack --model runs/npo_mc --forget {forget} --ref {e.ref} --scale mini --k-sweep 1,3,5,10,20")
    say(f"  margincal evaluate --model runs/npo_mc --benchmark mini --data {out} --out npo_mc.json")
    return 0


def _cmd_population(args: argparse.Namespace) -> int:
    from margincal.api import population  # lazy: help

    pop = _call(population, args, command=_command_line())
    say(f"population of {pop['n_checkpoints']} checkpoints written to {args.out}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from margincal.api import report  # lazy: help

    say(f"report written to {_call(report, args)}")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from margincal.api import audit  # lazy: help

    settings = _eval_settings(args, mmlu=args.mmlu)
    card = _call(audit, args, models=args.model, settings=settings, command=_command_line(), log=say)
    for name in card.checkpoints:
        value, delta = card.recovered(name), card.delta(name)
        shown_delta = "—" if delta is None else f"{delta:+.3f}"
        shown = "—" if value is None else f"{value:.2f}" + (" (below the floor)" if value < 0 else "")
        say(f"  {name}: Δ {shown_delta}, {card.headline} recovered {shown}")
    say(f"card: {Path(card.out) / 'card.md'}")
    return 0
