"""The documentation: a README of one screen whose two commands come first, and the docs site built with
``mkdocs build --strict`` (a broken link, a page missing from the nav or a generated reference page that fails to
build stops it)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_one_screen_with_the_two_commands_first():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    first = "\n".join(lines[:30])
    assert '.venv/bin/pip install torch==2.13.0 -e ".[dev]" && .venv/bin/margincal demo' in first
    assert ".venv/bin/python -m pytest -q" in first


def test_docs_holds_documentation_only():
    kinds = {p.suffix for p in (ROOT / "docs").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert kinds == {".md", ".py"}  # pages and the hook generating the reference pages


def test_the_site_builds_strictly_with_its_generated_reference(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml")]
    run += ["-d", str(tmp_path)]
    done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "margincal audit" in cli and "--budget" in cli  # every command's help, from the parser
    config = (tmp_path / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert "MCConfig" in config and "kl_weight" in config and "a positive number" in config  # fields and checks
    metrics = (tmp_path / "reference" / "metrics" / "index.html").read_text(encoding="utf-8")
    assert "forget_Q_A_ROUGE" in metrics and "margincal.evaluation.metrics" in metrics
    assert "GradDiff" in (tmp_path / "reference" / "methods" / "index.html").read_text(encoding="utf-8")
    assert "def evaluate" not in (api := (tmp_path / "reference" / "api" / "index.html").read_text(encoding="utf-8"))
    assert "diagnose" in api and "AuditCard" in api
