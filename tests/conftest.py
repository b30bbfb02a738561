"""Shared fixtures: a tiny tokenizer/model built in-process (no mini benchmark needed) for unit tests."""

import pytest

from margincal.data.records import QARecord, encode_qa
from margincal.models import MiniArch, new_mini_model, train_mini_tokenizer

RECORDS = [
    QARecord("Where was Ann Bel born?", "Ann Bel was born in Port Ivo."),
    QARecord("What does Ann Bel write?", "Ann Bel writes sea novels."),
    QARecord("Where was Cid Dor born?", "Cid Dor was born in Vale Ume."),
    QARecord("What does Cid Dor write?", "Cid Dor writes war poems."),
]
TINY = MiniArch(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    texts = [t for r in RECORDS for t in (r.question, r.answer)]
    return train_mini_tokenizer(texts * 5, TINY.vocab_size)


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return new_mini_model(TINY, tiny_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_examples(tiny_tokenizer):
    return encode_qa(tiny_tokenizer, RECORDS, max_length=64)
