"""Prompt templates: how a question (with optional few-shot pairs) and its answer become token ids.

The ``chat`` and ``tags`` modes reproduce open-unlearning's ``preprocess_chat_instance`` (src/data/utils.py, commit
d3d7cf9) with the ``template_args`` of its model configs (``configs/templates/*.yaml`` restate them), so scores are
comparable with numbers produced there:

* ``chat`` (``apply_chat_template: True``): the conversation ``[system] + (user, assistant)* + (user, assistant)``
  is rendered by the tokenizer's chat template (``date_string`` passed through); the prompt is the same
  conversation without the last answer, with the generation prompt.
* ``tags`` (``apply_chat_template: False``): ``system_prompt_with_special_tokens + (user_start q user_end
  asst_start a asst_end)* + user_start q user_end asst_start`` is the prompt, tokenised with the tokenizer's
  special tokens (BOS); the full text is prompt + answer.

In both, the answer tokens are the full sequence after the first ``len(prompt)`` tokens, with EOS appended unless
the sequence already ends with it; generation starts from the separately tokenised prompt (they differ only where
tokenisation merges across the boundary, e.g. a trailing space, which open-unlearning handles the same way).

``separate`` is margincal's mode for the mini benchmark: prompt and ``" " + answer + EOS`` are tokenised separately
(the prompt through the tokenizer's chat template, which it must have), so the answer boundary is exact. A template
that renders through the chat template is refused for a tokenizer without one (:func:`check_template`), never
replaced by other prompts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

from margincal.config.files import build_file, read_yaml, shipped
from margincal.core.errors import InputError

MODES = ("chat", "tags", "separate")


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """open-unlearning's ``template_args`` plus a ``mode`` (``chat`` | ``tags`` | ``separate``)."""

    name: str = "separate"
    mode: str = "separate"
    system_prompt: str | None = None  # chat: a leading system turn
    date_string: str | None = None  # chat: passed to the chat template (Llama-3's "Today Date")
    system_prompt_with_special_tokens: str | None = None  # tags: literal text before the first turn
    user_start_tag: str = "Question: "
    user_end_tag: str = "\n"
    asst_start_tag: str = "Answer: "
    asst_end_tag: str = "\n\n"

    def __post_init__(self):
        if self.mode not in MODES:
            raise InputError(f"template {self.name!r}: unknown mode {self.mode!r}; use one of {MODES}")


@functools.cache
def load_template(name_or_path: str | Path) -> PromptTemplate:
    """A shipped template (``configs/templates/<name>.yaml``) or a YAML file with the same fields (read once per
    process: detection runs on every encode of a tokenizer that carries no template)."""
    path = shipped("templates", name_or_path, "prompt template")
    return build_file(PromptTemplate, {"name": path.stem, **read_yaml(path)}, path)


def detect_template(tokenizer) -> PromptTemplate:
    """The template open-unlearning uses for this tokenizer's family, recognised from its chat template: Llama-3
    headers → ``llama3``; Phi-3 ``<|end|>`` turns → ``phi3``; the mini tokenizer → ``mini``; no chat template (a base
    model such as Llama-2-7b-hf) → ``qa``; any other chat template → ``chat`` (no system prompt)."""
    chat = getattr(tokenizer, "chat_template", None) or ""
    if not chat:
        return load_template("qa")
    if "<|start_header_id|>" in chat:
        return load_template("llama3")
    if "<|assistant|>" in chat and "<|end|>" in chat:
        return load_template("phi3")
    if "<|eot|>" in chat and "<|assistant|>" in chat:
        return load_template("mini")
    return load_template("chat")


def renders_through_chat_template(template: PromptTemplate) -> bool:
    """Whether the template's prompts are rendered by the tokenizer's own chat template (``chat`` and ``separate``;
    ``tags`` writes its prompts from the template's fields alone)."""
    return template.mode in ("chat", "separate")


def check_template(tokenizer, template: PromptTemplate, source: str) -> None:
    """A template that renders through the tokenizer's chat template needs one: without it prompts would silently
    fall back to other text (the ``Question:/Answer:`` blocks), so the load stops here with what to do."""
    if renders_through_chat_template(template) and not getattr(tokenizer, "chat_template", None):
        raise InputError(
            f"template {template.name!r} renders prompts through the tokenizer's chat template, and {source} has none "
            "(no chat_template.jinja or tokenizer_config.json chat_template): save the tokenizer with its chat "
            "template, or give --template qa for Question/Answer prompts"
        )


def template_identity(tokenizer) -> dict[str, str | None]:
    """What a model's prompts depend on, named in every result and card: the template (name, mode) and, where it
    renders through the tokenizer's chat template, a digest of that template (None where it does not)."""
    import hashlib

    template = template_of(tokenizer)
    chat = getattr(tokenizer, "chat_template", None) if renders_through_chat_template(template) else None
    if isinstance(chat, dict):  # several named chat templates: all of them
        chat = repr(sorted(chat.items()))
    return {
        "name": template.name,
        "mode": template.mode,
        "chat_template": hashlib.sha256(chat.encode()).hexdigest()[:12] if chat else None,
    }


def describe_template(identity: dict) -> str:
    """One template identity in words: ``llama3 (chat template 1a2b3c4d5e6f)``."""
    chat = identity.get("chat_template")
    return f"{identity.get('name')} ({'chat template ' + chat if chat else identity.get('mode') + ' mode'})"


def template_of(tokenizer) -> PromptTemplate:
    """The template attached by :func:`margincal.model.loading.load_tokenizer`, else the detected one."""
    return getattr(tokenizer, "margincal_template", None) or detect_template(tokenizer)


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return tokenizer(text, add_special_tokens=special)["input_ids"]


def _chat(template: PromptTemplate, turns: Sequence[tuple[str, str]]) -> list[dict]:
    chat = [{"role": "system", "content": template.system_prompt}] if template.system_prompt else []
    for question, answer in turns:
        chat += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return chat


def _render(tokenizer, template: PromptTemplate, chat: list[dict], generation_prompt: bool) -> str:
    extra = {"date_string": template.date_string} if template.date_string is not None else {}
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt, **extra)


def encode_pair(
    tokenizer, template: PromptTemplate, question: str, answer: str, shots: Sequence[tuple[str, str]] = ()
) -> tuple[list[int], list[int], list[int]]:
    """``(context_ids, answer_ids, generation_prompt_ids)`` of one example: ``context_ids + answer_ids`` is the
    teacher-forced sequence whose answer positions are scored; generation starts from ``generation_prompt_ids``."""
    eos = tokenizer.eos_token_id
    check_template(tokenizer, template, getattr(tokenizer, "name_or_path", None) or "the tokenizer")
    if template.mode == "separate":
        chat = [m for q, a in shots for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
        prompt = _render(tokenizer, template, chat + [{"role": "user", "content": question}], True)
        prompt_ids = _ids(tokenizer, prompt, False)
        answer_ids = _ids(tokenizer, " " + answer.strip(), False) + ([eos] if eos is not None else [])
        return prompt_ids, answer_ids, prompt_ids
    if template.mode == "chat":
        chat = _chat(template, [*shots, (question, answer)])
        full = _ids(tokenizer, _render(tokenizer, template, chat, False), False)
        prompt_ids = _ids(tokenizer, _render(tokenizer, template, chat[:-1], True), False)
    else:
        t = template
        prompt = (t.system_prompt_with_special_tokens or "") + "".join(
            t.user_start_tag + q + t.user_end_tag + t.asst_start_tag + a + t.asst_end_tag for q, a in shots
        )
        prompt += t.user_start_tag + question + t.user_end_tag + t.asst_start_tag
        full = _ids(tokenizer, prompt + answer, True)
        prompt_ids = _ids(tokenizer, prompt, True)
    if eos is not None and full[-1] != eos:
        full = full + [eos]
    cut = len(prompt_ids)
    return full[:cut], full[cut:], prompt_ids
