"""MC's loss terms at the torch level, for margincal's own polish and any other training loop (paper Sec. 3.4).

    L_forget(θ) = E_{D_f}[ Σ_t w_t (1/κ) softplus(κ (m_θ(t) − m_mar(t))) ],  w_t = 1/T by default       (Eq. 4)
    L_KL(θ)     = E_{x∈D_a}[ (1/T) Σ_t KL(p_anc(·|x, y_<t) ‖ p_θ(·|x, y_<t)) ]                               (Eq. 5)

Nothing here knows margincal's pipeline: the hinge reads the model's answer-token statistics on a forget batch
(:class:`margincal.model.scoring.TokenStats`) and the anchor's per-token tables for that batch's records; the KL reads
answer logits. :func:`margincal.mc.polish.mc_objective` (the pipeline's polish) and
:class:`margincal.integrations.hf.MCMixin` (any Hugging Face ``Trainer``) both compute the terms here
(:func:`forget_hinge`, :func:`probe_kl`) and assemble Eq. 6 by :func:`mc_loss`.

An **anchor table** holds the frozen anchor's per-token ``margin``, ``entropy`` and ``gold`` log-probability on the
forget records, each ``[max index + 1, T]`` indexed by record index (:func:`anchor_tables`). As a file
(:class:`AnchorTable`, written by ``margincal anchors``) it also holds the answer token ids and states the tokenizer
and prompt template it was made with, so a trainer elsewhere needs no live reference model and a table made with
another tokenizer or template fails on load or on the first mismatching batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from margincal.core.artifacts import TABLE_FORMAT, atomic_path
from margincal.core.errors import InputError
from margincal.core.inputs import checked, path_kind
from margincal.data.records import IGNORE_INDEX, EncodedQA
from margincal.model.scoring import TokenStats, forward_answer, kl_divergence, score_dataset, stats_from_logits

TABLES = ("margin", "entropy", "gold")


def uniform_weights(mask: torch.Tensor) -> torch.Tensor:
    """w_t = 1/T on each row's T answer tokens, 0 on padding."""
    mask = mask.float()
    return mask / mask.sum(1, keepdim=True).clamp(min=1)


def token_weights(kind: str, stats: TokenStats, anchor: dict[str, torch.Tensor], top: int = 8) -> torch.Tensor:
    """Per-token hinge weights ``[B, T]`` (zero on padding); ``anchor`` holds the anchor's tables for the batch:
    ``uniform`` 1/T, ``soft_entropy`` the stop-grad softmax of the model's entropies, ``top8`` 1/8 on the anchor's 8
    highest-entropy positions, ``ref_gate`` (1 − p_anc(y_t))/T."""
    mask = stats.mask
    if kind == "uniform":
        return uniform_weights(mask)
    if kind == "soft_entropy":
        scores = stats.entropy.detach().masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=1).masked_fill(~mask, 0.0)
    if kind == "top8":
        scores = anchor["entropy"].masked_fill(~mask, float("-inf"))
        k = min(top, scores.size(1))
        chosen = torch.zeros_like(scores).scatter(1, scores.topk(k, dim=1).indices, 1.0) * mask
        return chosen / chosen.sum(1, keepdim=True).clamp(min=1)
    if kind == "ref_gate":
        return (1 - anchor["gold"].exp()) * uniform_weights(mask)
    raise InputError(f"unknown token_weights {kind!r}; use uniform, soft_entropy, top8 or ref_gate")


def hinge_loss(margins: torch.Tensor, anchor: torch.Tensor, weights: torch.Tensor, kappa: float) -> torch.Tensor:
    """E_samples[Σ_t w_t (1/κ) softplus(κ (m(t) − m_mar(t)))] over answer-aligned ``[B, T]`` tensors.

    With ``weights = uniform_weights(mask)`` this is Eq. 4's (1/T) Σ_t; the retain hinge passes the arguments
    swapped (anchor margins first), penalising margins that fall below the anchor's."""
    per_token = F.softplus(kappa * (margins - anchor)) / kappa
    return (per_token * weights).sum(1).mean()


def anchor_rows(tables: dict[str, torch.Tensor], index: torch.Tensor, width: int, device) -> dict[str, torch.Tensor]:
    """The tables' rows of records ``index``, cut to the batch's answer width ``width``."""
    return {name: t[index.to(t.device), :width].to(device) for name, t in tables.items() if name in TABLES}


def forget_hinge(
    stats: TokenStats, tables: dict[str, torch.Tensor], kappa: float, weights: str = "uniform"
) -> torch.Tensor:
    """Eq. 4 on one forget batch: ``stats`` the model's differentiable answer-token statistics (``stats.index``
    the records' indices), ``tables`` the anchor's tables (:func:`anchor_tables`)."""
    rows = anchor_rows(tables, stats.index, stats.mask.size(1), stats.gold.device)
    return hinge_loss(stats.margin, rows["margin"], token_weights(weights, stats, rows), kappa)


def retain_hinge(stats: TokenStats, tables: dict[str, torch.Tensor], kappa: float) -> torch.Tensor:
    """The retain-side hinge on one retain batch, E_{D_r}[(1/T) Σ_t (1/κ) softplus(κ (m_anc(t) − m_θ(t)))], at the
    anchor's retain ``tables``: it penalises retain margins that fall below the anchor's."""
    rows = anchor_rows(tables, stats.index, stats.mask.size(1), stats.gold.device)
    return hinge_loss(rows["margin"], stats.margin, uniform_weights(stats.mask), kappa)


def probe_kl(model: torch.nn.Module, anchor: torch.nn.Module, probe: dict[str, torch.Tensor]) -> torch.Tensor:
    """Eq. 5 on one probe batch: (1/T) Σ_t KL(p_anc(·|x, y_<t) ‖ p_θ(·|x, y_<t)) over its answer positions, the
    frozen anchor's logits under ``no_grad``."""
    logits, _, mask, _ = forward_answer(model, probe)
    with torch.no_grad():
        anchor_logits, _, _, _ = forward_answer(anchor, probe)
    return kl_divergence(anchor_logits, logits, mask)


FORGET_TERMS = ("hinge", "ascent")  # MC's forget term: Eq. 4's hinge, or the GradAscent polish's −NLL_f


def mc_loss(
    native: torch.Tensor, terms: dict[str, torch.Tensor], kl_weight: float, retain_hinge_weight: float = 0.0
) -> torch.Tensor:
    """Eq. 6 assembled, the one place it is: L_native + L_forget + λ_KL · L_KL (+ λ_r · L_retain-hinge). ``terms``
    holds the forget term under its name (one of :data:`FORGET_TERMS`) and ``kl`` (:func:`probe_kl`) and
    ``retain_hinge`` (:func:`retain_hinge`) when they are on."""
    forget = [name for name in FORGET_TERMS if name in terms]
    if len(forget) != 1 or set(terms) - {*FORGET_TERMS, "kl", "retain_hinge"}:
        raise InputError(f"MC's terms are one of {FORGET_TERMS} with kl and retain_hinge optional, got {sorted(terms)}")
    loss = native + terms[forget[0]]
    if "kl" in terms:
        loss = loss + kl_weight * terms["kl"]
    if "retain_hinge" in terms:
        loss = loss + retain_hinge_weight * terms["retain_hinge"]
    return loss


def answer_span(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(answer_start, answer_len)`` per row of Hugging Face causal-LM ``labels`` (``-100`` outside the answer):
    the scored tokens must be one contiguous span per row."""
    scored = labels != IGNORE_INDEX
    length = scored.sum(1)
    if bool((length == 0).any()):
        raise ValueError("a batch row has no scored token (labels all -100): nothing to take a margin of")
    start = scored.int().argmax(1)
    span = torch.arange(labels.size(1), device=labels.device)[None, :]
    if not bool((scored == ((span >= start[:, None]) & (span < (start + length)[:, None]))).all()):
        raise ValueError("the labels' scored tokens are not one contiguous answer span per row (a QA batch is needed)")
    return start, length


def batch_stats(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> TokenStats:
    """Differentiable answer-token statistics of ``model`` on a batch with ``input_ids``, ``attention_mask`` and
    either margincal's ``answer_start``/``answer_len`` or Hugging Face ``labels``; ``index`` (record indices, the
    anchor table's rows) is carried over. One forward pass."""
    if "answer_start" not in batch:
        start, length = answer_span(batch["labels"])
        batch = {**batch, "answer_start": start, "answer_len": length}
    logits, targets, mask, _ = forward_answer(model, batch)
    stats = stats_from_logits(logits, targets, mask)
    if "index" not in batch:
        raise ValueError("the forget batch has no 'index' (record indices into the anchor table)")
    stats.index = batch["index"]
    return stats


def _examples_digest(examples: Sequence[EncodedQA]) -> str:
    h = hashlib.sha256()
    for e in examples:  # a multiple-choice example's statistics are over its choices: they are part of it
        h.update(repr((e.index, e.prompt_ids, e.answer_ids) + ((e.choices,) if e.choices else ())).encode())
    return h.hexdigest()[:16]


def anchor_tables(
    anchor: torch.nn.Module,
    anchor_id: str,
    examples: Sequence[EncodedQA],
    pad_id: int,
    cache_dir: Path | None = None,
) -> dict[str, torch.Tensor]:
    """The frozen anchor's per-token margin, entropy and gold log-prob, each a table ``[max_index + 1, T]``
    indexed by record index. Cached under ``cache_dir/anchors/<sha(anchor_id, tokens)>.safetensors``."""
    key = hashlib.sha256(f"v2|{anchor_id}|{_examples_digest(examples)}".encode()).hexdigest()[:20]
    path = cache_dir / "anchors" / f"{key}.safetensors" if cache_dir is not None else None
    if path is not None and path.exists():
        return load_file(str(path))
    stats = score_dataset(anchor, examples, pad_id)
    tables = {}
    for name, values in zip(TABLES, (stats.margin, stats.entropy, stats.gold), strict=True):
        table = torch.zeros(int(stats.index.max()) + 1, stats.mask.size(1))
        table[stats.index] = values
        tables[name] = table.contiguous()
    if path is not None:  # a temporary name per call: workers computing the same table never share one
        with atomic_path(path) as tmp:
            save_file(tables, str(tmp))
    return tables


def tokenizer_identity(tokenizer) -> dict[str, str]:
    """What an anchor table's token positions depend on: the tokenizer's name, vocabulary size and a digest of its
    vocabulary and special tokens."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted(map(str, tokenizer.all_special_tokens))
    blob = json.dumps([vocab, special], ensure_ascii=False).encode()
    return {
        "tokenizer": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "vocab_size": str(len(vocab)),
        "tokenizer_digest": hashlib.sha256(blob).hexdigest()[:16],
    }


@dataclasses.dataclass
class AnchorTable:
    """An anchor table as a file: ``tables`` (:data:`TABLES`, ``[N, T]``), ``tokens`` (the answer token ids each
    row was scored on, ``-100`` past the answer) and ``meta`` (format, tokenizer identity, template, the anchor and
    the forget file it was made from)."""

    tables: dict[str, torch.Tensor]
    tokens: torch.Tensor
    meta: dict[str, str]

    @classmethod
    def build(cls, anchor, examples: Sequence[EncodedQA], tokenizer, template: str, **meta: str) -> AnchorTable:
        """Score ``examples`` (the forget records encoded with ``template``) with ``anchor``."""
        tables = anchor_tables(anchor, "", examples, tokenizer.pad_token_id)
        tokens = torch.full_like(tables["margin"], IGNORE_INDEX, dtype=torch.long)
        for e in examples:
            tokens[e.index, : len(e.answer_ids)] = torch.tensor(e.answer_ids)
        info = {"format": TABLE_FORMAT, "template": template, **tokenizer_identity(tokenizer), **meta}
        return cls(tables, tokens, info)

    def save(self, path: str | Path) -> Path:
        """Written atomically as safetensors (the metadata in its header)."""
        path = Path(path)
        with atomic_path(path) as tmp:
            save_file({**self.tables, "tokens": self.tokens}, str(tmp), metadata=self.meta)
        return path

    @classmethod
    def load(cls, path: str | Path, tokenizer=None) -> AnchorTable:
        """Read a table; with ``tokenizer``, refuse one made with another tokenizer (vocabulary digest)."""
        path = Path(path)
        if path_kind(path) == "missing":
            raise FileNotFoundError(f"no anchor table at {path}; make one with `margincal anchors`")
        checked(path, "the anchor table", "file", "a .safetensors anchor table made by `margincal anchors`")
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != TABLE_FORMAT:
            raise InputError(
                f"{path} is not a margincal anchor table (format {meta.get('format')!r}, want "
                f"{TABLE_FORMAT!r}); make one with `margincal anchors`"
            )
        data = load_file(str(path))
        table = cls({k: data[k] for k in TABLES}, data["tokens"], meta)
        if tokenizer is not None:
            mine = tokenizer_identity(tokenizer)
            if mine["tokenizer_digest"] != meta["tokenizer_digest"]:
                raise InputError(
                    f"{path} was made with tokenizer {meta['tokenizer']!r} (vocabulary {meta['vocab_size']}, digest "
                    f"{meta['tokenizer_digest']}), not this one ({mine['tokenizer']!r}, {mine['vocab_size']}, "
                    f"{mine['tokenizer_digest']}): remake it with `margincal anchors` and this model's tokenizer"
                )
        return table

    def check(self, stats: TokenStats) -> None:
        """Stop unless the batch's answer tokens are the ones the table's rows were scored on (same records, same
        tokenizer and template)."""
        index = stats.index.to(self.tokens.device)
        if int(index.max()) >= self.tokens.size(0) or stats.mask.size(1) > self.tokens.size(1):
            raise InputError(
                f"the forget batch reaches record {int(index.max())} or {stats.mask.size(1)} answer "
                f"tokens; the anchor table has {self.tokens.size(0)} records of ≤ {self.tokens.size(1)} "
                "tokens: it was made from another forget file"
            )
        want = self.tokens[index, : stats.mask.size(1)]
        got = torch.where(stats.mask.cpu(), stats.targets.cpu(), IGNORE_INDEX)
        if not torch.equal(want, got):
            bad = int(index[(want != got).any(1)][0])
            raise InputError(
                f"record {bad}'s answer tokens differ from the anchor table's (made with template "
                f"{self.meta.get('template')!r}, tokenizer {self.meta.get('tokenizer')!r}): encode the forget set "
                "the way the table was made, or remake the table with `margincal anchors`"
            )
