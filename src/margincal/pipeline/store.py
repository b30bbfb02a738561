"""Atomic result files, run manifests (config, package versions, git commit, seed) and the stage artifact store."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
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
    "ray",
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


def config_key(stage: str, config: Any, inputs: Sequence[str] = ()) -> str:
    """Content key of a stage: sha256 of its name, canonical JSON config and the keys of its inputs (16 hex)."""
    blob = json.dumps({"stage": stage, "config": config, "inputs": list(inputs)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Store:
    """Artifact cache: ``<root>/<stage>/<key>/`` exists only once the stage finished.

    A stage writes into a private temp directory that is renamed into place at the end (an atomic directory
    rename), so a process killed at any point leaves no half-written artifact: only a ``.tmp`` directory that the
    next writer of that key removes. A per-key ``fcntl`` lock makes concurrent workers (Ray tasks on one machine or
    a shared POSIX file system) wait for a stage another worker is computing instead of computing it twice.
    """

    META = "stage.json"

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def done(self, stage: str, key: str) -> bool:
        return (self.path(stage, key) / self.META).exists()

    def meta(self, stage: str, key: str) -> dict:
        return json.loads((self.path(stage, key) / self.META).read_text())

    @contextlib.contextmanager
    def _lock(self, stage: str, key: str) -> Iterator[None]:
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{stage}-{key}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def run(self, stage: str, key: str, config: Any, build: Callable[[Path], dict | None]) -> Path:
        """The finished directory of (stage, key), running ``build(tmp_dir) -> info`` first if it is missing.

        ``info`` (JSON) is stored in ``stage.json`` with the config, the wall time and a manifest."""
        final = self.path(stage, key)
        if self.done(stage, key):
            return final
        with self._lock(stage, key):
            if self.done(stage, key):  # another worker finished it while we waited
                return final
            for stale in final.parent.glob(f".{key}.tmp-*"):  # left by a killed writer of this key
                shutil.rmtree(stale, ignore_errors=True)
            tmp = final.parent / f".{key}.tmp-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            start = time.perf_counter()
            info = build(tmp) or {}
            meta = {
                "stage": stage,
                "key": key,
                "seconds": time.perf_counter() - start,
                "info": info,
                "manifest": manifest(config, seed=_seed_of(config)),
            }
            (tmp / self.META).write_text(json.dumps(meta, indent=2, default=str) + "\n")
            if final.exists():  # an incomplete directory without stage.json (never produced by this class)
                shutil.rmtree(final)
            os.replace(tmp, final)
        return final


def _seed_of(config: Any) -> int:
    return int(config.get("seed", 0)) if isinstance(config, dict) else 0
