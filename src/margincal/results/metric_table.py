"""The metric table: every number ``evaluate`` writes, declared once, in the order the evaluators write it.

A row is a :class:`Metric` (a key of the evaluate JSON's ``summary``, and with ``split_key`` also of
``splits[role]``) or a :class:`Field` (a per-sample output kept in a split only: the diagnosis, the diagnostic
margins, the greedy answers, the forget truth ratios). Each row names the function that computes it from the
*shared scores* of the evaluator's one scoring pass (:class:`margincal.evaluation.tofu.RoleScores`: a role's token
statistics, greedy answers and their ROUGE-L, margin diagnosis, perturbed answers, truth ratios and θ_ref's split),
the roles it applies to, its direction and its display format; in the spirit of lm-eval's ``MetricSpec`` (name,
function, aggregation, higher_is_better), except that no row runs the model: they all read the one pass.

A row names its function by the name it is registered under (:data:`VALUES`), and the function is registered where
it is defined (lm-eval's ``register_metric``): the token-statistic and ROUGE metrics in
:mod:`margincal.evaluation.metrics`, the margin diagnosis in :mod:`margincal.model.margin`, the MIA AUCs in
:mod:`margincal.evaluation.mia`, WMDP's accuracy in :mod:`margincal.evaluation.wmdp` and the reads of the shared
scores in :mod:`margincal.evaluation.tofu`; the aggregates, which read only the summary, here (the report computes
them without torch). An evaluator imports the modules its rows' functions are defined in, so the store's code
versions (:func:`margincal.core.artifacts.code_version`) and the layer test see every module a metric runs.

Three kinds of row, by what their ``value`` takes:

* per split (``roles`` names split roles): ``value(scores)`` over one role's :class:`RoleScores`;
* members vs non-members (``roles == MIA_ROLES``: TOFU forget/holdout, MUSE privleak forget/holdout):
  ``value(scores)`` over the detector scores of both (``scores.auc(detector)``);
* aggregates (``inputs`` given): ``value(values, reference)`` over the inputs already in the summary (those present)
  and θ_ref's summary; computed in the pass of their role, or after every role when ``roles`` is empty.

A value of None means "not available here" (no θ_ref, no paraphrases, gradnorm off, ...) and writes nothing.

Readers: :func:`margincal.evaluation.tofu.evaluate_tofu` and :func:`~margincal.evaluation.muse.evaluate_muse`
(:func:`fill` writes their rows, so JSON keys and their order are the table's), ``evaluators.evaluate`` (MMLU),
the panel report (labels, directions, formats and :func:`read`, which also falls back to a benchmark's stand-in)
and ``margincal evaluate``'s printed summary (:func:`summary_order`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from margincal.core.registry import Registry

Better = Literal["higher", "lower"] | None
GROUPS = ("forget", "utility", "margin", "privacy", "capability")  # the order of the CLI's headline list
PARTS = ("diagnosis", "rouge")  # what ``evaluate(..., parts=...)`` can restrict the forget role to
MIA_ROLES = ("members", "non-members")
MIA_DETECTORS = ("loss", "min_k", "min_k_plus_plus", "zlib", "gradnorm")


@dataclass(frozen=True)
class Metric:
    """One summary number. ``name``: its key in the summary (and the CLI's label); ``value``: the name its function
    is registered under in :data:`VALUES` (see the module docstring; None: computed outside the table, e.g. MMLU);
    ``roles``: the splits it is computed on (one role, ``MIA_ROLES``, or () for an aggregate over the summary);
    ``split_key``: also kept as ``splits[role][split_key]``; ``better``: the direction (None: none, e.g. a boolean or
    a score ideal at 0); ``fmt``: the report's format; ``label``: the report's column name; ``group``: one of
    ``GROUPS``; ``headline``: listed first, by group, in ``margincal evaluate``'s summary; ``part``: the evaluate part
    it belongs to (computed in a ``parts`` run); ``inputs``: the summary keys an aggregate reads; ``stands_for``:
    metrics of other benchmarks whose report column this one fills where they are absent (MUSE's forget F1 for F.agg
    and F-ROUGE)."""

    name: str
    value: str | None
    roles: tuple[str, ...] = ()
    split_key: str | None = None
    better: Better = None
    fmt: str = ".3f"
    label: str | None = None
    group: str = "forget"
    headline: bool = False
    part: str | None = None
    inputs: tuple[str, ...] = ()
    stands_for: tuple[str, ...] = ()

    @property
    def lower_is_better(self) -> bool:
        return self.better == "lower"

    @property
    def display(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class Field:
    """A per-sample output kept as ``splits[role][split_key]`` and in no summary; ``value`` names its function
    ``value(scores)`` as a per-split metric's; ``part`` as :attr:`Metric.part`."""

    split_key: str
    value: str
    roles: tuple[str, ...]
    part: str | None = None


Row = Metric | Field


VALUES: Registry[Callable[..., Any]] = Registry("metric value", "metric values")  # a row's value -> its function


def metric_value(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the value ``name`` that rows of this table compute (where it is defined)."""
    return VALUES.register(name)


# ------------------------------------------------------------------------------------------ aggregates
@metric_value("average")
def average(values: dict[str, float], _reference: dict) -> float | None:
    """Mean of the inputs present (F.agg: all four; MIA.agg: the detectors run)."""
    return float(sum(values.values()) / len(values)) if values else None


@metric_value("model_utility")
def model_utility(values: dict[str, float], _reference: dict) -> float | None:
    """MU (TOFU): the harmonic mean of the nine retain-side metrics ``MU_KEYS`` (``scipy.stats.hmean``; any value
    ≤ 0 gives 0); None unless all nine are present."""
    if len(values) != len(MU_KEYS):
        return None
    from scipy import stats as sps

    vals = [values[k] for k in MU_KEYS]
    return 0.0 if any(v <= 0 for v in vals) else float(sps.hmean(vals))


@metric_value("advantage")
def advantage(values: dict[str, float], _reference: dict) -> float | None:
    """Membership advantage: the mean over the detectors run of |AUC_i − 0.5| (per detector first, so reversals
    don't cancel)."""
    return float(sum(abs(a - 0.5) for a in values.values()) / len(values)) if values else None


def privleak(model_auc: float, reference_auc: float = 0.5) -> float:
    """PrivLeak (%) = ((1 − AUC) − (1 − AUC_ref)) / (1 − AUC_ref) · 100 on the min-k AUC; ≈ 0 is ideal, negative
    means the forget set is still more separable than for θ_ref (open-unlearning ``privacy.privleak``)."""
    score, ref = 1 - model_auc, 1 - reference_auc
    return (score - ref) / (ref + 1e-10) * 100


@metric_value("privleak")
def _privleak(values: dict[str, float], reference: dict) -> float | None:
    """On the min-k AUC, against θ_ref's (0.5 without a reference)."""
    if not values:
        return None
    (auc,) = values.values()
    return privleak(auc, reference.get(MIA_AUC["min_k"].name, 0.5))


# ------------------------------------------------------------------------------------------ the rows
FORGET = ("forget",)
UTILITY_ROLES = {"retain": "retain", "real_authors": "ra", "world_facts": "wf"}  # role -> summary prefix

# shared by both benchmarks: the margin diagnostic, the MIA AUCs and privleak
DIAGNOSIS = Field("diagnosis", "diagnosis", FORGET, part="diagnosis")
DIAGNOSTIC_MARGINS = Field("diagnostic_margins", "diagnostic_margins", FORGET, part="diagnosis")


def _margin_metric(name: str, label: str, headline: bool = False) -> Metric:
    """One of the margin diagnostic's numbers on the forget split: lower is better, shown signed."""
    return Metric(
        name, name, FORGET, better="lower", fmt="+.2f", label=label, group="margin", headline=headline, part="diagnosis"
    )


M_D = _margin_metric("m", "m(D_f)", headline=True)
LOG_ODDS = _margin_metric("log_odds", "ℓ")
DELTA = _margin_metric("delta", "Δ", headline=True)
CERTIFIED = Metric("certified", "certified", FORGET, group="margin", part="diagnosis")
MIA_AUC = {
    d: Metric(
        f"mia_{d}_auc",
        f"{d}_auc",
        MIA_ROLES,
        better="lower",
        label=f"{d} AUC",
        group="privacy",
        headline=True,
    )
    for d in MIA_DETECTORS
}
PRIVLEAK = Metric(
    "privleak", "privleak", better=None, fmt="+.2f", group="privacy", headline=True, inputs=(MIA_AUC["min_k"].name,)
)  # no direction: ≈ 0 is ideal

FORGET_ROUGE = Metric(
    "forget_Q_A_ROUGE", "rouge_recall", FORGET, "rouge_l", "lower", label="F-ROUGE", headline=True, part="rouge"
)
FACT_RECALL = Metric(
    "forget_fact_recall",
    "fact_recall",
    FORGET,
    "fact_recall",
    "lower",
    label="facts",
    part="rouge",
)
F_AGG_INPUTS = ("forget_Q_A_Prob", "forget_Q_A_ROUGE", "exact_memorization", "extraction_strength")


def _utility(name: str, value: str, role: str, split_key: str) -> Metric:
    return Metric(name, value, (role,), split_key, "higher", group="utility")


def _utility_rows() -> list[Row]:
    """retain, real authors, world facts: probability (real authors / world facts: normalised over the perturbed
    options), ROUGE-L recall and truth ratio (true-better), each higher-is-better and entering MU."""
    rows: list[Row] = []
    for role, prefix in UTILITY_ROLES.items():
        if role == "retain":
            rows.append(_utility(f"{prefix}_Q_A_Prob", "q_a_prob", role, "q_a_prob"))
        else:
            rows.append(_utility(f"{prefix}_Q_A_Prob_normalised", "prob_normalised", role, "q_a_prob_normalised"))
        rows += [
            _utility(f"{prefix}_Q_A_ROUGE", "rouge_recall", role, "rouge_l"),
            _utility(f"{prefix}_Truth_Ratio", "true_better", role, "truth_ratio"),
            Field("samples", "samples", (role,)),
        ]
    return rows


UTILITY: tuple[Row, ...] = tuple(_utility_rows())
MU_KEYS = tuple(row.name for row in UTILITY if isinstance(row, Metric))  # model utility's nine inputs, in TOFU's order
MODEL_UTILITY = Metric(
    "model_utility", "model_utility", better="higher", label="MU", group="utility", headline=True, inputs=MU_KEYS
)
AUC_NAMES = tuple(m.name for m in MIA_AUC.values())
ADVANTAGE = Metric(
    "mia_advantage", "advantage", better="lower", label="advantage", group="privacy", headline=True, inputs=AUC_NAMES
)  # mean |AUC − 0.5| over the detectors run

TOFU: tuple[Row, ...] = (
    # forget (members): memorisation, the margin diagnostic, truth ratio and forget quality against θ_ref
    Metric("forget_Q_A_Prob", "q_a_prob", FORGET, "q_a_prob", "lower", headline=True),
    FORGET_ROUGE,
    Metric("exact_memorization", "exact_memorization", FORGET, "exact_memorization", "lower", headline=True),
    Metric("extraction_strength", "extraction_strength", FORGET, "extraction_strength", "lower", headline=True),
    DIAGNOSIS,
    DIAGNOSTIC_MARGINS,
    Field("samples", "samples", FORGET, part="rouge"),
    M_D,
    LOG_ODDS,
    FACT_RECALL,
    Metric("F_agg", "average", FORGET, better="lower", label="F.agg", headline=True, inputs=F_AGG_INPUTS),
    DELTA,
    CERTIFIED,
    Field("truth_ratios", "truth_ratios", FORGET),
    Metric("forget_truth_ratio", "closer_to_1", FORGET, better="higher", headline=True),
    Metric("forget_quality", "forget_quality", FORGET, better="higher", fmt=".4f", label="KS-p", headline=True),
    # retain, real authors, world facts
    *UTILITY,
    # after every role: model utility, the MIA AUCs (members = forget, non-members = holdout) and their aggregates
    MODEL_UTILITY,
    *MIA_AUC.values(),
    Metric("mia_agg", "average", better="lower", label="MIA.agg", group="privacy", headline=True, inputs=AUC_NAMES),
    ADVANTAGE,
    PRIVLEAK,
)


def _muse_rows() -> list[Row]:
    """knowmem on forget (lower is better; its F1 stands in for F.agg and F-ROUGE in the report) and retain."""
    rows: list[Row] = []
    for role in ("forget", "retain"):
        on = (role,)
        better, group = ("lower", "forget") if role == "forget" else ("higher", "utility")
        stands = ("F_agg", FORGET_ROUGE.name) if role == "forget" else ()
        kw = {"group": group, "part": "rouge"}
        rows += [
            Field("samples", "samples", on, part="rouge"),
            Metric(f"{role}_knowmem_rouge_l_f1", "rouge_f1", on, "rouge_l_f1", better, stands_for=stands, **kw),
            Metric(f"{role}_knowmem_rouge_l_recall", "rouge_recall", on, "rouge_l_recall", better, **kw),
            Field("rouge_l", "rouge_headline", on, part="rouge"),
        ]
        if role == "forget":
            rows += [DIAGNOSIS, DIAGNOSTIC_MARGINS, M_D, DELTA]
    return rows


VERBMEM = ("verbmem",)
# MUSE verbmem (open-unlearning's forget_verbmem_ROUGE): ROUGE-L F1 of the greedy continuation of each forget-passage
# prefix against the passage's true continuation; computed where the benchmark has a verbmem split
VERBMEM_ROWS: tuple[Row, ...] = (
    Field("samples", "samples", VERBMEM),
    Metric("forget_verbmem_rouge_l_f1", "rouge_f1", VERBMEM, "rouge_l_f1", "lower", label="VerbMem"),
)

# MUSE knowmem (few-shot greedy answers), verbmem, the median-aggregated margin diagnostic, loss / min-k AUCs, privleak
MUSE: tuple[Row, ...] = (*_muse_rows(), *VERBMEM_ROWS, MIA_AUC["loss"], MIA_AUC["min_k"], PRIVLEAK)


# WMDP (lm-eval's multiple-choice acc; :mod:`margincal.evaluation.wmdp`): the forget questions' accuracy (it stands in
# for F.agg and F-ROUGE in reports, as the score attacks recover), the answer-letter margin diagnosis, and the accuracy
# on the MMLU-layout utility split
WMDP: tuple[Row, ...] = (
    Field("samples", "samples", FORGET, part="rouge"),
    Metric(
        "forget_wmdp_acc",
        "accuracy",
        FORGET,
        "accuracy",
        "lower",
        label="WMDP acc",
        headline=True,
        part="rouge",
        stands_for=("F_agg", FORGET_ROUGE.name),
    ),
    Field("rouge_l", "accuracy", FORGET, part="rouge"),  # the headline score the attack stage reads (accuracy here)
    DIAGNOSIS,
    DIAGNOSTIC_MARGINS,
    M_D,
    LOG_ODDS,
    DELTA,
    CERTIFIED,
    Field("samples", "samples", ("mmlu",)),
    Metric("mmlu_split_acc", "accuracy", ("mmlu",), "accuracy", "higher", label="MMLU (split)", group="utility"),
)

# any benchmark, when ``EvalSettings.mmlu`` asks for it (computed by :mod:`margincal.evaluation.mmlu`)
MMLU = Metric("mmlu_acc", None, better="higher", label="MMLU", group="capability", headline=True)

TABLES: dict[str, tuple[Row, ...]] = {"tofu": TOFU, "muse": MUSE, "wmdp": WMDP}  # evaluator kind -> its rows


def _index() -> dict[str, Metric]:
    """Every metric by name; a name is declared by one row (the same object where benchmarks share it)."""
    out: dict[str, Metric] = {}
    for row in (*TOFU, *MUSE, *WMDP, MMLU):
        if isinstance(row, Metric):
            if out.setdefault(row.name, row) is not row:
                raise ValueError(f"metric {row.name!r} is declared twice")
            if row.group not in GROUPS:
                raise ValueError(f"metric {row.name!r}: unknown group {row.group!r}")
    for row in out.values():
        unknown = [k for k in (*row.inputs, *row.stands_for) if k not in out]
        if unknown:
            raise ValueError(f"metric {row.name!r} reads undeclared metrics {unknown}")
    return out


METRICS: dict[str, Metric] = _index()
STAND_INS: dict[str, tuple[Metric, ...]] = {
    name: tuple(m for m in METRICS.values() if name in m.stands_for) for name in METRICS
}
HEADLINE: tuple[Metric, ...] = tuple(
    sorted((m for m in METRICS.values() if m.headline), key=lambda m: GROUPS.index(m.group))
)


# ------------------------------------------------------------------------------------------ readers
def metrics(*names: str) -> tuple[Metric, ...]:
    """The declared metrics ``names``, in that order: a name the table does not declare stops at import, so a
    selection elsewhere (the audit card's) cannot drift from the table."""
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise ValueError(f"undeclared metrics {unknown}; the metric table declares {sorted(METRICS)}")
    return tuple(METRICS[name] for name in names)


def per_split(row: Row) -> bool:
    """Whether ``row`` is computed in a role's own pass (else after every role)."""
    return bool(row.roles) and row.roles != MIA_ROLES


def detectors(rows: Iterable[Row]) -> list[str]:
    """The MIA detectors whose AUC ``rows`` hold (what an evaluator has to score)."""
    rows = list(rows)
    return [d for d, m in MIA_AUC.items() if any(m is row for row in rows)]


def _function(row: Row) -> Callable[..., Any]:
    """The function registered as ``row``'s value; missing, it is a bug: the evaluator does not import the module
    that defines it."""
    if row.value not in VALUES:
        raise RuntimeError(f"metric value {row.value!r} is not registered: import the module that defines it")
    return VALUES[row.value]


def fill(
    rows: Iterable[Row],
    role: str | None,
    scores: Any,
    split: dict,
    summary: dict,
    reference: dict,
    parts: Sequence[str] | None = None,
) -> None:
    """Compute the rows of ``role`` (None: the rows computed after every role) in table order from ``scores``, and
    write each available value to ``split`` under its split key and, for a metric, to ``summary`` under its name.
    ``reference`` is θ_ref's summary; ``parts`` keeps only the rows of those parts."""
    for row in rows:
        if (role in row.roles if role is not None else not per_split(row)) and row.value is not None:
            if parts is not None and row.part not in parts:
                continue
            compute = _function(row)
            if isinstance(row, Metric) and row.inputs:
                value = compute({k: summary[k] for k in row.inputs if k in summary}, reference)
            else:
                value = compute(scores)
            if value is None:
                continue
            if row.split_key is not None:
                split[row.split_key] = value
            if isinstance(row, Metric):
                summary[row.name] = value


def read(name: str, summary: dict) -> Any:
    """Metric ``name`` of an evaluate summary: its value, else (an aggregate) computed from its inputs there, else
    the value of a metric standing in for it on that benchmark (MUSE's forget F1 for F.agg), else None."""
    metric = METRICS[name]
    if name in summary:
        return summary[name]
    if metric.inputs and metric.value is not None:
        value = VALUES[metric.value]({k: summary[k] for k in metric.inputs if k in summary}, {})
        if value is not None:
            return value
    return next((summary[m.name] for m in STAND_INS[name] if m.name in summary), None)


def summary_order(summary: dict) -> list[str]:
    """The keys of an evaluate summary as ``margincal evaluate`` prints them: the headline metrics by group, then
    the rest alphabetically."""
    first = [m.name for m in HEADLINE if m.name in summary]
    return first + sorted(k for k in summary if k not in first)
