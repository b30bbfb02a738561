"""The package installs as a wheel: configs and task files are package data, and the installed copy runs
``margincal methods`` and the demo (at smoke size) from outside the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import SMOKE

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from a copy of the source tree, installed into its own directory (dependencies: this venv)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src-copy"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    run = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root), str(src)]
    subprocess.run(run, check=True, capture_output=True)
    wheel = next(root.glob("margincal-*.whl"))
    target = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    subprocess.run(pip, check=True, capture_output=True)
    return wheel, target


def _run(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("MARGINCAL_CONFIGS", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_wheel_holds_configs_and_task_files(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src/margincal/configs").rglob("*.yaml")}
    assert shipped and shipped <= set(names)
    assert "margincal/evaluation/tasks/general_mc.jsonl" in names


def test_installed_wheel_lists_methods_and_runs_the_demo(installed, smoke_mini, tmp_path):
    _, target = installed
    where = _run(target, tmp_path, "-c", "import margincal, sys; print(margincal.__file__)")
    assert where.stdout.strip().startswith(str(target)), where  # the installed copy, not the source tree
    methods = _run(target, tmp_path, "-m", "margincal.cli", "methods")
    assert methods.returncode == 0 and "15 methods" in methods.stdout, methods.stderr
    store = smoke_mini.seed_store(tmp_path / "store")
    demo = _run(target, tmp_path, "-m", "margincal.cli", "demo", *SMOKE, f"store={store}", f"out={tmp_path / 'demo'}")
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "## T1 head-to-head" in (tmp_path / "demo" / "report.md").read_text()
