"""Our calls into transformers must not use an API it has deprecated: a deprecated argument is a removal scheduled
for a coming release (transformers 5.24 renamed the KV cache argument ``past_key_values`` to ``cache``: removed from
the forward pass in 5.40, from ``generate`` in 6.0), which a fresh install would pick up. Each test runs our scoring
and generation calls on the tiny model with deprecation warnings as errors; transformers' own deprecation notices
that go through its logger (``warning_once``, e.g. the output's ``past_key_values`` attribute) fail too."""

import contextlib
import logging
import warnings
from dataclasses import replace

import pytest
import torch
from conftest import RECORDS

from margincal.data.records import encode_qa
from margincal.model.generation import generate_answers
from margincal.model.loading import clone_model
from margincal.model.scoring import _shared_prompt, score_dataset
from margincal.training.attacks import SoftPrompted


@contextlib.contextmanager
def no_deprecations():
    """FutureWarning and DeprecationWarning raise; a transformers log record that says "deprecated" fails."""
    from transformers.utils import logging as hf_logging

    notices: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "deprecat" in record.getMessage().lower():
                notices.append(record.getMessage())

    hf_logging.warning_once.cache_clear()  # a notice another test already logged would otherwise stay silent
    handler, logger = Catch(), logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            yield
    finally:
        logger.removeHandler(handler)
    assert not notices, notices


def shared_prompt_examples(tokenizer):
    """Answers sharing prompts (so scoring takes the KV-cache path) over prompts of several lengths (so batched
    generation left-pads)."""
    records = [replace(r, question=r.question + " born" * i) for i, r in enumerate(RECORDS)]
    examples = encode_qa(tokenizer, records, 64)
    return examples, examples + encode_qa(tokenizer, [replace(r, answer=r.answer[::-1]) for r in records], 64)


def lora(model):
    from peft import LoraConfig, TaskType, get_peft_model

    return get_peft_model(clone_model(model), LoraConfig(task_type=TaskType.CAUSAL_LM, r=2, target_modules=["q_proj"]))


def soft_prompted(model):
    from peft import PromptTuningConfig, PromptTuningInit, TaskType, get_peft_model

    spec = PromptTuningConfig(
        task_type=TaskType.CAUSAL_LM, num_virtual_tokens=2, prompt_tuning_init=PromptTuningInit.RANDOM
    )
    return SoftPrompted(get_peft_model(clone_model(model), spec), 2)


@pytest.mark.parametrize("wrap", [None, lora], ids=["plain", "lora"])
def test_shared_prompt_scoring_and_static_cache_generation_use_no_deprecated_api(tiny_model, tiny_tokenizer, wrap):
    model = wrap(tiny_model) if wrap else tiny_model  # built outside the check: peft's own calls are not ours
    prompts, shared = shared_prompt_examples(tiny_tokenizer)
    pad = tiny_tokenizer.pad_token_id
    with no_deprecations(), torch.no_grad():
        assert _shared_prompt(model.eval(), shared, pad, 4) is not None  # the cache path, not the fallback
        score_dataset(model, shared, pad, batch_size=4)
        generate_answers(model, tiny_tokenizer, prompts, 4, batch_size=4)


def test_soft_prompt_generation_uses_no_deprecated_api(tiny_model, tiny_tokenizer):
    """A soft-prompted model decodes with transformers' own dynamic cache (our call passes ``None``)."""
    model = soft_prompted(tiny_model)
    prompts, shared = shared_prompt_examples(tiny_tokenizer)
    with no_deprecations(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Position ids are not supported", UserWarning)  # peft, prompt tuning
        score_dataset(model, shared, tiny_tokenizer.pad_token_id, batch_size=4)
        generate_answers(model, tiny_tokenizer, prompts, 4, batch_size=4)
