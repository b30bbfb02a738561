"""One evaluator per benchmark kind, chosen by the benchmark spec: ``tofu`` (TOFU and the mini benchmark), ``muse``
(MUSE-News, MUSE-Books) and ``wmdp`` (four-choice questions). Every evaluate stage, the attack stage and ``margincal
diagnose`` go through :func:`evaluate`, so numbers taken before and after an attack are comparable by construction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from margincal.config.settings import BenchmarkSpec, EvalSettings
from margincal.core.registry import Registry
from margincal.data.records import QARecord
from margincal.evaluation.mmlu import mmlu_accuracy
from margincal.evaluation.muse import evaluate_muse
from margincal.evaluation.request import EvalRequest
from margincal.evaluation.tofu import evaluate_tofu
from margincal.evaluation.wmdp import evaluate_wmdp
from margincal.results.metric_table import MMLU, VALUES


class Evaluator(Protocol):
    """What every benchmark kind's evaluator is: ``model`` (its ``tokenizer``) evaluated as ``request`` asks
    (:class:`~margincal.evaluation.request.EvalRequest`). Returns ``{"splits": {role: {...}}, "summary": {metric:
    value}}`` with the keys and order of its metric table rows."""

    def __call__(self, model, tokenizer, request: EvalRequest) -> dict: ...


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
    """Every metric of ``spec``'s evaluator (:class:`Evaluator`; the arguments are those of
    :class:`~margincal.evaluation.request.EvalRequest`), plus MMLU when ``settings.mmlu`` asks for it on a full
    evaluation."""
    request = EvalRequest(spec, splits, settings, reference, parts)
    result = EVALUATORS.lookup(spec.kind)(model, tokenizer, request)
    if settings.mmlu and parts is None:
        result["summary"][MMLU.name], result["mmlu"] = mmlu_accuracy(model, tokenizer, settings.mmlu)
    return result
