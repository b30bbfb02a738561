"""Tokenizers in the formats of the paper's model families, built offline (tests, and the GPU acceptance run's
real-shape checkpoints): byte-level BPE with the family's special tokens and chat template (Llama-3.x-Instruct,
Phi-3.5-mini-instruct) or BOS/EOS and no chat template (Llama-2-7b-hf). The chat templates keep the parts of the
released ones that decide the token layout."""

from tokenizers import processors
from transformers import PreTrainedTokenizerFast

from margincal.mini.models import train_bpe as _bpe

LLAMA3_CHAT = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
PHI3_CHAT = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def llama3_tokenizer(texts, vocab_size=400):
    """Llama-3.x-Instruct layout: BOS from the chat template (none added by the tokenizer), EOS = <|eot_id|>."""
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(texts, vocab_size, specials), bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    )
    fast.chat_template = LLAMA3_CHAT
    return fast


def phi3_tokenizer(texts, vocab_size=400):
    specials = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    fast = PreTrainedTokenizerFast(tokenizer_object=_bpe(texts, vocab_size, specials), eos_token="<|endoftext|>")
    fast.chat_template = PHI3_CHAT
    return fast


def llama2_tokenizer(texts, vocab_size=400):
    """Llama-2-7b-hf layout: the tokenizer adds BOS, no chat template."""
    tok = _bpe(texts, vocab_size, ["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
