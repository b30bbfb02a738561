"""Relearn attackers behind one registry.

A relearn attack fine-tunes the released model on D_rel ⊂ D_f (|D_rel| = K, drawn with a seed) and is
evaluated on the held-out D_f \\ D_rel (paper Sec. 4.1). Every attacker is a function
``(model, d_rel examples, AttackConfig, pad_id) -> attacked model`` that leaves its input untouched.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from margincal.config import AttackConfig
from margincal.data.records import EncodedQA, cycle
from margincal.models import clone_model, merge_lora
from margincal.training import nll_objective, train

Attacker = Callable[[torch.nn.Module, Sequence[EncodedQA], AttackConfig, int], torch.nn.Module]
ATTACKERS: dict[str, Attacker] = {}


def register_attacker(name: str):
    def wrap(fn: Attacker) -> Attacker:
        ATTACKERS[name] = fn
        return fn

    return wrap


def get_attacker(name: str) -> Attacker:
    if name not in ATTACKERS:
        raise ValueError(f"unknown attacker {name!r}; known attackers: {', '.join(sorted(ATTACKERS))}")
    return ATTACKERS[name]


def relearn_split(n: int, k: int, seed: int) -> tuple[list[int], list[int]]:
    """Seeded disjoint split of ``range(n)`` into D_rel (k items) and the held-out rest."""
    if not 0 < k < n:
        raise ValueError(f"relearn budget K={k} must be in [1, {n - 1}] for a forget set of {n} samples")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[:k]), sorted(order[k:])


@register_attacker("lora")
def lora_relearn(model: torch.nn.Module, d_rel: Sequence[EncodedQA], cfg: AttackConfig, pad_id: int) -> torch.nn.Module:
    """LoRA fine-tuning (answer NLL) on D_rel for ``cfg.train.steps`` steps, merged for evaluation."""
    if cfg.train.lora is None:
        raise ValueError("the lora attacker needs attack.train.lora (rank, alpha)")
    tc = cfg.train
    stream = cycle(d_rel, min(tc.batch_size, len(d_rel)), pad_id, seed=tc.seed)
    attacked, _ = train(clone_model(model), nll_objective, stream, tc, desc=f"attack lora K={len(d_rel)}")
    return merge_lora(attacked)


def run_attack(
    model: torch.nn.Module, forget: Sequence[EncodedQA], cfg: AttackConfig, pad_id: int
) -> tuple[torch.nn.Module, list[int]]:
    """Attack with ``cfg.name`` on a seeded D_rel of size ``cfg.k``; returns (attacked model, held-out idx)."""
    rel, held = relearn_split(len(forget), cfg.k, cfg.train.seed)
    attacked = get_attacker(cfg.name)(model, [forget[i] for i in rel], cfg, pad_id)
    return attacked, held
