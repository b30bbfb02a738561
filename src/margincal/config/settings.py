"""Typed configs (dataclasses) and the one config resolution.

Every stage setting is resolved here, in one layering order, into a typed config:

    dataclass defaults  →  shipped YAML (configs/…)  →  panel file  →  ``key=value`` overrides

The dataclasses are the only source of defaults; the shipped YAML files hold overrides with their provenance
(``configs/mc.yaml``, ``configs/methods/<name>.yaml``, ``configs/attacks.yaml`` presets, ``configs/benchmarks``).
:func:`resolve_method`, :func:`resolve_mc`, :func:`resolve_attack` and :func:`resolve_benchmark` are the only
readers of those files (found by :mod:`margincal.config.files`); the single-stage CLI commands and the panel cells
both call them. Every layer is checked by the typed builder (:mod:`margincal.config.typed`): dotted overrides
(``mc.kappa=2.0``) are parsed as YAML scalars; unknown keys stop with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

from margincal.config.files import CONFIG_DIR, YAML_SUFFIXES, build_file, read_yaml, shipped, shown
from margincal.config.typed import (
    AT_LEAST_1,
    BATCH,
    MAX_K,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    STEPS,
    UNIT,
    ConfigError,
    Override,
    apply_overrides,
    at_most,
    brief,
    build_sourced,
    check_fields,
    deep_merge,
    one_of,
    override_layers,
)
from margincal.core.errors import InputError
from margincal.core.registry import Registry


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


DTYPE_NAMES = (
    "float32",
    "bfloat16",
    "float16",
)  # the dtypes a model's weights load in (margincal.model.loading.DTYPES)
DEFAULT_DTYPE = "float32"  # every loading entry point's default (bfloat16 is the GPU's choice, asked for)
DEFAULT_DEVICE = "cpu"  # every command's and API function's torch device unless told (a panel's default is auto)
DEFAULT_BENCHMARK = "tofu"  # the benchmark a command evaluates unless told (the mini benchmark has TOFU's layout)
DEFAULT_SCALE = "paper"  # the schedules' scale unless told: paper (real models) or mini
DEFAULT_SELECT = "last"  # the step an unlearning run releases unless told: the last
DEFAULT_VARIANT = "reference"  # the MC variant a polish runs unless told: anchored at θ_ref
DEFAULT_ATTACKER = "lora_r8"  # the attacker preset an attack runs unless told (configs/attacks.yaml)
DEFAULT_BUDGET = "quick"  # the audit budget unless told (configs/audit.yaml)

MONITOR_DETECTORS = ("loss", "min_k", "zlib")  # the forward-only MIA detectors (margincal.evaluation.mia)


@dataclasses.dataclass
class MonitorConfig:
    """Held-out monitors of a training run (:mod:`margincal.training.monitors`): every ``every`` optimizer steps (and at
    the start), on fixed seeded samples of at most ``n`` records each, Δ on evaluation forget records outside the
    training pool, the AUC of each of ``detectors`` on forget vs holdout (privleak against θ_ref's AUC on the same
    samples), a utility proxy (answer NLL on utility records no method trains on) and, for a polish, the probe KL to its
    anchor (the mean of the training loss's own KL term since the previous pass). Written as ``trace.json`` and
    ``trace.png`` beside the checkpoint."""

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
      (:data:`margincal.training.controller.CRITERIA`; ``controlled``: within the utility budget, the lowest max(Δ,
      target),
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
    # variant switches (margincal.config.settings.MC_VARIANTS names the paper's presets); defaults = reference-anchored
    # MC
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


# The attacker kinds, as data: margincal.training.attacks registers one function per name and refuses any other.
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

    name: str = "lora"  # lora | fpft | soft_prompt | adaptive | linear_probe | in_context (margincal.training.attacks)
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
    # the benchmark's `utility` splits: margincal.pipeline.stages.utility_score); empty: none
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
    generation_batch_size: int = 512  # rows per greedy batch; finished rows leave it (benchmarks/speed/)
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
    select: str = (
        DEFAULT_SELECT  # the released step: last, or the best monitored one (margincal.training.controller.CRITERIA)
    )

    def __post_init__(self) -> None:
        check_fields(self, retain_batch_size=AT_LEAST_1, select=one_of(*SELECT_CRITERIA[:3]))
        if self.select != "last" and self.monitor is None:
            self.monitor = MonitorConfig()


# MC variant presets: sets of MCConfig switches (paper appendices on the entropy-weighted and reference-gated hinges,
# the stopping-rule sweep and the ablation matrix).
MC_VARIANTS: Registry[dict] = Registry(
    "MC variant preset",
    "MC variant presets",
    entries={
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
    },
).freeze()


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
    variant: str,
    scale: str,
    panel: dict | None = None,
    overrides: Sequence[Override] = (),
    seed: int | None = None,
    given: Sequence[tuple[str, dict]] = (),
) -> MCConfig:
    """MCConfig defaults ← ``configs/mc.yaml`` (its ``mini`` section on top at ``scale=mini``) ← ``panel`` (a panel's
    ``mc`` section) ← the variant preset (:data:`MC_VARIANTS`) ← ``given`` (named mappings of fields a caller passed,
    in order: the API's ``mc=`` and its keywords) ← overrides (``key=value``, or a variant's ``set:`` pairs);
    ``seed`` (a cell's seed) sets ``train.seed``."""
    if variant not in MC_VARIANTS:
        known = ", ".join(MC_VARIANTS)
        raise ConfigError("preset", f"unknown MC variant preset {brief(variant)}; known: {known}", named=False)
    shipped = _at_scale(read_yaml(CONFIG_DIR / "mc.yaml"), scale, "MC")
    data = deep_merge(deep_merge(shipped, panel or {}), MC_VARIANTS[variant])
    for _, fields in given:
        data = deep_merge(data, fields)
    data = apply_overrides(data, [*overrides, *([f"train.seed={seed}"] if seed is not None else [])])
    layers = [(shown(CONFIG_DIR / "mc.yaml"), shipped), ("the panel", panel or {}), *given, *override_layers(overrides)]
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
