"""Training curves where researchers look for them, as Hugging Face Trainer's ``report_to`` writes them.

The one training loop (:func:`margincal.training.loop.train`) hands every step's scalars to :func:`emit`: the loss and
its terms, the gradient norm, the learning rate, and Δ and the monitors at the steps where they run. Inside
:func:`recording` (the graph runner opens one around every stage it runs, the single-stage commands around theirs)
the scalars go to the reporters of ``report_to``; outside it they go nowhere.

``report_to``: ``"none"`` (the default) or ``"tensorboard"`` (``torch.utils.tensorboard``, the optional
``tensorboard`` package: ``pip install 'margincal[tensorboard]'``). Event files are written under
``<stage directory>/tensorboard``, so ``tensorboard --logdir <store or --out>`` shows every stage's curves, tagged
``<run>/<scalar>`` with the run named by the training loop's description (a second run of one description inside a
stage, such as a relearn attack's second draw, is ``<run>#2``). A stage that trains nothing writes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

from margincal.core.errors import InputError, MissingPackageError, require

REPORTERS = ("none", "tensorboard")
DEFAULT_REPORT_TO = "none"  # every training command's and function's reporter unless told: no curves written
INSTALL = "pip install 'margincal[tensorboard]'"


def check_report_to(report_to: str, where: str = "report_to") -> str:
    """``report_to`` when it is a reporter margincal has and its package is installed (checked before any compute)."""
    if report_to not in REPORTERS:
        raise InputError(f"{where} {report_to!r}: use one of {', '.join(REPORTERS)}")
    if report_to == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise MissingPackageError(
            f"{where} tensorboard needs the package tensorboard, which is not installed: {INSTALL}"
        )
    return report_to


class _Recorder:
    """The reporters of one stage: a TensorBoard writer under ``directory``, opened at the stage's first row."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.writer, self.runs = directory, None, {}

    def begin(self, run: str) -> str:
        self.runs[run] = self.runs.get(run, 0) + 1
        return run if self.runs[run] == 1 else f"{run}#{self.runs[run]}"

    def row(self, run: str, step: int, scalars: Mapping[str, object]) -> None:
        if self.writer is None:
            tensorboard = require("torch.utils.tensorboard", "report_to tensorboard", INSTALL)
            self.writer = tensorboard.SummaryWriter(log_dir=str(self.directory / "tensorboard"))
        for name, value in scalars.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(f"{run}/{name}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


_CURRENT: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("margincal_curves", default=None)


@contextlib.contextmanager
def recording(directory: str | Path, report_to: str = "none") -> Iterator[None]:
    """Send the training loop's rows to ``report_to``'s reporters under ``directory`` while the block runs; the
    event files are closed (complete) when it ends, before the directory is published."""
    if check_report_to(report_to) == "none":
        yield
        return
    recorder = _Recorder(Path(directory))
    token = _CURRENT.set(recorder)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        recorder.close()


def begin(run: str) -> str:
    """The tag prefix of a training run named ``run`` in the current recording (``run``, then ``run#2``, ...)."""
    recorder = _CURRENT.get()
    return run if recorder is None else recorder.begin(run)


def emit(run: str, step: int, scalars: Mapping[str, object]) -> None:
    """Record ``scalars`` (numbers only; a string or a non-finite value is skipped) at ``step`` of ``run``."""
    recorder = _CURRENT.get()
    if recorder is not None:
        recorder.row(run, step, scalars)
