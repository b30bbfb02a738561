"""The margin-cliff diagnostic (paper Sec. 3.1, Thm. 1, Thm. 3, Asm. 1).

All functions consume :class:`~margincal.model.scoring.TokenStats` (answer-aligned, one forward pass).

* margin            m_θ(t) = log p(y_t) − max_{v≠y_t} log p(v)                           (Eq. 1)
* diagnostic pos.   t̂_θ = argmax_t H(p_θ(·|x, y_<t)) over answer tokens (ties → first)
* dataset diag.     m_θ(D) = E_D[m_θ(t̂_θ)]  (MUSE: median)                              (Eq. 2)
* cliff gap         Δ(θ̂) = m_θ̂(D_f) − m_ref(D_f); Δ ≤ 0 means crossed                 (Eq. 3)
* log-odds level    ℓ(θ) = E_D[log(p_t̂ / (1 − p_t̂))]; always m ≥ ℓ; certified iff ℓ(θ̂) > m_ref (Thm. 1)
* smoothed margin   m_β = log p(y) − (1/β) log Σ_{v≠y} exp(β log p(v)),  m_β ≤ m ≤ m_β + c_β,
                    c_β = log(V−1)/β                                                      (Thm. 3)
* overlap ε         fraction of unique word-bigram types of forget Q&A also in retain Q&A (Asm. 1)
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable

import torch

from margincal.core.errors import InputError
from margincal.model.scoring import TokenStats
from margincal.results.base import Diagnosis
from margincal.results.metric_table import metric_value


def diagnostic_positions(stats: TokenStats) -> torch.Tensor:
    """t̂ per sample: the max-entropy answer position (first one on ties)."""
    ent = torch.where(stats.mask, stats.entropy, torch.full_like(stats.entropy, float("-inf")))
    return ent.argmax(dim=1)


def diagnostic_margins(stats: TokenStats, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample margin at the diagnostic position (own t̂ unless ``positions`` is given)."""
    pos = diagnostic_positions(stats) if positions is None else positions
    return stats.margin.gather(1, pos[:, None]).squeeze(1)


def diagnostic_log_odds(stats: TokenStats, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample gold log-odds log(p/(1−p)) at the diagnostic position, as log p − max(log(−expm1(log p)), c) with
    c the strongest competitor's log-probability: 1 − p ≥ p_c, so the max changes nothing while log p is resolved,
    and where p rounds to 1 (log p = 0 in float32) it gives the margin there instead of +∞ (ℓ ≤ m always)."""
    pos = diagnostic_positions(stats) if positions is None else positions
    logp = stats.gold.gather(1, pos[:, None]).squeeze(1).double()
    competitor = stats.competitor.gather(1, pos[:, None]).squeeze(1).double()
    return (logp - torch.maximum(torch.log(-torch.expm1(logp)), competitor)).float()


def aggregate(values: torch.Tensor, how: str = "mean") -> float:
    """Mean (TOFU) or median (MUSE) over samples."""
    if values.numel() == 0:
        raise InputError("cannot aggregate a diagnostic over an empty split")
    if how == "mean":
        return float(values.mean())
    if how == "median":
        return float(values.double().quantile(0.5))
    raise InputError(f"unknown aggregation {how!r}; use 'mean' or 'median'")


def dataset_margin(stats: TokenStats, how: str = "mean") -> float:
    """m_θ(D) of Eq. 2."""
    return aggregate(diagnostic_margins(stats), how)


def log_odds_level(stats: TokenStats, how: str = "mean") -> float:
    """ℓ(θ) of Asm. 1 at the model's own diagnostic positions."""
    return aggregate(diagnostic_log_odds(stats), how)


def diagnose(stats: TokenStats, m_ref: float | None = None, how: str = "mean") -> Diagnosis:
    """m, ℓ, and (given m_ref) Δ, certificate and crossing for one checkpoint (the numbers of a
    :class:`~margincal.results.outputs.Diagnosis`)."""
    m = dataset_margin(stats, how)
    ell = log_odds_level(stats, how)
    if m_ref is None:
        return Diagnosis(m=m, log_odds=ell, n=int(stats.mask.size(0)), aggregate=how)
    return Diagnosis(
        m=m,
        log_odds=ell,
        m_ref=m_ref,
        delta=m - m_ref,
        certified=ell > m_ref,
        crossed=(m - m_ref) <= 0,
        n=int(stats.mask.size(0)),
        aggregate=how,
    )


# the metric table's diagnosis rows: a role's shared scores (``tofu.RoleScores``) hold its diagnosis
@metric_value("diagnosis")
def _diagnosis(s) -> dict:
    """The margin diagnosis of the split: m(D), ℓ, Δ and the certificate together."""
    return s.diagnosis


@metric_value("diagnostic_margins")
def _diagnostic_margins(s) -> list[float]:
    """Each answer's margin at its max-entropy position, per sample."""
    return diagnostic_margins(s.stats).tolist()


MARGIN_NUMBERS = {  # delta and certified are None without m_ref
    "m": "m(D): the mean (MUSE: median) answer margin, gold log-prob minus the best rival's, at each answer's "
    "max-entropy position; lower means the answers are further forgotten",
    "log_odds": "ℓ: the log-odds level of the gold answers (Theorem 1's left side)",
    "delta": "Δ = m − m_ref: how far above the retain-only reference's margin the model stops (the margin cliff at 0)",
    "certified": "Theorem 1's certificate ℓ > m_ref: whether the bound on relearning applies",
}
for _key, _what in MARGIN_NUMBERS.items():
    _value = functools.partial(lambda s, key: s.diagnosis[key], key=_key)
    _value.__doc__, _value.__module__ = _what + ".", __name__
    metric_value(_key)(_value)


def smoothed_margin(logits: torch.Tensor, targets: torch.Tensor, beta: float) -> torch.Tensor:
    """m_β per row from logits ``[..., V]`` at frozen positions and gold ids ``[...]`` (differentiable)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    gold = logp.gather(-1, targets[..., None]).squeeze(-1)
    others = logp.scatter(-1, targets[..., None], float("-inf"))
    return gold - torch.logsumexp(beta * others, dim=-1) / beta


def smoothing_slack(vocab_size: int, beta: float) -> float:
    """c_β = log(V − 1)/β, the bracket m_β ≤ m ≤ m_β + c_β."""
    return math.log(vocab_size - 1) / beta


_WORD = re.compile(r"[a-z0-9']+")


def word_bigrams(text: str) -> set[tuple[str, str]]:
    """Unique lower-cased word-level bigram types of a text (words = ``[a-z0-9']+``)."""
    words = _WORD.findall(text.lower())
    return set(zip(words, words[1:], strict=False))


def overlap_epsilon(forget_texts: Iterable[str], retain_texts: Iterable[str]) -> float:
    """ε = |B(D_f) ∩ B(D_r)| / |B(D_f)| over unique word-bigram types of the Q&A texts."""
    forget = set().union(*(word_bigrams(t) for t in forget_texts))
    if not forget:
        raise InputError("overlap_epsilon: the forget texts contain no word bigrams")
    retain = set().union(*(word_bigrams(t) for t in retain_texts))
    return len(forget & retain) / len(forget)
