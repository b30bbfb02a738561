"""Build (or reuse) the mini benchmark's models: tokenizer, base, θ0 and θ_ref per forget tier.

Stages, all through the shared training loop:

* base  = random init → general knowledge (real-author and world-fact analogues) + the probe corpus
* θ0    = base → all trained authors (forget ∪ retain) + replay of the general data
* θ_ref = base → retain authors of the tier only + the same replay (the retain-only oracle)

Artifacts are saved with ``save_pretrained`` (safetensors) under ``<cache>/mini/<config hash>/`` and reused
when a later run asks for the same configuration; each stage is written atomically, so an interrupted
build resumes at the first missing stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

from margincal.config import TrainConfig
from margincal.data.mini import MiniBenchmark, MiniConfig
from margincal.data.records import QARecord, cycle, encode_qa
from margincal.models import (
    MiniArch,
    load_model,
    load_tokenizer,
    new_mini_model,
    save_model,
    train_mini_tokenizer,
)
from margincal.training import nll_objective, train

log = logging.getLogger(__name__)

BUILD_VERSION = 1  # bump when the build procedure changes in a way that invalidates cached models
GENERAL_SPLITS = ("real_authors", "world_facts", "probe")


@dataclasses.dataclass
class MiniModelConfig:
    """Everything that determines the mini models (its hash is the cache key)."""

    data: MiniConfig = dataclasses.field(default_factory=MiniConfig)
    arch: MiniArch = dataclasses.field(default_factory=MiniArch)
    max_length: int = 96
    base: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=300, batch_size=32, lr=3e-3, weight_decay=0.0, warmup_ratio=0.05, scheduler="cosine"
        )
    )
    finetune: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=600, batch_size=32, lr=3e-3, weight_decay=0.0, warmup_ratio=0.05, scheduler="cosine"
        )
    )

    def cache_key(self) -> str:
        blob = json.dumps({"v": BUILD_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path(os.environ.get("MARGINCAL_CACHE", Path.home() / ".cache" / "margincal"))


@dataclasses.dataclass
class MiniModels:
    """Paths of a built mini model family."""

    root: Path

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def base(self) -> Path:
        return self.root / "base"

    @property
    def theta0(self) -> Path:
        return self.root / "theta0"

    def ref(self, tier: str) -> Path:
        return self.root / f"ref_{tier}"


def _corpus_texts(bench: MiniBenchmark) -> list[str]:
    texts = []
    for records in bench.splits.values():
        for r in records:
            texts += [r.question, r.answer, r.paraphrased_answer or "", *r.perturbed_answers]
    return [" " + t for t in texts if t]  # leading space: words tokenize as they appear after the prompt


def _finetune(init_path: Path, tokenizer, records: list[QARecord], cfg: MiniModelConfig, tc: TrainConfig, desc):
    log.info("training %s: %d steps on %d examples", desc, tc.steps, len(records))
    model = load_model(init_path)
    examples = encode_qa(tokenizer, records, cfg.max_length)
    stream = cycle(examples, tc.batch_size, tokenizer.pad_token_id, seed=tc.seed)
    model, result = train(model, nll_objective, stream, tc, desc=desc)
    log.info("%s: %d steps, final nll %.4f, %.1fs", desc, tc.steps, result.last("nll"), result.seconds)
    return model


def build_mini_models(
    bench: MiniBenchmark,
    cfg: MiniModelConfig,
    tiers: tuple[str, ...] = ("forget10",),
    cache_dir: Path | None = None,
) -> MiniModels:
    """Build whatever of tokenizer/base/θ0/θ_ref(tiers) is missing from the cache; return their paths."""
    if bench.config != cfg.data:
        raise ValueError("the benchmark was generated with a different MiniConfig than the model config")
    models = MiniModels((cache_dir or default_cache_dir()) / "mini" / cfg.cache_key())
    models.root.mkdir(parents=True, exist_ok=True)
    (models.root / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, sort_keys=True))

    if not models.tokenizer.exists():
        tok = train_mini_tokenizer(_corpus_texts(bench), cfg.arch.vocab_size)
        tok.model_max_length = cfg.max_length
        save_model_dir = models.tokenizer.parent / f".{models.tokenizer.name}.tmp"
        tok.save_pretrained(save_model_dir)
        os.replace(save_model_dir, models.tokenizer)
    tokenizer = load_tokenizer(models.tokenizer)

    general = [r for name in GENERAL_SPLITS for r in bench.split(name)]
    if not models.base.exists():
        log.info("training mini base: %d steps on %d general-knowledge/probe examples", cfg.base.steps, len(general))
        model = new_mini_model(cfg.arch, tokenizer, seed=cfg.base.seed)
        examples = encode_qa(tokenizer, general, cfg.max_length)
        stream = cycle(examples, cfg.base.batch_size, tokenizer.pad_token_id, seed=cfg.base.seed)
        model, _ = train(model, nll_objective, stream, cfg.base, desc="mini base")
        save_model(model, tokenizer, models.base)

    if not models.theta0.exists():
        authors = bench.split("forget10") + bench.split("retain90")
        model = _finetune(models.base, tokenizer, authors + general, cfg, cfg.finetune, "mini θ0")
        save_model(model, tokenizer, models.theta0)

    for tier in tiers:
        if not models.ref(tier).exists():
            retain = bench.split(retain_split(tier))
            model = _finetune(models.base, tokenizer, retain + general, cfg, cfg.finetune, f"mini θ_ref {tier}")
            save_model(model, tokenizer, models.ref(tier))
    return models


def retain_split(tier: str) -> str:
    """``forget10`` → ``retain90`` (TOFU naming)."""
    if not (tier.startswith("forget") and tier[6:].isdigit()):
        raise ValueError(f"unknown forget tier {tier!r}; use forget01, forget05 or forget10")
    return f"retain{100 - int(tier[6:]):02d}"
