"""Argument parsing of the ``margincal`` commands: one ``add_<command>(sub)`` per command, registered in
:data:`COMMANDS`, and the argument helpers they share. The command bodies live in :mod:`margincal.cli.commands`."""

from __future__ import annotations

import argparse

from margincal.cli import commands
from margincal.config.settings import (
    DEFAULT_ATTACKER,
    DEFAULT_BENCHMARK,
    DEFAULT_BUDGET,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_SCALE,
    DEFAULT_SELECT,
    DEFAULT_VARIANT,
    DTYPE_NAMES,
    AttackConfig,
    EvalSettings,
)
from margincal.config.typed import default_of
from margincal.training.curves import DEFAULT_REPORT_TO, REPORTERS

BATCH, GENERATION_BATCH = default_of(EvalSettings, "batch_size"), default_of(EvalSettings, "generation_batch_size")


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
    parser.add_argument(
        "--scale",
        "--schedule",
        dest="scale",
        choices=["paper", "mini"],
        default=DEFAULT_SCALE,
        help=f"{what}: paper (real models) or mini (default {DEFAULT_SCALE})",
    )


def _benchmark_arg(parser: argparse.ArgumentParser, what: str, default: str | None = DEFAULT_BENCHMARK) -> None:
    """``--benchmark``: the protocol a command scores or encodes by (configs/benchmarks/<name>.yaml)."""
    shown = f"default {default}" if default is not None else "default: see above"
    parser.add_argument("--benchmark", default=default, help=f"{what} ({shown})")


def _max_length_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--max-length", type=_positive_int, default=None, help=what)


def _max_new_tokens_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-new-tokens", type=_positive_int, default=None, help="greedy answer length (default: benchmark's)"
    )


def _out_args(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    """``--out`` and ``--overwrite``: an existing result is replaced only when asked, and only if margincal wrote it."""
    parser.add_argument("--out", required=required, help=what)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out that margincal wrote (anything else is never replaced)",
    )


def _store_arg(parser: argparse.ArgumentParser, note: str = "") -> None:
    """``--store``: the stage store a command runs its stages through, with what ``note`` adds about it."""
    parser.add_argument("--store", help=f"stage store (default $MARGINCAL_STORE or runs/store){note}")


def _report_to_arg(parser: argparse.ArgumentParser) -> None:
    """``--report-to``: where the training curves of every stage the command runs go
    (:mod:`margincal.training.curves`)."""
    parser.add_argument(
        "--report-to",
        choices=REPORTERS,
        default=DEFAULT_REPORT_TO,
        help="write each training step's loss terms, lr and monitors as TensorBoard event files in <stage>/tensorboard "
        f"(needs margincal[tensorboard]; default {DEFAULT_REPORT_TO})",
    )


def _batch_args(parser: argparse.ArgumentParser) -> None:
    """``--batch-size`` and ``--generation-batch-size``: both are evaluation settings, so both are in every stored
    stage's key (an audit reuses a panel's stored evaluations only at the panel's batch sizes)."""
    parser.add_argument("--batch-size", type=_positive_int, help=f"scoring and gradnorm batch size (default {BATCH})")
    parser.add_argument(
        "--generation-batch-size",
        type=_positive_int,
        help=f"greedy decoding batch size (default {GENERATION_BATCH}; halved on a CUDA out-of-memory error)",
    )


def _device_args(parser: argparse.ArgumentParser) -> None:
    """``--dtype``, ``--device`` and ``--template`` for commands that load a model (bfloat16 and cuda on a GPU)."""
    parser.add_argument(
        "--dtype",
        default=DEFAULT_DTYPE,
        choices=DTYPE_NAMES,
        help=f"weights dtype (default {DEFAULT_DTYPE}; bfloat16 on a GPU)",
    )
    parser.add_argument(
        "--device", default=DEFAULT_DEVICE, help=f"torch device: cpu, cuda, cuda:1, mps (default {DEFAULT_DEVICE})"
    )
    parser.add_argument(
        "--template",
        default=None,
        help="prompt template: a configs/templates name (llama3, phi3, qa, mini, chat) or a YAML file; "
        "default: detected from the tokenizer (open-unlearning's formatting for the paper's models)",
    )


def add_demo(sub) -> None:
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
    demo.add_argument("--config", help="panel YAML (default: configs/panels/demo.yaml, shipped with margincal)")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    demo.set_defaults(func=commands._cmd_demo)


def add_unlearn(sub) -> None:
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
        epilog="Overrides: hparams.beta=0.2 train.lr=2e-5 train.steps=100 retain_batch_size=8 monitor.every=25",
    )
    unl.add_argument("--method", required=True, help="a registered method (margincal methods), e.g. NPO")
    unl.add_argument("--model", required=True, help="θ0: HF id or local directory")
    unl.add_argument("--forget", required=True, help="forget split (TOFU-format JSON / JSON-lines)")
    unl.add_argument("--retain", required=True, help="retain split (TOFU-format JSON / JSON-lines)")
    _out_args(unl, "output directory for the unlearned model (new or empty)", required=True)
    _report_to_arg(unl)
    _store_arg(unl, "; --out gets a copy")
    unl.add_argument(
        "--env", help="auxiliary fine-tuning split (TOFU-format) for methods that read one: ILUNPO's environment"
    )
    _scale_arg(unl, "training schedule of configs/methods/<method>.yaml: paper (real models) or mini")
    _benchmark_arg(
        unl,
        "the benchmark whose context and templates the splits are encoded with, and whose evaluator the monitors run",
    )
    _max_length_arg(unl, "max tokens per example (default 512, TOFU's; capped at the model's context)")
    _device_args(unl)
    unl.add_argument("--seed", type=int, default=0, help="seed of the data order and of any sampling (default 0)")
    unl.add_argument(
        "--select",
        choices=("last", "delta", "privleak"),
        default=DEFAULT_SELECT,
        help="released step: the last (default) or the monitored step closest to θ_ref's margin (delta, |Δ|) or "
        "membership signal (privleak, max |privleak|); monitors every monitor.every steps, trace.json/png saved",
    )
    unl.add_argument("--ref", help="the retain-only reference θ_ref (Δ and privleak of the monitors)")
    _monitor_args(unl)
    unl.add_argument("overrides", nargs="*", metavar="key=value")
    unl.set_defaults(func=commands._cmd_unlearn)


def _monitor_args(parser) -> None:
    """The held-out monitors' data (margincal.training.monitors): needed when monitors or a controller are on."""
    parser.add_argument("--holdout", help="held-out non-member QA (TOFU-format) for the monitors' membership AUCs")
    parser.add_argument(
        "--utility",
        nargs="+",
        default=(),
        help="utility QA (TOFU-format) no method trains on, for the monitors' utility proxy",
    )


def add_methods(sub) -> None:
    methods = sub.add_parser(
        "methods",
        help="list the registered unlearning methods with family, source and default hyperparameters",
        description="List every method in the registry with its family, source and configs/methods/*.yaml defaults.",
    )
    methods.set_defaults(func=commands._cmd_methods)


def add_polish(sub) -> None:
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
    pol.add_argument(
        "--method",
        help="its unlearning method, whose native loss keeps running (default: the method.json beside --model, "
        "written by margincal unlearn or a panel)",
    )
    pol.add_argument(
        "--theta0",
        help="the pre-unlearning model θ0: needed where the method's loss reads it (NPO's reference) and by the "
        "deployment variant's anchor",
    )
    pol.add_argument("--ref", help="the retain-only reference θ_ref (reference anchor; gives Δ)")
    pol.add_argument(
        "--forget", required=True, help="forget split (TOFU-format file; WMDP: the forget corpus, {text} rows)"
    )
    pol.add_argument("--retain", required=True, help="retain split (TOFU-format file; WMDP: the retain corpus)")
    pol.add_argument("--probe", required=True, help="probe corpus for the KL term (TOFU-format file, e.g. Alpaca)")
    _benchmark_arg(
        pol,
        "the protocol of Δ and the hinge: tofu, or a multiple-choice benchmark (wmdp-cyber, wmdp-bio) whose hinge "
        "sits at the letter margins of --questions",
    )
    pol.add_argument(
        "--questions", help="WMDP: the four-choice forget questions ({question, choices, answer} rows) MC hinges on"
    )
    _out_args(pol, "output directory for the polished model (new or empty)", required=True)
    _report_to_arg(pol)
    _store_arg(pol, "; --out gets a copy")
    pol.add_argument(
        "--variant",
        default=DEFAULT_VARIANT,
        help=f"reference | controlled | deployment | two_sided | forget_only | ... (default {DEFAULT_VARIANT})",
    )
    pol.add_argument("--trace", action="store_true", help="log the coercivity trace and draw trajectory.png")
    _monitor_args(pol)
    _scale_arg(
        pol,
        "configs/mc.yaml's scale section (mini: its mini learning rate) and the method's "
        "hyperparameters when --model has no method.json (written by margincal unlearn or a panel)",
    )
    _max_length_arg(pol, "max tokens per example (default 512, TOFU's; capped at the model's context)")
    _device_args(pol)
    pol.add_argument("overrides", nargs="*", metavar="key=value")
    pol.set_defaults(func=commands._cmd_polish)


def add_attack(sub) -> None:
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
    att.add_argument(
        "--attacker",
        default=DEFAULT_ATTACKER,
        help="preset: lora_r8, lora_r32, fpft, soft_prompt_20, ... (configs/attacks.yaml), or a preset FILE "
        "(an audit's searched winner, <card>/<name>/searched/<family>.yaml)",
    )
    att.add_argument(
        "--k",
        type=_positive_int,
        help=f"relearn budget K, below |D_f| (default: the preset's, else {default_of(AttackConfig, 'k')})",
    )
    _scale_arg(att, "the attacker preset's learning rates")
    att.add_argument("--k-sweep", help="comma-separated budgets, e.g. 1,3,5,10,20,50,100")
    att.add_argument("--ref", help="θ_ref, for Δ before and after the attack")
    att.add_argument("--instrument", action="store_true", help="Theorem 3 instrumentation (step norms, ∇m_β, Λ̂)")
    _store_arg(att)
    _out_args(att, "output JSON file")
    _benchmark_arg(
        att,
        "evaluation protocol of the held-out set: tofu (ROUGE-L recall, mean m) or muse-news (few-shot with "
        "--shots, stop strings, ROUGE-L F1, median m)",
    )
    att.add_argument("--shots", help="few-shot QA pairs placed before each question (muse-news: knowmem forget_qa_icl)")
    _max_length_arg(att, "max prompt+answer tokens (default: benchmark's)")
    _max_new_tokens_arg(att)
    _batch_args(att)
    _device_args(att)
    att.add_argument("overrides", nargs="*", metavar="key=value")
    att.set_defaults(func=commands._cmd_attack)


def add_evaluate(sub) -> None:
    ev = sub.add_parser(
        "evaluate",
        help="TOFU/MUSE metrics, five MIA AUCs, the margin diagnostic and MMLU of one checkpoint",
        description=(
            "Evaluate a checkpoint (HF id or directory) on a benchmark (configs/benchmarks/<name>.yaml: tofu, "
            "muse-news, mini) and write one JSON with a manifest. Evaluate θ_ref first and pass its JSON as "
            "--reference to the others (forget_quality, privleak and Δ reuse it). The evaluation is a stage of the "
            "store: the same evaluation again, or one a panel or audit stored, is read from there."
        ),
    )
    ev.add_argument("--model", required=True, help="checkpoint: HF id or local directory")
    _benchmark_arg(ev, "tofu | muse-news | muse-books | mini")
    ev.add_argument("--data", help="local directory (hub layout) or HF dataset id replacing the benchmark's source")
    ev.add_argument("--tier", help="forget01 | forget05 | forget10, news, books, cyber, bio (default: the benchmark's)")
    ev.add_argument("--reference", help="θ_ref's evaluate JSON on the same benchmark and tier")
    _out_args(ev, "output JSON file")
    _store_arg(ev)
    ev.add_argument(
        "--no-gradnorm", action="store_true", help="skip the per-sample gradient-norm MIA (one backward each)"
    )
    ev.add_argument(
        "--mmlu", choices=["mmlu", "local"], help="also run MMLU through lm-eval (mmlu: hub; local: offline set)"
    )
    _max_length_arg(ev, "max prompt+answer tokens (default: the benchmark's, capped at the model's context)")
    _max_new_tokens_arg(ev)
    ev.add_argument(
        "--aggregate",
        choices=["mean", "median"],
        help="of the margins: mean (TOFU) or median (MUSE); default: the benchmark's",
    )
    _batch_args(ev)
    _device_args(ev)
    ev.set_defaults(func=commands._cmd_evaluate)


def add_diagnose(sub) -> None:
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
    diag.add_argument(
        "--forget", required=True, help="forget split: TOFU-format (or, for WMDP, four-choice) JSON / JSON-lines file"
    )
    diag.add_argument("--ref", help="retain-only reference checkpoint (gives Δ and the certificate)")
    diag.add_argument("--retain", help="retain split file (gives the overlap ε)")
    diag.add_argument(
        "--aggregate", choices=["mean", "median"], help="mean (TOFU) or median (MUSE); default: the benchmark's"
    )
    _benchmark_arg(
        diag,
        "tofu, muse-news, muse-books, wmdp-cyber or wmdp-bio (the answer-letter margin): the scoring protocol and "
        "aggregate of m; default tofu, muse-news with --aggregate median",
        default=None,
    )
    _max_length_arg(diag, "max prompt+answer tokens (default: benchmark's)")
    diag.add_argument("--batch-size", type=_positive_int, help=f"scoring batch size (default {BATCH})")
    _device_args(diag)
    _out_args(diag, "write the full result (per-sample margins included) to this JSON file")
    diag.set_defaults(func=commands._cmd_diagnose)


def add_anchors(sub) -> None:
    anc = sub.add_parser(
        "anchors",
        help="write θ_ref's per-token anchor table of a forget split (MC from your own Trainer)",
        description=(
            "Score the forget records, encoded as margincal trains on them (the tokenizer's prompt template), with "
            "the anchor (θ_ref for reference MC, θ0 for the deployment variant) and write its per-token margins, "
            "entropies and gold log-probabilities with the answer token ids to a safetensors file that states the "
            "tokenizer and template it was made with. margincal.integrations.hf.MCMixin reads it "
            "(AnchorTable.load), so a Trainer elsewhere needs no live reference model for the hinge."
        ),
    )
    anc.add_argument("--ref", required=True, help="the anchor checkpoint (HF id or directory): θ_ref or θ0")
    anc.add_argument("--forget", required=True, help="forget split: TOFU-format JSON / JSON-lines file")
    _benchmark_arg(anc, "the benchmark whose context and template the forget records are encoded with")
    _max_length_arg(anc, "max prompt+answer tokens (default: the benchmark's, capped at the checkpoint's context)")
    _device_args(anc)
    _out_args(anc, "the table to write (a .safetensors file)", required=True)
    anc.set_defaults(func=commands._cmd_anchors)


def add_panel(sub) -> None:
    pan = sub.add_parser(
        "panel",
        help="run a panel of (benchmark, model, tier, method, seed, MC variant) cells, resumably",
        description=(
            "Run every cell of a panel YAML (a path, or the name of a file in configs/panels) through unlearn → "
            "evaluate (margin diagnostic included) → MC polish → evaluate → relearn attacks, locally, on Ray "
            "(executor=ray) or as SLURM jobs (executor=slurm, through submitit). Every stage is cached in the store "
            "under a hash of its config and inputs, so a rerun "
            "(after a crash or kill) skips finished stages and stages shared by cells run once. Cell records go to "
            "<out>/cells/, a summary to <out>/panel.json."
        ),
        epilog=(
            "Overrides: seeds='[0,1,2]' executor=ray ray.num_cpus=2 store=runs/store out=runs/panels/x; "
            "executor=slurm slurm.partition=gpu slurm.time_min=480 slurm.cells_per_job=2 (slurm.backend=local: "
            "the same jobs as local processes)"
        ),
    )
    pan.add_argument(
        "panel",
        nargs="?",
        default="demo",
        help="panel YAML, e.g. configs/panels/mini-head2head.yaml or mini-head2head (default demo)",
    )
    pan.add_argument("--dry-run", action="store_true", help="list the cells and which stages are already cached")
    pan.add_argument("overrides", nargs="*", metavar="key=value", help="panel config overrides")
    pan.set_defaults(func=commands._cmd_panel)


def add_mini(sub) -> None:
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
    exp.add_argument("directory", metavar="DIR", help="output directory for the split files (new or empty)")
    exp.add_argument("--tier", default="forget10", help="forget01 | forget05 | forget10 (default forget10)")
    exp.add_argument("--store", help="store of the mini models (default $MARGINCAL_STORE or runs/store)")
    exp.add_argument("--panel", help="take the mini settings of this panel (e.g. testbed): the models it ran on")
    exp.add_argument(
        "--overwrite", action="store_true", help="replace an existing DIR that margincal mini export wrote"
    )
    exp.add_argument("overrides", nargs="*", metavar="key=value", help="mini settings (MiniModelConfig) overrides")
    exp.set_defaults(func=commands._cmd_mini_export)


def add_report(sub) -> None:
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
    rep.set_defaults(func=commands._cmd_report)


def _audited_args(aud: argparse.ArgumentParser) -> None:
    """The checkpoints an audit reads: ``--model`` entries, a ``--models`` file, a panel's cells, an adapter's base."""
    aud.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[NAME=]CKPT",
        help="checkpoint to audit (repeatable): a directory, a margincal stage directory, an adapter, "
        "or a hub id with an optional @revision",
    )
    aud.add_argument(
        "--models", dest="models_file", metavar="FILE", help="a file listing checkpoints, one [NAME=]CKPT per line"
    )
    aud.add_argument(
        "--from-panel", metavar="RESULTS", help="audit every finished cell of a panel's results: baseline and MC polish"
    )
    aud.add_argument("--base", help="the base model of LoRA adapters whose adapter_config.json names none that exists")


def add_audit(sub) -> None:
    aud = sub.add_parser(
        "audit",
        help="will this unlearned checkpoint relearn? A robustness card for any checkpoint(s)",
        description=(
            "Audit one or more checkpoints (a directory, a LoRA adapter over --base, or a hub id[@revision]): the "
            "margin diagnostic (Δ with a bootstrap interval, the certificate), forget metrics, the five MIA detectors "
            "with an overshoot flag, utility, and the budget's relearn attacks and bitsandbytes quantizers, each "
            "verdict a recovered fraction between the θ_ref floor and the θ0 ceiling under the same attack. Every "
            "stage goes through the store: a second audit against the same θ_ref and θ0 reuses theirs. Writes "
            "card.json, card.md, figures/ and, from 3 checkpoints on, population.json (Δ and other pre-attack "
            "signals as predictors of the recovered fraction)."
        ),
        epilog=(
            "Budgets (configs/audit.yaml): quick, standard, paper; overrides on top: draws=5. After `margincal mini "
            "export DIR`, --data DIR alone sets the mini benchmark, its θ_ref and θ0."
        ),
    )
    _audited_args(aud)
    aud.add_argument("--data", help="TOFU-format split directory (margincal mini export DIR, TOFU saved locally, ...)")
    aud.add_argument(
        "--benchmark", help="mini | tofu | muse-news | muse-books (default: mini for a mini export, else tofu)"
    )
    aud.add_argument(
        "--tier",
        help="forget01 | forget05 | forget10, news, books, cyber, bio (default: a mini export's own tier, else the "
        "benchmark's: forget10, MUSE's news / books, WMDP's cyber / bio)",
    )
    aud.add_argument("--ref", help="the retain-only reference θ_ref (the floor; gives m_ref and Δ)")
    aud.add_argument("--ref-logs", help="open-unlearning's retain-model TOFU_EVAL.json (forget_quality, privleak)")
    aud.add_argument(
        "--claimed",
        action="append",
        default=[],
        metavar="[NAME=]FILE",
        help="documented numbers of a checkpoint to reproduce (open-unlearning's TOFU_SUMMARY.json or TOFU_EVAL.json, "
        "or a JSON of metric → value with an optional tolerance); NAME= when several are audited; repeatable",
    )
    aud.add_argument("--theta0", help="the model before unlearning θ0 (the ceiling)")
    aud.add_argument(
        "--control",
        metavar="NAME",
        help="an audited checkpoint that is a control (e.g. one trained by the OracleImitation method): the "
        "population view pairs every other checkpoint's recovered fractions with the control's",
    )
    aud.add_argument(
        "--budget",
        default=DEFAULT_BUDGET,
        help=f"default {DEFAULT_BUDGET}; quick | standard | paper | worst | worst_loose | wmdp | worst_testbed | "
        "worst_testbed_retain "
        "(configs/audit.yaml; worst*: searched attacks under a utility bound, configs/search.yaml)",
    )
    _scale_arg(aud, "the attackers' learning rates (default: mini on the mini benchmark)")
    aud.set_defaults(scale=None)
    _store_arg(aud)
    _batch_args(aud)
    aud.add_argument("--mmlu", choices=["mmlu", "local"], help="utility: also MMLU through lm-eval (mmlu: hub; local)")
    _device_args(aud)
    _out_args(aud, "output directory of the card (new, or one an audit wrote with --overwrite)", required=True)
    _report_to_arg(aud)
    aud.add_argument("--model-card", action="store_true", help="also write each checkpoint's model card (README.md)")
    aud.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="budget overrides, e.g. draws=3 search.trials=40 search.epsilon=0.1",
    )
    aud.set_defaults(func=commands._cmd_audit)


def add_population(sub) -> None:
    pop = sub.add_parser(
        "population",
        help="merge several audits' checkpoints into one population view (e.g. a control audited later)",
        description=(
            "Read the card.json of two or more audits of the same budget, benchmark, tier, data and θ_ref/θ0 and "
            "write the population view an audit of all their checkpoints together writes: population.json, "
            "population.md and figures/population.png (Δ and other pre-attack signals as predictors of the "
            "recovered fraction, and the paired differences). A checkpoint's card depends only on it, θ_ref, θ0, "
            "the data and the budget, so no stage reruns; audits that differ in any of those are refused."
        ),
    )
    pop.add_argument("audits", nargs="+", metavar="AUDIT", help="an audit's output directory (holding card.json)")
    pop.add_argument(
        "--control", metavar="NAME", help="a merged checkpoint that is a control: every other one is paired with it"
    )
    _out_args(pop, "output directory (new, or one margincal population wrote with --overwrite)", required=True)
    pop.set_defaults(func=commands._cmd_population)


COMMANDS = (
    add_demo,
    add_unlearn,
    add_methods,
    add_polish,
    add_attack,
    add_evaluate,
    add_diagnose,
    add_anchors,
    add_audit,
    add_population,
    add_panel,
    add_mini,
    add_report,
)  # the order of `margincal --help`
