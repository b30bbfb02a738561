"""Prompt templates reproduce open-unlearning's formatting token for token (src/data/utils.py, d3d7cf9)."""

import pytest

from margincal.data.records import (
    QARecord,
    chunk_passages,
    encode_completions,
    encode_qa,
    encode_records,
    encode_text,
)
from margincal.data.templates import detect_template, load_template
from margincal.data.tofu import record_from_row
from margincal.mini.formats import llama2_tokenizer, llama3_tokenizer, phi3_tokenizer
from margincal.model.loading import load_tokenizer

TEXTS = ["Where was Ann Bel born?", "Ann Bel was born in Port Ivo.", "Question: Answer: assistant user system"] * 20
REC = QARecord("Where was Ann Bel born?", "Ann Bel was born in Port Ivo.")
SHOT = QARecord("Who is Cid?", "A poet.")


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def test_llama3_chat_layout_matches_open_unlearning():
    tok = llama3_tokenizer(TEXTS)
    assert detect_template(tok).name == "llama3"
    [ex] = encode_qa(tok, [REC], 256)
    assert _decode(tok, ex.prompt_ids) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 10 Apr 2025\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhere was Ann Bel born?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # the answer is the content (no leading space) closed by <|eot_id|> = EOS, nothing appended twice
    assert _decode(tok, ex.answer_ids) == "Ann Bel was born in Port Ivo.<|eot_id|>"
    assert ex.generation_ids is None  # prompt is a token prefix of the full conversation
    [shot] = encode_qa(tok, [REC], 256, shots=[SHOT])
    assert "user<|end_header_id|>\n\nWho is Cid?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA poet." in (
        _decode(tok, shot.prompt_ids)
    )


def test_phi3_chat_layout_keeps_the_trailing_eos():
    tok = phi3_tokenizer(TEXTS)
    assert detect_template(tok).name == "phi3"
    [ex] = encode_qa(tok, [REC], 256)
    assert _decode(tok, ex.prompt_ids) == (
        "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nWhere was Ann Bel born?<|end|>\n<|assistant|>\n"
    )
    assert _decode(tok, ex.answer_ids) == "Ann Bel was born in Port Ivo.<|end|>\n<|endoftext|>"


def test_llama2_tags_layout_with_bos_shots_and_the_trailing_space_quirk():
    tok = llama2_tokenizer(TEXTS)
    assert detect_template(tok).name == "qa"
    [ex] = encode_qa(tok, [REC], 256, shots=[SHOT])
    full = _decode(tok, ex.prompt_ids + ex.answer_ids)
    assert full == (
        "<s>Question: Who is Cid?\nAnswer: A poet.\n\n"
        "Question: Where was Ann Bel born?\nAnswer: Ann Bel was born in Port Ivo.</s>"
    )
    # "Answer: " alone ends in a lone space token; in the full text the space merges into the answer's first word.
    # open-unlearning cuts the full sequence at len(prompt) and generates from the separately tokenised prompt.
    assert ex.generation_ids is not None and len(ex.generation_ids) == len(ex.prompt_ids)
    assert _decode(tok, ex.generation_ids).endswith("Answer: ")
    # ... so the answer's first word lands in the scored context, exactly as open-unlearning's labels have it
    assert _decode(tok, ex.prompt_ids).endswith("Answer: Ann")
    assert _decode(tok, ex.answer_ids) == " Bel was born in Port Ivo.</s>"


def test_mini_template_is_unchanged_and_explicit_templates_override(tiny_tokenizer, tmp_path):
    assert detect_template(tiny_tokenizer).name == "mini"
    [ex] = encode_qa(tiny_tokenizer, [REC], 64)
    assert _decode(tiny_tokenizer, ex.prompt_ids) == "<|user|> Where was Ann Bel born?\n<|assistant|>"
    assert _decode(tiny_tokenizer, ex.answer_ids) == " Ann Bel was born in Port Ivo.<|eot|>"
    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok", template="qa")
    [qa] = encode_qa(tok, [REC], 64)
    assert _decode(tok, qa.prompt_ids + qa.answer_ids) == (
        "Question: Where was Ann Bel born?\nAnswer: Ann Bel was born in Port Ivo.<|eot|>"
    )
    with pytest.raises(ValueError, match="unknown prompt template 'llama9'.*llama3"):
        load_template("llama9")
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: chat\nsystem: hi\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: unknown config key\(s\) \[.system.\] in PromptTemplate"):
        load_template(bad)


def test_passages_score_every_token_after_bos_and_chunk_like_open_unlearning():
    tok = llama2_tokenizer(TEXTS)
    [ex] = encode_text(tok, ["Ann Bel was born in Port Ivo."], max_length=4)
    assert _decode(tok, ex.prompt_ids) == "<s>" and len(ex.answer_ids) == 4  # BOS + max_length tokens
    text = ["Ann Bel was born in Port Ivo.", "Where was Ann Bel born?"]
    ids = tok("\n\n".join(text), add_special_tokens=False)["input_ids"]
    chunks = chunk_passages(tok, text, max_length=5)
    assert len(chunks) == -(-len(ids) // 5) and "".join(chunks) == "\n\n".join(text)
    passages = [QARecord("", t, meta={"kind": "passage"}) for t in text]
    encoded = encode_records(tok, passages, max_length=5)
    assert [len(e.prompt_ids + e.answer_ids) for e in encoded] <= [6] * len(encoded)
    with pytest.raises(ValueError, match="mixes raw-text passages"):
        encode_records(tok, passages + [REC], 64)


def test_verbmem_completions_are_encoded_as_open_unlearning_does():
    """open-unlearning's CompletionDataset (insert_space): the sequence is BOS + tokens of "prefix continuation",
    truncated to len(prefix ids) + max_length; the positions after the prefix's length are scored and generation
    starts from the prefix's own tokens (here the same ones: the prefix ends at a word)."""
    tok = llama2_tokenizer(TEXTS)
    prefix, text = "Ann Bel was born", "in Port Ivo."
    full = tok("Ann Bel was born in Port Ivo.", add_special_tokens=True)["input_ids"]
    alone = tok(prefix, add_special_tokens=True)["input_ids"]
    assert full[: len(alone)] == alone  # what the test relies on: the prefix's tokens start the full sequence
    [ex] = encode_completions(tok, [prefix], [text], max_length=64, insert_space=True)
    assert ex.prompt_ids == alone and ex.answer_ids == full[len(alone) :] and ex.generation_prompt == alone
    assert _decode(tok, ex.answer_ids).strip() == text  # the ground truth open-unlearning decodes
    [cut] = encode_completions(tok, [prefix], [text], max_length=2, insert_space=True)
    assert cut.answer_ids == full[len(alone) : len(alone) + 2]
    [glued] = encode_completions(tok, [prefix], [text], max_length=64)  # no space: "bornin Port Ivo."
    assert glued.prompt_ids + glued.answer_ids == tok("Ann Bel was bornin Port Ivo.")["input_ids"]
    assert record_from_row({"prompt": prefix, "gt": text}, "row").meta == {"kind": "completion"}


def test_too_long_examples_stop_or_are_skipped(tiny_tokenizer):
    long = QARecord("Where was Ann Bel born?", "Ann Bel was born in Port Ivo. " * 10)
    with pytest.raises(ValueError, match="record 1 is .* tokens long"):
        encode_qa(tiny_tokenizer, [REC, long], 40)
    kept = encode_qa(tiny_tokenizer, [REC, long, REC], 40, too_long="skip")
    assert [e.index for e in kept] == [0, 2]
