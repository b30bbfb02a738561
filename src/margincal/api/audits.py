"""The audit as a library function: :func:`audit`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from margincal.api.common import local_paths, settings_of
from margincal.auditing import inputs as audit_inputs
from margincal.auditing.merge import merge_population, read_audits
from margincal.auditing.prepare import AuditRequest, prepare_audit, weight_distances
from margincal.auditing.report import write_audit
from margincal.auditing.search import run_searches
from margincal.config.settings import DEFAULT_DEVICE, DEFAULT_DTYPE, EvalSettings
from margincal.config.typed import checked_call
from margincal.core.artifacts import check_output
from margincal.data.checks import check_device
from margincal.pipeline.graph import run_graph
from margincal.results.outputs import AuditCard
from margincal.store.stage_store import Store, default_store
from margincal.training.curves import check_report_to


@checked_call
def audit(
    models: str | Sequence[str] | Mapping[str, str] = (),
    *,
    out: str | Path,
    models_file: str | None = None,
    from_panel: str | None = None,
    data: str | None = None,
    benchmark: str | None = None,
    tier: str | None = None,
    ref: str | None = None,
    ref_logs: str | None = None,
    theta0: str | None = None,
    budget: str = "quick",
    overrides: Sequence[str] = (),
    scale: str | None = None,
    base: str | None = None,
    settings: EvalSettings | Mapping[str, Any] | Sequence[str] | None = None,
    template: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    store: str | Path | None = None,
    control: str | None = None,
    claimed: Sequence[str] = (),
    report_to: str = "none",
    overwrite: bool = False,
    command: str = "margincal.audit(...)",
    log: Callable[[str], None] | None = None,
) -> AuditCard:
    """The relearn robustness card of ``models`` (``[NAME=]CKPT`` entries or a mapping name → checkpoint; also
    ``models_file`` lines and ``from_panel``'s cells): Δ with a bootstrap interval, the certificate, forget metrics,
    the five MIA detectors, utility, and the ``budget``'s relearn attacks and quantizers (``configs/audit.yaml``;
    ``worst*`` search attacks under a utility bound), each verdict the fraction of the θ_ref floor to θ0 ceiling gap
    it recovers. ``data``: a TOFU-format directory, or a mini export (its θ_ref, θ0 and tier are then the defaults).
    Every stage runs through the store; ``out`` gets ``card.json``, ``card.md`` and the figures; ``log`` gets a line
    per stage.

    Example (the polished model of :func:`~margincal.api.polish`'s example, one LoRA attack at K = 4)::

        card = margincal.audit({"npo_mc": p.out}, data=mini.dir, out=f"{tmp}/audit", overrides=[
            "attackers=[{preset: lora_r8, k: [4], set: {train.steps: 4}}]", "headline=lora_r8@4", "quantizers=[]"])
        print(card.delta("npo_mc"), card.recovered("npo_mc"))
    """
    check_device(device)
    check_report_to(report_to)
    resolved = audit_inputs.audited(_entries(models), models_file, from_panel)
    floor = audit_inputs.floor_and_ceiling(data, benchmark, tier, ref, ref_logs, theta0)
    if floor.note and log is not None:
        log(floor.note)
    # every input known (the export's θ_ref and θ0, the models file, the panel's results) before out is checked
    claims = audit_inputs.claimed(claimed)
    named = (data, floor.ref, ref_logs, floor.theta0, models_file, from_panel, base, *(m for m, _ in resolved))
    named += tuple(claim["path"] for _, claim in claims)
    out = check_output(out, directory=True, overwrite=overwrite, inputs=local_paths(*named))
    stages = Store(store or default_store())
    request = AuditRequest(
        models=resolved,
        data=data,
        benchmark=floor.benchmark,
        tier=floor.tier,
        ref=floor.ref,
        ref_logs=ref_logs,
        theta0=floor.theta0,
        budget=budget,
        overrides=overrides,
        scale=scale,
        base=base,
        settings=settings_of(EvalSettings, settings, "settings"),
        dtype=dtype,
        device=device,
        template=template,
        control=control,
    )
    plan, ws = prepare_audit(request, stages)
    claimed_by = audit_inputs.match_claims(claims, plan.audited)
    if log is not None:
        log(_planned(plan, stages, budget))
    run = run_graph(plan.graph, ws, stages, log, report_to)
    searches = run_searches(plan, ws, run, log)
    return write_audit(plan, run.paths, weight_distances(plan, ws), out, command, searches, claimed_by)


def _planned(plan, stages: Store, budget: str) -> str:
    """The audit's plan in one line: checkpoints, stages, how many the store holds, and where."""
    cached = sum(stages.done(n.kind, n.key) for n in plan.graph.nodes)
    nodes = len(plan.graph.nodes)
    return f"audit ({budget}): {len(plan.audited)} checkpoint(s), {nodes} stages ({cached} cached) in {stages.root}"


def _entries(models: str | Sequence[str] | Mapping[str, str]) -> list[str]:
    """``[NAME=]CKPT`` entries of ``models``: one entry, a list of them, or a mapping name → checkpoint."""
    if isinstance(models, Mapping):
        return [f"{k}={v}" for k, v in models.items()]
    return [models] if isinstance(models, str) else list(models)


@checked_call
def population(
    audits: Sequence[str | Path],
    *,
    out: str | Path,
    control: str | None = None,
    overwrite: bool = False,
    command: str = "margincal.api.population(...)",
) -> dict[str, Any]:
    """Merge several audits of one benchmark, data and floor/ceiling into one population view (``population.json``
    in ``out``: Δ and the other pre-attack signals against what the attacks recovered, with ``control`` named);
    returns the population.

    Example (not run by the tests as written: it needs audits of three checkpoints or more; ``tests/test_audit.py``
    merges some)::

        population = margincal.api.population(["runs/audit-a", "runs/audit-b"], out="runs/population")
        print(population["n_checkpoints"])
    """
    checked = read_audits(audits, control)  # every input checked before out
    target = check_output(out, directory=True, overwrite=overwrite, inputs=local_paths(*audits))
    return merge_population(checked, control, target, command)
