"""Loading and saving models/tokenizers (HF id or local path), LoRA merge, and the mini model factory.

Real checkpoints load with ``AutoModelForCausalLM`` from safetensors only and never with
``trust_remote_code`` unless asked. The mini model is a small ``LlamaForCausalLM`` with a BPE tokenizer
trained by ``tokenizers`` on the generated corpus and wrapped as a ``PreTrainedTokenizerFast`` with a
chat template, so after building it goes through exactly the same loading code as a hub model.
"""

from __future__ import annotations

import copy
import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

MINI_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|> {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}<|assistant|> {{ message['content'] }}<|eot|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MINI_SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eot|>", "<|user|>", "<|assistant|>"]


class ModelNotFoundError(FileNotFoundError):
    """A model path or hub id could not be loaded."""


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def _resolve_name(name_or_path: str | Path) -> str:
    """A path-looking name must exist locally; anything else is passed on as a hub id."""
    name = str(name_or_path)
    local = Path(name).expanduser()
    if local.exists():
        return str(local)
    if isinstance(name_or_path, Path) or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"model directory not found: {local}")
    from margincal.hub import require_hub

    require_hub(
        name,
        f"Download it where the hub is reachable (huggingface-cli download {name} --local-dir DIR) and pass DIR "
        "instead: as --model DIR, or as the target/references entry of the model family YAML.",
    )
    return name


def attention_backend(requested: str, dtype: torch.dtype | str, device: str) -> str:
    """``auto``: FlashAttention-2 on CUDA in bf16/fp16 when ``flash_attn`` is installed, else PyTorch SDPA (which
    picks its own flash/memory-efficient kernels on GPU); any other value is passed to transformers as is."""
    if requested != "auto":
        return requested
    import importlib.util

    half = dtype in (torch.bfloat16, torch.float16)
    if str(device).startswith("cuda") and half and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def load_model(
    name_or_path: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
    attn_implementation: str = "auto",
    device_map: str | dict | None = None,
) -> torch.nn.Module:
    """Load a causal LM from a local directory or HF hub id (safetensors only), in eval mode.

    ``device_map="auto"`` spreads the layers over every visible GPU through accelerate (a model that does not fit
    one GPU; ``device`` is then ignored); otherwise the whole model goes to ``device``.
    """
    from transformers import AutoModelForCausalLM

    name = _resolve_name(name_or_path)
    torch_dtype = _resolve_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            name,
            dtype=torch_dtype,
            trust_remote_code=trust_remote_code,
            use_safetensors=True,
            attn_implementation=attention_backend(attn_implementation, torch_dtype, device),
            device_map=device_map,
        )
    except OSError as err:
        raise ModelNotFoundError(
            f"could not load model {name!r} ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
            "If the hub is unreachable, download the checkpoint where it is reachable (huggingface-cli download "
            f"{name} --local-dir DIR) and pass DIR instead: as --model DIR, or as the target/references entry of "
            "the model family YAML."
        ) from err
    return (model if device_map is not None else model.to(device)).eval()


def load_tokenizer(name_or_path: str | Path, template: str | Path | None = None, trust_remote_code: bool = False):
    """Load a tokenizer; sets ``pad_token`` to EOS when the checkpoint defines none, and attaches the prompt
    template every encoder uses (``template``: a shipped name or YAML path; None: detected from the tokenizer,
    :func:`margincal.data.templates.detect_template`)."""
    from transformers import AutoTokenizer

    from margincal.data.templates import detect_template, load_template

    name = _resolve_name(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise ModelNotFoundError(
            f"could not load tokenizer {name!r}: {str(err).splitlines()[0]}. If the hub is unreachable, download the "
            "checkpoint elsewhere and pass its local directory instead."
        ) from err
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.margincal_template = load_template(template) if template else detect_template(tok)
    return tok


def save_model(model: torch.nn.Module, tokenizer, path: str | Path) -> Path:
    """Atomically save model (safetensors) and tokenizer: write to a temp dir, then rename into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def merge_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Fold a peft LoRA adapter into the base weights (no-op for plain models). The merged model is a plain model
    whose weights require grad again, as a loaded one (peft froze them), so gradient-based metrics work on it."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return model
    merged = model.merge_and_unload()
    for p in merged.parameters():
        p.requires_grad_(True)
    return merged


def load_checkpoint(
    path: str | Path, base: str | Path | None = None, dtype: str = "float32", device: str = "cpu", **options
) -> torch.nn.Module:
    """A saved model, or a saved LoRA adapter (``adapter_config.json``) loaded onto ``base`` and merged (evaluation
    and generation then run at the base model's speed); ``options`` go to :func:`load_model`."""
    path = Path(path)
    if not (path / "adapter_config.json").exists():
        return load_model(path, dtype, device, **options)
    if base is None:
        raise ValueError(f"{path} holds a LoRA adapter; pass the model it was trained on as base")
    from peft import PeftModel

    return merge_lora(PeftModel.from_pretrained(load_model(base, dtype, device, **options), path)).eval()


def clone_model(model: torch.nn.Module) -> torch.nn.Module:
    """An independent deep copy (used to keep θ0 while unlearning a copy)."""
    return copy.deepcopy(model)


# ---------------------------------------------------------------------------------------------- mini


@dataclass(frozen=True)
class MiniArch:
    """Shape of the mini Llama (a few hundred thousand to a few million parameters)."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    max_position_embeddings: int = 128


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` with ``special_tokens`` first in the vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def train_mini_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE trained on ``texts``, wrapped as ``PreTrainedTokenizerFast`` with a chat template."""
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(texts, vocab_size, MINI_SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eot|>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    fast.chat_template = MINI_CHAT_TEMPLATE
    return fast


def new_mini_model(arch: MiniArch, tokenizer, seed: int) -> torch.nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` of the mini shape (tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_heads,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()
