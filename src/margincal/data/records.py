"""QA records, chat formatting with answer-only labels, and batch collation.

Every benchmark (TOFU, MUSE, the mini benchmark) is reduced to lists of :class:`QARecord`. Prompts are built
by the tokenizer's :class:`~margincal.data.templates.PromptTemplate` (open-unlearning's formatting for the real
models); the answer tokens follow the prompt and are the only labelled positions (prompt positions get label
``-100``). Raw passages (MUSE news) are encoded as text, every token after the first scored.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from margincal.core.errors import InputError
from margincal.data.lengths import bounded, check_fits, interruptible, longest_token
from margincal.data.templates import encode_pair, template_of

IGNORE_INDEX = -100


@dataclass(frozen=True)
class QARecord:
    """One question/answer pair.

    ``paraphrased_answer`` and ``perturbed_answers`` feed the truth-ratio metric; ``meta`` holds free-form
    provenance (author id, template id, ...).
    """

    question: str
    answer: str
    paraphrased_answer: str | None = None
    perturbed_answers: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class EncodedQA:
    """Token ids of one formatted example: ``prompt_ids + answer_ids`` is the teacher-forced sequence (answer
    positions scored); generation starts from ``generation_ids`` when set (see :mod:`margincal.data.templates`),
    else from ``prompt_ids``. A multiple-choice question (:func:`margincal.evaluation.wmdp.encode_choices`) has one
    answer token, the correct letter's, and ``choices``, the four letters' token ids at that position: its
    statistics are over those letters only (:func:`margincal.model.scoring.choice_logits`)."""

    index: int
    prompt_ids: list[int]
    answer_ids: list[int]
    generation_ids: list[int] | None = None
    choices: list[int] | None = None

    @property
    def generation_prompt(self) -> list[int]:
        return self.generation_ids if self.generation_ids is not None else self.prompt_ids


def check_distinct(records: Sequence[QARecord], where: str) -> None:
    """Stop when two forget records ask the same question (a raw passage: hold the same text): D_rel and the
    held-out set would share it, and a relearn attack would be scored on what it trained on. Compared after
    trimming surrounding whitespace; the message names both rows."""
    seen: dict[str, int] = {}
    for i, record in enumerate(records):
        key = record.question.strip() or f"\0{record.answer.strip()}"
        if key in seen:
            text = (record.question or record.answer).strip()
            raise InputError(
                f"{where}: rows {seen[key]} and {i} hold the same {'question' if record.question.strip() else 'text'} "
                f"({text[:60]!r}); a forget set's records must be distinct (D_rel and the held-out set would share "
                "it): remove the repeats"
            )
        seen[key] = i


def is_completion(record: QARecord) -> bool:
    """A prefix/continuation record (a ``{"prompt": ..., "gt": ...}`` row: MUSE verbmem), its prefix the question."""
    return record.meta.get("kind") == "completion"


CHOICE_LETTERS = ("A", "B", "C", "D")  # lm-eval's doc_to_choice for MMLU and WMDP


def choice_prompt(question: str, choices: Sequence[str]) -> str:
    """lm-eval's ``doc_to_text`` of MMLU and WMDP (``tasks/wmdp/_default_template_yaml``, 0.4.13):
    ``{{question.strip()}}\nA. {{choices[0]}}\nB. …\nD. {{choices[3]}}\nAnswer:``."""
    lines = [question.strip(), *(f"{letter}. {c}" for letter, c in zip(CHOICE_LETTERS, choices, strict=True))]
    return "\n".join([*lines, "Answer:"])


def is_choice(record: QARecord) -> bool:
    """A four-choice question (a ``{"question", "choices", "answer": index}`` row: WMDP, MMLU): its question is the
    rendered :func:`choice_prompt`, its answer the correct letter."""
    return record.meta.get("kind") == "choice"


def is_passage(record: QARecord) -> bool:
    """A raw-text record (a ``{"text": ...}`` row: MUSE news passages), scored or trained on as plain text."""
    return record.meta.get("kind") == "passage"


def evaluated_fields(record: QARecord) -> tuple:
    """What an evaluation reads of a record: its question and answers, and of its meta the facts it states
    (``content``: fact recall) and whether it is a passage (its other meta is provenance)."""
    facts = record.meta.get("content")
    return (
        record.question,
        record.answer,
        record.paraphrased_answer,
        record.perturbed_answers,
        facts,
        is_passage(record),
    )


def encode_qa(
    tokenizer,
    records: Sequence[QARecord],
    max_length: int,
    answer_field: str = "answer",
    shots: Sequence[QARecord] = (),
    template=None,
    too_long: str = "error",
) -> list[EncodedQA]:
    """Tokenise records with the tokenizer's prompt template (:func:`margincal.data.templates.template_of`, or
    ``template``); ``shots`` are few-shot pairs placed before every question (MUSE's ICL prompts).

    ``answer_field`` selects which text is scored as the answer (``answer`` or ``paraphrased_answer``). An example
    longer than ``max_length`` stops with a clear error (one whose characters cannot fit before it is tokenised,
    :func:`~margincal.data.lengths.check_fits`), or is left out when ``too_long="skip"`` (sampled training
    corpora such as the Alpaca probe; the result may then be shorter, even empty); ``EncodedQA.index`` is the
    record's position in ``records``.
    """
    if not records:
        raise InputError("encode_qa: the split is empty; nothing to score or train on")
    template = template or template_of(tokenizer)
    pairs = [(r.question, r.answer) for r in shots]
    longest = longest_token(tokenizer)
    out: list[EncodedQA] = []
    for i, rec in enumerate(records):
        answer = getattr(rec, answer_field)
        if answer is None:
            raise InputError(f"record {i} has no {answer_field!r}")
        if too_long != "skip":  # refused before tokenising when its characters cannot fit (data.lengths)
            check_fits([("question", rec.question), (answer_field, answer)], max_length, longest, f"record {i}")
        prompt_ids, answer_ids, generation_ids = encode_pair(tokenizer, template, rec.question, answer, pairs)
        total = len(prompt_ids) + len(answer_ids)
        if total > max_length or not answer_ids:
            if too_long == "skip":
                continue
            why = "has no answer token after its prompt" if not answer_ids else f"is {total} tokens long"
            raise InputError(
                f"record {i} {why} (prompt {len(prompt_ids)} + answer {len(answer_ids)}, max_length={max_length}, "
                f"template {template.name!r}); raise max_length or shorten the example: {rec.question[:60]!r}"
            )
        gen = None if generation_ids == prompt_ids else generation_ids
        out.append(EncodedQA(index=i, prompt_ids=prompt_ids, answer_ids=answer_ids, generation_ids=gen))
    return out


def encode_completions(
    tokenizer, prefixes: Sequence[str], texts: Sequence[str], max_length: int, insert_space: bool = False
) -> list[EncodedQA]:
    """Prefix/continuation pairs as open-unlearning's ``preprocess_pretraining_instance`` makes them (its
    ``CompletionDataset``, MUSE verbmem): ``prefix + (" " if insert_space else "") + text`` tokenised with the
    tokenizer's special tokens (BOS) and truncated to ``len(prefix ids) + max_length`` tokens (a long text cut first
    to a head with the same tokens, :func:`~margincal.data.lengths.bounded`); every token after the
    prefix's length is scored (never the first position), and generation starts from the prefix tokenised alone."""
    if not texts:
        raise InputError("encode_completions: no passages")
    longest = longest_token(tokenizer)
    out = []
    for i, (prefix, text) in enumerate(zip(prefixes, texts, strict=True)):
        prefix_ids = tokenizer(prefix, add_special_tokens=True)["input_ids"]
        joined = prefix + (" " if insert_space else "") + text
        joined = bounded(tokenizer, joined, len(prefix_ids) + max_length, longest, add_special_tokens=True)
        ids = tokenizer(joined, add_special_tokens=True)["input_ids"][: len(prefix_ids) + max_length]
        cut = max(len(prefix_ids), 1)
        if len(ids) <= cut:
            raise InputError(f"passage {i} has no token to score")
        generation = None if ids[:cut] == prefix_ids else prefix_ids
        out.append(EncodedQA(index=i, prompt_ids=ids[:cut], answer_ids=ids[cut:], generation_ids=generation))
    return out


def encode_text(tokenizer, texts: Sequence[str], max_length: int) -> list[EncodedQA]:
    """Raw passages for likelihood scoring and training: :func:`encode_completions` with empty prefixes (the
    passage after BOS, truncated to ``max_length`` tokens, every token but the first position scored)."""
    return encode_completions(tokenizer, [""] * len(texts), texts, max_length)


#: The most characters of a raw-text corpus tokenised in one call (4 Mi: a few hundred MiB of tokenizer memory). A
#: corpus joined within it is tokenised whole, exactly as open-unlearning does; a larger one (a 40 MB document) in
#: consecutive blocks, so memory stays bounded whatever one document holds; a block boundary may tokenise one word
#: otherwise than the whole text would (one word per 4 Mi characters).
CORPUS_BLOCK_CHARS = 4 * 2**20


def corpus_blocks(texts: Sequence[str], size: int = CORPUS_BLOCK_CHARS) -> Iterator[str]:
    """The passages joined by blank lines, as consecutive blocks of at most ``size`` characters whose concatenation
    is the joined text: a block ends after a whole passage (and its separator) where one fits, and a passage longer
    than ``size`` is cut after its last white space within the bound (at the bound where it has none)."""
    block = ""
    for i, text in enumerate(texts):
        text = text + ("\n\n" if i < len(texts) - 1 else "")
        if block and len(block) + len(text) > size:
            yield block
            block = ""
        while len(text) > size:
            cut = max(text.rfind(" ", 0, size), text.rfind("\n", 0, size)) + 1 or size
            yield text[:cut]
            text = text[cut:]
        block += text
    if block:
        yield block


def chunk_passages(tokenizer, texts: Sequence[str], max_length: int) -> list[str]:
    """open-unlearning's ``PretrainingDataset`` chunking (MUSE raw forget/retain corpora): the passages joined by
    blank lines, tokenised (in a worker thread, so a signal stops it: :func:`~margincal.data.lengths.interruptible`;
    at most :data:`CORPUS_BLOCK_CHARS` characters per call, :func:`corpus_blocks`), cut into ``max_length``-token
    pieces and decoded back to text (empty pieces dropped)."""
    pieces: list[str] = []
    pending: list[int] = []
    for block in corpus_blocks(texts, CORPUS_BLOCK_CHARS):
        pending += interruptible(lambda block=block: tokenizer(block, add_special_tokens=False)["input_ids"])
        full = len(pending) - len(pending) % max_length
        pieces += [tokenizer.decode(pending[i : i + max_length]) for i in range(0, full, max_length)]
        pending = pending[full:]
    if pending:
        pieces.append(tokenizer.decode(pending))
    return [p for p in pieces if p.strip()]


def encode_records(tokenizer, records: Sequence[QARecord], max_length: int, too_long: str = "error") -> list[EncodedQA]:
    """Training examples of a split: QA records through :func:`encode_qa`, a raw-text corpus (every record a
    passage) chunked and encoded as text (how open-unlearning trains on MUSE's raw news)."""
    if records and all(is_passage(r) for r in records):
        return encode_text(tokenizer, chunk_passages(tokenizer, [r.answer for r in records], max_length), max_length)
    if any(is_passage(r) for r in records):
        raise InputError("a split mixes raw-text passages with QA records")
    return encode_qa(tokenizer, records, max_length, too_long=too_long)


def collate(examples: Sequence[EncodedQA], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch with answer-only labels.

    Returns ``input_ids``, ``attention_mask``, ``labels`` (``-100`` outside answers), ``answer_start``
    (position of the first answer token in each row), ``answer_len`` and ``index`` (record indices).
    """
    input_ids, attention = padded([e.prompt_ids + e.answer_ids for e in examples], pad_id)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for row, ex in enumerate(examples):
        labels[row, len(ex.prompt_ids) : len(ex.prompt_ids) + len(ex.answer_ids)] = torch.tensor(ex.answer_ids)
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "labels": labels,
        "answer_start": torch.tensor([len(e.prompt_ids) for e in examples]),
        "answer_len": torch.tensor([len(e.answer_ids) for e in examples]),
        "index": torch.tensor([e.index for e in examples]),
    }
    with_choices = [e.choices is not None for e in examples]
    if any(with_choices):
        if not all(with_choices):
            raise ValueError("a batch mixes multiple-choice questions with other examples")
        batch["choices"] = torch.tensor([e.choices for e in examples])
    return batch


R = TypeVar("R")


def seeded_subset(items: Sequence[R], n: int | None, seed: int) -> list[R]:
    """At most ``n`` of ``items`` (all when ``n`` is None or not below their number): the positions
    ``random.Random(seed).sample`` draws, kept in the items' own order. The one rule for a seeded subset of records
    (monitor samples, the Δ check's records, a benchmark's retain subset); the polish pool keeps its draw's order,
    which is its training order (:func:`margincal.mc.polish.polish_pool`)."""
    if n is None or len(items) <= n:
        return list(items)
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), n))]


def sorted_batches(
    lengths: Sequence[int], batch_size: int, run: Callable[[list[int]], R], same_length: bool = False
) -> list[tuple[list[int], R]]:
    """``run(chunk)`` over the indices of ``lengths`` in increasing length, ``batch_size`` at a time (less padding;
    none with ``same_length``, where a chunk holds one length only); a CUDA out-of-memory error halves the batch and
    retries the chunk. Returns ``(chunk, result)`` in run order."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    done: list[tuple[list[int], R]] = []
    start = 0
    while start < len(order):
        chunk = order[start : start + batch_size]
        if same_length:
            chunk = [i for i in chunk if lengths[i] == lengths[chunk[0]]]
        try:
            done.append((chunk, run(chunk)))
        except torch.cuda.OutOfMemoryError:
            if batch_size == 1:
                raise
            batch_size //= 2
            torch.cuda.empty_cache()
            continue
        start += len(chunk)
    return done


def padded(seqs: Sequence[Sequence[int]], pad_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``seqs`` padded with ``pad_id`` to the longest: on the right, or on the
    left (``left``: every sequence right-aligned, as prompts to continue are)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        span = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[row, span] = torch.tensor(seq, dtype=torch.long)
        attn[row, span] = 1
    return ids, attn


def batches(examples: Sequence[EncodedQA], batch_size: int, pad_id: int) -> Iterator[dict[str, torch.Tensor]]:
    """Ordered, non-shuffled batches (for scoring and evaluation)."""
    for start in range(0, len(examples), batch_size):
        yield collate(examples[start : start + batch_size], pad_id)


def cycle(examples: Sequence[EncodedQA], batch_size: int, pad_id: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless shuffled batches; reshuffled each epoch from a seeded generator (training streams)."""
    if not examples:
        raise InputError("cannot train on an empty split")
    rng = random.Random(seed)
    order = list(range(len(examples)))
    while True:
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            if len(chunk) < batch_size and len(order) >= batch_size:
                break  # drop the ragged tail so every step sees the same batch size
            yield collate([examples[i] for i in chunk], pad_id)
