"""The mini-benchmark demo: build → unlearn → diagnose → MC polish → K20-LoRA attack → report.

``seed`` drives the run's stochastic stages (unlearning/polish/attack streams, D_rel draw, LoRA init);
the benchmark and its models are governed by ``mini.*`` (``mini.data.seed`` regenerates both) and are
cached, so changing ``seed`` reuses the cached θ0/θ_ref.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import torch

from margincal.attacks import run_attack
from margincal.config import (
    AttackConfig,
    EvalConfig,
    MCConfig,
    TrainConfig,
    to_dict,
)
from margincal.data.mini import MiniBenchmark, generate
from margincal.data.records import EncodedQA, QARecord, encode_qa
from margincal.evaluation.tofu import evaluate_split
from margincal.margin import overlap_epsilon
from margincal.methods.base import get_method
from margincal.models import load_model, load_tokenizer
from margincal.pipeline.mini_models import (
    MiniModelConfig,
    MiniModels,
    build_mini_models,
    default_cache_dir,
    retain_split,
)
from margincal.pipeline.store import atomic_write_json, atomic_write_text, manifest
from margincal.polish import run_polish
from margincal.report.figures import cliff_figure
from margincal.report.tables import demo_report
from margincal.unlearn import method_run, unlearn


@dataclasses.dataclass
class DemoConfig:
    seed: int = 0
    out_dir: str = "runs/demo"
    cache_dir: str | None = None  # default: $MARGINCAL_CACHE or ~/.cache/margincal
    tier: str = "forget10"
    methods: list[str] = dataclasses.field(default_factory=lambda: ["GradDiff", "NPO"])
    unlearn: dict[str, dict] = dataclasses.field(default_factory=dict)  # per-method overrides of configs/methods
    mini: MiniModelConfig = dataclasses.field(default_factory=MiniModelConfig)
    mc: MCConfig = dataclasses.field(default_factory=MCConfig)
    attack: AttackConfig = dataclasses.field(default_factory=AttackConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)


def _say(msg: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)


def _seeded(tc: TrainConfig, seed: int) -> TrainConfig:
    return dataclasses.replace(tc, seed=seed)


@dataclasses.dataclass
class MiniSetup:
    """The demo's benchmark, cached models, tokenizer, and its splits as records and as encoded examples.

    Splits: ``forget`` (the tier), ``retain`` (its complement), ``retain_eval`` (a seeded subset of
    ``eval.retain_eval_n`` retain samples used for retain ROUGE-L), ``probe`` and ``env`` (world facts: the
    auxiliary fine-tuning environment of ILU).
    """

    bench: MiniBenchmark
    paths: MiniModels
    tokenizer: object
    records: dict[str, list[QARecord]]
    encoded: dict[str, list[EncodedQA]]


def cache_dir(cfg: DemoConfig) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()


def prepare_mini(cfg: DemoConfig) -> MiniSetup:
    """Generate the benchmark, build or reuse its models, and encode the splits the demo uses."""
    bench = generate(cfg.mini.data)
    paths = build_mini_models(bench, cfg.mini, tiers=(cfg.tier,), cache_dir=cache_dir(cfg))
    tok = load_tokenizer(paths.tokenizer)
    retain = bench.split(retain_split(cfg.tier))
    n_eval = min(cfg.eval.retain_eval_n, len(retain))
    records = {
        "forget": bench.split(cfg.tier),
        "retain": retain,
        "retain_eval": [retain[i] for i in sorted(random.Random(0).sample(range(len(retain)), n_eval))],
        "probe": bench.split("probe"),
        "env": bench.split("world_facts"),  # ILU's fine-tuning environment (the GSM8K analogue)
    }
    encoded = {name: encode_qa(tok, recs, cfg.mini.max_length) for name, recs in records.items()}
    return MiniSetup(bench, paths, tok, records, encoded)


def run_demo(cfg: DemoConfig) -> Path:
    """Run the whole demo; returns the path of ``report.md``."""
    t0 = time.perf_counter()
    runs = {name: method_run(name, cfg.unlearn.get(name)) for name in cfg.methods}
    methods = {name: get_method(name, **run.hparams) for name, run in runs.items()}
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = cache_dir(cfg)

    _say("preparing the mini benchmark and its models (a first run builds them: about 3 min on 2 CPU cores)", t0)
    setup = prepare_mini(cfg)
    _say(f"mini benchmark {setup.bench.fingerprint()[:12]}, models in {setup.paths.root}", t0)
    bench, paths, tok, enc = setup.bench, setup.paths, setup.tokenizer, setup.encoded
    pad = tok.pad_token_id
    forget_rec, retain_rec = setup.records["forget"], setup.records["retain"]
    answers = {name: [r.answer for r in setup.records[name]] for name in ("forget", "retain_eval")}

    epsilon = overlap_epsilon(
        [f"{r.question} {r.answer}" for r in forget_rec], [f"{r.question} {r.answer}" for r in retain_rec]
    )
    _say(f"forget/retain word-bigram overlap ε = {epsilon:.3f}", t0)
    theta0 = load_model(paths.theta0)
    ref = load_model(paths.ref(cfg.tier))
    m_ref: float | None = None  # set by evaluating θ_ref first; read by every later evaluation
    results: dict[str, dict] = {}

    def evaluate(label: str, model: torch.nn.Module, kind: str, base: str | None = None) -> dict:
        row = {"kind": kind, "base": base}
        row["forget"] = evaluate_split(
            model, tok, enc["forget"], answers["forget"], cfg.eval.max_new_tokens, cfg.eval.batch_size, m_ref
        )
        row["retain"] = evaluate_split(
            model,
            tok,
            enc["retain_eval"],
            answers["retain_eval"],
            cfg.eval.max_new_tokens,
            cfg.eval.batch_size,
            diagnostic=False,
        )
        results[label] = row
        d = row["forget"]["diagnosis"]
        delta = f"Δ={d['delta']:+.2f}" if d.get("delta") is not None else "(reference)"
        _say(
            f"{label:<14} forget ROUGE-L {row['forget']['rouge_l']:.3f}  retain ROUGE-L "
            f"{row['retain']['rouge_l']:.3f}  m(D_f)={d['m']:+.2f} {delta}",
            t0,
        )
        return row

    m_ref = evaluate("θ_ref", ref, "reference")["forget"]["diagnosis"]["m"]
    evaluate("θ0", theta0, "target")

    def attack(label: str, model: torch.nn.Module) -> None:
        attacked, held = _attack(model, enc["forget"], cfg, tok)
        held_enc = [enc["forget"][i] for i in held]
        res = evaluate_split(
            attacked,
            tok,
            held_enc,
            [answers["forget"][i] for i in held],
            cfg.eval.max_new_tokens,
            cfg.eval.batch_size,
            m_ref,
        )
        results[label]["attack"] = {"attacker": cfg.attack.name, "k": cfg.attack.k, "heldout": held, **res}
        _say(f"{label:<14} K{cfg.attack.k}-{cfg.attack.name} held-out ROUGE-L {res['rouge_l']:.3f}", t0)

    attack("θ_ref", ref)
    attack("θ0", theta0)
    anchors = {"ref": (ref, str(paths.ref(cfg.tier))), "theta0": (theta0, str(paths.theta0))}
    timings = {}
    for name, method in methods.items():
        t = time.perf_counter()
        run = runs[name]
        model, _ = unlearn(
            theta0,
            method,
            enc["forget"],
            enc["retain"],
            _seeded(run.train, cfg.seed),
            tok,
            run.retain_batch_size,
            {"env": enc["env"]},
        )
        timings[f"unlearn {name}"] = time.perf_counter() - t
        evaluate(name, model, "baseline")
        attack(name, model)
        t = time.perf_counter()
        mc_cfg = dataclasses.replace(cfg.mc, train=_seeded(cfg.mc.train, cfg.seed))
        polished, _ = run_polish(
            model, method, mc_cfg, anchors, enc["forget"], enc["retain"], enc["probe"], pad, cache, m_ref
        )
        timings[f"polish {name}"] = time.perf_counter() - t
        evaluate(f"{name}+MC", polished, "mc", base=name)
        attack(f"{name}+MC", polished)

    elapsed = time.perf_counter() - t0
    record = {
        "manifest": manifest(
            to_dict(cfg), cfg.seed, {"benchmark_fingerprint": bench.fingerprint(), "models": str(paths.root)}
        ),
        "m_ref": m_ref,
        "overlap_epsilon": epsilon,
        "timings_s": {**timings, "total": elapsed},
        "models": results,
    }
    atomic_write_json(out / "results.json", record)
    cliff_figure(results, m_ref, out / "cliff.png")
    report = demo_report(record, figure="cliff.png")
    atomic_write_text(out / "report.md", report)
    _say(f"report written to {out / 'report.md'}", t0)
    return out / "report.md"


def _attack(model, forget: list[EncodedQA], cfg: DemoConfig, tokenizer):
    attack_cfg = dataclasses.replace(cfg.attack, train=_seeded(cfg.attack.train, cfg.seed))
    return run_attack(model, forget, attack_cfg, tokenizer)
