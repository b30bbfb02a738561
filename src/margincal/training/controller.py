"""The training loop's monitor hook: the monitors' trace, controlled MC's rules and best-checkpoint selection.

Controlled MC (:class:`margincal.config.settings.ControlConfig`, rules fixed before any attack was run):

* dual ascent on λ_KL at each monitor pass: λ ← clip(λ + η · (u − u₀ − b), λ₀, λ_max), u the utility proxy
  (held-out answer NLL, :mod:`margincal.training.monitors`), u₀ its value at the start, b the budget;
* MIA stop: the first pass where AUC_d ≤ AUC_ref,d for every monitored detector d;
* Δ target: the first pass where Δ ≤ target.

Selection criteria (:data:`CRITERIA`) map a monitor row to a sort key, or None when the row is not eligible; the
released checkpoint is the eligible monitored step (the start included) with the smallest key, the earliest on
ties. The hook keeps a CPU copy of the trainable parameters at the best step so far and restores it at the end.
Nothing here reads a relearn result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from margincal.config.settings import ControlConfig
from margincal.core.errors import InputError

Key = tuple[float, ...] | None


@dataclasses.dataclass
class Multiplier:
    """A loss weight the objective reads at every step and the controller may move (λ_KL)."""

    value: float


def dual_ascent(weight: float, utility: float, start: float, control: ControlConfig, floor: float) -> float:
    """λ + η · (u − u₀ − b), clipped to [floor, λ_max]: up while the utility proxy is over budget, down otherwise."""
    step = control.dual_lr * (utility - start - control.budget)
    return min(control.kl_max, max(floor, weight + step))


def delta_stop(target: float) -> ControlConfig:
    """The Δ-stop rule alone (the polish's ``stop_delta``, the Trainer callback's ``stop_delta``): stop at the first
    pass where Δ ≤ ``target``; no MIA stop, and no dual ascent (the hook is given no λ to move)."""
    return ControlConfig(mia_stop=False, delta_target=target, select="last")


def mia_reached(row: dict, reference: dict[str, float]) -> bool:
    """Every monitored detector's AUC is at or below θ_ref's on the same samples (privleak ≥ 0 on each)."""
    return all(row[f"auc/{d}"] <= ref for d, ref in reference.items())


def _delta(row: dict, context: dict) -> Key:
    """``delta``: closest to θ_ref's margin, |Δ|."""
    return (abs(row["delta"]),)


def _privleak(row: dict, context: dict) -> Key:
    """``privleak``: the membership signal closest to θ_ref's, max_d |privleak_d|."""
    return (max(abs(v) for k, v in row.items() if k.startswith("privleak/")),)


def _controlled(row: dict, context: dict) -> Key:
    """``controlled``: within the utility budget (u ≤ u₀ + b), the lowest max(Δ, target) (no credit for
    overshooting the target)."""
    control: ControlConfig = context["control"]
    if row["utility"] > context["start_utility"] + control.budget:
        return None
    target = control.delta_target if control.delta_target is not None else float("-inf")
    return (max(row["delta"], target),)


CRITERIA: dict[str, Callable[[dict, dict], Key]] = {
    "delta": _delta,
    "privleak": _privleak,
    "controlled": _controlled,
}


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


class MonitorHook:
    """The training-loop hook (``train(..., hook_at_start=True)``): runs ``monitors`` at step 0 and at every
    ``every``-th step (and the last), appends the row to :attr:`trace`, applies ``control`` (moving ``kl``) and
    tracks the best step by ``select`` (``last``: no selection). ``reference_auc`` (θ_ref's membership AUCs) defaults
    to the monitors' own (:attr:`margincal.training.monitors.Monitors.reference_auc`)."""

    def __init__(
        self,
        monitors: Callable[[torch.nn.Module], dict],
        every: int,
        total_steps: int,
        select: str = "last",
        control: ControlConfig | None = None,
        kl: Multiplier | None = None,
        reference_auc: dict[str, float] | None = None,
    ):
        if select != "last" and select not in CRITERIA:
            raise InputError(f"unknown selection criterion {select!r}; use last or one of {', '.join(CRITERIA)}")
        reference_auc = reference_auc if reference_auc is not None else getattr(monitors, "reference_auc", None)
        if control is not None and control.mia_stop and reference_auc is None:
            raise InputError("controlled MC's MIA stop needs θ_ref's membership AUCs (a reference model)")
        samples = getattr(monitors, "samples", None)
        if control is not None and control.delta_target is not None and samples is not None and samples.m_ref is None:
            raise InputError("a Δ target (stop_delta, control.delta_target) needs the reference margin m_ref")
        self.monitors, self.every, self.total = monitors, every, total_steps
        self.select, self.control, self.kl, self.reference_auc = select, control, kl, reference_auc
        self.floor = kl.value if kl is not None else 0.0
        self.trace: list[dict] = []
        self.best: tuple[Key, int, dict[str, torch.Tensor]] | None = None
        self._kl: list[float] = []

    def observe(self, objective: Callable) -> Callable:
        """``objective`` recording the probe KL its loss computes (the ``kl`` log, KL(p_anc ‖ p_θ) per answer token
        on the step's probe batch); each pass writes their mean since the previous pass as ``probe_kl``, so the probe
        KL is monitored without a forward pass of its own."""

        def observed(model, batch):
            loss, logs = objective(model, batch)
            if "kl" in logs:
                self._kl.append(logs["kl"])
            return loss, logs

        return observed

    def __call__(self, step: int, model: torch.nn.Module, final: bool = False) -> dict | None:
        if not final and step and step % self.every and step != self.total:
            return None
        row = {"step": step, **self.monitors(model)}
        if self._kl:
            row["probe_kl"], self._kl = sum(self._kl) / len(self._kl), []
        context = {"control": self.control, "start_utility": (self.trace[0] if self.trace else row).get("utility")}
        stop = False
        if self.control is not None:
            if self.kl is not None:
                row["kl_weight"] = self.kl.value  # the weight the steps up to here trained with
                self.kl.value = dual_ascent(
                    self.kl.value, row["utility"], context["start_utility"], self.control, self.floor
                )
            if self.control.mia_stop and step and mia_reached(row, self.reference_auc):
                row["stop_reason"], stop = "mia", True
            target = self.control.delta_target
            if target is not None and step and row["delta"] <= target:
                row["stop_reason"], stop = "delta", True
        self.trace.append(row)
        if self.select != "last":
            key = CRITERIA[self.select](row, context)
            if key is not None and (self.best is None or key < self.best[0]):
                self.best = (key, step, _trainable(model))
        return {"stop": stop, "curves": {k: v for k, v in row.items() if k != "step"}}  # Δ, utility, AUCs: curves

    def finish(self, model: torch.nn.Module, step: int) -> None:
        """After training: monitor the last step ``step`` if no pass saw it (a stop rule ended the run between
        passes), so that it is in the trace and can be selected."""
        if not self.trace or self.trace[-1]["step"] != step:
            model.eval()
            self(step, model, final=True)

    def conclude(self, model: torch.nn.Module, result) -> None:
        """After training (``result`` the loop's :class:`~margincal.training.loop.TrainResult`): the last step
        monitored, the selected step's parameters restored, and the trace, selected step and θ_ref's AUCs put in
        ``result``."""
        self.finish(model, len(result.history))
        result.selected = self.restore(model)
        result.trace, result.reference_auc = self.trace, self.reference_auc

    def restore(self, model: torch.nn.Module) -> int | None:
        """Load the selected step's parameters into ``model``; returns that step (None: ``last``, nothing loaded)."""
        if self.best is None:
            return None
        _, step, params = self.best
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in params:
                    p.copy_(params[name].to(p.device))
        for row in self.trace:
            row["selected"] = row["step"] == step
        return step
