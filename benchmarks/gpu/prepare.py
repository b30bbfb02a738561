"""Prepare the GPU acceptance run where pip works: the packages the lent machine lacks, as wheels to carry.

    .venv/bin/python benchmarks/gpu/prepare.py            # fills .gpu-carry/, writes benchmarks/gpu/carry.json
    .venv/bin/python benchmarks/gpu/prepare.py --check    # no download: is carry.json current, does it fit?

The set is worked out, not typed: margincal's core dependencies (``pyproject.toml``'s ``dependencies``; the
``mmlu`` and ``ray`` extras are needed only for MMLU and the Ray executor) and, for each one the lent machine lacks
(``benchmarks/gpu/machine.txt``), its own requirements, recursively, at the versions installed in this environment
(the ones the suite passed with). Each is downloaded as a wheel for the machine's Python (3.12, manylinux x86-64), or
built into one from its sdist (rouge-score); bitsandbytes' wheel keeps only the native library of the machine's
CUDA (``cuda`` in ``machine.txt``) and its CPU one (:func:`slim`: 3.4 MiB instead of 41). What travels to the
machine is the working tree (tracked files and untracked ones git does not ignore) plus ``.gpu-carry/``: at most
64 MiB together. If it would not fit, the largest packages are left out until it does, and carry.json says which
(the acceptance run then reports what it could not do without them, e.g. NF4 and paged 8-bit AdamW without
bitsandbytes).

The demo's trained mini models, which the acceptance run's ``generation`` stage decodes with
(``benchmarks/speed/generation_speed.py`` on the GPU: they stop their answers at EOS, which random weights never do),
travel with the tree: they ship with margincal (``src/margincal/mini/shipped/``).

``carry.json`` (committed) lists each wheel with its size; ``tests/e2e/test_gpu_acceptance.py``
checks that it still names the closure and that tree + carry fit, so a new dependency or a grown tree fails the
suite, not the GPU run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CARRY = ROOT / ".gpu-carry"
LIMIT = 64 * 2**20  # what the device tool sends: working tree + carried paths
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _entries(path: Path) -> list[str]:
    """The lines of ``machine.txt`` without comments and blank lines."""
    return [e for e in (line.split("#", 1)[0].strip() for line in path.read_text().splitlines()) if e]


def machine_packages(path: Path = HERE / "machine.txt") -> tuple[str, set[str]]:
    """(the machine's Python version, its installed package names) from ``machine.txt``."""
    python, names = None, set()
    for line in _entries(path):
        if line.startswith("python "):
            python = line.split()[1]
        elif not line.startswith("cuda "):
            names.update(normalize(n) for n in line.split())
    if python is None:
        raise ValueError(f"{path}: no 'python X.Y' line")
    return python, names


def machine_cuda(path: Path = HERE / "machine.txt") -> str:
    """The CUDA version of the machine's torch build (``cuda 13.0`` in ``machine.txt``), as bitsandbytes names its
    libraries: ``130``."""
    for line in _entries(path):
        if line.startswith("cuda "):
            return line.split()[1].replace(".", "")
    raise ValueError(f"{path}: no 'cuda X.Y' line")


NATIVE = re.compile(r"^bitsandbytes/libbitsandbytes_(cuda\d+|rocm\d+|xpu\d+)\.(so|dll|dylib)$")


def slim(wheel: Path, cuda: str) -> int:
    """Rewrite ``wheel`` without the native libraries the machine cannot load: bitsandbytes ships one per CUDA,
    ROCm and XPU release (about 40 MiB), and loads the one named by the CUDA version torch was built with
    (``libbitsandbytes_cuda130.so`` under torch +cu130), or its CPU library. Every other file and its line in
    ``RECORD`` (its hash unchanged) stay as they were; returns the bytes saved."""
    import zipfile

    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".slim")
    dropped, kept = set(), False
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            match = NATIVE.match(info.filename)
            if match and match.group(1) != f"cuda{cuda}":
                dropped.add(info.filename)
                continue
            kept = kept or bool(match)
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if line.split(",", 1)[0] not in dropped).encode()
            dst.writestr(info, data)
    if dropped and not kept:
        tmp.unlink()
        raise SystemExit(f"{wheel.name}: no libbitsandbytes_cuda{cuda} in it; check machine.txt's cuda line")
    tmp.replace(wheel)
    return before - wheel.stat().st_size


def core_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """margincal's own dependencies (no extras)."""
    return [Requirement(r) for r in tomllib.loads(pyproject.read_text())["project"]["dependencies"]]


def closure(requirements: list[Requirement], present: set[str], python: str) -> dict[str, str]:
    """{name: installed version} of every requirement the machine lacks, with their requirements, recursively
    (markers evaluated for ``python`` on Linux, extras not taken); each version is this environment's."""
    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}  # fmt: skip
    out: dict[str, str] = {}
    todo = list(requirements)
    while todo:
        req = todo.pop()
        name = normalize(req.name)
        if name in present or name in out or (req.marker and not req.marker.evaluate(env)):
            continue
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(
                f"{req.name} is not installed here: run this in the environment the suite passed in"
            ) from None
        out[name] = dist.version
        todo += [Requirement(r) for r in dist.requires or []]
    return dict(sorted(out.items()))


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what the device tool sends besides carried paths: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    return sum((root / f).stat().st_size for f in listed.split("\0") if f and (root / f).is_file())


def download(name: str, version: str, python: str, dest: Path) -> Path:
    """The wheel of ``name==version`` for the machine, downloaded, or built here from the sdist (pure Python)."""
    pip = [sys.executable, "-m", "pip", "-q"]
    with tempfile.TemporaryDirectory() as tmp:
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        binary = [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
                  "--implementation", "cp", *platforms, "-d", tmp, f"{name}=={version}"]  # fmt: skip
        if subprocess.run(binary, capture_output=True).returncode != 0:
            subprocess.run([*pip, "wheel", "--no-deps", "--no-binary=:all:", "-w", tmp, f"{name}=={version}"],
                           check=True, capture_output=True)  # fmt: skip
        [wheel] = Path(tmp).glob("*.whl")
        if not wheel.name.endswith("-any.whl") and "manylinux" not in wheel.name:
            raise SystemExit(f"{wheel.name}: not a wheel the machine can install (built for this one)")
        return Path(wheel.replace(dest / wheel.name))


def fit(sizes: dict[str, int], tree: int) -> tuple[list[str], list[str]]:
    """(carried, left out): the largest packages are left out until tree + carry fit in ``LIMIT``."""
    carried = sorted(sizes, key=sizes.get)
    left = []
    while carried and tree + sum(sizes[n] for n in carried) > LIMIT:
        left.append(carried.pop())
    return sorted(carried), left


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="no download: compare carry.json with the closure")
    args = parser.parse_args(argv)
    python, present = machine_packages()
    pins = closure(core_requirements(), present, python)
    tree = tree_bytes()
    if args.check:
        record = json.loads((HERE / "carry.json").read_text())
        versions = {n: p["version"] for n, p in {**record["packages"], **record["left_out"]}.items()}
        carry = sum(p["bytes"] for p in record["packages"].values())
        print(f"closure {'matches' if versions == pins else 'differs from'} carry.json: {pins}")
        print(f"tree {tree / 2**20:.1f} MiB + carry {carry / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB")
        raise SystemExit(0 if versions == pins and tree + carry <= LIMIT else 1)
    CARRY.mkdir(exist_ok=True)
    for old in CARRY.glob("*.whl"):
        old.unlink()
    wheels = {}
    for name, version in pins.items():
        wheels[name] = download(name, version, python, CARRY)
        if name == "bitsandbytes":
            cuda = machine_cuda()
            saved = slim(wheels[name], cuda)
            print(f"bitsandbytes: kept its CUDA {cuda} and CPU libraries ({saved / 2**20:.1f} MiB less)")
        print(f"{name}=={version}: {wheels[name].name} ({wheels[name].stat().st_size / 2**20:.2f} MiB)", flush=True)
    sizes = {n: w.stat().st_size for n, w in wheels.items()}
    carried, left = fit(sizes, tree)
    for name in left:
        wheels[name].unlink()
    entry = lambda n: {"version": pins[n], "file": wheels[n].name, "bytes": sizes[n]}  # noqa: E731
    record = {
        "python": python,
        "packages": {n: entry(n) for n in carried},
        "left_out": {n: entry(n) for n in left},
        "tree_bytes_when_prepared": tree,
        "limit_bytes": LIMIT,
    }
    (HERE / "carry.json").write_text(json.dumps(record, indent=2) + "\n")
    total = tree + sum(sizes[n] for n in carried)
    print(f"tree {tree / 2**20:.1f} MiB + .gpu-carry {(total - tree) / 2**20:.1f} MiB = {total / 2**20:.1f} MiB "
          f"of {LIMIT / 2**20:.0f} MiB; left out: {', '.join(left) or 'nothing'}")  # fmt: skip


if __name__ == "__main__":
    main()
