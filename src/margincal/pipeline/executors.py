"""Run a panel's cells locally (sequentially), as Ray tasks or as SLURM jobs (submitit), with a live table of cells
done / running / failed. Every executor runs the same function on each cell (:func:`run_cell_safely`), from the
same plans, into the same store: where a cell ran enters no stage key and no record.

A failing cell is recorded (``<out>/cells/<id>.json`` with ``status: failed``, the error and its traceback) and
the panel goes on; so is a cell whose worker died (a Ray worker or SLURM job killed, out of memory). A worker marks
the cell it runs with ``<out>/cells/.<id>.running`` so the driver can show what is running under any executor.
Rerunning a panel reruns every cell; the store makes finished stages instant.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from margincal.core.artifacts import atomic_write_json, check_owned_dir, check_writable, manifest, own
from margincal.core.errors import InputError, RefusedError, refusal, require
from margincal.core.terminal import quiet_libraries
from margincal.pipeline.cell import run_cell
from margincal.pipeline.panel import RAY_EXECUTOR, RAY_INSTALL, SLURM_EXECUTOR, SLURM_INSTALL, PanelConfig
from margincal.pipeline.plan import CellPlan, check_data, plan_panel
from margincal.reporting.records import SCHEMA
from margincal.store.stage_store import Store


def record_failure(plan: CellPlan, error: str, trace: str) -> dict:
    """Write the cell's failed record (``<out>/cells/<id>.json``) and return its ``{id, status, error}``."""
    cell = plan.cell
    atomic_write_json(
        plan.cfg.out_dir / "cells" / f"{cell.id}.json",
        {
            "schema": SCHEMA,
            "id": cell.id,
            "status": "failed",
            "cell": cell.__dict__,
            "error": error,
            "traceback": trace,
        },
    )
    return {"id": cell.id, "status": "failed", "error": error}


def run_cell_safely(plan: CellPlan, stopped: Callable[[], BaseException | None] = lambda: None) -> dict:
    """``run_cell`` that never raises: returns ``{id, status, error}`` and records failures on disk. The one
    exception is the worker's own stop: where ``stopped()`` names one (a SLURM job's preemption, whose handler
    raises its exit wherever the cell was, possibly inside a library that turns it into an error of its own), that
    stop is raised again instead of recording the cell as failed."""
    cells = plan.cfg.out_dir / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    marker = cells / f".{plan.cell.id}.running"
    marker.write_text(f"{socket.gethostname()} pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
    try:
        run_cell(plan)
        return {"id": plan.cell.id, "status": "done"}
    except Exception as err:  # a failing cell is recorded and the panel goes on
        if (stop := stopped()) is not None:
            raise stop from None
        return record_failure(plan, f"{type(err).__name__}: {err}", traceback.format_exc())
    finally:
        marker.unlink(missing_ok=True)


def worker_died(plan: CellPlan, err: BaseException, since: float) -> dict:
    """The result of a cell whose worker died (a Ray task or SLURM job lost): the cell's own record when it
    finished before (written after ``since``), else a failed record naming the worker's error."""
    path = plan.cfg.out_dir / "cells" / f"{plan.cell.id}.json"
    if path.exists() and path.stat().st_mtime >= since:
        record = json.loads(path.read_text())
        return {
            "id": plan.cell.id,
            "status": record["status"],
            **({"error": record["error"]} if "error" in record else {}),
        }
    trace = "".join(traceback.format_exception(err))
    return record_failure(plan, f"the worker died: {type(err).__name__}: {str(err).strip()[-500:]}", trace)


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


def usable_cpus() -> int:
    """The CPUs this process may run on (a SLURM job's allocation, where its cgroup sets the affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _set_threads(threads: int) -> None:
    """A worker's torch threads: the CPUs its cell was given (cell results depend on them at float precision)."""
    import torch

    torch.set_num_threads(max(1, threads))


def _ray_cell(plan: CellPlan, threads: int) -> dict:
    _set_threads(threads)
    return run_cell_safely(plan)


def start_ray(what: str, install: str, address: str | None = None, num_cpus: int | None = None):
    """Ray (missing: one line naming ``what`` needs it and ``install``), connected to the cluster at ``address`` or
    a local instance of ``num_cpus`` CPUs unless this process already holds one; returns (ray, whether it started it,
    and so must shut it down). A start-up that fails is one line with Ray's reason."""
    ray = require("ray", what, install)
    if ray.is_initialized():
        return ray, False
    try:
        ray.init(
            address=address,
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            log_to_driver=False,
        )
    except Exception as err:  # no cluster at the address, a start-up that failed: Ray's reason, one line
        where = f"the cluster at ray.address={address}" if address else "a local Ray instance"
        raise RefusedError(f"Ray did not start {where}: {refusal(err)}") from None
    return ray, True


def _ray(cfg: PanelConfig, plans: Sequence[CellPlan], table: LiveTable) -> list[dict]:
    ray, started = start_ray(RAY_EXECUTOR, RAY_INSTALL, cfg.ray.address, cfg.ray.num_cpus)
    try:
        task = ray.remote(_ray_cell).options(num_cpus=cfg.ray.cell_cpus, num_gpus=cfg.ray.cell_gpus, max_retries=0)
        since = time.time()
        pending = {task.remote(plan, int(cfg.ray.cell_cpus)): plan for plan in plans}
        results = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            table.poll_running()
            for ref in done:
                plan = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as err:  # the worker died (out of memory, killed): record it like a failure
                    result = worker_died(plan, err, since)
                table.set(plan.cell.id, result["status"], result.get("error"))
                results.append(result)
        return results
    finally:
        if started:
            ray.shutdown()


class CellJob:
    """What one SLURM job runs: its packed cells, split over the job's tasks (task r of n runs cells r, r + n, ...),
    each cell with ``threads`` torch threads (at most the CPUs the job may use) and its output in
    ``<logs>/<cell id>.log``. submitit calls :meth:`checkpoint` when the job is preempted or times out: the job is
    requeued with the same cells, which resume from the store (a finished stage is not run again)."""

    def __init__(self, threads: int, logs: Path):
        self.threads, self.logs = threads, logs
        self.stop: BaseException | None = None

    def __call__(self, plans: Sequence[CellPlan]) -> list[dict]:
        import submitit

        env = submitit.JobEnvironment()
        self.note_stop(signal.Signals[f"SIG{env.USR_SIG}"])
        quiet_libraries()
        _set_threads(min(self.threads, usable_cpus()))
        self.logs.mkdir(parents=True, exist_ok=True)
        return [self._logged(plan, env.job_id) for plan in plans[env.global_rank :: env.num_tasks]]

    def _logged(self, plan: CellPlan, job: str) -> dict:
        """Run one cell with everything the process writes (its output, warnings, margincal's log lines, submitit's
        lines on a preemption) in the cell's log file: file descriptors 1 and 2 point there while it runs, so every
        stream and handler made for ``sys.stdout`` or ``sys.stderr`` writes there too, and none is left on a closed
        file."""
        sys.stdout.flush(), sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        with open(self.logs / f"{plan.cell.id}.log", "a") as handle:
            os.dup2(handle.fileno(), 1)
            os.dup2(handle.fileno(), 2)
            try:
                print(f"== {plan.cell.id}: job {job} on {socket.gethostname()} at {time.strftime('%F %T')}", flush=True)
                result = run_cell_safely(plan, lambda: self.stop)
                print(f"== {plan.cell.id}: {result['status']} at {time.strftime('%F %T')}", flush=True)
                return result
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                for fd, copy in zip((1, 2), saved, strict=True):
                    os.dup2(copy, fd)
                    os.close(copy)

    def note_stop(self, signum: signal.Signals) -> None:
        """Keep what the handler of ``signum`` (submitit's preemption handler: it requeues the job, then raises
        ``SystemExit`` in whatever code the job was running) raises in :attr:`stop`, so the cell is not recorded as
        failed when a library turns that exit into an error of its own on its way up."""
        handler = signal.getsignal(signum)
        if not callable(handler):
            return

        def noted(number: int, frame) -> None:
            try:
                handler(number, frame)
            except BaseException as stop:
                self.stop = stop
                raise

        signal.signal(signum, noted)

    def checkpoint(self, plans: Sequence[CellPlan]):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, plans)


def check_slurm(cfg: PanelConfig):
    """submitit, after stopping with one line where the panel's SLURM executor cannot submit: submitit missing, or
    (``backend: slurm``) the SLURM commands not on this machine's PATH."""
    submitit = require("submitit", SLURM_EXECUTOR, SLURM_INSTALL)
    missing = [c for c in ("sbatch", "srun", "sacct") if cfg.slurm.backend == "slurm" and shutil.which(c) is None]
    if missing:
        raise InputError(
            f"executor slurm needs the SLURM commands, and {', '.join(missing)} is not on this machine's PATH: run "
            "the panel on the cluster's login node, or use slurm.backend=local to run the jobs here"
        )
    return submitit


def _slurm_executor(cfg: PanelConfig):
    """submitit's executor for the panel's ``slurm`` settings (``backend: local``: its local executor); it makes its
    folder, ``<out>/slurm/jobs``."""
    submitit = check_slurm(cfg)
    s = cfg.slurm
    folder = cfg.out_dir / "slurm" / "jobs"
    executor = submitit.AutoExecutor(
        folder, cluster=s.backend, slurm_max_num_timeout=s.max_requeues, local_max_num_timeout=s.max_requeues
    )
    named = {"partition": s.partition, "account": s.account, "qos": s.qos, "constraint": s.constraint}
    executor.update_parameters(
        name=f"margincal-{cfg.name}",
        timeout_min=s.time_min,
        nodes=1,
        tasks_per_node=s.tasks_per_job,
        cpus_per_task=s.cpus_per_cell,
        gpus_per_node=s.gpus_per_job,
        **({"mem_gb": s.mem_gb} if s.mem_gb is not None else {}),
        **{f"slurm_{k}": v for k, v in named.items() if v is not None},
        slurm_array_parallelism=s.array_parallelism,
        slurm_setup=list(s.setup),
        slurm_additional_parameters=dict(s.additional),
        local_setup=list(s.setup),
    )
    return executor


def _submit(executor, job: CellJob, batch: list) -> list:
    """``executor.map_array(job, batch)``; sbatch's refusal (a partition or account it does not know, a limit) is one
    line with its reason (submitit's echo of it on stderr held back)."""
    from submitit.core.utils import FailedJobError

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return executor.map_array(job, batch)
    except FailedJobError as err:
        raise RefusedError(
            f"sbatch refused the panel's jobs: {refusal(err)}; check the panel's slurm settings (partition, account, "
            "qos, additional)"
        ) from None


def _slurm(cfg: PanelConfig, plans: Sequence[CellPlan], table: LiveTable) -> list[dict]:
    """Submit the cells as SLURM jobs of ``cells_per_job`` cells (one job array, at most ``array_parallelism`` at
    once) and wait for them; the local backend starts at most ``array_parallelism`` jobs at once itself, and no
    more than the machine's CPUs hold (``cpus_per_cell`` × ``tasks_per_job`` each)."""
    s = cfg.slurm
    executor = _slurm_executor(cfg)
    job = CellJob(s.cpus_per_cell, cfg.out_dir / "slurm" / "cells")
    queued = [list(plans[i : i + s.cells_per_job]) for i in range(0, len(plans), s.cells_per_job)]
    fits = max(1, usable_cpus() // (s.cpus_per_cell * s.tasks_per_job))  # local jobs this machine holds at once
    window = len(queued) if s.backend == "slurm" else min(s.array_parallelism, fits)
    running: dict = {}
    results: list[dict] = []
    since = time.time()
    while queued or running:
        if queued and len(running) < window:
            batch, queued = queued[: window - len(running)], queued[window - len(running) :]
            running.update(zip(_submit(executor, job, batch), batch, strict=True))
        time.sleep(1.0)
        table.poll_running()
        for submitted in [j for j in running if j.done()]:
            group = running.pop(submitted)
            try:
                outcome = [r for task in submitted.results() for r in task]
            except Exception as err:  # the job died (killed, out of memory, out of requeues)
                outcome = [worker_died(plan, err, since) for plan in group]
            for result in outcome:
                table.set(result["id"], result["status"], result.get("error"))
                results.append(result)
    return results


def run_panel(cfg: PanelConfig) -> dict:
    """Run every cell with the panel's executor; writes ``<out>/panel.json`` and returns it."""
    import dataclasses

    check_writable(cfg.out_dir, "out")
    check_writable(cfg.store_dir, "store")
    cfg = dataclasses.replace(cfg, out=str(cfg.out_dir), store=str(cfg.store_dir))  # workers may start elsewhere
    if cfg.executor == "slurm":
        check_slurm(cfg)  # no SLURM here: one line, before planning
    plans = plan_panel(cfg)
    check_data(plans)
    out = cfg.out_dir
    check_owned_dir(out, "out")
    made = [p for p in (out, out / "slurm") if not p.exists()]  # what this run makes, removed if nothing can start
    (out / "cells").mkdir(parents=True, exist_ok=True)
    own(out, ["cells", "panel.json", *(["slurm"] if cfg.executor == "slurm" else [])])
    for stale in (out / "cells").glob(".*.running"):  # left by a killed run
        stale.unlink()
    table = LiveTable(plans, out)
    start = time.perf_counter()
    try:
        results = {"local": _local, "ray": _ray, "slurm": _slurm}[cfg.executor](cfg, plans, table)
    except RefusedError:
        if made and not any((out / "cells").glob("*.json")):  # nothing ran: leave no trace of this run
            shutil.rmtree(made[0], ignore_errors=True)
        raise
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
