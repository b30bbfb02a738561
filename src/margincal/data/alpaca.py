"""Auxiliary training corpora sampled from a large pool: the KL-probe corpus D_a (Alpaca) and ILU's environment.

The paper requires D_a disjoint from D_f ∪ D_r (Sec. 3.4, Lemma "KL bounded"). :func:`overlapping` makes that
checkable: a probe example overlaps when its prompt equals a forget/retain question or when it shares a word
``n``-gram (lower-cased words, ``n = 8`` by default, the contamination test of Brown et al. 2020 scaled down to short
QA) with any forget/retain question or answer. :func:`sample_corpus` draws a seeded subset of ``n`` examples that
fit ``max_length`` (a long Alpaca answer is skipped, not truncated) and, for the probe, are disjoint; it reports
what it left out so the count is visible in the cell record.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence

from margincal.core.errors import InputError
from margincal.data.records import EncodedQA, QARecord, encode_qa
from margincal.data.templates import template_of

WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


class OverlapIndex:
    """Word n-grams and normalised questions of D_f ∪ D_r, to test probe examples against."""

    def __init__(self, records: Iterable[QARecord], n: int = 8):
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        self.questions: set[str] = set()
        for r in records:
            self.grams |= ngrams(r.question, n) | ngrams(r.answer, n)
            if r.question.strip():
                self.questions.add(" ".join(_words(r.question)))

    def overlaps(self, record: QARecord) -> bool:
        if " ".join(_words(record.question)) in self.questions:
            return True
        return not self.grams.isdisjoint(ngrams(record.question, self.n) | ngrams(record.answer, self.n))


def overlapping(probe: Sequence[QARecord], excluded: Iterable[QARecord], n: int = 8) -> list[int]:
    """Indices of ``probe`` examples that overlap ``excluded`` (D_f ∪ D_r)."""
    index = OverlapIndex(excluded, n)
    return [i for i, r in enumerate(probe) if index.overlaps(r)]


def sample_corpus(
    tokenizer,
    records: Sequence[QARecord],
    n: int | None,
    max_length: int,
    excluded: Iterable[QARecord] | None = None,
    seed: int = 0,
    ngram: int = 8,
) -> tuple[list[EncodedQA], dict]:
    """A seeded subset of ``n`` encodable examples (all when ``n`` is None), disjoint from ``excluded`` when given.

    Candidates are visited in a seeded random order and kept until ``n`` are found; the report counts the
    candidates seen, those left out as overlapping or too long, and those kept.
    """
    template = template_of(tokenizer)  # resolved once for the whole walk
    index = OverlapIndex(excluded, ngram) if excluded is not None else None
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    target = len(records) if n is None else n
    kept: list[EncodedQA] = []
    report = {"pool": len(records), "seen": 0, "overlapping": 0, "too_long": 0, "kept": 0, "ngram": ngram}
    for i in order:
        if len(kept) == target:
            break
        report["seen"] += 1
        if index is not None and index.overlaps(records[i]):
            report["overlapping"] += 1
            continue
        encoded = encode_qa(tokenizer, [records[i]], max_length, template=template, too_long="skip")
        if not encoded:
            report["too_long"] += 1
            continue
        encoded[0].index = i
        kept.append(encoded[0])
    report["kept"] = len(kept)
    if not kept:
        raise InputError(f"no usable example in a pool of {len(records)} (report: {report})")
    kept.sort(key=lambda e: e.index)
    return kept, report
