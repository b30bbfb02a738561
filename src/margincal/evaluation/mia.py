"""Membership-inference scores and AUCs: loss, min-k, min-k++, zlib, gradnorm (members = forget, non-members = holdout).

Source: open-unlearning ``src/evals/metrics/mia/{loss,min_k,min_k_plus_plus,zlib,gradnorm,utils}.py`` and
``privacy.py`` (commit d3d7cf9). Every score is loss-like (higher = less likely a member) and the AUC is
``roc_auc_score`` with forget labelled 0 and holdout 1, so AUC → 1 when the forget answers are far more likely
than the holdout answers. The gradient norm is capped at 1e6 (paper Sec. 4.1).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from margincal.data.records import EncodedQA, collate
from margincal.evaluation.metrics import without_eos
from margincal.scoring import TokenStats, answer_token_stats

DETECTORS = ("loss", "min_k", "min_k_plus_plus", "zlib", "gradnorm")
GRADNORM_CAP = 1e6


def _lowest_k_mean(values: torch.Tensor, mask: torch.Tensor, k: float) -> torch.Tensor:
    """Per row: −mean of the lowest max(1, ⌊k·n⌋) of the n masked values (0 for an empty row)."""
    out = torch.zeros(values.size(0))
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


def answer_texts(tokenizer, examples: Sequence[EncodedQA]) -> list[str]:
    """The scored answer tokens decoded without special tokens (EOS dropped): the text open-unlearning's zlib
    detector compresses (``extract_target_texts_from_processed_data``), which differs from the raw answer string
    wherever tokenisation does not round-trip (whitespace, normalisation)."""
    return tokenizer.batch_decode([e.answer_ids for e in examples], skip_special_tokens=True)


def zlib_score(stats: TokenStats, texts: Sequence[str]) -> torch.Tensor:
    """Mean answer NLL divided by the zlib-compressed length (bytes) of the answer text (:func:`answer_texts`)."""
    sizes = torch.tensor([len(zlib.compress(t.encode("utf-8"))) for t in texts], dtype=torch.float)
    return stats.nll_mean() / sizes


def gradnorm_scores(model, examples: Sequence[EncodedQA], pad_id: int) -> torch.Tensor:
    """Per sample: mean over parameter tensors of ‖∇_w NLL‖₂, NLL the mean answer NLL without EOS; capped at 1e6.

    One backward per sample (open-unlearning's batch size 1); gradients are cleared before and after.
    """
    was_training = model.training
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    scores = []
    for example in examples:
        model.zero_grad(set_to_none=True)
        stats = answer_token_stats(model, collate([example], pad_id))
        mask = without_eos(stats)
        nll = -(stats.gold * mask).sum() / mask.sum().clamp(min=1)
        nll.backward()
        norms = [p.grad.detach().float().norm() for p in params if p.grad is not None]
        scores.append(min(float(torch.stack(norms).mean()), GRADNORM_CAP) if norms else 0.0)
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return torch.tensor(scores)


def auc(member_scores: Sequence[float], nonmember_scores: Sequence[float]) -> float:
    """ROC AUC with members (forget) labelled 0 and non-members (holdout) labelled 1 on loss-like scores."""
    labels = [0] * len(member_scores) + [1] * len(nonmember_scores)
    return float(roc_auc_score(labels, np.concatenate([np.asarray(member_scores), np.asarray(nonmember_scores)])))


def advantage(aucs: dict[str, float]) -> float:
    """Membership advantage: mean over detectors of |AUC_i − 0.5| (per detector first, so reversals don't cancel)."""
    return float(np.mean([abs(a - 0.5) for a in aucs.values()]))


def privleak(model_auc: float, reference_auc: float = 0.5) -> float:
    """PrivLeak (%) = ((1 − AUC) − (1 − AUC_ref)) / (1 − AUC_ref) · 100 on the min-k AUC; ≈ 0 is ideal, negative
    means the forget set is still more separable than for θ_ref (open-unlearning ``privacy.privleak``)."""
    score, ref = 1 - model_auc, 1 - reference_auc
    return (score - ref) / (ref + 1e-10) * 100
