"""TOFU metrics as pure functions of token statistics, NLLs and texts (open-unlearning's definitions).

Source: open-unlearning ``src/evals/metrics/{memorization,utility,privacy,utils}.py`` and
``configs/eval/tofu_metrics/*.yaml`` (commit d3d7cf9); TOFU ``aggregate_eval_stat.py``. Per-sample NLLs are
per-token means over the labelled answer tokens, EOS included; EM and ES drop the final (EOS) position, as
open-unlearning's ``tokenwise_vocab_logprobs`` does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

from margincal.core.errors import InputError, require
from margincal.model.scoring import TokenStats
from margincal.results.metric_table import metric_value

EPS = 1e-10


@lru_cache(maxsize=1)
def _scorer():
    """rouge-score's scorer with its default tokenizer and the Porter stemmer (open-unlearning's), the tokenizer
    handed in: left to make it, rouge-score logs through absl, which then gives the root logger a handler of its own
    and every library's INFO lines reach the terminal twice."""
    rouge_scorer = require("rouge_score.rouge_scorer", "ROUGE-L", "pip install 'rouge-score>=0.1.2'")
    from rouge_score.tokenizers import DefaultTokenizer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=DefaultTokenizer(use_stemmer=True))


def rouge_l(gold: str, generated: str) -> tuple[float, float]:
    """(recall, F1) of ROUGE-L between the gold answer and the generation (``rouge-score``, stemming on).

    TOFU reports the recall (LCS / |gold|), MUSE the F1."""
    score = _scorer().score(gold, generated)["rougeL"]
    return score.recall, score.fmeasure


def rouge_l_recall(gold: str, generated: str) -> float:
    """ROUGE-L recall = LCS(gold, generated) / |gold| over stemmed word tokens."""
    return rouge_l(gold, generated)[0]


def fact_recall(values: Sequence[str], generated: str) -> float:
    """Share of gold attribute values the generation states: (1/|V|) Σ_{v∈V} 1[v occurs in it as whole words,
    case-insensitive]. A fact-level relearn score beside ROUGE-L, which on templated answers is dominated by frame
    words (ours; the mini benchmark records each answer's values in ``meta["content"]``)."""
    if not values:
        raise InputError("fact_recall needs at least one gold value")
    hits = [re.search(rf"(?<!\w){re.escape(v)}(?!\w)", generated, re.IGNORECASE) is not None for v in values]
    return sum(hits) / len(hits)


def rouge_l_samples(records, generated: Sequence[str]) -> tuple[list[tuple[float, float]], list[dict]]:
    """(recall, F1) of each generation against its record's answer, and the samples (question, gold, generated,
    ROUGE-L recall and F1, and :func:`fact_recall` for records that carry their attribute values)."""
    pairs = list(zip(records, generated, strict=True))
    scores = [rouge_l(r.answer, g) for r, g in pairs]
    samples = [
        {"question": r.question, "gold": r.answer, "generated": g, "rouge_l": rec, "rouge_l_f1": f1}
        for (r, g), (rec, f1) in zip(pairs, scores, strict=True)
    ]
    for (r, g), sample in zip(pairs, samples, strict=True):
        if r.meta.get("content"):
            sample["fact_recall"] = fact_recall(list(r.meta["content"].values()), g)
    return scores, samples


def mean_fact_recall(samples: Sequence[dict]) -> float | None:
    """Mean :func:`fact_recall` of the samples, or None unless every sample has one."""
    if not samples or any("fact_recall" not in s for s in samples):
        return None
    return float(sum(s["fact_recall"] for s in samples) / len(samples))


def repeated_ngrams(text: str, n: int) -> tuple[float, int]:
    """(share of the word n-grams that repeat an earlier one, number of n-grams) of a generation: words are its
    lower-cased whitespace-separated tokens; ``(0.0, 0)`` for fewer than ``n`` words. "a b c a b c a b c" has the
    3-grams abc bca cab abc bca cab abc: 4 of 7 repeat one before them."""
    words = text.lower().split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0, 0
    return 1 - len(set(grams)) / len(grams), len(grams)


def q_a_prob(stats: TokenStats) -> torch.Tensor:
    """Per-sample probability exp(−N), N the mean answer-token NLL (open-unlearning ``probability``)."""
    return torch.exp(-stats.nll_mean())


def without_eos(stats: TokenStats) -> torch.Tensor:
    """The answer mask with each row's last labelled position (the EOS prediction) removed."""
    steps = torch.arange(stats.mask.size(1), device=stats.mask.device)[None, :]
    return stats.mask & (steps < (stats.lengths - 1)[:, None])


def argmax_hits(stats: TokenStats) -> torch.Tensor:
    """1[gold is the strict argmax] per answer position (teacher forcing); ties count as misses."""
    return stats.gold > stats.competitor


def exact_memorization(stats: TokenStats) -> torch.Tensor:
    """EM per sample: mean over answer positions (EOS excluded) of 1[argmax_v p(v | x, y_<t) = y_t]."""
    mask = without_eos(stats)
    hits = (argmax_hits(stats) & mask).sum(1).float()
    return hits / mask.sum(1).clamp(min=1)


def extraction_strength(stats: TokenStats) -> torch.Tensor:
    """ES per sample: 1 − k*/L, k* the smallest k whose teacher-forced argmax suffix y_k.. matches the gold.

    L = answer length without EOS. Like open-unlearning's loop, a sample with no matching suffix gets k* = L − 1
    (ES = 1/L), and an empty answer gets 0.
    """
    mask = without_eos(stats)
    hits = argmax_hits(stats) | ~mask  # padding never breaks a suffix
    suffix_ok = hits.flip(1).int().cumprod(1).flip(1).bool() & mask
    lengths = mask.sum(1)
    out = torch.zeros(len(lengths))
    for i, n in enumerate(lengths.tolist()):
        if n == 0:
            continue
        ok = suffix_ok[i, :n].nonzero()
        k = int(ok[0]) if len(ok) else n - 1
        out[i] = 1 - k / n
    return out


def group_mean(values: torch.Tensor, owner: Sequence[int], n: int) -> torch.Tensor:
    """Mean of ``values`` per owner index (``owner[j]`` is the sample value ``j`` belongs to)."""
    owner_t = torch.as_tensor(list(owner), device=values.device)
    total = values.new_zeros(n, dtype=torch.float).index_add_(0, owner_t, values.float())
    count = values.new_zeros(n, dtype=torch.float).index_add_(
        0, owner_t, values.new_ones(len(owner_t), dtype=torch.float)
    )
    return total / count.clamp(min=1)


def truth_ratio(correct_nll: torch.Tensor, perturbed_nll_mean: torch.Tensor) -> torch.Tensor:
    """Per-sample raw truth ratio R = p_wrong / p_correct with p = exp(−mean NLL).

    ``perturbed_nll_mean`` is the mean over a sample's perturbed answers of their mean NLLs, so p_wrong is the
    geometric mean of the length-normalised perturbed probabilities (open-unlearning ``truth_ratio``)."""
    return torch.exp(-perturbed_nll_mean) / (torch.exp(-correct_nll) + EPS)


def closer_to_1_better(ratios: torch.Tensor) -> float:
    """Forget aggregation: mean of min(R, 1/R)."""
    return float(torch.minimum(ratios, 1 / (ratios + EPS)).mean())


def true_better(ratios: torch.Tensor) -> float:
    """Retain / real-author / world-fact aggregation: mean of max(0, 1 − R)."""
    return float((1 - ratios).clamp(min=0).mean())


def prob_normalised(correct_nll: torch.Tensor, perturbed_nll: torch.Tensor, owner: Sequence[int]) -> torch.Tensor:
    """Per-sample p_true / (p_true + Σ_j p_pert_j + 1e−10), p = exp(−mean NLL) (``probability_w_options``)."""
    n = len(correct_nll)
    owner_t = torch.as_tensor(list(owner), device=perturbed_nll.device)
    wrong = perturbed_nll.new_zeros(n, dtype=torch.float).index_add_(0, owner_t, torch.exp(-perturbed_nll.float()))
    correct = torch.exp(-correct_nll)
    return correct / (correct + wrong + EPS)


def forget_quality(ratios: Sequence[float], reference_ratios: Sequence[float]) -> float:
    """KS-test p-value between the model's and θ_ref's per-sample forget truth ratios (``scipy.stats.ks_2samp``)."""
    from scipy import stats as sps

    return float(sps.ks_2samp(np.asarray(ratios), np.asarray(reference_ratios)).pvalue)


# ------------------------------------------------------------------------------------------ the metric table's values
# each a function of a role's shared scores (``tofu.RoleScores``), named by the rows of :mod:`.metric_table`
def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


@metric_value("q_a_prob")
def _q_a_prob(s) -> float:
    """Probability of the gold answer, length-normalised (exp of the mean answer-token log-prob), mean over samples."""
    return float(q_a_prob(s.stats).mean())


@metric_value("rouge_recall")
def _rouge_recall(s) -> float:  # TOFU's ROUGE-L; MUSE's recall
    """ROUGE-L recall of the greedy answer against the gold answer (TOFU's ROUGE), mean over samples."""
    return _mean([recall for recall, _ in s.rouge])


@metric_value("rouge_f1")
def _rouge_f1(s) -> float:
    """ROUGE-L F1 of the greedy answer against the gold answer (MUSE's), mean over samples."""
    return _mean([f1 for _, f1 in s.rouge])


@metric_value("rouge_headline")
def _rouge_headline(s) -> float:
    """The benchmark's headline ROUGE-L (``spec.rouge``: MUSE's F1, else recall): what the attack stage reads."""
    return _rouge_f1(s) if s.spec.rouge == "f1" else _rouge_recall(s)


@metric_value("fact_recall")
def _fact_recall(s) -> float | None:
    """Share of the record's attribute values (a fact's words) the greedy answer states, mean over samples."""
    return mean_fact_recall(s.samples)


@metric_value("exact_memorization")
def _exact_memorization(s) -> float:
    """Share of answer tokens the model ranks first under teacher forcing, mean over samples."""
    return float(exact_memorization(s.stats).mean())


@metric_value("extraction_strength")
def _extraction_strength(s) -> float:
    """Extraction strength: 1 − k*/L, k* the shortest gold prefix after which the teacher-forced argmax reproduces
    the rest of the answer (L its length), mean over samples."""
    return float(extraction_strength(s.stats).mean())


@metric_value("truth_ratios")
def _truth_ratios(s) -> list[float] | None:
    """Each sample's truth ratio: perturbed (wrong) answers' probability over the paraphrased answer's."""
    return None if s.truth_ratios is None else s.truth_ratios.tolist()


@metric_value("closer_to_1")
def _closer_to_1(s) -> float | None:
    """Truth ratio scored so that 1 (no preference between true and false answers) is best: mean of min(R, 1/R)."""
    return None if s.truth_ratios is None else closer_to_1_better(s.truth_ratios)


@metric_value("true_better")
def _true_better(s) -> float | None:
    """Truth ratio scored so that preferring the true answer is better: mean of max(0, 1 − R)."""
    return None if s.truth_ratios is None else true_better(s.truth_ratios)


@metric_value("forget_quality")
def _forget_quality(s) -> float | None:
    """KS-test p-value between the model's and the retain-only reference's forget truth ratios; high means alike."""
    ref = s.reference_split.get("truth_ratios")
    return None if s.truth_ratios is None or ref is None else forget_quality(s.truth_ratios.tolist(), ref)


@metric_value("prob_normalised")
def _prob_normalised(s) -> float:
    """Probability of the gold answer against the perturbed ones: p(gold) / (p(gold) + Σ p(perturbed)), mean."""
    pert, owner = s.perturbed
    return float(prob_normalised(s.stats.nll_mean(), pert.nll_mean(), owner).mean())
