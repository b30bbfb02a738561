"""Texts bounded before they are tokenised, and tokenisation that a signal can stop.

A token is at most :func:`longest_token` characters long (the longest string in the tokenizer's vocabulary, an upper
bound on the characters any one token decodes to), so a text of ``c`` characters is at least ``c / longest`` tokens.
Where a benchmark's protocol refuses an example longer than ``max_length`` tokens (TOFU-format QA,
:func:`margincal.data.records.encode_qa`), :func:`check_fits` refuses one whose characters already exceed
``max_length × longest``, before any tokenising. Where the protocol truncates (open-unlearning's completions and
passages keep the first ``max_length`` tokens; lm-eval's multiple choice keeps a context's last ``max_length``),
:func:`bounded` cuts the text to a head (or tail) whose kept tokens are those of the whole text: cut at ``(n + 16) ×
longest`` characters and doubled until the kept ``n`` ids agree between the cut and twice the cut. A megabyte-long
question is then tokenised in a few kilobytes, in milliseconds.

:func:`interruptible` runs one long tokenizer call (a whole corpus joined, as open-unlearning chunks MUSE's raw text)
in a worker thread, so SIGTERM and Ctrl-C stop the command within a second, not when the call returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from margincal.core.errors import InputError

T = TypeVar("T")
MARGIN_TOKENS = 16  # tokens' worth of characters cut beyond the last kept token


def longest_token(tokenizer) -> int:
    """The most characters one token of ``tokenizer`` stands for: its vocabulary's longest entry (byte-level and
    SentencePiece entries are never shorter than what they decode to)."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def check_fits(texts: Sequence[tuple[str, str]], max_length: int, longest: int, where: str) -> None:
    """Refuse, before tokenising, texts ``(field, text)`` of one example whose characters cannot fit ``max_length``
    tokens: more than ``max_length × longest`` (:func:`longest_token`) of them in all. The message names ``where``
    (the record) and the longest field."""
    most = max_length * longest
    total = sum(len(text) for _, text in texts)
    if total > most:
        field, text = max(texts, key=lambda item: len(item[1]))
        raise InputError(
            f"{where}: its {field} is {len(text):,} characters ({total:,} in all), more than max_length={max_length} "
            f"tokens can hold with this tokenizer (at most {most:,} characters); shorten the example"
        )


def bounded(tokenizer, text: str, n: int, longest: int, tail: bool = False, **kwargs) -> str:
    """A head of ``text`` (its last part where ``tail``: lm-eval's left truncation) whose first (last) ``n`` token ids,
    tokenised with ``kwargs``, are those of the whole text: ``text`` itself when it is short, else the shortest cut
    of ``(n + MARGIN_TOKENS) × longest × 2^j`` characters (``longest``: :func:`longest_token`) whose kept ids equal
    those of the cut twice as long."""
    cut = (n + MARGIN_TOKENS) * longest

    def kept(length: int) -> list[int]:
        ids = tokenizer(text[-length:] if tail else text[:length], **kwargs)["input_ids"]
        return ids[-n:] if tail else ids[:n]

    while 2 * cut < len(text):
        if kept(cut) == kept(2 * cut):
            return text[-cut:] if tail else text[:cut]
        cut *= 2
    return text


def interruptible(call: Callable[[], T]) -> T:
    """``call()`` run in a daemon thread while this thread waits in short slices: a signal handler (SIGTERM, Ctrl-C)
    runs within 0.1 s and its exception leaves here; the abandoned call ends with the process. Exceptions of
    ``call`` are raised here."""
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as err:  # re-raised in the waiting thread
            result["error"] = err

    worker = threading.Thread(target=run, daemon=True, name="margincal-tokenize")
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["value"]  # type: ignore[return-value]
