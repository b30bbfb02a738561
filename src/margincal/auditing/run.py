"""Resolve an audit (:func:`prepare_audit`: every check before the first forward pass) into a plan whose stage graph
runs through the store by the runner a panel's cell uses (:func:`margincal.pipeline.graph.run_graph`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from margincal.auditing.plan import AuditPlan, Checkpoint, audit_graph, checkpoint, load_budget
from margincal.config import EvalSettings, resolve_benchmark
from margincal.data.records import QARecord
from margincal.errors import InputError
from margincal.pipeline.graph import REFERENCE, THETA0
from margincal.stages import Workspace, build_workspace
from margincal.store import Store

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


def audit_splits(spec, tier: str, data: str | None) -> tuple[dict[str, list[QARecord]], list[str]]:
    """The benchmark's evaluation splits from ``data`` (a TOFU-format directory) or its own source, by the one split
    loader; the forget split (attacks, margins) and the membership roles (MIA, ``spec.membership``) are required, a
    missing utility split is left out (and named: second value)."""
    from margincal.data.benchmarks import load_benchmark_splits
    from margincal.data.tofu import load_split

    source = data or spec.source
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


def relearn_data(spec, tier: str, data: str | None, roles: Sequence[str]) -> tuple[dict, dict]:
    """The training data the budget's retain and probe attacks draw D_rel from, by the benchmark's ``train_splits``:
    (role → records of a split of ``data``, role → a sampled corpus entry ``{source, name, n}``). A role the
    benchmark names no split for, or whose split the data lacks, stops here with one line."""
    from margincal.data.benchmarks import fill_split
    from margincal.data.tofu import load_split

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


def check_prompts(ws: Workspace, label: str, cfg) -> None:
    """The prompts a no-training attack builds fit the benchmark's max_length, checked by tokenising them before any
    model is loaded: in-context relearning's K D_rel pairs before each held-out question, the format probe's K
    wordings of every forget question."""
    from margincal.data.records import encode_qa
    from margincal.stages import attack_inputs, reworded

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
    if name in (REFERENCE, THETA0):
        raise InputError(f"{name!r} names θ_ref or θ0 in an audit; name the checkpoint otherwise (NAME=CKPT)")
    if name in CARD_ENTRIES:
        raise InputError(f"{name!r} names a file of the audit's card; name the checkpoint otherwise (NAME=CKPT)")


def _tokenizer_identity(source: str, template: str | None) -> tuple[str, dict]:
    """A model's tokenizer as the audit compares them: the digest of its vocabulary and the identity of the prompt
    template it is scored under (``template`` given, else detected; :func:`margincal.data.templates.template_identity`;
    a given template the tokenizer cannot render stops here)."""
    from margincal.artifacts import digest
    from margincal.data.templates import template_identity
    from margincal.models import load_tokenizer

    tok = load_tokenizer(source, template)
    return digest(sorted(tok.get_vocab().items())), template_identity(tok)


def check_templates(templates: dict[str, dict], shown: dict[str, str]) -> None:
    """Every model of an audit is scored under one prompt template: the first audited checkpoint's. A model whose
    tokenizer would render prompts otherwise (another template, another chat template, none) is refused, naming
    both, before any model is loaded; scored under the first's template its margins and answers would not be its
    own."""
    from margincal.data.templates import describe_template

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
    from margincal.models import TOKENIZER_FILES

    here = Path(ckpt.path)
    if ckpt.base and here.is_dir() and not any((here / f).exists() for f in TOKENIZER_FILES):
        return ckpt.base
    return ckpt.spec


def _roles(
    models: Sequence[tuple[str, str | None]],
    ref: str | None,
    theta0: str | None,
    base: str | None,
    store: Store,
    identify: bool,
) -> dict[str, Checkpoint]:
    """role -> checkpoint: the audited ones by name (each name valid and unique), then θ_ref and θ0 where given."""
    roles: dict[str, Checkpoint] = {}
    for spec_str, name in models:
        ckpt = checkpoint(spec_str, name, base, store, identify=identify)
        _check_role_name(ckpt.name)
        if ckpt.name in roles:
            raise InputError(f"two audited checkpoints are named {ckpt.name!r}; name them (NAME=CKPT)")
        roles[ckpt.name] = ckpt
    for role, given in ((REFERENCE, ref), (THETA0, theta0)):
        if given:
            roles[role] = dataclasses.replace(checkpoint(given, role, store=store, identify=identify), name=role)
    return roles


def prepare_audit(
    models: Sequence[tuple[str, str | None]],
    *,
    data: str | None,
    benchmark: str | None,
    tier: str,
    ref: str | None,
    ref_logs: str | None,
    theta0: str | None,
    budget: str,
    overrides: Sequence[str] = (),
    scale: str | None = None,
    base: str | None = None,
    settings: EvalSettings | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    template: str | None = None,
    store: Store,
    control: str | None = None,
) -> tuple[AuditPlan, Workspace]:
    """Every input resolved and checked before any model is loaded: the budget, the checkpoints (digests, pinned
    revisions, adapter bases), one tokenizer for all of them, the data (forget and holdout present, every K below
    |D_f|), the quantizers' packages and open-unlearning logs; then the plan's stage nodes and the workspace."""
    from margincal.artifacts import digest
    from margincal.auditing.interop import read_retain_logs
    from margincal.auditing.search import resolve_searches, split_for
    from margincal.checks import check_budgets
    from margincal.data.benchmarks import data_identity
    from margincal.data.records import evaluated_fields
    from margincal.models import check_vocabulary, model_config
    from margincal.quantize import resolve_quantizer

    if ref and ref_logs:
        raise InputError("give θ_ref as --ref (a checkpoint) or --ref-logs (open-unlearning logs), not both")
    for name in [name for _, name in models if name is not None]:  # typed names first: nothing is read before
        _check_role_name(name)
    plan_budget = load_budget(budget, list(overrides))
    for name in plan_budget.quantizers:
        resolve_quantizer(name)
    spec = resolve_benchmark(benchmark or "tofu")
    scale = scale or ("mini" if spec.name == "mini" else "paper")
    # the data, the logs and the budget against |D_f| first: a refusal there reads no checkpoint
    splits, missing = audit_splits(spec, tier, data)
    logs = read_retain_logs(ref_logs, splits["forget"]) if ref_logs else None
    seeds = range(plan_budget.draws)
    attacks = {f"{s.label}/d{d}": s.resolve(scale, d) for s in plan_budget.specs() for d in seeds}
    forget_ks = sorted({c.k for c in attacks.values() if c.data == "forget"})
    corpus = spec.relearn_from == "corpus"  # forget-data attacks draw D_rel from the forget corpus (WMDP)
    if not corpus:
        check_budgets(forget_ks, len(splits["forget"]), f"the {budget} audit budget")
    searches = resolve_searches(plan_budget, scale, spec.utility, missing, corpus)
    split = split_for(searches, len(splits["forget"]))  # which forget records a search may train, select, report on
    relearn_roles = sorted({c.data for c in attacks.values()} - (set() if corpus else {"forget"}))
    train_records, corpora = relearn_data(spec, tier, data, relearn_roles)
    # every checkpoint checked, and every tokenizer compared, before any is identified (digests are cached)
    unidentified = _roles(models, ref, theta0, base, store, identify=False)
    named = [r for r in unidentified if r not in (REFERENCE, THETA0)]
    if control is not None and control not in named:
        raise InputError(f"--control {control}: no audited checkpoint is named so ({', '.join(named)})")
    sources = {role: _tokenizer_source(c) for role, c in unidentified.items()}
    tokenizers = {role: _tokenizer_identity(src, template) for role, src in sources.items()}
    first = next(iter(unidentified))
    for role, (vocab, _) in tokenizers.items():
        if vocab != tokenizers[first][0]:
            raise InputError(
                f"{role} ({unidentified[role].spec}) has another tokenizer than {first} ({unidentified[first].spec}): "
                "margins and answers are only comparable under one tokenizer"
            )
    templates = {role: identity for role, (_, identity) in tokenizers.items()}
    check_templates(templates, {role: c.spec for role, c in unidentified.items()})
    roles = _roles(models, ref, theta0, base, store, identify=True)
    audited = {name: roles[name] for name in unidentified if name not in (REFERENCE, THETA0)}
    first_ckpt = audited[first]
    frozen = {r: roles[r].spec for r in (THETA0, REFERENCE) if r in roles}
    ws = build_workspace(
        first_ckpt.base or first_ckpt.spec,
        spec,
        splits,
        train_records,
        corpora=corpora,
        models={"theta0" if r == THETA0 else "ref": s for r, s in frozen.items()},
        model_ids={"theta0" if r == THETA0 else "ref": roles[r].identity for r in frozen},
        tokenizer=sources[first],
        template=template,
        dtype=dtype,
        device=device,
    )
    for ckpt in roles.values():  # every model, not only the one the workspace was built on, embeds every id
        check_vocabulary(ws.tokenizer, model_config(ckpt.base or ckpt.spec), ckpt.spec)
    for label, cfg in attacks.items():  # a pool smaller than K would draw less than the budget says
        if cfg.data in relearn_roles and cfg.k > len(ws.train[cfg.data]):
            raise InputError(f"attack {label}: K={cfg.k} exceeds the {len(ws.train[cfg.data])} {cfg.data} records")
        if cfg.name in ("in_context", "format_probe"):
            check_prompts(ws, label, cfg)
    data_id = data_identity(ws.benchmark, tier, dataclasses.asdict(ws.tokenizer.margincal_template), splits)
    train_id = {role: digest([evaluated_fields(r) for r in recs]) for role, recs in train_records.items()} | corpora
    settings = settings or EvalSettings()
    ws.anchor_cache = store.root  # anchor margin tables under <store>/anchors
    graph, builder = audit_graph(
        roles, list(audited), data_id, settings, dtype, attacks, plan_budget.quantizers, logs, train_id or None
    )
    plan = AuditPlan(
        models=roles,
        audited=list(audited),
        spec=ws.benchmark,
        tier=tier,
        data_id=data_id,
        missing=missing,
        scale=scale,
        budget_name=budget,
        budget=plan_budget,
        attacks=attacks,
        eval=settings,
        dtype=dtype,
        device=ws.device,
        ref_logs=logs,
        graph=graph,
        templates=templates,
        builder=builder,
        searches=searches,
        split=split,
        control=control,
    )
    return plan, ws


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
