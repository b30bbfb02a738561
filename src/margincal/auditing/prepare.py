"""Resolve an audit (:func:`prepare_audit`: every check before the first forward pass) into a plan whose stage graph
runs through the store by the runner a panel's cell uses (:func:`margincal.pipeline.graph.run_graph`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from margincal.auditing.interop import read_retain_logs
from margincal.auditing.plan import AuditBudget, AuditPlan, Checkpoint, audit_graph, checkpoint, load_budget
from margincal.auditing.spaces import SearchSpace, resolve_searches, split_for
from margincal.config.settings import (
    DEFAULT_BENCHMARK,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    AttackConfig,
    BenchmarkSpec,
    EvalSettings,
    resolve_benchmark,
)
from margincal.core.artifacts import digest
from margincal.core.errors import InputError
from margincal.data.benchmarks import data_identity, fill_split, load_benchmark_splits
from margincal.data.checks import check_budgets
from margincal.data.draws import SearchSplit
from margincal.data.records import QARecord, encode_qa, evaluated_fields
from margincal.data.templates import describe_template, template_identity
from margincal.data.tofu import benchmark_source, load_split
from margincal.model.loading import (
    TOKENIZER_FILES,
    check_shared_vocabulary,
    load_tokenizer,
    model_config,
    vocabulary_digest,
)
from margincal.model.quantize import resolve_quantizer
from margincal.pipeline.graph import REFERENCE, THETA0
from margincal.pipeline.stages import Workspace, attack_inputs, build_workspace, reworded
from margincal.store.stage_store import Store

# what an audit writes at the top of --out beside one folder per checkpoint (margincal.auditing.report.write_audit)
CARD_ENTRIES = (
    "card.json",
    "card.md",
    "figures",
    "open-unlearning",
    "population.json",
    "samples.parquet",
    ".margincal.json",
)
FROZEN = (REFERENCE, THETA0)  # the roles beside the audited checkpoints: θ_ref (the floor) and θ0 (the ceiling)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditRequest:
    """An audit as it is asked for (:func:`prepare_audit`), nothing read or checked yet."""

    models: Sequence[tuple[str, str | None]]  # (checkpoint, name or None: derived from the checkpoint)
    data: str | None
    benchmark: str | None
    tier: str
    ref: str | None
    ref_logs: str | None
    theta0: str | None
    budget: str
    overrides: Sequence[str] = ()
    scale: str | None = None
    base: str | None = None
    settings: EvalSettings = dataclasses.field(default_factory=EvalSettings)
    dtype: str = DEFAULT_DTYPE
    device: str = DEFAULT_DEVICE
    template: str | None = None
    control: str | None = None
    held: Mapping[str, str] = dataclasses.field(default_factory=dict)  # a held model's temporary copy -> its name

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "overrides", tuple(self.overrides))


@dataclasses.dataclass(frozen=True)
class AuditInputs:
    """What an audit's budget and data resolve to (:func:`resolve_inputs`), every forget K checked against |D_f|."""

    spec: BenchmarkSpec
    scale: str
    budget: AuditBudget
    attacks: dict[str, AttackConfig]  # "<label>/d<draw>" -> resolved config
    splits: dict[str, list[QARecord]]  # the evaluation splits by role
    missing: list[str]  # the benchmark's utility splits the data does not hold
    logs: dict | None  # open-unlearning retain logs read into θ_ref's reference result
    searches: dict[str, SearchSpace]  # preset -> its search space
    split: SearchSplit | None  # the searches' one split of D_f
    relearn_roles: list[str]  # the train_splits roles D_rel is drawn from (forget too where it is the forget corpus)
    train_records: dict[str, list[QARecord]]  # relearn role -> its split's records
    corpora: dict[str, dict]  # relearn role -> a sampled corpus entry {source, name, n}


def audit_splits(spec: BenchmarkSpec, tier: str, data: str | None) -> tuple[dict[str, list[QARecord]], list[str]]:
    """The benchmark's evaluation splits from ``data`` (a TOFU-format directory) or its own source, by the one split
    loader; the forget split (attacks, margins) and the membership roles (MIA, ``spec.membership``) are required, a
    missing utility split is left out (and named: second value)."""
    source = spec.source if data is None else benchmark_source(data)
    if source is None:
        raise InputError(
            f"benchmark {spec.name} has no data source: give --data DIR (margincal mini export DIR "
            "writes the mini benchmark's)"
        )
    required = tuple(dict.fromkeys(("forget", *spec.membership)))
    optional = [role for role in spec.splits if role not in required]
    try:
        splits = load_benchmark_splits(spec, tier, functools.partial(load_split, source), optional)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err}; an audit needs its {' and '.join(required)} splits") from None
    return splits, [role for role in spec.splits if role not in splits]


def relearn_data(spec: BenchmarkSpec, tier: str, data: str | None, roles: Sequence[str]) -> tuple[dict, dict]:
    """The training data the budget's retain and probe attacks draw D_rel from, by the benchmark's ``train_splits``:
    (role → records of a split of ``data``, role → a sampled corpus entry ``{source, name, n}``). A role the
    benchmark names no split for, or whose split the data lacks, stops here with one line."""
    records, corpora = {}, {}
    for role in roles:
        entry = spec.train_splits.get(role)
        if entry is None:
            raise InputError(f"the budget attacks on {role} data; benchmark {spec.name} names no {role} split")
        if isinstance(entry, dict):
            corpora[role] = entry
            continue
        try:
            records[role] = load_split(data or spec.source, fill_split(entry, spec, tier))
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{err}; the budget's attacks on {role} data draw from it") from None
    return records, corpora


def check_prompts(ws: Workspace, label: str, cfg: AttackConfig) -> None:
    """The prompts a no-training attack builds fit the benchmark's max_length, checked by tokenising them before any
    model is loaded: in-context relearning's K D_rel pairs before each held-out question, the format probe's K
    wordings of every forget question."""
    _, _, splits = attack_inputs(ws, cfg)
    limit, shots = ws.benchmark.max_length, splits.get("forget_icl", ())
    if cfg.name == "in_context":
        prompts = [(splits["forget"], shots, f"{cfg.k} forget QA pairs before a question")]
    else:
        prompts = [(reworded(splits["forget"], f), shots, f"the wording {f!r}") for f in cfg.formats[: cfg.k]]
    for questions, shots, what in prompts:
        try:
            encode_qa(ws.tokenizer, questions, limit, shots=shots)
        except InputError as err:
            raise InputError(
                f"attack {label}: {what} exceed the {limit} tokens the benchmark allows this model "
                f"({str(err).splitlines()[0]}); lower K"
            ) from None


def _check_role_name(name: str) -> None:
    """An audited checkpoint's name may be neither θ_ref's nor θ0's role nor an entry the card writes beside it."""
    if name in FROZEN:
        raise InputError(f"{name!r} names θ_ref or θ0 in an audit; name the checkpoint otherwise (NAME=CKPT)")
    if name in CARD_ENTRIES:
        raise InputError(f"{name!r} names a file of the audit's card; name the checkpoint otherwise (NAME=CKPT)")


def _tokenizer_identity(source: str, template: str | None) -> tuple[str, dict]:
    """A model's tokenizer as the audit compares them: the digest of its vocabulary and the identity of the prompt
    template it is scored under (``template`` given, else detected; :func:`margincal.data.templates.template_identity`;
    a given template the tokenizer cannot render stops here)."""
    tok = load_tokenizer(source, template)
    return vocabulary_digest(tok), template_identity(tok)


def check_templates(templates: dict[str, dict], shown: dict[str, str]) -> None:
    """Every model of an audit is scored under one prompt template: the first audited checkpoint's. A model whose
    tokenizer would render prompts otherwise (another template, another chat template, none) is refused, naming
    both, before any model is loaded; scored under the first's template its margins and answers would not be its
    own."""
    first = next(iter(templates))
    for role, identity in templates.items():
        if identity != templates[first]:
            raise InputError(
                f"{role} ({shown[role]}) renders prompts with template {describe_template(identity)}, {first} "
                f"({shown[first]}) with {describe_template(templates[first])}: scores under one template are not "
                "the other's; save every model with the same tokenizer files (chat_template.jinja included)"
            )


def _tokenizer_source(ckpt: Checkpoint) -> str:
    """Where a checkpoint's tokenizer is: beside it, else (an adapter saved without one) its base's."""
    here = Path(ckpt.path)
    if ckpt.base and here.is_dir() and not any((here / f).exists() for f in TOKENIZER_FILES):
        return ckpt.base
    return ckpt.spec


def _roles(request: AuditRequest, store: Store, identify: bool) -> dict[str, Checkpoint]:
    """role -> checkpoint: the audited ones by name (each name valid and unique), then θ_ref and θ0 where given."""
    roles: dict[str, Checkpoint] = {}
    for spec_str, name in request.models:
        ckpt = checkpoint(spec_str, name, request.base, store, identify=identify)
        ckpt = dataclasses.replace(ckpt, held=request.held.get(spec_str))
        _check_role_name(ckpt.name)
        if ckpt.name in roles:
            raise InputError(f"two audited checkpoints are named {ckpt.name!r}; name them (NAME=CKPT)")
        roles[ckpt.name] = ckpt
    for role, given in ((REFERENCE, request.ref), (THETA0, request.theta0)):
        if given:
            roles[role] = dataclasses.replace(checkpoint(given, role, store=store, identify=identify), name=role)
    return roles


def resolve_inputs(request: AuditRequest) -> AuditInputs:
    """The budget and the data resolved and checked before any checkpoint is read (a refusal here reads none): θ_ref
    given one way, the names typed valid, the budget with its quantizers' packages, the benchmark and scale; then the
    evaluation splits, the open-unlearning logs matched to D_f, every forget K below |D_f| (unless the benchmark
    relearns from its corpus), the searches with their split of D_f and the relearn pools of the other roles."""
    if request.ref and request.ref_logs:
        raise InputError("give θ_ref as --ref (a checkpoint) or --ref-logs (open-unlearning logs), not both")
    for name in [name for _, name in request.models if name is not None]:  # typed names first: nothing is read before
        _check_role_name(name)
    budget = load_budget(request.budget, list(request.overrides))
    for name in budget.quantizers:
        resolve_quantizer(name)
    spec = resolve_benchmark(request.benchmark or DEFAULT_BENCHMARK)
    scale = request.scale or ("mini" if spec.name == "mini" else "paper")
    splits, missing = audit_splits(spec, request.tier, request.data)
    logs = read_retain_logs(request.ref_logs, splits["forget"]) if request.ref_logs else None
    seeds = range(budget.draws)
    attacks = {f"{s.label}/d{d}": s.resolve(scale, d) for s in budget.specs() for d in seeds}
    forget_ks = sorted({c.k for c in attacks.values() if c.data == "forget"})
    corpus = spec.relearn_from == "corpus"  # forget-data attacks draw D_rel from the forget corpus (WMDP)
    if not corpus:
        check_budgets(forget_ks, len(splits["forget"]), f"the {request.budget} audit budget")
    searches = resolve_searches(budget, scale, spec.utility, missing, corpus)
    split = split_for(searches, len(splits["forget"]))  # which forget records a search may train, select, report on
    relearn_roles = sorted({c.data for c in attacks.values()} - (set() if corpus else {"forget"}))
    train_records, corpora = relearn_data(spec, request.tier, request.data, relearn_roles)
    return AuditInputs(
        spec, scale, budget, attacks, splits, missing, logs, searches, split, relearn_roles, train_records, corpora
    )


def check_checkpoints(request: AuditRequest, store: Store) -> tuple[dict[str, str], dict[str, dict]]:
    """Every checkpoint checked without identifying one (no digest computed, no hub asked), ``control`` an audited
    one's name, and every model's tokenizer loaded and compared with the first audited checkpoint's: one vocabulary
    (else refused, naming both) and one prompt template (:func:`check_templates`). Returns role -> where its
    tokenizer is, and role -> the identity of the template it is scored under."""
    unidentified = _roles(request, store, identify=False)
    named = [r for r in unidentified if r not in FROZEN]
    if request.control is not None and request.control not in named:
        raise InputError(f"--control {request.control}: no audited checkpoint is named so ({', '.join(named)})")
    sources = {role: _tokenizer_source(c) for role, c in unidentified.items()}
    tokenizers = {role: _tokenizer_identity(src, request.template) for role, src in sources.items()}
    first = next(iter(unidentified))
    for role, (vocab, _) in tokenizers.items():
        if vocab != tokenizers[first][0]:
            raise InputError(
                f"{role} ({unidentified[role].shown}) has another tokenizer than {first} "
                f"({unidentified[first].shown}): "
                "margins and answers are only comparable under one tokenizer"
            )
    templates = {role: identity for role, (_, identity) in tokenizers.items()}
    check_templates(templates, {role: c.shown for role, c in unidentified.items()})
    return sources, templates


def audit_workspace(
    request: AuditRequest, inputs: AuditInputs, roles: dict[str, Checkpoint], first: Checkpoint, tokenizer: str
) -> Workspace:
    """The workspace on the ``first`` audited checkpoint's model and ``tokenizer`` (θ_ref and θ0 its frozen models),
    the evaluation splits and the relearn pools; then checked before any model is loaded: every model's embedding
    holds every id of the tokenizer, no attack's K exceeds its relearn pool (it would draw less than the budget
    says), and every no-training attack's prompts fit max_length (:func:`check_prompts`)."""
    frozen = {r: roles[r].spec for r in (THETA0, REFERENCE) if r in roles}
    ws = build_workspace(
        first.base or first.spec,
        inputs.spec,
        inputs.splits,
        inputs.train_records,
        corpora=inputs.corpora,
        models={"theta0" if r == THETA0 else "ref": s for r, s in frozen.items()},
        model_ids={"theta0" if r == THETA0 else "ref": roles[r].identity for r in frozen},
        tokenizer=tokenizer,
        template=request.template,
        dtype=request.dtype,
        device=request.device,
    )
    every = {ckpt.shown: (ckpt.base or ckpt.spec, model_config(ckpt.base or ckpt.spec)) for ckpt in roles.values()}
    check_shared_vocabulary(ws.tokenizer, every, tokenizer)  # every model, not only the workspace's
    for label, cfg in inputs.attacks.items():
        if cfg.data in inputs.relearn_roles and cfg.k > len(ws.train[cfg.data]):
            raise InputError(f"attack {label}: K={cfg.k} exceeds the {len(ws.train[cfg.data])} {cfg.data} records")
        if cfg.name in ("in_context", "format_probe"):
            check_prompts(ws, label, cfg)
    return ws


def audit_plan(
    request: AuditRequest,
    inputs: AuditInputs,
    roles: dict[str, Checkpoint],
    audited: list[str],
    ws: Workspace,
    templates: dict[str, dict],
) -> AuditPlan:
    """The plan: the data's identity (benchmark, tier, template, splits) and the relearn pools' digests that key
    every stage, the stage graph over θ_ref, θ0 and the ``audited`` checkpoints (:func:`audit_graph`) with its
    builder, and everything the card reports beside them."""
    template = dataclasses.asdict(ws.tokenizer.margincal_template)
    data_id = data_identity(ws.benchmark, request.tier, template, inputs.splits)
    train = {role: digest([evaluated_fields(r) for r in recs]) for role, recs in inputs.train_records.items()}
    train_id = train | inputs.corpora
    graph, builder = audit_graph(
        roles,
        audited,
        data_id,
        request.settings,
        request.dtype,
        inputs.attacks,
        inputs.budget.quantizers,
        inputs.logs,
        train_id or None,
    )
    return AuditPlan(
        models=roles,
        audited=audited,
        spec=ws.benchmark,
        tier=request.tier,
        data_id=data_id,
        missing=inputs.missing,
        scale=inputs.scale,
        budget_name=request.budget,
        budget=inputs.budget,
        attacks=inputs.attacks,
        eval=request.settings,
        dtype=request.dtype,
        device=ws.device,
        ref_logs=inputs.logs,
        graph=graph,
        templates=templates,
        builder=builder,
        searches=inputs.searches,
        split=inputs.split,
        control=request.control,
    )


def prepare_audit(request: AuditRequest, store: Store) -> tuple[AuditPlan, Workspace]:
    """Every input resolved and checked before any model is loaded, in this order: the budget and the data, every K
    below |D_f| (:func:`resolve_inputs`: a refusal there reads no checkpoint); every checkpoint checked and every
    tokenizer compared (:func:`check_checkpoints`) before any is identified (digests, pinned hub revisions; digests
    are cached in ``store``); the workspace with its vocabulary and prompt checks (:func:`audit_workspace`); then the
    plan's stage graph (:func:`audit_plan`)."""
    inputs = resolve_inputs(request)
    sources, templates = check_checkpoints(request, store)
    roles = _roles(request, store, identify=True)
    audited = {name: ckpt for name, ckpt in roles.items() if name not in FROZEN}
    first = next(iter(roles))
    ws = audit_workspace(request, inputs, roles, audited[first], sources[first])
    ws.anchor_cache = store.root  # anchor margin tables under <store>/anchors
    return audit_plan(request, inputs, roles, list(audited), ws, templates), ws


@torch.no_grad()
def weight_distance(model: torch.nn.Module, theta0: torch.nn.Module) -> float:
    """‖θ̂ − θ0‖₂ / ‖θ0‖₂ over the parameters both models name (a merged adapter names its base's)."""
    ref = dict(theta0.named_parameters())
    diff = norm = 0.0
    for name, p in model.named_parameters():
        if name in ref and ref[name].shape == p.shape:
            q = ref[name].to(p.device, torch.float32)
            diff += float((p.float() - q).pow(2).sum())
            norm += float(q.pow(2).sum())
    return math.sqrt(diff / norm) if norm else float("nan")


def weight_distances(plan: AuditPlan, ws: Workspace) -> dict[str, float | None]:
    """Each audited checkpoint's relative weight distance to θ0 (None without θ0)."""
    if THETA0 not in plan.models:
        return {name: None for name in plan.audited}
    theta0 = ws.frozen("theta0")
    return {name: weight_distance(plan.models[name].load(ws.dtype, ws.device), theta0) for name in plan.audited}
