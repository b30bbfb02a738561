"""Loading and saving models/tokenizers (HF id or local path), and LoRA merge.

Every Hugging Face ``from_pretrained`` of margincal goes through :func:`from_pretrained`, which passes
``trust_remote_code=False``: a checkpoint's own Python is never imported, whatever its ``config.json`` says, and no
loader asks on the terminal whether to run it. A local checkpoint is checked before anything of it is loaded
(:func:`check_checkpoint`): an architecture transformers does not implement (one that needs the checkpoint's own code),
pickle weights (safetensors only), unreadable safetensors files and weights of another architecture than its config's
stop with one line. Loading itself refuses weights the model does not take or leaves unset (the loader's report).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch

from margincal.config.settings import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_NAMES
from margincal.core.artifacts import atomic_write_json
from margincal.core.errors import InputError
from margincal.core.inputs import checked, path_kind, read_json
from margincal.data.hub import could_be_hub_id, require_hub, split_revision
from margincal.data.templates import check_template, detect_template, load_template

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))


class ModelNotFoundError(FileNotFoundError):
    """A model path or hub id could not be loaded."""


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def _resolve_name(name_or_path: str | Path) -> str:
    """A path-looking name must exist locally (a stage directory that margincal wrote stands for its ``model/``);
    anything else is passed on as a hub id."""
    name = str(name_or_path)
    local = Path(name).expanduser()
    if path_kind(local) != "missing":  # a file, a link loop, a link to nothing: named, never read as a hub id
        checked(local, "the model", "directory", "a model directory (config.json and safetensors weights)")
        is_stage = (local / "stage.json").is_file() and (local / "model").is_dir()
        return str(local / "model") if is_stage else str(local)  # a stage directory stands for its model
    if isinstance(name_or_path, Path) or not could_be_hub_id(name):
        raise ModelNotFoundError(f"no such model directory: {local}")
    require_hub(
        name,
        f"download it where the hub is reachable (huggingface-cli download {name} --local-dir DIR) and pass DIR "
        "instead: as --model DIR, or as the target/references entry of the model family YAML.",
        local="directory",
    )
    return name


def _hub_args(name: str) -> tuple[str, dict]:
    """A loader's name and keyword arguments: a hub id's ``@revision`` becomes ``revision=`` (a local path as is)."""
    if Path(name).exists():
        return name, {}
    repo, revision = split_revision(name)
    return repo, ({"revision": revision} if revision else {})


def from_pretrained(cls, name: str, **kwargs):
    """``cls.from_pretrained(name, ...)`` for a local directory or a hub id (``@revision`` → ``revision=``), with
    ``trust_remote_code=False``: the one way margincal calls a Hugging Face loader (configs, tokenizers, models,
    quantized models). A checkpoint that needs its own code stops with one line instead of a prompt: a local one
    before transformers reads it (:func:`_custom_code`), a hub one when transformers finds out."""
    repo, hub = _hub_args(name)
    why = _custom_code(Path(repo)) if Path(repo).is_dir() else None
    if why is not None:
        raise InputError(f"{repo}: {why}; {NO_REMOTE_CODE}")
    try:
        return cls.from_pretrained(repo, **hub, **kwargs, trust_remote_code=False)
    except ValueError as err:
        if "trust_remote_code" in str(err) or "custom code" in str(err):
            raise InputError(f"{name} needs its own Python code to load; {NO_REMOTE_CODE}") from None
        raise


NO_REMOTE_CODE = "margincal never runs a checkpoint's own code (trust_remote_code=False)"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def _custom_code(local: Path) -> str | None:
    """Why the checkpoint in ``local`` would need its own code (an architecture or tokenizer class transformers
    does not implement, only named by ``auto_map``), else None; read from its JSON files, nothing imported."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    config = read_json(local / "config.json") if (local / "config.json").is_file() else {}
    kind = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(kind, str) and kind not in CONFIG_MAPPING:
        return f"its config.json names the architecture {kind[:60]!r}, which transformers does not implement"
    tok = read_json(local / "tokenizer_config.json") if (local / "tokenizer_config.json").is_file() else {}
    cls = tok.get("tokenizer_class") if isinstance(tok, dict) else None
    if isinstance(cls, str) and "auto_map" in tok and tokenizer_class_from_name(cls) is None:
        return f"its tokenizer_config.json names the tokenizer class {cls[:60]!r}, which transformers does not have"
    return None


def check_checkpoint(name_or_path: str | Path) -> None:
    """Stop, with one line and before anything of it is loaded or imported, on a local checkpoint (or LoRA adapter)
    that margincal must not or cannot load:

    * one holding something other than regular files and folders (a FIFO, a device, a link loop or a link to nothing);
    * one that needs its own code (:func:`_custom_code`): margincal never runs it;
    * pickle weights without safetensors (``pytorch_model.bin``, ``adapter_model.bin``): unpickling can run code;
    * a safetensors file that does not open (its header parses and its tensors fill the file);
    * weights of another architecture than its ``config.json`` names (:func:`check_architecture`).

    A hub id is checked by the hub when it downloads (and by :func:`from_pretrained`)."""
    from safetensors import SafetensorError, safe_open

    local = Path(_resolve_name(name_or_path))
    if not local.is_dir():
        return
    for entry in local.iterdir():  # a FIFO, device or link loop among its files would hang or fail a loader's read
        if path_kind(entry) not in ("file", "directory"):
            checked(entry, "the checkpoint file", "file", "a checkpoint of regular files")
    why = _custom_code(local)
    if why is not None:
        raise InputError(f"{local}: {why}; {NO_REMOTE_CODE}")
    safetensors = sorted(local.glob("*.safetensors"))
    pickled = sorted(p.name for p in local.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if pickled and not safetensors:
        raise InputError(
            f"{local} holds pickle weights ({', '.join(pickled[:3])}) and no safetensors: margincal loads safetensors "
            "only (unpickling can run code); convert them with save_pretrained(DIR, safe_serialization=True) where "
            "you trust them"
        )
    for path in safetensors:
        checked(path, "the weights file", "file", "safetensors weights (a regular file)")
        try:
            with safe_open(path, "pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise InputError(f"{path} is not a readable safetensors file ({err}); download or save it again") from None
    if (local / "config.json").is_file() and safetensors and not (local / "adapter_config.json").is_file():
        check_architecture(local, safetensors)


ARCHITECTURE_COVERAGE = 0.5  # below this share of its own tensors found in the files, a config names other weights


def check_architecture(local: Path, files: list[Path]) -> None:
    """Stop when the safetensors ``files`` of ``local`` hold weights of another architecture than its ``config.json``
    names: fewer than :data:`ARCHITECTURE_COVERAGE` of the tensors a model of that config has (built on the meta
    device: no memory, no weights) are in the files, matched by name without the base-model prefix (``model.``,
    ``transformer.``). A coarse check on the headers alone, before anything is loaded (Llama weights under a GPT-2
    config share no name); :func:`load_model` then refuses any single tensor the loader reports missing or unused."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    stored: set[str] = set()
    for path in files:
        with safe_open(path, "pt") as f:
            stored.update(f.keys())
    try:
        config = from_pretrained(AutoConfig, str(local))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as err:
        why = " ".join(str(err).split())[:200]
        raise InputError(f"{local}/config.json does not describe a causal LM transformers can build ({why})") from None
    prefix = f"{model.base_model_prefix}."

    def plain(key: str) -> str:
        return key.removeprefix(prefix)

    expected = {plain(k) for k in model.state_dict()}
    found = expected & {plain(k) for k in stored}
    if expected and len(found) < ARCHITECTURE_COVERAGE * len(expected):
        example = sorted(expected - found)[0]
        other = sorted(stored)[0] if stored else "none"
        raise InputError(
            f"{local}: the weights are not those of the {config.model_type} model its config.json names ({len(found)} "
            f"of its {len(expected)} tensors are in the files; it expects e.g. {example!r}, the files hold e.g. "
            f"{other!r}); save the config that belongs to these weights"
        )


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
    dtype: str | torch.dtype = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
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
    try:
        model, info = from_pretrained(
            AutoModelForCausalLM,
            name,
            dtype=torch_dtype,
            use_safetensors=True,
            attn_implementation=attention_backend(attn_implementation, torch_dtype, device),
            device_map=device_map,
            output_loading_info=True,
        )
    except OSError as err:
        raise ModelNotFoundError(
            f"could not load model {name!r} ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
            "If the hub is unreachable, download the checkpoint where it is reachable (huggingface-cli download "
            f"{name} --local-dir DIR) and pass DIR instead: as --model DIR, or as the target/references entry of "
            "the model family YAML."
        ) from err
    check_loading(name, info)
    return (model if device_map is not None else model.to(device)).eval()


def check_loading(name: str, info: dict) -> None:
    """Stop when the loader reports weights the model left at their random initialisation (missing), tensors it did
    not take (unexpected) or took at another shape (mismatched): such a model is not the checkpoint."""
    problems = {
        "missing_keys": "has no weights for",
        "mismatched_keys": "holds other shapes for",
        "unexpected_keys": "holds tensors the model does not have:",
    }
    for kind, what in problems.items():
        keys = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(kind) or ())
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            raise InputError(f"{name} {what} {', '.join(keys[:3])}{more}: its weights do not fit its config.json")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_context(name_or_path: str | Path) -> int | None:
    """The number of positions a checkpoint was built for (``max_position_embeddings`` of its config), or None
    when its config does not say; read from ``config.json`` alone, no weights are loaded."""
    return getattr(model_config(name_or_path), "max_position_embeddings", None)


def model_config(name_or_path: str | Path):
    """A checkpoint's transformers config (``config.json`` alone, no weights, never its own code)."""
    from transformers import AutoConfig

    try:
        return from_pretrained(AutoConfig, _resolve_name(name_or_path))
    except (OSError, ValueError) as err:
        what = f"could not read the config of model {str(name_or_path)!r}: {str(err).splitlines()[0]}"
        raise (ModelNotFoundError if isinstance(err, OSError) else InputError)(what) from err


#: The least share of a model's embedding rows that its own tokenizer gives ids to. Real checkpoints pad their
#: embedding by a few percent at most (Phi-2 51 200 rows for 50 295 tokens, 1.8 %; Qwen2.5 0.3 %; OLMo 0.05 %); a
#: tokenizer that leaves more than a tenth of the rows unused belongs to another model.
LEAST_VOCABULARY_USE = 0.9


def vocabulary_size(config) -> int | None:
    """The rows of a model's input embedding (``vocab_size`` of its config, or of its text config)."""
    size = getattr(config, "vocab_size", None)
    if size is None and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def check_vocabulary(tokenizer, config, name: str, *, vouched: bool = False) -> None:
    """Stop when ``tokenizer`` is not a tokenizer of the model whose ``config`` is given (``vocab_size`` embedding
    rows, V): when it has ids the embedding has no row for (they would index past it at the first forward pass), or,
    unless the model's own saved tokenizer ``vouched`` for it (the same vocabulary, :func:`check_shared_vocabulary`),
    when it has fewer than :data:`LEAST_VOCABULARY_USE` · V tokens (a smaller vocabulary's ids land on rows trained
    for other tokens, and every score is silently wrong). A model saved with its tokenizer may pad its embedding
    freely (a random model of a real shape with a small trained tokenizer is one)."""
    size = vocabulary_size(config)
    if size is None:
        return
    highest = max(tokenizer.get_vocab().values(), default=-1)
    if highest >= size:
        raise InputError(
            f"the tokenizer of {name} has ids up to {highest}, but the model's embedding has {size} rows (vocab_size "
            "in config.json): this tokenizer is not the model's"
        )
    if not vouched and len(tokenizer) < LEAST_VOCABULARY_USE * size:
        raise InputError(
            f"the tokenizer given for {name} has {len(tokenizer)} tokens, but the model's embedding has {size} rows: "
            "this tokenizer is not the model's; pass the tokenizer saved with the model"
        )


def vocabulary_digest(tokenizer) -> str:
    """A digest of ``tokenizer``'s vocabulary (every token with its id): two tokenizers with one digest map text
    to the same ids."""
    import hashlib
    import json

    pairs = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()[:16]


def saved_tokenizer_dir(model: object) -> Path | None:
    """The local directory a model named by path saved its own tokenizer in (None: a model in memory, a hub id,
    or a directory without tokenizer files)."""
    if not isinstance(model, str | Path):
        return None
    local = Path(_resolve_name(model))
    return local if local.is_dir() and any((local / f).is_file() for f in TOKENIZER_FILES) else None


def check_shared_vocabulary(tokenizer, models: dict[str, tuple[object, object]], source: object = None) -> None:
    """Stop unless every model of ``models`` (shown name → (the model as given, its config)) can be read with
    ``tokenizer``, the one tokenizer a run encodes its data with (loaded from ``source``, or given in memory):

    * a model named by a directory that holds its own tokenizer has this tokenizer's vocabulary
      (:func:`vocabulary_digest`; the directory ``source`` names vouches for itself): a θ_ref trained with another
      tokenizer of the same size is refused;
    * ``tokenizer`` fits each model's embedding (:func:`check_vocabulary`; the share-of-rows rule only for a model
      no saved tokenizer vouched for, such as a model in memory);
    * all models have embeddings of one size (θ0, θ_ref and an unlearned θ̂ are fine-tunes of one base)."""
    mine = vocabulary_digest(tokenizer)
    own = saved_tokenizer_dir(source)
    sizes: dict[str, int] = {}
    for name, (model, config) in models.items():
        saved = saved_tokenizer_dir(model)
        foreign = saved is not None and (own is None or saved.resolve() != own.resolve())
        if foreign and _saved_vocabulary_digest(str(saved.resolve())) != mine:
            raise InputError(
                f"{name} was saved with another tokenizer than the one this run encodes with (their vocabularies "
                "differ): give models that share one tokenizer"
            )
        check_vocabulary(tokenizer, config, name, vouched=saved is not None)
        if (size := vocabulary_size(config)) is not None:
            sizes[name] = size
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{name} {size}" for name, size in sizes.items())
        raise InputError(f"these models do not share one vocabulary (embedding rows: {shown}); give models of one base")


@functools.lru_cache(maxsize=64)
def _saved_vocabulary_digest(directory: str) -> str:
    """The vocabulary digest of the tokenizer saved in ``directory`` (read once per process)."""
    from transformers import AutoTokenizer

    try:
        return vocabulary_digest(from_pretrained(AutoTokenizer, directory))
    except (OSError, ValueError) as err:
        raise InputError(f"{directory}: its tokenizer files do not load ({str(err).splitlines()[0]})") from None


def load_tokenizer(name_or_path: str | Path, template: str | Path | None = None):
    """Load a tokenizer; sets ``pad_token`` to EOS when the checkpoint defines none, and attaches the prompt
    template every encoder uses (``template``: a shipped name or YAML path; None: detected from the tokenizer,
    :func:`margincal.data.templates.detect_template`)."""
    from transformers import AutoTokenizer

    name = _resolve_name(name_or_path)
    local = Path(name)
    if local.is_dir() and not any((local / f).exists() for f in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"{local} has no tokenizer ({' / '.join(TOKENIZER_FILES)}); save the tokenizer beside the model "
            "(tokenizer.save_pretrained(DIR))"
        )
    try:
        tok = from_pretrained(AutoTokenizer, name)
    except OSError as err:
        raise ModelNotFoundError(
            f"could not load tokenizer {name!r}: {str(err).splitlines()[0]}. If the hub is unreachable, download the "
            "checkpoint elsewhere and pass its local directory instead."
        ) from err
    except ValueError as err:  # a tokenizer_class this transformers lacks (transformers 5 saves TokenizersBackend)
        if "Tokenizer class" not in str(err):
            raise
        tok = _fast_tokenizer(local, name, err)
    return prepare_tokenizer(tok, template, str(name_or_path), in_place=True)


def _fast_tokenizer(local: Path, name: str, err: ValueError):
    """The tokenizer saved in ``local`` whose ``tokenizer_class`` this transformers does not know (transformers 5
    writes ``TokenizersBackend``, which 4.x lacks), read as the ``PreTrainedTokenizerFast`` of its
    ``tokenizer.json``: the class a fast tokenizer's files describe whatever name wrote them. Without a
    ``tokenizer.json`` it stops, with the fix."""
    from transformers import PreTrainedTokenizerFast

    if not (local / "tokenizer.json").is_file():
        raise InputError(
            f"tokenizer {name}: {str(err).splitlines()[0]}; its tokenizer_config.json names a tokenizer class this "
            "transformers lacks: install the transformers that saved it, or save the tokenizer with this one"
        ) from None
    return from_pretrained(PreTrainedTokenizerFast, name)


def prepare_tokenizer(tok, template: str | Path | None = None, name: str = "the tokenizer", in_place: bool = False):
    """``tok`` ready for margincal's encoders: ``pad_token`` set to EOS when it defines none, and the prompt template
    attached (``template``: a shipped name or YAML path; None: detected). A copy is prepared unless ``in_place``, so
    a tokenizer a user holds (:mod:`margincal.api`) is left as it was."""
    if not in_place:
        tok = copy.deepcopy(tok)
    if tok.pad_token_id is None:
        if tok.eos_token is None:
            raise InputError(
                f"tokenizer {name!r} defines neither a pad nor an EOS token; set one of them in its "
                "tokenizer_config.json"
            )
        tok.pad_token = tok.eos_token
    tok.margincal_template = load_template(template) if template else detect_template(tok)
    check_template(tok, tok.margincal_template, name)
    return tok


def save_model(model: torch.nn.Module, tokenizer, path: str | Path) -> Path:
    """Save model (safetensors) and tokenizer into ``path``, a new or empty directory: callers write into a
    temporary directory that is published afterwards (:func:`margincal.core.artifacts.publish_dir`, a store stage; both
    also set the files' permissions), so nothing is ever saved over existing files."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"refusing to save a model into {path}: it is not a new or empty directory")
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        save_tokenizer(tokenizer, path)
    return path


PORTABLE_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}  # transformers 5's generic class → its 4.x name


def save_tokenizer(tokenizer, path: str | Path) -> Path:
    """``tokenizer.save_pretrained(path)`` in a form transformers 4.x and 5.x both load (what margincal saves is read
    by open-unlearning's users on 4.x, and the mini models ship as files): transformers 5 names its generic class
    ``TokenizersBackend`` and writes the extra special tokens as a list, which 4.x cannot read, so they are written
    under their 4.x names (``PreTrainedTokenizerFast``, ``additional_special_tokens``), which 5 reads as well. A
    config 4.x wrote is left as it is."""
    tokenizer.save_pretrained(path)
    config_path = Path(path) / "tokenizer_config.json"
    config = read_json(config_path)
    portable = {k: v for k, v in config.items() if k != "backend"}
    portable["tokenizer_class"] = PORTABLE_CLASSES.get(config.get("tokenizer_class"), config.get("tokenizer_class"))
    if isinstance(config.get("extra_special_tokens"), list):
        portable["additional_special_tokens"] = portable.pop("extra_special_tokens")
    if portable != config:
        atomic_write_json(config_path, portable)
    return Path(path)


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
    path: str | Path,
    base: str | Path | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    **options,
) -> torch.nn.Module:
    """A saved model, or a saved LoRA adapter (``adapter_config.json``) loaded onto ``base`` and merged (evaluation
    and generation then run at the base model's speed); ``options`` go to :func:`load_model`."""
    path = Path(_resolve_name(path))
    if not (path / "adapter_config.json").exists():
        return load_model(path, dtype, device, **options)
    if base is None:
        raise InputError(f"{path} holds a LoRA adapter; pass the model it was trained on as base")
    check_checkpoint(path)
    check_adapter(path, str(base))
    from peft import PeftModel

    return merge_lora(PeftModel.from_pretrained(load_model(base, dtype, device, **options), path)).eval()


def check_adapter(path: str | Path, base: str) -> None:
    """Stop, before anything is loaded, when the LoRA adapter at ``path`` cannot go onto ``base``: none of its
    ``target_modules`` (names, or a regular expression, as peft matches them) names a module of ``base`` (built on
    the meta device from its config: no weights are read)."""
    import re

    from transformers import AutoModelForCausalLM

    adapter = read_json(Path(path) / "adapter_config.json", "adapter")
    targets = adapter.get("target_modules") if isinstance(adapter, dict) else None
    if targets is None:
        return  # peft's defaults for the base's architecture
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(base), trust_remote_code=False)
    names = [name for name, _ in model.named_modules() if name]
    if isinstance(targets, str):
        hit = any(re.fullmatch(targets, name) for name in names)
    else:
        wanted = {str(t) for t in targets}
        hit = any(name.rsplit(".", 1)[-1] in wanted or name in wanted for name in names)
    if not hit:
        shown = targets if isinstance(targets, str) else ", ".join(map(str, list(targets)[:5]))
        raise InputError(
            f"the LoRA adapter {path} targets modules ({shown}) that its base {base} does not have: it was trained on "
            "another base; give that one with --base"
        )


def is_prompt_learning(model) -> bool:
    """Whether ``model`` is a PEFT prompt-learning wrapper (soft prompt): its sequences carry virtual tokens."""
    config = getattr(model, "active_peft_config", None)
    return bool(getattr(config, "is_prompt_learning", False))


def clone_model(model: torch.nn.Module) -> torch.nn.Module:
    """An independent deep copy (used to keep θ0 while unlearning a copy)."""
    return copy.deepcopy(model)


def check_in_memory(model: torch.nn.Module) -> None:
    """A model in memory margincal can run: a transformers model (it has a ``config``) whose weights are loaded (none
    on the meta device)."""
    if not hasattr(model, "config"):
        raise InputError(f"a model in memory must be a transformers model (with a config), not {type(model).__name__}")
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise InputError(
            f"the {type(model).__name__} given is on the meta device (its weights were never loaded): load it "
            "with from_pretrained, or materialize it (model.to_empty(...) and load its state dict)"
        )


def shown_model(model: str | Path | torch.nn.Module) -> str:
    """A model as messages and result files name it: its path or hub id, or ``in-memory <class> <id>``."""
    if isinstance(model, torch.nn.Module):
        return f"in-memory {type(model).__name__} {id(model):x}"
    return str(model)


def resolve_device(device: str) -> str:
    """``auto``: cuda when this machine has it, else cpu; anything else as given."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
