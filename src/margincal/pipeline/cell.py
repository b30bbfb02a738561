"""Run one planned cell through the store (:func:`margincal.pipeline.graph.run_graph`: each stage node skipped when
its key is already stored) and write its record.

Stages and their artifacts (``<store>/<stage>/<key>/``, written by the writers of :mod:`margincal.pipeline.stages`, the
same files a single-stage CLI command writes):

* ``evaluate``: ``eval.json`` (all metrics of the benchmark with samples; the summary is also in ``stage.json``).
  The margin diagnostic (m, Δ, ℓ, certificate) is part of it: one scoring pass per split feeds every metric.
* ``unlearn``: ``model/`` (safetensors), ``history.json`` and ``method.json`` (name, hyperparameters and the
  carried state the polish continues from, e.g. PDU's λ).
* ``polish``: ``model/`` (the LoRA adapter, or full weights when the variant trains without LoRA) and
  ``history.json``; anchor margin tables are cached under ``<store>/anchors``.
* ``attack``: ``attack.json`` (held-out ROUGE-L, diagnosis, margin flips, samples); the attacked model is not kept.

The cell record (``<out>/cells/<cell id>.json``) holds the summaries the report needs, a few example generations
and the store path of every number's source.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from margincal.core.artifacts import atomic_write_json
from margincal.core.errors import InputError
from margincal.data.benchmarks import data_identity, fill_split, load_benchmark_splits
from margincal.data.checks import check_budgets
from margincal.methods.base import get_method
from margincal.model.loading import resolve_device
from margincal.pipeline.graph import run_graph
from margincal.pipeline.panel import expand_cells, load_panel
from margincal.pipeline.plan import CellPlan, plan_cell
from margincal.pipeline.stages import Workspace, build_workspace
from margincal.reporting.records import ROLES, SCHEMA, check_record
from margincal.store.costs import summed
from margincal.store.stage_store import Store

N_EXAMPLES = 3  # held-out forget questions shown per cell in the report


def cell_workspace(plan: CellPlan) -> Workspace:
    """Tokenizer, splits and θ0/θ_ref of the cell's (benchmark, model family, tier), by the one workspace builder."""
    spec, tier, family = plan.spec, plan.cell.tier, plan.family
    resolved = family.resolve(tier, resolve_device(plan.device))
    train = {
        role: resolved.split(fill_split(name, spec, tier))
        for role, name in spec.train_splits.items()
        if isinstance(name, str)
    }
    corpora = {role: entry for role, entry in spec.train_splits.items() if isinstance(entry, dict)}
    ws = build_workspace(
        resolved.theta0,
        spec,
        load_benchmark_splits(spec, tier, resolved.split),
        train,
        corpora=corpora,
        models={"theta0": resolved.theta0, "ref": resolved.ref},
        model_ids={"theta0": plan.theta0_id, "ref": plan.ref_id},
        tokenizer=resolved.tokenizer,
        template=family.template,
        dtype=plan.dtype,
        device=plan.device,
        load_options=family.load_options,
    )
    evaluation = plan.data_id["eval"]
    if (
        "splits" in evaluation
        and data_identity(ws.benchmark, tier, evaluation["template"], ws.eval_splits) != evaluation
    ):
        raise InputError(
            f"{family.name} {tier}: the evaluation data changed since the panel was planned; plan it again"
        )
    if ws.benchmark != spec:
        raise InputError(
            f"{family.name}: the workspace's benchmark settings differ from the plan's "
            f"(max_length {ws.benchmark.max_length} vs {spec.max_length})"
        )
    if plan.n_forget is not None and len(ws.train["forget"]) != plan.n_forget:
        raise InputError(
            f"{family.name} {tier}: the plan resolved the schedule for |D_f| = {plan.n_forget}, the "
            f"data has {len(ws.train['forget'])} training forget examples"
        )
    return ws


_WORKSPACES: dict[str, Workspace] = {}


def workspace(plan: CellPlan) -> Workspace:
    """One workspace per (panel data, models, tier) and process (a Ray worker reuses it across its cells)."""
    key = json.dumps([plan.data_id, plan.theta0_id, plan.ref_id, plan.device, plan.dtype], sort_keys=True)
    if key not in _WORKSPACES:
        _WORKSPACES.clear()  # keep at most one family's frozen models in memory
        _WORKSPACES[key] = cell_workspace(plan)
    ws = _WORKSPACES[key]
    ws.anchor_cache = plan.cfg.store_dir  # anchor margin tables under <store>/anchors
    return ws


def run_cell(plan: CellPlan) -> dict:
    """Run (or reuse) every stage node of ``plan`` and return the cell record (also written to
    ``<out>/cells/<id>.json``)."""
    cfg, cell = plan.cfg, plan.cell
    store = Store(cfg.store_dir)
    ws = workspace(plan)
    # before any compute: data on the hub is first read here (plan.check_data covers local and generated data)
    budgets, where = [a.k for _, a in plan.attacks], f"panel {cfg.name}"
    if ws.benchmark.relearn_from == "corpus":  # D_rel: forget-corpus chunks; every question is scored
        check_budgets(budgets, len(ws.train["forget"]), where, corpus=True)
    else:
        check_budgets(budgets, len(ws.attack_examples), where)
    run = run_graph(plan.graph, ws, store, report_to=cfg.report_to)
    info = {n.label: store.meta(n.kind, n.key) for n in plan.graph.nodes}
    evals = {role: run.read(f"{role}/evaluate", "eval.json") for role in ROLES}
    attacks = {
        role: {
            spec.label: {"attacker": spec.preset, "k": spec.k, **info[f"{role}/attack/{spec.label}"]["info"]}
            for spec, _ in plan.attacks
        }
        for role in ROLES
    }
    unlearn_info, polish_info = info["baseline/unlearn"], info["mc/polish"]
    record = {
        "schema": SCHEMA,
        "id": cell.id,
        "status": "done",
        "cell": dataclasses.asdict(cell),
        "family": get_method(plan.method.name, **plan.method.hparams).family,  # a defense's follows its base
        "m_ref": evals["reference"]["summary"]["m"],
        "models": {role: {"summary": evals[role]["summary"], "attacks": attacks[role]} for role in ROLES},
        "unlearn": {"seconds": unlearn_info["seconds"], **unlearn_info["info"]},
        "polish": {"seconds": polish_info["seconds"], **polish_info["info"]},
        "examples": _examples(
            evals,
            {
                role: {spec.label: run.paths[f"{role}/attack/{spec.label}"] for spec, _ in plan.attacks}
                for role in ROLES
            },
        ),
        "sources": {label: str(path) for label, path in run.paths.items()},
        "corpora": ws.corpora,
        "cost": cell_cost(plan.graph.nodes, info),
    }
    check_record(record, cell.id)  # written as the report reads it (reporting.records), or the cell fails here
    atomic_write_json(cfg.out_dir / "cells" / f"{cell.id}.json", record)
    return record


def cell_cost(nodes, info: dict[str, dict]) -> dict:
    """What the cell's own stages cost when they ran (:func:`margincal.store.costs.summed`): unlearn, polish, and the
    baseline's and the MC model's evaluations and attacks (θ_ref's and θ0's are shared by every cell of the family
    and tier, so they are left out); with the unlearning's tokens/s and ``without_cost``, the count of stages stored
    before costs were recorded."""
    own = [node for node in nodes if node.role in ("baseline", "mc")]
    costs = [(node.kind, info[node.label]["cost"]) for node in own if info[node.label].get("cost")]
    unlearn = info["baseline/unlearn"].get("cost") or {}
    return {
        **summed(costs),
        "unlearn_tokens_per_s": unlearn.get("tokens_per_s"),
        "without_cost": len(own) - len(costs),
    }


def _examples(evals: dict[str, dict], attack_dirs: dict[str, dict[str, Path]]) -> list[dict]:
    """The first held-out forget questions of the first attacker: gold answer, each model's greedy answer, and its
    answer after that attack (every model is attacked on the same seeded D_rel, so the held-out rows line up)."""
    if not attack_dirs["theta0"]:
        return []
    label = next(iter(attack_dirs["theta0"]))
    attacked = {role: json.loads((dirs[label] / "attack.json").read_text()) for role, dirs in attack_dirs.items()}
    held = attacked["theta0"]["heldout"][:N_EXAMPLES]
    out = []
    for j, i in enumerate(held):
        sample = evals["theta0"]["splits"]["forget"]["samples"][i]
        row = {"question": sample["question"], "gold": sample["gold"], "attack": label, "answers": {}}
        for role in evals:
            row["answers"][role] = {
                "before": evals[role]["splits"]["forget"]["samples"][i]["generated"],
                "attacked": attacked[role]["samples"][j]["generated"],
            }
        out.append(row)
    return out


def panel_workspace(panel: str = "demo", overrides: list[str] | None = None) -> tuple[CellPlan, Workspace]:
    """The plan and workspace of a panel's first cell (benchmark scripts: sweeps over one benchmark and family)."""
    cfg = load_panel(panel, overrides)
    plan = plan_cell(cfg, expand_cells(cfg)[0])
    return plan, workspace(plan)
