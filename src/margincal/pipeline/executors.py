"""Run a panel's cells locally (sequentially) or as Ray tasks, with a live table of cells done / running / failed.

A failing cell is recorded (``<out>/cells/<id>.json`` with ``status: failed``, the error and its traceback) and
the panel goes on. A worker marks the cell it runs with ``<out>/cells/.<id>.running`` so the driver can show what
is running under either executor. Rerunning a panel reruns every cell; the store makes finished stages instant.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from margincal.artifacts import atomic_write_json, check_owned_dir, check_writable, manifest, own
from margincal.errors import require
from margincal.pipeline.panel import RAY_EXECUTOR, RAY_INSTALL, PanelConfig
from margincal.pipeline.plan import CellPlan, check_data, plan_panel
from margincal.report.records import SCHEMA
from margincal.store import Store


def run_cell_safely(plan: CellPlan) -> dict:
    """``run_cell`` that never raises: returns ``{id, status, error}`` and records failures on disk."""
    from margincal.pipeline.cell import run_cell

    cfg, cell = plan.cfg, plan.cell
    cells = cfg.out_dir / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    marker = cells / f".{cell.id}.running"
    marker.write_text(f"{socket.gethostname()} pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
    try:
        run_cell(plan)
        return {"id": cell.id, "status": "done"}
    except Exception as err:  # a failing cell is recorded and the panel goes on
        error = f"{type(err).__name__}: {err}"
        atomic_write_json(
            cells / f"{cell.id}.json",
            {
                "schema": SCHEMA,
                "id": cell.id,
                "status": "failed",
                "cell": cell.__dict__,
                "error": error,
                "traceback": traceback.format_exc(),
            },
        )
        return {"id": cell.id, "status": "failed", "error": error}
    finally:
        marker.unlink(missing_ok=True)


class LiveTable:
    """Cells done / running / failed: a rich live table on a terminal (counts in the title; running and failed cells,
    then the latest finished ones), one line per change otherwise."""

    def __init__(self, plans: Sequence[CellPlan], out: Path):
        self.ids = [p.cell.id for p in plans]
        self.status = dict.fromkeys(self.ids, "pending")
        self.errors: dict[str, str] = {}
        self.recent: list[str] = []  # finished cells, oldest first (the table shows the latest ones)
        self.max_rows = 20
        self.out, self.start = out, time.perf_counter()
        self.live = None
        if sys.stdout.isatty():
            from rich.live import Live

            self.live = Live(self._table(), refresh_per_second=2, redirect_stderr=True)
            self.live.start()

    def _table(self):
        from rich.table import Table

        counts = {s: sum(v == s for v in self.status.values()) for s in ("done", "running", "failed", "pending")}
        head = ", ".join(f"{n} {s}" for s, n in counts.items())
        table = Table(title=f"{head}  [{time.perf_counter() - self.start:.0f}s]")
        table.add_column("cell")
        table.add_column("status")
        table.add_column("error")
        colours = {"done": "green", "running": "yellow", "failed": "red", "pending": "dim"}
        shown = [c for c in self.ids if self.status[c] in ("running", "failed")]
        shown += [c for c in self.recent if c not in shown][-max(0, self.max_rows - len(shown)) :]
        for cid in sorted(shown, key=self.ids.index):
            status = self.status[cid]
            table.add_row(cid, f"[{colours[status]}]{status}[/]", self.errors.get(cid, "")[:80])
        if counts["pending"]:
            table.add_row(f"... {counts['pending']} pending", "", "")
        return table

    def poll_running(self) -> None:
        """Pick up the running markers workers write (Ray tasks run elsewhere)."""
        for cid in self.ids:
            if self.status[cid] == "pending" and (self.out / "cells" / f".{cid}.running").exists():
                self.set(cid, "running")

    def set(self, cid: str, status: str, error: str | None = None) -> None:
        if self.status[cid] == status:
            return
        self.status[cid] = status
        if status in ("done", "failed"):
            self.recent.append(cid)
        if error:
            self.errors[cid] = error
        if self.live is not None:
            self.live.update(self._table())
        else:
            done = sum(v in ("done", "failed") for v in self.status.values())
            tail = f": {error}" if error else ""
            print(
                f"[{time.perf_counter() - self.start:6.1f}s] {done}/{len(self.ids)} {status:<7} {cid}{tail}", flush=True
            )

    def close(self) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.stop()


def _local(cfg: PanelConfig, plans: Sequence[CellPlan], table: LiveTable) -> list[dict]:
    results = []
    for plan in plans:
        table.set(plan.cell.id, "running")
        result = run_cell_safely(plan)
        table.set(plan.cell.id, result["status"], result.get("error"))
        results.append(result)
    return results


def _ray_cell(plan: CellPlan, threads: int) -> dict:
    import torch

    torch.set_num_threads(max(1, threads))
    return run_cell_safely(plan)


def _ray(cfg: PanelConfig, plans: Sequence[CellPlan], table: LiveTable) -> list[dict]:
    ray = require("ray", RAY_EXECUTOR, RAY_INSTALL)

    started = not ray.is_initialized()
    if started:
        ray.init(
            address=cfg.ray.address,
            num_cpus=cfg.ray.num_cpus if cfg.ray.address is None else None,
            include_dashboard=False,
            log_to_driver=False,
        )
    try:
        task = ray.remote(_ray_cell).options(num_cpus=cfg.ray.cell_cpus, num_gpus=cfg.ray.cell_gpus, max_retries=0)
        pending = {task.remote(plan, int(cfg.ray.cell_cpus)): plan.cell for plan in plans}
        results = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            table.poll_running()
            for ref in done:
                cell = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as err:  # the worker died (out of memory, killed): record it like a failure
                    result = {"id": cell.id, "status": "failed", "error": f"{type(err).__name__}: {err}"}
                table.set(cell.id, result["status"], result.get("error"))
                results.append(result)
        return results
    finally:
        if started:
            ray.shutdown()


def run_panel(cfg: PanelConfig) -> dict:
    """Run every cell with the panel's executor; writes ``<out>/panel.json`` and returns it."""
    import dataclasses

    check_writable(cfg.out_dir, "out")
    check_writable(cfg.store_dir, "store")
    plans = plan_panel(cfg)
    check_data(plans)
    out = cfg.out_dir
    check_owned_dir(out, "out")
    (out / "cells").mkdir(parents=True, exist_ok=True)
    own(out, ["cells", "panel.json"])
    for stale in (out / "cells").glob(".*.running"):  # left by a killed run
        stale.unlink()
    table = LiveTable(plans, out)
    start = time.perf_counter()
    try:
        results = (_ray if cfg.executor == "ray" else _local)(cfg, plans, table)
    finally:
        table.close()
    summary = {
        "name": cfg.name,
        "seconds": time.perf_counter() - start,
        "counts": {s: sum(r["status"] == s for r in results) for s in ("done", "failed")},
        "cells": results,
        "manifest": manifest(dataclasses.asdict(cfg), seed=cfg.seeds[0] if cfg.seeds else 0),
    }
    atomic_write_json(out / "panel.json", summary)
    return summary


def dry_run(cfg: PanelConfig) -> list[dict]:
    """Per cell: its plan and which of its stage nodes are already stored, without loading any model (at paper
    scale the training forget split is read for |D_f|, which the schedules depend on)."""
    plans = plan_panel(cfg)
    check_data(plans)
    store = Store(cfg.store_dir)
    return [
        {
            "id": plan.cell.id,
            "plan": plan,
            "stages": {n.label: store.done(n.kind, n.key) for n in plan.graph.nodes},
            "models": plan.family.status(plan.cell.tier),
        }
        for plan in plans
    ]
