"""MUSE-News knowmem evaluation (Shi et al. 2024) as open-unlearning runs it (``configs/eval/muse_metrics``).

* knowmem forget / retain: greedy answers to few-shot prompts (every ICL pair of the split's ``*_icl`` set placed
  before the question by the model's prompt template: ``Question: q\\nAnswer: a\\n\\n`` blocks for Llama-2-7b-hf),
  cut at the stop words; ROUGE-L F1 (open-unlearning's MUSE
  ``rougeL_f1``) and recall, averaged over questions.
* Margin diagnostic on the forget answers under the same prompt, median-aggregated (paper App. "MUSE-News").
* MIA: loss and min-k AUCs (members = privleak ``forget`` passages, non-members = ``holdout``), privleak on the
  min-k AUC against θ_ref's.
"""

from __future__ import annotations

from collections.abc import Sequence

from margincal.data.records import QARecord, encode_qa, encode_text
from margincal.evaluation import metrics as M
from margincal.evaluation import mia
from margincal.generation import generate_answers
from margincal.margin import diagnose, diagnostic_margins
from margincal.scoring import score_dataset


def evaluate_muse(
    model,
    tokenizer,
    splits: dict[str, Sequence[QARecord]],
    max_length: int = 2048,
    batch_size: int = 16,
    max_new_tokens: int = 32,
    stop: Sequence[str] = ("\n\n", "\nQuestion", "Question:"),
    reference: dict | None = None,
    aggregate: str = "median",
) -> dict:
    """knowmem ROUGE-L, the margin diagnostic and the MUSE MIA AUCs; ``reference`` is θ_ref's result."""
    pad = tokenizer.pad_token_id
    ref_summary = (reference or {}).get("summary", {})
    out: dict = {"splits": {}, "summary": {}}
    for role in ("forget", "retain"):
        if role not in splits:
            continue
        records = splits[role]
        examples = encode_qa(tokenizer, records, max_length, shots=splits.get(f"{role}_icl", ()))
        generated = generate_answers(model, tokenizer, examples, max_new_tokens, batch_size, stop)
        scores, samples = M.rouge_l_samples(records, generated)
        split = {
            "n": len(records),
            "rouge_l_f1": sum(f for _, f in scores) / len(scores),
            "rouge_l_recall": sum(r for r, _ in scores) / len(scores),
            "samples": samples,
        }
        out["summary"][f"{role}_knowmem_rouge_l_f1"] = split["rouge_l_f1"]
        out["summary"][f"{role}_knowmem_rouge_l_recall"] = split["rouge_l_recall"]
        if role == "forget":
            stats = score_dataset(model, examples, pad, batch_size)
            split["diagnosis"] = diagnose(stats, ref_summary.get("m"), how=aggregate).to_dict()
            split["diagnostic_margins"] = diagnostic_margins(stats).tolist()
            out["summary"]["m"] = split["diagnosis"]["m"]
            if split["diagnosis"]["delta"] is not None:
                out["summary"]["delta"] = split["diagnosis"]["delta"]
        out["splits"][role] = split
    if "mia_forget" in splits and "mia_holdout" in splits:
        scores = {}
        for role in ("mia_forget", "mia_holdout"):
            examples = encode_text(tokenizer, [r.answer for r in splits[role]], max_length)
            stats = score_dataset(model, examples, pad, batch_size)
            scores[role] = {"loss": mia.loss_score(stats), "min_k": mia.min_k_score(stats)}
        for name in ("loss", "min_k"):
            value = mia.auc(scores["mia_forget"][name].tolist(), scores["mia_holdout"][name].tolist())
            out["summary"][f"mia_{name}_auc"] = value
        out["summary"]["privleak"] = mia.privleak(
            out["summary"]["mia_min_k_auc"], ref_summary.get("mia_min_k_auc", 0.5)
        )
    return out
