"""The paper's premises, measured on a panel's benchmark before any MC or relearn result is read.

    .venv/bin/python benchmarks/premises.py --panel testbed --out results/testbed [key=value ...]

Writes ``premises.json`` and ``premises.md`` under ``--out`` (default ``runs/premises/<panel>``):

* ``n_forget``, ``k20_fraction`` (20 / |D_f|), ``epsilon`` (forget/retain word-bigram overlap of the training
  splits), ``m_ref`` and θ0 / θ_ref's forget and retain ROUGE-L and forget fact recall;
* per method, the baseline as the panel trains it (its ``method_overrides``, e.g. the plateau rule): the cell's
  own unlearn stage, run through the panel's store (or read from it; a panel run after this reads it there):
  ``steps``, whether the plateau rule stopped it before the step cap (``plateau``) or the cap did, the last
  epoch's mean ``native_loss`` and pre-clipping ``native_grad_norm``, ``delta``, ``log_odds``, ``certified``
  (ℓ > m_ref), ``retain_rougeL``, ``forget_rougeL`` and ``forget_fact_recall``;
* ``kl_probe``: one MC polish (the panel's reference-anchored configuration) of the ``--kl-base`` baseline at
  λ_KL = 0 and at the configured λ_KL: probe KL(θ_ref ‖ θ) before and after, retain ROUGE-L and Δ.

Every stage is the pipeline's own (the graph's unlearn node, ``polish_stage``, ``forget_retain_scores``); seeded by
the panel's first seed. No relearn attack runs here. ``premises.json`` is rewritten after every method with
``"complete": false`` (a run stopped by a time limit keeps what it measured), and with ``true`` at the end;
``seconds`` holds the workspace's (the models built or read) and each stage's wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from margincal.config.settings import MethodRun
from margincal.core.artifacts import atomic_write_json, atomic_write_text, manifest
from margincal.core.terminal import quiet_libraries
from margincal.data.benchmarks import fill_split
from margincal.model.loading import clone_model, load_model
from margincal.model.margin import overlap_epsilon
from margincal.model.scoring import dataset_kl
from margincal.pipeline.cell import panel_workspace
from margincal.pipeline.graph import GraphRun
from margincal.pipeline.panel import method_names
from margincal.pipeline.plan import CellPlan, plan_panel
from margincal.pipeline.stages import Workspace, forget_retain_scores, polish_stage, reference_margin
from margincal.store.stage_store import Store
from margincal.training.unlearning import epoch_steps


def _qa_texts(records) -> list[str]:
    return [f"{r.question} {r.answer}" for r in records]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--panel", default="testbed", help="shipped panel name or YAML path (default: testbed)")
    parser.add_argument("--methods", nargs="+", help="methods to train (default: the panel's)")
    parser.add_argument("--kl-base", default="NPO", help="the baseline polished at λ_KL = 0 and the configured λ_KL")
    parser.add_argument("--out", help="output directory (default runs/premises/<panel>)")
    parser.add_argument("overrides", nargs="*", help="panel overrides (key=value)")
    args = parser.parse_args(argv)
    if args.methods and args.kl_base not in args.methods:
        parser.error(f"--kl-base {args.kl_base} is polished from its baseline: name it in --methods too")
    quiet_libraries()
    start = time.perf_counter()
    plan, ws = panel_workspace(args.panel, args.overrides)
    cfg = plan.cfg
    names = args.methods or method_names(cfg)
    if args.kl_base not in names:
        parser.error(f"--kl-base {args.kl_base} is not among the panel's methods ({', '.join(names)})")
    out = Path(args.out or f"runs/premises/{cfg.name}")
    out.mkdir(parents=True, exist_ok=True)
    workspace_seconds = time.perf_counter() - start
    seed, settings, tier = plan.cell.seed, plan.eval, plan.cell.tier
    split = plan.family.local_splits()
    roles = ("forget", "retain")
    train_records = {role: split(fill_split(plan.spec.train_splits[role], plan.spec, tier)) for role in roles}
    n_forget = len(ws.train["forget"])
    m_ref = reference_margin(ws, settings)

    def scores(model) -> dict:
        return forget_retain_scores(model, ws, settings, m_ref)

    result: dict = {
        "panel": cfg.name,
        "tier": tier,
        "seed": seed,
        "n_forget": n_forget,
        "n_retain": len(ws.train["retain"]),
        "k20_fraction": 20 / n_forget,
        "epsilon": overlap_epsilon(_qa_texts(train_records["forget"]), _qa_texts(train_records["retain"])),
        "m_ref": m_ref,
        "models": {"theta0": scores(ws.frozen("theta0")), "ref": scores(ws.frozen("ref"))},
        "methods": {},
        "complete": False,
        "seconds": {
            "workspace": workspace_seconds,
            "reference_scores": time.perf_counter() - start - workspace_seconds,
        },
    }
    _print_header(result)
    store = Store(cfg.store_dir)
    plans: dict[str, CellPlan] = {}
    for cell_plan in plan_panel(cfg):  # a method's first cell at the seed: its unlearn node is every variant's
        if cell_plan.cell.seed == seed:
            plans.setdefault(cell_plan.cell.method, cell_plan)
    for name in names:
        start = time.perf_counter()
        stage, run = _baseline(plans[name], ws, store)
        history = json.loads((stage / "history.json").read_text())
        last = history[-epoch_steps(n_forget, run.train) :]
        model = load_model(stage / "model", ws.dtype, ws.device, **ws.load_options)
        row = {
            "steps": len(history),
            "cap": run.train.steps,
            "plateau": len(history) < run.train.steps,
            "native_loss": statistics.fmean(r["loss"] for r in last),
            "native_grad_norm": statistics.fmean(r["grad_norm"] for r in last),
            **scores(model),
            "seconds": time.perf_counter() - start,
        }
        result["methods"][run.name] = row
        if run.name == args.kl_base:  # the baseline the KL probe polishes, kept loaded
            base, kl_run, state = model, run, json.loads((stage / "method.json").read_text())["state"]
        print(_method_line(run.name, row), flush=True)
        atomic_write_json(out / "premises.json", result)

    mc = plan.mc
    probe, pad, ref = ws.train["probe"], ws.tokenizer.pad_token_id, ws.frozen("ref")
    kl_probe = {
        "base": kl_run.name,
        "probe_n": len(probe),
        "probe_kl_base": dataset_kl(ref, base, probe, pad),
        "probe_kl_theta0": dataset_kl(ref, ws.frozen("theta0"), probe, pad),
        "mc": dataclasses.asdict(mc),
        "polish": {},
    }
    probe_start = time.perf_counter()
    for weight in (0.0, mc.kl_weight):
        weighted = dataclasses.replace(mc, kl_weight=weight)
        polished, _ = polish_stage(clone_model(base), kl_run, weighted, ws, m_ref, state)
        kl_probe["polish"][str(weight)] = {"probe_kl": dataset_kl(ref, polished, probe, pad), **scores(polished)}
        print(f"MC polish of {kl_run.name} at λ_KL = {weight}: {kl_probe['polish'][str(weight)]}", flush=True)
    result["kl_probe"] = kl_probe
    result["seconds"]["kl_probe"] = time.perf_counter() - probe_start
    result["manifest"] = manifest({"panel": dataclasses.asdict(cfg), "args": vars(args)}, seed)
    result["complete"] = True
    atomic_write_json(out / "premises.json", result)
    atomic_write_text(out / "premises.md", _markdown(result))
    print(f"written to {out}/premises.json and premises.md")


def _baseline(plan: CellPlan, ws: Workspace, store: Store) -> tuple[Path, MethodRun]:
    """The cell's baseline as its panel trains it: the graph's unlearn node run through the store (or read from it:
    the panel then reuses it), after θ_ref's evaluation where the method's monitors read it; (its stored directory,
    the method run)."""
    graph = GraphRun(plan.graph, ws, store)
    node = plan.graph.node("baseline/unlearn")
    for label in node.inputs:
        graph.execute(plan.graph.node(label))
    return graph.execute(node), node.spec


def _print_header(r: dict) -> None:
    print(f"|D_f| = {r['n_forget']} (K20 = {r['k20_fraction']:.1%}), ε = {r['epsilon']:.3f}, m_ref = {r['m_ref']:+.3f}")
    for name, row in r["models"].items():
        print(f"{name}: {row}")


def _method_line(name: str, row: dict) -> str:
    stop = "plateau" if row["plateau"] else "cap"
    return (
        f"| {name} | {row['steps']} ({stop}) | {row['native_loss']:.4g} | {row['native_grad_norm']:.3g} | "
        f"{row['delta']:+.2f} | {row['log_odds']:+.2f} | {'yes' if row['certified'] else 'no'} | "
        f"{row['forget_rougeL']:.3f} | {row.get('forget_fact_recall', float('nan')):.3f} | "
        f"{row['retain_rougeL']:.3f} |"
    )


def _markdown(r: dict) -> str:
    m = r["manifest"]
    lines = [
        f"# Premises of the `{r['panel']}` benchmark ({r['tier']}, seed {r['seed']})",
        "",
        f"Measured by `{m['command']}` at commit {m['git_commit']} on {m['machine']}.",
        "",
        f"- |D_f| = {r['n_forget']}, |D_r| = {r['n_retain']}: K20 is {r['k20_fraction']:.1%} of D_f.",
        f"- Forget/retain word-bigram overlap ε = {r['epsilon']:.3f} (TOFU forget10: 0.44).",
        f"- m_ref = {r['m_ref']:+.3f}.",
        "",
        "| model | Δ | ℓ | forget ROUGE-L | forget fact recall | retain ROUGE-L |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in r["models"].items():
        lines.append(
            f"| {name} | {row['delta']:+.2f} | {row['log_odds']:+.2f} | {row['forget_rougeL']:.3f} | "
            f"{row.get('forget_fact_recall', float('nan')):.3f} | {row['retain_rougeL']:.3f} |"
        )
    lines += [
        "",
        "Baselines as the panel trains them (plateau: stopped by the native-loss rule; cap: the step cap):",
        "",
        "| method | steps | native loss | grad norm | Δ | ℓ | certified | forget ROUGE-L | fact recall | "
        "retain ROUGE-L |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_method_line(name, row) for name, row in r["methods"].items()]
    k = r["kl_probe"]
    lines += [
        "",
        f"KL probe: MC polish of {k['base']} (probe n = {k['probe_n']}); KL(θ_ref ‖ θ0) on the probe = "
        f"{k['probe_kl_theta0']:.4f}, KL(θ_ref ‖ θ̂) = {k['probe_kl_base']:.4f}.",
        "",
        "| λ_KL | probe KL | Δ | retain ROUGE-L | forget ROUGE-L |",
        "|---|---|---|---|---|",
    ]
    for weight, row in k["polish"].items():
        lines.append(
            f"| {weight} | {row['probe_kl']:.4f} | {row['delta']:+.2f} | {row['retain_rougeL']:.3f} | "
            f"{row['forget_rougeL']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
