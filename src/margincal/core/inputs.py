"""One checked door for every file or directory a user names: data files, presets, panel and config YAML, ``--claimed``,
``--ref-logs``, ``--reference``, ``--models`` lists, model and results directories.

Before anything is read, the kind of the path is checked (:func:`checked`): a regular file where a file is expected, a
directory where a directory is; a device, FIFO or socket, a symbolic-link loop and a link to nothing are each named as
such. Reading (:func:`read_bytes`, :func:`read_text`, :func:`read_json`) then stops at a byte cap whatever the file
system reports as its size (a device reports 0), and refuses a file that is empty where content is required. JSON and
YAML are parsed strictly and within bounds (:func:`parse_json`, :func:`parse_yaml`). Every problem is one
:class:`~margincal.core.errors.InputError` line naming the input (a missing path: :class:`FileNotFoundError`);
``tests/unit/core/test_inputs.py`` fails when a loader reads a user's file without coming through here.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from margincal.core.errors import InputError

MAX_JSON_BYTES = 256 * 2**20  # a JSON file margincal reads: results, logs, data files (TOFU forget10 is ~0.1 MiB)
MAX_TEXT_BYTES = 2**20  # a configuration or list file (the largest shipped YAML is ~10 KiB)
MAX_DEPTH = 64  # nesting of a JSON or YAML document (margincal's own files nest at most ~8 deep)
MAX_INT_DIGITS = 100  # an integer in a JSON file (tokenizer configs hold 10^30, transformers' "no limit")
_BRACKETS = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')  # possessive: no backtracking state kept per character

KINDS = {
    stat.S_ISREG: "file",
    stat.S_ISDIR: "directory",
    stat.S_ISCHR: "character device",
    stat.S_ISBLK: "block device",
    stat.S_ISFIFO: "FIFO (named pipe)",
    stat.S_ISSOCK: "socket",
}


def path_kind(path: str | Path) -> str:
    """What ``path`` is, symbolic links followed: ``file``, ``directory``, a device, FIFO or socket (:data:`KINDS`),
    ``link loop`` (a symbolic link that leads back to itself), ``dangling link`` (a link to nothing) or ``missing``
    (also below a file: ``a.json/x``)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "link loop"
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return "dangling link" if os.path.islink(path) else "missing"
        raise
    return next((kind for test, kind in KINDS.items() if test(mode)), "special file")


def _where(path: str | Path, what: str) -> str:
    return f"{what} {path}".strip()


def checked(path: str | Path, what: str = "", want: str = "file", give: str = "") -> Path:
    """``path`` if it is a ``want`` (``file``: a regular file; ``directory``), symbolic links followed; else one line
    naming it (``what``: the flag or role, e.g. ``--claimed``) and what it is, ending with ``give`` (what to pass
    instead, e.g. ``a JSON file``). A missing path is :class:`FileNotFoundError`, anything else :class:`InputError`."""
    kind, where = path_kind(path), _where(path, what)
    give = give or f"a {want}"
    if kind == "missing":
        raise FileNotFoundError(f"{where}: no such {want}")
    if kind == "dangling link":
        raise FileNotFoundError(f"{where} is a symbolic link to {os.readlink(path)}, which does not exist; give {give}")
    if kind == "link loop":
        raise InputError(f"{where} is a symbolic link loop (it leads back to itself); give {give}")
    if kind != want:
        raise InputError(f"{where} is a {kind}, not a {want}; give {give}")
    return Path(path)


def _size(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit:,} bytes"


def read_bytes(path: str | Path, what: str = "", limit: int = MAX_JSON_BYTES, give: str = "", empty: bool = False):
    """The bytes of the regular file ``path`` (:func:`checked`), at most ``limit`` of them: a longer file stops
    without reading past ``limit + 1`` bytes, whatever its reported size. A file with nothing but white space stops
    unless ``empty``. The file is opened without blocking and checked again once open (no FIFO can hang a read)."""
    where = _where(path, what)
    data = _head(path, what, limit + 1, give)
    if len(data) > limit:
        raise InputError(f"{where} is larger than {_size(limit)}, the most margincal reads for it; split or shorten it")
    if not empty and not data.strip():
        raise InputError(f"{where} is empty; give {give or 'a file with content'}")
    return data


def read_text(path: str | Path, what: str = "", limit: int = MAX_TEXT_BYTES, give: str = "", empty: bool = False):
    """:func:`read_bytes` decoded as UTF-8; a file that is not UTF-8 stops naming the byte."""
    data = read_bytes(path, what, limit, give, empty)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{_where(path, what)} is not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_head(path: str | Path, n: int, what: str = "") -> str:
    """The first ``n`` bytes of the regular file ``path`` (:func:`checked`) as text, undecodable bytes replaced: where
    only a file's head matters (a model card's front matter), whatever its length."""
    return _head(path, what, n, "a file").decode("utf-8", errors="replace")


def _head(path: str | Path, what: str, n: int, give: str) -> bytes:
    """At most ``n`` bytes of the regular file ``path`` (:func:`checked`), opened without blocking and checked again
    once open (no FIFO swapped in can hang the read): the one open of :func:`read_bytes` and :func:`read_head`."""
    checked(path, what, "file", give)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{_where(path, what)} changed into something other than a regular file; give {give}")
        return handle.read(n)


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in the JSON ``text`` (strings skipped), found without parsing it."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> Any:
    raise InputError(f"holds the non-finite number {name}")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise InputError(f"holds an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def parse_json(text: str, where: str) -> Any:
    """Strict, bounded JSON: at most :data:`MAX_DEPTH` deep (checked before parsing), integers of at most
    :data:`MAX_INT_DIGITS` digits, and no NaN or infinity (a number ``1e999`` that overflows included). Anything else
    stops with one line naming ``where`` (a file, or a file and line) and, for a non-finite number, its key path."""
    depth = json_depth(text)
    if depth > MAX_DEPTH:
        raise InputError(f"{where} is nested {depth} deep; margincal reads JSON at most {MAX_DEPTH} deep")
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int)
    except InputError as err:
        raise InputError(f"{where} {err}; margincal reads strict JSON (write null for a missing number)") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{where} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    bad = non_finite_key(data)
    if bad is not None:
        raise InputError(f"{where}: {bad} is not a finite number; margincal reads strict JSON (null for a missing one)")
    return data


def non_finite_key(data: Any, path: str = "") -> str | None:
    """The key path (``summary.delta``, ``rows[3]``) of the first float in ``data`` that is not finite, else None."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (path or "the value")
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = non_finite_key(value, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def read_json(path: str | Path, what: str = "") -> Any:
    """A JSON file through :func:`read_text` (at most :data:`MAX_JSON_BYTES`, not empty) parsed by :func:`parse_json`;
    ``what`` (a flag such as ``--reference``) heads every message."""
    return parse_json(read_text(path, what, MAX_JSON_BYTES, "a JSON file"), _where(path, what))


# ------------------------------------------------------------------------------------------------ bounded YAML

MAX_YAML_DEPTH = 64  # nesting of a YAML document
MAX_YAML_NODES = 100_000  # values of a document with every alias expanded (the shipped ones hold < 2 000)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded while the document is composed, before any value is built: nesting deeper than
    :data:`MAX_YAML_DEPTH`, an alias inside the node it names (a recursive document) and a document whose aliases
    expand to more than :data:`MAX_YAML_NODES` values (an alias bomb: a few lines that expand exponentially) stop
    with a ``yaml.YAMLError`` at the place in the text where the bound was crossed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._size: dict[int, int] = {}  # id(node) -> its values with every alias expanded, once composed

    def _refuse(self, problem: str, event: yaml.Event) -> None:
        raise yaml.composer.ComposerError(None, None, problem, event.start_mark)

    def compose_node(self, parent, index):  # PyYAML's signature
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None and id(target) not in self._size:
                self._refuse(f"the alias *{event.anchor} is inside the node it names (a recursive document)", event)
        elif self._depth >= MAX_YAML_DEPTH:
            self._refuse(f"nested deeper than {MAX_YAML_DEPTH} levels", event)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if id(node) not in self._size:
            children = node.value if isinstance(node.value, list) else []
            flat = [c for child in children for c in (child if isinstance(child, tuple) else (child,))]
            self._size[id(node)] = 1 + sum(self._size[id(c)] for c in flat)
            if self._size[id(node)] > MAX_YAML_NODES:
                self._refuse(f"expands to more than {MAX_YAML_NODES:,} values (aliases repeat whole subtrees)", event)
        return node


def parse_yaml(text: str) -> Any:
    """A YAML document read safely (no Python objects) and within bounds (:class:`_BoundedLoader`)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
