"""The stage artifact store: ``<root>/<stage>/<key>/``, written atomically under a per-key lock."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from margincal.core.artifacts import OWNER, json_text, manifest, publish_dir
from margincal.core.errors import InputError
from margincal.core.inputs import path_kind
from margincal.store.costs import metered


def default_store() -> Path:
    """``$MARGINCAL_STORE``, else ``runs/store`` under the working directory (absolute; :class:`Store` checks what
    it is before following its links)."""
    return Path(os.path.abspath(os.environ.get("MARGINCAL_STORE", "runs/store")))


class Store:
    """Artifact cache: ``<root>/<stage>/<key>/`` exists only once the stage finished.

    A stage writes into a private temp directory that is renamed into place at the end (an atomic directory
    rename), so a process killed at any point leaves no half-written artifact: only a ``.tmp`` directory that the
    next writer of that key removes. A per-key ``fcntl`` lock makes concurrent workers (Ray tasks on one machine or
    a shared POSIX file system) wait for a stage another worker is computing instead of computing it twice.
    """

    META = "stage.json"
    DIGESTS = "digests.json"  # SHA-256 of every file of a finished entry, written as it is published

    def __init__(self, root: str | Path):
        kind = path_kind(root)
        if kind not in ("directory", "missing"):
            raise InputError(f"the store {root} is a {kind}, not a directory: give a directory for --store")
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

    def run(
        self, stage: str, key: str, config: Any, build: Callable[[Path], dict | None], verify: bool = False
    ) -> Path:
        """The finished directory of (stage, key), running ``build(tmp_dir) -> info`` first if it is missing (or,
        with ``verify``, damaged: :meth:`damaged`; it is then built again).

        ``info`` (JSON) is stored in ``stage.json`` with the config, the wall time and a manifest."""

        def write(tmp: Path) -> None:
            with metered() as cost:
                info = build(tmp) or {}
            write_meta(tmp, stage, key, cost["seconds"], info, config, cost)

        return self._publish(stage, key, write, verify)

    def adopt(self, stage: str, key: str, source: Path, digests: dict[str, str] | None = None) -> Path:
        """The finished directory of (stage, key), copied first from ``source`` if it is missing (or damaged): a
        finished entry of the same stage and key in another store (the mini models shipped with margincal), its
        ``stage.json`` (the machine and versions that built it) kept as it is. The copy's files must have the
        SHA-256 ``digests`` (relative path → digest) or, without them, those of the source's ``digests.json``: a
        damaged source is refused before anything is published."""
        if not (source / self.META).is_file():
            raise ValueError(f"{source} is not a finished store entry")
        expected = digests if digests is not None else _recorded(source)

        def write(tmp: Path) -> None:
            for item in source.iterdir():
                if item.name not in (OWNER, self.DIGESTS):  # the copy is this store's: publishing marks it
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
            if expected is not None and (bad := _differs(file_digests(tmp), expected)):
                raise InputError(f"{source}: {bad}; the entry is damaged: reinstall margincal (or rebuild it)")

        return self._publish(stage, key, write, verify=True)

    def damaged(self, stage: str, key: str) -> str | None:
        """How the finished entry (stage, key) differs from the digests recorded when it was published (a file
        changed, missing or added), or None when it does not (or was published before digests were kept)."""
        entry = self.path(stage, key)
        expected = _recorded(entry)
        if expected is None:  # an entry from before digests were kept: its weights must at least be whole
            return next((f"{p.name} is cut short" for p in sorted(entry.rglob("*.safetensors")) if not _whole(p)), None)
        return _differs(file_digests(entry), expected)

    def _publish(self, stage: str, key: str, write: Callable[[Path], None], verify: bool = False) -> Path:
        """``write`` (stage, key) into a temporary directory renamed into place with its files' digests, under the
        key's lock, unless it is (or meanwhile became) done; with ``verify`` a done entry whose files differ from
        its digests is replaced (written again), never handed out."""
        final = self.path(stage, key)
        if self.done(stage, key) and not (verify and self.damaged(stage, key)):
            return final
        with self._lock(stage, key):
            if self.done(stage, key) and not (verify and self.damaged(stage, key)):  # finished while we waited
                return final
            for stale in [*final.parent.glob(f".{key}.tmp-*"), *final.parent.glob(f".{key}.old-*")]:
                shutil.rmtree(stale, ignore_errors=True)  # left by a killed writer of this key
            with publish_dir(final) as tmp:
                write(tmp)
                (tmp / self.DIGESTS).write_text(json_text(file_digests(tmp)))
        return final


def file_digests(directory: Path) -> dict[str, str]:
    """SHA-256 of every regular file under ``directory`` (relative path → hex digest), the entry's bookkeeping
    (``stage.json``'s neighbours :data:`~margincal.core.artifacts.OWNER` and ``digests.json``) left out."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        name = path.relative_to(directory).as_posix()
        if name not in (OWNER, Store.DIGESTS):
            sha = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    sha.update(block)
            out[name] = sha.hexdigest()
    return out


def _whole(path: Path) -> bool:
    """Whether the safetensors file ``path`` opens: its header parses and its tensors fill the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy"):
            return True
    except (SafetensorError, OSError):
        return False


def _recorded(entry: Path) -> dict[str, str] | None:
    """The digests ``entry`` recorded when published (None: none recorded)."""
    path = entry / Store.DIGESTS
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):  # a damaged record: no digest agrees with it, so the entry reads as damaged
        return {}
    return data if isinstance(data, dict) else {}


def _differs(found: dict[str, str], expected: dict[str, str]) -> str | None:
    """The first way ``found`` digests differ from ``expected`` ones, in words (None: they agree)."""
    for name in sorted(set(found) | set(expected)):
        if name not in found:
            return f"{name} is missing"
        if name not in expected:
            return f"{name} was not in it"
        if found[name] != expected[name]:
            return f"{name} is not the file it was (SHA-256 differs)"
    return None


def write_meta(
    path: Path, stage: str, key: str | None, seconds: float, info: dict, config: Any, cost: dict | None = None
) -> None:
    """``stage.json`` of a finished stage directory (a store entry, or the output of a single-stage command, whose
    ``key`` is None): stage, key, wall time, what it cost (:func:`margincal.store.costs.metered`), the writer's info and
    a manifest of ``config``."""
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
