"""What a stage cost: wall seconds, peak memory, tokens processed, tokens per second and the device.

Tokens are one process-wide count: the training loop adds each micro-batch's attended tokens, the scoring pass
each scored sequence's prompt and answer tokens, greedy decoding each prompt's tokens and each new one (the
gradnorm detector's per-sample backward is not counted). :func:`metered` reads the count around a stage. Peak
memory: on CUDA the allocator's peak, reset when the stage starts; on a CPU the process's peak resident set
(``VmHWM``), reset when the stage starts through ``/proc/self/clear_refs`` where Linux allows it, else the peak since
the process started (and ``memory`` says which). torch is read from ``sys.modules``, never imported here.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from margincal.core.artifacts import cpu_name

_TOKENS = [0]


def add_tokens(n: int) -> None:
    """Count ``n`` processed tokens in this process."""
    _TOKENS[0] += int(n)


def _cuda():
    """torch, when this process has initialised CUDA; else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set to the current one
        return True
    except OSError:
        return False


def _peak_rss_gib() -> float:
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


@contextlib.contextmanager
def metered() -> Iterator[dict]:
    """Yields a dict that holds, once the block ends: ``seconds``, ``tokens``, ``tokens_per_s``,
    ``peak_memory_gib``, ``memory`` (what the peak measures) and ``device``."""
    cost: dict = {}
    cuda = _cuda()
    if cuda is not None:
        cuda.cuda.reset_peak_memory_stats()
    reset = _reset_peak_rss()
    tokens, start = _TOKENS[0], time.perf_counter()
    yield cost
    seconds, count = time.perf_counter() - start, _TOKENS[0] - tokens
    cuda = _cuda()
    if cuda is not None:
        peak, memory, device = cuda.cuda.max_memory_allocated() / 2**30, "GPU allocated", cuda.cuda.get_device_name()
    else:
        peak, memory, device = _peak_rss_gib(), "peak RSS" if reset else "peak RSS since start", cpu_name()
    cost.update(
        seconds=seconds,
        tokens=count,
        tokens_per_s=count / seconds if seconds > 0 else None,
        peak_memory_gib=peak,
        memory=memory,
        device=device,
    )


def summed(costs: list[tuple[str, dict]]) -> dict:
    """Stage costs ``(stage kind, cost)`` added up: ``stages``, ``seconds`` and ``tokens`` summed, ``by_kind``
    seconds per stage kind, the largest ``peak_memory_gib``, and the ``memory`` kinds and ``devices`` met."""
    by_kind: dict[str, float] = {}
    for kind, cost in costs:
        by_kind[kind] = by_kind.get(kind, 0.0) + cost["seconds"]
    return {
        "stages": len(costs),
        "seconds": sum(c["seconds"] for _, c in costs),
        "by_kind": by_kind,
        "tokens": sum(c["tokens"] for _, c in costs),
        "peak_memory_gib": max((c["peak_memory_gib"] for _, c in costs), default=None),
        "memory": sorted({c["memory"] for _, c in costs}),
        "devices": sorted({c["device"] for _, c in costs}),
    }
