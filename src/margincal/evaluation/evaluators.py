"""One evaluator per benchmark kind, chosen by the benchmark spec: ``tofu`` (TOFU and the mini benchmark), ``muse``
(MUSE-News, MUSE-Books) and ``wmdp`` (four-choice questions). Every evaluate stage, the attack stage and ``margincal
diagnose`` go through :func:`evaluate`, so numbers taken before and after an attack are comparable by construction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from margincal.config import BenchmarkSpec, EvalSettings
from margincal.data.records import QARecord
from margincal.evaluation.metric_table import MMLU, VALUES
from margincal.evaluation.mmlu import mmlu_accuracy
from margincal.evaluation.muse import evaluate_muse
from margincal.evaluation.tofu import evaluate_tofu
from margincal.evaluation.wmdp import evaluate_wmdp
from margincal.registry import Registry


class Evaluator(Protocol):
    """What every benchmark kind's evaluator is: ``model`` (its ``tokenizer``) evaluated on ``splits`` (role →
    records; the roles ``spec`` reads, any subset) with ``settings``; ``reference`` is θ_ref's result of the same
    evaluator (its m(D_f) gives Δ, its truth ratios forget quality, its min-k AUC privleak); ``parts`` restricts the
    work to the forget role's ``diagnosis`` and/or ``rouge`` (the attack stage's reads). Returns ``{"splits": {role:
    {...}}, "summary": {metric: value}}`` with the keys and order of its metric table rows."""

    def __call__(
        self,
        model,
        tokenizer,
        spec: BenchmarkSpec,
        splits: dict[str, Sequence[QARecord]],
        settings: EvalSettings,
        reference: dict | None = None,
        parts: Sequence[str] | None = None,
    ) -> dict: ...


EVALUATORS: Registry[Evaluator] = Registry(  # a benchmark kind → its evaluator
    "evaluator", "evaluators", entries={"tofu": evaluate_tofu, "muse": evaluate_muse, "wmdp": evaluate_wmdp}
).freeze()
VALUES.freeze()  # the evaluators above import every module defining a metric table function


def evaluate(
    model,
    tokenizer,
    spec: BenchmarkSpec,
    splits: dict[str, Sequence[QARecord]],
    settings: EvalSettings,
    reference: dict | None = None,
    parts: Sequence[str] | None = None,
) -> dict:
    """Every metric of ``spec``'s evaluator (:class:`Evaluator`, the arguments as there), plus MMLU when
    ``settings.mmlu`` asks for it on a full evaluation."""
    result = EVALUATORS.lookup(spec.kind)(model, tokenizer, spec, splits, settings, reference, parts)
    if settings.mmlu and parts is None:
        result["summary"][MMLU.name], result["mmlu"] = mmlu_accuracy(model, tokenizer, settings.mmlu)
    return result
