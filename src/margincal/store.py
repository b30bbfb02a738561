"""The stage artifact store: ``<root>/<stage>/<key>/``, written atomically under a per-key lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from margincal.artifacts import OWNER, json_text, manifest, publish_dir
from margincal.costs import metered


def default_store() -> Path:
    """``$MARGINCAL_STORE``, else ``runs/store`` under the working directory."""
    return Path(os.environ.get("MARGINCAL_STORE", "runs/store")).resolve()


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

    def entry(self, directory: str | Path) -> str | None:
        """``<stage>/<key>`` when ``directory`` (or the stage directory above its ``model/``) is a finished entry of
        this store, else None. Such a model is named by its entry in store keys, as the plan that made it names it:
        its content is a function of that key. Only this store's own entries count: a ``stage.json`` elsewhere,
        whatever it says, names nothing."""
        here = Path(directory).resolve()
        entry = here.parent if here.name == "model" else here
        if entry.parent.parent != self.root or not self.done(entry.parent.name, entry.name):
            return None
        return f"{entry.parent.name}/{entry.name}"

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

        def write(tmp: Path) -> None:
            with metered() as cost:
                info = build(tmp) or {}
            write_meta(tmp, stage, key, cost["seconds"], info, config, cost)

        return self._publish(stage, key, write)

    def adopt(self, stage: str, key: str, source: Path) -> Path:
        """The finished directory of (stage, key), copied first from ``source`` if it is missing: a finished entry
        of the same stage and key in another store (the mini models shipped with margincal), its ``stage.json``
        (the machine and versions that built it) kept as it is."""
        if not (source / self.META).is_file():
            raise ValueError(f"{source} is not a finished store entry")

        def write(tmp: Path) -> None:
            for item in source.iterdir():
                if item.name != OWNER:  # the copy is this store's: publishing marks it
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)

        return self._publish(stage, key, write)

    def _publish(self, stage: str, key: str, write: Callable[[Path], None]) -> Path:
        """``write`` (stage, key) into a temporary directory renamed into place, under the key's lock, unless it
        is (or meanwhile became) done."""
        final = self.path(stage, key)
        if self.done(stage, key):
            return final
        with self._lock(stage, key):
            if self.done(stage, key):  # another worker finished it while we waited
                return final
            for stale in [*final.parent.glob(f".{key}.tmp-*"), *final.parent.glob(f".{key}.old-*")]:
                shutil.rmtree(stale, ignore_errors=True)  # left by a killed writer of this key
            with publish_dir(final) as tmp:
                write(tmp)
        return final


def write_meta(
    path: Path, stage: str, key: str | None, seconds: float, info: dict, config: Any, cost: dict | None = None
) -> None:
    """``stage.json`` of a finished stage directory (a store entry, or the output of a single-stage command, whose
    ``key`` is None): stage, key, wall time, what it cost (:func:`margincal.costs.metered`), the writer's info and a
    manifest of ``config``."""
    meta = {
        "stage": stage,
        "key": key,
        "seconds": seconds,
        "cost": cost,
        "info": info,
        "manifest": manifest(config, seed=_seed_of(config)),
    }
    (path / Store.META).write_text(json_text(meta))  # strict JSON: a value that is not finite is null


def _seed_of(config: Any) -> int:
    return int(config.get("seed", 0)) if isinstance(config, dict) else 0
