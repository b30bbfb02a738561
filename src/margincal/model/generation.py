"""Batched greedy decoding with left padding and a KV cache, finished rows leaving the batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from margincal.data.records import EncodedQA, padded, sorted_batches
from margincal.model.loading import is_prompt_learning
from margincal.model.scoring import cache_keyword, prefill
from margincal.store.costs import add_tokens


def cut(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any stop string."""
    for word in stop:
        text = text.split(word)[0]
    return text


def soft_prompt_parts(model) -> tuple[torch.nn.Module, torch.Tensor]:
    """A soft-prompted model (peft prompt tuning, bare or under :class:`margincal.training.attacks.SoftPrompted`)
    as (its transformers model, its virtual tokens' input embeddings ``[1, n_virtual, d]``): peft's forward feeds
    the model ``[virtual; embed(prompt)]``, which is what :func:`greedy_tokens` does with them as ``prefix``."""
    peft_model = getattr(model, "peft_model", model)
    return peft_model.get_base_model(), peft_model.get_prompt(batch_size=1)


@torch.no_grad()
def greedy_tokens(
    model,
    ids: torch.Tensor,
    attn: torch.Tensor,
    max_new_tokens: int,
    eos: int | None,
    pad: int,
    prefix: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy continuations of left-padded prompts ``ids`` (mask ``attn``), ``[rows, max_new_tokens]``, padded with
    ``pad`` after each row's EOS (none: every row runs to the limit). What ``model.generate(do_sample=False)``
    computes, token for token: y_t = argmax p(· | prompt, y_<t) with positions counted over the mask (a row's first
    real token at 0), one prefill (logits of the last position only) and one single-token step per new token into a
    dynamic KV cache. A row that has emitted EOS leaves the batch (``Cache.batch_select_indices``), so each step
    costs the rows still decoding, where ``generate`` carries every row until the last one stops.

    ``prefix`` (``[1, n, d]``, a soft prompt's virtual tokens: :func:`soft_prompt_parts`) is put before every row's
    padding, ``[prefix; pads; prompt]``, its positions 0..n−1 and the prompt's continuing from n: each row sees what
    peft's unpadded ``[prefix; prompt]`` gives it, so prompts of every length decode in one batch."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    keyword = cache_keyword(model)
    out = torch.full((ids.size(0), max_new_tokens), pad, dtype=torch.long, device=ids.device)
    rows = torch.arange(ids.size(0), device=ids.device)
    add_tokens(int(attn.sum()))
    if prefix is None:
        logits = prefill(model, ids, attn, cache).logits[:, -1]
    else:
        embeds = model.get_input_embeddings()(ids)
        embeds = torch.cat([prefix.to(embeds.dtype).expand(ids.size(0), -1, -1), embeds], dim=1)
        attn = torch.cat([attn.new_ones(ids.size(0), prefix.size(1)), attn], dim=1)
        positions = attn.cumsum(1) - 1
        logits = model(
            inputs_embeds=embeds,
            attention_mask=attn,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{keyword: cache},
        ).logits[:, -1]
    for step in range(max_new_tokens):
        token = logits.argmax(-1)
        out[rows, step] = token
        add_tokens(token.numel())
        going = token != eos if eos is not None else torch.ones_like(token, dtype=torch.bool)
        if step == max_new_tokens - 1 or not going.any():
            break
        if not going.all():
            keep = going.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, token, attn = rows[keep], token[keep], attn[keep]
        attn = torch.cat([attn, attn.new_ones(attn.size(0), 1)], dim=1)
        positions = attn.sum(-1, keepdim=True) - 1
        step_inputs = dict(attention_mask=attn, position_ids=positions, use_cache=True)
        logits = model(input_ids=token[:, None], **step_inputs, **{keyword: cache}).logits[:, -1]
    return out


@torch.no_grad()
def generate_answers(
    model,
    tokenizer,
    examples: Sequence[EncodedQA],
    max_new_tokens: int,
    batch_size: int = 512,
    stop: Sequence[str] = (),
) -> list[str]:
    """Greedy answers to the prompts of ``examples`` (the exact prompt tokens used for scoring), each cut at the
    first of the ``stop`` strings (MUSE's stop words). Prompts are batched by length (less left padding) and the
    answers returned in ``examples`` order; each batch decodes through :func:`greedy_tokens` (finished rows leave the
    batch); a soft-prompted model decodes its transformers model with the virtual tokens as every row's prefix
    (:func:`soft_prompt_parts`; peft's own ``generate`` ignores position ids, so it could only batch prompts of one
    length). A CUDA out-of-memory error halves the batch."""
    device = next(model.parameters()).device
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    decoder, prefix = soft_prompt_parts(model) if is_prompt_learning(model) else (model, None)

    def decode(chunk: list[int]) -> list[str]:
        ids, attn = padded([examples[i].generation_prompt for i in chunk], pad, left=True)
        tokens = greedy_tokens(decoder, ids.to(device), attn.to(device), max_new_tokens, eos, pad, prefix)
        return [cut(t, stop).strip() for t in tokenizer.batch_decode(tokens, skip_special_tokens=True)]

    outputs: list[str] = [""] * len(examples)
    lengths = [len(e.generation_prompt) for e in examples]
    for chunk, texts in sorted_batches(lengths, batch_size, decode):
        for i, text in zip(chunk, texts, strict=True):
            outputs[i] = text
    model.train(was_training)
    return outputs
