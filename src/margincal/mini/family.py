"""The mini benchmark as a model family (``kind: mini``): its models are store stages, its splits generated."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from margincal.config.settings import DEFAULT_DEVICE
from margincal.data.records import QARecord
from margincal.mini.data import generate
from margincal.mini.models import MiniModelConfig, build_mini_models, built, shipped, stage_keys
from margincal.pipeline.families import ModelFamily, Resolved
from margincal.store.stage_store import Store


class MiniFamily(ModelFamily):
    """θ0 and the retain-only θ_ref of a tier, trained from scratch by :mod:`margincal.mini.models` into ``store``
    (identities: their store keys); the splits are those of :func:`margincal.mini.data.generate`."""

    def __init__(self, spec: dict, config: MiniModelConfig, store: Store):
        super().__init__(spec)
        self.config, self.store = config, store

    def ids(self, tier: str) -> tuple[str, str]:
        keys = stage_keys(self.config, tier)
        return f"mini-theta0/{keys['mini-theta0']}", f"mini-ref/{keys['mini-ref']}"

    def data_id(self, tier: str) -> dict:
        return {"mini": dataclasses.asdict(self.config.data), **super().data_id(tier)}

    def status(self, tier: str) -> str:
        if built(self.config, tier, self.store):
            return f"mini models stored under {self.store.root}"
        if shipped(self.config, tier):
            return f"mini models shipped with margincal: copied into {self.store.root}"
        steps = self.config.base.steps + 2 * self.config.finetune.steps
        return f"mini models will be built into {self.store.root} ({steps} training steps; 1500 take 2 min on 2 cores)"

    def context(self) -> int | None:
        return self.config.arch.max_position_embeddings

    def splits(self) -> Callable[[str], list[QARecord]]:
        return generate(self.config.data).split

    def tokenizer_source(self, tier: str) -> str:
        raise ValueError("the mini benchmark's splits are QA records: its tokenizer is not needed to count them")

    def tokenizer_ready(self, tier: str) -> bool:
        return False

    def local_splits(self) -> Callable[[str], list[QARecord]]:
        return self.splits()

    def resolve(self, tier: str, device: str = DEFAULT_DEVICE) -> Resolved:
        bench = generate(self.config.data)
        paths = build_mini_models(self.config, tier, self.store, bench, device=device)
        return Resolved(str(paths.theta0), str(paths.ref), str(paths.tokenizer), bench.split)
