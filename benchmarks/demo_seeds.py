"""The demo's numbers over several run seeds, with 95 % t-intervals (what the README quotes).

    .venv/bin/python benchmarks/demo_seeds.py [key=value ...]      # default seeds=[0,1,2] out=runs/demo-seeds

Runs the shipped demo panel with the given seeds (the mini benchmark and its models are shared; each seed reruns
unlearning, the MC polish and the attacks) and prints, per method, the mean and 95 % t-interval over seeds of
Δ = m − m_ref, F.agg, model utility and K20-LoRA held-out ROUGE-L for the baseline and its MC polish, plus θ_ref's
ROUGE-L floor. Numbers differ between CPU types; the machine is printed with them.
"""

from __future__ import annotations

import json
import statistics
import sys

from scipy import stats

from margincal.core.artifacts import cpu_name
from margincal.pipeline.executors import run_panel
from margincal.pipeline.panel import load_panel

METRICS = {"Δ": ("summary", "delta"), "F.agg": ("summary", "F_agg"), "MU": ("summary", "model_utility")}


def interval(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def main(overrides: list[str]) -> None:
    cfg = load_panel("demo", ["seeds=[0,1,2]", "out=runs/demo-seeds", *overrides])
    summary = run_panel(cfg)
    cells = [
        json.loads((cfg.out_dir / "cells" / f"{c['id']}.json").read_text())
        for c in summary["cells"]
        if c["status"] == "done"
    ]
    attack = next(iter(cells[0]["models"]["theta0"]["attacks"]))
    print(f"\n{cfg.name}, seeds {cfg.seeds}, on {cpu_name()} (mean [95 % t-interval])")
    floor = [c["models"]["reference"]["attacks"][attack]["rouge_l"] for c in cells]
    print(f"θ_ref {attack} ROUGE-L (the floor): {interval(floor)}")
    for method in cfg.methods:
        rows = [c for c in cells if c["cell"]["method"] == method]
        for role in ("baseline", "mc"):
            values = {name: [c["models"][role][a][b] for c in rows] for name, (a, b) in METRICS.items()}
            values[f"{attack} ROUGE-L"] = [c["models"][role]["attacks"][attack]["rouge_l"] for c in rows]
            label = method if role == "baseline" else f"{method}+MC"
            print(f"{label:<12} " + "   ".join(f"{name} {interval(v)}" for name, v in values.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
