"""The audit card's typed entries: what ``<out>/<name>/card.json`` holds for one audited checkpoint
(:class:`CheckpointCard`), and the parts of an audit's ``card.json`` beside its checkpoints (:class:`PairedDifference`,
:class:`RunProvenance`), as :class:`margincal.results.outputs.AuditCard` holds them.

Frozen dataclasses, written by :func:`json_copy` in field order; a field made by :func:`sometimes`
is left out of the JSON where it holds nothing (``why`` beside a recovered fraction the card withholds), and a
field marked :data:`LEADS` is written before the fields it inherits (an attack row's budget). Older cards (``schema``
1 to 3) lack sections added since (``score``, ``searched``, ``cost``, provenance, a row's unattacked level): read
back, those hold their defaults. No torch here (report layer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from margincal.results.base import LEADS, json_copy, sometimes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimate:
    """A number with its 95 % bootstrap interval (``ci``; None where there is none); ``why`` says why ``value`` is
    None, where the card withholds it (written only then)."""

    value: float | None
    ci: list[float] | None = None
    why: str | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sanity:
    """The sanity rule of a row (:meth:`margincal.auditing.rules.CardRules.sanity`): ``valid`` at this scale, and
    why not in numbers."""

    valid: bool
    why: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Degenerate:
    """The share of a row's attacked answers that are degenerate (repetition loops), the unattacked share on the
    same records, and ``flagged`` at the rule's share."""

    share: float
    unattacked_share: float
    flagged: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreVerdict:
    """One score (ROUGE-L, fact recall) of an attack or quantizer: the attacked level with its interval, the
    unattacked level and what the attack added, the records scored; the floor (θ_ref attacked, or the benchmark's
    chance, ``floor_is``) and the ceiling (θ0 attacked, and unattacked) where given; with both, the sanity status
    and, for a valid row, the recovered, unattacked and added fractions. None: not finite, or absent."""

    attacked: float | None
    ci: list[float] | None
    unattacked: float | None = sometimes()
    added: Estimate | None = sometimes()
    records: int | None = sometimes()
    floor: float | None = sometimes()
    floor_is: str | None = sometimes()
    ceiling: float | None = sometimes()
    ceiling_unattacked: float | None = sometimes()
    sanity: Sanity | None = sometimes()
    recovered_fraction: Estimate | None = sometimes()
    unattacked_fraction: float | None = sometimes()
    added_fraction: Estimate | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """A row's headline, of its ROUGE-L (the benchmark's score): the recovered fraction of the floor-to-ceiling
    gap, the attacked and unattacked levels, what the attack added (and as a fraction of the gap), the sanity
    status, and fact recall under the attack."""

    recovered_fraction: Estimate
    rouge_l: float | None = None
    unattacked_rouge_l: float | None = None
    added: Estimate | None = None
    added_fraction: Estimate | None = None
    sanity: Sanity | None = None
    fact_recall: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttackBudget:
    """What a relearn attack ran: its preset and attacker, K records of ``data``, the schedule as run (a batch holds
    at most K records), the LoRA rank (None: full fine-tuning or no training), the D_rel draws and the scale; the
    virtual tokens of a soft prompt and the epochs of an epoch-based schedule, where they apply."""

    preset: str
    attacker: str
    k: int
    data: str = "forget"
    steps: int
    lr: float
    batch_size: int
    lora_rank: int | None
    draws: int
    scale: str
    n_soft: int | None = sometimes()
    epochs: float | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizerBudget:
    """What a quantizer ran: its preset, bits and source; a 4-bit codebook's type, compute dtype and double
    quantization, and the layers bitsandbytes kept in full precision (off the codebook on this CPU), if any."""

    preset: str
    bits: int
    source: str
    quant_type: str | None = sometimes()
    compute_dtype: str | None = sometimes()
    double_quant: bool | None = sometimes()
    full_precision_layers: int | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttackRow(Verdict):
    """One relearn attack's row (``attacks[label]``, ``lora_r8@20``): its budget, its :class:`Verdict`, the
    degenerate answers under it, and per score its :class:`ScoreVerdict` (``detail``)."""

    budget: AttackBudget = dataclasses.field(metadata=LEADS)
    degenerate: Degenerate | None = None
    detail: dict[str, ScoreVerdict]


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizerRow(Verdict):
    """One quantizer's row (``quantization[preset]``): as an attack's, with the forget ROUGE-L unquantized."""

    budget: QuantizerBudget = dataclasses.field(metadata=LEADS)
    degenerate: Degenerate | None = None
    unquantized_rouge_l: float | None = None
    detail: dict[str, ScoreVerdict]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchedRow(Verdict):
    """A searched family's preset or winner on the report set: its :class:`Verdict` and the K and values it ran at
    (``label``, :func:`margincal.auditing.search.searched_label`)."""

    label: str | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trial:
    """One trial of a search: its number and values, its selection-set score and utility, whether it kept utility
    within the bound, and the best feasible score so far."""

    trial: int
    params: dict[str, Any]
    value: float
    utility: float
    feasible: bool
    best_so_far: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Split:
    """The search's one split of the forget set: its seed, the relearn pool, the selection set and the report set
    (record positions)."""

    seed: int
    pool: list[int]
    selection: list[int]
    report: list[int]


@dataclasses.dataclass(frozen=True, kw_only=True)
class UtilityBound:
    """A reported row's utility on every draw, the worst of them, and whether that stays within the bound."""

    utility_by_draw: list[float]
    worst_utility: float
    within_bound: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gap:
    """The winner's recovered fraction minus the preset's on the report set (None where either is withheld), what
    the winner added beyond the preset's addition, and why a winner falls below the preset, where it does."""

    recovered_fraction: float | None
    added: float
    why_below: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """A configuration the worst case was chosen among (:mod:`margincal.auditing.candidates`), read on the selection
    records only: its reported runs (``row``: ``preset`` or ``t<trial>``), trial (None: the preset's values outside
    every trial), values and K, its selection score pooled over every reported draw, its utility on each draw, the
    floor (θ_ref) and ceiling (θ0, and θ0 unattacked) under it, and the constraints it breaks (empty: valid)."""

    row: str
    trial: int | None
    params: dict[str, Any]
    k: int
    selection: float
    utility_by_draw: list[float]
    worst_utility: float
    within_bound: bool
    floor: float | None
    ceiling: float | None
    ceiling_unattacked: float | None
    broken: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchedFamily:
    """A searched family's worst case (``searched[preset]``, :func:`margincal.auditing.worst_case.rows`): the
    search (K, ε, sampler, score, the unattacked utility and its bound, the space, the journal, the split and the
    selection set's size, trials and feasible ones, the winner and the history, the trials to 90 %), the preset's and
    the winner's rows on the report set (``searched``: the worst case, the strongest valid candidate; None when every
    trial broke a constraint, ``why_none`` says which), their utility bounds by row, their gap and per row the
    :class:`ScoreVerdict` of each score (``detail``); the search's seed and the :class:`Candidate` s checked (cards
    since issue 73). ``report_half``: the report records of a schema-3 card (``split`` since)."""

    k: int
    epsilon: float
    sampler: str
    score: str = "ROUGE-L"
    unattacked_utility: float
    utility_bound: float
    space: dict[str, dict[str, Any]]
    journal: str
    split: Split | None = sometimes()
    selected_on: int | None = sometimes()
    trials: int
    feasible: int
    winner: dict[str, Any] | None
    history: list[Trial]
    unattacked_selection: float | None
    trials_to_90: int | None
    report_half: list[int] | None = sometimes()
    preset: SearchedRow
    searched: SearchedRow | None
    bound: dict[str, UtilityBound] = dataclasses.field(default_factory=dict)
    gap: Gap | None
    detail: dict[str, dict[str, ScoreVerdict]]
    seed: int | None = sometimes()
    candidates: list[Candidate] | None = sometimes()
    why_none: str | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delta:
    """Δ = m − m_ref (``value``) with its paired bootstrap interval over forget samples, the margins m and m_ref,
    the log-odds level ℓ, how m aggregates (mean, median) and over how many samples; None without θ_ref."""

    value: float | None
    ci: list[float] | None
    m: float | None
    m_ref: float | None
    log_odds: float | None
    aggregate: str
    n: int | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Detector:
    """A membership detector's AUC (members: forget, non-members: holdout), its advantage |AUC − 0.5|, whether it
    overshoots (below chance by more than θ_ref's own distance from it) and θ_ref's AUC."""

    auc: float | None
    advantage: float | None
    overshoot: bool
    reference_auc: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mia:
    """Membership inference: per detector its :class:`Detector`, the mean advantage, privleak, and the overshoot
    note where a detector overshoots."""

    detectors: dict[str, Detector]
    advantage: float | None
    privleak: float | None
    overshoot_note: str | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """The audited checkpoint: as named (``model``), its identity, the base of an adapter, its prompt template."""

    model: str
    identity: str
    base: str | None
    template: dict[str, Any] | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceEntry:
    """What served as the floor or the ceiling (``serves_as``): a model (as named, its identity and template), or
    open-unlearning's retain logs (their path and digest)."""

    model: str | None = sometimes()
    identity: str | None = sometimes()
    template: dict[str, Any] | None = sometimes()
    path: str | None = sometimes()
    digest: str | None = sometimes()
    serves_as: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Example:
    """A held-out question, its gold answer and the checkpoint's answers before and after the attack."""

    question: str
    gold: str
    before: str
    after: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Examples:
    """Held-out questions before and after the attack that recovered the most (its first draw); empty without one."""

    attack: str | None = sometimes()
    rows: list[Example] | None = sometimes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cost:
    """What a checkpoint's stages cost when they ran (:func:`margincal.store.costs.summed`): stages with a cost, seconds
    (by stage kind too) and tokens summed, the largest peak memory, the memory kinds and devices met."""

    stages: int
    seconds: float
    by_kind: dict[str, float]
    tokens: int
    peak_memory_gib: float | None
    memory: list[str]
    devices: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reproduction:
    """A checkpoint's claimed numbers checked (``audit --claimed``): the file and its digest, per metric the claim
    beside the audit's value (a row as :meth:`margincal.auditing.card.CardBuilder.reproduction` writes it: its first
    key, ``as``, is a Python keyword), the names not compared and how many reproduce."""

    file: str
    digest: str
    metrics: dict[str, dict[str, Any]]
    not_compared: list[str]
    reproduced: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lineage:
    """The base an adapter names (with its identity), or the ``_name_or_path`` a full checkpoint's config names, and
    the file naming it."""

    base: str | None
    base_identity: str | None
    named_in: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProducedBy:
    """The margincal run that produced a checkpoint, as its ``stage.json`` states it (its values as that file has
    them): stage, command, seed, commit, the method's run and θ0; ``verified`` for an entry of the audit's store."""

    stage: Any
    command: Any
    seed: Any
    git_commit: Any
    method: Any
    theta0: Any
    verified: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where a checkpoint came from (:func:`margincal.auditing.provenance.checkpoint_provenance`): what the audit
    loaded, its pinned revision, lineage, license (and the file stating it) and the run that produced it."""

    model: str
    identity: str
    revision: str | None
    lineage: Lineage
    license: str
    license_source: str | None
    produced_by: ProducedBy | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointCard:
    """One audited checkpoint's card (``<out>/<name>/card.json``, ``card.json``'s ``checkpoints[name]``): what the
    rows measure (``score``), the checkpoint, Δ, the certificate, forget metrics, MIA, utility, the weight distance to
    θ0, per attack and quantizer its row, per searched family its worst case, examples, cost, the floor and ceiling,
    what the card cannot give, the claimed numbers checked (if any) and its provenance."""

    schema: int
    name: str
    score: str = "ROUGE-L"
    checkpoint: Checkpoint
    delta: Delta
    certified: bool | None
    forget: dict[str, float | None]
    mia: Mia
    utility: dict[str, float | None]
    weight_distance: float | None
    attacks: dict[str, AttackRow]
    quantization: dict[str, QuantizerRow]
    searched: dict[str, SearchedFamily] = dataclasses.field(default_factory=dict)
    examples: Examples
    cost: Cost | None = sometimes()
    reference: dict[str, ReferenceEntry]
    unavailable: list[str]
    reproduction: Reproduction | None = sometimes()
    provenance: Provenance | None = sometimes()

    def to_dict(self) -> dict[str, Any]:
        """The card's JSON, as ``<out>/<name>/card.json`` holds it (less the manifest beside it there)."""
        return json_copy(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Difference:
    """A paired difference of recovered fractions with its interval (identical bootstrap resamples)."""

    difference: float
    ci: list[float] | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PairedDifference:
    """``checkpoint`` against ``versus``: per ``kind:label:score`` the difference of their recovered fractions."""

    checkpoint: str
    versus: str
    recovered_fraction: dict[str, Difference]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunProvenance:
    """The audit's own run: the data's identity, the command, the stage graph's digest, versions and the device."""

    data: dict[str, Any]
    command: str
    graph_digest: str
    versions: dict[str, str]
    device: str
