"""The one place that turns (model, batch) into per-answer-token statistics.

For every answer token ``y_t`` (teacher forcing, prompt masked) it gives

* ``gold``       = log p(y_t | x, y_<t)
* ``competitor`` = max_{v != y_t} log p(v | x, y_<t)   (the strongest non-gold token)
* ``entropy``    = H(p(. | x, y_<t)) = -sum_v p_v log p_v
* ``logp_sq``    = E_p[(log p)^2] = sum_v p_v (log p_v)^2   (with ``-entropy`` = E_p[log p]: min-k++'s moments)

laid out answer-aligned: row ``i`` holds sample ``i``'s answer tokens left-aligned in ``[:, :T]`` with
``mask`` marking real tokens. Margins, diagnostics, probabilities, MIA scores and the MC hinge all consume
this layout (training code calls :func:`answer_token_stats` with gradients; evaluation calls
:func:`score_dataset` under ``no_grad``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from margincal.data.records import EncodedQA, batches, collate, padded, sorted_batches
from margincal.model.loading import is_prompt_learning
from margincal.store.costs import add_tokens


class TokenStats:
    """Answer-aligned per-token statistics, shape ``[N, T]`` each (``mask`` is bool).

    Built from logits, only ``gold`` is computed up front; ``competitor``, ``entropy`` and ``logp_sq`` are computed
    from the kept log-softmax on first access, so a loss that reads only the gold log-prob (NLL, NPO, the attacks)
    never builds the other ``[B, T, V]`` tensors or their autograd graph (GBs at a 128k vocabulary).
    """

    def __init__(
        self,
        gold: torch.Tensor,
        competitor: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        index: torch.Tensor | None = None,
        logp_sq: torch.Tensor | None = None,
        logp: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
    ):
        self.gold, self.mask = gold, mask
        self.index = index if index is not None else torch.empty(0, dtype=torch.long)
        self._fields = {"competitor": competitor, "entropy": entropy, "logp_sq": logp_sq}
        self._logp, self._targets = logp, targets  # the log-softmax [B, T, V] and gold ids the lazy fields read

    def _lazy(self, name: str) -> torch.Tensor:
        if self._fields[name] is None:
            if self._logp is None:
                raise ValueError(f"TokenStats.{name} was neither given nor derivable (no logits kept)")
            self._fields[name] = torch.where(self.mask, _FIELD_FNS[name](self._logp, self._targets), 0.0)
        return self._fields[name]

    @property
    def targets(self) -> torch.Tensor | None:
        """The gold answer ids ``[N, T]`` the statistics were computed for (kept only when built from logits)."""
        return self._targets

    @property
    def competitor(self) -> torch.Tensor:
        """max_{v != y_t} log p(v): the strongest non-gold token (ties with gold give a zero margin)."""
        return self._lazy("competitor")

    @property
    def entropy(self) -> torch.Tensor:
        """H(p) = −Σ_v p_v log p_v."""
        return self._lazy("entropy")

    @property
    def logp_sq(self) -> torch.Tensor:
        """E_p[(log p)²] = Σ_v p_v (log p_v)² (0·(−∞)² = 0)."""
        return self._lazy("logp_sq")

    def materialized(self) -> TokenStats:
        """Every field computed, detached and on the CPU, without the log-softmax (what evaluation keeps)."""
        return TokenStats(
            self.gold.detach().cpu(),
            self.competitor.detach().cpu(),
            self.entropy.detach().cpu(),
            self.mask.cpu(),
            self.index.cpu(),
            self.logp_sq.detach().cpu(),
        )

    def select(self, rows: torch.Tensor) -> TokenStats:
        """The given rows, in that order (materialized fields only)."""
        return TokenStats(
            self.gold[rows],
            self.competitor[rows],
            self.entropy[rows],
            self.mask[rows],
            self.index[rows],
            self.logp_sq[rows],
        )

    @property
    def margin(self) -> torch.Tensor:
        """m(t) = log p(y_t) - max_{v != y_t} log p(v); zero on padding."""
        return torch.where(self.mask, self.gold - self.competitor, torch.zeros_like(self.gold))

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(dim=1)

    def nll_mean(self) -> torch.Tensor:
        """Per-sample mean answer NLL N = -(1/|y|) sum_t log p(y_t)."""
        return -(self.gold * self.mask).sum(1) / self.lengths.clamp(min=1)

    def token_mean_nll(self) -> torch.Tensor:
        """Batch NLL as HF computes it: summed over all answer tokens of the batch / their count."""
        return -(self.gold * self.mask).sum() / self.mask.sum().clamp(min=1)

    def nll_sum(self) -> torch.Tensor:
        """Per-sample summed answer NLL S = -sum_t log p(y_t)."""
        return -(self.gold * self.mask).sum(1)


def answer_logits(logits: torch.Tensor, answer_start: torch.Tensor, answer_len: torch.Tensor):
    """Gather the logits that predict each answer token: position ``answer_start + t - 1`` predicts token t.

    Returns ``(logits [B, T, V], mask [B, T])`` with ``T = max(answer_len)``.
    """
    width = int(answer_len.max())
    steps = torch.arange(width, device=logits.device)
    pos = (answer_start.to(logits.device) - 1)[:, None] + steps[None, :]
    mask = steps[None, :] < answer_len.to(logits.device)[:, None]
    pos = torch.where(mask, pos, torch.zeros_like(pos))
    gathered = torch.gather(logits, 1, pos[:, :, None].expand(-1, -1, logits.size(-1)))
    return gathered, mask


def answer_targets(input_ids: torch.Tensor, answer_start: torch.Tensor, answer_len: torch.Tensor):
    """Gold answer token ids, answer-aligned ``[B, T]`` (0 on padding)."""
    width = int(answer_len.max())
    steps = torch.arange(width, device=input_ids.device)
    pos = answer_start.to(input_ids.device)[:, None] + steps[None, :]
    mask = steps[None, :] < answer_len.to(input_ids.device)[:, None]
    pos = torch.where(mask, pos, torch.zeros_like(pos))
    return torch.where(mask, torch.gather(input_ids, 1, pos), torch.zeros_like(pos))


def _competitor(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logp.scatter(-1, targets[..., None], float("-inf")).max(dim=-1).values


def _entropy(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -(logp.exp() * logp).sum(-1)


def _logp_sq(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    p = logp.exp()
    return torch.where(p > 0, p * logp.square(), torch.zeros_like(p)).sum(-1)


_FIELD_FNS = {"competitor": _competitor, "entropy": _entropy, "logp_sq": _logp_sq}


def stats_from_logits(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> TokenStats:
    """Token statistics from answer-aligned logits ``[B, T, V]`` and gold ids ``[B, T]`` (differentiable).

    ``gold`` = log p(y_t) now; the other fields from the same log-softmax when first read.
    Ties: if another token has exactly the gold logit, ``competitor == gold`` and the margin is 0.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    gold = torch.gather(logp, -1, targets[..., None]).squeeze(-1)
    return TokenStats(torch.where(mask, gold, torch.zeros_like(gold)), mask=mask, logp=logp, targets=targets)


def kl_divergence(anchor_logits: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """E_samples[(1/T) Σ_t KL(p_anc ‖ p_θ)] with KL(p‖q) = Σ_v p_v (log p_v − log q_v); ``[B, T, V]`` logits."""
    log_p = F.log_softmax(anchor_logits.float(), dim=-1)
    log_q = F.log_softmax(logits.float(), dim=-1)
    per_token = (log_p.exp() * (log_p - log_q)).sum(-1)
    per_sample = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
    return per_sample.mean()


def choice_logits(logits: torch.Tensor, targets: torch.Tensor, choices: torch.Tensor):
    """Multiple choice: answer logits ``[B, T, V]`` restricted to each row's choice tokens ``choices [B, C]`` →
    ``[B, T, C]``, and the gold token's position among them ``[B, T]``. Statistics computed from these are over the
    C letters (p_L = softmax over the letters' logits): the answer-letter margin ll_gold − max_{L≠gold} ll_L, its
    entropy and log-odds (:mod:`margincal.evaluation.wmdp`)."""
    wide = choices[:, None, :].expand(-1, logits.size(1), -1)
    restricted = logits.gather(-1, wide)
    gold = (wide == targets[..., None]).float().argmax(-1)
    return restricted, gold


def forward_answer(model, batch: dict[str, torch.Tensor], inputs_embeds: torch.Tensor | None = None):
    """One forward pass (on ``inputs_embeds`` instead of the batch's ids when given); returns ``(answer logits
    [B,T,V], targets [B,T], mask [B,T], model outputs)``; a multiple-choice batch's logits and targets are over its
    choices (:func:`choice_logits`)."""
    device = next(model.parameters()).device
    inputs = {"input_ids": batch["input_ids"].to(device)} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
    out = model(**inputs, attention_mask=batch["attention_mask"].to(device))
    logits, mask = answer_logits(out.logits, batch["answer_start"], batch["answer_len"])
    targets = answer_targets(batch["input_ids"].to(device), batch["answer_start"], batch["answer_len"])
    if "choices" in batch:
        logits, targets = choice_logits(logits, targets, batch["choices"].to(device))
    return logits, targets, mask, out


def answer_token_stats(model, batch: dict[str, torch.Tensor]) -> TokenStats:
    """Differentiable token statistics of ``model`` on ``batch`` (used inside training objectives)."""
    logits, targets, mask, _ = forward_answer(model, batch)
    stats = stats_from_logits(logits, targets, mask)
    stats.index = batch["index"]
    return stats


class LazyStats:
    """Per-stream answer logits and token statistics of one model on one step's batches, each computed once.

    Lets a method's native loss and the MC hinge share a single forward pass over the forget batch.
    """

    def __init__(self, model, batch: dict[str, dict[str, torch.Tensor]]):
        self.model = model
        self.batch = batch
        self._logits: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._stats: dict[str, TokenStats] = {}

    def answer(self, stream: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits [B,T,V], targets [B,T], mask [B,T])`` at the answer positions of ``stream``."""
        if stream not in self._logits:
            logits, targets, mask, _ = forward_answer(self.model, self.batch[stream])
            self._logits[stream] = (logits, targets, mask)
        return self._logits[stream]

    def __getitem__(self, stream: str) -> TokenStats:
        if stream not in self._stats:
            stats = stats_from_logits(*self.answer(stream))
            stats.index = self.batch[stream]["index"]
            self._stats[stream] = stats
        return self._stats[stream]


@torch.no_grad()
def score_dataset(model, examples: Sequence[EncodedQA], pad_id: int, batch_size: int = 32) -> TokenStats:
    """One batched no-grad pass over a split; rows follow ``examples`` order.

    Batches are length-sorted (less padding). Where answers share a prompt (a question's gold, paraphrased and
    perturbed answers), the prompt runs once and each answer continues from its KV cache (:func:`_shared_prompt`);
    models whose cache is not a plain per-layer key/value cache (sliding windows, prompt tuning) take full sequences.
    Multiple-choice examples (``choices``) are scored over their letters by :func:`letter_logits` (the WMDP
    evaluator's pass): one position each, the last prompt position's logits only.
    """
    if examples and examples[0].choices is not None:  # multiple choice: the letters at the one answer position
        return letter_stats(letter_logits(model, examples, pad_id, batch_size), examples)
    add_tokens(sum(len(e.prompt_ids) + len(e.answer_ids) for e in examples))
    was_training = model.training
    model.eval()
    try:
        parts = None
        if len({tuple(e.prompt_ids) for e in examples}) < len(examples) and not is_prompt_learning(model):
            parts = _shared_prompt(model, examples, pad_id, batch_size)
        if parts is None:
            lengths = [len(e.prompt_ids) + len(e.answer_ids) for e in examples]
            parts = sorted_batches(lengths, batch_size, lambda c: _stats_of(model, [examples[i] for i in c], pad_id))
    finally:
        model.train(was_training)
    return in_input_order(parts)


def letter_stats(lls: torch.Tensor, examples: Sequence[EncodedQA]) -> TokenStats:
    """Materialized statistics of multiple-choice ``examples`` at their one answer position over their letters, from
    the letters' log-likelihoods ``lls [N, C]`` (:func:`letter_logits`): the same statistics a training forward
    gives through :func:`choice_logits` (p_L = softmax over the letters; gold, strongest other letter, entropy)."""
    gold = torch.tensor([e.choices.index(e.answer_ids[0]) for e in examples])
    stats = stats_from_logits(lls[:, None, :], gold[:, None], torch.ones(len(examples), 1, dtype=torch.bool))
    stats.index = torch.tensor([e.index for e in examples])
    return stats.materialized()


@torch.no_grad()
def letter_logits(model, examples: Sequence[EncodedQA], pad_id: int, batch_size: int = 32) -> torch.Tensor:
    """``[N, C]``: each multiple-choice example's log-likelihood of each of its letters, ll_L = log p(L | prompt), in
    ``examples`` order (lm-eval's numbers). Prompts run left-padded (positions counted from each row's first real
    token) keeping only the last position's logits, so no ``[B, T, V]`` tensor is built; a prompt-tuned model (whose
    logits drop its virtual tokens) runs batches of one length, unpadded."""
    add_tokens(sum(len(e.prompt_ids) for e in examples))
    device = next(model.parameters()).device
    prompt_tuned = is_prompt_learning(model)

    def run(chunk: list[int]) -> torch.Tensor:
        ids, attn = (t.to(device) for t in padded([examples[i].prompt_ids for i in chunk], pad_id, left=True))
        if prompt_tuned:
            last = model(input_ids=ids, attention_mask=attn).logits[:, -1]
        else:
            positions = (attn.cumsum(1) - 1).clamp(min=0)
            last = model(input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=1).logits[:, -1]
        logp = torch.log_softmax(last.float(), dim=-1)
        return logp.gather(1, torch.tensor([examples[i].choices for i in chunk], device=device)).cpu()

    was_training = model.training
    model.eval()
    try:
        lengths = [len(e.prompt_ids) for e in examples]
        parts = sorted_batches(lengths, batch_size, run, same_length=prompt_tuned)
    finally:
        model.train(was_training)
    order = torch.argsort(torch.tensor([i for chunk, _ in parts for i in chunk]))
    return torch.cat([t for _, t in parts])[order]


def in_input_order(parts: Sequence[tuple[list[int], TokenStats]]) -> TokenStats:
    """Batch results ``[(example positions, stats)]`` (e.g. of length-sorted batches) as one ``TokenStats`` whose
    row ``i`` is example ``i``."""
    rows = torch.tensor([i for chunk, _ in parts for i in chunk])
    return concat_stats([s for _, s in parts]).select(torch.argsort(rows))


def _stats_of(model, examples: Sequence[EncodedQA], pad_id: int) -> TokenStats:
    """Materialized token statistics of one full-sequence batch."""
    return answer_token_stats(model, collate(examples, pad_id)).materialized()


def cache_keyword(model) -> str:
    """The keyword under which ``model``'s forward takes its KV cache and returns it on its output: ``cache`` from
    transformers 5.24, which deprecates ``past_key_values`` (a FutureWarning; removed from the forward pass in 5.40,
    from ``generate`` in 6.0); ``past_key_values`` before 5.24 and for remote-code models written before the rename.
    Read from the forward's signature (of the transformers model under a peft wrapper) rather than the version: a
    remote-code model may keep the old name, and a keyword its forward does not know would land in its ``**kwargs``
    and be ignored."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def prefill(model, ids: torch.Tensor, attn: torch.Tensor, cache=None):
    """One forward pass over left-padded prompts ``ids`` (mask ``attn``) that keeps their KV cache (into ``cache``
    when given) and the last position's logits only; positions count from 0 at each row's first real token."""
    given = {cache_keyword(model): cache} if cache is not None else {}
    positions = (attn.cumsum(1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True, logits_to_keep=1, **given)


def _shared_prompt(model, examples: Sequence[EncodedQA], pad_id: int, batch_size: int):
    """``[(example positions, stats)]`` scoring each distinct prompt once: prompts run left-padded (positions from
    0 at the first real token) and keep their KV cache; each answer then runs on its prompt's cache with positions
    continuing the prompt's, and the prompt's last logits predict the first answer token. ``None`` when the model's
    cache is not a plain key/value cache per layer."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    device = next(model.parameters()).device
    kv_name = cache_keyword(model)
    members: dict[tuple[int, ...], list[int]] = {}
    for i, e in enumerate(examples):
        members.setdefault(tuple(e.prompt_ids), []).append(i)
    prompts = sorted(members, key=len)
    parts = []
    for start in range(0, len(prompts), batch_size):
        group = prompts[start : start + batch_size]
        ids, attn = (t.to(device) for t in padded(group, pad_id, left=True))
        out = prefill(model, ids, attn)
        layers = getattr(out, kv_name).layers
        if not all(type(layer) is DynamicLayer for layer in layers):
            return None
        kv = [(layer.keys, layer.values) for layer in layers]
        first, lengths = out.logits[:, -1], attn.sum(1)
        rows = sorted(
            ((j, i) for j, p in enumerate(group) for i in members[p]), key=lambda r: len(examples[r[1]].answer_ids)
        )
        for s in range(0, len(rows), batch_size):
            chunk = rows[s : s + batch_size]
            owner = torch.tensor([j for j, _ in chunk], device=device)
            answers = [examples[i].answer_ids for _, i in chunk]
            a_ids, a_attn = (x.to(device) for x in padded(answers, pad_id))
            t, mask = a_ids.size(1), a_attn.bool()
            cache = DynamicCache([(k[owner], v[owner]) for k, v in kv])
            logits = model(
                input_ids=a_ids,
                attention_mask=torch.cat([attn[owner], a_attn], 1),
                position_ids=lengths[owner, None] + torch.arange(t, device=device),
                use_cache=True,
                **{kv_name: cache},
            ).logits
            if cache.get_seq_length() != ids.size(1) + t:  # a forward that dropped the cache scored answers unprompted
                raise RuntimeError(f"{type(model).__name__} did not extend the prompt cache passed as `{kv_name}`")
            stats = stats_from_logits(
                torch.cat([first[owner, None], logits[:, :-1]], 1), torch.where(mask, a_ids, 0), mask
            )
            stats.index = torch.tensor([examples[i].index for _, i in chunk])
            parts.append(([i for _, i in chunk], stats.materialized()))
    return parts


@torch.no_grad()
def dataset_kl(anchor, model, examples: Sequence[EncodedQA], pad_id: int, batch_size: int = 32) -> float:
    """E_{x∈D}[(1/T) Σ_t KL(p_anchor ‖ p_model)] over answer positions (the KL probe's quantity, measured)."""
    total = 0.0
    for batch in batches(examples, batch_size, pad_id):
        anchor_logits, _, mask, _ = forward_answer(anchor.eval(), batch)
        logits, _, _, _ = forward_answer(model.eval(), batch)
        total += kl_divergence(anchor_logits, logits, mask).item() * len(batch["index"])
    return total / len(examples)


def concat_stats(parts: Sequence[TokenStats]) -> TokenStats:
    """Concatenate batch results, right-padding the answer axis to a common width."""
    width = max(p.mask.size(1) for p in parts)

    def pad(t: torch.Tensor, value) -> torch.Tensor:
        return F.pad(t.detach().cpu(), (0, width - t.size(1)), value=value)

    return TokenStats(
        gold=torch.cat([pad(p.gold, 0.0) for p in parts]),
        competitor=torch.cat([pad(p.competitor, 0.0) for p in parts]),
        entropy=torch.cat([pad(p.entropy, 0.0) for p in parts]),
        mask=torch.cat([pad(p.mask, False) for p in parts]),
        index=torch.cat([p.index.cpu() for p in parts]),
        logp_sq=torch.cat([pad(p.logp_sq, 0.0) for p in parts]),
    )
