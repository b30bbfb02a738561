"""Quantization attacks: a checkpoint loaded through bitsandbytes under a named preset (``configs/quantizers.yaml``).

Zhang et al. (ICLR 2025) report that 4-bit quantization restores forgotten knowledge: rounding every weight to a
coarse codebook can undo the small weight changes unlearning made. The preset is a transformers
``BitsAndBytesConfig`` (NF4 with bf16 compute as open-unlearning's meta-evaluation, FP4 as Zhang et al.'s code gets
from transformers' defaults, LLM.int8), so the quantizer is bitsandbytes' own: blockwise absmax scaling (64 weights
a block for 4-bit) onto its documented 16-value codebook, or row-wise int8. bitsandbytes >= 0.50 runs it on a CPU.

Its CPU kernels differ by CPU type: on an AVX512-BF16 AMD EPYC, bitsandbytes 0.50.2 dequantizes (and its forward
pass follows) off-codebook values for a 4-bit layer whose rows are not a multiple of the 64-weight block (issue 39;
exact on AVX2 machines and for 64-aligned rows everywhere). So every 4-bit load is checked against a pure-torch
reference of the codebook (:func:`codebook_check`) before any number is computed under it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
from pathlib import Path

import torch

from margincal.config.files import CONFIG_DIR, read_yaml
from margincal.config.settings import DEFAULT_DEVICE, DEFAULT_DTYPE, DTYPE_NAMES
from margincal.config.typed import build, check_fields, one_of
from margincal.core.artifacts import cpu_name
from margincal.core.errors import CodebookError, InputError
from margincal.core.inputs import read_json
from margincal.model.loading import _hub_args, _resolve_name, from_pretrained, load_checkpoint, save_model

BLOCK = 64  # bitsandbytes' 4-bit block size (transformers' BitsAndBytesConfig default)
# The 16 values of each 4-bit code, as bitsandbytes documents them (``bitsandbytes.functional.get_4bit_type``):
# NF4 from QLoRA (Dettmers et al. 2023, Appendix E); FP4 the E2M1 values scaled to a maximum of 1 (1/192 the
# subnormal). A weight w of a block with absmax a is stored as the code value nearest to w / a.
CODEBOOKS = {
    "nf4": (
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ),
    "fp4": (
        0.0,
        1 / 192,
        2 / 3,
        1.0,
        1 / 3,
        0.5,
        1 / 6,
        0.25,
        -0.0,
        -1 / 192,
        -2 / 3,
        -1.0,
        -1 / 3,
        -0.5,
        -1 / 6,
        -0.25,
    ),
}
OFF_CODEBOOK_MAX = 0.01  # a layer holds the codebook when at most 1 % of its weights are off it (ties at bin edges)


@dataclasses.dataclass(frozen=True)
class QuantPreset:
    """One ``configs/quantizers.yaml`` entry: the ``BitsAndBytesConfig`` fields it sets and their source."""

    source: str
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_compute_dtype: str = DEFAULT_DTYPE
    bnb_4bit_use_double_quant: bool = False

    def __post_init__(self) -> None:
        check_fields(
            self,
            bnb_4bit_quant_type=one_of("nf4", "fp4"),
            bnb_4bit_compute_dtype=one_of(*DTYPE_NAMES),
        )
        if self.load_in_4bit == self.load_in_8bit:
            raise InputError("a quantizer preset sets exactly one of load_in_4bit and load_in_8bit")

    @property
    def bits(self) -> int:
        return 4 if self.load_in_4bit else 8

    def config(self, skip: list[str] | None = None):
        """The transformers ``BitsAndBytesConfig`` of this preset; ``skip``: module names kept in full precision
        (``llm_int8_skip_modules``; None keeps transformers' default, the output head)."""
        from transformers import BitsAndBytesConfig

        if self.load_in_8bit:
            return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=getattr(torch, self.bnb_4bit_compute_dtype),
            bnb_4bit_use_double_quant=self.bnb_4bit_use_double_quant,
            llm_int8_skip_modules=skip,
        )


def quantizer_presets() -> dict[str, QuantPreset]:
    """Every shipped preset by name."""
    path = CONFIG_DIR / "quantizers.yaml"
    return {name: build(QuantPreset, spec, f"{path.name}: {name}") for name, spec in read_yaml(path).items()}


def resolve_quantizer(name: str) -> QuantPreset:
    """The preset ``name``; stops on an unknown name, or when bitsandbytes (and accelerate, which transformers needs
    to place a quantized model) is not installed."""
    presets = quantizer_presets()
    if name not in presets:
        raise InputError(f"unknown quantizer preset {name!r}; known: {', '.join(presets)} (configs/quantizers.yaml)")
    missing = [pkg for pkg in ("bitsandbytes", "accelerate") if importlib.util.find_spec(pkg) is None]
    if missing:
        raise InputError(
            f"the {name} quantizer needs {' and '.join(missing)}: pip install 'bitsandbytes>=0.50' accelerate"
        )
    return presets[name]


def load_quantized(
    model: str | Path, preset: QuantPreset, device: str = DEFAULT_DEVICE, base: str | Path | None = None
) -> tuple[torch.nn.Module, dict]:
    """``model`` (a checkpoint directory or hub id; a LoRA adapter is merged onto ``base`` first, into a temporary
    directory) loaded with ``preset``'s quantizer onto ``device`` in the checkpoint's own dtype, in eval mode, and
    what :func:`codebook_check` found. Where bitsandbytes did not apply a 4-bit codebook to the layers whose rows are
    not a multiple of the block, those layers are loaded again in full precision and named in the check
    (``full_precision``); where it did not apply it to an aligned layer, the load stops
    (:class:`~margincal.core.errors.CodebookError`)."""
    from transformers import AutoModelForCausalLM

    name = _resolve_name(model)
    with tempfile.TemporaryDirectory(prefix="margincal-merged-") as tmp:
        if (Path(name) / "adapter_config.json").exists():
            save_model(load_checkpoint(name, base), None, Path(tmp) / "model")
            name = str(Path(tmp) / "model")

        def load(config):  # dtype given: transformers 4.x's bitsandbytes loader would pick float16
            kw = dict(quantization_config=config, dtype="auto", device_map={"": device}, use_safetensors=True)
            return from_pretrained(AutoModelForCausalLM, name, **kw).eval()

        quantized = load(preset.config())
        if not preset.load_in_4bit:
            return quantized, {}
        check = codebook_check(quantized, name, preset)
        if check["full_precision"]:  # keep what was not converted, and the unaligned layers, out of 4 bits
            keep = [n for n, m in quantized.named_modules() if type(m) is torch.nn.Linear] + check["full_precision"]
            quantized = load(preset.config(skip=keep))
    return quantized, check


def _weight(name: str, key: str) -> torch.Tensor:
    """The tensor ``key`` as the checkpoint ``name`` (a directory, or a hub id with an optional ``@revision`` in the
    local cache, as the loader just read it) stores it, read from its safetensors file alone (one tensor, not the
    model)."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    def file(filename: str) -> str | None:
        local = Path(name) / filename
        if local.is_file():
            return str(local)
        if Path(name).is_dir():
            return None
        repo, revision = _hub_args(name)
        return cached_file(repo, filename, _raise_exceptions_for_missing_entries=False, **revision)

    index = file("model.safetensors.index.json")
    shard = read_json(index, "the model's index")["weight_map"][key] if index else "model.safetensors"
    with safe_open(file(shard), framework="pt") as f:
        return f.get_tensor(key)


def reference_4bit(weight: torch.Tensor, quant_type: str, block: int = BLOCK) -> torch.Tensor:
    """What a 4-bit codebook stores for ``weight``, in pure torch: the weights in row-major blocks of ``block``
    (the last one zero-padded), each block scaled by its absmax a, every w replaced by a · c*(w / a) with c* the
    codebook value nearest to w / a."""
    flat = weight.detach().float().flatten()
    padded = torch.nn.functional.pad(flat, (0, -len(flat) % block)).view(-1, block)
    absmax = padded.abs().max(dim=1, keepdim=True).values
    codes = torch.tensor(CODEBOOKS[quant_type], device=flat.device)
    scaled = padded / absmax.clamp_min(torch.finfo(torch.float32).tiny)
    nearest = codes[(scaled.unsqueeze(-1) - codes).abs().argmin(-1)]
    return (nearest * absmax).flatten()[: len(flat)].view(weight.shape)


def off_codebook(layer: torch.nn.Module, original: torch.Tensor, quant_type: str) -> float:
    """The share of a bitsandbytes 4-bit layer's dequantized weights (what its forward pass multiplies by) that
    differ from :func:`reference_4bit` of the weights it was loaded from by more than the rounding of the dtype
    they are dequantized to (relative: that dtype's machine epsilon, at least 1e-3; bf16's is 2^-7) + 1e-6."""
    import bitsandbytes.functional as F

    stored = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
    rtol = max(1e-3, torch.finfo(stored.dtype).eps)
    stored = stored.float().cpu().view(original.shape)
    want = reference_4bit(original, quant_type)
    return float(((stored - want).abs() > rtol * want.abs() + 1e-6).float().mean())


def codebook_check(model: torch.nn.Module, name: str, preset: QuantPreset) -> dict:
    """Whether bitsandbytes stored ``preset``'s codebook, checked once per load on two layers: the first 4-bit
    layer whose rows (``in_features``) are a multiple of the block and the first whose rows are not (if the model
    has one), each against :func:`reference_4bit` of the checkpoint's own tensor. Off the codebook (more than
    ``OFF_CODEBOOK_MAX`` of the weights): an aligned layer stops the load with one line naming the layer, the
    bitsandbytes version and the CPU; an unaligned one puts every unaligned layer in ``full_precision``."""
    import bitsandbytes

    layers = [(n, m) for n, m in model.named_modules() if type(m).__name__ == "Linear4bit"]
    out: dict = {"codebook": preset.bnb_4bit_quant_type, "layers_4bit": len(layers), "checked": {}}
    out["full_precision"] = []
    for aligned in (True, False):
        group = [(n, m) for n, m in layers if (m.in_features % BLOCK == 0) == aligned]
        if not group:
            continue
        layer_name, layer = group[0]
        off = off_codebook(layer, _weight(name, f"{layer_name}.weight"), preset.bnb_4bit_quant_type)
        out["checked"][layer_name] = {"shape": list(layer.weight.quant_state.shape), "off_codebook": off}
        if off <= OFF_CODEBOOK_MAX:
            continue
        if aligned:
            raise CodebookError(
                f"bitsandbytes {bitsandbytes.__version__} on this CPU ({cpu_name()}) did not store {layer_name} "
                f"{tuple(layer.weight.quant_state.shape)} as {preset.bnb_4bit_quant_type} codes ({off:.0%} of its "
                "weights are off the codebook); no quantization attack is reported under a codebook it did not apply"
            )
        out["full_precision"] = [n for n, _ in group]
    return out
