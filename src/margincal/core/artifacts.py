"""Bottom of the import graph: atomic writes, run manifests and content digests.

Everything in margincal that writes a file goes through :func:`atomic_path` (a fresh temporary sibling, unique per
call, renamed into place, so a reader never sees a half-written file and concurrent writers never share a temporary
file) or its text/JSON forms :func:`atomic_write_text` / :func:`atomic_write_json`; a directory goes through
:func:`publish_dir`. Every result carries a :func:`manifest` (config, seed, package versions, git commit).
:func:`config_key` is the content key of a store stage; :func:`code_version` digests the code a stage runs, so a
change to a loss or a metric changes the keys of the stages that use it.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import functools
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from margincal.core.errors import InputError
from margincal.core.inputs import checked, read_json

PACKAGES = (
    "margincal",
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "bitsandbytes",
    "tokenizers",
    "rouge-score",
    "scipy",
    "scikit-learn",
    "ray",
    "optuna",
)


class OutputError(InputError):
    """An output location that cannot, or must not, be written (reported before any compute where possible)."""


def _fresh_sibling(path: Path) -> Path:
    """Create and return an empty file ``.NAME.<random>.tmp<suffix>`` beside ``path``, unique to this call
    (``O_EXCL``; mode 0666 & ~umask, as a plain ``open`` gives). The suffix is kept so writers that read the format
    from the name (matplotlib's ``savefig``) write the right one."""
    while True:
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp{path.suffix}"
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:  # pragma: no cover - a 48-bit collision
            continue


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of the file ``path`` for a writer that takes a file name
    (``safetensors.torch.save_file``, ``Figure.savefig``, ``Path.write_text``); when the block succeeds it is
    renamed into place with ``os.replace``, so a reader sees the old file or the complete new one, never a part.

    Every call has its own temporary name, so concurrent writers of one path (two Ray workers computing the same
    cache entry) never write into each other's file: each rename installs a complete file and the last one wins.
    On any failure (a full disk, Ctrl-C, an error of the writer) the temporary file is removed and ``path`` is
    untouched. Failures to write (no space, read-only, no permission) become :class:`OutputError`; other errors
    of the block pass through unchanged."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _fresh_sibling(path)
    except OSError as err:
        raise OutputError(f"could not write {path}: {err.strerror or err}; nothing was written there") from err
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in WRITE_ERRORS:
            raise OutputError(f"could not write {path}: {err.strerror}; nothing was written there") from err
        raise


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` through :func:`atomic_path` (a temp file in the same directory, ``os.replace``d into place);
    on any failure the temp file is removed and ``path`` is untouched. Any ``OSError`` becomes :class:`OutputError`."""
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding=encoding)
    except OSError as err:
        raise OutputError(f"could not write {path}: {err.strerror or err}; nothing was written there") from err
    return path


def finite(data: Any) -> Any:
    """``data`` with every float that is not finite (NaN, ±inf) replaced by None, recursively: what margincal writes is
    strict JSON (RFC 8259 has no NaN), which every reader accepts; a value that could not be computed reads as null."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def json_text(data: Any, **options: Any) -> str:
    """``data`` as strict JSON text (:func:`finite`; ``default=str`` for paths and the like), indented by 2."""
    return json.dumps(finite(data), indent=2, default=str, allow_nan=False, **options) + "\n"


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as strict JSON (:func:`json_text`) through :func:`atomic_write_text`."""
    return atomic_write_text(path, json_text(data))


# ------------------------------------------------------------------------------------------------ names and paths

NAME_RULE = "1 to 100 letters, digits, '.', '_', '+', '@' or '-', not starting with '.', '-', '+' or '@'"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+@-]{0,99}")


def check_name(name: Any, what: str) -> str:
    """``name`` if it may become part of a path (:data:`NAME`, :data:`NAME_RULE`: no separator, never ``.`` or ``..``,
    at most 100 characters), else :class:`OutputError` naming ``what`` (an audit checkpoint, a panel variant, ...)."""
    if isinstance(name, str) and NAME.fullmatch(name):
        return name
    shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
    raise OutputError(f"{what} {shown} is not a valid name: it becomes part of a path, so it must be {NAME_RULE}")


def inside(root: str | Path, *parts: str) -> Path:
    """``root / parts``, refused (:class:`OutputError`) unless it resolves inside ``root`` (symbolic links followed):
    the last line of defence of every writer that puts a name into a path, behind :func:`check_name`."""
    path = Path(root).joinpath(*parts)
    top, real = os.path.realpath(root), os.path.realpath(path)
    if real == top or os.path.commonpath([top, real]) != top:
        raise OutputError(f"refusing to write {path}: it is not inside {root}")
    return path


# ------------------------------------------------------------------------------------------------ output safety


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def share_permissions(root: Path) -> None:
    """Give files under ``root`` the mode a plain ``open`` would (0666 & ~umask; safetensors writes 0600), so a
    shared store or output is readable by the group as the umask allows."""
    mask = _umask()
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


OWNER = ".margincal.json"  # the marker of a directory margincal wrote: which of its entries margincal wrote
TABLE_FORMAT = "margincal-anchor-table/1"  # the format tag of an anchor table (margincal.mc.loss.AnchorTable)


def owned_entries(directory: Path) -> set[str]:
    """The entries of ``directory`` its marker says margincal wrote (empty without a readable marker)."""
    try:
        entries = read_json(directory / OWNER)["entries"]
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return set()
    return {e for e in entries if isinstance(e, str)} if isinstance(entries, list) else set()


def foreign_entries(directory: Path) -> list[str]:
    """The entries of ``directory`` that margincal did not write (not listed in its marker), sorted."""
    owned = owned_entries(directory) | {OWNER}
    return sorted(p.name for p in directory.iterdir() if p.name not in owned)


def own(directory: Path, entries: Sequence[str]) -> None:
    """Record ``entries`` of ``directory`` as margincal's in its marker (added to those already listed)."""
    listed = sorted(owned_entries(directory) | set(entries))
    atomic_write_json(directory / OWNER, {"written_by": "margincal", "entries": listed})


def written_by_margincal(path: Path) -> bool:
    """``path`` is margincal's to replace: a JSON result with a manifest, an anchor table (``margincal anchors``),
    or a directory whose marker lists every entry in it."""
    if path.is_dir():
        return (path / OWNER).is_file() and not foreign_entries(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), "pt") as f:
                return (f.metadata() or {}).get("format") == TABLE_FORMAT
        except (OSError, SafetensorError):
            return False
    try:
        record = read_json(path)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("manifest"), dict) and "versions" in record["manifest"]


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output(
    path: str | Path, *, directory: bool, overwrite: bool = False, inputs: Sequence[str | Path] = (), flag="--out"
) -> Path:
    """Stop, before any compute, on an output location that must not or cannot be written.

    Refused: a file where a directory is wanted (and the reverse); a location that holds one of ``inputs`` or the
    working directory; an existing non-empty location unless ``overwrite`` is given, and even then one that
    margincal did not write (:func:`written_by_margincal`: a directory's marker must list every entry in it);
    a location whose nearest existing parent is not writable (permissions, a read-only file system)."""
    path = Path(os.path.abspath(path))
    _refuse_dangling(path, flag)
    if directory and path.is_file():
        raise OutputError(f"{flag} {path} is a file; give a directory")
    if not directory and path.is_dir():
        raise OutputError(f"{flag} {path} is a directory; give a file path")
    for item in [Path.cwd(), *inputs]:
        item = Path(item).resolve()
        if item == path.resolve() or path.resolve() in item.parents:
            what = "the working directory" if item == Path.cwd() else f"the input {item}"
            raise OutputError(f"{flag} {path} would replace {what}; choose another location")
    if path.exists() and (path.is_file() or any(path.iterdir())):
        if not overwrite:
            raise OutputError(
                f"{flag} {path} already exists; choose a new location, or pass --overwrite to replace "
                "a result margincal wrote there"
            )
        if not written_by_margincal(path):
            raise OutputError(
                f"{flag} {path} {_foreign(path)}; --overwrite replaces only margincal's own results: "
                "choose another location"
            )
    check_writable(path.parent, flag, path)
    return path


def _refuse_dangling(path: Path, flag: str) -> None:
    """A symbolic link whose target does not exist cannot be written through: stop before any compute."""
    if path.is_symlink() and not path.exists():
        target = os.readlink(path)
        raise OutputError(f"{flag} {path} links to {target}, which does not exist; remove the link or choose another")


def _foreign(path: Path) -> str:
    if path.is_file():
        return "is a file margincal did not write (no result with a manifest)"
    foreign = foreign_entries(path)
    return f"holds files margincal did not write ({', '.join(foreign[:3])}{', …' if len(foreign) > 3 else ''})"


def check_owned_dir(path: str | Path, flag: str, hint: str = "choose a new or empty directory") -> Path:
    """A directory that margincal adds results to across runs (a panel's output, a report): new, empty, or one whose
    marker lists every entry in it; never a directory holding files margincal did not write (``hint``: the way out
    the message names)."""
    path = Path(os.path.abspath(path))
    _refuse_dangling(path, flag)
    if path.is_file():
        raise OutputError(f"{flag} {path} is a file; give a directory")
    if path.is_dir() and any(path.iterdir()) and not written_by_margincal(path):
        raise OutputError(f"{flag} {path} {_foreign(path)}; {hint}")
    check_writable(path.parent, flag, path)
    return path


def check_writable(directory: str | Path, flag: str, target: str | Path | None = None) -> None:
    """The nearest existing ancestor of ``directory`` is a directory this process can create files in (a probe
    file; permissions and read-only file systems alike)."""
    parent = _existing_ancestor(Path(os.path.abspath(directory)))
    target = target or directory
    if not parent.is_dir():
        raise OutputError(f"{flag} {target}: {parent} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise OutputError(f"{flag} {target} cannot be written: {parent}: {err.strerror or err}") from err


def check_free_space(path: str | Path, nbytes: int, flag: str = "--out") -> None:
    """Stop when the file system of ``path`` has less than ``nbytes`` (plus 5 %) free."""
    parent = _existing_ancestor(Path(path).absolute())
    free = shutil.disk_usage(parent).free
    if free < nbytes * 1.05:
        raise OutputError(
            f"{flag} {path} needs about {nbytes / 2**20:.0f} MiB, but {parent} has {free / 2**20:.0f} MiB free"
        )


@contextlib.contextmanager
def publish_dir(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``path`` (``.NAME.tmp-*``) to write into; when the block succeeds its
    marker (:data:`OWNER`, listing what the block wrote) is added and it is renamed into place, replacing an
    earlier result (one that :func:`check_output` allowed to be overwritten, or a store entry without its
    ``stage.json``; through a symbolic link, the directory it names). On any failure (a full disk, Ctrl-C) the
    temporary directory and any parent this call created
    are removed and ``path`` is untouched. Failures to write (no space, read-only, no
    permission) become :class:`OutputError`; other errors of the block pass through unchanged."""
    path = Path(os.path.abspath(path))
    if path.is_symlink() and path.is_dir():  # replace the directory the link names; the link stays as it is
        path = Path(os.path.realpath(path))
    tag = uuid.uuid4().hex[:8]
    tmp, old = path.parent / f".{path.name}.tmp-{tag}", path.parent / f".{path.name}.old-{tag}"
    created = [p for p in [path.parent, *path.parent.parents] if not p.exists()]  # parents this call makes
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        yield tmp
        own(tmp, [p.name for p in tmp.iterdir()])
        share_permissions(tmp)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.replace(old, path)
        for parent in created:  # innermost first; only if still empty
            with contextlib.suppress(OSError):
                parent.rmdir()
        if isinstance(err, OSError) and err.errno in WRITE_ERRORS:
            raise OutputError(f"could not write {path}: {err.strerror}; nothing was written there") from err
        raise
    shutil.rmtree(old, ignore_errors=True)


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/margincal: the modules code versions read

WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


def git_commit() -> str:
    """HEAD of the source checkout (``+dirty`` if modified), or ``unknown`` outside git."""
    src = PACKAGE_DIR
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


@functools.cache
def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s model name on Linux), else what ``platform`` knows: floating-point
    results differ between CPU types, so every number is written with it."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def shown_command(argv: list[str]) -> str:
    """The command line as a record shows it, without this machine's layout: the program by its name (a module of
    margincal as ``python -m margincal.<module>``), and every absolute path inside the working directory relative to
    it (a path elsewhere, such as a user's data directory, as given)."""
    program = Path(argv[0]) if argv else Path("python")
    package = Path(__file__).resolve().parents[1]
    if program.is_absolute() and program.suffix == ".py" and package in program.resolve().parents:
        module = program.resolve().relative_to(package.parent).with_suffix("")
        shown = ["python", "-m", ".".join(module.parts)]
    else:
        shown = [program.name]
    here = Path.cwd()
    for arg in argv[1:]:
        path = Path(arg)
        inside = path.is_absolute() and (path == here or here in path.parents)
        shown.append(str(path.relative_to(here)) if inside else arg)
    return " ".join(shown)


def manifest(config: dict, seed: int, extra: dict | None = None) -> dict:
    """Provenance block written beside every result."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shown_command(sys.argv),
        "seed": seed,
        "git_commit": git_commit(),
        "versions": package_versions(),
        "machine": cpu_name(),
        "config": config,
        **(extra or {}),
    }


def digest(data: Any, n: int = 16) -> str:
    """sha256 of the canonical JSON of ``data`` (sorted keys), first ``n`` hex digits."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:n]


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def weight_files(directory: str | Path) -> list[Path]:
    """The weight files of a checkpoint directory, sorted by name."""
    return sorted(p for p in Path(directory).iterdir() if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file())


def weights_bytes(model: str | Path) -> int:
    """Size of a local checkpoint's weight files (about what saving a trained copy needs); 0 for a hub id."""
    return sum(f.stat().st_size for f in weight_files(model)) if Path(model).is_dir() else 0


def weights_digest(directory: str | Path, cache: str | Path | None = None) -> str:
    """sha256 (16 hex) of a checkpoint directory's weight files, by content. With ``cache``, the digest is stored
    under ``cache/<digest of the files' paths, sizes and mtimes>``, so an unchanged checkpoint is hashed once and a
    checkpoint retrained into the same directory gets a new digest."""
    files = weight_files(directory)
    if not files:
        raise FileNotFoundError(f"{directory} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    stamp = digest([[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files])
    cached = Path(cache) / stamp if cache is not None else None
    if cached is not None and cached.is_file():
        return cached.read_text().strip()
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode())
        with open(checked(path, "the weights file"), "rb") as handle:  # a regular file: no FIFO blocks the read
            h.update(hashlib.file_digest(handle, "sha256").digest())
    value = h.hexdigest()[:16]
    if cached is not None:
        atomic_write_text(cached, value + "\n")
    return value


def config_key(stage: str, config: Any, inputs: Sequence[str] = ()) -> str:
    """Content key of a stage: digest of its name, canonical JSON config and the keys of its inputs (16 hex)."""
    return digest({"stage": stage, "config": config, "inputs": list(inputs)})


def _module_source(name: str) -> str | None:
    """The source of margincal module ``name`` (read from the package directory, nothing is imported), or None
    when ``name`` is not a module file (an attribute imported from a module)."""
    parts = name.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
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
            if node.module != "margincal":  # the package root is the library's face (it imports margincal.api lazily)
                imports.append(node.module)
            imports += [f"{node.module}.{a.name}" for a in node.names]  # `from margincal.x import module`
        elif isinstance(node, ast.Import):
            imports += [a.name for a in node.names if a.name.startswith("margincal")]
    return ast.dump(tree), imports


@functools.cache
def code_modules(*entry_modules: str) -> dict[str, str]:
    """``entry_modules`` and every margincal module they import, transitively: module name → its code
    (:func:`code_tree`)."""
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
    return seen


@functools.cache
def code_version(*entry_modules: str) -> str:
    """Digest of the code of ``entry_modules`` and every margincal module they import, transitively
    (:func:`code_modules`).

    Docstrings, comments and formatting do not count; any other change to a module a stage runs (a loss, a metric,
    the training loop) gives a new version, so the store never serves a result computed by other code.
    """
    return digest(sorted(code_modules(*entry_modules).items()))
