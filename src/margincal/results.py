"""The typed results of margincal's public functions (:mod:`margincal.api`), one versioned JSON schema each.

Every result is a frozen dataclass: its fields are the numbers a researcher reads (``diagnosis.delta``,
``evaluation.summary["forget_rouge_l"]``), ``to_dict()`` is its JSON (a ``kind`` and ``schema_version`` first),
``save(path)`` writes that JSON atomically with a provenance manifest, and :func:`load` reads any saved result back
into its class, checked field by field (:func:`margincal.config.build_file`). The CLI's result files are these
objects saved, so ``margincal.load("npo.json")`` reads what ``margincal evaluate --out npo.json`` wrote.
No torch here: the report layer reads results without it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from margincal.artifacts import atomic_write_json, manifest
from margincal.config import build_file
from margincal.errors import InputError
from margincal.inputs import read_json

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Result:
    """What every typed result shares: ``to_dict``, ``save`` and ``from_dict`` (its class's ``KIND`` names it)."""

    KIND: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.KIND, "schema_version": SCHEMA_VERSION, **dataclasses.asdict(self)}

    def save(self, path: str | Path, config: dict | None = None, seed: int = 0) -> Path:
        """Write the result to ``path`` (JSON, atomic), with a manifest of ``config`` (what produced it) and
        ``seed``."""
        return atomic_write_json(path, {**self.to_dict(), "manifest": manifest(config or {}, seed)})

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "result"):
        """The result ``data`` holds (a saved file's JSON: its ``kind``, version and manifest set aside), every field
        checked against its type."""
        if data.get("kind") != cls.KIND:
            raise InputError(f"{source} is a {data.get('kind') or 'untyped'} result, not a {cls.KIND}")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise InputError(
                f"{source} has result schema {data.get('schema_version')!r}; this margincal reads {SCHEMA_VERSION} "
                "(write it again with this version)"
            )
        fields = {k: v for k, v in data.items() if k not in ("kind", "schema_version", "manifest")}
        return build_file(cls, fields, source)


@dataclasses.dataclass(frozen=True)
class Diagnosis(Result):
    """The margin diagnostic of one checkpoint on a forget split (:func:`margincal.api.diagnose`): the dataset
    margin m = agg_i min_t (z_{i,t,y} − max_{v≠y} z_{i,t,v}) (mean, or median for MUSE), the log-odds level ℓ, and
    against the retain-only reference θ_ref its margin m_ref, Δ = m − m_ref, the certificate ℓ > m_ref (Thm. 1:
    relearnable) and the crossing Δ ≤ 0; per-sample margins in ``diagnostic_margins``."""

    KIND: ClassVar[str] = "diagnosis"

    m: float
    log_odds: float
    n: int
    aggregate: str = "mean"
    m_ref: float | None = None
    delta: float | None = None
    certified: bool | None = None
    crossed: bool | None = None
    model: str | None = None
    forget: str | None = None
    ref: str | None = None
    diagnostic_margins: list[float] = dataclasses.field(default_factory=list)
    overlap_epsilon: float | None = None  # forget/retain word-bigram overlap, when a retain split was given

    @property
    def label(self) -> str:
        """Where the checkpoint stands against the margin cliff, in words."""
        return certificate_label(self.certified, self.delta)

    def numbers(self) -> dict[str, Any]:
        """The diagnostic's numbers alone, as an evaluation's ``diagnosis`` entry holds them."""
        keys = ("m", "log_odds", "m_ref", "delta", "certified", "crossed", "n", "aggregate")
        return {k: getattr(self, k) for k in keys}


def certificate_label(certified: bool | None, delta: float | None) -> str:
    """The certificate in words: certified (ℓ > m_ref) means the forget answers stay recoverable (Thm. 1)."""
    if certified is None:
        return "no reference margin: Δ and the certificate need θ_ref"
    if certified:
        return "above the cliff, certified (ℓ > m_ref): relearnable"
    if delta is not None and delta <= 0:
        return "at or below the cliff (Δ ≤ 0)"
    return "above the cliff (Δ > 0), not certified (ℓ ≤ m_ref)"


@dataclasses.dataclass(frozen=True)
class Evaluation(Result):
    """A benchmark's evaluation of one checkpoint (:func:`margincal.api.evaluate`): ``summary`` holds every metric
    of the benchmark's metric table by name (:mod:`margincal.evaluation.metric_table`), ``splits`` the per-split
    values (per-sample ones included); ``template`` is the prompt template it was scored under; ``cached`` tells
    whether the store served it."""

    KIND: ClassVar[str] = "evaluation"

    benchmark: str
    model: str
    tier: str
    summary: dict[str, Any]
    splits: dict[str, Any] = dataclasses.field(default_factory=dict)
    template: dict[str, Any] | None = None
    seconds: float = 0.0
    mmlu: dict[str, Any] | None = None
    cached: bool = False


@dataclasses.dataclass(frozen=True)
class AuditCard(Result):
    """An audit's card (:func:`margincal.api.audit`, ``margincal audit``): per checkpoint Δ with its bootstrap
    interval, the certificate, forget metrics, MIA, utility, and per attack and quantizer the recovered fraction
    between the θ_ref floor and the θ0 ceiling (``checkpoints[name]``, as ``<out>/card.json`` holds it); ``out`` is
    the directory with ``card.md`` and the figures. ``load(out)`` reads it back."""

    KIND: ClassVar[str] = "audit"

    out: str
    budget: dict[str, Any]
    benchmark: str
    tier: str
    checkpoints: dict[str, dict[str, Any]]

    @property
    def headline(self) -> str:
        """The budget's headline attack (``lora_r8@20``): the verdict the card's first table shows."""
        return self.budget["headline"]

    def delta(self, name: str) -> float | None:
        """Δ = m − m_ref of checkpoint ``name``."""
        return self.checkpoints[name]["delta"]["value"]

    def recovered(self, name: str, attack: str | None = None) -> float | None:
        """The fraction of the floor-to-ceiling gap ``attack`` (default the headline) recovers on ``name``."""
        return self.checkpoints[name]["attacks"][attack or self.headline]["recovered_fraction"]["value"]

    @classmethod
    def from_card(cls, card: dict[str, Any], out: str | Path) -> AuditCard:
        """The typed view of a ``card.json`` an audit wrote into ``out``."""
        fields = {k: card.get(k) for k in ("budget", "benchmark", "tier", "checkpoints")}
        return build_file(cls, {"out": str(out), **fields}, str(Path(out) / "card.json"))


KINDS: dict[str, type[Result]] = {cls.KIND: cls for cls in (Diagnosis, Evaluation, AuditCard)}


def load(path: str | Path) -> Result:
    """Any result margincal saved (``--out`` of ``diagnose`` or ``evaluate``, ``Result.save``; an audit's ``--out``
    directory or its ``card.json``), as its typed class."""
    path = Path(path)
    card = path / "card.json" if path.is_dir() else path
    data = read_json(card, "result")
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a margincal result (a JSON object expected)")
    if "kind" not in data and card.name == "card.json" and "checkpoints" in data:
        return AuditCard.from_card(data, card.parent)
    kind = data.get("kind")
    if kind is None:
        raise InputError(f"{path} names no result kind (an older margincal wrote it): write it again with this one")
    if kind not in KINDS:
        known = ", ".join(KINDS)
        raise InputError(f"{path} is not a typed margincal result (kind {kind!r}; known kinds: {known})")
    return KINDS[kind].from_dict(data, str(path))
