"""The files margincal reads settings from: user YAML files bounded in size and parsed once per version
(:func:`read_yaml`), the shipped configuration files under ``configs/`` (``$MARGINCAL_CONFIGS`` overrides the
directory), found by kind and name (:func:`shipped`, :func:`shipped_names`), and a file's data built into its typed
class with the file named in every error (:func:`build_file`).
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any, TypeVar

import yaml

from margincal.config.typed import ConfigError, brief, build, describe
from margincal.core.errors import InputError
from margincal.core.inputs import MAX_TEXT_BYTES, checked, parse_yaml, path_kind, read_text

T = TypeVar("T")

CONFIG_DIR = Path(os.environ.get("MARGINCAL_CONFIGS", Path(__file__).resolve().parents[1] / "configs"))


def read_yaml(path: str | Path) -> dict:
    """A YAML file holding a non-empty mapping, read by :func:`margincal.core.inputs.read_text` (no empty file or one of
    only comments: defaults are never taken silently); parsed once per version of the file (its size and mtime), a fresh
    copy each call: a panel's plans read the shipped files per cell."""
    stat = checked(path, "", "file", "a YAML file").stat()
    return copy.deepcopy(_parsed_yaml(Path(path), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=256)
def _parsed_yaml(path: Path, size: int, mtime_ns: int) -> dict:
    try:
        data = parse_yaml(read_text(path, "", MAX_TEXT_BYTES, "a YAML file of key: value settings"))
    except yaml.YAMLError as err:
        raise InputError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    if data is None or data == {}:
        empty = "only comments" if data is None else "an empty mapping"
        raise InputError(f"{path} holds {empty}; give a YAML file of key: value settings")
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping of key: value at its top level, got {describe(data)}")
    return data


def shown(path: str | Path) -> str:
    """A config file as messages name it: shipped ones as ``configs/…``, others as given."""
    path = Path(path)
    return f"configs/{path.relative_to(CONFIG_DIR)}" if path.is_relative_to(CONFIG_DIR) else str(path)


YAML_SUFFIXES = (".yaml", ".yml")


def shipped_names(kind: str) -> list[str]:
    """The names of the shipped ``configs/<kind>/*.yaml``."""
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def shipped(kind: str, name: str | Path, what: str) -> Path:
    """The one lookup of a config by name or path: ``name`` itself when it names something that exists (a ``.yaml``
    name, or one with a path separator; anything but a regular file is refused, naming its kind), else the shipped
    ``configs/<kind>/<name>.yaml`` (the name lower-cased; a YAML path that does not exist stands for its stem). A name
    with a path separator, or none shipped, stops with the shipped names (``what`` names the kind in the message)."""
    path = Path(name)
    as_path = path.suffix in YAML_SUFFIXES or os.sep in str(name)
    if as_path and path_kind(path) != "missing":  # a directory x.yaml, a device, a link loop: named as such
        return checked(path, f"the {what} file", "file", "a YAML file")
    stem = (path.stem if path.suffix in YAML_SUFFIXES else str(name)).lower()
    own = CONFIG_DIR / kind / f"{stem}.yaml"
    if Path(stem).name != stem or not own.is_file():
        lead = f"no such file {brief(str(name))}, and no shipped {what} {brief(stem)}" if as_path else ""
        raise InputError(f"{lead or f'unknown {what} {brief(str(name))}'}; known: {', '.join(shipped_names(kind))}")
    return own


def build_file(cls: type[T], data: Any, source: str | Path) -> T:
    """:func:`build` of what a file holds, its errors naming the file (``source``)."""
    try:
        return build(cls, data)
    except ConfigError as err:
        raise err.sourced(shown(source) if isinstance(source, Path) else source) from None
