"""MC and the margin diagnostic inside a Hugging Face ``Trainer`` (issue 28).

* :class:`MCMixin` (or :func:`with_mc`) adds MC to any ``Trainer`` subclass whose ``compute_loss`` is an unlearning
  method's loss on ``{"forget", "retain", ...}`` batches (open-unlearning's contract): the polish loss of Eq. 6,

      L(θ) = L_native(θ) + L_forget(θ) + λ_KL · L_KL(θ),

  with L_native the subclass's own ``compute_loss`` (kept running: the paper's plug-in definition), L_forget the
  hinge at an anchor table's per-token margins and L_KL the probe KL to a frozen anchor model, assembled by
  :func:`margincal.mc.loss.mc_loss` (the terms and the sum margincal's own polish uses).
* :class:`ForgetRetainDataset` and :class:`ForgetRetainCollator`: nested forget/retain(/probe) batches in the layout
  margincal and open-unlearning share (``input_ids``, ``attention_mask``, ``labels`` with −100 outside the answer,
  ``index``); a nested batch needs ``TrainingArguments(remove_unused_columns=False)``.
* :class:`MonitorCallback`: margincal's held-out monitors (:class:`margincal.training.monitors.Monitors`: Δ, membership
  AUCs, the utility proxy) every N steps, through :class:`margincal.training.controller.MonitorHook` (an optional Δ
  target stop and best-checkpoint selection), logged through the Trainer; works with any ``Trainer``.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Sequence

import torch
from transformers import Trainer, TrainerCallback

from margincal.config.settings import BenchmarkSpec, MCConfig, MonitorConfig
from margincal.config.typed import ConfigError, given
from margincal.core.errors import InputError
from margincal.data.records import EncodedQA, QARecord, collate, encode_qa
from margincal.data.tofu import load_qa_json
from margincal.mc.loss import AnchorTable, batch_stats, forget_hinge, mc_loss, probe_kl
from margincal.model.loading import load_model
from margincal.training.controller import MonitorHook, delta_stop
from margincal.training.monitors import Monitors, monitor_samples

NESTED_HINT = (
    "set TrainingArguments(remove_unused_columns=False): with the default the Trainer strips the nested "
    "forget/retain keys and fails with 'The batch received was empty'"
)


class ForgetRetainDataset(torch.utils.data.Dataset):
    """Item ``i``: forget example ``i`` with a retain (and probe) example drawn by a generator seeded by
    ``(seed, i)``, so an epoch visits every forget record once and the draws do not depend on the order of access
    (open-unlearning's ``ForgetRetainDataset`` anchors on the forget set the same way)."""

    def __init__(
        self,
        forget: Sequence[EncodedQA],
        retain: Sequence[EncodedQA] = (),
        probe: Sequence[EncodedQA] = (),
        seed: int = 0,
    ):
        if not forget:
            raise InputError("ForgetRetainDataset: the forget set is empty")
        self.streams = {"forget": list(forget), "retain": list(retain), "probe": list(probe)}
        self.seed = seed

    @classmethod
    def from_records(
        cls,
        tokenizer,
        forget: Sequence[QARecord],
        retain: Sequence[QARecord] = (),
        probe: Sequence[QARecord] = (),
        max_length: int = 512,
        seed: int = 0,
    ) -> ForgetRetainDataset:
        """Encode records with the tokenizer's prompt template (:func:`margincal.data.records.encode_qa`, the
        encoding ``margincal anchors`` scores); probe records longer than ``max_length`` are skipped."""

        def encode(records: Sequence[QARecord], too_long: str = "error") -> list[EncodedQA]:
            return encode_qa(tokenizer, records, max_length, too_long=too_long) if records else []

        return cls(encode(forget), encode(retain), encode(probe, "skip"), seed)

    def __len__(self) -> int:
        return len(self.streams["forget"])

    def __getitem__(self, i: int) -> dict[str, EncodedQA]:
        rng = random.Random(f"{self.seed}:{i}")
        item = {"forget": self.streams["forget"][i]}
        for name in ("retain", "probe"):
            if self.streams[name]:
                item[name] = self.streams[name][rng.randrange(len(self.streams[name]))]
        return item


class ForgetRetainCollator:
    """Collate items of :class:`ForgetRetainDataset` into ``{stream: batch}`` (:func:`margincal.data.records.collate`
    per stream: right-padded ``input_ids``/``attention_mask``, answer-only ``labels``, ``answer_start``,
    ``answer_len`` and ``index``)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, items: Sequence[dict[str, EncodedQA]]) -> dict[str, dict[str, torch.Tensor]]:
        if not items or not isinstance(items[0], dict) or "forget" not in items[0]:
            raise InputError(f"ForgetRetainCollator needs ForgetRetainDataset items; {NESTED_HINT}")
        return {name: collate([item[name] for item in items], self.pad_id) for name in items[0]}


def mc_settings(kappa: float | None, kl_weight: float | None, token_weights: str | None) -> MCConfig:
    """The mixin's ``mc_kappa``, ``mc_kl_weight`` and ``mc_token_weights`` as an
    :class:`~margincal.config.settings.MCConfig`,
    whose defaults fill what is not given (None) and whose checks refuse a bad value in one line naming the
    argument (``mc_kappa=0`` would divide by zero in the hinge): the one set of MC defaults."""
    try:
        return given(MCConfig, kappa=kappa, kl_weight=kl_weight, token_weights=token_weights)
    except ConfigError as err:
        raise InputError(f"MCMixin: mc_{err}") from None


class MCMixin:
    """MC for a ``Trainer`` subclass: put it first, ``class NPOMC(MCMixin, NPOTrainer)``, or use :func:`with_mc`.

    Keyword arguments (the rest go to the wrapped Trainer): ``mc_table`` an :class:`~margincal.mc.loss.AnchorTable`
    or its file (``margincal anchors``; its rows are the forget records' ``index``), ``mc_anchor`` the frozen anchor
    model of the KL probe (θ_ref for reference MC; needed when ``mc_kl_weight`` > 0): a module, a checkpoint path, or
    ``"ref_model"`` for the wrapped Trainer's own ``ref_model`` (after ``mc_native_ref``), ``mc_probe`` a
    TOFU-format file of probe QA records drawn one per step (seeded) when the batches carry no ``probe`` stream
    (open-unlearning's), ``mc_kappa`` κ, ``mc_kl_weight`` λ_KL, ``mc_token_weights``,
    ``mc_check_tokens`` (True: every forget batch's answer tokens must be the table's), ``mc_native_ref`` a
    checkpoint loaded as the wrapped Trainer's ``ref_model``: the native loss's own reference, θ0 for NPO
    (open-unlearning's NPO copies the model it is given, which for a polish is the unlearned one; margincal's polish
    prepares it on θ0). κ, λ_KL and the token weights left out are margincal's frozen MC's, and every value given is
    checked, by :class:`margincal.config.settings.MCConfig` (:func:`mc_settings`); strings make
    the mixin configurable from YAML (open-unlearning's ``method_args``). In eval mode the wrapped loss runs alone.

    The loss is a per-batch mean: the Trainer divides it by the gradient-accumulation steps, and the wrapped
    ``compute_loss`` gets ``num_items_in_batch`` only when its signature has it (open-unlearning's trainers, written
    for transformers 4.45, do not). The terms are logged with the Trainer's ``loss`` as ``mc/native``,
    ``mc/hinge`` and ``mc/kl`` (means since the last log); :attr:`mc_history` keeps every call's values.
    """

    def __init__(
        self,
        *args,
        mc_table: AnchorTable | str,
        mc_anchor: torch.nn.Module | str | None = None,
        mc_probe: str | None = None,
        mc_kappa: float | None = None,
        mc_kl_weight: float | None = None,
        mc_token_weights: str | None = None,
        mc_check_tokens: bool = True,
        mc_native_ref: str | None = None,
        **kwargs,
    ):
        mc = mc_settings(mc_kappa, mc_kl_weight, mc_token_weights)  # checked before the Trainer is built
        mc_kappa, mc_kl_weight, mc_token_weights = mc.kappa, mc.kl_weight, mc.token_weights
        super().__init__(*args, **kwargs)
        if getattr(self.args, "remove_unused_columns", False):
            raise InputError(f"{type(self).__name__}: {NESTED_HINT}")
        if mc_kl_weight > 0 and mc_anchor is None:
            raise InputError("MC's KL probe (mc_kl_weight > 0) needs mc_anchor, the frozen anchor model (θ_ref)")
        if mc_native_ref is not None and not hasattr(self, "ref_model"):
            raise InputError(f"mc_native_ref: {type(self).__name__} has no ref_model to replace")
        tokenizer = getattr(self, "processing_class", None) or getattr(self, "tokenizer", None)
        if not isinstance(mc_table, AnchorTable):
            mc_table = AnchorTable.load(mc_table, tokenizer)
        self.mc_probe = self._probe_examples(mc_probe, tokenizer) if mc_probe is not None else None
        if mc_native_ref is not None:  # every input checked: now the models load
            self.ref_model = load_model(mc_native_ref, device=str(self.args.device)).eval().requires_grad_(False)
        if mc_anchor == "ref_model":
            mc_anchor = self.ref_model
        elif isinstance(mc_anchor, str):
            mc_anchor = load_model(mc_anchor, device=str(self.args.device))
        self._mc_pad = tokenizer.pad_token_id if tokenizer is not None else 0
        self.mc_table, self.mc_anchor, self.mc_kappa = mc_table, mc_anchor, mc_kappa
        self.mc_kl_weight, self.mc_token_weights, self.mc_check_tokens = mc_kl_weight, mc_token_weights, mc_check_tokens
        if mc_anchor is not None:
            mc_anchor.eval().requires_grad_(False)
        self.loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides by the accumulation steps
        self.mc_history: list[dict[str, float]] = []
        self._mc_pending: list[dict[str, float]] = []
        self._native_items = "num_items_in_batch" in inspect.signature(super().compute_loss).parameters

    @staticmethod
    def _probe_examples(path: str, tokenizer) -> list[EncodedQA]:
        if tokenizer is None:
            raise InputError("mc_probe needs the Trainer's tokenizer (processing_class) to encode the probe records")
        examples = encode_qa(tokenizer, load_qa_json(path), tokenizer.model_max_length, too_long="skip")
        if not examples:
            raise InputError(f"mc_probe {path}: no probe record fits the tokenizer's context")
        return examples

    def _probe_batch(self) -> dict[str, torch.Tensor]:
        """One probe example per optimizer step, drawn by a generator seeded by (args.seed, step)."""
        step = self.state.global_step if getattr(self, "state", None) is not None else 0
        pick = random.Random(f"{self.args.seed}:{step}").randrange(len(self.mc_probe))
        return collate([self.mc_probe[pick]], self._mc_pad)

    def mc_terms(self, model: torch.nn.Module, inputs: dict) -> dict[str, torch.Tensor]:
        """The hinge on ``inputs["forget"]`` and, with an anchor, the KL on ``inputs["probe"]``."""
        if "forget" not in inputs:
            raise InputError(f"MC needs nested batches with a 'forget' stream, got {sorted(inputs)}; {NESTED_HINT}")
        stats = batch_stats(model, inputs["forget"])
        if self.mc_check_tokens:
            self.mc_table.check(stats)
        terms = {"hinge": forget_hinge(stats, self.mc_table.tables, self.mc_kappa, self.mc_token_weights)}
        if self.mc_kl_weight > 0:
            if "probe" in inputs:
                probe = inputs["probe"]
            elif self.mc_probe is not None:
                probe = self._probe_batch()
            else:
                raise InputError(
                    "MC's KL probe needs a 'probe' stream in the batch (ForgetRetainDataset probe=...) "
                    "or mc_probe, a file of probe records"
                )
            terms["kl"] = probe_kl(model, self.mc_anchor, probe)
        return terms

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        extra = {"num_items_in_batch": num_items_in_batch} if self._native_items else {}
        if not model.training:  # evaluation: the wrapped Trainer's own loss
            return super().compute_loss(model, inputs, return_outputs=return_outputs, **extra)
        native = super().compute_loss(model, inputs, return_outputs=False, **extra)
        terms = self.mc_terms(model, inputs)
        loss = mc_loss(native, terms, self.mc_kl_weight)
        row = {"loss": loss.item(), "native": native.item(), **{k: v.item() for k, v in terms.items()}}
        self.mc_history.append(row)
        self._mc_pending.append(row)
        return (loss, None) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs and self._mc_pending:
            for key in ("native", "hinge", "kl"):
                values = [r[key] for r in self._mc_pending if key in r]
                if values:
                    logs[f"mc/{key}"] = sum(values) / len(values)
            self._mc_pending = []
        super().log(logs, *args, **kwargs)


def with_mc(trainer_class: type[Trainer]) -> type[Trainer]:
    """``trainer_class`` with MC added (:class:`MCMixin` first in its bases), named ``<Name>MC``."""
    return type(f"{trainer_class.__name__}MC", (MCMixin, trainer_class), {})


def monitors_for(
    tokenizer,
    forget: Sequence[QARecord],
    holdout: Sequence[QARecord],
    utility: Sequence[QARecord],
    m_ref: float | None = None,
    reference: torch.nn.Module | None = None,
    config: MonitorConfig | None = None,
    seed: int = 0,
    max_length: int = 512,
    aggregate: str = "mean",
    pool: Sequence[EncodedQA] = (),
) -> Monitors:
    """margincal's monitors (:mod:`margincal.training.monitors`) on QA records: Δ on ``forget`` records (less those
    whose encoding is in the training ``pool``) against ``m_ref`` (θ_ref's m(D_f), e.g. ``margincal diagnose``), the
    membership AUCs of forget vs ``holdout`` (privleak against ``reference``'s AUCs when given) and the utility proxy on
    ``utility`` records the run does not train on."""
    config = config or MonitorConfig()
    spec = BenchmarkSpec("records", "tofu", {}, {}, aggregate=aggregate, max_length=max_length)
    splits = {"forget": list(forget), "holdout": list(holdout), "utility": list(utility)}
    samples = monitor_samples(tokenizer, spec, splits, config, seed, m_ref, pool)
    return Monitors(samples, config.detectors, reference)


class MonitorCallback(TrainerCallback):
    """margincal's monitors in any ``Trainer``: at the start and every ``every`` optimizer steps (and the last),
    ``monitors`` run on the Trainer's model (``no_grad``, eval mode) and the row (``delta``, ``auc/<detector>``,
    ``privleak/<detector>``, ``utility``) is logged through ``trainer.log`` (TensorBoard, W&B, ... see it) with the
    prefix ``monitor/``; without ``trainer`` it goes to ``state.log_history``. ``stop_delta`` stops training at the
    first pass with Δ ≤ it; ``select`` (``last``, ``delta``, ``privleak``, ``controlled``:
    :data:`margincal.training.controller.CRITERIA`) loads the best monitored step's trainable parameters into the model
    when training ends. :attr:`trace` holds the rows, :attr:`selected` the released step.

    Every process runs the monitors on its own copy of the model (no collective, so nothing waits on rank 0, and
    every rank takes the same stop decision); under sharded training (FSDP, ZeRO-3) the forward passes need every
    rank anyway. Only a single process was tested.
    """

    def __init__(
        self,
        monitors: Monitors,
        every: int = 10,
        stop_delta: float | None = None,
        select: str = "last",
        trainer: Trainer | None = None,
    ):
        self.monitors, self.every, self.select, self.trainer = monitors, every, select, trainer
        self.control = None if stop_delta is None else delta_stop(stop_delta)
        if stop_delta is not None and monitors.samples.m_ref is None:
            raise InputError("MonitorCallback(stop_delta=...) needs the monitors' m_ref (θ_ref's margin)")
        self.hook: MonitorHook | None = None
        self.selected: int | None = None

    @property
    def trace(self) -> list[dict]:
        return self.hook.trace if self.hook is not None else []

    def _pass(self, step: int, model, state, final: bool = False) -> bool:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = self.hook(step, model, final=final)
        finally:
            model.train(was_training)
        if out is None:
            return False
        row = {f"monitor/{k}": v for k, v in self.hook.trace[-1].items() if isinstance(v, int | float) and k != "step"}
        if self.trainer is not None:
            self.trainer.log(row)
        else:
            state.log_history.append({**row, "step": step})
        return bool(out.get("stop"))

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.hook = MonitorHook(self.monitors, self.every, state.max_steps, self.select, self.control)
        self._pass(0, model, state)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self._pass(state.global_step, model, state):
            control.should_training_stop = True

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not self.trace or self.trace[-1]["step"] != state.global_step:
            self._pass(state.global_step, model, state, final=True)
        self.selected = self.hook.restore(model)


def watch(trainer: Trainer, monitors: Monitors, **options) -> MonitorCallback:
    """Add a :class:`MonitorCallback` (``options``: ``every``, ``stop_delta``, ``select``) to ``trainer``, logging
    through it; returns the callback (its :attr:`~MonitorCallback.trace` and :attr:`~MonitorCallback.selected`)."""
    callback = MonitorCallback(monitors, trainer=trainer, **options)
    trainer.add_callback(callback)
    return callback
