"""The derived numbers of a results write-up (results/testbed/README.md, results/mini/README.md) that no
report table prints.

    .venv/bin/python benchmarks/results_summary.py [--results results/testbed | results/mini]

Reads the cell records the reports copied (``<results>/{head2head,deploy,ablations,ksweep}/cells/*.json``) and
prints: the premise counts of ``<results>/premises.json`` where there is one (Δ > 0 at the plateau, certified, the
whole premise row), crossing counts, panel means of K20-LoRA ROUGE-L / fact recall / MU, θ_ref's floor and θ0's
ceiling, the cells at or below the same-seed floor, MC's K20-LoRA change with its interval over seeds and over
methods and its per-method spread, the methods whose deployment MC beats their baseline (seed means), the Δ of the
core ablation variants on NPO and CRNPO, the bridge without GradAscent and GradDiff (a check made after the figure
was read), and the K-sweep panel means per K. Everything else in the write-up is in the reports.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

from margincal.results.stats import correlation, mean_interval

K20 = "lora_r8@20"


def cells(results: Path, panel: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((results / panel / "cells").glob("*.json"))]


def k20(model: dict, key: str = "rouge_l") -> float:
    return model["attacks"][K20][key]


def head_to_head(recs: list[dict]) -> None:
    floor = {r["cell"]["seed"]: k20(r["models"]["reference"]) for r in recs}
    ceiling = {r["cell"]["seed"]: k20(r["models"]["theta0"]) for r in recs}
    per_seed = ", ".join(f"{v:.3f}" for _, v in sorted(floor.items()))
    print(
        f"head2head: {len(recs)} cells; θ_ref K20 floor {statistics.mean(floor.values()):.3f} (per seed {per_seed}); "
        f"θ0 ceiling {statistics.mean(ceiling.values()):.3f}"
    )
    for role in ("baseline", "mc"):
        models = [r["models"][role] for r in recs]
        crossed = sum(m["summary"]["delta"] <= 0 for m in models)
        below = sorted(
            (r["cell"]["method"], r["cell"]["seed"]) for r in recs if k20(r["models"][role]) <= floor[r["cell"]["seed"]]
        )
        print(
            f"  {role}: crossed (Δ ≤ 0) {crossed}/{len(recs)}; K20 {statistics.mean(k20(m) for m in models):.3f}, "
            f"facts {statistics.mean(k20(m, 'fact_recall') for m in models):.3f}, "
            f"MU {statistics.mean(m['summary']['model_utility'] for m in models):.3f}; "
            f"at or below the same-seed floor {len(below)}: {below}"
        )


MEMORISED = 0.9  # P1: θ0's forget ROUGE-L at least this (configs/panels/testbed.yaml's rule; testbed-gpu's PLAN)
PROBE_DROP = 0.05  # P3: the configured λ_KL lowers the probe KL by at least this share of its value at λ_KL = 0
KEPT = 0.9  # retain kept: retain ROUGE-L at least this


def premise_reading(premises: dict) -> dict:
    """The premises read from ``premises.json`` (``benchmarks/premises.py``), the one reading the write-ups and the
    GPU testbed's plan use: P1 (θ0 memorises: forget ROUGE-L ≥ :data:`MEMORISED`), P2 per method (``above``: Δ > 0
    at its plateau, stopped by the plateau rule before the step cap; ``certified``: ℓ > m_ref; ``kept``: above and
    retain ROUGE-L ≥ :data:`KEPT`; ``row``: all three; ``capped``: stopped by the cap), P3 (the KL probe works: the
    probe KL after a polish at the configured λ_KL is at least :data:`PROBE_DROP` below that at λ_KL = 0; the drop
    is ``p3_drop``). Method lists are sorted; a premise not measured (a run cut short) is None."""
    methods = premises.get("methods", {})
    above = sorted(m for m, v in methods.items() if v["delta"] > 0 and v["plateau"])
    certified = sorted(m for m, v in methods.items() if v["certified"])
    kept = [m for m in above if methods[m]["retain_rougeL"] >= KEPT]
    probe = premises.get("kl_probe", {}).get("polish", {})
    p3 = drop = None
    if len(probe) == 2:
        at_zero, at_weight = (probe[k]["probe_kl"] for k in sorted(probe, key=float))
        drop = 1 - at_weight / at_zero
        p3 = drop >= PROBE_DROP
    return {
        "p1": premises["models"]["theta0"]["forget_rougeL"] >= MEMORISED if "models" in premises else None,
        "methods": len(methods),
        "capped": sorted(m for m, v in methods.items() if not v["plateau"]),
        "above": above,
        "certified": certified,
        "kept": kept,
        "row": [m for m in kept if m in certified],
        "p3": p3,
        "p3_drop": drop,
    }


def premises(results: Path) -> None:
    """The cliff-at-the-plateau premise read three ways from premises.json (:func:`premise_reading`): Δ > 0 at the
    plateau, certified (ℓ > m_ref), and the whole premise row (Δ > 0, ℓ > m_ref and retain ROUGE-L ≥ 0.9)."""
    path = results / "premises.json"
    if not path.exists():
        return
    r = premise_reading(json.loads(path.read_text()))
    above, certified, row = r["above"], r["certified"], r["row"]
    print(
        f"premises: Δ > 0 at the plateau {len(above)}/{r['methods']} {above}; certified (ℓ > m_ref) "
        f"{len(certified)} {certified}; Δ > 0, ℓ > m_ref and retain ≥ 0.9 {len(row)} {row}"
    )


def k20_change(recs: list[dict]) -> None:
    """MC − baseline in K20-LoRA ROUGE-L: the mean over methods with its Student-t interval over seeds (the reports'
    "mean over methods") and over the methods' seed means, and per method (over seeds) how many are lower, how many
    intervals lie below 0 and which methods go the wrong way."""
    change = defaultdict(dict)
    for r in recs:
        change[r["cell"]["method"]][r["cell"]["seed"]] = k20(r["models"]["mc"]) - k20(r["models"]["baseline"])
    seeds = sorted({s for v in change.values() for s in v})
    over_seeds = mean_interval([statistics.mean(v[s] for v in change.values()) for s in seeds])
    per_method = {m: mean_interval(list(v.values())) for m, v in change.items()}
    over_methods = mean_interval([i.mean for i in per_method.values()])
    shown = sorted(m for m, i in per_method.items() if i.high < 0)
    wrong = sorted((m for m, i in per_method.items() if i.mean > 0), key=lambda m: -per_method[m].mean)
    print(
        f"head2head K20-LoRA MC − baseline: {over_seeds} over {len(seeds)} seeds; {over_methods} over "
        f"{len(per_method)} methods; lower for {sum(i.mean < 0 for i in per_method.values())}/{len(per_method)}; "
        f"interval below 0 for {len(shown)} {shown}; the wrong way for {len(wrong)}: "
        + ", ".join(f"{m} {per_method[m].mean:+.3f}" for m in wrong)
    )


def deployment(recs: list[dict]) -> None:
    runs = defaultdict(lambda: defaultdict(list))
    for r in recs:
        runs[r["cell"]["variant"]][r["cell"]["method"]].append((k20(r["models"]["baseline"]), k20(r["models"]["mc"])))
    for variant, methods in runs.items():
        better = sorted(
            m for m, v in methods.items() if statistics.mean(c for _, c in v) < statistics.mean(b for b, _ in v)
        )
        print(f"deploy/{variant}: MC K20 below baseline (seed means) for {len(better)}/{len(methods)}: {better}")


def ablations(recs: list[dict]) -> None:
    runs = defaultdict(list)
    for r in recs:
        runs[r["cell"]["method"], r["cell"]["variant"]].append(
            (r["models"]["baseline"]["summary"]["delta"], r["models"]["mc"]["summary"]["delta"])
        )
    for method in ("NPO", "CRNPO"):
        parts = [
            f"{v} {statistics.mean(m for _, m in runs[method, v]):+.2f}"
            for v in ("reference", "forget_only", "two_sided")
            if runs[method, v]
        ]
        base = statistics.mean(b for b, _ in runs[method, "reference"])
        print(f"ablations/{method}: baseline Δ {base:+.2f}; MC Δ {', '.join(parts)}")


def bridge(results: Path) -> None:
    rows = [r for r in _csv(results / "head2head" / "bridge.csv") if r["method"] not in ("GradAscent", "GradDiff")]
    x, y = [float(r["delta"]) for r in rows], [float(r["rouge_l"]) for r in rows]
    print(f"bridge without GradAscent and GradDiff: {correlation(x, y, 'pearson')}; {correlation(x, y, 'spearman')}")


def ksweep(recs: list[dict]) -> None:
    labels = sorted(recs[0]["models"]["mc"]["attacks"], key=lambda lab: int(lab.rsplit("@", 1)[1]))
    for lab in labels:
        b = statistics.mean(r["models"]["baseline"]["attacks"][lab]["rouge_l"] for r in recs)
        m = [r["models"]["mc"]["attacks"][lab]["rouge_l"] for r in recs]
        print(f"ksweep {lab}: baseline {b:.3f}, MC {statistics.mean(m):.3f} (max {max(m):.3f})")


def _csv(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results/testbed"))
    args = parser.parse_args(argv)
    premises(args.results)
    head_to_head(cells(args.results, "head2head"))
    k20_change(cells(args.results, "head2head"))
    deployment(cells(args.results, "deploy"))
    ablations(cells(args.results, "ablations"))
    bridge(args.results)
    ksweep(cells(args.results, "ksweep"))


if __name__ == "__main__":
    main()
