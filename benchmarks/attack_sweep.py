"""Relearn attacks on the mini benchmark: one baseline and its MC polish under every attacker and a K-sweep.

    .venv/bin/python benchmarks/attack_sweep.py --method NPO [--budgets 1,3,5,10,20,30,40] [--attackers ...]

Unlearns θ0 with the method's mini schedule, polishes it with the frozen MC configuration, then reports
held-out forget ROUGE-L (and the share of held-out samples whose diagnostic margin the attack flips positive)
for (a) the LoRA-r8 K-sweep and (b) each attacker preset of ``configs/attacks.yaml`` at K = 20, baseline → MC,
with wall times (presets at their ``mini`` scale), and (c) Theorem 3's instrumented K20 LoRA-r8 attack. The mini
forget set has 50 samples, so the paper's K = 50 / 100 budgets become 30 / 40 here. ``attack.<preset>.key=value``
overrides adjust a preset (e.g. ``attack.fpft.train.lr=1e-4``); put them before ``--attackers``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from margincal.attacks import attack_and_evaluate, attack_preset
from margincal.bounds import LiftInstrument
from margincal.cli import _quiet_libraries, load_demo_config
from margincal.margin import dataset_margin
from margincal.methods import get_method
from margincal.models import load_model
from margincal.pipeline.demo import prepare_mini
from margincal.polish import run_polish
from margincal.scoring import score_dataset
from margincal.unlearn import method_run, unlearn

PRESETS = ["lora_r8", "lora_r32", "fpft", "soft_prompt_20", "soft_prompt_100", "adaptive", "linear_probe"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="NPO")
    parser.add_argument("--budgets", default="1,3,5,10,20,30,40")
    parser.add_argument("--attackers", nargs="*", default=PRESETS)
    parser.add_argument("overrides", nargs="*", help="attack.<preset>.key=value, or demo config key=value")
    args = parser.parse_args()
    _quiet_libraries()
    preset_overrides: dict[str, list[str]] = {}
    demo_overrides = []
    for item in args.overrides:
        key, _, value = item.partition("=")
        parts = key.split(".")
        if parts[0] == "attack" and len(parts) > 2 and parts[1] in PRESETS:
            preset_overrides.setdefault(parts[1], []).append(f"{'.'.join(parts[2:])}={value}")
        else:
            demo_overrides.append(item)
    cfg = load_demo_config(None, demo_overrides)
    setup = prepare_mini(cfg)
    tok, enc, rec = setup.tokenizer, setup.encoded, setup.records
    pad = tok.pad_token_id
    theta0, ref = load_model(setup.paths.theta0), load_model(setup.paths.ref(cfg.tier))
    forget, answers = enc["forget"], [r.answer for r in rec["forget"]]
    m_ref = dataset_margin(score_dataset(ref, forget, pad))
    run = method_run(args.method, cfg.unlearn.get(args.method))
    method = get_method(args.method, **run.hparams)
    base, _ = unlearn(theta0, method, forget, enc["retain"], run.train, tok, run.retain_batch_size, {"env": enc["env"]})
    anchors = {"ref": (ref, "ref"), "theta0": (theta0, "theta0")}
    mc, _ = run_polish(base, method, cfg.mc, anchors, forget, enc["retain"], enc["probe"], pad, m_ref=m_ref)
    models = {"baseline": base, "MC": mc}
    for name, model in models.items():
        print(f"{args.method} {name}: Δ = {dataset_margin(score_dataset(model, forget, pad)) - m_ref:+.2f}")

    def cell(res) -> str:
        flipped = res["flips"]["flipped"]["n"]
        return f"{res['rouge_l']:.3f} ({flipped}/{len(res['heldout'])} flipped)"

    budgets = [int(k) for k in args.budgets.split(",")]
    lora = attack_preset("lora_r8", preset_overrides.get("lora_r8", []), "mini")
    print(f"\n(a) LoRA-r8 K-sweep, held-out forget ROUGE-L (margins flipped positive), m_ref = {m_ref:+.2f}\n")
    print("| K | " + " | ".join(models) + " |\n|---|" + "---|" * len(models))
    start = time.perf_counter()
    sweep = {
        name: {k: attack_and_evaluate(m, tok, forget, answers, dataclasses.replace(lora, k=k), cfg.eval, m_ref)
               for k in budgets}
        for name, m in models.items()
    }  # fmt: skip
    for k in budgets:
        print(f"| {k} | " + " | ".join(cell(sweep[name][k]) for name in models) + " |")
    print(f"\nK-sweep wall time ({len(budgets)} budgets × {len(models)} models): {time.perf_counter() - start:.1f} s")

    print("\n(b) every attacker at K = 20, held-out forget ROUGE-L baseline → MC\n")
    print("| attacker | baseline | MC | seconds (both) |\n|---|---|---|---|")
    for preset in args.attackers:
        attack_cfg = dataclasses.replace(attack_preset(preset, preset_overrides.get(preset, []), "mini"), k=20)
        start = time.perf_counter()
        res = {n: attack_and_evaluate(m, tok, forget, answers, attack_cfg, cfg.eval, m_ref) for n, m in models.items()}
        print(f"| {preset} | {cell(res['baseline'])} | {cell(res['MC'])} | {time.perf_counter() - start:.1f} |")

    print("\n(c) Theorem 3 constants on the instrumented K20 LoRA-r8 attack\n")
    print("| model | G_m^sup | L_m^sup | Σ‖δ‖ | Λ̂(N) | lift | lift ≤ Λ̂ |\n|---|---|---|---|---|---|---|")
    for name, model in models.items():
        probes = []

        def factory(held, model=model, probes=probes):
            probes.append(LiftInstrument(model, [forget[i] for i in held], pad))
            return probes[-1]

        attack_and_evaluate(model, tok, forget, answers, dataclasses.replace(lora, k=20), cfg.eval, m_ref, factory)
        s = probes[0].summary()
        print(
            f"| {name} | {s['G_m_sup']:.2f} | {s['L_m_sup']:.2f} | {s['sum_step_norm']:.3f} | {s['Lambda_hat']:.2f} | "
            f"{s['lift']:+.3f} | {s['bound_holds']} |"
        )


if __name__ == "__main__":
    main()
