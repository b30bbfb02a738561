"""The base of every typed result and the one result stage code builds, the margin diagnosis.

:class:`Result`: ``to_dict`` (a ``kind`` and ``schema_version`` first, then the fields its JSON writes),
``save`` (atomic, with a manifest) and ``from_dict`` (every field checked against its type). The JSON rules every
result and card entry follows: :func:`json_copy` writes a dataclass's fields in order, a field marked :data:`LEADS`
before those it inherits, leaving out a model held in memory (:data:`IN_MEMORY`) and an empty :func:`sometimes`.
:class:`Diagnosis` is here, apart from the other results (:mod:`margincal.results.outputs`,
:mod:`margincal.results.cards`), because
the margin code that computes it is part of every stage's code version (:func:`margincal.pipeline.graph.stage_version`):
a change to another result's schema leaves the stored stages valid. No torch here (report layer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from margincal.config.files import build_file
from margincal.core.artifacts import atomic_write_json, check_output, manifest
from margincal.core.errors import InputError

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Result:
    """What every typed result shares: ``to_dict``, ``save`` and ``from_dict`` (its class's ``KIND`` names it)."""

    KIND: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """The result's JSON: its kind, the schema version and every field it writes
        (:func:`margincal.results.cards.written`:
        not a model or a directory held in memory, nor an optional section left empty)."""
        return {"kind": self.KIND, "schema_version": SCHEMA_VERSION, **json_copy(self)}

    def save(self, path: str | Path, config: dict | None = None, seed: int = 0, overwrite: bool = False) -> Path:
        """Write the result to ``path`` (JSON, atomic), with a manifest of ``config`` (what produced it) and
        ``seed``; an existing file is replaced only with ``overwrite`` and only if margincal wrote it."""
        check_output(path, directory=False, overwrite=overwrite)
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


LEADS = {"leads": True}  # a field written before the fields its class inherits


def sometimes(written: Callable[[Any, Any], bool] | None = None) -> Any:
    """A field (default None) the JSON holds only sometimes: where ``written(entry, value)``, by default where its
    value is not None."""
    return dataclasses.field(default=None, metadata={"written": written or (lambda _, value: value is not None)})


def written(entry: Any, field: dataclasses.Field) -> bool:
    """Whether ``entry``'s ``field`` goes into its JSON: not a model held in memory, not an absent :func:`sometimes`."""
    test = field.metadata.get("written")
    return field.metadata.get("json", True) and (test is None or test(entry, getattr(entry, field.name)))


def json_fields(entry: Any) -> list[dataclasses.Field]:
    """``entry``'s fields in the order its JSON writes them: :data:`LEADS` first, then the dataclass's order."""
    return sorted(dataclasses.fields(entry), key=lambda f: not f.metadata.get("leads", False))


def json_copy(value: Any) -> Any:
    """``value`` as its JSON holds it: its dataclasses as dicts of the fields written (:func:`written`, in the order
    of :func:`json_fields`), its containers copied."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_copy(getattr(value, f.name)) for f in json_fields(value) if written(value, f)}
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_copy(v) for v in value]
    return value


IN_MEMORY = {"json": False}  # a field the JSON leaves out: the trained model itself, the directory a card is in


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
