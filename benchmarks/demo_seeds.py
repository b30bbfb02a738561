"""The demo's numbers over several run seeds, with 95 % t-intervals (what Getting started quotes).

    .venv/bin/python benchmarks/demo_seeds.py [key=value ...]      # default seeds=[0,1,2] out=runs/demo-seeds

Runs the shipped demo panel with the given seeds (the mini benchmark and its models are shared; each seed reruns
unlearning, the MC polish and the attacks) and prints, per method, the mean and 95 % t-interval over seeds of
Δ = m − m_ref, F.agg, model utility and K20-LoRA held-out ROUGE-L for the baseline and its MC polish, plus θ_ref's
ROUGE-L floor; an interval of a metric with a range (F.agg, MU and ROUGE-L lie in [0, 1]) is clipped to it, and
says so. Writes every seed's values with the intervals and the machine to ``<out>.json`` beside the panel's folder
(numbers differ between CPU types).
"""

from __future__ import annotations

import json
import math
import statistics
import sys

from scipy import stats

from margincal.core.artifacts import atomic_write_json, cpu_name, git_commit
from margincal.pipeline.executors import run_panel
from margincal.pipeline.panel import load_panel

METRICS = {"Δ": ("summary", "delta"), "F.agg": ("summary", "F_agg"), "MU": ("summary", "model_utility")}
UNIT = (0.0, 1.0)
RANGES = {"Δ": (-math.inf, math.inf), "F.agg": UNIT, "MU": UNIT, "ROUGE-L": UNIT}  # what each metric can take


def interval(values: list[float], bounds: tuple[float, float]) -> dict:
    """The mean and the 95 % Student-t interval over seeds, clipped to ``bounds`` (``clipped``: whether it was)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci": None, "clipped": False}
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    low, high = max(mean - half, bounds[0]), min(mean + half, bounds[1])
    return {"mean": mean, "ci": [low, high], "clipped": (low, high) != (mean - half, mean + half)}


def shown(entry: dict) -> str:
    """``mean [low, high]``, a clipped end marked ``*``."""
    if entry["ci"] is None:
        return f"{entry['mean']:+.3f}"
    mark = "*" if entry["clipped"] else ""
    return f"{entry['mean']:+.3f} [{entry['ci'][0]:+.3f}, {entry['ci'][1]:+.3f}]{mark}"


def main(overrides: list[str]) -> None:
    cfg = load_panel("demo", ["seeds=[0,1,2]", "out=runs/demo-seeds", *overrides])
    summary = run_panel(cfg)
    cells = [
        json.loads((cfg.out_dir / "cells" / f"{c['id']}.json").read_text())
        for c in summary["cells"]
        if c["status"] == "done"
    ]
    attack = next(iter(cells[0]["models"]["theta0"]["attacks"]))
    print(f"\n{cfg.name}, seeds {cfg.seeds}, on {cpu_name()} (mean [95 % t-interval], * clipped to the metric's range)")
    first = (cfg.methods[0], cfg.variants[0])  # θ_ref's attack is the same in every cell of a seed: one cell each
    floor = [c["models"]["reference"]["attacks"][attack]["rouge_l"] for c in cells if _of(c) == first]
    record = {"panel": cfg.name, "seeds": list(cfg.seeds), "machine": cpu_name(), "commit": git_commit()}
    record |= {"attack": attack, "floor": {"values": floor, **interval(floor, RANGES["ROUGE-L"])}, "rows": {}}
    print(f"θ_ref {attack} ROUGE-L (the floor): {shown(record['floor'])}")
    for method in cfg.methods:
        for variant in cfg.variants:  # a seed's cells of one method share the baseline: take it from the first variant
            rows = [c for c in cells if _of(c) == (method, variant)]
            roles = ("baseline", "mc") if variant == cfg.variants[0] else ("mc",)
            for role in roles:
                label = (
                    method if role == "baseline" else f"{method}+MC" + ("" if variant == "reference" else f"_{variant}")
                )
                record["rows"][label] = _row(rows, role, attack)
                print(f"{label:<22} " + "   ".join(f"{name} {shown(e)}" for name, e in record["rows"][label].items()))
    path = cfg.out_dir.with_name(f"{cfg.out_dir.name}.json")  # beside the panel's folder, which holds its files only
    atomic_write_json(path, record)
    print(f"written to {path}")


def _of(cell: dict) -> tuple[str, str]:
    return cell["cell"]["method"], cell["cell"]["variant"]


def _row(cells: list[dict], role: str, attack: str) -> dict:
    """Every metric of ``role``'s model over the cells (one per seed): the values, mean and interval."""
    values = {name: [c["models"][role][a][b] for c in cells] for name, (a, b) in METRICS.items()}
    values["ROUGE-L"] = [c["models"][role]["attacks"][attack]["rouge_l"] for c in cells]
    return {name: {"values": v, **interval(v, RANGES[name])} for name, v in values.items()}


if __name__ == "__main__":
    main(sys.argv[1:])
