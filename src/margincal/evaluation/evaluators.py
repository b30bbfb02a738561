"""One evaluator per benchmark kind, chosen by the benchmark spec: ``tofu`` (TOFU and the mini benchmark), ``muse``
(MUSE-News, MUSE-Books) and ``wmdp`` (four-choice questions). Every evaluate stage, the attack stage and ``margincal
diagnose`` go through :func:`evaluate`, so numbers taken before and after an attack are comparable by construction."""

from __future__ import annotations

from collections.abc import Sequence

from margincal.config import BenchmarkSpec, EvalSettings
from margincal.data.records import QARecord
from margincal.evaluation.metric_table import MMLU
from margincal.evaluation.mmlu import mmlu_accuracy
from margincal.evaluation.muse import evaluate_muse
from margincal.evaluation.tofu import evaluate_tofu
from margincal.evaluation.wmdp import evaluate_wmdp
from margincal.registry import Registry

EVALUATORS = Registry(  # a benchmark kind → its evaluator
    "evaluator", "evaluators", entries={"tofu": evaluate_tofu, "muse": evaluate_muse, "wmdp": evaluate_wmdp}
)


def evaluate(
    model,
    tokenizer,
    spec: BenchmarkSpec,
    splits: dict[str, Sequence[QARecord]],
    settings: EvalSettings,
    reference: dict | None = None,
    parts: Sequence[str] | None = None,
) -> dict:
    """Every metric of ``spec``'s evaluator (or only ``parts`` of the forget role: ``diagnosis``, ``rouge``), plus
    MMLU when ``settings.mmlu`` asks for it on a full evaluation; ``reference`` is θ_ref's result."""
    result = EVALUATORS.lookup(spec.kind)(model, tokenizer, spec, splits, settings, reference, parts)
    if settings.mmlu and parts is None:
        result["summary"][MMLU.name], result["mmlu"] = mmlu_accuracy(model, tokenizer, settings.mmlu)
    return result
