"""The typed results of margincal's public functions (:mod:`margincal.api`), one versioned JSON schema each.

Every result is a frozen dataclass: its fields are the numbers a researcher reads (``diagnosis.delta``,
``evaluation.summary["forget_rouge_l"]``), ``to_dict()`` is its JSON (a ``kind`` and ``schema_version`` first),
``save(path)`` writes that JSON atomically with a provenance manifest, and :func:`load` reads any saved result back
into its class, checked field by field (:func:`margincal.config.files.build_file`). The CLI's result files are these
objects saved, so ``margincal.load("npo.json")`` reads what ``margincal evaluate --out npo.json`` wrote.
No torch here: the report layer reads results without it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from margincal.config.files import build_file
from margincal.config.typed import checked_call
from margincal.core.errors import InputError
from margincal.core.inputs import read_json
from margincal.results.base import IN_MEMORY, SCHEMA_VERSION, Diagnosis, Result, sometimes
from margincal.results.cards import CheckpointCard, PairedDifference, ReferenceEntry, RunProvenance


@dataclasses.dataclass(frozen=True)
class Evaluation(Result):
    """A benchmark's evaluation of one checkpoint (:func:`margincal.api.evaluate`): ``summary`` holds every metric
    of the benchmark's metric table by name (:mod:`margincal.results.metric_table`), ``splits`` the per-split
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
    """An audit's card (:func:`margincal.api.audit`, ``margincal audit``), saved as ``<out>/card.json``: the card
    ``schema``, the budget, benchmark and tier, the floor and ceiling (``reference``), per checkpoint its
    :class:`~margincal.results.cards.CheckpointCard` (Δ with its bootstrap interval, the certificate, forget metrics,
    MIA, utility, and per attack and quantizer the recovered fraction between the θ_ref floor and the θ0 ceiling), the
    paired differences between checkpoints, the rules applied, the stages read (``sources``), the run's provenance and,
    from three checkpoints, the population file; ``out`` is the directory with ``card.md`` and the figures (not in the
    JSON). ``load(out)`` reads it back, a card written before cards named their kind too."""

    KIND: ClassVar[str] = "audit"

    schema: int
    budget: dict[str, Any]
    benchmark: str
    tier: str
    reference: dict[str, ReferenceEntry]
    checkpoints: dict[str, CheckpointCard]
    paired: list[PairedDifference]
    rules: dict[str, Any]
    sources: dict[str, str]
    provenance: RunProvenance | None = sometimes()
    population: str | None = sometimes()  # population.json beside it
    out: str = dataclasses.field(default="", compare=False, metadata=IN_MEMORY)

    @property
    def headline(self) -> str:
        """The budget's headline attack (``lora_r8@20``): the verdict the card's first table shows."""
        return self.budget["headline"]

    def delta(self, name: str) -> float | None:
        """Δ = m − m_ref of checkpoint ``name``."""
        return self.checkpoints[name].delta.value

    def recovered(self, name: str, attack: str | None = None) -> float | None:
        """The fraction of the floor-to-ceiling gap ``attack`` (default the headline) recovers on ``name``."""
        return self.checkpoints[name].attacks[attack or self.headline].recovered_fraction.value

    @classmethod
    def read(cls, data: Any, path: Path) -> AuditCard:
        """The card an audit's ``card.json`` at ``path`` holds (``data``, its JSON), every field checked against its
        type; a card written before cards named their kind (and version) is read as this version's."""
        if not isinstance(data, dict):
            raise InputError(f"{path} is not a margincal result (a JSON object expected)")
        card = cls.from_dict({"kind": cls.KIND, "schema_version": SCHEMA_VERSION, **data}, str(path))
        return dataclasses.replace(card, out=str(path.parent))


@dataclasses.dataclass(frozen=True)
class Trained(Result):
    """A training stage's record: the method, its schedule as run (``steps``, ``seconds``, the per-step
    ``history`` of the loss and its terms), the step released (``selected``; None: the last), the directory written
    (``out``; None when nothing was written) and the trained model itself (``model``, in memory; not in the JSON)."""

    method: str
    hparams: dict[str, Any]
    state: dict[str, Any]
    steps: int
    seconds: float
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    selected: int | None = None
    stopped_at: int | None = None
    out: str | None = None
    cached: bool = dataclasses.field(default=False, compare=False)  # read from the store, not trained in this call
    model: Any = dataclasses.field(default=None, compare=False, repr=False, metadata=IN_MEMORY)

    @property
    def final_loss(self) -> float:
        return self.history[-1]["loss"]


@dataclasses.dataclass(frozen=True)
class Unlearned(Trained):
    """An unlearning run (:func:`margincal.api.unlearn`): ``state`` is the method's carried state (PDU's λ) that
    :func:`margincal.api.polish` continues from."""

    KIND: ClassVar[str] = "unlearned"


@dataclasses.dataclass(frozen=True)
class Polished(Trained):
    """An MC polish (:func:`margincal.api.polish`): the method whose native loss it kept and the state it continued
    from (``state``: PDU's λ as unlearning left it), the variant and its settings (``mc``), and where the Δ-stop or
    the controller stopped it (``stopped_at``)."""

    KIND: ClassVar[str] = "polished"

    variant: str = "reference"
    mc: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AttackResult(Result):
    """A relearn attack on one checkpoint (:func:`margincal.api.attack`) per budget K (``results["20"]``): the
    held-out forget ROUGE-L after the attack, Δ before and after, the margin flips and the samples; ``theorem3``
    the instrumented lift against its bound Λ̂(N) per K, when asked for."""

    KIND: ClassVar[str] = "attack"

    attacker: str
    model: str
    results: dict[str, dict[str, Any]]
    m_ref: float | None = None
    theorem3: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    cached: bool = False  # every attack read from the store

    def rouge_l(self, k: int) -> float:
        """The held-out forget ROUGE-L after the attack at budget ``k``."""
        return self.results[str(k)]["rouge_l"]


@dataclasses.dataclass(frozen=True)
class PanelResult(Result):
    """A panel's run (:func:`margincal.api.run_panel`): how many cells finished or failed, each cell's row (its
    id, status and error), the wall time, the results directory (``out``) and its report (None unless asked for)."""

    KIND: ClassVar[str] = "panel"

    name: str
    out: str
    counts: dict[str, int]
    cells: list[dict[str, Any]]
    seconds: float
    report: str | None = None

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The rows of the cells that failed (their ``error`` says why)."""
        return [row for row in self.cells if row["status"] == "failed"]


@dataclasses.dataclass(frozen=True)
class MiniExport(Result):
    """A mini export (:func:`margincal.api.mini_export`, ``margincal mini export DIR``), saved as ``DIR/mini.json``:
    the mini θ0 and the retain-only θ_ref of ``tier`` (store paths) and the TOFU-format splits written to ``dir``."""

    KIND: ClassVar[str] = "mini_export"

    dir: str
    theta0: str
    ref: str
    tier: str
    retain: str  # the retain split of the tier (retain90 for forget10)
    splits: list[str]


KINDS: dict[str, type[Result]] = {
    cls.KIND: cls
    for cls in (Diagnosis, Evaluation, AuditCard, Unlearned, Polished, AttackResult, PanelResult, MiniExport)
}


def _mapping(value: object, file: Path, key: str | None) -> dict:
    """``value`` read from ``file`` (at ``key``) as a JSON object; absent or null is empty; anything else is a file
    margincal did not write, refused naming it."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(
            f"{file}: {key or 'the file'} is a {type(value).__name__}, not an object: not a file margincal wrote"
        )
    return value


def trained(path: Path) -> Trained:
    """The record of the unlearn or polish stage directory at ``path`` (``--out`` of ``margincal unlearn`` or
    ``polish``, or a store entry): its ``stage.json``, ``history.json`` and, for an unlearned model, ``method.json``
    (the model itself stays on disk: ``out``)."""
    meta = read_json(path / "stage.json", "stage.json")
    history = read_json(path / "history.json", "history.json")
    if not isinstance(meta, dict) or not isinstance(history, list) or meta.get("stage") not in ("unlearn", "polish"):
        raise InputError(f"{path} is no unlearn or polish stage directory margincal wrote")
    info = _mapping(meta.get("info"), path / "stage.json", "info")
    config = _mapping(_mapping(meta.get("manifest"), path / "stage.json", "manifest").get("config"), path, "config")
    steps = len(history)
    stopped = info.get("stopped_at", steps if isinstance(info.get("steps"), int) and steps < info["steps"] else None)
    common = {"steps": steps, "seconds": info.get("seconds", meta.get("seconds")), "history": history}
    common |= {"selected": info.get("selected"), "stopped_at": stopped, "out": str(path)}
    if meta["stage"] == "unlearn":
        method = _mapping(read_json(path / "method.json", "method.json"), path / "method.json", None)
        fields = {"method": method.get("name"), "hparams": method.get("hparams"), "state": method.get("state", {})}
        return build_file(Unlearned, {**fields, **common}, str(path))
    run = _mapping(config.get("method"), path / "stage.json", "manifest.config.method")
    fields = {"method": run.get("name"), "hparams": run.get("hparams", {}), "state": info.get("method_state_in", {})}
    fields |= {"variant": config.get("variant", "reference"), "mc": config.get("mc", {})}
    return build_file(Polished, {**fields, **common}, str(path))


@checked_call
def load(path: str | Path) -> Result | CheckpointCard:
    """Any result margincal saved (``--out`` of ``diagnose`` or ``evaluate``, ``Result.save``; an audit's ``--out``
    directory or its ``card.json``, or one checkpoint's ``<out>/<name>/card.json``; a mini export's ``mini.json``;
    the directory ``unlearn`` or ``polish`` wrote, or a store entry of those stages), as its typed class.

    Example::

        export = margincal.load(f"{mini.dir}/mini.json")
        print(type(export).__name__, export.tier, export.theta0)
    """
    path = Path(path)
    if path.is_dir() and (path / "stage.json").is_file():
        return trained(path)
    card = path / "card.json" if path.is_dir() and (path / "card.json").is_file() else path
    data = read_json(card, "result")
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a margincal result (a JSON object expected)")
    if card.name == "card.json" and "checkpoints" in data:
        return AuditCard.read(data, card)
    if card.name == "card.json" and "attacks" in data:  # one audited checkpoint's card, beside its manifest
        return build_file(CheckpointCard, {k: v for k, v in data.items() if k != "manifest"}, str(card))
    kind = data.get("kind")
    if kind is not None and not isinstance(kind, str):
        raise InputError(f"{path}: its kind is a {type(kind).__name__}, not a name: not a result margincal wrote")
    if kind is None:
        raise InputError(f"{path} names no result kind (an older margincal wrote it): write it again with this one")
    if kind not in KINDS:
        known = ", ".join(KINDS)
        raise InputError(f"{path} is not a typed margincal result (kind {kind!r}; known kinds: {known})")
    return KINDS[kind].from_dict(data, str(path))
