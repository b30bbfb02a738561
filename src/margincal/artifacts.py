"""Bottom of the import graph: atomic writes, run manifests and content digests.

Everything in margincal that writes a result goes through :func:`atomic_write_text` / :func:`atomic_write_json`
(a temporary sibling renamed into place, so a reader never sees a half-written file), and every result carries a
:func:`manifest` (config, seed, package versions, git commit). :func:`config_key` is the content key of a store
stage; :func:`code_version` digests the code a stage runs, so a change to a loss or a metric changes the keys of
the stages that use it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
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
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
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
        "machine": platform.processor() or platform.machine(),
        "config": config,
        **(extra or {}),
    }


def digest(data: Any, n: int = 16) -> str:
    """sha256 of the canonical JSON of ``data`` (sorted keys), first ``n`` hex digits."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:n]


def config_key(stage: str, config: Any, inputs: Sequence[str] = ()) -> str:
    """Content key of a stage: digest of its name, canonical JSON config and the keys of its inputs (16 hex)."""
    return digest({"stage": stage, "config": config, "inputs": list(inputs)})


def _module_source(name: str) -> str | None:
    """The source of margincal module ``name`` (read from the package directory, nothing is imported), or None
    when ``name`` is not a module file (an attribute imported from a module)."""
    parts = name.split(".")[1:]
    base = Path(__file__).resolve().parent.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.read_text()
    return None


def code_tree(source: str) -> tuple[str, list[str]]:
    """The module's AST without docstrings (comments and formatting are not in the AST) and the margincal
    modules it imports (at any depth, function-local imports included)."""
    tree = ast.parse(source)
    imports: list[str] = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                body[:1] = [] if len(body) > 1 else [ast.Pass()]
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("margincal"):
            imports.append(node.module)
            imports += [f"{node.module}.{a.name}" for a in node.names]  # `from margincal.x import module`
        elif isinstance(node, ast.Import):
            imports += [a.name for a in node.names if a.name.startswith("margincal")]
    return ast.dump(tree), imports


@functools.cache
def code_version(*entry_modules: str) -> str:
    """Digest of the code of ``entry_modules`` and every margincal module they import, transitively.

    Docstrings, comments and formatting do not count; any other change to a module a stage runs (a loss, a metric,
    the training loop) gives a new version, so the store never serves a result computed by other code.
    """
    seen: dict[str, str] = {}
    todo = list(entry_modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        source = _module_source(name)
        if source is None:
            continue
        seen[name], imports = code_tree(source)
        todo += imports
    return digest(sorted(seen.items()))
