"""Loading and saving models/tokenizers (HF id or local path), and LoRA merge.

Real checkpoints load with ``AutoModelForCausalLM`` from safetensors only and never with
``trust_remote_code`` unless asked.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelNotFoundError(FileNotFoundError):
    """A model path or hub id could not be loaded."""


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def _resolve_name(name_or_path: str | Path) -> str:
    """A path-looking name must exist locally (a stage directory that margincal wrote stands for its ``model/``);
    anything else is passed on as a hub id."""
    name = str(name_or_path)
    local = Path(name).expanduser()
    if (local / "stage.json").is_file() and (local / "model").is_dir():  # a stage directory: its model
        return str(local / "model")
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


def _hub_args(name: str) -> tuple[str, dict]:
    """A loader's name and keyword arguments: a hub id's ``@revision`` becomes ``revision=`` (a local path as is)."""
    if Path(name).exists():
        return name, {}
    from margincal.hub import split_revision

    repo, revision = split_revision(name)
    return repo, ({"revision": revision} if revision else {})


def check_checkpoint(name_or_path: str | Path) -> None:
    """Every safetensors file of a local checkpoint (or LoRA adapter) opens: its header parses and its tensors fill
    the file. A truncated or corrupt file stops here, naming it, before any model is loaded; a hub id is checked
    by the hub when it downloads."""
    from safetensors import SafetensorError, safe_open

    local = Path(_resolve_name(name_or_path))
    if not local.is_dir():
        return
    for path in sorted(local.glob("*.safetensors")):
        try:
            with safe_open(path, "pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{path} is not a readable safetensors file ({err}); download or save it again") from None


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
    """Load a causal LM from a local directory or HF hub id (``org/model@revision`` pins a revision; safetensors
    only), in eval mode.

    ``device_map="auto"`` spreads the layers over every visible GPU through accelerate (a model that does not fit
    one GPU; ``device`` is then ignored); otherwise the whole model goes to ``device``.
    """
    from transformers import AutoModelForCausalLM

    name = _resolve_name(name_or_path)
    torch_dtype = _resolve_dtype(dtype)
    repo, hub = _hub_args(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            repo,
            **hub,
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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_context(name_or_path: str | Path) -> int | None:
    """The number of positions a checkpoint was built for (``max_position_embeddings`` of its config), or None
    when its config does not say; read from ``config.json`` alone, no weights are loaded."""
    from transformers import AutoConfig

    try:
        repo, hub = _hub_args(_resolve_name(name_or_path))
        config = AutoConfig.from_pretrained(repo, **hub)
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(
            f"could not read the config of model {str(name_or_path)!r}: {str(err).splitlines()[0]}"
        ) from err
    return getattr(config, "max_position_embeddings", None)


def load_tokenizer(name_or_path: str | Path, template: str | Path | None = None, trust_remote_code: bool = False):
    """Load a tokenizer; sets ``pad_token`` to EOS when the checkpoint defines none, and attaches the prompt
    template every encoder uses (``template``: a shipped name or YAML path; None: detected from the tokenizer,
    :func:`margincal.data.templates.detect_template`)."""
    from transformers import AutoTokenizer

    from margincal.data.templates import detect_template, load_template

    name = _resolve_name(name_or_path)
    local = Path(name)
    if local.is_dir() and not any((local / f).exists() for f in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"{local} has no tokenizer ({' / '.join(TOKENIZER_FILES)}); save the tokenizer beside the model "
            "(tokenizer.save_pretrained(DIR))"
        )
    try:
        repo, hub = _hub_args(name)
        tok = AutoTokenizer.from_pretrained(repo, **hub, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise ModelNotFoundError(
            f"could not load tokenizer {name!r}: {str(err).splitlines()[0]}. If the hub is unreachable, download the "
            "checkpoint elsewhere and pass its local directory instead."
        ) from err
    if tok.pad_token_id is None:
        if tok.eos_token is None:
            raise ValueError(
                f"tokenizer {name!r} defines neither a pad nor an EOS token; set one of them in its "
                "tokenizer_config.json"
            )
        tok.pad_token = tok.eos_token
    tok.margincal_template = load_template(template) if template else detect_template(tok)
    return tok


def save_model(model: torch.nn.Module, tokenizer, path: str | Path) -> Path:
    """Save model (safetensors) and tokenizer into ``path``, a new or empty directory: callers write into a
    temporary directory that is published afterwards (:func:`margincal.artifacts.publish_dir`, a store stage; both
    also set the files' permissions), so nothing is ever saved over existing files."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"refusing to save a model into {path}: it is not a new or empty directory")
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
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
    path = Path(_resolve_name(path))
    if not (path / "adapter_config.json").exists():
        return load_model(path, dtype, device, **options)
    if base is None:
        raise ValueError(f"{path} holds a LoRA adapter; pass the model it was trained on as base")
    from peft import PeftModel

    return merge_lora(PeftModel.from_pretrained(load_model(base, dtype, device, **options), path)).eval()


def is_prompt_learning(model) -> bool:
    """Whether ``model`` is a PEFT prompt-learning wrapper (soft prompt): its sequences carry virtual tokens."""
    config = getattr(model, "active_peft_config", None)
    return bool(getattr(config, "is_prompt_learning", False))


def clone_model(model: torch.nn.Module) -> torch.nn.Module:
    """An independent deep copy (used to keep θ0 while unlearning a copy)."""
    return copy.deepcopy(model)
