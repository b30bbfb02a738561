"""One population view over several audits (``margincal population``): a control audited after the population, or
checkpoints audited in parts on different machines, ranked and paired as if audited together.

A checkpoint's card depends only on that checkpoint, θ_ref, θ0, the data and the budget (every searched trial, the
winner and its floor and ceiling are its own), so cards of separate audits join one population exactly when those
agree. :func:`read_audits` checks that they do (budget, benchmark, tier, the split digests of the data, θ_ref's and
θ0's identities and what they measured: θ_ref's margin and the headline attack's floor and ceiling) and that no name
repeats; :func:`merge_population` then writes what one audit of all of them writes for its population
(:mod:`margincal.auditing.population`), with each source audit's card digest."""

from __future__ import annotations

import hashlib
from pathlib import Path

from margincal.auditing.card import SCHEMA
from margincal.auditing.population import POPULATION_MIN
from margincal.auditing.report import population_files
from margincal.core.artifacts import atomic_write_text, manifest, publish_dir
from margincal.core.errors import InputError
from margincal.core.inputs import MAX_JSON_BYTES, checked, parse_json, path_kind, read_text
from margincal.reporting.records import same_build
from margincal.results.cards import CheckpointCard
from margincal.results.outputs import AuditCard

AGREE = ("budget", "benchmark", "tier")  # the top-level card fields every merged audit must share


def _identities(card: AuditCard) -> dict[str, str | None]:
    """θ_ref's and θ0's identities (the model path where a card records none): where they live may differ."""
    return {role: entry.identity or entry.model for role, entry in card.reference.items()}


def _anchors(card: AuditCard) -> tuple:
    """What θ_ref and θ0 measured in an audit, the same for each of its checkpoints: θ_ref's margin on D_f (m_ref)
    and the headline attack's floor and ceiling (θ_ref and θ0 attacked with the same draws): a fingerprint of their
    weights, since an identity names a configuration and a rebuild of it need not be bit-identical."""
    out = set()
    for entry in card.checkpoints.values():
        verdict = entry.attacks.get(card.headline)
        detail = verdict.detail.get("rouge_l") if verdict is not None else None
        out.add((entry.delta.m_ref, *((detail.floor, detail.ceiling) if detail is not None else (None, None))))
    return tuple(sorted(out, key=repr))


def _same(a: tuple, b: tuple) -> bool:
    """Equal anchors, up to float rounding of the same computation on another CPU."""
    pairs = [pair for rows in zip(a, b, strict=False) for pair in zip(*rows, strict=True)]
    return len(a) == len(b) and all((x is None) == (y is None) and (x is None or same_build(x, y)) for x, y in pairs)


def _shown(anchors: tuple) -> str:
    """Anchors as m_ref/floor/ceiling, one group per distinct value."""
    return "; ".join("/".join("none" if v is None else f"{v:.4f}" for v in row) for row in anchors)


def read_audits(
    dirs: list[str | Path], control: str | None = None
) -> tuple[AuditCard, dict[str, CheckpointCard], list[dict]]:
    """(the first audit's card, every checkpoint card by name in the audits' order, one source entry per audit),
    refused with one line (:class:`ValueError`) unless every directory holds an audit's ``card.json`` (read as its
    :class:`~margincal.results.outputs.AuditCard`) and they agree on the budget, benchmark, tier, data and references,
    no checkpoint name repeats, ``control`` (if given) is one of the names and there are at least :data:`POPULATION_MIN`
    checkpoints."""
    if len(dirs) < 2:
        raise InputError("margincal population: give at least two audit directories (one audit writes its own)")
    first: AuditCard | None = None
    cards: dict[str, CheckpointCard] = {}
    sources = []
    for d in dirs:
        if path_kind(Path(d) / "card.json") == "missing":  # also a missing directory, or a file given for one
            raise InputError(f"{d}: no card.json; give directories written by margincal audit")
        path = checked(d, "", "directory", "directories written by margincal audit") / "card.json"
        text = read_text(path, "", MAX_JSON_BYTES, "an audit's card.json")
        data, raw = parse_json(text, str(path)), text.encode("utf-8")  # valid UTF-8: the bytes as read
        card = AuditCard.read(data, path)
        if card.schema != SCHEMA or card.provenance is None:
            raise InputError(f"{path}: not an audit card of schema {SCHEMA}; rerun that audit with this margincal")
        if first is None:
            first = card
        for key in AGREE:
            if getattr(card, key) != getattr(first, key):
                raise InputError(f"{d}: its {key} differs from {dirs[0]}'s; only audits of one {key} merge")
        if card.provenance.data != first.provenance.data:
            raise InputError(f"{d}: audited other data (split digests) than {dirs[0]}; only audits of one data merge")
        if _identities(card) != _identities(first):
            raise InputError(f"{d}: its θ_ref or θ0 differs from {dirs[0]}'s; only audits of one floor/ceiling merge")
        if not _same(_anchors(card), _anchors(first)):
            raise InputError(
                f"{d}: θ_ref's margin and the floor/ceiling (m_ref/floor/ceiling {_shown(_anchors(card))}) differ "
                f"from {dirs[0]}'s ({_shown(_anchors(first))}) under the same identities: the models were rebuilt, not "
                "bit-identically; only audits of one θ_ref and θ0 merge"
            )
        for name, entry in card.checkpoints.items():
            if name in cards:
                raise InputError(f"{d}: checkpoint {name!r} is also in an earlier audit; names must be unique")
            cards[name] = entry
        sources.append(
            {
                "audit": str(d),
                "card_sha256": hashlib.sha256(raw).hexdigest(),
                "checkpoints": list(card.checkpoints),
                "command": card.provenance.command,
                "git_commit": data.get("manifest", {}).get("git_commit"),  # the file's manifest, not the card's
                "graph_digest": card.provenance.graph_digest,
                "device": card.provenance.device,
            }
        )
    if control is not None and control not in cards:
        raise InputError(f"--control {control}: no audited checkpoint of that name (they are: {', '.join(cards)})")
    if len(cards) < POPULATION_MIN:
        raise InputError(f"{len(cards)} checkpoints in all; a population needs at least {POPULATION_MIN}")
    assert first is not None
    return first, cards, sources


def merge_population(
    audits: tuple[AuditCard, dict[str, CheckpointCard], list[dict]], control: str | None, out: Path, command: str
) -> dict:
    """Write ``population.json``, ``population.md`` and ``figures/population.png`` of the checkpoints of ``audits``
    (what :func:`read_audits` returned) into ``out``; returns the population."""
    first, cards, sources = audits
    headline = first.headline
    config = {"command": command, "sources": sources, "control": control}
    with publish_dir(out) as tmp:
        pop, section = population_files(
            tmp, cards, headline, control, {"sources": sources, "manifest": manifest(config, 0)}
        )
        md = [
            f"# Population ({first.budget['name']} budget): {first.benchmark} {first.tier}, merged",
            "",
            f"`{command}`",
            "",
            "Audits merged (same budget, benchmark, tier, data and θ_ref/θ0):",
            "",
            *[
                f"- `{s['audit']}` ({len(s['checkpoints'])} checkpoints; card sha256 {s['card_sha256'][:12]}; "
                f"commit {s['git_commit'] or 'unknown'}; {s['device']}): `{s['command']}`"
                for s in sources
            ],
            "",
            *section,
        ]
        atomic_write_text(tmp / "population.md", "\n".join(md))
    return pop
