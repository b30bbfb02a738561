"""The mini models that ship with margincal: the tokenizer, θ0 and θ_ref of the settings in :data:`SETS`, built once
by :func:`rebuild` and kept as finished store entries under :data:`~margincal.mini.models.SHIPPED` (package data),
which :func:`~margincal.mini.models.build_mini_models` copies into a store under exactly the key a build would have.

    python -m margincal.mini.shipped            # rebuild every shipped set (after raising BUILD_VERSION)
    python -m margincal.mini.shipped --check    # what is stale, one line each (tests/unit/mini/test_mini_shipped.py)

The mini models' keys name their settings and :data:`~margincal.mini.models.BUILD_VERSION`, not the code version,
so the shipped files change only when what the build makes would change. What ties that version to the code is a
**fingerprint**: a tiny build (:data:`FINGERPRINT`, seconds on a CPU) whose generated data and vocabulary are
compared exactly and whose final training losses agree within :data:`RTOL` (another CPU's float rounding stays far
inside it; another learning rate, schedule, data draw or objective does not). :func:`rebuild` records it in the
shipped manifest and refuses to replace models of the same version by ones the build now makes differently.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from margincal.config.settings import TrainConfig
from margincal.config.typed import apply_overrides, build
from margincal.core.artifacts import atomic_write_json, cpu_name, json_text, publish_dir
from margincal.core.inputs import read_json
from margincal.core.terminal import quiet_libraries
from margincal.mini.data import MiniConfig, generate
from margincal.mini.models import (
    BUILD_VERSION,
    SHIPPED,
    SHIPPED_MANIFEST,
    STAGES,
    MiniArch,
    MiniModelConfig,
    build_mini_models,
    model_keys,
    stage_keys,
)
from margincal.store.stage_store import Store, file_digests

REBUILD = "python -m margincal.mini.shipped"
MANIFEST = SHIPPED_MANIFEST
RTOL = 1e-4  # the fingerprint's losses: observed cross-library and cross-run differences are below 1e-6

SMOKE = (  # the tests' smoke size (tests/conftest.py: MINI_SMOKE)
    "data.n_authors=20",
    "data.n_holdout_authors=4",
    "data.n_real_authors=6",
    "data.n_world_facts=10",
    "data.n_probe=30",
    "arch.hidden_size=32",
    "arch.intermediate_size=64",
    "arch.num_layers=2",
    "arch.num_heads=2",
    "arch.vocab_size=400",
    "base.steps=20",
    "finetune.steps=30",
)
MEMORISING = (*SMOKE, "arch.hidden_size=64", "arch.intermediate_size=128", "finetune.steps=300")


@dataclass(frozen=True)
class ShippedSet:
    """One shipped setting: ``overrides`` (``key=value`` on :class:`MiniModelConfig`'s defaults) and its tiers."""

    overrides: tuple[str, ...]
    tiers: tuple[str, ...]
    what: str

    def config(self) -> MiniModelConfig:
        return build(MiniModelConfig, apply_overrides({}, list(self.overrides)), "mini")

    def entries(self) -> list[str]:
        """``stage/key`` of every shipped entry of this set (:func:`model_keys` per tier)."""
        cfg = self.config()
        return sorted({f"{stage}/{key}" for tier in self.tiers for stage, key in model_keys(cfg, tier).items()})


SETS = {
    "demo": ShippedSet((), ("forget10",), "margincal demo (the MiniModelConfig defaults)"),
    "smoke": ShippedSet(SMOKE, ("forget10",), "the tests' smoke size"),
    "memorising": ShippedSet(MEMORISING, ("forget10",), "the tests' smoke size wide enough for θ0 to memorise"),
}

_TINY_TRAIN = TrainConfig(steps=30, batch_size=8, lr=3e-3, weight_decay=0.0, warmup_ratio=0.05, scheduler="cosine")
FINGERPRINT = MiniModelConfig(
    data=MiniConfig(n_authors=10, n_holdout_authors=2, n_real_authors=4, n_world_facts=4, n_probe=5),
    arch=MiniArch(vocab_size=300, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2),
    base=_TINY_TRAIN,
    finetune=_TINY_TRAIN,
)


def fingerprint(store: Path | None = None) -> dict:
    """What the build makes at the tiny :data:`FINGERPRINT` setting (built into ``store``, else a temporary one,
    never from shipped entries): the SHA-256 of its generated records and of its tokenizer's vocabulary, and the
    final training NLL of the base, θ0 and θ_ref (forget10)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Store(store or tmp)
        bench = generate(FINGERPRINT.data)
        paths = build_mini_models(FINGERPRINT, "forget10", root, bench, source=None)
        keys = stage_keys(FINGERPRINT, "forget10")
        records = [dataclasses.asdict(r) for name in sorted(bench.splits) for r in bench.split(name)]
        vocab = read_json(paths.tokenizer / "tokenizer.json")["model"]["vocab"]
        return {
            "data": _sha256(records),
            "vocab": _sha256(sorted(vocab.items())),
            "final_nll": {s: root.meta(s, keys[s])["info"]["final_nll"] for s in STAGES[1:]},
        }


def same_build(a: dict, b: dict) -> bool:
    """Whether two fingerprints are of one build: data and vocabulary equal, losses within :data:`RTOL`."""
    if (a["data"], a["vocab"], sorted(a["final_nll"])) != (b["data"], b["vocab"], sorted(b["final_nll"])):
        return False
    return all(math.isclose(a["final_nll"][s], b["final_nll"][s], rel_tol=RTOL) for s in a["final_nll"])


def problems(source: Path = SHIPPED, current: dict | None = None) -> list[str]:
    """One line per way the shipped entries under ``source`` are not what the code would build now (empty: they
    are): the manifest's version against :data:`BUILD_VERSION`, each set's entries against the keys its settings
    give now, and, with ``current`` (this code's :func:`fingerprint`), the recorded fingerprint against it."""
    if not (source / MANIFEST).is_file():
        return [f"no shipped mini models at {source}: run `{REBUILD}`"]
    manifest = read_json(source / MANIFEST)
    if manifest["build_version"] != BUILD_VERSION:
        v = manifest["build_version"]
        return [f"the shipped mini models are of BUILD_VERSION {v}, the code's is {BUILD_VERSION}: run `{REBUILD}`"]
    out = []
    if current is not None and not same_build(manifest["fingerprint"], current):
        out.append(
            f"the mini build now makes other models than BUILD_VERSION {BUILD_VERSION} did (its fingerprint "
            f"changed): raise BUILD_VERSION in margincal/mini/models.py and run `{REBUILD}`"
        )
    if manifest.get("digests") != entry_digests(source):
        out.append(f"the shipped files differ from the digests their manifest records: run `{REBUILD}`")
    wanted = {e for s in SETS.values() for e in s.entries()}
    present = {f"{d.parent.name}/{d.name}" for d in source.glob("mini-*/*") if d.is_dir()}
    for name, shipped_set in SETS.items():
        if missing := [e for e in shipped_set.entries() if e not in present]:
            out.append(
                f"the shipped set {name!r} lacks {', '.join(missing)} (its settings or the build changed): "
                f"run `{REBUILD}`"
            )
    if stale := sorted(present - wanted):
        out.append(f"shipped entries no set needs: {', '.join(stale)}: run `{REBUILD}`")
    return out


def rebuild(source: Path = SHIPPED, log=print) -> dict:
    """Build every set of :data:`SETS` from scratch and replace ``source`` with their entries and the manifest
    (the build version, the fingerprint, the CPU that built them); returns the manifest. Refuses when ``source``
    holds models of this :data:`BUILD_VERSION` that the build now makes differently: raise the version first."""
    with tempfile.TemporaryDirectory() as tmp:
        current = fingerprint(Path(tmp) / "fingerprint")
        old = read_json(source / MANIFEST) if (source / MANIFEST).is_file() else None
        if old and old["build_version"] == BUILD_VERSION and not same_build(old["fingerprint"], current):
            raise SystemExit(
                f"the build now makes other models than BUILD_VERSION {BUILD_VERSION} did: raise BUILD_VERSION in "
                "margincal/mini/models.py, then run this again"
            )
        store = Store(Path(tmp) / "store")
        for name, shipped_set in SETS.items():
            for tier in shipped_set.tiers:
                log(f"building the shipped set {name!r} ({shipped_set.what}), {tier}")
                build_mini_models(shipped_set.config(), tier, store, source=None)
        manifest = {
            "build_version": BUILD_VERSION,
            "fingerprint": current,
            "built_on": cpu_name(),
            "sets": {n: {**dataclasses.asdict(s), "entries": s.entries()} for n, s in SETS.items()},
        }
        with publish_dir(source) as out:
            target = Store(out)
            for entry in sorted({e for s in SETS.values() for e in s.entries()}):
                stage, key = entry.split("/")
                target.adopt(stage, key, store.path(stage, key))
                (out / entry / Store.DIGESTS).unlink()  # the manifest holds them: adopting checks against it
            shutil.rmtree(out / ".locks", ignore_errors=True)
            manifest["digests"] = entry_digests(out)
            atomic_write_json(out / MANIFEST, manifest)
    log(f"wrote {source}: {_size(source) / 2**20:.1f} MiB")
    return manifest


def entry_digests(source: Path) -> dict[str, dict[str, str]]:
    """Every shipped entry under ``source`` (``stage/key``) → the SHA-256 of each of its files
    (:func:`margincal.store.stage_store.file_digests`), as the manifest records them."""
    return {f"{d.parent.name}/{d.name}": file_digests(d) for d in sorted(source.glob("mini-*/*")) if d.is_dir()}


def _sha256(value) -> str:
    return hashlib.sha256(json_text(value, sort_keys=True).encode()).hexdigest()


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REBUILD, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list what is stale (one line each) instead of building")
    args = parser.parse_args(argv)
    quiet_libraries()
    if args.check:
        lines = problems(current=fingerprint())
        print("\n".join(lines) or "the shipped mini models are what the build makes")
        return 1 if lines else 0
    rebuild()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
