"""A benchmark's splits for one forget tier: split names with the tier filled in, and the records they hold.

Role → split name comes from the :class:`~margincal.config.settings.BenchmarkSpec`; the records from a split reader: a
model family's (:mod:`margincal.pipeline.families`), or :func:`margincal.data.tofu.load_split` over an HF dataset id or
a local directory in the hub layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence

from margincal.config.settings import BenchmarkSpec
from margincal.core.artifacts import digest
from margincal.core.errors import InputError
from margincal.data.records import QARecord, check_distinct, evaluated_fields, seeded_subset

TIER_CHOICES = "forget01, forget05 or forget10"


def forget_pct(tier: str) -> int | None:
    """The forget percentage of a ``forgetNN`` tier (``forget01`` → 1, ``forget10`` → 10); ``None`` for any other
    tier (a benchmark's own tier names, e.g. MUSE's ``news``). The one parser of tier names."""
    if tier.startswith("forget") and tier[6:].isdigit():
        return int(tier[6:])
    return None


def tier_fields(tier: str) -> dict[str, str]:
    """Placeholders of split names: ``{tier}``, and for ``forgetNN`` tiers ``{pct}``/``{retain_pct}`` (10, 90)."""
    fields = {"tier": tier}
    pct = forget_pct(tier)
    if pct is not None:
        fields.update(pct=f"{pct:02d}", retain_pct=f"{100 - pct:02d}")
    return fields


def retain_split(tier: str) -> str:
    """The TOFU-named retain split of a ``forgetNN`` tier (``forget10`` → ``retain90``); other tiers stop."""
    pct = forget_pct(tier)
    if pct is None:
        raise InputError(f"unknown forget tier {tier!r}; use {TIER_CHOICES}")
    return f"retain{100 - pct:02d}"


def fill_split(name: str, spec: BenchmarkSpec, tier: str) -> str:
    try:
        return name.format(**tier_fields(tier))
    except KeyError as err:
        raise InputError(f"tier {tier!r} does not fit the {spec.name} split {name!r}; use {TIER_CHOICES}") from err


def split_names(spec: BenchmarkSpec, tier: str) -> dict[str, str]:
    """Role → split name of the benchmark's evaluation splits with the tier placeholders filled in."""
    return {role: fill_split(name, spec, tier) for role, name in spec.splits.items()}


def load_benchmark_splits(
    spec: BenchmarkSpec, tier: str, split: Callable[[str], list[QARecord]], optional: Collection[str] = ()
) -> dict[str, list[QARecord]]:
    """The benchmark's evaluation splits, read by ``split(name)`` (a family's
    :attr:`~margincal.pipeline.families.Resolved.split`
    or :func:`margincal.data.tofu.load_split` of a source); ``spec.retain_n`` keeps a seeded retain subset. A role in
    ``optional`` whose split is not found is left out (the audit of a user's own QA without utility splits)."""
    splits = {}
    for role, name in split_names(spec, tier).items():
        try:
            splits[role] = split(name)
        except FileNotFoundError:
            if role not in optional:
                raise
    if "forget" in splits:
        check_distinct(splits["forget"], f"the {split_names(spec, tier)['forget']} split")
    if spec.retain_n and "retain" in splits and len(splits["retain"]) > spec.retain_n:
        splits["retain"] = seeded_subset(splits["retain"], spec.retain_n, 0)
    return splits


def shots_of(spec: BenchmarkSpec, splits: dict[str, Sequence[QARecord]], role: str) -> Sequence[QARecord]:
    """The few-shot pairs placed before each question of ``role``: its ``<role>_icl`` split when the benchmark prompts
    few-shot (``spec.few_shot``, MUSE knowmem), else none."""
    return splits.get(f"{role}_icl", ()) if spec.few_shot else ()


def data_identity(
    spec: BenchmarkSpec, tier: str, template: dict | None, splits: Mapping[str, Sequence[QARecord]]
) -> dict:
    """What an evaluation's numbers depend on besides the model and its settings, as store keys hold it: the benchmark
    spec (``max_length`` as capped for the model), the tier, the prompt template (its fields) and the content of
    every evaluation split present (a digest of each record's fields, in order). A panel's cell and an audit on the
    same data and template get the same identity, so an audit against a panel's θ_ref and θ0 reads their stored
    evaluations and attacks. A record's fields are what its evaluation reads (:func:`~.records.evaluated_fields`)."""
    contents = {role: digest([evaluated_fields(r) for r in records]) for role, records in sorted(splits.items())}
    return {"benchmark": dataclasses.asdict(spec), "tier": tier, "template": template, "splits": contents}
