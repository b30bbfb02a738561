"""Run one panel cell through the store: every stage is skipped when its key is already stored.

Stages and their artifacts (``<store>/<stage>/<key>/``):

* ``evaluate``: ``eval.json`` (all metrics of the benchmark with samples; the summary is also in ``stage.json``).
  The margin diagnostic (m, Δ, ℓ, certificate) is part of it: one scoring pass per split feeds every metric.
* ``unlearn``: ``model/`` (safetensors) and ``history.json``.
* ``polish``: ``model/`` (the LoRA adapter, or full weights when the variant trains without LoRA) and
  ``history.json``; anchor margin tables are cached under ``<store>/anchors``.
* ``attack``: ``attack.json`` (held-out ROUGE-L, diagnosis, margin flips, samples); the attacked model is not kept.

The cell record (``<out>/cells/<cell id>.json``) holds the summaries the report needs and the store path of every
number's source.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch

from margincal.data.records import EncodedQA, encode_qa
from margincal.pipeline.panel import Cell, CellPlan, PanelConfig, attack_specs, method_override
from margincal.pipeline.store import Store, atomic_write_json


@dataclasses.dataclass
class Checkpoint:
    """A model the stages can load: its identity (a model id or the key of the stage that made it) and loader."""

    role: str
    key: str
    load: Callable[[], torch.nn.Module]


class Workspace:
    """Tokenizer, splits and the frozen θ0/θ_ref of one (benchmark, model family, tier), loaded once per process."""

    def __init__(self, plan: CellPlan):
        from margincal.data.alpaca import sample_corpus
        from margincal.data.records import encode_records
        from margincal.data.tofu import load_split
        from margincal.evaluate import fill_split, load_benchmark_splits
        from margincal.models import load_tokenizer

        cfg, spec, tier = plan.cfg, plan.spec, plan.cell.tier
        self.spec, self.dtype = spec, plan.dtype
        self.load_options = {k: plan.model[k] for k in ("attn_implementation", "device_map") if k in plan.model}
        self.device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        names = spec["train_splits"]
        if plan.model["kind"] == "mini":
            from margincal.data.mini import generate
            from margincal.pipeline.mini_models import build_mini_models

            bench = generate(cfg.mini.data)
            cache = Path(cfg.cache_dir) if cfg.cache_dir else None
            paths = build_mini_models(bench, cfg.mini, tiers=(tier,), cache_dir=cache)
            self.theta0_path, self.ref_path, tok_path = str(paths.theta0), str(paths.ref(tier)), paths.tokenizer
            self.eval_splits, _ = load_benchmark_splits(spec, tier, None, bench)
            train = {role: bench.split(fill_split(name, spec, tier)) for role, name in names.items()}
        else:
            self.theta0_path, self.ref_path, tok_path = plan.theta0_id, plan.ref_id, plan.theta0_id
            self.eval_splits, _ = load_benchmark_splits(spec, tier, cfg.data)
            source = cfg.data or spec.get("source")
            train = {role: load_split(source, fill_split(entry, spec, tier)) for role, entry in names.items()
                     if isinstance(entry, str)}  # fmt: skip
        self.tokenizer = load_tokenizer(tok_path, template=plan.model.get("template"))
        max_length = spec["max_length"]
        self.train: dict[str, list[EncodedQA]] = {
            role: encode_records(self.tokenizer, records, max_length) for role, records in train.items()
        }
        # sampled corpora (probe D_a, ILU's environment): a seeded subset; the probe is kept disjoint from D_f ∪ D_r
        excluded = [r for role in ("forget", "retain") for r in (*train.get(role, ()), *self.eval_splits.get(role, ()))]
        self.corpora: dict[str, dict] = {}
        for role, entry in names.items():
            if isinstance(entry, dict):
                pool = load_split(entry["source"], entry["name"])
                self.train[role], self.corpora[role] = sample_corpus(
                    self.tokenizer, pool, entry.get("n"), max_length, excluded if role == "probe" else None
                )
        self.attack_forget = encode_qa(self.tokenizer, self.eval_splits["forget"], max_length)
        self.attack_answers = [r.answer for r in self.eval_splits["forget"]]
        self._frozen: dict[str, torch.nn.Module] = {}

    def load(self, path: str) -> torch.nn.Module:
        from margincal.models import load_model

        return load_model(path, self.dtype, self.device, **self.load_options)

    def frozen(self, which: str) -> torch.nn.Module:
        """θ0 or θ_ref, loaded once and shared read-only by every stage of this process."""
        if which not in self._frozen:
            self._frozen[which] = self.load(self.theta0_path if which == "theta0" else self.ref_path)
        return self._frozen[which]


_WORKSPACES: dict[str, Workspace] = {}


def workspace(plan: CellPlan) -> Workspace:
    """One workspace per (panel data, models, tier) and process (a Ray worker reuses it across its cells)."""
    key = json.dumps([plan.data_id, plan.theta0_id, plan.ref_id, plan.cfg.device, plan.dtype], sort_keys=True)
    if key not in _WORKSPACES:
        _WORKSPACES.clear()  # keep at most one family's frozen models in memory
        _WORKSPACES[key] = Workspace(plan)
    return _WORKSPACES[key]


def _read(path: Path, name: str) -> dict:
    return json.loads((path / name).read_text())


def _history(result) -> list[dict]:
    return [{k: float(v) if isinstance(v, float | int) else v for k, v in row.items()} for row in result.history]


def run_cell(cfg: PanelConfig, cell: Cell) -> dict:
    """Run (or reuse) every stage of ``cell`` and return its record (also written to ``<out>/cells/<id>.json``)."""
    from margincal.attacks import attack_and_evaluate
    from margincal.config import EvalConfig
    from margincal.evaluate import evaluate_model
    from margincal.methods.base import get_method
    from margincal.models import load_checkpoint, save_model
    from margincal.polish import run_polish
    from margincal.unlearn import method_run, unlearn

    plan = CellPlan(cfg, cell)
    keys = plan.keys()
    store = Store(cfg.store_dir)
    ws = workspace(plan)
    tok, pad = ws.tokenizer, ws.tokenizer.pad_token_id
    sources: dict[str, str] = {}

    def stage(label: str, config: dict, build) -> Path:
        name, key = keys[label]
        path = store.run(name, key, config, build)
        sources[label] = str(path)
        return path

    def evaluate(ckpt: Checkpoint, reference: dict | None) -> dict:
        ref_key = None if reference is None else keys["reference/evaluate"][1]

        def build(tmp: Path) -> dict:
            result = evaluate_model(ckpt.load(), tok, ws.spec, ws.eval_splits, reference, cfg.eval.batch_size,
                                    cfg.eval.gradnorm)  # fmt: skip
            if cfg.eval.mmlu:
                from margincal.evaluation.mmlu import mmlu_accuracy

                result["summary"]["mmlu_acc"], result["mmlu"] = mmlu_accuracy(ckpt.load(), tok, cfg.eval.mmlu)
            atomic_write_json(tmp / "eval.json", result)
            return {"summary": result["summary"]}

        path = stage(f"{ckpt.role}/evaluate", plan.evaluate_config(ckpt.key, ref_key), build)
        return _read(path, "eval.json")

    reference = Checkpoint("reference", plan.ref_id, lambda: ws.frozen("ref"))
    theta0 = Checkpoint("theta0", plan.theta0_id, lambda: ws.frozen("theta0"))
    ref_eval = evaluate(reference, None)
    m_ref = ref_eval["summary"]["m"]
    evals = {"reference": ref_eval, "theta0": evaluate(theta0, ref_eval)}

    run = method_run(cell.method, method_override(cfg, cell.method), cfg.scale, len(ws.train["forget"]))
    extra = {k: v for k, v in ws.train.items() if k not in ("forget", "retain", "probe")}

    def build_unlearn(tmp: Path) -> dict:
        method = get_method(cell.method, **run.hparams)
        train_cfg = dataclasses.replace(run.train, seed=cell.seed)
        model, result = unlearn(ws.frozen("theta0"), method, ws.train["forget"], ws.train["retain"], train_cfg, tok,
                                run.retain_batch_size, extra)  # fmt: skip
        save_model(model, tok, tmp / "model")
        atomic_write_json(tmp / "history.json", _history(result))
        return {"steps": train_cfg.steps, "seconds": result.seconds}

    base_dir = stage("baseline/unlearn", plan.unlearn_config(), build_unlearn)
    baseline = Checkpoint("baseline", keys["baseline/unlearn"][1], lambda: ws.load(str(base_dir / "model")))
    evals["baseline"] = evaluate(baseline, ref_eval)

    def build_polish(tmp: Path) -> dict:
        from margincal.pipeline.panel import mc_config

        method = get_method(cell.method, **run.hparams)
        method.prepare(ws.frozen("theta0"), ws.train["forget"], tok)
        anchors = {"ref": (ws.frozen("ref"), plan.ref_id), "theta0": (ws.frozen("theta0"), plan.theta0_id)}
        mc = mc_config(cfg, plan.variant, cell.seed)
        polished, result = run_polish(baseline.load(), method, mc, anchors, ws.train["forget"], ws.train["retain"],
                                      ws.train["probe"], pad, store.root, m_ref, merge=False)  # fmt: skip
        polished.save_pretrained(tmp / "model", safe_serialization=True)
        atomic_write_json(tmp / "history.json", _history(result))
        return {"base": keys["baseline/unlearn"][1], "steps": len(result.history), "stopped_at": result.stopped_at,
                "seconds": result.seconds}  # fmt: skip

    mc_dir = stage("mc/polish", plan.polish_config(), build_polish)
    mc = Checkpoint(
        "mc", keys["mc/polish"][1],
        lambda: load_checkpoint(mc_dir / "model", base_dir / "model", ws.dtype, ws.device, **ws.load_options),
    )  # fmt: skip
    evals["mc"] = evaluate(mc, ref_eval)

    eval_cfg = EvalConfig(max_new_tokens=ws.spec["max_new_tokens"], batch_size=cfg.eval.batch_size)
    too_big = [s.label for s in attack_specs(cfg) if s.k >= len(ws.attack_forget)]
    if too_big:
        n = len(ws.attack_forget)
        raise ValueError(f"attack budget(s) {too_big} leave no held-out forget sample (|D_f| = {n})")
    attacks: dict[str, dict] = {role: {} for role in evals}
    for ckpt in (reference, theta0, baseline, mc):
        loaded: list[torch.nn.Module] = []
        for spec in attack_specs(cfg):

            def build_attack(tmp: Path, ckpt=ckpt, spec=spec, loaded=loaded) -> dict:
                if not loaded:
                    loaded.append(ckpt.load())
                res = attack_and_evaluate(loaded[0], tok, ws.attack_forget, ws.attack_answers, plan.attack(spec),
                                          eval_cfg, m_ref)  # fmt: skip
                atomic_write_json(tmp / "attack.json", res)
                return {"rouge_l": res["rouge_l"], "diagnosis": res["diagnosis"], "flips": res["flips"]}

            label = f"{ckpt.role}/attack/{spec.label}"
            stage(label, plan.attack_config(ckpt.key, spec, keys["reference/evaluate"][1]), build_attack)
            info = store.meta(*keys[label])["info"]
            attacks[ckpt.role][spec.label] = {"attacker": spec.preset, "k": spec.k, **info}

    unlearn_info, polish_info = store.meta(*keys["baseline/unlearn"]), store.meta(*keys["mc/polish"])
    record = {
        "id": cell.id,
        "status": "done",
        "cell": dataclasses.asdict(cell),
        "family": get_method(cell.method).family,
        "m_ref": m_ref,
        "models": {
            role: {"summary": evals[role]["summary"], "attacks": attacks[role]}
            for role in ("reference", "theta0", "baseline", "mc")
        },
        "unlearn": {"seconds": unlearn_info["seconds"], **unlearn_info["info"]},
        "polish": {"seconds": polish_info["seconds"], **polish_info["info"]},
        "sources": sources,
        "corpora": ws.corpora,
    }
    atomic_write_json(cfg.out_dir / "cells" / f"{cell.id}.json", record)
    return record
