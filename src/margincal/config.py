"""Typed configs (dataclasses) and the one config resolution.

Every stage setting is resolved here, in one layering order, into a typed config:

    dataclass defaults  →  shipped YAML (configs/…)  →  panel file  →  ``key=value`` overrides

The dataclasses are the only source of defaults; the shipped YAML files hold overrides with their provenance
(``configs/mc.yaml``, ``configs/methods/<name>.yaml``, ``configs/attacks.yaml`` presets, ``configs/benchmarks``).
:func:`resolve_method`, :func:`resolve_mc`, :func:`resolve_attack` and :func:`resolve_benchmark` are the only
readers of those files; the single-stage CLI commands and the panel cells both call them. Dotted overrides
(``mc.kappa=2.0``) are parsed as YAML scalars; unknown keys stop with the list of valid ones.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import reprlib
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from margincal.errors import InputError
from margincal.inputs import MAX_TEXT_BYTES, checked, parse_yaml, path_kind, read_text

T = TypeVar("T")

CONFIG_DIR = Path(os.environ.get("MARGINCAL_CONFIGS", Path(__file__).resolve().parent / "configs"))


@dataclasses.dataclass
class LoraSpec:
    """LoRA adapter shape (peft ``LoraConfig``)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = dataclasses.field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        check_fields(
            self,
            r=AT_LEAST_1,
            alpha=POSITIVE,
            dropout=(lambda v: 0 <= v < 1, "in [0, 1)"),
            target_modules=(bool, "a non-empty list of module names"),
        )


@dataclasses.dataclass
class TrainConfig:
    """One optimisation run of the shared training loop (AdamW + schedule + clipping + NaN guard)."""

    steps: int = 100
    batch_size: int = 8
    lr: float = 1e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.0
    scheduler: str = "linear"  # linear | cosine | constant (transformers.get_scheduler names)
    max_grad_norm: float = 1.0
    lora: LoraSpec | None = None  # None = full-parameter training
    seed: int = 0
    # memory/speed only: activation recomputation, and the optimizer implementation
    gradient_checkpointing: bool = False
    # micro-batches of ``batch_size`` per optimizer step; the step's loss is their mean (effective batch
    # batch_size × grad_accum in the memory of one micro-batch)
    grad_accum: int = 1
    optimizer: str = "adamw"  # adamw | adamw_8bit | paged_adamw_8bit | paged_adamw_32bit (the last three: bitsandbytes)

    def __post_init__(self) -> None:
        """Ranges a run cannot work outside of (checked when the config is built, before any model is loaded)."""
        check_fields(
            self,
            steps=STEPS,
            batch_size=BATCH,
            grad_accum=BATCH,
            lr=POSITIVE,
            weight_decay=NON_NEGATIVE,
            warmup_ratio=UNIT,
            max_grad_norm=POSITIVE,
            seed=SEED,
            scheduler=one_of(*SCHEDULERS),
            optimizer=one_of(*OPTIMIZERS),
        )


SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial")
OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")


class ConfigError(InputError):
    """A configuration value outside its typed spec: the key path (``train.steps``, ``attackers[0].k[1]``), what
    is allowed and, once known, the source that set it (a YAML file or a ``key=value`` override)."""

    def __init__(self, key: str, what: str, source: str | None = None, named: bool = True):
        self.key, self.what, self.source, self.named = key, what, source, named
        head = f"{source}: " if source else ""
        super().__init__(f"{head}{key} {what}" if key and named else f"{head}{what}")

    def within(self, prefix: str) -> ConfigError:
        """The same error for a key under ``prefix`` (a panel section resolved on its own)."""
        return ConfigError(f"{prefix}.{self.key}" if self.key else prefix, self.what, self.source, self.named)

    def sourced(self, source: str) -> ConfigError:
        return ConfigError(self.key, self.what, source, self.named)


# A range rule: (predicate, what the value must be). Numbers are finite by the time a rule sees them (coerce).
Rule = tuple[Callable[[Any], bool], str]
AT_LEAST_1: Rule = (lambda v: v >= 1, "an integer ≥ 1")
POSITIVE: Rule = (lambda v: v > 0, "a positive number")
NON_NEGATIVE: Rule = (lambda v: v >= 0, "≥ 0")
UNIT: Rule = (lambda v: 0 <= v <= 1, "in [0, 1]")
SEED: Rule = (lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)")

# The most of each count that sizes a plan or a run, checked before planning: a run past these is a typo, and planning
# it (one node per draw and budget, one cell per axis product) would take the machine before any check could fail.
MAX_STEPS = 1_000_000  # optimizer steps of one training run (the paper's longest schedules are ~10^3)
MAX_DRAWS = 100  # D_rel draws of an audit budget
MAX_BUDGETS = 64  # K values of one attackers entry
MAX_K = 1_000_000  # one K (it must also stay below |D_f|)
MAX_CELLS = 10_000  # cells of one panel (the product of its axes)
MAX_SEEDS = 1_000  # seeds of one panel
MAX_BATCH = 65_536  # a batch size or a sample count


def at_most(limit: int, low: int = 1) -> Rule:
    """An integer in [``low``, ``limit``]."""
    return (lambda v: low <= v <= limit, f"an integer in [{low}, {f'{limit:,}'.replace(',', ' ')}]")


STEPS: Rule = at_most(MAX_STEPS)
BATCH: Rule = at_most(MAX_BATCH)


def one_of(*allowed: Any) -> Rule:
    return (lambda v: v in allowed, f"one of {', '.join(map(str, allowed))}")


def check_items(key: str, values: Sequence, rule: Rule, most: int | None = None) -> None:
    """Stop on the first item of the list ``key`` outside ``rule``, and on a list of more than ``most`` items."""
    if most is not None and len(values) > most:
        raise ConfigError(key, f"may hold at most {most} items, got {len(values)}")
    ok, what = rule
    for i, value in enumerate(values):
        if not ok(value):
            raise ConfigError(f"{key}[{i}]", f"must be {what}, got {brief(value)}")


def check_fields(obj: Any, **rules: Rule) -> None:
    """Stop on the first field of ``obj`` outside its rule (None passes: an optional field left unset)."""
    for name, (ok, what) in rules.items():
        value = getattr(obj, name)
        if value is not None and not ok(value):
            raise ConfigError(name, f"must be {what}, got {brief(value)}")


_BRIEF = reprlib.Repr()  # keyword arguments only from Python 3.12
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 2, 60, 60, 40
_BRIEF.maxdict = _BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxset = 4


def brief(value: Any) -> str:
    """``repr(value)`` cut to a bounded view (:mod:`reprlib`: a few items per level, two levels, 60 characters per
    string, at most 80 characters), built without ever forming the whole text: a message about a huge or aliased
    value stays one short line."""
    text = _BRIEF.repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


MONITOR_DETECTORS = ("loss", "min_k", "zlib")  # the forward-only MIA detectors (margincal.evaluation.mia)


@dataclasses.dataclass
class MonitorConfig:
    """Held-out monitors of a training run (:mod:`margincal.monitors`): every ``every`` optimizer steps (and at the
    start), on fixed seeded samples of at most ``n`` records each, Δ on evaluation forget records outside the
    training pool, the AUC of each of ``detectors`` on forget vs holdout (privleak against θ_ref's AUC on the same
    samples), a utility proxy (answer NLL on utility records no method trains on) and, for a polish, the probe KL to
    its anchor (the mean of the training loss's own KL term since the previous pass). Written as ``trace.json``
    and ``trace.png`` beside the checkpoint."""

    every: int = 10
    n: int = 16  # the rule in configs/mc.yaml: ≤ 15 % of a monitored mini polish (benchmarks/RESULTS.md)
    detectors: tuple[str, ...] = MONITOR_DETECTORS

    def __post_init__(self) -> None:
        check_fields(self, every=AT_LEAST_1, n=(lambda v: v >= 2, "an integer ≥ 2"))
        bad = [d for d in self.detectors if d not in MONITOR_DETECTORS]
        if bad or not self.detectors:
            raise InputError(f"monitor detectors must be some of {', '.join(MONITOR_DETECTORS)}, got {bad or '()'}")


SELECT_CRITERIA = ("last", "delta", "privleak", "controlled")


@dataclasses.dataclass
class ControlConfig:
    """Controlled MC (issue 27): the rules, fixed before any attack was run (provenance in configs/mc.yaml).

    * utility budget by dual ascent on λ_KL: at each monitor pass, λ ← clip(λ + ``dual_lr`` · (u − u₀ − ``budget``),
      λ₀, ``kl_max``), u the utility proxy (held-out answer NLL, nats/token), u₀ its value at the start and λ₀ the
      polish's ``kl_weight``;
    * MIA stop (``mia_stop``): stop at the first pass where every monitored detector's AUC ≤ θ_ref's AUC;
    * Δ target (``delta_target``): stop at the first pass where Δ ≤ target;
    * the released checkpoint is the monitored step (the start included) chosen by ``select``
      (:data:`margincal.controller.CRITERIA`; ``controlled``: within the utility budget, the lowest max(Δ, target),
      the earliest on ties).
    The controller reads monitors only: no relearn number ever."""

    budget: float = 0.1
    dual_lr: float = 1.0
    kl_max: float = 1.0
    mia_stop: bool = True
    delta_target: float | None = 0.0
    select: str = "controlled"

    def __post_init__(self) -> None:
        check_fields(self, budget=POSITIVE, dual_lr=NON_NEGATIVE, kl_max=POSITIVE, select=one_of(*SELECT_CRITERIA))


@dataclasses.dataclass
class MCConfig:
    """Margin Calibration polish (paper Sec. 3.4 and 4.1); defaults are the frozen configuration.

    The paper fixes (κ, λ_KL, r, N_pol) = (5.0, 0.05, 32, 200) and 80 single-sample optimizer steps, and
    gives no learning rate or LoRA alpha. ``lr`` = 1e-4 (constant) and ``lora.alpha`` = r = 32 (LoRA scale 1) are
    our choices for real-scale models (provenance in configs/mc.yaml); AdamW, weight decay 0.01, clipping at 1.0.
    """

    kappa: float = 5.0
    kl_weight: float = 0.05
    n_pool: int = 200
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=80, batch_size=1, lr=1e-4, warmup_ratio=0.0, scheduler="constant", lora=LoraSpec(r=32, alpha=32)
        )
    )
    probe_batch_size: int = 1
    retain_batch_size: int = 1  # retain samples per step for the native loss's retain term
    # variant switches (margincal.calibration.MC_VARIANTS names the paper's presets); defaults = reference-anchored MC
    margin_anchor: str = "ref"  # ref (θ_mar = θ_anc = θ_ref) | theta0 (deployment)
    forget_term: str = "hinge"  # hinge | ascent (GradAscent polish)
    token_weights: str = "uniform"  # uniform | soft_entropy | top8 | ref_gate
    retain_hinge_weight: float = 0.0  # λ_r of the retain-side hinge (two-sided / deployment: 1.0)
    native_forget: bool = True  # false: native forget term off (γ = 0)
    stop_delta: float | None = None  # Δ-stop: stop once Δ on a held-out check batch (the monitors' when on) ≤ this
    stop_batch: int = 16  # Δ-stop check batch: evaluation forget records outside the polish pool, encoded as evaluated
    check_every: int = 10  # steps between Δ-stop checks / trace rows
    monitor: MonitorConfig | None = None  # held-out monitors and their trace (on whenever ``control`` is set)
    control: ControlConfig | None = None  # controlled MC (variant ``controlled``)

    def __post_init__(self) -> None:
        check_fields(
            self,
            kappa=POSITIVE,
            kl_weight=NON_NEGATIVE,
            n_pool=AT_LEAST_1,
            probe_batch_size=AT_LEAST_1,
            retain_batch_size=AT_LEAST_1,
            margin_anchor=one_of("ref", "theta0"),
            forget_term=one_of("hinge", "ascent"),
            token_weights=one_of(*TOKEN_WEIGHTS),
            retain_hinge_weight=NON_NEGATIVE,
            stop_batch=AT_LEAST_1,
            check_every=AT_LEAST_1,
        )
        if self.control is not None and self.stop_delta is not None:
            raise InputError("controlled MC has its own Δ target: set control.delta_target instead of stop_delta")
        if self.control is not None and self.monitor is None:
            self.monitor = MonitorConfig()
        if self.control is not None and self.control.dual_lr > 0 and self.kl_weight <= 0:
            raise InputError("controlled MC raises λ_KL from kl_weight: set kl_weight > 0 (or control.dual_lr=0)")


TOKEN_WEIGHTS = ("uniform", "soft_entropy", "top8", "ref_gate")


# The attacker kinds, as data: margincal.attacks registers one function per name and refuses any other.
FAMILIES = ("gradient", "preference", "distillation")  # unlearning loss families, in the paper's row order
ATTACKER_KINDS = ("lora", "fpft", "soft_prompt", "adaptive", "linear_probe", "in_context", "format_probe")
# What an attacker trains on (threat families): D_rel ⊂ D_f; retain records alone (retain-only relearning, "From
# Dormant to Deleted", 2505.22310); the out-of-domain probe corpus (benign relearning, 2510.07626)
RELEARN_DATA = ("forget", "retain", "probe")


@dataclasses.dataclass
class AttackConfig:
    """Relearn attack: fine-tune on D_rel (|D_rel| = k, seeded) and score the forget records it did not train on.
    ``data`` is where D_rel comes from (:data:`RELEARN_DATA`): ``forget`` (D_rel ⊂ D_f, scored on D_f \\ D_rel),
    ``retain`` or ``probe`` (k records of the retain split or of the out-of-domain probe corpus, scored on all of
    D_f)."""

    name: str = "lora"  # lora | fpft | soft_prompt | adaptive | linear_probe | in_context (margincal.attacks)
    k: int = 20
    data: str = "forget"
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=20, batch_size=10, lr=1e-4, scheduler="constant", lora=LoraSpec(r=8, alpha=16)
        )
    )
    n_soft: int = 20  # soft_prompt: virtual tokens
    beta: float = 120.0  # adaptive: inverse temperature of the smoothed margin m_β
    # when set, an epoch-based schedule: train.steps = ceil(epochs · K / (batch_size · grad_accum)) passes over D_rel
    epochs: float | None = None
    # format_probe: rewordings of each question ("{question}" stands for it); K is how many of them are tried
    formats: list[str] = dataclasses.field(default_factory=list)
    # evaluation roles whose headline ROUGE-L the attacked model is also scored on (a searched trial's utility proxy,
    # the benchmark's `utility` splits: margincal.stages.utility_score); empty: none
    utility: list[str] = dataclasses.field(default_factory=list)
    # D_f positions D_rel is drawn from (set by an audit's search: margincal.data.draws.search_split); empty: all D_f
    pool: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check_fields(self, k=at_most(MAX_K), n_soft=BATCH, beta=POSITIVE, epochs=POSITIVE, data=one_of(*RELEARN_DATA))
        if self.pool and (self.data != "forget" or self.name == "format_probe" or len(set(self.pool)) < len(self.pool)):
            raise ConfigError("pool", f"lists distinct D_f records of an attack on D_f, got {brief(self.pool)}")
        if self.k > (len(self.pool) or MAX_K):
            raise ConfigError("k", f"must be at most the relearn pool's {len(self.pool)} records, got {self.k}")
        if self.name in ("in_context", "format_probe") and self.data != "forget":
            raise ConfigError("data", f"must be forget for {self.name} (it asks the forget questions)")
        if self.name == "format_probe":
            if not 0 < self.k <= len(self.formats):
                raise ConfigError("k", f"must be in [1, {len(self.formats)}] for format_probe (the formats it tries)")
            for i, fmt in enumerate(self.formats):
                if fmt.count("{question}") != 1 or fmt.replace("{question}", "").count("{") > 0:
                    raise ConfigError(f"formats[{i}]", "must hold {question} once and no other {…} field")

    def scheduled(self) -> AttackConfig:
        """This config with an epoch-based schedule turned into optimizer steps at its K (unchanged without one)."""
        if self.epochs is None:
            return self
        per_step = self.train.batch_size * self.train.grad_accum
        steps = max(1, math.ceil(self.epochs * self.k / per_step))
        return dataclasses.replace(self, train=dataclasses.replace(self.train, steps=steps))


@dataclasses.dataclass
class EvalSettings:
    """Evaluation settings of every evaluate/attack stage (decoding length and splits come from the benchmark)."""

    batch_size: int = 32  # scoring and gradnorm batches
    generation_batch_size: int = 512  # rows per greedy batch; finished rows leave it (benchmarks/generation_speed.py)
    gradnorm: bool = True  # the gradient-norm MIA detector (per-sample gradient norms, batched)
    mmlu: str | None = None  # None | local (offline multiple-choice set) | mmlu (lm-eval, hub access)

    def __post_init__(self) -> None:
        check_fields(self, batch_size=AT_LEAST_1, generation_batch_size=AT_LEAST_1, mmlu=one_of("local", "mmlu"))


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark's evaluation protocol (``configs/benchmarks/<name>.yaml``): data source, splits and their roles,
    and how the evaluator of its ``kind`` scores them.

    ``splits``/``train_splits`` map roles to split names (``{tier}``, ``{pct}``, ``{retain_pct}`` are filled per
    tier); a ``train_splits`` entry may instead be a sampled corpus ``{source, name, n}`` (the probe D_a, ILU's
    environment). ``few_shot``: each QA role ``r`` is prompted with the pairs of role ``r_icl`` before the
    question (MUSE knowmem); a ``verbmem`` role holds prefix/continuation pairs whose greedy continuations
    (``verbmem_new_tokens``) are scored by ROUGE-L F1 (MUSE verbmem). ``rouge``: the headline ROUGE-L (``recall``,
    TOFU; ``f1``, MUSE). ``aggregate``: of the margin diagnostic m(D) (``mean``, TOFU; ``median``, MUSE).
    ``membership``: the (members, non-members) roles the
    MIA detectors, the monitors and the audit read (TOFU's forget/holdout; MUSE's privleak mia_forget/mia_holdout;
    none for WMDP, which has no non-member passages).

    ``kind: wmdp`` (multiple choice, :mod:`margincal.evaluation.wmdp`): every evaluation role holds four-choice
    questions scored as lm-eval's ``multiple_choice`` tasks score them, with ``description`` (lm-eval's task
    description) before each; ``relearn_from: corpus`` draws a forget-data relearn attack's D_rel from the training
    forget corpus and scores every forget question (WMDP's questions are never trained on), where ``questions``
    (TOFU, MUSE) draws it from the forget questions and scores the rest; ``chance`` is the score of a model that
    knows nothing (0.25 for four choices), the audit's floor when no θ_ref is given; ``hinge_on: questions`` puts
    MC's hinge on the forget questions at their answer-letter margins (anchored at the margin anchor's per-question
    margins) while the method's native loss keeps training on the forget corpus.
    """

    name: str
    kind: str  # tofu | muse: which evaluator
    splits: dict
    train_splits: dict
    source: str | None = None  # HF dataset id or local directory; None: the mini benchmark, generated in-process
    aggregate: str = "mean"
    rouge: str = "recall"
    few_shot: bool = False
    max_length: int = 512
    max_new_tokens: int = 200
    verbmem_new_tokens: int = 128  # MUSE verbmem continuations (open-unlearning's forget_verbmem_ROUGE)
    stop: tuple[str, ...] = ()
    retain_n: int | None = None  # a seeded subset of the retain split (None: all of it)
    membership: tuple[str, ...] = ("forget", "holdout")  # (members, non-members): the roles MIA detectors separate
    utility: tuple[str, ...] = ()  # the utility proxy's roles: splits no attack trains on (configs/audit.yaml search)
    description: str = ""  # multiple choice: lm-eval's task description, placed before every question
    relearn_from: str = "questions"  # questions | corpus: where a forget-data relearn attack draws D_rel from
    chance: float | None = None  # the score of a model without the knowledge (WMDP: 0.25); the floor without θ_ref
    hinge_on: str = "train"  # train | questions: MC's hinge on the training forget split, or on the forget questions
    tier: str = "forget10"  # the tier a single-stage command or an audit reads when none is given (MUSE: news)

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "membership", tuple(self.membership))
        object.__setattr__(self, "utility", tuple(self.utility))
        for role in self.utility:
            if role not in self.splits or role in ("forget", *self.membership):
                raise ConfigError("utility", f"must name evaluation splits other than the forget set, got {role!r}")
        if self.hinge_on == "questions" and self.kind != "wmdp":
            raise ConfigError("hinge_on", "questions is for multiple-choice benchmarks (kind: wmdp)")
        if self.membership and (len(self.membership) != 2 or len(set(self.membership)) != 2):
            got = brief(list(self.membership))
            raise ConfigError("membership", f"must be two distinct roles (members, non-members) or none, got {got}")
        check_fields(
            self,
            kind=one_of("tofu", "muse", "wmdp"),
            relearn_from=one_of("questions", "corpus"),
            hinge_on=one_of("train", "questions"),
            description=(lambda v: isinstance(v, str), "a string (lm-eval's task description)"),
            tier=(lambda v: isinstance(v, str) and v.strip() != "", "a tier name"),
            chance=(lambda v: 0 <= v < 1, "in [0, 1)"),
            rouge=one_of("recall", "f1"),
            aggregate=one_of("mean", "median"),
            max_length=AT_LEAST_1,
            max_new_tokens=AT_LEAST_1,
            verbmem_new_tokens=AT_LEAST_1,
            retain_n=AT_LEAST_1,
        )

    @property
    def score_field(self) -> str:
        """The per-sample field of the headline forget score an attack recovers: ``rouge_l`` (TOFU's ROUGE-L
        recall), ``rouge_l_f1`` (MUSE's F1) or ``correct`` (WMDP: 1 when the question is answered right)."""
        if self.kind == "wmdp":
            return "correct"
        return "rouge_l_f1" if self.rouge == "f1" else "rouge_l"

    @property
    def score_label(self) -> str:
        """The headline forget score in words, as cards and reports name it."""
        return {"correct": "accuracy", "rouge_l_f1": "ROUGE-L F1"}.get(self.score_field, "ROUGE-L")


@dataclasses.dataclass
class PlateauStop:
    """Stop unlearning at a plateau of the method's own (native) loss, ``train.steps`` being the cap.

    An epoch is ⌈|D_f| / batch_size⌉ steps and L̄_e the mean native loss of epoch e. Training stops at the end of the
    first epoch e ≥ ``min_epochs`` whose improvement is a small share of the improvement so far:
    L̄_{e−1} − L̄_e ≤ ``tol`` · |L̄_1 − L̄_e|. Scale-free, so it serves losses near zero (NPO) and unbounded ones
    (GradDiff, which never meets it and runs to the cap). Use it with a constant learning rate: a decaying schedule
    makes any loss flatten."""

    tol: float = 0.05
    min_epochs: int = 3

    def __post_init__(self) -> None:
        check_fields(self, tol=(lambda v: 0 < v < 1, "in (0, 1)"), min_epochs=(lambda v: v >= 2, "an integer ≥ 2"))


@dataclasses.dataclass
class MethodRun:
    """One unlearning method's registry hyperparameters and training schedule (``stop``: an optional plateau rule)."""

    name: str = ""
    hparams: dict = dataclasses.field(default_factory=dict)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    retain_batch_size: int | None = None
    stop: PlateauStop | None = None
    monitor: MonitorConfig | None = None  # held-out monitors during unlearning, with their trace
    select: str = "last"  # the released step: last, or the best monitored one (margincal.controller.CRITERIA)

    def __post_init__(self) -> None:
        check_fields(self, retain_batch_size=AT_LEAST_1, select=one_of(*SELECT_CRITERIA[:3]))
        if self.select != "last" and self.monitor is None:
            self.monitor = MonitorConfig()


# MC variant presets: sets of MCConfig switches (paper appendices on the entropy-weighted and reference-gated hinges,
# the stopping-rule sweep and the ablation matrix).
MC_VARIANTS: dict[str, dict] = {
    "reference": {},
    "deployment": {"margin_anchor": "theta0", "kl_weight": 0.0, "retain_hinge_weight": 1.0},
    "forget_only": {"kl_weight": 0.0},
    "two_sided": {"kl_weight": 0.0, "retain_hinge_weight": 1.0},
    "gradascent": {"forget_term": "ascent", "kl_weight": 0.0},
    "soft_entropy": {"token_weights": "soft_entropy"},
    "top8": {"token_weights": "top8"},
    "ref_gate": {"token_weights": "ref_gate"},
    "no_native_forget": {"native_forget": False},
    "delta_stop": {"stop_delta": -2.0},
    "controlled": {"control": {}},
}


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _optional(tp: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, else ``(tp, False)``."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def describe(value: Any) -> str:
    """How a value of the wrong shape reads in a message (a bounded view of it, :func:`brief`)."""
    kinds = {dict: "a mapping", list: "a list", tuple: "a list", str: "a string", bool: "a boolean"}
    return next((f"{name} ({brief(value)})" for t, name in kinds.items() if isinstance(value, t)), brief(value))


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass ``cls`` from a nested mapping, checked against its typed spec: the mapping's shape, unknown
    and missing keys, each value's type (:func:`coerce`, recursing into dataclass-typed fields, merged over the
    field's default) and the dataclass's own range rules. Any violation is a :class:`ConfigError` naming the key
    path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a mapping of key: value, got {describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        what = f"unknown config key(s) {brief(unknown)} in {path or cls.__name__}; valid keys: {sorted(fields)}"
        raise ConfigError(where, what, named=False)
    missing = [
        n
        for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(path, f"misses required key(s) {missing}")
    kwargs = {}
    for name, value in data.items():
        where = f"{path}.{name}" if path else name
        tp, _ = _optional(hints[name])
        if _is_dataclass_type(tp) and isinstance(value, dict):
            default = default_of(cls, name)
            merged = deep_merge(dataclasses.asdict(default) if default is not None else {}, value)
            kwargs[name] = build(tp, merged, where)
        else:
            kwargs[name] = coerce(value, hints[name], where)
    try:
        return cls(**kwargs)
    except ConfigError as err:  # a range rule of the dataclass: name the config section
        raise err.within(path) if path else err from None
    except InputError as err:  # a rule phrased by the dataclass itself: keyed by its section, for its source
        raise ConfigError(path, str(err), named=False) from None


def coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against type ``tp`` (``int``, ``float``, ``bool``, ``str``, ``T | None``, ``list[T]``,
    ``tuple[T, ...]``, ``dict[str, T]``, a dataclass), converted where YAML's reading is ambiguous: ``1e-4`` read
    as a string becomes a float, ``2.0`` an int. A value of the wrong type (``steps=2.5``, ``lr=fast``,
    ``models: mini`` for a list, a non-finite number) stops with :class:`ConfigError` naming the key path."""
    tp, optional = _optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise ConfigError(where, f"expects {_expected(tp)}, got null")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if _is_dataclass_type(tp):
        return value if isinstance(value, tp) else build(tp, value, where)
    if tp in (list, tuple) or origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(where, f"expects a list, got {describe(value)}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(where, f"expects a mapping, got {describe(value)}")
        item = args[1] if args else Any
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ConfigError(where, f"expects string keys, got {brief(bad[0])}")
        return {k: coerce(v, item, f"{where}.{k}") for k, v in value.items()}
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(where, f"expects a string, got {describe(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"expects true or false, got {describe(value)}")
        return value
    if tp is int:
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(where, f"expects an integer, got {brief(value)}") from None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"expects an integer, got {describe(value)}")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(where, f"expects a number, got {brief(value)}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"expects a number, got {describe(value)}")
        if not math.isfinite(value):
            raise ConfigError(where, f"expects a finite number, got {value!r}")
        return float(value)
    return value


def _expected(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    origin = typing.get_origin(tp)
    if tp in names:
        return names[tp]
    if tp in (list, tuple) or origin in (list, tuple):
        return "a list"
    return "a mapping" if tp is dict or origin is dict or _is_dataclass_type(tp) else "a value"


def deep_merge(base: dict, update: dict) -> dict:
    """Recursive dict merge: ``update`` wins, nested mappings are merged key by key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(item: Override) -> tuple[list[str], Any]:
    """``a.b.c=value`` → (``["a", "b", "c"]``, the value read as a YAML scalar or flow collection); a ``(key, value)``
    pair (a panel's ``set:`` entry, data already) keeps its value as it is: null stays None."""
    if isinstance(item, tuple):
        return item[0].split("."), item[1]
    if not isinstance(item, str) or "=" not in item:
        raise InputError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise InputError(f"override {item!r}: {key.strip()!r} is not a dotted key (e.g. train.lr)")
    try:
        return parts, parse_yaml(raw)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "unreadable"
        raise InputError(f"override {item!r}: the value is not valid YAML ({problem})") from None


def apply_overrides(data: dict, overrides: Sequence[Override]) -> dict:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) and ``(key, value)`` pairs to a nested dict."""
    out = copy.deepcopy(data or {})
    for item in overrides:
        parts, value = parse_override(item)
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"override {item!r}: {part!r} is not a mapping")
        node[parts[-1]] = value
    return out


# A configuration layer: (its source as a message names it — a file, "override k=v" —, the mapping it sets).
Layer = tuple[str, Any]
Override = str | tuple[str, Any]  # ``key=value`` (its value YAML text), or a ``(key, value)`` pair of a set: block


def override_layers(overrides: Sequence[Override]) -> list[Layer]:
    """One layer per ``key=value`` override or ``set:`` entry."""
    named = [f"override {o}" if isinstance(o, str) else f"set {o[0]}: {brief(o[1])}" for o in overrides]
    return [(name, apply_overrides({}, [item])) for name, item in zip(named, overrides, strict=True)]


def _sets(data: Any, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(data, dict):
            return True  # the layer sets a parent of the key (a list or a scalar in its place)
        if part not in data:
            return False
        data = data[part]
    return True


def sourced(err: ConfigError, layers: Sequence[Layer]) -> ConfigError:
    """``err`` naming the last of ``layers`` that sets its key (an index — ``attackers[0].k[1]`` — counts as set by
    whoever set the list); when none does, the source the error already names (a file read on its own), else the
    first layer (a default read there)."""
    parts = []
    for part in err.key.split("."):
        name, bracket, _ = part.partition("[")
        parts.append(name)
        if bracket:
            break
    for source, data in reversed(layers):
        if err.key and _sets(data, parts):
            return err.sourced(source)
    return err if err.source or not layers else err.sourced(layers[0][0])


def read_yaml(path: str | Path) -> dict:
    """A YAML file holding a non-empty mapping, read by :func:`margincal.inputs.read_text` (no empty file or one of only
    comments: defaults are never taken silently); parsed once per version of the file (its size and mtime), a fresh
    copy each call: a panel's plans read the shipped files per cell."""
    stat = checked(path, "", "file", "a YAML file").stat()
    return copy.deepcopy(_parsed_yaml(Path(path), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=256)
def _parsed_yaml(path: Path, size: int, mtime_ns: int) -> dict:
    try:
        data = parse_yaml(read_text(path, "", MAX_TEXT_BYTES, "a YAML file of key: value settings"))
    except yaml.YAMLError as err:
        raise InputError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    if data is None or data == {}:
        empty = "only comments" if data is None else "an empty mapping"
        raise InputError(f"{path} holds {empty}; give a YAML file of key: value settings")
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping of key: value at its top level, got {describe(data)}")
    return data


def build_sourced(cls: type[T], data: dict, layers: Sequence[Layer]) -> T:
    """:func:`build`, its errors naming the layer that set the failing key (:func:`sourced`)."""
    try:
        return build(cls, data)
    except ConfigError as err:
        raise sourced(err, layers) from None


def shown(path: str | Path) -> str:
    """A config file as messages name it: shipped ones as ``configs/…``, others as given."""
    path = Path(path)
    return f"configs/{path.relative_to(CONFIG_DIR)}" if path.is_relative_to(CONFIG_DIR) else str(path)


YAML_SUFFIXES = (".yaml", ".yml")


def shipped_names(kind: str) -> list[str]:
    """The names of the shipped ``configs/<kind>/*.yaml``."""
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def shipped(kind: str, name: str | Path, what: str) -> Path:
    """The one lookup of a config by name or path: ``name`` itself when it names something that exists (a ``.yaml``
    name, or one with a path separator; anything but a regular file is refused, naming its kind), else the shipped
    ``configs/<kind>/<name>.yaml`` (the name lower-cased; a YAML path that does not exist stands for its stem). A name
    with a path separator, or none shipped, stops with the shipped names (``what`` names the kind in the message)."""
    path = Path(name)
    as_path = path.suffix in YAML_SUFFIXES or os.sep in str(name)
    if as_path and path_kind(path) != "missing":  # a directory x.yaml, a device, a link loop: named as such
        return checked(path, f"the {what} file", "file", "a YAML file")
    stem = (path.stem if path.suffix in YAML_SUFFIXES else str(name)).lower()
    own = CONFIG_DIR / kind / f"{stem}.yaml"
    if Path(stem).name != stem or not own.is_file():
        lead = f"no such file {brief(str(name))}, and no shipped {what} {brief(stem)}" if as_path else ""
        raise InputError(f"{lead or f'unknown {what} {brief(str(name))}'}; known: {', '.join(shipped_names(kind))}")
    return own


def given(cls: type[T], **values: Any) -> T:
    """``cls`` from the values given (not None); the rest fall through to its defaults, the only ones there are (a
    command-line option left out passes None)."""
    return cls(**{k: v for k, v in values.items() if v is not None})


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass field ``name`` (what a help text quotes, what :func:`build` merges a partial mapping
    onto); None for a field without one."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    factory = None if field.default_factory is dataclasses.MISSING else field.default_factory
    return factory() if factory else None if field.default is dataclasses.MISSING else field.default


def build_file(cls: type[T], data: Any, source: str | Path) -> T:
    """:func:`build` of what a file holds, its errors naming the file (``source``)."""
    try:
        return build(cls, data)
    except ConfigError as err:
        raise err.sourced(shown(source) if isinstance(source, Path) else source) from None


def _without_provenance(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "provenance"}


def paper_schedule(paper: dict, n_forget: int) -> tuple[TrainConfig, dict]:
    """Step-based equivalent of an epoch-based paper schedule (``configs/methods/*.yaml`` ``train.paper``) and the
    hyperparameters it sets (``dual_warmup_epochs`` → PDU's ``dual_warmup_steps``).

    One optimizer step sees ``per_device_batch_size × gradient_accumulation_steps`` forget samples, accumulated over
    ``gradient_accumulation_steps`` micro-batches; steps = epochs × ⌈|D_f| / effective batch⌉; warm-up
    ``warmup_epochs / epochs`` of them; ``optimizer`` (e.g. ``paged_adamw_32bit``) as given.
    """
    per_device = int(paper.get("per_device_batch_size", 4))
    accum = int(paper.get("gradient_accumulation_steps", 1))
    per_epoch = math.ceil(max(n_forget, 1) / (per_device * accum))
    epochs = int(paper["epochs"])
    train = TrainConfig(
        steps=epochs * per_epoch,
        batch_size=per_device,
        grad_accum=accum,
        lr=float(paper["lr"]),
        weight_decay=float(paper.get("weight_decay", 0.0)),
        warmup_ratio=float(paper.get("warmup_epochs", 0)) / epochs,
        scheduler="linear",
        optimizer=paper.get("optimizer", "adamw"),
    )
    if "dual_warmup_epochs" in paper:
        return train, {"dual_warmup_steps": int(paper["dual_warmup_epochs"]) * per_epoch}
    return train, {}


def resolve_method(
    name: str, scale: str, n_forget: int = 0, panel: dict | None = None, overrides: Sequence[str] = ()
) -> MethodRun:
    """MethodRun defaults ← ``configs/methods/<name>.yaml`` (hparams + the ``scale`` schedule) ← ``panel``
    (a panel's ``method_overrides`` entry) ← ``key=value`` overrides (``hparams.beta=0.2 train.lr=2e-5``).

    ``scale``: ``mini`` (the calibrated step-based mini schedule; its section may adapt hparams and the retain batch)
    or ``paper`` (the epoch-based open-unlearning schedule, converted by :func:`paper_schedule` for ``n_forget``)."""
    path = shipped("methods", name, "method")
    spec = read_yaml(path)
    schedules = spec.get("train")
    if scale in ("paper", "mini") and not (isinstance(schedules, dict) and isinstance(schedules.get(scale), dict)):
        raise InputError(f"{shown(path)}: no train.{scale} schedule; a method YAML gives train.paper and train.mini")
    hparams = dict(spec.get("hparams", {}))
    if scale == "paper":
        train, extra = paper_schedule(spec["train"]["paper"], n_forget)
        data = {"hparams": {**hparams, **extra}, "train": dataclasses.asdict(train)}
    elif scale == "mini":
        mini = _without_provenance(spec["train"]["mini"])
        data = {
            "hparams": deep_merge(hparams, mini.pop("hparams", {})),
            "retain_batch_size": mini.pop("retain_batch_size", None),
            "train": mini,
        }
    else:
        raise InputError(f"unknown scale {scale!r}; use 'paper' or 'mini'")
    data = apply_overrides(deep_merge(deep_merge(data, panel or {}), {"name": spec.get("name", name)}), overrides)
    layers = [(shown(path), data), ("the panel", panel or {}), *override_layers(overrides)]
    return build_sourced(MethodRun, data, layers)


def _at_scale(spec: dict, scale: str, what: str) -> dict:
    """A shipped YAML section without provenance, its ``mini`` subsection layered on top at ``scale=mini``."""
    if scale not in ("paper", "mini"):
        raise InputError(f"unknown {what} scale {scale!r}; use paper or mini")
    spec = _without_provenance(dict(spec))
    mini = _without_provenance(spec.pop("mini", {}))
    return deep_merge(spec, mini) if scale == "mini" else spec


def resolve_mc(
    variant: str, scale: str, panel: dict | None = None, overrides: Sequence[Override] = (), seed: int | None = None
) -> MCConfig:
    """MCConfig defaults ← ``configs/mc.yaml`` (its ``mini`` section on top at ``scale=mini``) ← ``panel`` (a panel's
    ``mc`` section) ← the variant preset (:data:`MC_VARIANTS`) ← overrides (``key=value``, or a variant's ``set:``
    pairs); ``seed`` (a cell's seed) sets ``train.seed``."""
    if variant not in MC_VARIANTS:
        known = ", ".join(MC_VARIANTS)
        raise ConfigError("preset", f"unknown MC variant preset {brief(variant)}; known: {known}", named=False)
    shipped = _at_scale(read_yaml(CONFIG_DIR / "mc.yaml"), scale, "MC")
    data = deep_merge(deep_merge(shipped, panel or {}), MC_VARIANTS[variant])
    data = apply_overrides(data, [*overrides, *([f"train.seed={seed}"] if seed is not None else [])])
    layers = [(shown(CONFIG_DIR / "mc.yaml"), shipped), ("the panel", panel or {}), *override_layers(overrides)]
    return build_sourced(MCConfig, data, layers)


def resolve_attack(
    preset: str, scale: str, overrides: Sequence[Override] = (), k: int | None = None, seed: int | None = None
) -> AttackConfig:
    """AttackConfig defaults ← ``configs/attacks.yaml`` preset, or a YAML file holding one (a searched attack's winner,
    :mod:`margincal.auditing.search`), its ``mini`` section on top at ``scale=mini`` ← overrides (``train.lr=2e-4``, or
    an attacker's ``set:`` pairs); ``k`` and ``seed`` (the D_rel draw and attacker init) last."""
    source = CONFIG_DIR / "attacks.yaml"
    presets = read_yaml(source)
    if Path(preset).suffix in YAML_SUFFIXES or os.sep in preset:  # a preset file (a searched attack's winner)
        source = Path(preset)
        presets = {preset: read_yaml(source)}
    if preset not in presets:
        known = ", ".join(presets)
        raise ConfigError("preset", f"unknown attacker preset {brief(preset)}; known: {known}", named=False)
    spec = _at_scale(presets[preset], scale, "attack")
    extra = [*([f"k={k}"] if k is not None else []), *([f"train.seed={seed}"] if seed is not None else [])]
    layers = [(shown(source), spec), *override_layers([*overrides, *extra])]
    cfg = build_sourced(AttackConfig, apply_overrides(spec, [*overrides, *extra]), layers).scheduled()
    if cfg.name not in ATTACKER_KINDS:
        kinds = ", ".join(ATTACKER_KINDS)
        raise ConfigError("name", f"must be one of {kinds}, got {brief(cfg.name)}", f"preset {preset}")
    return cfg


def resolve_benchmark(name: str) -> BenchmarkSpec:
    """``configs/benchmarks/<name>.yaml`` (or a benchmark YAML file of one's own) as a :class:`BenchmarkSpec`."""
    path = shipped("benchmarks", name, "benchmark")
    return build_file(BenchmarkSpec, read_yaml(path), path)
