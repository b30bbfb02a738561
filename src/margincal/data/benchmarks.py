"""A benchmark's splits for one forget tier: split names with the tier filled in, and the records they hold.

Role → split name comes from the :class:`~margincal.config.BenchmarkSpec`; the records from a split reader: a model
family's (:mod:`margincal.families`), or :func:`margincal.data.tofu.load_split` over an HF dataset id or a local
directory in the hub layout.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from margincal.config import BenchmarkSpec
from margincal.data.records import QARecord


def tier_fields(tier: str) -> dict[str, str]:
    """Placeholders of split names: ``{tier}``, and for ``forgetNN`` tiers ``{pct}``/``{retain_pct}`` (10, 90)."""
    fields = {"tier": tier}
    if tier.startswith("forget") and tier[6:].isdigit():
        pct = int(tier[6:])
        fields.update(pct=f"{pct:02d}", retain_pct=f"{100 - pct:02d}")
    return fields


def fill_split(name: str, spec: BenchmarkSpec, tier: str) -> str:
    try:
        return name.format(**tier_fields(tier))
    except KeyError as err:
        raise ValueError(
            f"tier {tier!r} does not fit the {spec.name} split {name!r}; use forget01, forget05 or forget10"
        ) from err


def split_names(spec: BenchmarkSpec, tier: str) -> dict[str, str]:
    """Role → split name of the benchmark's evaluation splits with the tier placeholders filled in."""
    return {role: fill_split(name, spec, tier) for role, name in spec.splits.items()}


def load_benchmark_splits(
    spec: BenchmarkSpec, tier: str, split: Callable[[str], list[QARecord]]
) -> dict[str, list[QARecord]]:
    """The benchmark's evaluation splits, read by ``split(name)`` (a family's :attr:`~margincal.families.Resolved.split`
    or :func:`margincal.data.tofu.load_split` of a source); ``spec.retain_n`` keeps a seeded retain subset."""
    splits = {role: split(name) for role, name in split_names(spec, tier).items()}
    if spec.retain_n and "retain" in splits and len(splits["retain"]) > spec.retain_n:
        keep = sorted(random.Random(0).sample(range(len(splits["retain"])), spec.retain_n))
        splits["retain"] = [splits["retain"][i] for i in keep]
    return splits
