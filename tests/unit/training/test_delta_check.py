"""Δ-stop's and the coercivity trace's Δ is the evaluator's: the evaluation forget records encoded as the benchmark's
evaluator encodes them (MUSE: few-shot prompts from ``forget_icl``) and the benchmark's aggregate (MUSE: median), so
it is on the scale of m_ref (θ_ref's m(D_f) by the same evaluator)."""

import dataclasses

import pytest
from conftest import RECORDS, TINY

from margincal.config.settings import EvalSettings, LoraSpec, MCConfig, MethodRun, TrainConfig, resolve_benchmark
from margincal.data.records import QARecord, encode_qa, encode_records
from margincal.evaluation.evaluators import evaluate
from margincal.mc.polish import polish_pool
from margincal.mini.models import new_mini_model
from margincal.model.loading import clone_model
from margincal.model.margin import dataset_margin
from margincal.model.scoring import score_dataset
from margincal.pipeline.stages import Workspace, evaluate_stage, polish_stage, reference_margin
from margincal.training.monitors import delta_check

SHOTS = RECORDS[:2]  # knowmem forget_qa_icl
FORGET = [  # knowmem forget_qa: the evaluation forget records
    RECORDS[2],
    RECORDS[3],
    QARecord("Where was Ann Bel born?", "Ann Bel was born in Vale Ume."),
    QARecord("What does Cid Dor write?", "Cid Dor writes sea novels."),
    QARecord("Where was Cid Dor born?", "Cid Dor was born in Port Ivo."),
]
PASSAGES = [  # raw/forget: the training forget corpus (news passages, chunked)
    QARecord("", " ".join(r.answer for r in RECORDS), meta={"kind": "passage"}),
    QARecord("", f"{RECORDS[1].answer} {RECORDS[2].answer}", meta={"kind": "passage"}),
]


def muse_spec():
    spec = dataclasses.replace(resolve_benchmark("muse-news"), max_length=96, max_new_tokens=4)
    assert spec.kind == "muse" and spec.aggregate == "median" and spec.few_shot
    return spec


def muse_workspace(theta0, ref, tokenizer) -> Workspace:
    """MUSE-shaped: unlearning trains on passages, the evaluator scores knowmem QA under few-shot prompts."""
    spec = muse_spec()
    qa = encode_qa(tokenizer, RECORDS, spec.max_length)
    train = {"forget": encode_records(tokenizer, PASSAGES, spec.max_length), "retain": qa, "probe": qa}
    ws = Workspace(tokenizer, spec, {"forget": FORGET, "forget_icl": SHOTS}, train, {"theta0": "t0", "ref": "ref"})
    ws._frozen.update(theta0=theta0, ref=ref)
    return ws


def test_delta_stop_of_the_polish_stage_is_the_evaluators_delta_on_muse(tiny_model, tiny_tokenizer):
    ref = new_mini_model(TINY, tiny_tokenizer, seed=1)
    ws = muse_workspace(tiny_model, ref, tiny_tokenizer)
    settings = EvalSettings()
    m_ref = reference_margin(ws, settings)

    def evaluator_delta(step, model):  # runs just before Δ-stop's hook, on the same model
        return {
            "evaluator_delta": evaluate_stage(model, ws, settings, {"summary": {"m": m_ref}}, ("diagnosis",))[
                "summary"
            ]["delta"]
        }

    train = TrainConfig(steps=3, batch_size=1, lr=1e-2, lora=LoraSpec(r=2, alpha=2))
    mc = MCConfig(train=train, stop_delta=-1e9, stop_batch=len(FORGET), check_every=1)  # never stops
    _, result = polish_stage(clone_model(tiny_model), MethodRun(name="NPO"), mc, ws, m_ref, hook=evaluator_delta)
    rows = [r for r in result.trace if r["step"] > 0]  # the Δ-stop monitor's rows after steps 1, 2 and 3
    assert [r["step"] for r in rows] == [1, 2, 3] and "stop_reason" not in rows[-1]
    for row in rows:
        assert row["delta"] == pytest.approx(result.history[row["step"] - 1]["evaluator_delta"], abs=1e-5)
    assert len({round(r["delta"], 5) for r in rows}) > 1  # the polish moves Δ: each step's model is compared


def test_delta_check_encodes_and_aggregates_as_the_muse_evaluator(tiny_model, tiny_tokenizer):
    spec, pad, m_ref = muse_spec(), tiny_tokenizer.pad_token_id, 0.25
    pool = polish_pool(encode_records(tiny_tokenizer, PASSAGES, spec.max_length), 200, 0)
    check = delta_check(tiny_tokenizer, spec, FORGET, m_ref, SHOTS, pool=pool)
    assert check.aggregate == "median" and check.indices == list(range(len(FORGET)))  # passages match no record
    shot_prompts = encode_qa(tiny_tokenizer, FORGET, spec.max_length, shots=SHOTS)
    assert [e.prompt_ids for e in check.examples] == [e.prompt_ids for e in shot_prompts]
    assert [e.answer_ids for e in check.examples] == [e.answer_ids for e in shot_prompts]
    splits = {"forget": FORGET, "forget_icl": SHOTS}
    diagnosis = evaluate(
        tiny_model, tiny_tokenizer, spec, splits, EvalSettings(), {"summary": {"m": m_ref}}, ("diagnosis",)
    )["splits"]["forget"]["diagnosis"]
    assert check(tiny_model) == pytest.approx(diagnosis["delta"], abs=1e-6)
    assert check.diagnosis(tiny_model).log_odds == pytest.approx(diagnosis["log_odds"], abs=1e-6)
    # what the old check measured (no few-shot prompt, the mean) is another number
    plain = dataset_margin(score_dataset(tiny_model, encode_qa(tiny_tokenizer, FORGET, spec.max_length), pad))
    assert abs((plain - m_ref) - check(tiny_model)) > 1e-3
    subset = delta_check(tiny_tokenizer, spec, FORGET, m_ref, SHOTS, size=3, seed=4)
    assert subset.indices == delta_check(tiny_tokenizer, spec, FORGET, m_ref, SHOTS, size=3, seed=4).indices
    assert len(subset.indices) == 3 and set(subset.indices) < set(range(len(FORGET)))


def test_delta_check_holds_out_the_polish_pool_where_training_forget_is_eval_forget(
    tiny_model, tiny_tokenizer, tiny_examples
):
    spec = dataclasses.replace(resolve_benchmark("tofu"), max_length=64)
    pool = polish_pool(tiny_examples, 2, seed=0)  # TOFU / mini: the training forget examples are the eval records
    check = delta_check(tiny_tokenizer, spec, RECORDS, 0.0, pool=pool, size=16, seed=0)
    assert check.indices == sorted(set(range(len(RECORDS))) - {e.index for e in pool}) and check.aggregate == "mean"
    one = delta_check(tiny_tokenizer, spec, RECORDS, 0.0, pool=pool, size=1, seed=0)
    assert len(one.indices) == 1 and one.indices[0] in check.indices
    assert delta_check(tiny_tokenizer, spec, RECORDS, 0.0, pool=tiny_examples).indices == [0, 1, 2, 3]  # all pooled
    records = [RECORDS[i] for i in check.indices]
    out = evaluate(
        tiny_model, tiny_tokenizer, spec, {"forget": records}, EvalSettings(), {"summary": {"m": 0.0}}, ("diagnosis",)
    )
    assert check(tiny_model) == pytest.approx(out["summary"]["delta"], abs=1e-6)
