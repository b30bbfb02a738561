"""Run one panel cell through the store: every stage is a :mod:`margincal.stages` function, skipped when its key is
already stored.

Stages and their artifacts (``<store>/<stage>/<key>/``):

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
from collections.abc import Callable
from pathlib import Path

import torch

from margincal.artifacts import atomic_write_json
from margincal.checks import check_budgets
from margincal.data.records import encode_records
from margincal.pipeline.panel import Cell, CellPlan, PanelConfig, attack_specs, mc_config, method_spec
from margincal.stages import Workspace, attack_stage, evaluate_stage, polish_stage, unlearn_stage
from margincal.store import Store

N_EXAMPLES = 3  # held-out forget questions shown per cell in the report


@dataclasses.dataclass
class Checkpoint:
    """A model the stages can load: its identity (a model id or the key of the stage that made it) and loader."""

    role: str
    key: str
    load: Callable[[], torch.nn.Module]


def build_workspace(plan: CellPlan) -> Workspace:
    """Tokenizer, splits and θ0/θ_ref of the cell's (benchmark, model family, tier)."""
    from margincal.data.alpaca import sample_corpus
    from margincal.data.benchmarks import fill_split, load_benchmark_splits
    from margincal.data.tofu import load_split
    from margincal.models import load_tokenizer

    cfg, spec, tier, family = plan.cfg, plan.spec, plan.cell.tier, plan.family
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    resolved = family.resolve(tier)
    eval_splits = load_benchmark_splits(spec, tier, resolved.split)
    names = spec.train_splits
    train = {role: resolved.split(fill_split(name, spec, tier)) for role, name in names.items()
             if isinstance(name, str)}  # fmt: skip
    tokenizer = load_tokenizer(resolved.tokenizer, template=family.template)
    encoded = {role: encode_records(tokenizer, records, spec.max_length) for role, records in train.items()}
    # sampled corpora (probe D_a, ILU's environment): a seeded subset; the probe is kept disjoint from D_f ∪ D_r
    excluded = [r for role in ("forget", "retain") for r in (*train.get(role, ()), *eval_splits.get(role, ()))]
    corpora: dict[str, dict] = {}
    for role, entry in names.items():
        if isinstance(entry, dict):
            pool = load_split(entry["source"], entry["name"])
            encoded[role], corpora[role] = sample_corpus(
                tokenizer, pool, entry.get("n"), spec.max_length, excluded if role == "probe" else None
            )
    models = {"theta0": resolved.theta0, "ref": resolved.ref}
    return Workspace(tokenizer, spec, eval_splits, encoded, models, plan.dtype, device, family.load_options,
                     model_ids={"theta0": plan.theta0_id, "ref": plan.ref_id}, corpora=corpora)  # fmt: skip


_WORKSPACES: dict[str, Workspace] = {}


def workspace(plan: CellPlan) -> Workspace:
    """One workspace per (panel data, models, tier) and process (a Ray worker reuses it across its cells)."""
    key = json.dumps([plan.data_id, plan.theta0_id, plan.ref_id, plan.cfg.device, plan.dtype], sort_keys=True)
    if key not in _WORKSPACES:
        _WORKSPACES.clear()  # keep at most one family's frozen models in memory
        _WORKSPACES[key] = build_workspace(plan)
    ws = _WORKSPACES[key]
    ws.anchor_cache = plan.cfg.store_dir  # anchor margin tables under <store>/anchors
    return ws


def _read(path: Path, name: str) -> dict:
    return json.loads((path / name).read_text())


def run_cell(cfg: PanelConfig, cell: Cell) -> dict:
    """Run (or reuse) every stage of ``cell`` and return its record (also written to ``<out>/cells/<id>.json``)."""
    from margincal.methods.base import method_class
    from margincal.models import load_checkpoint, save_model

    plan = CellPlan(cfg, cell)
    keys = plan.keys()
    store = Store(cfg.store_dir)
    ws = workspace(plan)
    # before any compute: data on the hub is first read here (check_data covers local and generated data earlier)
    check_budgets([s.k for s in attack_specs(cfg)], len(ws.attack_examples), f"panel {cfg.name}")
    tok = ws.tokenizer
    sources: dict[str, str] = {}

    def stage(label: str, config: dict, build) -> Path:
        name, key = keys[label]
        path = store.run(name, key, config, build)
        sources[label] = str(path)
        return path

    def evaluate(ckpt: Checkpoint, reference: dict | None) -> dict:
        ref_key = None if reference is None else keys["reference/evaluate"][1]

        def build(tmp: Path) -> dict:
            result = evaluate_stage(ckpt.load(), ws, cfg.eval, reference)
            atomic_write_json(tmp / "eval.json", result)
            return {"summary": result["summary"]}

        path = stage(f"{ckpt.role}/evaluate", plan.evaluate_config(ckpt.key, ref_key), build)
        return _read(path, "eval.json")

    reference = Checkpoint("reference", plan.ref_id, lambda: ws.frozen("ref"))
    theta0 = Checkpoint("theta0", plan.theta0_id, lambda: ws.frozen("theta0"))
    ref_eval = evaluate(reference, None)
    m_ref = ref_eval["summary"]["m"]
    evals = {"reference": ref_eval, "theta0": evaluate(theta0, ref_eval)}
    run = method_spec(cfg, cell.method, len(ws.train["forget"]))

    def build_unlearn(tmp: Path) -> dict:
        model, result = unlearn_stage(run, ws, cell.seed)
        save_model(model, tok, tmp / "model")
        atomic_write_json(tmp / "history.json", result.history)
        atomic_write_json(tmp / "method.json", {"name": run.name, "hparams": run.hparams, "state": result.method_state})
        return {"steps": run.train.steps, "seconds": result.seconds}

    base_dir = stage("baseline/unlearn", plan.unlearn_config(), build_unlearn)
    baseline = Checkpoint("baseline", keys["baseline/unlearn"][1], lambda: ws.load(base_dir / "model"))
    evals["baseline"] = evaluate(baseline, ref_eval)

    def build_polish(tmp: Path) -> dict:
        state = _read(base_dir, "method.json")["state"]
        mc = mc_config(cfg, plan.variant, cell.seed)
        polished, result = polish_stage(baseline.load(), run, mc, ws, m_ref, state, merge=False)
        polished.save_pretrained(tmp / "model", safe_serialization=True)
        atomic_write_json(tmp / "history.json", result.history)
        return {"base": keys["baseline/unlearn"][1], "steps": len(result.history), "stopped_at": result.stopped_at,
                "seconds": result.seconds, "method_state_in": state}  # fmt: skip

    mc_dir = stage("mc/polish", plan.polish_config(), build_polish)
    mc = Checkpoint(
        "mc", keys["mc/polish"][1],
        lambda: load_checkpoint(mc_dir / "model", base_dir / "model", ws.dtype, ws.device, **ws.load_options),
    )  # fmt: skip
    evals["mc"] = evaluate(mc, ref_eval)

    attacks: dict[str, dict] = {role: {} for role in evals}
    attack_dirs: dict[str, dict[str, Path]] = {role: {} for role in evals}
    for ckpt in (reference, theta0, baseline, mc):
        loaded: list[torch.nn.Module] = []
        for spec in attack_specs(cfg):

            def build_attack(tmp: Path, ckpt=ckpt, spec=spec, loaded=loaded) -> dict:
                if not loaded:
                    loaded.append(ckpt.load())
                res = attack_stage(loaded[0], plan.attack(spec), ws, cfg.eval, m_ref)
                atomic_write_json(tmp / "attack.json", res)
                keep = ("rouge_l", "fact_recall", "diagnosis", "flips")
                return {k: res[k] for k in keep if k in res}

            label = f"{ckpt.role}/attack/{spec.label}"
            attack_dirs[ckpt.role][spec.label] = stage(
                label, plan.attack_config(ckpt.key, spec, keys["reference/evaluate"][1]), build_attack
            )
            info = store.meta(*keys[label])["info"]
            attacks[ckpt.role][spec.label] = {"attacker": spec.preset, "k": spec.k, **info}

    unlearn_info, polish_info = store.meta(*keys["baseline/unlearn"]), store.meta(*keys["mc/polish"])
    record = {
        "id": cell.id,
        "status": "done",
        "cell": dataclasses.asdict(cell),
        "family": method_class(cell.method).family,
        "m_ref": m_ref,
        "models": {
            role: {"summary": evals[role]["summary"], "attacks": attacks[role]}
            for role in ("reference", "theta0", "baseline", "mc")
        },
        "unlearn": {"seconds": unlearn_info["seconds"], **unlearn_info["info"]},
        "polish": {"seconds": polish_info["seconds"], **polish_info["info"]},
        "examples": _examples(evals, attack_dirs),
        "sources": sources,
        "corpora": ws.corpora,
    }
    atomic_write_json(cfg.out_dir / "cells" / f"{cell.id}.json", record)
    return record


def _examples(evals: dict[str, dict], attack_dirs: dict[str, dict[str, Path]]) -> list[dict]:
    """The first held-out forget questions of the first attacker: gold answer, each model's greedy answer, and its
    answer after that attack (every model is attacked on the same seeded D_rel, so the held-out rows line up)."""
    if not attack_dirs["theta0"]:
        return []
    label = next(iter(attack_dirs["theta0"]))
    attacked = {role: _read(dirs[label], "attack.json") for role, dirs in attack_dirs.items()}
    held = attacked["theta0"]["heldout"][:N_EXAMPLES]
    out = []
    for j, i in enumerate(held):
        sample = evals["theta0"]["splits"]["forget"]["samples"][i]
        row = {"question": sample["question"], "gold": sample["gold"], "attack": label, "answers": {}}
        for role in evals:
            row["answers"][role] = {"before": evals[role]["splits"]["forget"]["samples"][i]["generated"],
                                    "attacked": attacked[role]["samples"][j]["generated"]}  # fmt: skip
        out.append(row)
    return out


def panel_workspace(panel: str = "demo", overrides: list[str] | None = None) -> tuple[PanelConfig, CellPlan, Workspace]:
    """The workspace of a panel's first cell (benchmark scripts: sweeps over one benchmark and model family)."""
    from margincal.pipeline.panel import expand_cells, load_panel

    cfg = load_panel(panel, overrides)
    plan = CellPlan(cfg, expand_cells(cfg)[0])
    return cfg, plan, workspace(plan)
