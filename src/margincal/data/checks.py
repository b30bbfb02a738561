"""Checks that stop a command before its first forward pass, each with one sentence naming the value at fault.

Every entry point runs the ones that apply before loading weights: the single-stage CLI commands and
``panel`` (including ``--dry-run``). Output locations are checked by :func:`margincal.core.artifacts.check_output`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from margincal.core.errors import InputError
from margincal.data.alpaca import overlapping
from margincal.data.records import QARecord


def check_device(device: str) -> None:
    """``device`` exists in this torch build and on this machine (``cpu``, ``cuda[:i]``, ``mps``)."""
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise InputError(f"--device {device!r} is not a torch device; use cpu, cuda, cuda:1 or mps") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise InputError(
                f"--device {device}: no CUDA GPU is usable here (torch {torch.__version__}, {build}); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {device}: MPS is not available on this machine; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"--device {device}: unsupported device type {dev.type!r}; use cpu, cuda or mps")


def check_budgets(budgets: Sequence[int], n_forget: int, where: str, corpus: bool = False) -> None:
    """Every relearn budget K leaves a held-out forget sample: 1 ≤ K < |D_f|; where D_rel is drawn from a forget
    corpus and every question is scored (``corpus``, WMDP), 1 ≤ K ≤ the corpus' ``n_forget`` chunks."""
    if corpus:
        bad = [k for k in budgets if not 1 <= k <= n_forget]
        if bad:
            raise InputError(
                f"relearn budget(s) K = {bad} in {where}: K must be at least 1 and at most the {n_forget} chunks of "
                "the forget corpus D_rel is drawn from"
            )
        return
    bad = [k for k in budgets if not 1 <= k < n_forget]
    if bad:
        raise InputError(
            f"relearn budget(s) K = {bad} in {where}: K must be at least 1 and below |D_f| = {n_forget} "
            "(the attack is scored on the held-out D_f \\ D_rel)"
        )


def check_probe_disjoint(probe: Sequence[QARecord], excluded: Iterable[QARecord], where: str) -> None:
    """The KL probe D_a shares no question and no 8-gram with D_f ∪ D_r (:func:`margincal.data.alpaca.overlapping`)."""
    hits = overlapping(probe, excluded)
    if hits:
        raise InputError(
            f"the probe corpus {where} overlaps the forget/retain splits in {len(hits)} of {len(probe)} "
            f"examples (first: row {hits[0]}); the KL probe must be disjoint from D_f ∪ D_r"
        )


def context_length(max_length: int, context: int | None, explicit: bool, model: str) -> int:
    """The max_length to encode with: the benchmark's, capped at the model's context; an explicit ``--max-length``
    beyond the context stops (positions past it were never trained, so scores there mean nothing)."""
    if context is None or max_length <= context:
        return max_length
    if explicit:
        raise InputError(f"--max-length {max_length} exceeds the {context} positions of model {model}")
    return context
