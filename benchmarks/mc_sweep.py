"""Sweep MC polish settings on the demo panel's mini baseline and report forget/retain ROUGE-L, Δ and K20-LoRA.

    .venv/bin/python benchmarks/mc_sweep.py --method NPO --runs "lr=5e-5" "lr=1e-4" "lr=1e-3,gamma=0"
    .venv/bin/python benchmarks/mc_sweep.py mc.kappa=2 mini.data.seed=1 --method PDU --runs "variant=deployment"

Each run is a comma-separated list of ``key=value``: ``lr``, ``steps`` (polish), ``kl`` (λ_KL), ``kappa``,
``variant`` (a preset of ``margincal.config.settings.MC_VARIANTS``: deployment, two_sided, ref_gate, ...), and any
hyperparameter of the method (e.g. ``gamma=0`` turns the native forget term off). Other ``key=value`` arguments
(before ``--method``/``--runs``) are demo panel overrides: ``mc.kappa=2`` (under every run), ``mini.data.seed=1``,
``'method_overrides={NPO: {train: {steps: 80}}}'``. Uses the cached mini models (built on first use): the baseline
is the cell's ``unlearn_stage``, each run a ``polish_stage`` of a copy of it (continuing its method state, e.g.
PDU's λ), the attack the panel's first attacker (K20 LoRA-r8); prints one row per run after the baseline row.
"""

from __future__ import annotations

import argparse

from margincal.config.settings import resolve_mc, resolve_method
from margincal.core.terminal import quiet_libraries
from margincal.model.loading import clone_model
from margincal.pipeline.cell import panel_workspace
from margincal.pipeline.panel import method_override
from margincal.pipeline.stages import attack_stage, forget_retain_scores, polish_stage, reference_margin, unlearn_stage

MC_KEYS = {"lr": "train.lr", "steps": "train.steps", "kl": "kl_weight", "kappa": "kappa"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="NPO")
    parser.add_argument("--runs", nargs="+", default=["lr=1e-4"])
    parser.add_argument("overrides", nargs="*", help="demo panel overrides (key=value)")
    args = parser.parse_args(argv)
    quiet_libraries()
    plan, ws = panel_workspace("demo", [f"methods=[{args.method}]", *args.overrides])
    cfg, seed, settings, method = plan.cfg, plan.cell.seed, plan.eval, plan.cell.method
    m_ref = reference_margin(ws, settings)
    spec, attack = plan.attacks[0]

    def row(label, model):
        s = forget_retain_scores(model, ws, settings, m_ref)
        k = attack_stage(model, attack, ws, settings, m_ref)
        print(
            f"| {label} | {s['forget_rougeL']:.3f} | {s['retain_rougeL']:.3f} | {s['delta']:+.2f} | "
            f"{k['rouge_l']:.3f} |",
            flush=True,
        )

    n_forget = len(ws.train["forget"])
    base, res = unlearn_stage(plan.method, ws, seed)
    print(f"m_ref = {m_ref:+.3f}\n")
    print(f"| run | forget ROUGE-L | retain ROUGE-L | Δ | K{attack.k}-{spec.preset} |\n|---|---|---|---|---|")
    row(f"{method} baseline", base)
    for item in args.runs:
        kv = dict(pair.split("=", 1) for pair in item.split(",") if pair)
        mc_keys = [f"{MC_KEYS[k]}={v}" for k, v in kv.items() if k in MC_KEYS]
        mc = resolve_mc(kv.pop("variant", "reference"), cfg.scale, cfg.mc, mc_keys, seed)
        hparams = [f"hparams.{k}={v}" for k, v in kv.items() if k not in MC_KEYS]
        polish_run = resolve_method(method, cfg.scale, n_forget, method_override(cfg, method), hparams)
        polished, _ = polish_stage(clone_model(base), polish_run, mc, ws, m_ref, res.method_state)
        row(f"+MC {item}", polished)


if __name__ == "__main__":
    main()
