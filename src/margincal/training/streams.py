"""Multi-stream batch iterators: one shuffled, seeded stream per named split, zipped per step."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from margincal.data.records import EncodedQA, cycle


def zip_streams(
    splits: Mapping[str, Sequence[EncodedQA]], batch_sizes: Mapping[str, int], pad_id: int, seed: int
) -> Iterator[dict[str, dict]]:
    """Yield ``{name: batch}`` forever; each split is cycled with its own seed offset."""
    iters = {
        name: cycle(examples, batch_sizes[name], pad_id, seed=seed + 1000 * i)
        for i, (name, examples) in enumerate(splits.items())
    }
    while True:
        yield {name: next(it) for name, it in iters.items()}
