"""Panels and their reports as library functions: :func:`run_panel`, :func:`report`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from margincal.config.typed import checked_call
from margincal.pipeline.executors import run_panel as run_cells
from margincal.pipeline.panel import load_panel
from margincal.reporting.panel import write_report
from margincal.results.outputs import PanelResult


@checked_call
def run_panel(panel: str | Path = "demo", overrides: Sequence[str] = (), report: bool = False) -> PanelResult:
    """Run a panel (a shipped name such as ``demo``, ``mini-head2head``, ``testbed``, or a panel YAML) with
    ``key=value`` ``overrides``: every cell (method × variant × seed × tier × model family) through the store, on
    the panel's executor (local, Ray or SLURM). ``report``: also write its report (:func:`report`).

    Example (not run by the tests as written: the demo panel runs minutes; ``tests/integration/test_panel.py`` runs
    panels)::

        result = margincal.run_panel("demo", ["seeds=[1]"], report=True)
        print(result.counts, result.report)
    """
    cfg = load_panel(panel, list(overrides))
    summary = run_cells(cfg)
    written = write_report(cfg.out_dir) if report else None
    return PanelResult(
        name=cfg.name,
        out=str(cfg.out_dir),
        counts=summary["counts"],
        cells=summary["cells"],
        seconds=summary["seconds"],
        report=None if written is None else str(written),
    )


@checked_call
def report(results: str | Path, out: str | Path | None = None) -> Path:
    """The report of a panel's results directory (tables, figures, ``report.md``; no torch), into ``out`` (default
    the results directory). Returns the path of ``report.md``.

    Example (the committed head-to-head panel's records)::

        print(margincal.report("results/mini/head2head", f"{tmp}/report"))
    """
    return write_report(results, out)
