"""What one evaluation is asked (:class:`EvalRequest`): the one argument every benchmark kind's evaluator takes
besides the model and its tokenizer (:class:`margincal.evaluation.evaluators.Evaluator`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from margincal.config.settings import BenchmarkSpec, EvalSettings
from margincal.data.records import QARecord


class EvalRequest(NamedTuple):
    """``splits`` (role → records: any subset of the roles ``spec`` reads) scored as ``spec`` says with ``settings``.
    ``reference`` is θ_ref's result of the same evaluator (its m(D_f) gives Δ, its truth ratios forget quality, its
    min-k AUC privleak); ``parts`` restricts the work to the forget role's ``diagnosis`` and/or ``rouge`` (the
    attack stage's reads). A named tuple: an evaluator unpacks it as ``spec, splits, settings, reference, parts``."""

    spec: BenchmarkSpec
    splits: dict[str, Sequence[QARecord]]
    settings: EvalSettings
    reference: dict | None = None
    parts: Sequence[str] | None = None

    @property
    def ref_summary(self) -> dict:
        """θ_ref's summary metrics (empty without a reference)."""
        return (self.reference or {}).get("summary", {})
