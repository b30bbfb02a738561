"""Quantization attacks: a checkpoint loaded through bitsandbytes under a named preset (``configs/quantizers.yaml``).

Zhang et al. (ICLR 2025) report that 4-bit quantization restores forgotten knowledge: rounding every weight to a
coarse codebook can undo the small weight changes unlearning made. The preset is a transformers
``BitsAndBytesConfig`` (NF4 with bf16 compute as open-unlearning's meta-evaluation, FP4 as Zhang et al.'s code gets
from transformers' defaults, LLM.int8), so the quantizer is bitsandbytes' own: blockwise absmax scaling (64 weights
a block for 4-bit) onto its documented 16-value codebook, or row-wise int8. bitsandbytes >= 0.50 runs it on a CPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
from pathlib import Path

import torch

from margincal.config import CONFIG_DIR, build, check_fields, one_of, read_yaml


@dataclasses.dataclass(frozen=True)
class QuantPreset:
    """One ``configs/quantizers.yaml`` entry: the ``BitsAndBytesConfig`` fields it sets and their source."""

    source: str
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_compute_dtype: str = "float32"
    bnb_4bit_use_double_quant: bool = False

    def __post_init__(self) -> None:
        check_fields(self, bnb_4bit_quant_type=one_of("nf4", "fp4"),
                     bnb_4bit_compute_dtype=one_of("float32", "bfloat16", "float16"))  # fmt: skip
        if self.load_in_4bit == self.load_in_8bit:
            raise ValueError("a quantizer preset sets exactly one of load_in_4bit and load_in_8bit")

    @property
    def bits(self) -> int:
        return 4 if self.load_in_4bit else 8

    def config(self):
        """The transformers ``BitsAndBytesConfig`` of this preset."""
        from transformers import BitsAndBytesConfig

        if self.load_in_8bit:
            return BitsAndBytesConfig(load_in_8bit=True)
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=getattr(torch, self.bnb_4bit_compute_dtype),
            bnb_4bit_use_double_quant=self.bnb_4bit_use_double_quant,
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
        raise ValueError(f"unknown quantizer preset {name!r}; known: {', '.join(presets)} (configs/quantizers.yaml)")
    missing = [pkg for pkg in ("bitsandbytes", "accelerate") if importlib.util.find_spec(pkg) is None]
    if missing:
        raise ValueError(
            f"the {name} quantizer needs {' and '.join(missing)}: pip install 'bitsandbytes>=0.50' accelerate"
        )
    return presets[name]


def load_quantized(model: str | Path, preset: QuantPreset, device: str = "cpu", base: str | Path | None = None):
    """``model`` (a checkpoint directory or hub id; a LoRA adapter is merged onto ``base`` first, into a temporary
    directory) loaded with ``preset``'s quantizer onto ``device``, in eval mode."""
    from transformers import AutoModelForCausalLM

    from margincal.models import _resolve_name, from_pretrained, load_checkpoint, save_model

    name = _resolve_name(model)
    with tempfile.TemporaryDirectory(prefix="margincal-merged-") as tmp:
        if (Path(name) / "adapter_config.json").exists():
            save_model(load_checkpoint(name, base), None, Path(tmp) / "model")
            name = str(Path(tmp) / "model")
        quantized = from_pretrained(
            AutoModelForCausalLM,
            name,
            quantization_config=preset.config(),
            device_map={"": device},
            use_safetensors=True,
        )
    return quantized.eval()
