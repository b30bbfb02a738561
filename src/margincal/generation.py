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
    first of the ``stop`` strings (MUSE's stop words). Prompts are batched by length (less left padding) and the
    answers returned in ``examples`` order; ``generate`` stops a batch once every row has emitted EOS. A CUDA
    out-of-memory error halves the batch."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].generation_prompt))
    outputs: list[str] = [""] * len(examples)
    start = 0
    while start < len(order):
        chunk = order[start : start + batch_size]
        width = max(len(examples[i].generation_prompt) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            prompt = examples[i].generation_prompt
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attn[row, width - len(prompt) :] = 1
        try:
            gen = model.generate(
                input_ids=ids.to(device),
                attention_mask=attn.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=tokenizer.eos_token_id,
                use_cache=True,
            )
        except torch.cuda.OutOfMemoryError:
            if batch_size == 1:
                raise
            batch_size = max(1, batch_size // 2)
            torch.cuda.empty_cache()
            continue
        texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        for i, text in zip(chunk, texts, strict=True):
            outputs[i] = cut(text, stop).strip()
        start += len(chunk)
    model.train(was_training)
    return outputs
