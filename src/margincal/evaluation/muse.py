"""The MUSE-News evaluator (Shi et al. 2024), knowmem as open-unlearning runs it (``configs/eval/muse_metrics``).

* knowmem forget / retain: greedy answers to few-shot prompts (every ICL pair of the split's ``*_icl`` set placed
  before the question by the model's prompt template: ``Question: q\\nAnswer: a\\n\\n`` blocks for Llama-2-7b-hf),
  cut at the stop words; ROUGE-L F1 (open-unlearning's MUSE ``rougeL_f1``, the headline ``rouge_l``) and recall,
  averaged over questions.
* Margin diagnostic on the forget answers under the same prompt, median-aggregated (paper App. "MUSE-News").
* MIA: loss and min-k AUCs (members = privleak ``forget`` passages, non-members = ``holdout``), privleak on the
  min-k AUC against θ_ref's.

``parts`` restricts the work to the forget role's ``diagnosis`` and/or ``rouge``, computed exactly as in a full
evaluation (same few-shot prompts, stop strings, F1 and aggregate): the attack stage reads these.
"""

from __future__ import annotations

from collections.abc import Sequence

from margincal.config import BenchmarkSpec, EvalSettings
from margincal.data.records import QARecord, encode_qa, encode_text
from margincal.evaluation import metrics as M
from margincal.evaluation import mia
from margincal.evaluation.tofu import PARTS, reference_margin
from margincal.generation import generate_answers
from margincal.margin import diagnose, diagnostic_margins
from margincal.scoring import score_dataset


def evaluate_muse(
    model,
    tokenizer,
    spec: BenchmarkSpec,
    splits: dict[str, Sequence[QARecord]],
    settings: EvalSettings,
    reference: dict | None = None,
    parts: Sequence[str] | None = None,
) -> dict:
    """knowmem ROUGE-L, the margin diagnostic and the MUSE MIA AUCs; ``reference`` is θ_ref's result."""
    pad, batch_size = tokenizer.pad_token_id, settings.batch_size
    ref_summary = (reference or {}).get("summary", {})
    wanted = set(PARTS if parts is None else parts)
    out: dict = {"splits": {}, "summary": {}}
    for role in ("forget",) if parts is not None else ("forget", "retain"):
        if role not in splits:
            continue
        records = splits[role]
        shots = splits.get(f"{role}_icl", ()) if spec.few_shot else ()
        examples = encode_qa(tokenizer, records, spec.max_length, shots=shots)
        split: dict = {"n": len(records)}
        if "rouge" in wanted:
            generated = generate_answers(model, tokenizer, examples, spec.max_new_tokens,
                                         settings.generation_batch_size, spec.stop)  # fmt: skip
            scores, split["samples"] = M.rouge_l_samples(records, generated)
            split["rouge_l_f1"] = sum(f for _, f in scores) / len(scores)
            split["rouge_l_recall"] = sum(r for r, _ in scores) / len(scores)
            split["rouge_l"] = split["rouge_l_f1" if spec.rouge == "f1" else "rouge_l_recall"]
            out["summary"][f"{role}_knowmem_rouge_l_f1"] = split["rouge_l_f1"]
            out["summary"][f"{role}_knowmem_rouge_l_recall"] = split["rouge_l_recall"]
        if role == "forget" and "diagnosis" in wanted:
            stats = score_dataset(model, examples, pad, batch_size)
            split["diagnosis"] = diagnose(stats, reference_margin(reference), how=spec.aggregate).to_dict()
            split["diagnostic_margins"] = diagnostic_margins(stats).tolist()
            out["summary"]["m"] = split["diagnosis"]["m"]
            if split["diagnosis"]["delta"] is not None:
                out["summary"]["delta"] = split["diagnosis"]["delta"]
        out["splits"][role] = split
    if parts is None and "mia_forget" in splits and "mia_holdout" in splits:
        scores = {}
        for role in ("mia_forget", "mia_holdout"):
            examples = encode_text(tokenizer, [r.answer for r in splits[role]], spec.max_length)
            stats = score_dataset(model, examples, pad, batch_size)
            scores[role] = {"loss": mia.loss_score(stats), "min_k": mia.min_k_score(stats)}
        for name in ("loss", "min_k"):
            value = mia.auc(scores["mia_forget"][name].tolist(), scores["mia_holdout"][name].tolist())
            out["summary"][f"mia_{name}_auc"] = value
        out["summary"]["privleak"] = mia.privleak(
            out["summary"]["mia_min_k_auc"], ref_summary.get("mia_min_k_auc", 0.5)
        )
    return out
