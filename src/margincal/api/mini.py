"""The mini benchmark as a library function: :func:`mini_export` (its models and files, for single-stage runs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from margincal.config.typed import apply_overrides, build, checked_call
from margincal.core.artifacts import check_output, publish_dir
from margincal.core.errors import InputError
from margincal.mini.data import generate
from margincal.mini.models import MiniModelConfig, build_mini_models, retain_split
from margincal.pipeline.panel import load_panel
from margincal.results.outputs import MiniExport
from margincal.store.stage_store import Store, default_store


@checked_call
def mini_export(
    directory: str | Path,
    tier: str = "forget10",
    *,
    panel: str | None = None,
    overrides: Sequence[str] = (),
    store: str | Path | None = None,
    overwrite: bool = False,
) -> MiniExport:
    """Build (or read from the store) the mini θ0 and the retain-only θ_ref of ``tier`` with the mini settings of
    ``panel`` (default the defaults; ``key=value`` ``overrides`` on :class:`~margincal.mini.models.MiniModelConfig`)
    and write every mini split as a TOFU-format file into ``directory``, with ``mini.json`` (the result saved).

    Example (not run by the tests: with other than the shipped settings it builds the mini models, about 2 minutes
    on 2 CPU cores)::

        mini = margincal.api.mini_export("runs/mini")
        print(mini.theta0, mini.ref)
    """
    out = check_output(directory, directory=True, overwrite=overwrite, flag="DIR")
    base = dataclasses.asdict(load_panel(panel).mini) if panel else {}
    cfg = build(MiniModelConfig, apply_overrides(base, list(overrides)), f"panel {panel}: mini" if panel else "mini")
    bench = generate(cfg.data)
    if tier not in bench.splits:
        raise InputError(f"the mini benchmark has no tier {tier!r}; it has forget01, forget05 and forget10")
    paths = build_mini_models(cfg, tier, Store(store or default_store()), bench)
    export = MiniExport(str(out), str(paths.theta0), str(paths.ref), tier, retain_split(tier), sorted(bench.splits))
    with publish_dir(out) as tmp:
        bench.to_json_dir(tmp)
        export.save(tmp / "mini.json", {"mini": dataclasses.asdict(cfg), "tier": tier})
    return export
