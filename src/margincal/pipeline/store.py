"""Atomic result files and run manifests (config, package versions, git commit, seed)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = (
    "margincal",
    "torch",
    "transformers",
    "peft",
    "tokenizers",
    "rouge-score",
    "scipy",
    "scikit-learn",
)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write via a temp file in the same directory and ``os.replace`` it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def git_commit() -> str:
    """HEAD of the source checkout (``+dirty`` if modified), or ``unknown`` outside git."""
    src = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=src,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def manifest(config: dict, seed: int, extra: dict | None = None) -> dict:
    """Provenance block written beside every result."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "seed": seed,
        "git_commit": git_commit(),
        "versions": package_versions(),
        "config": config,
        **(extra or {}),
    }
