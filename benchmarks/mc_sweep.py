"""Sweep MC polish settings on the demo's mini baselines and report forget/retain ROUGE-L, Δ and K20-LoRA.

    .venv/bin/python benchmarks/mc_sweep.py --method NPO --runs "lr=5e-5" "lr=1e-4" "lr=1e-3,gamma=0"

Each run is a comma-separated list of ``key=value``: ``lr``, ``steps`` (polish), ``kl`` (λ_KL), ``kappa``,
``variant`` (a preset of ``margincal.polish.MC_VARIANTS``: deployment, two_sided, ref_gate, ...), and any
hyperparameter of the method (e.g. ``gamma=0`` turns the native forget term off). Uses the cached mini models
(built on first use) and the demo configuration; prints one row per run after the baseline row.
"""

from __future__ import annotations

import argparse
import dataclasses

from margincal.attacks import run_attack
from margincal.cli import _quiet_libraries, load_demo_config
from margincal.evaluation.tofu import evaluate_split
from margincal.methods import get_method
from margincal.models import load_model
from margincal.pipeline.demo import prepare_mini
from margincal.polish import MC_VARIANTS, run_polish
from margincal.unlearn import method_run, unlearn

MC_KEYS = {"lr", "steps", "kl", "kappa", "variant"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="NPO")
    parser.add_argument("--runs", nargs="+", default=["lr=1e-4"])
    parser.add_argument("overrides", nargs="*", help="demo config overrides (key=value)")
    args = parser.parse_args()
    _quiet_libraries()
    cfg = load_demo_config(None, args.overrides)
    setup = prepare_mini(cfg)
    paths, tok, enc, forget = setup.paths, setup.tokenizer, setup.encoded, setup.records["forget"]
    retain_eval = setup.records["retain_eval"]
    pad = tok.pad_token_id
    theta0, ref = load_model(paths.theta0), load_model(paths.ref(cfg.tier))
    m_ref = evaluate_split(ref, tok, enc["forget"], [r.answer for r in forget], 48, 32)["diagnosis"]["m"]
    anchors = {"ref": (ref, str(paths.ref(cfg.tier))), "theta0": (theta0, str(paths.theta0))}

    def row(label, model):
        f = evaluate_split(model, tok, enc["forget"], [r.answer for r in forget], 48, 32, m_ref)
        r = evaluate_split(model, tok, enc["retain_eval"], [x.answer for x in retain_eval], 48, 32, diagnostic=False)
        attacked, held = run_attack(model, enc["forget"], cfg.attack, tok)
        k = evaluate_split(
            attacked, tok, [enc["forget"][i] for i in held], [forget[i].answer for i in held], 48, 32, diagnostic=False
        )
        print(
            f"| {label} | {f['rouge_l']:.3f} | {r['rouge_l']:.3f} | {f['diagnosis']['delta']:+.2f} | "
            f"{k['rouge_l']:.3f} |",
            flush=True,
        )

    run = method_run(args.method, cfg.unlearn.get(args.method))
    method = get_method(args.method, **run.hparams)
    base, _ = unlearn(theta0, method, enc["forget"], enc["retain"], run.train, tok, run.retain_batch_size)
    print(f"m_ref = {m_ref:+.3f}\n")
    print(f"| run | forget ROUGE-L | retain ROUGE-L | Δ | K{cfg.attack.k}-LoRA |\n|---|---|---|---|---|")
    row(f"{args.method} baseline", base)
    for spec in args.runs:
        kv = dict(item.split("=", 1) for item in spec.split(","))
        hp = {k: float(v) for k, v in kv.items() if k not in MC_KEYS}
        variant = get_method(args.method, **{**run.hparams, **hp})
        variant.prepare(theta0, enc["forget"], tok)
        train = dataclasses.replace(
            cfg.mc.train, lr=float(kv.get("lr", cfg.mc.train.lr)), steps=int(kv.get("steps", cfg.mc.train.steps))
        )
        mc = dataclasses.replace(
            cfg.mc,
            train=train,
            kl_weight=float(kv.get("kl", cfg.mc.kl_weight)),
            kappa=float(kv.get("kappa", cfg.mc.kappa)),
            **MC_VARIANTS[kv.get("variant", "reference")],
        )
        polished, _ = run_polish(
            base, variant, mc, anchors, enc["forget"], enc["retain"], enc["probe"], pad, m_ref=m_ref
        )
        row(f"+MC {spec}", polished)


if __name__ == "__main__":
    main()
