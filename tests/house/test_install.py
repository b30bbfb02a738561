"""The package installs as a wheel: configs and task files are package data, and the installed copy runs
``margincal methods`` and the demo (at smoke size, timed by benchmarks/speed/demo_time.py) from outside the source tree,
as a core install without extras has it (lm-eval, Ray, submitit and Optuna unimportable)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

from tests.conftest import SMOKE

# demo_time.py's smallest setting: one cell (NPO, reference-anchored MC) on the smoke mini, shipped in the wheel
DEMO_TIME = [*SMOKE, "method_overrides={NPO: {train: {steps: 3}}}", "variants=[reference]", "methods=[NPO]",
             "mc.train.steps=1", "eval.gradnorm=false"]  # fmt: skip


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


EXTRAS = ("lm_eval", "ray", "submitit", "optuna")  # what margincal[mmlu], [ray], [slurm] and [search] install


def _run(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run Python on the installed copy as a core install (no extras) has it: a ``sitecustomize`` on the path makes
    every extra's package unimportable, in this process and in the ones it starts."""
    core = target.parent / "core-only"
    core.mkdir(exist_ok=True)
    (core / "sitecustomize.py").write_text(f"import sys\nfor name in {EXTRAS!r}:\n    sys.modules[name] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{core}{os.pathsep}{target}"}
    env.pop("MARGINCAL_CONFIGS", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_wheel_holds_configs_and_task_files(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src/margincal/configs").rglob("*.yaml")}
    assert shipped and shipped <= set(names)
    assert "margincal/evaluation/tasks/general_mc.jsonl" in names
    models = ROOT / "src/margincal/mini/shipped"  # the shipped mini models, every file but the ownership markers
    files = {p.relative_to(ROOT / "src").as_posix() for p in models.rglob("*") if p.is_file()}
    assert {f for f in files if not f.endswith("/.margincal.json")} <= set(names) and len(files) > 40


def test_installed_wheel_lists_methods_and_times_the_demo(installed, tmp_path):
    """``margincal methods`` and ``benchmarks/speed/demo_time.py`` (the demo twice, cold and warm, each in a fresh
    process, at its smallest setting) run from the installed copy: the demo's configs, its mini models (the shipped
    smoke set, nothing trained) and the report come from the wheel's package data. This is demo_time.py's smoke test too
    (tests/e2e/test_benchmarks.py)."""
    _, target = installed
    code = (
        "import margincal, sys; print(margincal.__file__); from margincal.cli import main; sys.exit(main(['methods']))"
    )
    hidden = _run(target, tmp_path, "-c", "import ray")
    assert hidden.returncode != 0 and "ray" in hidden.stderr  # a core install: the extras cannot be imported
    methods = _run(target, tmp_path, "-c", code)
    where = methods.stdout.splitlines()[0] if methods.stdout else ""
    assert where.startswith(str(target)), methods  # the installed copy, not the source tree
    assert methods.returncode == 0 and "16 methods" in methods.stdout, methods.stderr
    timed = _run(target, tmp_path, str(ROOT / "benchmarks" / "speed" / "demo_time.py"), *DEMO_TIME)
    assert timed.returncode == 0, timed.stderr[-2000:]
    assert timed.stdout.count("1/1 done") == 2 and timed.stdout.count("report.md") == 2, timed.stdout
    assert "mini models: copied from the shipped set" in timed.stdout
    assert " cold run:" in timed.stdout and " warm run:" in timed.stdout and "warm-run stages: evaluate" in timed.stdout
    assert not any(tmp_path.iterdir())  # demo_time works in a temporary folder of its own
