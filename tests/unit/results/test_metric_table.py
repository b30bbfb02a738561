"""The metric table: one declaration per metric, read by the evaluators (JSON keys and their order), the report
(labels, directions, formats, MUSE stand-ins) and `margincal evaluate`'s summary order."""

from dataclasses import replace

import pytest
from conftest import RECORDS

from margincal.config.settings import EvalSettings, resolve_benchmark
from margincal.core.registry import Registry
from margincal.evaluation.evaluators import evaluate
from margincal.reporting.records import AttackResult, RoleResult
from margincal.reporting.rows import column, metrics
from margincal.results import metric_table as T

# what cli.SUMMARY_ORDER listed before the table existed, and metrics.MU_KEYS
OLD_SUMMARY_ORDER = (
    "forget_Q_A_Prob",
    "forget_Q_A_ROUGE",
    "exact_memorization",
    "extraction_strength",
    "F_agg",
    "forget_truth_ratio",
    "forget_quality",
    "model_utility",
    "m",
    "delta",
    "mia_loss_auc",
    "mia_min_k_auc",
    "mia_min_k_plus_plus_auc",
    "mia_zlib_auc",
    "mia_gradnorm_auc",
    "mia_agg",
    "mia_advantage",
    "privleak",
    "mmlu_acc",
)
OLD_MU_KEYS = (
    "retain_Q_A_Prob",
    "retain_Q_A_ROUGE",
    "retain_Truth_Ratio",
    "ra_Q_A_Prob_normalised",
    "ra_Q_A_ROUGE",
    "ra_Truth_Ratio",
    "wf_Q_A_Prob_normalised",
    "wf_Q_A_ROUGE",
    "wf_Truth_Ratio",
)
# evaluate_tofu's JSON keys, in the order it wrote them before the table (store records read these)
TOFU_SUMMARY = [
    "forget_Q_A_Prob",
    "forget_Q_A_ROUGE",
    "exact_memorization",
    "extraction_strength",
    "m",
    "log_odds",
    "F_agg",
    "delta",
    "certified",
    "forget_truth_ratio",
    "forget_quality",
    *OLD_MU_KEYS,
    "model_utility",
    "mia_loss_auc",
    "mia_min_k_auc",
    "mia_min_k_plus_plus_auc",
    "mia_zlib_auc",
    "mia_gradnorm_auc",
    "mia_agg",
    "mia_advantage",
    "privleak",
]
TOFU_SPLITS = {
    "forget": [
        "n",
        "digest",
        "mia_scores",
        "q_a_prob",
        "rouge_l",
        "exact_memorization",
        "extraction_strength",
        "diagnosis",
        "diagnostic_margins",
        "samples",
        "truth_ratios",
    ],
    "holdout": ["n", "digest", "mia_scores"],
    "retain": ["n", "q_a_prob", "rouge_l", "truth_ratio", "samples"],
    "real_authors": ["n", "q_a_prob_normalised", "rouge_l", "truth_ratio", "samples"],
    "world_facts": ["n", "q_a_prob_normalised", "rouge_l", "truth_ratio", "samples"],
}


def with_options(records):
    return [
        replace(
            r,
            paraphrased_answer=r.answer.replace(" was ", " is "),
            perturbed_answers=(r.answer.replace("Ann", "Cid"), r.answer[::-1]),
        )
        for r in records
    ]


def tofu_splits():
    rich = with_options(RECORDS)
    return {
        "forget": rich[:3],
        "holdout": list(RECORDS),
        "retain": rich,
        "real_authors": rich[1:],
        "world_facts": rich[:2],
    }


def test_headline_order_and_mu_inputs_are_the_former_constants():
    headline = [m.name for m in T.HEADLINE]
    assert headline.index("forget_wmdp_acc") == headline.index("forget_quality") + 1  # WMDP's, in the forget group
    assert tuple(name for name in headline if name != "forget_wmdp_acc") == OLD_SUMMARY_ORDER
    assert T.MU_KEYS == OLD_MU_KEYS
    summary = dict.fromkeys(["zeta", *reversed(OLD_SUMMARY_ORDER), "alpha"], 0.0)  # a TOFU summary
    assert T.summary_order(summary) == [*OLD_SUMMARY_ORDER, "alpha", "zeta"]


def test_every_metric_is_declared_once_with_a_direction_format_and_group():
    names = [r.name for rows in T.TABLES.values() for r in rows if isinstance(r, T.Metric)]
    assert set(names) == set(T.METRICS) - {T.MMLU.name}
    shared = {"m": 3, "delta": 3, "mia_loss_auc": 2, "mia_min_k_auc": 2, "privleak": 2}  # TOFU, MUSE (and WMDP)
    for name, tables in shared.items():  # the same row object in each table that has it
        assert sum(r is T.METRICS[name] for rows in T.TABLES.values() for r in rows) == tables
    for metric in T.METRICS.values():
        assert metric.group in T.GROUPS and metric.better in ("higher", "lower", None)
        format(0.5, metric.fmt)
        assert set(metric.inputs) <= set(T.METRICS)
    assert T.detectors(T.MUSE) == ["loss", "min_k"] and T.detectors(T.TOFU) == list(T.MIA_DETECTORS)


def test_fill_skips_unavailable_values_and_keeps_table_order(monkeypatch):
    functions = {
        "read_a": lambda s: s["a"],
        "pair": lambda s: [1, 2],
        "none": lambda s: None,
        "sum_x": lambda v, ref: sum(v.values()) + ref["x"],
    }
    monkeypatch.setattr(T, "VALUES", Registry("metric value", "metric values", entries=functions))
    rows = (
        T.Metric("a", "read_a", ("forget",), "a_split", "lower"),
        T.Field("per_sample", "pair", ("forget",), part="rouge"),
        T.Metric("b", "none", ("forget",)),
        T.Metric("mean", "sum_x", inputs=("a",)),
    )
    split, summary = {}, {}
    T.fill(rows, "forget", {"a": 2.0}, split, summary, {"x": 1.0})
    assert split == {"a_split": 2.0, "per_sample": [1, 2]} and summary == {"a": 2.0}
    T.fill(rows, None, None, split, summary, {"x": 1.0})
    assert list(summary.items()) == [("a", 2.0), ("mean", 3.0)]
    split, summary = {}, {}
    T.fill(rows, "forget", {"a": 2.0}, split, summary, {}, parts=("rouge",))
    assert split == {"per_sample": [1, 2]} and summary == {}
    with pytest.raises(RuntimeError, match="metric value 'unknown' is not registered"):
        T.fill((T.Metric("c", "unknown", ("forget",)),), "forget", {}, {}, {}, {})


def test_read_falls_back_to_an_aggregate_of_the_inputs_then_a_stand_in():
    tofu = {"F_agg": 0.4, "mia_agg": 0.7, "forget_Q_A_ROUGE": 0.3, "mia_loss_auc": 0.1}
    muse = {"forget_knowmem_rouge_l_f1": 0.25, "mia_loss_auc": 0.6, "mia_min_k_auc": 0.8}
    assert T.read("F_agg", tofu) == 0.4 and T.read("mia_agg", tofu) == 0.7
    assert T.read("F_agg", muse) == 0.25 and T.read("forget_Q_A_ROUGE", muse) == 0.25
    assert T.read("mia_agg", muse) == pytest.approx(0.7) and T.read("model_utility", muse) is None
    assert T.read("delta", muse) is None


def test_report_columns_come_from_the_table():
    cols = metrics(["lora_r8@20"], facts=True)
    assert [(c[0], c[2], c[3]) for c in cols] == [
        ("Δ", True, "+.2f"),
        ("F.agg", True, ".3f"),
        ("MIA.agg", True, ".3f"),
        ("MU", False, ".3f"),
        ("K20-LoRA", True, ".3f"),
        ("K20-LoRA facts", True, ".3f"),
    ]
    record = RoleResult(summary={"delta": -0.5}, attacks={"lora_r8@20": AttackResult(rouge_l=0.4, fact_recall=0.2)})
    assert [c[1](record) for c in cols] == [-0.5, None, None, None, 0.4, 0.2]
    assert column("forget_Q_A_ROUGE")[0] == "F-ROUGE"


def test_tofu_writes_the_table_keys_in_the_former_order(tiny_model, tiny_tokenizer):
    spec = replace(resolve_benchmark("tofu"), max_length=64, max_new_tokens=4)
    splits, settings = tofu_splits(), EvalSettings(batch_size=4, generation_batch_size=4)
    first = evaluate(tiny_model, tiny_tokenizer, spec, splits, settings)
    assert "delta" not in first["summary"] and "forget_quality" not in first["summary"]
    result = evaluate(tiny_model, tiny_tokenizer, spec, splits, settings, first)
    assert list(result["summary"]) == TOFU_SUMMARY
    assert {role: list(split) for role, split in result["splits"].items()} == TOFU_SPLITS
    summary = result["summary"]
    assert summary["forget_quality"] == pytest.approx(1.0) and summary["delta"] == pytest.approx(0.0)
    assert summary["privleak"] == pytest.approx(0.0) and summary["certified"] in (True, False)
    forget = ["forget_Q_A_Prob", "forget_Q_A_ROUGE", "exact_memorization", "extraction_strength"]
    assert summary["F_agg"] == pytest.approx(sum(summary[k] for k in forget) / 4)
    aucs = [summary[f"mia_{d}_auc"] for d in T.MIA_DETECTORS]
    assert summary["mia_agg"] == pytest.approx(sum(aucs) / 5)
    assert summary["mia_advantage"] == pytest.approx(sum(abs(a - 0.5) for a in aucs) / 5)
    # parts: only the forget role's diagnosis / greedy answers, computed as in the full evaluation
    parts = evaluate(tiny_model, tiny_tokenizer, spec, splits, settings, first, ("diagnosis", "rouge"))
    assert set(parts["summary"]) == {"forget_Q_A_ROUGE", "m", "log_odds", "delta", "certified"}
    assert set(parts["splits"]) == {"forget"}
    for key in ("rouge_l", "diagnosis", "diagnostic_margins", "samples"):
        assert parts["splits"]["forget"][key] == result["splits"]["forget"][key]
    with pytest.raises(ValueError, match=r"unknown evaluation part\(s\) \['nope'\]"):
        evaluate(tiny_model, tiny_tokenizer, spec, splits, settings, parts=("nope",))


def test_tofu_without_options_skips_truth_ratios_and_mu(tiny_model, tiny_tokenizer):
    spec = replace(resolve_benchmark("tofu"), max_length=64, max_new_tokens=4)
    splits = {"forget": list(RECORDS), "retain": list(RECORDS)}
    result = evaluate(tiny_model, tiny_tokenizer, spec, splits, EvalSettings(batch_size=4, gradnorm=False))
    assert list(result["summary"]) == [
        "forget_Q_A_Prob",
        "forget_Q_A_ROUGE",
        "exact_memorization",
        "extraction_strength",
        "m",
        "log_odds",
        "F_agg",
        "retain_Q_A_Prob",
        "retain_Q_A_ROUGE",
    ]
    assert "truth_ratios" not in result["splits"]["forget"] and "truth_ratio" not in result["splits"]["retain"]
    with pytest.raises(ValueError):  # real authors / world facts need perturbed answers (not optional there)
        evaluate(tiny_model, tiny_tokenizer, spec, {"real_authors": list(RECORDS)}, EvalSettings(batch_size=4))


def test_muse_writes_the_table_keys(tiny_model, tiny_tokenizer):
    spec = replace(resolve_benchmark("muse-news"), max_length=64, max_new_tokens=4)
    texts = [replace(r, answer=f"{r.question} {r.answer}") for r in RECORDS]
    splits = {
        "forget": RECORDS[1:],
        "forget_icl": RECORDS[:1],
        "retain": RECORDS[:3],
        "retain_icl": RECORDS[3:],
        "mia_forget": texts[:2],
        "mia_holdout": texts[2:],
    }
    first = evaluate(tiny_model, tiny_tokenizer, spec, splits, EvalSettings(batch_size=4))
    result = evaluate(tiny_model, tiny_tokenizer, spec, splits, EvalSettings(batch_size=4), first)
    assert list(result["summary"]) == [
        "forget_knowmem_rouge_l_f1",
        "forget_knowmem_rouge_l_recall",
        "m",
        "delta",
        "retain_knowmem_rouge_l_f1",
        "retain_knowmem_rouge_l_recall",
        "mia_loss_auc",
        "mia_min_k_auc",
        "privleak",
    ]
    assert list(result["splits"]["forget"]) == [
        "n",
        "samples",
        "rouge_l_f1",
        "rouge_l_recall",
        "rouge_l",
        "diagnosis",
        "diagnostic_margins",
    ]
    assert list(result["splits"]["retain"]) == ["n", "samples", "rouge_l_f1", "rouge_l_recall", "rouge_l"]
    forget = result["splits"]["forget"]
    assert forget["rouge_l"] == forget["rouge_l_f1" if spec.rouge == "f1" else "rouge_l_recall"]
    assert result["summary"]["privleak"] == pytest.approx(0.0) and result["summary"]["delta"] == pytest.approx(0.0)
    parts = evaluate(tiny_model, tiny_tokenizer, spec, splits, EvalSettings(batch_size=4), first, ("rouge",))
    assert list(parts["summary"]) == ["forget_knowmem_rouge_l_f1", "forget_knowmem_rouge_l_recall"]
