"""A search's trials run several at once: the batch a search asks Optuna for (``search.workers`` trials, asked
before any of them is told) runs on worker processes of this machine or as Ray tasks, each trial an attack node
stored like any other, so the search then reads every trial of the batch from the store, in trial order, and tells
Optuna what the serial search would (:func:`margincal.auditing.study.completed_trials`).

Which trials a search runs depends on its seed and ``workers`` only, never on where they run: the executor
(``serial``, ``processes``, ``ray``) changes the wall time, not the card, as long as each trial runs on the same
number of torch threads (a float reduction split over more threads may round otherwise). A worker runs its trials
on ``max(1, CPUs // workers)`` threads and keeps its graph run, and with it the audited model, loaded from one trial
to the next.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from margincal.auditing.spaces import RAY_INSTALL, RAY_TRIALS
from margincal.core.terminal import quiet_libraries
from margincal.pipeline.executors import start_ray, usable_cpus
from margincal.pipeline.graph import GraphRun
from margincal.store.stage_store import Store


@dataclasses.dataclass(frozen=True)
class TrialWork:
    """What a worker needs to run the trial nodes of one audit: its ``graph``, its workspace ``ws`` (no model
    loaded), the ``store`` root, the stored directory of every graph node (``paths``: the audited models, θ_ref's
    evaluation), the torch ``threads`` of each trial, and a ``token`` naming this work in the worker's cache."""

    graph: Any
    ws: Any
    store: Path
    paths: dict[str, Path]
    threads: int
    token: str


_RUNS: dict[str, Any] = {}  # per worker process: token → its graph run (the audited model stays loaded)


def run_trial(work: TrialWork, node) -> str:
    """Run one trial node in this worker (or read it from the store) on ``work.threads`` threads; returns its key."""
    torch.set_num_threads(work.threads)
    if work.token not in _RUNS:
        _RUNS.clear()
        run = GraphRun(work.graph, work.ws, Store(work.store))
        run.paths.update(work.paths)
        _RUNS[work.token] = run
    _RUNS[work.token].execute(node)
    return node.key


_WORK: list[TrialWork] = []  # per process-pool worker: the work it was started with


def _start_worker(work: TrialWork) -> None:
    quiet_libraries()
    _WORK[:] = [work]


def _run_in_worker(node) -> str:
    return run_trial(_WORK[0], node)


class TrialPool:
    """Where a search's batches of trials run: ``serial`` runs nothing ahead (each trial runs when the search reads
    it), ``processes`` on ``workers`` spawned processes of this machine, ``ray`` as Ray tasks (a local instance of
    ``workers`` CPUs, or the cluster ``RAY_ADDRESS`` names)."""

    def __init__(self, executor: str, workers: int, run, store: Path):
        self.executor, self.workers = executor, workers
        self.threads = max(1, usable_cpus() // workers)
        self._pool: Any = None
        self._ray: Any = None
        self._started_ray = False
        if executor == "serial" or workers == 1:
            return
        ws = dataclasses.replace(run.ws, _frozen={})
        work = TrialWork(run.graph, ws, store, dict(run.paths), self.threads, uuid.uuid4().hex)
        if executor == "processes":
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(work,))
        else:
            self._start_ray(work)

    def _start_ray(self, work: TrialWork) -> None:
        address = os.environ.get("RAY_ADDRESS")
        ray, self._started_ray = start_ray(RAY_TRIALS, RAY_INSTALL, address, self.workers * self.threads)
        self._ray = (ray, ray.remote(num_cpus=self.threads)(run_trial), ray.put(work))

    def run(self, nodes: Sequence, done) -> None:
        """Run the trial ``nodes`` the store does not hold yet (``done(kind, key)``), all at once; the first failure
        is raised once every node has ended."""
        todo = [n for n in nodes if not done(n.kind, n.key)]
        if not todo or (self._pool is None and self._ray is None):
            return
        if self._pool is not None:
            for future in [self._pool.submit(_run_in_worker, node) for node in todo]:
                future.result()
        else:
            ray, remote, work = self._ray
            ray.get([remote.remote(work, node) for node in todo])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self._started_ray:
            self._ray[0].shutdown()
