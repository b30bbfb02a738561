"""A SLURM job's preemption while a cell runs: the job's exit, not a failed cell."""

import os
import signal
import types

import pytest

from margincal.pipeline import executors
from margincal.pipeline.executors import CellJob


def test_a_preemption_turned_into_another_error_by_a_library_still_stops_the_job(tmp_path, monkeypatch):
    """submitit's preemption handler requeues the job and raises its exit wherever the cell is; torch, asked for the
    shape of a storage whose ``__getitem__`` the handler interrupted, raises a ValueError of its own instead. The job
    still exits with the handler's code (the local requeue's), and no failed record is written for the cell."""

    def submitit_handler(signum, frame):  # what submitit binds to SIGUSR2: requeue, then exit
        raise SystemExit(3)

    def run_cell(plan):
        try:
            os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs in this frame
        except SystemExit as err:
            raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'") from err

    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        job = CellJob(1, tmp_path / "logs")
        job.logs.mkdir()
        job.note_stop(signal.SIGUSR2)
        monkeypatch.setattr(executors, "run_cell", run_cell)
        cell = types.SimpleNamespace(id="cell")
        plan = types.SimpleNamespace(cell=cell, cfg=types.SimpleNamespace(out_dir=tmp_path / "out"))
        with pytest.raises(SystemExit) as stop:
            job._logged(plan, "7")
        assert stop.value.code == 3
        assert not (tmp_path / "out" / "cells" / "cell.json").exists()
        assert list((tmp_path / "out" / "cells").iterdir()) == []  # the running marker removed too

        monkeypatch.setattr(executors, "run_cell", lambda plan: 1 / 0)  # without a stop, a failure is recorded
        job.stop = None
        assert job._logged(plan, "7")["error"] == "ZeroDivisionError: division by zero"
    finally:
        signal.signal(signal.SIGUSR2, previous)
