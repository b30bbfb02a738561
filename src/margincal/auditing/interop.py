"""open-unlearning interop: its retain model's evaluation log as θ_ref, and a summary in its format.

open-unlearning (``src/evals/base.py``, commit d3d7cf9) writes ``TOFU_EVAL.json``: metric name → ``{"agg_value":
…, "value_by_index": {"<i>": {…}}}``. Its ``forget_quality`` is the KS test of the unlearned model's per-sample
forget truth ratios against the retain model's (``forget_truth_ratio.value_by_index[i].score``, TOFU's
perturbed/correct ratio, the one margincal computes) and its ``privleak`` reads the retain model's
``mia_min_k.agg_value``; those two are what an audit takes from the log instead of evaluating θ_ref. It has no
margin, so a card read against a log has no Δ, certificate or floor. ``TOFU_SUMMARY.json`` is its metric name →
``agg_value`` file (``Evaluator.summarize``). Either, or a JSON of metric → value, is a claim ``audit --claimed``
checks against the audit's own evaluation (:func:`read_claimed`).
"""

from __future__ import annotations

from pathlib import Path

from margincal.core.artifacts import digest
from margincal.core.errors import InputError
from margincal.core.inputs import read_json
from margincal.results.metric_table import MIA_AUC, MU_KEYS

# margincal summary key -> open-unlearning metric name (configs/eval/tofu_metrics/*.yaml, muse_metrics/*.yaml)
SUMMARY_NAMES = {
    "forget_quality": "forget_quality",
    "forget_truth_ratio": "forget_truth_ratio",
    "forget_Q_A_Prob": "forget_Q_A_Prob",
    "forget_Q_A_ROUGE": "forget_Q_A_ROUGE",
    "model_utility": "model_utility",
    "privleak": "privleak",
    "exact_memorization": "exact_memorization",
    "extraction_strength": "extraction_strength",
    **{name: name for name in MU_KEYS},  # model utility's nine inputs: the same names in both
    **{metric.name: f"mia_{detector}" for detector, metric in MIA_AUC.items()},
    # MUSE (configs/eval/muse_metrics/*.yaml: knowmem and verbmem ROUGE are rougeL_f1): MUSE_SUMMARY.json
    "forget_knowmem_rouge_l_f1": "forget_knowmem_ROUGE",
    "retain_knowmem_rouge_l_f1": "retain_knowmem_ROUGE",
    "forget_verbmem_rouge_l_f1": "forget_verbmem_ROUGE",
}


def read_retain_logs(path: str | Path, forget: list) -> dict:
    """θ_ref's reference result from open-unlearning's retain-model ``TOFU_EVAL.json``: the per-sample forget truth
    ratios (forget_quality) and, when logged, the min-k AUC (privleak). A log holds no questions, only values by
    index (open-unlearning's own contract), so it is matched to the audited ``forget`` records by their number and
    order, and then stands for a result on them (their digest). Stops on a file that is not such a log or was computed
    on a forget split of another size."""
    from margincal.evaluation.tofu import records_digest  # lazy: torch

    n_forget = len(forget)
    path = Path(path)
    logs = read_json(path, "--ref-logs")  # strict: a NaN or infinite value stops, naming its key
    ratios = logs.get("forget_truth_ratio") if isinstance(logs, dict) else None
    by_index = ratios.get("value_by_index") if isinstance(ratios, dict) else None
    if not isinstance(by_index, dict) or not by_index:
        raise InputError(
            f"--ref-logs {path} has no forget_truth_ratio.value_by_index: give the retain model's "
            "TOFU_EVAL.json that open-unlearning's eval wrote (not its TOFU_SUMMARY.json)"
        )
    try:
        truth_ratios = [float(by_index[i]["score"]) for i in sorted(by_index, key=int)]
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"--ref-logs {path}: forget_truth_ratio.value_by_index is malformed ({err!r})") from None
    if len(truth_ratios) != n_forget:
        raise InputError(
            f"--ref-logs {path} holds {len(truth_ratios)} forget truth ratios; the forget split audited "
            f"has {n_forget} samples: the logs were computed on another forget split"
        )
    summary = {}
    min_k = logs.get("mia_min_k")
    if isinstance(min_k, dict) and isinstance(min_k.get("agg_value"), int | float):
        summary[MIA_AUC["min_k"].name] = float(min_k["agg_value"])
    forget_result = {"truth_ratios": truth_ratios, "digest": records_digest(forget)}
    reference = {"summary": summary, "splits": {"forget": forget_result}}
    return {"path": str(path), "digest": digest(reference), "reference": reference}


def summary(result_summary: dict) -> dict:
    """A margincal evaluation summary in open-unlearning's ``TOFU_SUMMARY.json`` names (the metrics both have)."""
    return {ou: result_summary[ours] for ours, ou in SUMMARY_NAMES.items() if result_summary.get(ours) is not None}


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_claimed(path: str | Path) -> dict:
    """Documented numbers of a checkpoint (``audit --claimed``): open-unlearning's ``TOFU_SUMMARY.json`` (metric →
    value), its ``TOFU_EVAL.json`` (metric → ``{"agg_value": …}``) or a JSON of metric → value or ``{"value": …,
    "tolerance": …}``, with an optional top-level ``"tolerance"`` for all. Names are open-unlearning's or margincal's
    (:data:`SUMMARY_NAMES`); a name the audit does not compute is listed in ``not_compared``, never dropped
    silently. Stops, naming the problem, on anything else: not an object, a value that is not a finite number, a
    negative tolerance, or no metric the audit computes."""
    path = Path(path)
    data = read_json(path, "--claimed")  # strict: a NaN or infinite value stops, naming its key
    if not isinstance(data, dict) or not data:
        raise InputError(f"--claimed {path}: expected a JSON object of metric → value (e.g. a TOFU_SUMMARY.json)")
    known = {**{ou: ours for ours, ou in SUMMARY_NAMES.items()}, **{ours: ours for ours in SUMMARY_NAMES}}

    def tolerance_of(value, where: str):
        if value is not None and (not _number(value) or value < 0):
            raise InputError(f"--claimed {path}: {where} must be a number ≥ 0, got {value!r}")
        return None if value is None else float(value)

    default = tolerance_of(data.get("tolerance"), "tolerance")
    metrics, not_compared = {}, []
    for name, entry in data.items():
        if name == "tolerance":
            continue
        value, tolerance = entry, default
        if isinstance(entry, dict):
            value = entry.get("agg_value", entry.get("value"))
            tolerance = tolerance_of(entry.get("tolerance", default), f"{name}.tolerance")
        if name not in known:
            not_compared.append(name)
            continue
        if not _number(value):
            raise InputError(f"--claimed {path}: {name} is {value!r}, not a number")
        metrics[known[name]] = {"as": name, "claimed": float(value), "tolerance": tolerance}
    if not metrics:
        raise InputError(
            f"--claimed {path}: none of its metrics is one the audit computes; give any of "
            f"{', '.join(sorted(SUMMARY_NAMES.values()))}"
        )
    return {"path": str(path), "digest": digest(data), "metrics": metrics, "not_compared": sorted(not_compared)}
