"""margincal from Python, on a model you hold: unlearn it, diagnose it, polish it with MC, attack it, audit it.

    python examples/api_quickstart.py --out runs/quickstart

On the mini benchmark (its models ship with margincal and are copied into the store) the whole run takes a few
minutes on 2 CPU cores (measured timings: ``benchmarks/RESULTS.md``). ``--data DIR`` takes a ``margincal mini
export DIR`` instead of building one under ``--out``; ``--smoke`` runs every stage for a few steps (what the tests
run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

import margincal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/quickstart", help="where the polished model and the card go")
    parser.add_argument("--data", help="a margincal mini export (default: made under --out)")
    parser.add_argument("--smoke", action="store_true", help="a few steps per stage (the tests' size)")
    args = parser.parse_args()
    out = Path(args.out)
    mini = margincal.load(Path(args.data) / "mini.json") if args.data else margincal.api.mini_export(out / "mini")
    data = Path(mini.dir)
    forget, retain, probe = data / f"{mini.tier}.json", data / f"{mini.retain}.json", data / "probe.json"
    smoke = {
        "unlearn": ["train.steps=2"] if args.smoke else [],
        "polish": ["train.steps=3"] if args.smoke else [],
        "attack": ["train.steps=3", "train.batch_size=4"] if args.smoke else [],
        "audit": ["attackers=[{preset: lora_r8, k: [4], set: {train.steps: 3}}]", "headline=lora_r8@4", "quantizers=[]"]
        if args.smoke
        else [],
    }

    # The model you hold: the mini θ0, loaded with transformers.
    tokenizer = AutoTokenizer.from_pretrained(mini.theta0)
    theta0 = AutoModelForCausalLM.from_pretrained(mini.theta0)

    # 1. Unlearn it with NPO (mini-scale schedule); the result holds the unlearned model in memory.
    npo = margincal.unlearn(
        theta0, "NPO", forget, retain=retain, tokenizer=tokenizer, scale="mini", overrides=smoke["unlearn"]
    )
    # 2. The margin diagnostic against the retain-only reference θ_ref: Δ > 0 is above the margin cliff.
    d = margincal.diagnose(npo.model, forget, ref=mini.ref, tokenizer=tokenizer)
    print(f"NPO:     Δ = {d.delta:+.3f} ({d.label})")
    # 3. Margin Calibration: a short LoRA polish continuing NPO's loss, saved to --out for the audit.
    mc = margincal.polish(
        npo,
        forget,
        retain=retain,
        probe=probe,
        theta0=theta0,  # NPO's loss reads θ0
        ref=mini.ref,
        tokenizer=tokenizer,
        scale="mini",
        overrides=smoke["polish"],
        out=out / "npo_mc",
        overwrite=True,
    )
    d = margincal.diagnose(mc.model, forget, ref=mini.ref, tokenizer=tokenizer)
    print(f"NPO+MC:  Δ = {d.delta:+.3f} ({d.label})")
    # 4. A relearn attack: LoRA fine-tuning on K = 4 forget records, scored on the held-out ones.
    attacked = margincal.attack(
        mc.model, forget, k=4, ref=mini.ref, tokenizer=tokenizer, scale="mini", overrides=smoke["attack"]
    )
    print(f"attack:  held-out forget ROUGE-L after relearning on K = 4: {attacked.rouge_l(4):.3f}")
    # 5. The audit card: every verdict a fraction of the θ_ref-to-θ0 gap an attack recovers.
    card = margincal.audit(
        {"NPO+MC": mc.out}, data=mini.dir, overrides=smoke["audit"], out=out / "audit", overwrite=True
    )
    recovered = card.recovered("NPO+MC")  # None where the card's sanity rule withholds the verdict
    shown = "—" if recovered is None else f"{recovered:.2f}"
    print(f"audit:   Δ {card.delta('NPO+MC'):+.3f}, {card.headline} recovered {shown} (card: {card.out}/card.md)")


if __name__ == "__main__":
    main()
