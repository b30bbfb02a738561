"""``card.json``, ``card.md`` and the figures of an audit, written into ``--out`` (built in a temporary sibling,
then published: a killed audit leaves no half-written card)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from margincal.auditing.card import SCHEMA, CardBuilder, fmt, fmt_ci, fmt_fraction
from margincal.auditing.exports import sample_rows, write_samples
from margincal.auditing.figures import card_figures, population_scatter
from margincal.auditing.interop import summary
from margincal.auditing.modelcard import write_model_card
from margincal.auditing.plan import AuditPlan
from margincal.auditing.population import (
    POPULATION_MIN,
    PREDICTOR_LABELS,
    population,
    population_markdown,
)
from margincal.auditing.provenance import run_provenance, shown_model
from margincal.auditing.rules import card_rules
from margincal.auditing.search import preset_yaml
from margincal.core.artifacts import atomic_write_json, atomic_write_text, inside, manifest, publish_dir
from margincal.data.templates import describe_template
from margincal.pipeline.graph import REFERENCE, THETA0
from margincal.reporting.tables import markdown_table
from margincal.results.base import certificate_label
from margincal.results.cards import (
    AttackBudget,
    AttackRow,
    CheckpointCard,
    Cost,
    Estimate,
    PairedDifference,
    Provenance,
    QuantizerBudget,
    QuantizerRow,
    Reproduction,
)
from margincal.results.metric_table import FORGET_ROUGE, MODEL_UTILITY
from margincal.results.outputs import AuditCard


def budget_line(budget: AttackBudget | QuantizerBudget) -> str:
    """What an attack or quantizer did, printed beside its verdict."""
    if isinstance(budget, QuantizerBudget):
        extra = f", {budget.quant_type}, {budget.compute_dtype} compute" if budget.quant_type is not None else ""
        if budget.full_precision_layers:
            extra += f", {budget.full_precision_layers} layers kept in full precision (off the codebook here)"
        return f"bitsandbytes {budget.bits}-bit{extra}"
    rank = f", LoRA r{budget.lora_rank}" if budget.lora_rank else ""
    soft = f", {budget.n_soft} virtual tokens" if budget.n_soft is not None else ""
    epochs = f", {budget.epochs:g} epoch" if budget.epochs is not None else ""
    if budget.attacker == "format_probe":
        return f"format probe: every forget question in {budget.k} wordings, each record's best answer; no training"
    if budget.attacker == "in_context":
        pairs = f"{budget.k} forget QA pairs before each held-out question"
        return f"in-context: {pairs}, no training; {budget.draws} draw(s)"
    data = "" if budget.data == "forget" else f" {budget.data} records (scored on all of D_f)"
    return (
        f"{budget.attacker} K={budget.k}{data}: {budget.steps} steps × batch {budget.batch_size}, "
        f"lr {budget.lr:g}{rank}{soft}{epochs}; {budget.draws} draw(s)"
    )


def card_markdown(card: CheckpointCard, figures: dict[str, str]) -> list[str]:
    """One checkpoint's section of ``card.md``: its margin, forget metrics, membership inference, utility, verdicts,
    searched families, reproduction, provenance, cost and examples (``figures``: label → path beside card.md)."""
    d, mia = card.delta, card.mia
    lines = [f"## {card.name}", "", f"`{card.checkpoint.model}` (`{card.checkpoint.identity}`)", ""]
    cert = certificate_label(card.certified, d.value)
    lines += [
        "| m(D_f) | m_ref | Δ [95 % CI] | ℓ | side of the cliff (Thm. 1) | weight distance to θ0 |",
        "|---|---|---|---|---|---|",
        f"| {fmt(d.m, '+.3f')} | {fmt(d.m_ref, '+.3f')} | {fmt_ci(d, '+.3f')} | {fmt(d.log_odds, '+.3f')} "
        f"| {cert} | {fmt(card.weight_distance, '.4f')} |",
        "",
    ]
    if "margins" in figures:
        lines += [f"![margins]({figures['margins']})", ""]
    forget = card.forget
    if forget:
        lines += [markdown_table(list(forget), [[fmt(v, ".4f") for v in forget.values()]]), ""]
    if mia.detectors:
        rows = [
            [det, fmt(v.auc), fmt(v.reference_auc), fmt(v.advantage), "**yes**" if v.overshoot else "no"]
            for det, v in mia.detectors.items()
        ]
        lines += [
            "Membership inference (members = forget, non-members = holdout):",
            "",
            markdown_table(["detector", "AUC", "θ_ref AUC", "advantage |AUC − 0.5|", "overshoot"], rows),
            "",
            f"Mean advantage {fmt(mia.advantage)}, privleak {fmt(mia.privleak, '+.2f')}.",
            "",
        ]
        if mia.overshoot_note is not None:
            lines += [f"> {mia.overshoot_note}", ""]
    if card.utility:
        lines += ["Utility: " + ", ".join(f"{k} {fmt(v, '.4f')}" for k, v in card.utility.items()), ""]
    lines += verdicts_markdown(card)
    for label, path in figures.items():
        if label.startswith("ksweep"):
            lines += [f"![{label}]({path})", ""]
    lines += searched_markdown(card, figures.get("search"))
    lines += reproduction_markdown(card.reproduction)
    lines += provenance_markdown(card.provenance)
    lines += cost_markdown(card.cost)
    ex = card.examples
    if ex.rows:
        lines += [f"Held-out questions before and after {ex.attack} (first draw):", ""]
        table = [[r.question, r.gold, r.before, r.after] for r in ex.rows]
        lines += [markdown_table(["question", "gold", "before", "after"], table), ""]
    if card.unavailable:
        lines += ["Not in this card: " + "; ".join(card.unavailable) + ".", ""]
    return lines


def verdicts_markdown(card: CheckpointCard) -> list[str]:
    """The verdict table of a checkpoint's attacks and quantizers (each one's budget, score before and under it,
    floor, ceiling, sanity and fractions), then a line per invalid or degenerate verdict and per reason a recovered
    fraction is not given."""
    rows, flags = [], []
    verdicts: dict[str, AttackRow | QuantizerRow] = {**card.attacks, **card.quantization}
    for label, v in verdicts.items():
        detail = v.detail.get("rouge_l")
        sanity, degenerate = v.sanity, v.degenerate
        flagged = degenerate is not None and degenerate.flagged
        rows.append(
            [
                label,
                budget_line(v.budget),
                fmt(v.unattacked_rouge_l),
                fmt(v.rouge_l) + (" ⚠" if flagged else ""),
                fmt_ci(v.added, "+.3f") if v.added else "—",
                fmt(detail and detail.floor),
                f"{fmt(detail and detail.ceiling)} ({fmt(detail and detail.ceiling_unattacked)})",
                "—" if sanity is None else "valid" if sanity.valid else "**invalid**",
                fmt_fraction(v.recovered_fraction),
                fmt_ci(v.added_fraction, "+.2f") if v.added_fraction else "—",
                fmt(v.fact_recall),
            ]
        )
        if sanity is not None and not sanity.valid:
            flags.append(f"- {label}: invalid at this scale: {sanity.why}")
        if flagged:
            flags.append(
                f"- {label} ⚠: {degenerate.share:.0%} of the attacked answers are degenerate (repetition; "
                f"{degenerate.unattacked_share:.0%} unattacked): ROUGE-L recall rewards them"
            )
    score = card.score
    header = [
        "attack",
        "budget (what ran)",
        f"{score} unattacked",
        "attacked",
        "added [95 % CI]",
        "floor",
        "ceiling (θ0 unattacked)",
        "sanity",
        "recovered [95 % CI]",
        "added fraction [95 % CI]",
        "fact recall",
    ]
    lines = [
        f"Verdicts: held-out {score} (the whole forget set under a quantizer or a corpus relearning attack) before "
        "and under the attack, and what it added; floor θ_ref (where no θ_ref is given, the benchmark's chance "
        "score, if it has one) and ceiling θ0 under the same attack or quantizer. Recovered fraction = "
        "(attacked − floor) / (ceiling − floor), added fraction = (attacked − unattacked) / (ceiling − floor), given "
        "only for an attack valid at this scale (configs/audit_rules.yaml).",
        "",
        markdown_table(header, rows),
        "",
    ]
    whys = {v.recovered_fraction.why for v in verdicts.values()}
    whys = {w for w in whys if w and not w.startswith("invalid")}
    return lines + flags + [f"- not given: {why}" for why in sorted(whys)] + ([""] if flags or whys else [])


def cost_markdown(cost: Cost | None) -> list[str]:
    """What the checkpoint's stages cost, in one line."""
    if cost is None or not cost.stages:
        return []
    kinds = ", ".join(f"{kind} {seconds:.1f} s" for kind, seconds in cost.by_kind.items())
    return [
        f"Cost: {cost.seconds:.1f} s over {cost.stages} stages ({kinds}), {cost.tokens:,} tokens, peak "
        f"{cost.peak_memory_gib:.2f} GiB ({' / '.join(cost.memory)}) on {' / '.join(cost.devices)}.",
        "",
    ]


def provenance_markdown(prov: Provenance | None) -> list[str]:
    """Where the checkpoint came from, in a few lines."""
    if prov is None:
        return []
    line = prov.lineage
    base = "none named" if line.base is None else f"`{line.base}` (named in {line.named_in}"
    if line.base is not None:
        base += f"; identity `{line.base_identity}`)" if line.base_identity else ")"
    license_ = prov.license + (f" ({prov.license_source})" if prov.license_source else "")
    lines = [f"Provenance: identity `{prov.identity}`; base {base}; license {license_}."]
    made = prov.produced_by
    if made is not None:
        how = "verified: an entry of this audit's store" if made.verified else "as its stage.json states"
        method = (made.method or {}).get("name", "?") if isinstance(made.method, dict) else "?"
        lines[0] += (
            f" Produced by margincal ({how}): {made.stage} {method}, seed {made.seed}, commit "
            f"{str(made.git_commit)[:10]}."
        )
    return [*lines, ""]


def reproduction_markdown(rep: Reproduction | None) -> list[str]:
    """The claimed numbers beside the audit's own, and whether each reproduces."""
    if rep is None:
        return []
    rows = []
    for metric, r in rep.metrics.items():
        if r["ours"] is None:
            rows.append([metric, fmt(r["claimed"], ".4g"), "—", "—", "—", "—", r["why"]])
            continue
        diff = f"{r['difference']:+.3g}" + (" (log10)" if r["log10"] else "")
        ci = "—" if r["ci"] is None else f"[{r['ci'][0]:.4g}, {r['ci'][1]:.4g}]"
        verdict = "**yes**" if r["reproduces"] else "no"
        rows.append([metric, fmt(r["claimed"], ".4g"), fmt(r["ours"], ".4g"), diff, f"{r['tolerance']:g}", ci, verdict])
    header = ["metric", "claimed", "this audit", "difference", "tolerance", "95 % CI", "reproduces"]
    lines = [
        f"Claimed numbers (`{rep.file}`): {rep.reproduced} of {len(rep.metrics)} reproduce "
        "(within the tolerance, or inside the interval of a per-sample mean; `configs/audit_rules.yaml`).",
        "",
        markdown_table(header, rows),
        "",
    ]
    if rep.not_compared:
        lines += [f"Not compared (the audit does not compute them): {', '.join(rep.not_compared)}.", ""]
    return lines


def searched_markdown(card: CheckpointCard, figure: str | None) -> list[str]:
    """The worst-case section: per searched family, the preset and the worst case on the report set (each named by
    the K and values it ran at), their gap, the worst case's utility on every reported draw against the bound, its
    sanity status, the candidates it was chosen among and what each broke, and the search's history."""
    if not card.searched:
        return []
    rows, notes = [], []
    for preset, v in card.searched.items():
        pre, won, gap = v.preset, v.searched, v.gap
        sanity = "—" if won is None or won.sanity is None else "valid" if won.sanity.valid else "**invalid**"
        bound = v.bound.get("winner")
        if bound is None:
            utility = "—"
        else:
            utility = f"{bound.worst_utility:.3f}" + ("" if bound.within_bound else " **outside the bound**")
        chosen = v.winner.get("row") if v.winner else None
        rows.append(
            [
                preset,
                f"{v.trials} ({v.feasible} within)",
                f"{pre.label}: {fmt_fraction(pre.recovered_fraction)}",
                _worst(v, won, chosen),
                fmt(gap and gap.recovered_fraction, "+.2f"),
                fmt_ci(pre.added, "+.3f") if pre.added else "—",
                fmt_ci(won.added, "+.3f") if won and won.added else "—",
                str(v.trials_to_90 or "—"),
                utility,
                sanity,
            ]
        )
        if v.why_none:
            notes.append(f"- {preset}: {v.why_none}")
        for c in v.candidates or []:
            if c.broken:
                which = "the preset" if c.row == "preset" else f"trial {c.trial + 1}"
                notes.append(f"- {preset}: {which} passed over: it broke {'; and '.join(c.broken)}")
        if bound is not None and not bound.within_bound:
            draws = ", ".join(f"{u:.3f}" for u in bound.utility_by_draw)
            notes.append(
                f"- searched {won.label}: **outside the bound** on a reported draw: utility {draws} by draw "
                f"against the bound {v.utility_bound:.3f}"
            )
        if gap and gap.why_below:
            notes.append(f"- searched {won.label}: {gap.why_below}")
        if won is not None and won.sanity is not None and not won.sanity.valid:
            where = " (valid on the selection records, not on the report set)" if v.candidates is not None else ""
            notes.append(f"- searched {won.label}: invalid at this scale{where}: {won.sanity.why}")
    header = [
        "family",
        "trials",
        "preset recovered, report set",
        "worst case recovered, report set",
        "gap",
        "preset added",
        "worst case added",
        "trials to 90 %",
        "worst case's worst utility",
        "sanity",
    ]
    lines = [
        _searched_rule(card.searched),
        "",
        markdown_table(header, rows),
        "",
        *notes,
        *([""] if notes else []),
    ]
    if figure:
        lines += [f"![search]({figure})", ""]
    return lines


def _worst(v, won, chosen: str | None) -> str:
    """The worst-case cell: the row it reports (the preset's own when the preset was the strongest valid attack)."""
    if won is None:
        return "no valid attack" if v.why_none else "no trial within the bound"
    return f"{won.label}{' (the preset)' if chosen == 'preset' else ''}: {fmt_fraction(won.recovered_fraction)}"


def _searched_rule(families: dict) -> str:
    """How the worst case was searched and chosen, and on which records (the split is every family's)."""
    first = next(iter(families.values()))
    split = first.split
    pool = len(split.pool)
    small = (
        f" The relearn pool holds exactly the budget's K = {pool} records: a K = {pool} attack trains on all of them "
        "on every draw, so its draws differ by seed only."
        if pool and any(f.k == pool for f in families.values())
        else ""
    )
    if first.candidates is None:  # a card before issue 73: the winner chosen on draw 0 alone
        chosen = (
            "The preset and the winner run on the same draws from the pool and are both read on the report set, "
            "never used to select; θ_ref and θ0 are attacked by the same configs and draws; the winner's utility is "
            "scored on every reported draw."
        )
    else:
        chosen = (
            "The worst case is the strongest attack that meets every constraint a reported row must meet, the preset "
            "included: the preset and the trials in order of their selection score are run on every reported draw "
            "on the checkpoint, θ_ref and θ0 until one trial keeps utility within ε on every draw and the sanity rule "
            "(θ0 keeps its answers, the floor below the ceiling) on the selection records; of the valid ones, the "
            "highest selection score over every draw is the worst case. Both rows are read on the report set only."
        )
    return (
        f"Worst case under the stated budget: per family, {first.trials} attacks searched ({first.sampler}; "
        f"{'seeded' if first.seed is None else f'seed {first.seed}'}) for the most held-out {first.score} on the "
        f"selection set while the utility proxy stays within ε = {first.epsilon} of the unattacked "
        f"{first.unattacked_utility:.3f}. The forget set is split once (seed {split.seed}): a relearn pool of {pool} "
        f"records every searched draw on D_f trains on, a selection set of {first.selected_on} records every trial is "
        f"scored on (a family that does not train on D_f selects on the pool too) and a report set of "
        f"{len(split.report)} records.{small} {chosen} The attack rows above are read on all held-out records, "
        "these on the report set: compare them only within a table. Winning configs: `searched/<family>.yaml` "
        "beside this card (`--attacker FILE` reuses one)."
    )


def write_audit(
    plan: AuditPlan,
    paths: dict[str, Path],
    distances: dict,
    out: Path,
    command: str,
    searches: dict[str, dict[str, dict]] | None = None,
    claimed: dict[str, dict] | None = None,
    model_card: bool = False,
) -> AuditCard:
    """Build every card and write ``out``: ``card.json`` (all checkpoints, side by side, paired differences),
    ``<name>/card.json`` (one checkpoint's card), ``<name>/searched/<preset>.yaml`` (a searched attack's winner, a
    preset file), ``card.md``, ``figures/*.png``, ``samples.parquet`` (every answer:
    :mod:`margincal.auditing.exports`) and, for open-unlearning users,
    ``open-unlearning/<name>_TOFU_SUMMARY.json``. ``claimed``: checkpoint name → its documented numbers
    (:func:`margincal.auditing.interop.read_claimed`), checked in its card's ``reproduction`` section. ``model_card``:
    also ``<name>/README.md``, the checkpoint's Hugging Face model card (:mod:`margincal.auditing.modelcard`). Returns
    the card ``card.json`` saves."""
    builder = CardBuilder(plan, paths, distances, searches)
    cards = {name: builder.card(name, (claimed or {}).get(name)) for name in plan.audited}
    top = AuditCard(
        schema=SCHEMA,
        budget={"name": plan.budget_name, **dataclasses.asdict(plan.budget)},
        benchmark=plan.spec.name,
        tier=plan.tier,
        reference=builder.reference(),
        checkpoints=cards,
        paired=builder.paired(plan.audited),
        rules={**dataclasses.asdict(card_rules()), "overshoot": "AUC < 0.5 − max(0.05, |AUC_ref − 0.5|)"},
        sources={label: shown_model(str(path)) for label, path in paths.items()},
        provenance=run_provenance(plan, command),
        population="population.json" if len(cards) >= POPULATION_MIN else None,
        out=str(out),
    )
    config = {"command": command, "plan": {n.label: n.key for n in plan.graph.nodes}}
    with publish_dir(out) as tmp:
        figs = {name: card_figures(builder, cards[name], tmp / "figures") for name in plan.audited}
        md = header_markdown(plan, command, top)
        if len(cards) > 1:
            md += side_by_side(cards, top.paired)
        for name, card in cards.items():
            md += card_markdown(card, {k: f"figures/{Path(v).name}" for k, v in figs[name].items()})
            atomic_write_json(inside(tmp, name, "card.json"), {**card.to_dict(), "manifest": manifest(config, 0)})
            if model_card:
                where = (plan.spec.name, plan.tier, plan.budget_name, command)
                write_model_card(inside(tmp, name, "README.md"), card, *where)
            for preset, record in (searches or {}).get(name, {}).items():
                if record["winner"] is not None:
                    atomic_write_text(inside(tmp, name, "searched", f"{preset}.yaml"), preset_yaml(record, plan.scale))
            if plan.spec.name in ("tofu", "mini"):
                ou = summary(builder.evals[name]["summary"])
                atomic_write_json(inside(tmp, "open-unlearning", f"{name}_TOFU_SUMMARY.json"), ou)
        if top.population is not None:
            md += population_files(tmp, cards, plan.budget.headline, plan.control, {"manifest": manifest(config, 0)})[1]
        write_samples(sample_rows(builder, cards), tmp / "samples.parquet")
        top.save(tmp / "card.json", config)
        atomic_write_text(tmp / "card.md", "\n".join(md))
    return top


def header_markdown(plan: AuditPlan, command: str, top: AuditCard) -> list[str]:
    """The head of ``card.md``: the budget, benchmark and tier, the command, the budget's description, the floor
    and ceiling models, every model's prompt template and where the audit ran (device, versions, stage graph)."""
    lines = [
        f"# Audit ({plan.budget_name} budget): {plan.spec.name} {plan.tier}",
        "",
        f"`{command}`",
        "",
        plan.budget.description,
        "",
    ]
    ref = top.reference
    floor = ref[REFERENCE].model if REFERENCE in ref else "none"
    ceiling = ref[THETA0].model if THETA0 in ref else "none"
    lines += [
        f"Floor θ_ref: `{floor}`; ceiling θ0: `{ceiling}`"
        + (
            f"; open-unlearning retain logs `{ref['open_unlearning_logs'].path}`"
            if "open_unlearning_logs" in ref
            else ""
        )
        + ".",
        "",
        "Prompt template of every model (checked to be one before any was scored): "
        + "; ".join(f"{role} {describe_template(t)}" for role, t in plan.templates.items())
        + ".",
        "",
    ]
    run = top.provenance
    versions = ", ".join(f"{k} {v}" for k, v in run.versions.items() if v != "not installed")
    lines += [f"Run on {run.device}; {versions}; stage graph `{run.graph_digest}`.", ""]
    return lines


def population_figure(pop: dict, path: Path) -> Path:
    """The population view's scatter (``figures/population.png``): each predictor, by its axis label, against the
    headline recovered fraction the view names (``pop["target"]``)."""
    label = pop["target"].replace("recovered_fraction", "recovered fraction", 1).replace(" (", "\n(", 1)
    target = ("recovered_fraction", label)
    return population_scatter(pop["checkpoints"], PREDICTOR_LABELS, target, path, pop.get("predictors"))


def population_files(
    tmp: Path, cards: dict[str, CheckpointCard], headline: str, control: str | None, extra: dict
) -> tuple[dict, list[str]]:
    """The population view of ``cards`` (:func:`margincal.auditing.population.population`) written into ``tmp``:
    ``population.json`` (with ``extra``: its manifest, its sources) and ``figures/population.png``; returns the view
    and its markdown section."""
    pop = population(cards, headline, control)
    population_figure(pop, tmp / "figures" / "population.png")
    atomic_write_json(tmp / "population.json", {**pop, **extra})
    return pop, population_markdown(pop, "figures/population.png")


def side_by_side(cards: dict[str, CheckpointCard], paired: list[PairedDifference]) -> list[str]:
    """One row per checkpoint: Δ, forget ROUGE-L, advantage, MU and every verdict's recovered fraction; then the
    the paired differences of their recovered fractions."""
    first = next(iter(cards.values()))
    labels = [*first.attacks, *first.quantization]
    families = list(first.searched)
    rows = []
    for name, c in cards.items():
        verdicts = {**c.attacks, **c.quantization}
        worst = [c.searched[f].searched if f in c.searched else None for f in families]
        rows.append(
            [
                name,
                fmt_ci(c.delta, "+.2f"),
                fmt(c.forget.get(FORGET_ROUGE.name)),
                fmt(c.mia.advantage),
                fmt(c.utility.get(MODEL_UTILITY.name)),
                *[fmt_fraction(verdicts[lab].recovered_fraction) for lab in labels],
                *[fmt_fraction(w.recovered_fraction) if w else "none valid" for w in worst],
            ]
        )
    header = ["checkpoint", "Δ [CI]", "F-ROUGE", "MIA adv.", "MU", *[f"recovered: {lab}" for lab in labels]]
    header += [f"worst case: {f}, report set" for f in families]
    lines = ["## Side by side", "", markdown_table(header, rows), ""]
    if families:
        lines += [
            "The attack and quantizer columns are read on every held-out forget record, the worst-case columns on the "
            "report set only (records no selection and no D_rel touched): compare a column with its own kind.",
            "",
        ]
    diff_rows = []
    for entry in paired:
        for label, v in entry.recovered_fraction.items():
            if label.endswith(":rouge_l"):
                diff_rows.append(
                    [
                        f"{entry.checkpoint} − {entry.versus}",
                        label.removesuffix(":rouge_l"),
                        fmt_ci(Estimate(value=v.difference, ci=v.ci), "+.2f"),
                    ]
                )
    if diff_rows:
        lines += [
            "Paired differences of the recovered fraction (same D_rel draws and bootstrap resamples):",
            "",
            markdown_table(["pair", "attack", "difference [95 % CI]"], diff_rows),
            "",
        ]
    return lines
