"""Command-line interface: ``margincal <command> [--config FILE] [key=value ...]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from margincal.config import CONFIG_DIR, apply_overrides, build, deep_merge, read_yaml

EPILOG = "Overrides use dotted keys, e.g. `seed=1 out_dir=runs/seed1 mc.kappa=2.0 attack.k=10`."


def load_demo_config(path: str | Path | None, overrides: list[str]):
    """mc.yaml (frozen MC) ← demo YAML ← key=value overrides → DemoConfig."""
    from margincal.pipeline.demo import DemoConfig

    data = {"mc": read_yaml(CONFIG_DIR / "mc.yaml")}
    data = deep_merge(data, read_yaml(path or CONFIG_DIR / "demo.yaml"))
    return build(DemoConfig, apply_overrides(data, overrides))


def _cmd_demo(args: argparse.Namespace) -> int:
    from margincal.pipeline.demo import run_demo

    cfg = load_demo_config(args.config, args.overrides)
    report = run_demo(cfg)
    print(f"\nReport: {report.resolve()}")
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from margincal.diagnose import diagnose_checkpoint
    from margincal.pipeline.store import atomic_write_json

    result = diagnose_checkpoint(
        args.model,
        args.forget,
        args.ref,
        args.retain,
        args.aggregate,
        args.max_length,
        args.batch_size,
        args.dtype,
        args.device,
        args.template,
    )
    d = result["diagnosis"]
    print(f"m(D_f) = {d['m']:+.3f}   ℓ = {d['log_odds']:+.3f}   (n = {d['n']}, {args.aggregate})")
    if d["m_ref"] is not None:
        verdict = "crossed (Δ ≤ 0)" if d["crossed"] else "above the cliff (Δ > 0)"
        cert = "certified by ℓ > m_ref" if d["certified"] else "not certified by ℓ"
        print(f"m_ref = {d['m_ref']:+.3f}   Δ = {d['delta']:+.3f}: {verdict}; {cert}")
    if "overlap_epsilon" in result:
        print(f"forget/retain bigram overlap ε = {result['overlap_epsilon']:.3f}")
    if args.out:
        atomic_write_json(args.out, result)
        print(f"written to {args.out}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from margincal.methods import METHODS

    families = ["gradient", "preference", "distillation"]
    ordered = sorted(METHODS, key=lambda k: (families.index(METHODS[k].family), k))
    print(f"{len(METHODS)} methods (configs/methods/<name>.yaml; `margincal unlearn --method NAME`)\n")
    for key in ordered:
        cls = METHODS[key]
        spec = read_yaml(CONFIG_DIR / "methods" / f"{key}.yaml")
        paper, mini = spec["train"]["paper"], spec["train"]["mini"]
        hparams = ", ".join(f"{k}={v}" for k, v in spec.get("hparams", {}).items())
        print(f"{cls.name:<11} {cls.family:<13} {cls.source}")
        print(f"{'':<11} hparams: {hparams}")
        mini_hp = "".join(f", {k}={v}" for k, v in mini.get("hparams", {}).items())
        print(
            f"{'':<11} paper: lr {paper['lr']}, {paper.get('epochs', '?')} epochs;  mini: lr {mini['lr']}, "
            f"{mini['steps']} steps, batch {mini['batch_size']}{mini_hp}"
        )
    return 0


def _cmd_unlearn(args: argparse.Namespace) -> int:
    from margincal.unlearn import unlearn_checkpoint

    record = unlearn_checkpoint(
        args.method,
        args.model,
        args.forget,
        args.retain,
        args.out,
        args.schedule,
        args.overrides,
        args.max_length,
        args.dtype,
        args.device,
        args.seed,
        args.env,
        args.template,
    )
    last = record["history"][-1]
    print(f"{args.method}: {len(record['history'])} steps in {record['seconds']:.1f} s, final loss {last['loss']:.4f}")
    print(f"saved to {args.out} (safetensors + unlearn.json)")
    return 0


SUMMARY_ORDER = (
    "forget_Q_A_Prob", "forget_Q_A_ROUGE", "exact_memorization", "extraction_strength", "F_agg", "forget_truth_ratio",
    "forget_quality", "model_utility", "m", "delta", "mia_loss_auc", "mia_min_k_auc", "mia_min_k_plus_plus_auc",
    "mia_zlib_auc", "mia_gradnorm_auc", "mia_agg", "mia_advantage", "privleak", "mmlu_acc",
)  # fmt: skip


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from margincal.evaluate import evaluate_checkpoint

    record = evaluate_checkpoint(
        args.model, args.benchmark, args.data, args.tier, args.reference, args.out, not args.no_gradnorm,
        args.mmlu, args.batch_size, args.dtype, args.device, args.template,
    )  # fmt: skip
    summary = record["summary"]
    keys = [k for k in SUMMARY_ORDER if k in summary] + sorted(k for k in summary if k not in SUMMARY_ORDER)
    print(f"{record['model']} on {record['benchmark']} {record['tier']} ({record['seconds']:.1f} s)")
    for key in keys:
        value = summary[key]
        print(f"  {key:<28} {value:.4f}" if isinstance(value, float) else f"  {key:<28} {value}")
    if args.out:
        print(f"written to {args.out}")
    return 0


def _cmd_polish(args: argparse.Namespace) -> int:
    from margincal.polish import polish_checkpoint

    record = polish_checkpoint(
        args.model, args.method, args.theta0, args.forget, args.retain, args.probe, args.out, args.ref,
        args.variant, args.overrides, args.trace, args.max_length, args.dtype, args.device, args.template,
    )  # fmt: skip
    last = record["history"][-1]
    print(f"MC {args.variant} polish of {args.model}: {len(record['history'])} steps in {record['seconds']:.1f} s")
    print(
        f"  final loss {last['loss']:.4f}"
        + (f", stopped at step {record['stopped_at']}" if record["stopped_at"] else "")
    )
    if "trajectory" in record:
        print(f"  coercivity trace: {record['trajectory']}")
    print(f"saved to {args.out} (safetensors + polish.json)")
    return 0


def _cmd_attack(args: argparse.Namespace) -> int:
    from margincal.attacks import attack_checkpoint
    from margincal.pipeline.store import atomic_write_json, manifest

    budgets = [int(k) for k in args.k_sweep.split(",")] if args.k_sweep else [args.k]
    record = attack_checkpoint(
        args.model, args.forget, args.attacker, budgets, args.scale, args.ref, args.instrument, args.overrides,
        args.max_length, args.max_new_tokens, args.dtype, args.device, args.template,
    )  # fmt: skip
    for k, res in record["results"].items():
        delta = res["diagnosis"].get("delta")
        flips = res["flips"]["flipped"]
        print(
            f"K={k:<4} held-out ROUGE-L {res['rouge_l']:.3f}"
            + (f"  Δ {delta:+.2f}" if delta is not None else "")
            + f"  margin flips {flips['n']}/{len(res['heldout'])}"
        )
        if k in record["theorem3"]:
            t3 = record["theorem3"][k]["summary"]
            print(f"       Theorem 3: lift {t3['lift']:+.3f} ≤ Λ̂(N) {t3['Lambda_hat']:.3f}: {t3['bound_holds']}")
    if args.out:
        config = {"model": args.model, "attack": record.pop("config")}
        atomic_write_json(args.out, {**record, "manifest": manifest(config, 0)})
        print(f"written to {args.out}")
    return 0


def _device_args(parser: argparse.ArgumentParser) -> None:
    """``--dtype``, ``--device`` and ``--template`` for commands that load a model (bfloat16 and cuda on a GPU)."""
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
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
            print(f"  {row['id']}: {cached}/{len(row['stages'])} stages cached; {todo}")
        return 0
    summary = run_panel(cfg)
    counts = summary["counts"]
    print(f"\npanel {cfg.name}: {counts['done']} cells done, {counts['failed']} failed in {summary['seconds']:.0f}s")
    for row in summary["cells"]:
        if row["status"] == "failed":
            print(f"  FAILED {row['id']}: {row['error']}")
    print(f"results: {cfg.out_dir}  (report: margincal report {cfg.out_dir})")
    return 1 if counts["failed"] else 0


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
            "Build (or reuse from the cache) the mini benchmark's θ0 and θ_ref, unlearn with GradDiff and NPO, "
            "diagnose the margin cliff, polish each with MC, attack base and MC with K20-LoRA, and write "
            "results.json, cliff.png and report.md to out_dir."
        ),
        epilog=EPILOG,
    )
    demo.add_argument("--config", help=f"demo YAML (default: {CONFIG_DIR / 'demo.yaml'})")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    demo.set_defaults(func=_cmd_demo)

    unl = sub.add_parser(
        "unlearn",
        help="unlearn a checkpoint with a registered method on TOFU-format forget/retain files",
        description=(
            "Apply a registered unlearning method (see `margincal methods`) to a checkpoint (HF id or directory) "
            "with its paper-scale or mini schedule from configs/methods/<method>.yaml, and save the unlearned "
            "model (safetensors) and unlearn.json (config, loss trace, manifest) to --out."
        ),
        epilog="Overrides: hparams.beta=0.2 train.lr=2e-5 train.steps=100 retain_batch_size=8",
    )
    unl.add_argument("--method", required=True)
    unl.add_argument("--model", required=True, help="θ0: HF id or local directory")
    unl.add_argument("--forget", required=True, help="forget split (TOFU-format JSON / JSON-lines)")
    unl.add_argument("--retain", required=True, help="retain split (TOFU-format JSON / JSON-lines)")
    unl.add_argument("--out", required=True, help="output directory for the unlearned model")
    unl.add_argument(
        "--env", help="auxiliary fine-tuning split (TOFU-format) for methods that read one: ILUNPO's environment"
    )
    unl.add_argument("--schedule", choices=["paper", "mini"], default="paper")
    unl.add_argument("--max-length", type=int, default=512)
    _device_args(unl)
    unl.add_argument("--seed", type=int, default=0)
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
            "deployment variant) and the KL probe. Saves the merged model (safetensors) and polish.json."
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
    pol.add_argument("--out", required=True, help="output directory")
    pol.add_argument("--variant", default="reference", help="reference | deployment | two_sided | forget_only | ...")
    pol.add_argument("--trace", action="store_true", help="log the coercivity trace and draw trajectory.png")
    pol.add_argument("--max-length", type=int, default=512)
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
    att.add_argument("--k", type=int, default=20, help="relearn budget K (default 20)")
    att.add_argument(
        "--scale", choices=["paper", "mini"], default="paper", help="preset learning rates (default paper)"
    )
    att.add_argument("--k-sweep", help="comma-separated budgets, e.g. 1,3,5,10,20,50,100")
    att.add_argument("--ref", help="θ_ref, for Δ before and after the attack")
    att.add_argument("--instrument", action="store_true", help="Theorem 3 instrumentation (step norms, ∇m_β, Λ̂)")
    att.add_argument("--out", help="output JSON")
    att.add_argument("--max-length", type=int, default=512)
    att.add_argument("--max-new-tokens", type=int, default=200)
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
    ev.add_argument("--out", help="output JSON path")
    ev.add_argument(
        "--no-gradnorm", action="store_true", help="skip the per-sample gradient-norm MIA (one backward each)"
    )
    ev.add_argument(
        "--mmlu", choices=["mmlu", "local"], help="also run MMLU through lm-eval (mmlu: hub; local: offline set)"
    )
    ev.add_argument("--batch-size", type=int, default=32)
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
    diag.add_argument("--aggregate", choices=["mean", "median"], default="mean", help="mean (TOFU) or median (MUSE)")
    diag.add_argument("--max-length", type=int, default=512, help="max prompt+answer tokens (default 512)")
    diag.add_argument("--batch-size", type=int, default=16)
    _device_args(diag)
    diag.add_argument("--out", help="write the full result (per-sample margins included) to this JSON file")
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
    _quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"margincal {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
