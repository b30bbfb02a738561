"""TOFU-style forget/retain metrics from one scoring pass and one greedy generation pass per split.

* ROUGE-L recall of the greedy answer against the gold answer (``rouge-score``, stemming on), as in
  open-unlearning's ``rouge`` metric (``rougeL_recall``).
* Q_A_Prob: mean over samples of exp(−N), N the mean answer-token NLL (open-unlearning ``probability``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from margincal.data.records import EncodedQA
from margincal.generation import generate_answers
from margincal.margin import diagnose, diagnostic_margins
from margincal.scoring import TokenStats, score_dataset


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l_recall(gold: str, generated: str) -> float:
    """ROUGE-L recall = LCS(gold, generated) / |gold| over stemmed word tokens."""
    return _scorer().score(gold, generated)["rougeL"].recall


def q_a_prob(stats: TokenStats) -> torch.Tensor:
    """Per-sample exp(−mean answer NLL)."""
    return torch.exp(-stats.nll_mean())


def evaluate_split(
    model,
    tokenizer,
    examples: Sequence[EncodedQA],
    answers: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    m_ref: float | None = None,
    diagnostic: bool = True,
) -> dict:
    """ROUGE-L recall, Q_A_Prob and (optionally) the margin diagnostic of ``model`` on one split."""
    stats = score_dataset(model, examples, tokenizer.pad_token_id, batch_size)
    generated = generate_answers(model, tokenizer, examples, max_new_tokens, batch_size)
    rouge = [rouge_l_recall(gold, gen) for gold, gen in zip(answers, generated, strict=True)]
    out = {
        "n": len(examples),
        "rouge_l": float(sum(rouge) / len(rouge)),
        "q_a_prob": float(q_a_prob(stats).mean()),
        "samples": [
            {"gold": g, "generated": s, "rouge_l": r} for g, s, r in zip(answers, generated, rouge, strict=True)
        ],
    }
    if diagnostic:
        out["diagnosis"] = diagnose(stats, m_ref).to_dict()
        out["diagnostic_margins"] = diagnostic_margins(stats).tolist()
    return out
