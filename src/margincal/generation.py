"""Batched greedy decoding with left padding and the KV cache (``model.generate``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from margincal.data.records import EncodedQA


def cut(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any stop string."""
    for word in stop:
        text = text.split(word)[0]
    return text


@torch.no_grad()
def generate_answers(
    model,
    tokenizer,
    examples: Sequence[EncodedQA],
    max_new_tokens: int,
    batch_size: int = 32,
    stop: Sequence[str] = (),
) -> list[str]:
    """Greedy answers to the prompts of ``examples`` (the exact prompt tokens used for scoring), each cut at the
    first of the ``stop`` strings (MUSE's stop words)."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    outputs: list[str] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        width = max(len(e.generation_prompt) for e in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, e in enumerate(chunk):
            prompt = e.generation_prompt
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attn[row, width - len(prompt) :] = 1
        gen = model.generate(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=True,
        )
        outputs += [cut(s, stop).strip() for s in tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)]
    model.train(was_training)
    return outputs
