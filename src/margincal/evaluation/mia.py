"""Membership-inference scores and AUCs: loss, min-k, min-k++, zlib, gradnorm (members = forget, non-members = holdout).

Source: open-unlearning ``src/evals/metrics/mia/{loss,min_k,min_k_plus_plus,zlib,gradnorm,utils}.py`` and
``privacy.py`` (commit d3d7cf9). Every score is loss-like (higher = less likely a member) and the AUC is
``roc_auc_score`` with forget labelled 0 and holdout 1, so AUC → 1 when the forget answers are far more likely
than the holdout answers. The gradient norm is capped at 1e6 (paper Sec. 4.1).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence

import numpy as np
import torch

from margincal.data.records import EncodedQA, collate, sorted_batches
from margincal.evaluation.metrics import without_eos
from margincal.model.persample import Unsupported, per_sample_grad_norms
from margincal.model.scoring import TokenStats, forward_answer, in_input_order, score_dataset, stats_from_logits
from margincal.results.metric_table import MIA_DETECTORS, metric_value

DETECTORS = MIA_DETECTORS  # loss, min_k, min_k_plus_plus, zlib, gradnorm (their AUCs: the metric table's rows)
GRADNORM_CAP = 1e6


def _lowest_k_mean(values: torch.Tensor, mask: torch.Tensor, k: float) -> torch.Tensor:
    """Per row: −mean of the lowest max(1, ⌊k·n⌋) of the n masked values (0 for an empty row)."""
    out = values.new_zeros(values.size(0), dtype=torch.float)
    for i in range(values.size(0)):
        row = values[i][mask[i]]
        if len(row):
            n = max(1, int(len(row) * k))
            out[i] = -row.sort().values[:n].mean()
    return out


def loss_score(stats: TokenStats) -> torch.Tensor:
    """Mean answer NLL (EOS included)."""
    return stats.nll_mean()


def min_k_score(stats: TokenStats, k: float = 0.4) -> torch.Tensor:
    """Min-k% (Shi et al. 2024): −mean of the lowest k fraction of gold log-probs (EOS excluded)."""
    return _lowest_k_mean(stats.gold, without_eos(stats), k)


def min_k_plus_plus_score(stats: TokenStats, k: float = 0.4) -> torch.Tensor:
    """Min-k%++ (Zhang et al. 2024): min-k over z_t = (log p(y_t) − μ_t)/σ_t, μ_t = E_p[log p], σ_t² = Var_p[log p]."""
    mu = -stats.entropy
    var = (stats.logp_sq - mu.square()).clamp(min=1e-6)
    return _lowest_k_mean((stats.gold - mu) / var.sqrt(), without_eos(stats), k)


TOKEN_DETECTORS = {"loss": loss_score, "min_k": min_k_score, "min_k_plus_plus": min_k_plus_plus_score}  # of stats alone


def answer_texts(tokenizer, examples: Sequence[EncodedQA]) -> list[str]:
    """The scored answer tokens decoded without special tokens (EOS dropped): the text open-unlearning's zlib
    detector compresses (``extract_target_texts_from_processed_data``), which differs from the raw answer string
    wherever tokenisation does not round-trip (whitespace, normalisation)."""
    return tokenizer.batch_decode([e.answer_ids for e in examples], skip_special_tokens=True)


def zlib_score(stats: TokenStats, texts: Sequence[str]) -> torch.Tensor:
    """Mean answer NLL divided by the zlib-compressed length (bytes) of the answer text (:func:`answer_texts`)."""
    sizes = torch.tensor(
        [len(zlib.compress(t.encode("utf-8"))) for t in texts], dtype=torch.float, device=stats.gold.device
    )
    return stats.nll_mean() / sizes


def _nll_without_eos(stats: TokenStats) -> torch.Tensor:
    """Per-sample mean answer NLL without EOS (the gradnorm detector's loss), differentiable."""
    mask = without_eos(stats)
    return -(stats.gold * mask).sum(1) / mask.sum(1).clamp(min=1)


class _KeepStats:
    """The gradnorm loss that also keeps the token statistics of its forward pass (materialized, no graph)."""

    def __init__(self):
        self.stats: TokenStats | None = None

    def __call__(self, model, batch: dict[str, torch.Tensor], inputs_embeds: torch.Tensor | None = None):
        stats = stats_from_logits(*forward_answer(model, batch, inputs_embeds)[:3])
        stats.index = batch["index"]
        self.stats = stats
        return _nll_without_eos(stats)

    def taken(self) -> TokenStats:
        with torch.no_grad():
            return self.stats.materialized()


def gradnorm_scores(
    model, examples: Sequence[EncodedQA], pad_id: int, batch_size: int = 32
) -> tuple[torch.Tensor, TokenStats]:
    """Per sample: mean over parameter tensors of ‖∇_w NLL‖₂, NLL the mean answer NLL without EOS; capped at 1e6.
    Also returns the token statistics of the same forward passes (rows in ``examples`` order), so the gold answers
    of the forget and holdout splits need no scoring pass of their own.

    open-unlearning computes it with one backward per sample (batch size 1); here the per-sample norms of a whole
    length-sorted batch come from one backward (:func:`margincal.model.persample.per_sample_grad_norms`, exact), with
    one backward per sample only for parameter layouts that does not cover. A CUDA out-of-memory error halves the batch.
    No parameter gradient is left behind. Without trainable parameters every score is 0.
    """
    was_training = model.training
    model.eval()
    try:
        if not any(p.requires_grad for p in model.parameters()):
            return torch.zeros(len(examples)), score_dataset(model, examples, pad_id, batch_size)
        try:
            parts = _batched_norms(model, examples, pad_id, batch_size)
        except Unsupported:
            parts = [([i], _per_sample_norms(model, collate([e], pad_id))) for i, e in enumerate(examples)]
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    order = torch.argsort(torch.tensor([i for chunk, _ in parts for i in chunk]))
    scores = torch.cat([_capped_mean(norms) for _, (norms, _) in parts])[order]
    return scores, in_input_order([(chunk, stats) for chunk, (_, stats) in parts])


def _capped_mean(norms: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` per-tensor norms → ``[B]`` mean over tensors, capped at 1e6 (0 when no tensor got a gradient)."""
    if norms.size(1) == 0:
        return torch.zeros(norms.size(0))
    return norms.mean(1).clamp(max=GRADNORM_CAP)


def _batched_norms(model, examples: Sequence[EncodedQA], pad_id: int, batch_size: int):
    """``[(example positions, (per-tensor norms [B, P], token statistics))]`` over length-sorted batches."""

    def norms(chunk: list[int]) -> tuple[torch.Tensor, TokenStats]:
        loss = _KeepStats()
        values = per_sample_grad_norms(model, collate([examples[i] for i in chunk], pad_id), loss)
        return values, loss.taken()

    return sorted_batches([len(e.prompt_ids) + len(e.answer_ids) for e in examples], batch_size, norms)


def _per_sample_norms(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, TokenStats]:
    """One sample's per-tensor gradient norms ``[1, P]`` by an ordinary backward pass, each norm reduced in float64
    (a float32 reduction over a 2M-element gradient is off by up to 2e-4 relative: measured at the 100M shape), and
    its token statistics."""
    model.zero_grad(set_to_none=True)
    loss = _KeepStats()
    with torch.enable_grad():
        loss(model, batch).sum().backward()
    norms = torch.stack([p.grad.detach().double().norm() for p in model.parameters() if p.grad is not None])
    return norms.float()[None], loss.taken()


def auc(member_scores: Sequence[float], nonmember_scores: Sequence[float]) -> float:
    """ROC AUC with members (forget) labelled 0 and non-members (holdout) labelled 1 on loss-like scores."""
    from sklearn.metrics import roc_auc_score  # 0.5 s with pandas: only when AUCs are computed

    labels = [0] * len(member_scores) + [1] * len(nonmember_scores)
    return float(roc_auc_score(labels, np.concatenate([np.asarray(member_scores), np.asarray(nonmember_scores)])))


for _detector in MIA_DETECTORS:  # the metric table's AUC rows: members vs non-members (``tofu.MiaScores``)
    _auc = functools.partial(lambda s, d: s.auc(d), d=_detector)
    _auc.__doc__ = (
        f"ROC AUC of the {_detector} membership detector telling forget (member) from holdout (non-member) samples; "
        "0.5 is chance, as a retain-only model gives."
    )
    _auc.__module__ = __name__
    metric_value(f"{_detector}_auc")(_auc)
