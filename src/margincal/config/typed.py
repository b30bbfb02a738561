"""Typed builds from mappings, the one way a user's settings become a typed object.

:func:`build` checks a nested mapping against a dataclass's typed spec (its shape, unknown keys with the valid ones
named, each value coerced to its annotated type, then the class's own range rules, :data:`Rule`), and
:class:`ConfigError` names the key path, what is allowed and, once known, the source that set it (a YAML file or a
``key=value`` override, :func:`sourced`). Overrides are parsed here (:func:`parse_override`, :func:`apply_overrides`:
dotted keys, values as YAML scalars) and the counts that size a plan are bounded (``MAX_*``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import reprlib
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import yaml

from margincal.core.errors import InputError
from margincal.core.inputs import parse_yaml

T = TypeVar("T")


class ConfigError(InputError):
    """A configuration value outside its typed spec: the key path (``train.steps``, ``attackers[0].k[1]``), what
    is allowed and, once known, the source that set it (a YAML file or a ``key=value`` override)."""

    def __init__(self, key: str, what: str, source: str | None = None, named: bool = True):
        self.key, self.what, self.source, self.named = key, what, source, named
        head = f"{source}: " if source else ""
        super().__init__(f"{head}{key} {what}" if key and named else f"{head}{what}")

    def within(self, prefix: str) -> ConfigError:
        """The same error for a key under ``prefix`` (a panel section resolved on its own)."""
        return ConfigError(f"{prefix}.{self.key}" if self.key else prefix, self.what, self.source, self.named)

    def sourced(self, source: str) -> ConfigError:
        return ConfigError(self.key, self.what, source, self.named)


# A range rule: (predicate, what the value must be). Numbers are finite by the time a rule sees them (coerce).
Rule = tuple[Callable[[Any], bool], str]


AT_LEAST_1: Rule = (lambda v: v >= 1, "an integer ≥ 1")


POSITIVE: Rule = (lambda v: v > 0, "a positive number")


NON_NEGATIVE: Rule = (lambda v: v >= 0, "≥ 0")


UNIT: Rule = (lambda v: 0 <= v <= 1, "in [0, 1]")


SEED: Rule = (lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)")


# The most of each count that sizes a plan or a run, checked before planning: a run past these is a typo, and planning
# it (one node per draw and budget, one cell per axis product) would take the machine before any check could fail.
MAX_STEPS = 1_000_000  # optimizer steps of one training run (the paper's longest schedules are ~10^3)


MAX_DRAWS = 100  # D_rel draws of an audit budget


MAX_BUDGETS = 64  # K values of one attackers entry


MAX_K = 1_000_000  # one K (it must also stay below |D_f|)


MAX_CELLS = 10_000  # cells of one panel (the product of its axes)


MAX_SEEDS = 1_000  # seeds of one panel


MAX_BATCH = 65_536  # a batch size or a sample count


def at_most(limit: int, low: int = 1) -> Rule:
    """An integer in [``low``, ``limit``]."""
    return (lambda v: low <= v <= limit, f"an integer in [{low}, {f'{limit:,}'.replace(',', ' ')}]")


STEPS: Rule = at_most(MAX_STEPS)


BATCH: Rule = at_most(MAX_BATCH)


def one_of(*allowed: Any) -> Rule:
    return (lambda v: v in allowed, f"one of {', '.join(map(str, allowed))}")


def check_items(key: str, values: Sequence, rule: Rule, most: int | None = None) -> None:
    """Stop on the first item of the list ``key`` outside ``rule``, and on a list of more than ``most`` items."""
    if most is not None and len(values) > most:
        raise ConfigError(key, f"may hold at most {most} items, got {len(values)}")
    ok, what = rule
    for i, value in enumerate(values):
        if not ok(value):
            raise ConfigError(f"{key}[{i}]", f"must be {what}, got {brief(value)}")


def check_fields(obj: Any, **rules: Rule) -> None:
    """Stop on the first field of ``obj`` outside its rule (None passes: an optional field left unset)."""
    for name, (ok, what) in rules.items():
        value = getattr(obj, name)
        if value is not None and not ok(value):
            raise ConfigError(name, f"must be {what}, got {brief(value)}")


_BRIEF = reprlib.Repr()  # keyword arguments only from Python 3.12


_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 2, 60, 60, 40


_BRIEF.maxdict = _BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxset = 4


def brief(value: Any) -> str:
    """``repr(value)`` cut to a bounded view (:mod:`reprlib`: a few items per level, two levels, 60 characters per
    string, at most 80 characters), built without ever forming the whole text: a message about a huge or aliased
    value stays one short line."""
    text = _BRIEF.repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _optional(tp: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, else ``(tp, False)``."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def describe(value: Any) -> str:
    """How a value of the wrong shape reads in a message (a bounded view of it, :func:`brief`)."""
    kinds = {dict: "a mapping", list: "a list", tuple: "a list", str: "a string", bool: "a boolean"}
    return next((f"{name} ({brief(value)})" for t, name in kinds.items() if isinstance(value, t)), brief(value))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The field types of dataclass ``cls``, resolved once (a card of many rows builds each row class many times)."""
    return typing.get_type_hints(cls)


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass ``cls`` from a nested mapping, checked against its typed spec: the mapping's shape, unknown
    and missing keys, each value's type (:func:`coerce`, recursing into dataclass-typed fields, merged over the
    field's default) and the dataclass's own range rules. Any violation is a :class:`ConfigError` naming the key
    path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a mapping of key: value, got {describe(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        what = f"unknown config key(s) {brief(unknown)} in {path or cls.__name__}{hint}; valid keys: {sorted(fields)}"
        raise ConfigError(where, what, named=False)
    missing = [
        n
        for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(path, f"misses required key(s) {missing}")
    kwargs = {}
    for name, value in data.items():
        where = f"{path}.{name}" if path else name
        tp, _ = _optional(hints[name])
        if _is_dataclass_type(tp) and isinstance(value, dict):
            default = default_of(cls, name)
            merged = deep_merge(dataclasses.asdict(default) if default is not None else {}, value)
            kwargs[name] = build(tp, merged, where)
        else:
            kwargs[name] = coerce(value, hints[name], where)
    try:
        return cls(**kwargs)
    except ConfigError as err:  # a range rule of the dataclass: name the config section
        raise err.within(path) if path else err from None
    except InputError as err:  # a rule phrased by the dataclass itself: keyed by its section, for its source
        raise ConfigError(path, str(err), named=False) from None


def coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against type ``tp`` (``int``, ``float``, ``bool``, ``str``, ``T | None``, ``list[T]``,
    ``tuple[T, ...]``, ``dict[str, T]``, a dataclass), converted where YAML's reading is ambiguous: ``1e-4`` read
    as a string becomes a float, ``2.0`` an int. A value of the wrong type (``steps=2.5``, ``lr=fast``,
    ``models: mini`` for a list, a non-finite number) stops with :class:`ConfigError` naming the key path."""
    tp, optional = _optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise ConfigError(where, f"expects {_expected(tp)}, got null")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if _is_dataclass_type(tp):
        return value if isinstance(value, tp) else build(tp, value, where)
    if tp in (list, tuple) or origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(where, f"expects a list, got {describe(value)}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(where, f"expects a mapping, got {describe(value)}")
        item = args[1] if args else Any
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ConfigError(where, f"expects string keys, got {brief(bad[0])}")
        return {k: coerce(v, item, f"{where}.{k}") for k, v in value.items()}
    if tp is str or tp is bool:
        if not isinstance(value, tp):
            raise ConfigError(where, f"expects {_expected(tp)}, got {describe(value)}")
        return value
    if tp is int:
        if isinstance(value, str):
            return _number_text(value, int, where)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"expects an integer, got {describe(value)}")
        return value
    if tp is float:
        if isinstance(value, str):
            value = _number_text(value, float, where)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"expects a number, got {describe(value)}")
        if not math.isfinite(value):
            raise ConfigError(where, f"expects a finite number, got {value!r}")
        return float(value)
    return value


def _number_text(value: str, tp: type[int] | type[float], where: str) -> int | float:
    """``value``, a number YAML read as a string (``1e-4``), converted to ``tp``; text that is no such number stops
    with :class:`ConfigError` naming ``where``."""
    try:
        return tp(value)
    except ValueError:
        raise ConfigError(where, f"expects {_expected(tp)}, got {brief(value)}") from None


def _expected(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    origin = typing.get_origin(tp)
    if tp in names:
        return names[tp]
    if tp in (list, tuple) or origin in (list, tuple):
        return "a list"
    return "a mapping" if tp is dict or origin is dict or _is_dataclass_type(tp) else "a value"


def deep_merge(base: dict, update: dict) -> dict:
    """Recursive dict merge: ``update`` wins, nested mappings are merged key by key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(item: Override) -> tuple[list[str], Any]:
    """``a.b.c=value`` → (``["a", "b", "c"]``, the value read as a YAML scalar or flow collection); a ``(key, value)``
    pair (a panel's ``set:`` entry, data already) keeps its value as it is: null stays None."""
    if isinstance(item, tuple):
        return item[0].split("."), item[1]
    if not isinstance(item, str) or "=" not in item:
        raise InputError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise InputError(f"override {item!r}: {key.strip()!r} is not a dotted key (e.g. train.lr)")
    try:
        return parts, parse_yaml(raw)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "unreadable"
        raise InputError(f"override {item!r}: the value is not valid YAML ({problem})") from None


def apply_overrides(data: dict, overrides: Sequence[Override]) -> dict:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) and ``(key, value)`` pairs to a nested dict."""
    out = copy.deepcopy(data or {})
    for item in overrides:
        parts, value = parse_override(item)
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"override {item!r}: {part!r} is not a mapping")
        node[parts[-1]] = value
    return out


# A configuration layer: (its source as a message names it — a file, "override k=v" —, the mapping it sets).
Layer = tuple[str, Any]


Override = str | tuple[str, Any]  # ``key=value`` (its value YAML text), or a ``(key, value)`` pair of a set: block


def override_layers(overrides: Sequence[Override]) -> list[Layer]:
    """One layer per ``key=value`` override or ``set:`` entry."""
    named = [f"override {o}" if isinstance(o, str) else f"set {o[0]}: {brief(o[1])}" for o in overrides]
    return [(name, apply_overrides({}, [item])) for name, item in zip(named, overrides, strict=True)]


def _sets(data: Any, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(data, dict):
            return True  # the layer sets a parent of the key (a list or a scalar in its place)
        if part not in data:
            return False
        data = data[part]
    return True


def sourced(err: ConfigError, layers: Sequence[Layer]) -> ConfigError:
    """``err`` naming the last of ``layers`` that sets its key (an index — ``attackers[0].k[1]`` — counts as set by
    whoever set the list); when none does, the source the error already names (a file read on its own), else the
    first layer (a default read there)."""
    parts = []
    for part in err.key.split("."):
        name, bracket, _ = part.partition("[")
        parts.append(name)
        if bracket:
            break
    for source, data in reversed(layers):
        if err.key and _sets(data, parts):
            return err.sourced(source)
    return err if err.source or not layers else err.sourced(layers[0][0])


def build_sourced(cls: type[T], data: dict, layers: Sequence[Layer]) -> T:
    """:func:`build`, its errors naming the layer that set the failing key (:func:`sourced`)."""
    try:
        return build(cls, data)
    except ConfigError as err:
        raise sourced(err, layers) from None


def given(cls: type[T], **values: Any) -> T:
    """``cls`` from the values given (not None); the rest fall through to its defaults, the only ones there are (a
    command-line option left out passes None)."""
    return cls(**{k: v for k, v in values.items() if v is not None})


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass field ``name`` (what a help text quotes, what :func:`build` merges a partial mapping
    onto); None for a field without one."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    factory = None if field.default_factory is dataclasses.MISSING else field.default_factory
    return factory() if factory else None if field.default is dataclasses.MISSING else field.default


# -------------------------------------------------------------------------------------------- public arguments

#: How the parts of a public function's annotation read in a refusal (the rest read as written).
_ARGUMENT_KINDS = {
    "str": "a string",
    "Path": "a Path",
    "int": "an integer",
    "float": "a number",
    "bool": "True or False",
    "None": "None",
    "Model": "a checkpoint directory, a hub id (a string) or a transformers model in memory",
    "Records": "a TOFU-format file or a list of QARecord or of TOFU rows (dicts)",
    "Sequence[str]": "a list of strings",
    "Sequence[int]": "a list of integers",
    "Sequence[Records]": "a list of TOFU-format files or record lists",
    "Sequence[str | Path]": "a list of paths",
    "Mapping[str, Any]": "a mapping",
    "Mapping[str, str]": "a mapping of names to paths",
    "Callable[[str], None]": "a function of one string",
    "Audited": "a checkpoint (a directory or hub id) or a model in memory (alone or with its tokenizer)",
    "Sequence[Audited]": "a list of them",
    "Mapping[str, Audited]": "a mapping of names to them",
    "MCConfig": "an MCConfig",
}


def _expected_argument(annotation: str) -> str:
    """What an argument annotated ``annotation`` (its source text) must be, in words."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(annotation + " |"):
        depth += (char == "[") - (char == "]")
        if char == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    return " or ".join(_ARGUMENT_KINDS.get(p, p) for p in parts if p)


def _given(value: Any) -> str:
    """The value an argument was given, as a refusal names it: a short view of a plain value, else its type."""
    if value is None:
        return "None"
    name = type(value).__name__
    kind = f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
    plain = (str, bytes, int, float, bool, list, tuple, dict)
    return f"{brief(value)} ({kind})" if isinstance(value, plain) else kind


def checked_call(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` with its arguments checked by name against its annotations before its body runs (pydantic's
    call validation in strict mode: a string is never taken for a list, a boolean never for an integer, a float
    never for an integer, nothing is coerced; objects are checked by type and passed on as given). A wrong, missing
    or unknown argument is one :class:`~margincal.core.errors.InputError` naming the function, the argument, what it
    must be and what it got (an unknown keyword with the closest known one)."""
    import inspect

    from pydantic import ConfigDict, ValidationError, validate_call

    validated = validate_call(config=ConfigDict(strict=True, arbitrary_types_allowed=True))(function)
    parameters = inspect.signature(function).parameters
    names = list(parameters)

    def refusal(err: ValidationError, args: tuple, kwargs: dict) -> str:
        first = err.errors()[0]
        where = first["loc"][0] if first["loc"] else None
        name = names[where] if isinstance(where, int) and where < len(names) else str(where)
        head = f"{function.__name__}: "
        if first["type"] == "unexpected_keyword_argument":
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f"; it takes {', '.join(names)}"
            return f"{head}no argument {name!r}{hint}"
        if first["type"] in ("missing_argument", "missing_keyword_only_argument"):
            return f"{head}{name} is required"
        if first["type"] == "unexpected_positional_argument":
            return f"{head}too many positional arguments: name them (it takes {', '.join(names)})"
        value = args[where] if isinstance(where, int) and where < len(args) else kwargs.get(name)
        annotation = parameters[name].annotation if name in parameters else "?"
        return f"{head}{name} must be {_expected_argument(str(annotation))}, not {_given(value)}"

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return validated(*args, **kwargs)
        except ValidationError as err:
            if err.title != function.__name__:  # raised inside the body: not an argument check
                raise
            raise InputError(refusal(err, args, kwargs)) from None

    return call
