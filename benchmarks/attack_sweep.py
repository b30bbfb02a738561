"""Relearn attacks on the mini benchmark: one baseline and its MC polish under every attacker and a K-sweep.

    .venv/bin/python benchmarks/attack_sweep.py --method NPO [--budgets 1,3,5,10,20,30,40] [--attackers ...]
        [attack.fpft.train.lr=1e-4] [mc.kappa=2] ['method_overrides={NPO: {train: {steps: 80}}}']

Unlearns θ0 with the method's mini schedule (the demo panel's first cell: ``unlearn_stage``), polishes it with the
cell's MC configuration (``polish_stage``), then reports held-out forget ROUGE-L (and the share of held-out samples
whose diagnostic margin the attack flips positive; ``attack_stage``) for (a) the LoRA-r8 K-sweep and (b) each
attacker preset of ``configs/attacks.yaml`` at K = ``--k`` (20), baseline → MC, with wall times (presets at the
panel's scale, ``mini``), and (c) Theorem 3's instrumented K-``--k`` LoRA-r8 attack. The mini forget set has 50
samples, so the paper's K = 50 / 100 budgets become 30 / 40 here. ``attack.<preset>.key=value`` overrides adjust a
preset (e.g. ``attack.fpft.train.lr=1e-4``); any other ``key=value`` is a demo panel override. Put them before
``--attackers``.
"""

from __future__ import annotations

import argparse
import time

from margincal.config.settings import resolve_attack
from margincal.core.terminal import quiet_libraries
from margincal.mc.bounds import LiftInstrument
from margincal.model.loading import clone_model
from margincal.pipeline.cell import panel_workspace
from margincal.pipeline.stages import attack_stage, evaluate_stage, polish_stage, reference_margin, unlearn_stage

PRESETS = ["lora_r8", "lora_r32", "fpft", "soft_prompt_20", "soft_prompt_100", "adaptive", "linear_probe"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="NPO")
    parser.add_argument("--budgets", default="1,3,5,10,20,30,40")
    parser.add_argument("--k", type=int, default=20, help="attack budget of (b) and (c)")
    parser.add_argument("--attackers", nargs="*", default=PRESETS)
    parser.add_argument("overrides", nargs="*", help="attack.<preset>.key=value, or demo panel key=value")
    args = parser.parse_args(argv)
    quiet_libraries()
    preset_overrides: dict[str, list[str]] = {}
    panel_overrides = [f"methods=[{args.method}]"]
    for item in args.overrides:
        key, _, value = item.partition("=")
        parts = key.split(".")
        if parts[0] == "attack" and len(parts) > 2 and parts[1] in PRESETS:
            preset_overrides.setdefault(parts[1], []).append(f"{'.'.join(parts[2:])}={value}")
        else:
            panel_overrides.append(item)
    plan, ws = panel_workspace("demo", panel_overrides)
    cfg, seed, settings, pad = plan.cfg, plan.cell.seed, plan.eval, ws.tokenizer.pad_token_id
    m_ref = reference_margin(ws, settings)
    method = plan.cell.method
    run = plan.method
    base, res = unlearn_stage(run, ws, seed)
    mc, _ = polish_stage(clone_model(base), run, plan.mc, ws, m_ref, res.method_state)
    models = {"baseline": base, "MC": mc}
    for name, model in models.items():
        delta = evaluate_stage(model, ws, settings, {"summary": {"m": m_ref}}, ("diagnosis",))["summary"]["delta"]
        print(f"{method} {name}: Δ = {delta:+.2f}")

    def attack(preset: str, k: int):
        return resolve_attack(preset, cfg.scale, preset_overrides.get(preset, []), k=k, seed=seed)

    def cell(res) -> str:
        flipped = res["flips"]["flipped"]["n"]
        return f"{res['rouge_l']:.3f} ({flipped}/{len(res['heldout'])} flipped)"

    budgets = [int(k) for k in args.budgets.split(",")]
    print(f"\n(a) LoRA-r8 K-sweep, held-out forget ROUGE-L (margins flipped positive), m_ref = {m_ref:+.2f}\n")
    print("| K | " + " | ".join(models) + " |\n|---|" + "---|" * len(models))
    start = time.perf_counter()
    sweep = {
        name: {k: attack_stage(m, attack("lora_r8", k), ws, settings, m_ref) for k in budgets}
        for name, m in models.items()
    }
    for k in budgets:
        print(f"| {k} | " + " | ".join(cell(sweep[name][k]) for name in models) + " |")
    print(f"\nK-sweep wall time ({len(budgets)} budgets × {len(models)} models): {time.perf_counter() - start:.1f} s")

    print(f"\n(b) every attacker at K = {args.k}, held-out forget ROUGE-L baseline → MC\n")
    print("| attacker | baseline | MC | seconds (both) |\n|---|---|---|---|")
    for preset in args.attackers:
        start = time.perf_counter()
        res = {n: attack_stage(m, attack(preset, args.k), ws, settings, m_ref) for n, m in models.items()}
        print(f"| {preset} | {cell(res['baseline'])} | {cell(res['MC'])} | {time.perf_counter() - start:.1f} |")

    print(f"\n(c) Theorem 3 constants on the instrumented K{args.k} LoRA-r8 attack\n")
    print("| model | G_m^sup | L_m^sup | Σ‖δ‖ | Λ̂(N) | lift | lift ≤ Λ̂ |\n|---|---|---|---|---|---|---|")
    for name, model in models.items():
        probes = []

        def factory(held, model=model, probes=probes):
            probes.append(LiftInstrument(model, [ws.attack_examples[i] for i in held], pad))
            return probes[-1]

        attack_stage(model, attack("lora_r8", args.k), ws, settings, m_ref, factory)
        s = probes[0].summary()
        print(
            f"| {name} | {s['G_m_sup']:.2f} | {s['L_m_sup']:.2f} | {s['sum_step_norm']:.3f} | {s['Lambda_hat']:.2f} | "
            f"{s['lift']:+.3f} | {s['bound_holds']} |"
        )


if __name__ == "__main__":
    main()
