"""The five stages of the pipeline, as functions of (resolved config, workspace): the only code that runs a stage.

* :func:`unlearn_stage`: θ̂ = a registered method applied to a copy of θ0;
* :func:`polish_stage`: θ̂_MC = the MC polish of θ̂, continuing the method's carried state (PDU's λ);
* :func:`evaluate_stage`: every metric of the benchmark's evaluator (or only the forget role's diagnosis/ROUGE);
* :func:`attack_stage`: a relearn attack on a seeded D_rel ⊂ D_f, scored on D_f \\ D_rel by the same evaluator;
* :func:`quantize_stage`: a checkpoint quantized by a bitsandbytes preset, its forget set scored by the same evaluator.

Every entry point calls these: the panel cell runner and the audit (through the store), the single-stage CLI commands
(``unlearn``, ``polish``, ``evaluate``, ``attack``, ``diagnose``), the demo (a shipped panel) and the benchmark
scripts. A :class:`Workspace` holds what they read: tokenizer, benchmark spec, evaluation and training splits, the
frozen θ0/θ_ref (loaded once), device/dtype and the anchor-margin cache. Each stage's code version, which enters
every store key, is declared with its runner (:func:`margincal.pipeline.graph.stage_kind`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from margincal.config.files import build_file
from margincal.config.settings import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    AttackConfig,
    BenchmarkSpec,
    EvalSettings,
    MCConfig,
    MethodRun,
    MonitorConfig,
)
from margincal.core.artifacts import atomic_write_json
from margincal.core.errors import InputError
from margincal.core.inputs import read_json
from margincal.data.alpaca import sample_corpus
from margincal.data.benchmarks import shots_of
from margincal.data.checks import check_probe_disjoint, context_length
from margincal.data.draws import relearn_draw, relearn_split
from margincal.data.records import EncodedQA, QARecord, encode_qa, encode_records
from margincal.data.tofu import load_split
from margincal.evaluation.evaluators import evaluate
from margincal.evaluation.wmdp import encode_choices
from margincal.mc.polish import polish, polish_input
from margincal.methods.base import UnlearningMethod, get_method
from margincal.model.loading import (
    check_checkpoint,
    check_in_memory,
    check_shared_vocabulary,
    load_model,
    load_tokenizer,
    model_config,
    prepare_tokenizer,
    resolve_device,
    save_model,
    save_tokenizer,
    shown_model,
)
from margincal.model.quantize import load_quantized, resolve_quantizer
from margincal.results.metric_table import FORGET_ROUGE
from margincal.training.attacks import get_attacker, margin_flips
from margincal.training.loop import TrainResult
from margincal.training.monitors import Monitors, delta_check, monitor_samples
from margincal.training.unlearning import unlearn

TRAIN_ROLES = ("forget", "retain", "probe")  # every other training split is an extra stream a method may read


@dataclasses.dataclass
class Workspace:
    """What the stages of one (benchmark, model family, tier) read, built once per process.

    ``eval_splits``: role → QA records of the benchmark's evaluation splits; ``train``: role → encoded training
    splits (``forget``, ``retain``, ``probe``, and extra streams such as ILU's ``env``); ``models``: ``theta0`` /
    ``ref`` → a path or hub id (absent when not given); ``model_ids``: their identities in cache keys.
    """

    tokenizer: object
    benchmark: BenchmarkSpec
    eval_splits: dict[str, list[QARecord]]
    train: dict[str, list[EncodedQA]]
    models: dict[str, str | torch.nn.Module]
    dtype: str = DEFAULT_DTYPE
    device: str = DEFAULT_DEVICE
    load_options: dict = dataclasses.field(default_factory=dict)
    anchor_cache: Path | None = None
    model_ids: dict[str, str] = dataclasses.field(default_factory=dict)
    corpora: dict = dataclasses.field(default_factory=dict)
    _frozen: dict = dataclasses.field(default_factory=dict, repr=False)

    def load(self, path: str | Path) -> torch.nn.Module:
        return load_model(path, self.dtype, self.device, **self.load_options)

    def frozen(self, which: str) -> torch.nn.Module:
        """θ0 (``theta0``) or θ_ref (``ref``), loaded once and shared read-only by every stage of this process."""
        if which not in self._frozen:
            if which not in self.models:
                raise InputError(f"this command needs the {'θ_ref (--ref)' if which == 'ref' else 'θ0'} model")
            given = self.models[which]
            self._frozen[which] = (given if isinstance(given, torch.nn.Module) else self.load(given)).eval()
        return self._frozen[which]

    @functools.cached_property
    def choice_examples(self) -> list[EncodedQA]:
        """The forget questions of a multiple-choice benchmark encoded as its evaluator scores them (the context,
        the correct letter, the four letters' tokens): MC's hinge examples with ``hinge_on: questions``."""
        spec = self.benchmark
        return encode_choices(self.tokenizer, self.eval_splits["forget"], spec.description, spec.max_length)

    @functools.cached_property
    def attack_examples(self) -> list[EncodedQA]:
        """The evaluation forget records encoded as fine-tuning data (no few-shot prefix): D_rel is drawn from them."""
        return encode_qa(self.tokenizer, self.eval_splits["forget"], self.benchmark.max_length)

    def anchors(self) -> dict[str, tuple[torch.nn.Module, str]]:
        """The margin anchors MC can use: ``ref`` (θ_ref) and ``theta0`` → (model, cache identity)."""
        return {role: (self.frozen(role), self.model_ids.get(role, str(self.models[role]))) for role in self.models}


def build_workspace(
    model: str | torch.nn.Module,
    spec: BenchmarkSpec,
    eval_splits: dict[str, list[QARecord]],
    train_records: dict[str, list[QARecord] | None],
    *,
    corpora: dict[str, dict] | None = None,
    models: dict[str, str | torch.nn.Module] | None = None,
    model_ids: dict[str, str] | None = None,
    tokenizer: object = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    load_options: dict | None = None,
    explicit_max_length: bool = False,
) -> Workspace:
    """The one workspace builder (CLI commands and panel cells): ``spec.max_length`` capped at ``model``'s context
    (an explicit ``--max-length`` beyond it stops); the tokenizer of ``tokenizer`` (default ``model``) with
    ``template``; ``train_records`` encoded (raw-text splits chunked); a ``probe`` given as records must be disjoint
    from D_f ∪ D_r (it stops otherwise), and ``corpora`` (role → ``{source, name, n}``) are seeded samples, the probe's
    kept disjoint from D_f ∪ D_r. ``models``: ``theta0`` / ``ref`` → path or hub id, loaded on first use. ``model``
    and ``models`` may also be models in memory (``torch.nn.Module`` with a transformers ``config``; then
    ``tokenizer`` is the tokenizer object, prepared on a copy: :func:`margincal.model.loading.prepare_tokenizer`)."""
    every = (model, *(models or {}).values())
    for name in every:  # a truncated, pickled or custom-code one stops before any load
        if isinstance(name, torch.nn.Module):
            check_in_memory(name)
        else:
            check_checkpoint(name)
    if isinstance(model, torch.nn.Module) and (tokenizer is None or isinstance(tokenizer, str | Path)):
        raise InputError("a model in memory needs its tokenizer in memory too: pass tokenizer=TOKENIZER")
    configs = {shown_model(m): m.config if isinstance(m, torch.nn.Module) else model_config(m) for m in every}
    context = getattr(configs[shown_model(model)], "max_position_embeddings", None)
    max_length = context_length(spec.max_length, context, explicit_max_length, shown_model(model))
    spec = dataclasses.replace(spec, max_length=max_length)
    if tokenizer is not None and not isinstance(tokenizer, str | Path):
        tok = prepare_tokenizer(tokenizer, template, "the tokenizer given")
    else:
        tok = load_tokenizer(tokenizer or model, template=template)
    shown = {shown_model(m): m for m in every}
    check_shared_vocabulary(tok, {name: (shown[name], config) for name, config in configs.items()}, tokenizer or model)
    records = {role: recs for role, recs in train_records.items() if recs is not None}
    excluded = [r for role in ("forget", "retain") for r in (*records.get(role, ()), *eval_splits.get(role, ()))]
    if "probe" in records:
        check_probe_disjoint(records["probe"], excluded, "(probe)")
    encoded = {role: encode_records(tok, recs, max_length) for role, recs in records.items()}
    reports: dict[str, dict] = {}
    for role, entry in (corpora or {}).items():
        pool = load_split(entry["source"], entry["name"])
        encoded[role], reports[role] = sample_corpus(
            tok, pool, entry.get("n"), max_length, excluded if role == "probe" else None
        )
    return Workspace(
        tok,
        spec,
        eval_splits,
        encoded,
        dict(models or {}),
        dtype,
        resolve_device(device),
        dict(load_options or {}),
        model_ids={
            **{r: shown_model(m) for r, m in (models or {}).items() if not isinstance(m, str)},
            **(model_ids or {}),
        },
        corpora=reports,
    )


# ------------------------------------------------------------------------------------------------------ stages


@dataclasses.dataclass
class StageResult:
    """A trained model's log: loss trace, wall time, early stop and the method state it carries (PDU's λ)."""

    history: list[dict]
    seconds: float
    stopped_at: int | None = None
    method_state: dict = dataclasses.field(default_factory=dict)
    trace: list[dict] = dataclasses.field(default_factory=list)  # monitor rows (margincal.training.monitors)
    selected: int | None = None  # the monitored step released (None: the last)
    reference_auc: dict[str, float] | None = None  # θ_ref's membership AUCs on the monitors' samples

    @classmethod
    def of(cls, result: TrainResult, method: UnlearningMethod) -> StageResult:
        def plain(rows: list[dict]) -> list[dict]:
            return [{k: float(v) if isinstance(v, float | int) else v for k, v in row.items()} for row in rows]

        trace = [{k: float(v) if isinstance(v, float) else v for k, v in row.items()} for row in result.trace]
        return cls(
            plain(result.history),
            result.seconds,
            result.stopped_at,
            method.state(),
            trace,
            result.selected,
            result.reference_auc,
        )


def run_monitors(ws: Workspace, cfg: MonitorConfig, seed: int, m_ref: float | None, pool=()) -> Monitors:
    """The held-out monitors of one run on the workspace's evaluation splits (:mod:`margincal.training.monitors`),
    θ_ref's membership AUCs on the same samples when the workspace has θ_ref."""
    samples = monitor_samples(ws.tokenizer, ws.benchmark, ws.eval_splits, cfg, seed, m_ref, pool)
    reference = ws.frozen("ref") if "ref" in ws.models else None
    return Monitors(samples, cfg.detectors, reference)


def unlearn_stage(
    run: MethodRun, ws: Workspace, seed: int, m_ref: float | None = None
) -> tuple[torch.nn.Module, StageResult]:
    """θ̂ = ``run``'s method on a copy of θ0 with the forget/retain (and extra) training splits; seeded. With
    ``run.monitor`` the held-out monitors run (Δ needs θ_ref's ``m_ref``) and ``run.select`` picks the step."""
    method = get_method(run.name, **run.hparams)
    extra = {k: v for k, v in ws.train.items() if k not in TRAIN_ROLES}
    train_cfg = dataclasses.replace(run.train, seed=seed)
    monitors = None
    if run.monitor is not None:
        monitors = run_monitors(ws, run.monitor, seed, m_ref, pool=ws.train["forget"])
    model, result = unlearn(
        ws.frozen("theta0"),
        method,
        ws.train["forget"],
        ws.train["retain"],
        train_cfg,
        ws.tokenizer,
        run.retain_batch_size,
        extra,
        run.stop,
        monitors,
        run.monitor.every if run.monitor else 0,
        run.select,
        ws.frozen(method.prepares_with) if method.prepares_with != "theta0" else None,
    )
    return model, StageResult.of(result, method)


def polish_stage(
    model: torch.nn.Module,
    run: MethodRun,
    mc: MCConfig,
    ws: Workspace,
    m_ref: float | None,
    method_state: dict | None = None,
    hook=None,
    merge: bool = True,
) -> tuple[torch.nn.Module, StageResult]:
    """θ̂_MC: the MC polish of ``model`` (consumed: the LoRA is trained on it in place, pass a copy to keep it).

    The method's native loss keeps running, prepared on θ0 and continuing from ``method_state`` (the unlearning
    run's carried state, e.g. PDU's λ); ``m_ref`` is θ_ref's m(D_f) (Δ-stop); ``hook`` an extra training-loop hook
    (the coercivity trace); ``merge=False`` returns the unmerged peft model (to save only the adapter)."""
    method = get_method(run.name, **run.hparams)
    method.prepare(ws.frozen(method.prepares_with), ws.train["forget"], ws.tokenizer)
    method.load_state(method_state or {})
    train, pad = ws.train, ws.tokenizer.pad_token_id
    probe = train.get("probe", [])
    hinge = ws.choice_examples if ws.benchmark.hinge_on == "questions" else None
    inp = polish_input(
        method, mc, ws.anchors(), train["forget"], train["retain"], probe, pad, ws.anchor_cache, hinge=hinge
    )
    check = None
    if mc.stop_delta is not None and mc.monitor is None and m_ref is not None:  # else the monitors' Δ is the check
        forget, icl = ws.eval_splits["forget"], shots_of(ws.benchmark, ws.eval_splits, "forget")
        held = inp.hinge if inp.hinge is not None else inp.pool  # what the polish trains the hinge on
        check = delta_check(ws.tokenizer, ws.benchmark, forget, m_ref, icl, held, mc.stop_batch, mc.train.seed)
    monitors = run_monitors(ws, mc.monitor, mc.train.seed, m_ref, inp.pool) if mc.monitor is not None else None
    inp = dataclasses.replace(inp, check=check, monitors=monitors, hook=hook)
    polished, result = polish(model, inp, merge)
    return polished, StageResult.of(result, method)


def evaluate_stage(
    model: torch.nn.Module,
    ws: Workspace,
    settings: EvalSettings,
    reference: dict | None = None,
    parts: Sequence[str] | None = None,
    splits: dict[str, list[QARecord]] | None = None,
) -> dict:
    """The benchmark's evaluator on ``splits`` (default: the workspace's); ``reference`` is θ_ref's result."""
    return evaluate(model, ws.tokenizer, ws.benchmark, splits or ws.eval_splits, settings, reference, parts)


def margin_stage(model: torch.nn.Module, ws: Workspace, settings: EvalSettings) -> dict:
    """The margin diagnosis of ``model`` on the workspace's forget split by the benchmark's evaluator (its
    aggregate): the summary alone (m(D_f), ℓ), what a stage reading θ_ref's m_ref needs of θ_ref."""
    return {"summary": evaluate_stage(model, ws, settings, parts=("diagnosis",))["summary"]}


def reference_margin(ws: Workspace, settings: EvalSettings) -> float:
    """m_ref = θ_ref's m(D_f) on the workspace's forget split (:func:`margin_stage`)."""
    return margin_stage(ws.frozen("ref"), ws, settings)["summary"]["m"]


def forget_retain_scores(model: torch.nn.Module, ws: Workspace, settings: EvalSettings, m_ref: float) -> dict:
    """The quick read of a checkpoint that sweeps and premise checks use: Δ, m, ℓ, certificate, forget ROUGE-L (and
    fact recall where the records carry attribute values) and retain ROUGE-L, by the benchmark's evaluator."""
    f = evaluate_stage(model, ws, settings, {"summary": {"m": m_ref}}, ("diagnosis", "rouge"))["summary"]
    r = evaluate_stage(model, ws, settings, parts=("rouge",), splits={"forget": ws.eval_splits["retain"]})["summary"]
    row = {
        "delta": f["delta"],
        "m": f["m"],
        "log_odds": f["log_odds"],
        "certified": f["certified"],
        "forget_rougeL": f[FORGET_ROUGE.name],
        "retain_rougeL": r[FORGET_ROUGE.name],
    }
    if "forget_fact_recall" in f:
        row["forget_fact_recall"] = f["forget_fact_recall"]
    return row


def utility_score(model: torch.nn.Module, ws: Workspace, settings: EvalSettings, roles: Sequence[str]) -> dict:
    """The utility proxy a searched attack is bounded by: the benchmark's headline ROUGE-L over the records of the
    evaluation splits ``roles`` (the benchmark's ``utility``: splits no attack trains on), each record weighted once:
    u = (1/N) Σ_i ROUGE-L(greedy answer_i, gold_i). Returns ``rouge_l`` (u) and ``n`` (N)."""
    missing = [role for role in roles if not ws.eval_splits.get(role)]
    if missing:
        raise InputError(f"the utility proxy reads the {', '.join(missing)} split(s); the data holds none")
    records = [r for role in roles for r in ws.eval_splits[role]]
    result = evaluate_stage(model, ws, settings, parts=("rouge",), splits={"forget": records})
    return {"rouge_l": result["splits"]["forget"]["rouge_l"], "n": len(records)}


def reworded(records: Sequence[QARecord], fmt: str) -> list[QARecord]:
    """``records`` with each question put in the wording ``fmt`` (``{question}`` stands for the question)."""
    return [dataclasses.replace(r, question=fmt.replace("{question}", r.question)) for r in records]


def reworded_worst_case(
    model, ws: Workspace, settings: EvalSettings, reference, splits: dict, formats: Sequence[str]
) -> dict:
    """The forget split scored under each wording of ``formats``; per record the answer of the wording whose
    ROUGE-L is highest (the first on ties: the original wording, listed first, wins them), so the headline ROUGE-L
    and fact recall are the per-record worst case over wordings (JensUn's worst case over paraphrases,
    2509.02820). The diagnosis and margins are those of the wording with the highest mean ROUGE-L; each sample
    names its wording (``format``)."""
    key = ws.benchmark.score_field
    results = [
        evaluate_stage(
            model, ws, settings, reference, ("diagnosis", "rouge"), {**splits, "forget": reworded(splits["forget"], f)}
        )["splits"]["forget"]
        for f in formats
    ]
    n = len(splits["forget"])
    best = [max(range(len(formats)), key=lambda j, i=i: results[j]["samples"][i][key]) for i in range(n)]
    samples = [{**results[j]["samples"][i], "format": formats[j]} for i, j in enumerate(best)]
    top = max(results, key=lambda r: r["rouge_l"])
    out = {**top, "samples": samples, "rouge_l": sum(s[key] for s in samples) / n}
    if "fact_recall" in top:
        out["fact_recall"] = sum(s["fact_recall"] for s in samples) / n
    return out


def relearn_pool(ws: Workspace, role: str) -> list[EncodedQA]:
    """The encoded training split an attack on ``role`` data draws D_rel from, or one line saying it is missing."""
    if not ws.train.get(role):
        raise InputError(f"a relearn attack on {role} data needs the {role} split; the workspace holds none")
    return ws.train[role]


def attack_inputs(ws: Workspace, cfg: AttackConfig) -> tuple[list[int], list[EncodedQA], dict[str, list[QARecord]]]:
    """What an attack trains on and is scored on: (held-out forget positions, D_rel, the splits scored). D_rel ⊂ D_f
    leaves D_f \\ D_rel held out; retain or probe data (:func:`relearn_pool`) and the format probe (no D_rel) leave
    every forget record; in-context relearning puts D_rel before every held-out question (``forget_icl``, in place
    of a benchmark's own shots). A benchmark that relearns from its corpus (``relearn_from: corpus``, WMDP) draws a
    forget-data D_rel from the training forget corpus and scores every forget question."""
    records, spec = ws.eval_splits["forget"], ws.benchmark
    rel: list[int] = []
    if spec.kind == "wmdp" and cfg.name in ("in_context", "format_probe"):
        raise InputError(
            f"the {cfg.name} attacker rewrites the question's prompt; {spec.name} is scored with lm-eval's zero-shot "
            "prompt only (use the relearn attackers)"
        )
    if cfg.name == "format_probe":
        held, d_rel = list(range(len(records))), []
    elif cfg.data == "forget" and spec.relearn_from == "corpus":
        pool = relearn_pool(ws, "forget")
        d_rel = [pool[i] for i in relearn_draw(len(pool), cfg.k, cfg.train.seed)]
        held = list(range(len(records)))
    elif cfg.data == "forget":
        examples = ws.attack_examples
        rel, held = relearn_split(len(examples), cfg.k, cfg.train.seed, cfg.pool)
        d_rel = [examples[i] for i in rel]
    else:
        pool = relearn_pool(ws, cfg.data)
        d_rel = [pool[i] for i in relearn_draw(len(pool), cfg.k, cfg.train.seed)]
        held = list(range(len(records)))
    splits = {"forget": [records[i] for i in held]}
    if cfg.name == "in_context":
        splits["forget_icl"] = [records[i] for i in rel]
    elif "forget_icl" in ws.eval_splits:
        splits["forget_icl"] = ws.eval_splits["forget_icl"]
    return held, d_rel, splits


def attack_stage(
    model: torch.nn.Module,
    cfg: AttackConfig,
    ws: Workspace,
    settings: EvalSettings,
    m_ref: float | None = None,
    instrument: Callable | None = None,
) -> dict:
    """Attack ``model`` (left untouched) on a seeded D_rel of ``cfg.k`` records and score the forget records it did
    not train on with the benchmark's evaluator (its prompts, stop strings, headline ROUGE-L and aggregate), before
    and after: D_rel ⊂ D_f scored on D_f \\ D_rel, or (``cfg.data`` retain / probe) k records of the workspace's
    training split of that role (:func:`relearn_pool`) scored on all of D_f.

    Returns held-out ``rouge_l`` (the benchmark's headline ROUGE-L), the diagnosis (Δ against ``m_ref``), margin
    flips and the samples; with ``cfg.utility``, the attacked model's utility proxy (:func:`utility_score`).
    ``instrument(held) -> hook`` builds a per-step hook (Theorem 3's ``LiftInstrument``)."""
    held, d_rel, held_splits = attack_inputs(ws, cfg)
    reference = {"summary": {"m": m_ref}} if m_ref is not None else None
    before = evaluate_stage(model, ws, settings, reference, ("diagnosis",), held_splits)["splits"]["forget"]
    hook = instrument(held) if instrument is not None else None
    attacked = get_attacker(cfg.name)(model, d_rel, cfg, ws.tokenizer, hook=hook)
    if cfg.name == "format_probe":
        after = reworded_worst_case(attacked, ws, settings, reference, held_splits, cfg.formats[: cfg.k])
    else:
        after = evaluate_stage(attacked, ws, settings, reference, ("diagnosis", "rouge"), held_splits)
        after = after["splits"]["forget"]
    per_sample = [s[ws.benchmark.score_field] for s in after["samples"]]
    utility = {"utility": utility_score(attacked, ws, settings, cfg.utility)} if cfg.utility else {}
    return {
        "attacker": cfg.name,
        "k": cfg.k,
        "heldout": held,
        "rouge_l": after["rouge_l"],
        **({"fact_recall": after["fact_recall"]} if "fact_recall" in after else {}),
        "diagnosis": after["diagnosis"],
        "flips": margin_flips(before["diagnostic_margins"], after["diagnostic_margins"], per_sample),
        "samples": after["samples"],
        **utility,
    }


def quantize_stage(
    model: str | Path, preset: str, ws: Workspace, settings: EvalSettings, m_ref: float | None = None, base=None
) -> dict:
    """The checkpoint ``model`` (a directory or hub id; an adapter is merged onto ``base``) quantized by the
    ``configs/quantizers.yaml`` preset, then its whole forget set scored by the benchmark's evaluator (diagnosis
    against ``m_ref``, greedy answers): ``rouge_l`` (the headline ROUGE-L), fact recall where the records carry
    attribute values, the diagnosis, the samples and the codebook check of a 4-bit preset (``codebook``: the layers
    checked and any kept in full precision)."""
    quantized, codebook = load_quantized(model, resolve_quantizer(preset), ws.device, base)
    reference = {"summary": {"m": m_ref}} if m_ref is not None else None
    splits = {k: v for k, v in ws.eval_splits.items() if k in ("forget", "forget_icl")}
    forget = evaluate_stage(quantized, ws, settings, reference, ("diagnosis", "rouge"), splits)["splits"]["forget"]
    return {
        "quantizer": preset,
        "rouge_l": forget["rouge_l"],
        **({"fact_recall": forget["fact_recall"]} if "fact_recall" in forget else {}),
        "diagnosis": forget["diagnosis"],
        "samples": forget["samples"],
        **({"codebook": codebook} if codebook else {}),
    }


# ------------------------------------------------------------------------------------------------------ writers
# What each stage saves, and its layout: the same for a store stage (``<store>/<stage>/<key>/``) and for the
# directory a single-stage CLI command writes, so each reads the other's output (PDU's λ carried either way).


def write_trace(path: Path, result: StageResult) -> dict:
    """``trace.json`` (the monitor rows, θ_ref's AUCs, the released step) and ``trace.png`` of a monitored run;
    returns the stage info entries (released step, monitor seconds per signal; nothing without monitors)."""
    from margincal.reporting.figures import trace_figure  # lazy: plots

    if not result.trace:
        return {}
    seconds: dict[str, float] = {}
    for row in result.trace:
        for k, v in row.items():
            if k.startswith("seconds/"):
                seconds[k.removeprefix("seconds/")] = seconds.get(k.removeprefix("seconds/"), 0.0) + v
    trace = {"selected": result.selected, "reference_auc": result.reference_auc, "rows": result.trace}
    atomic_write_json(path / "trace.json", trace)
    trace_figure(result.trace, path / "trace.png", result.reference_auc)
    return {"selected": result.selected, "monitor_seconds": seconds}


def write_unlearned(path: Path, model: torch.nn.Module, tokenizer, run: MethodRun, result: StageResult) -> dict:
    """``model/`` (safetensors and tokenizer), ``history.json`` and ``method.json`` (name, hyperparameters and the
    carried state the polish continues from); returns the stage info (scheduled and run steps, seconds)."""
    save_model(model, tokenizer, path / "model")
    atomic_write_json(path / "history.json", result.history)
    atomic_write_json(path / "method.json", {"name": run.name, "hparams": run.hparams, "state": result.method_state})
    info = {"steps": run.train.steps, "steps_run": len(result.history), "seconds": result.seconds}
    return info | write_trace(path, result)


@dataclasses.dataclass
class UnlearnedMethod:
    """``method.json`` of an unlearned checkpoint: the method's name, hyperparameters and carried state."""

    name: str
    hparams: dict[str, Any]
    state: dict[str, Any] = dataclasses.field(default_factory=dict)


def read_unlearned(model_dir: str | Path) -> dict | None:
    """The ``method.json`` that :func:`write_unlearned` saved beside ``model_dir`` (given as the stage directory
    or its ``model/``), checked against :class:`UnlearnedMethod`; None for a checkpoint margincal did not unlearn."""

    for where in (Path(model_dir), Path(model_dir).parent):
        path = where / "method.json"
        if path.is_file() and (where / "model").is_dir():
            data = read_json(path)
            build_file(UnlearnedMethod, data, str(path))
            return data
    return None


def write_polished(path: Path, model: torch.nn.Module, tokenizer, result: StageResult, state_in: dict) -> dict:
    """``model/`` (the LoRA adapter of an unmerged polish, else the merged weights, with the tokenizer) and
    ``history.json``; returns the stage info (steps, early stop, seconds, the method state it continued from)."""
    model.save_pretrained(path / "model", safe_serialization=True)
    save_tokenizer(tokenizer, path / "model")
    atomic_write_json(path / "history.json", result.history)
    return {
        "steps": len(result.history),
        "stopped_at": result.stopped_at,
        "seconds": result.seconds,
        "method_state_in": state_in,
    } | write_trace(path, result)


def write_evaluation(path: Path, result: dict) -> dict:
    """``eval.json`` (every metric with samples); returns the summary."""
    atomic_write_json(path / "eval.json", result)
    return {"summary": result["summary"]}


def write_quantized(path: Path, result: dict) -> dict:
    """``quantized.json`` (forget ROUGE-L, diagnosis, samples under the quantizer); returns its headline numbers."""
    atomic_write_json(path / "quantized.json", result)
    return {k: result[k] for k in ("rouge_l", "fact_recall", "diagnosis", "codebook") if k in result}


def write_attack(path: Path, result: dict) -> dict:
    """``attack.json`` (held-out ROUGE-L, diagnosis, flips, samples); returns its headline numbers."""
    atomic_write_json(path / "attack.json", result)
    return {k: result[k] for k in ("rouge_l", "fact_recall", "diagnosis", "flips", "utility") if k in result}
