"""The cell record's schema (``<out>/cells/<id>.json``), versioned, and the one reader of a panel's records.

A record is written by :func:`margincal.pipeline.cell.run_cell` (``status: done``) or, for a cell that failed,
by :func:`margincal.pipeline.executors.run_cell_safely` (``status: failed``); both carry ``schema`` =
:data:`SCHEMA`. Records written before the field existed are version 1. :func:`read_records` checks every record
against its typed spec (:func:`margincal.config.typed.build`) and returns the valid ones, built (:class:`DoneRecord`,
:class:`FailedRecord`), with a reason for each bad one, so a report covers the good records of a panel and names the
rest. Every reader of a panel's records reads these typed objects, not the JSON's keys.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import Any

from margincal.config.settings import FAMILIES
from margincal.config.typed import ConfigError, brief, build, check_fields, describe, one_of
from margincal.core.artifacts import NAME, NAME_RULE
from margincal.core.inputs import checked, read_json
from margincal.results.cards import Cost

SCHEMA = 1  # version of the cell record; bump it when a field the report reads changes meaning
ROLES = ("reference", "theta0", "baseline", "mc")  # the models of a cell, in the order the record lists them


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (benchmark, model, tier, method, seed, MC variant) cell; its attackers come from the panel."""

    benchmark: str
    model: str
    tier: str
    method: str
    seed: int
    variant: str

    @property
    def id(self) -> str:
        bench, model = (Path(x).stem if x.endswith((".yaml", ".yml")) else x for x in (self.benchmark, self.model))
        return f"{bench}_{model}_{self.tier}_{self.method}_s{self.seed}_{self.variant}"


@dataclasses.dataclass(frozen=True)
class AttackResult:
    """One attack on one model (the attack stage's info, :func:`margincal.pipeline.stages.write_attack`): held-out
    ROUGE-L, what the report reads, and fact recall where the benchmark has attribute values; the attacker, K, the
    margin diagnosis, the margin flips and the utility proxy where the attacker scores it."""

    rouge_l: float
    fact_recall: float | None = None
    attacker: str | None = None
    k: int | None = None
    diagnosis: dict[str, Any] = dataclasses.field(default_factory=dict)
    flips: dict[str, Any] = dataclasses.field(default_factory=dict)
    utility: dict[str, Any] | None = None  # the utility proxy, for an attacker set to score one (``utility: [...]``)


@dataclasses.dataclass(frozen=True)
class RoleResult:
    """One model of the cell: its evaluation summary (metric → a number, or a flag such as ``certified``) and its
    attacks by label (``lora_r8@20``)."""

    summary: dict[str, Any]
    attacks: dict[str, AttackResult]

    def __post_init__(self) -> None:
        for label in self.attacks:  # an attack label names report files (kcurve_<preset>.png)
            if not NAME.fullmatch(label):
                raise ConfigError("attacks", f"labels must be {NAME_RULE}, got {brief(label)}")
        for name, value in self.summary.items():
            if value is not None and not isinstance(value, int | float):
                raise ConfigError(f"summary.{name}", f"must be a number, true/false or null, got {describe(value)}")


@dataclasses.dataclass(frozen=True)
class Answer:
    """A model's greedy answer to an example's question, before and after the example's attack."""

    before: str
    attacked: str


@dataclasses.dataclass(frozen=True)
class Example:
    """A held-out forget question with each model's greedy answer before and after ``attack``."""

    question: str
    gold: str
    attack: str
    answers: dict[str, Answer]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellCost(Cost):
    """What a cell's own stages cost (:func:`margincal.pipeline.cell.cell_cost`): a stage cost sum
    (:class:`margincal.results.cards.Cost`) with the unlearning's tokens per second and the count of stages stored
    before costs were recorded."""

    unlearn_tokens_per_s: float | None
    without_cost: int


@dataclasses.dataclass(frozen=True)
class DoneRecord:
    """A finished cell: the four models' summaries and attacks, the stage infos, examples and sources."""

    id: str
    status: str
    cell: Cell
    family: str
    m_ref: float | None
    models: dict[str, RoleResult]
    unlearn: dict[str, Any]
    polish: dict[str, Any]
    schema: int = 1
    examples: list[Example] = dataclasses.field(default_factory=list)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    corpora: Any = None  # the sampled corpora's reports
    cost: CellCost | None = None  # None in records written before costs were recorded

    def __post_init__(self) -> None:
        check_fields(self, status=one_of("done"), family=one_of(*FAMILIES), schema=one_of(SCHEMA))
        missing = [role for role in ROLES if role not in self.models]
        if missing:
            raise ConfigError("models", f"misses the model(s) {missing}")
        for role in ("baseline", "mc"):  # the margins the cliff figure places against m_ref
            if not isinstance(self.models[role].summary.get("m"), int | float):
                raise ConfigError(f"models.{role}.summary.m", "must be a number (the model's margin m(D_f))")


@dataclasses.dataclass(frozen=True)
class FailedRecord:
    """A cell that failed: its error (and traceback)."""

    id: str
    status: str
    cell: Cell
    error: str
    schema: int = 1
    traceback: str = ""

    def __post_init__(self) -> None:
        check_fields(self, status=one_of("failed"), schema=one_of(SCHEMA))


def check_record(data: Any, stem: str) -> DoneRecord | FailedRecord:
    """The record ``data`` built (:func:`margincal.config.typed.build`); stop with
    :class:`~margincal.config.typed.ConfigError`
    on one that is not of the schema (its shape, keys, types, status, version) or whose ``id`` is not its file
    name."""
    status = data.get("status") if isinstance(data, dict) else None
    record = build(FailedRecord if status == "failed" else DoneRecord, data)
    if record.id != stem:
        raise ConfigError("id", f"must be the file's name {stem!r}, got {record.id!r}")
    return record


def _shape(record: DoneRecord) -> tuple:
    """What the report's columns need of a record: each model's attack labels and summary metrics."""
    return tuple(
        (role, tuple(sorted(m.attacks)), tuple(sorted(m.summary))) for role, m in sorted(record.models.items())
    )


def check_results(results: str | Path, what: str = "the results directory") -> Path:
    """``results`` if it is a directory holding a ``cells`` directory (:func:`margincal.core.inputs.checked`: a file, a
    link loop or a device in either place is named as such), checked before anything is read or made."""
    give = "a panel's results directory (margincal panel ... out=DIR)"
    results = checked(results, what, "directory", give)
    checked(results / "cells", "the cell records", "directory", give)
    return results


def read_records(cells: Path) -> tuple[list[DoneRecord], list[FailedRecord], list[tuple[str, str]]]:
    """(done, failed, bad) records of a panel's ``cells`` directory, built, in file-name order; ``bad`` lists each
    record that is not of the schema as (file name, why). The done records of one panel share their shape (each
    model's attacks and metrics, :func:`_shape`): the most common one is the panel's, and a record of another shape
    (edited, or copied from another panel) is bad too, since every table needs every column."""
    check_results(cells.parent)
    done: list[DoneRecord] = []
    failed: list[FailedRecord] = []
    bad: list[tuple[str, str]] = []
    for path in sorted(cells.glob("*.json")):
        try:
            record = check_record(read_json(path), path.stem)
        except (OSError, UnicodeDecodeError, ValueError) as err:  # unreadable, not JSON, or not of the schema
            bad.append((path.name, " ".join(str(err).split())))
            continue
        if isinstance(record, DoneRecord):
            done.append(record)
        else:
            failed.append(record)
    shapes = Counter(_shape(r) for r in done)
    if len(shapes) > 1:
        panel = max(shapes, key=lambda s: (shapes[s], s))
        for record in [r for r in done if _shape(r) != panel]:
            done.remove(record)
            bad.append((f"{record.id}.json", "its models' attacks or metrics differ from the panel's other records"))
    for record, why in _other_builds(done):
        done.remove(record)
        bad.append((f"{record.id}.json", why))
    return done, failed, sorted(bad)


def same_build(a: float, b: float) -> bool:
    """Whether two measurements of the same model are one build's: equal up to the float rounding of the same
    computation on another CPU (relative 1e-5, absolute 1e-6); a rebuild under the same store key differs by more."""
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


def _other_builds(done: list[DoneRecord]) -> list[tuple[DoneRecord, str]]:
    """Records whose θ_ref measured another margin than the most common one among the records of the same
    (benchmark, model, tier), with why: a record copied from another build of θ_ref. A store key names the
    computation, not its bytes (a mini θ_ref built on another CPU has other weights under the same key), so records
    of two builds cannot be pooled into one panel's tables."""
    groups: dict[tuple[str, str, str], list[DoneRecord]] = {}
    for record in done:
        cell = record.cell
        groups.setdefault((cell.benchmark, cell.model, cell.tier), []).append(record)
    out = []
    for (benchmark, model, tier), records in sorted(groups.items()):
        margins = [r.m_ref for r in records if r.m_ref is not None]
        if not margins:
            continue
        panel = max(margins, key=lambda m: (sum(same_build(m, other) for other in margins), -margins.index(m)))
        for record in records:
            if record.m_ref is not None and not same_build(record.m_ref, panel):
                why = (
                    f"θ_ref's margin m_ref = {record.m_ref:.4f} differs from {panel:.4f} of the panel's other "
                    f"{benchmark}/{model}/{tier} records: another build of θ_ref, not pooled"
                )
                out.append((record, why))
    return out
