"""Searched attacks' spaces: ``configs/search.yaml`` read and checked, each family's parameters and ranges at a scale,
and the audit's one split of D_f into a relearn pool, a selection set and a report set
(:mod:`margincal.auditing.search` runs the searches, :mod:`margincal.auditing.study` their trials)."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

from margincal.config.files import CONFIG_DIR, read_yaml, shown
from margincal.config.settings import resolve_attack
from margincal.config.typed import MAX_DRAWS, ConfigError, brief
from margincal.core.errors import InputError, require
from margincal.data.draws import SearchSplit, search_split

TRIAL_EXECUTORS = ("serial", "processes", "ray")  # where a search's batch of trials runs (auditing/trials.py)
RAY_TRIALS, RAY_INSTALL = "search.executor=ray", "pip install 'margincal[ray]', or use search.executor=processes"

SEARCH = CONFIG_DIR / "search.yaml"
SEARCH_INSTALL = "pip install 'margincal[search]'"


@functools.cache
def search_rules(path: Path = SEARCH) -> dict:
    """``configs/search.yaml``, its top-level counts checked."""
    rules = read_yaml(path)
    for key in ("max_trials", "startup_trials", "split_seed"):
        value = rules.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(key, f"must be an integer ≥ 0, got {brief(value)}", shown(path))
    if rules["split_seed"] < MAX_DRAWS:  # the split's shuffle must not be a D_rel draw's (seeds 0 … draws − 1)
        raise ConfigError("split_seed", f"must be ≥ {MAX_DRAWS}, a seed no D_rel draw uses", shown(path))
    if not isinstance(rules.get("spaces"), dict):
        raise ConfigError("spaces", "must map attacker presets to their search spaces", shown(path))
    return rules


def max_trials() -> int:
    """The most trials per family a budget may ask (``configs/search.yaml``)."""
    return search_rules()["max_trials"]


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched override key: a range [``low``, ``high``] (integers when both ends are, log-scaled with
    ``log``) or categorical ``choices``."""

    key: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple | None = None

    @property
    def integer(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)

    def size(self) -> int | None:
        """How many values the parameter takes (None: a float range)."""
        if self.choices is not None:
            return len(self.choices)
        return self.high - self.low + 1 if self.integer else None

    def at(self, u: float) -> Any:
        """The value at ``u`` ∈ [0, 1) of the parameter's range (a start design's coordinate): the ``u``-quantile of
        a uniform draw over its choices, its integers or its (log-scaled where ``log``) interval."""
        if self.choices is not None:
            return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]
        if self.integer:
            if self.log:
                value = math.exp(math.log(self.low) + u * (math.log(self.high + 1) - math.log(self.low)))
                return min(int(value), self.high)
            return self.low + min(int(u * (self.high - self.low + 1)), self.high - self.low)
        if self.log:
            return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        return self.low + u * (self.high - self.low)

    def suggest(self, trial) -> Any:
        name = self.key
        if self.choices is not None:
            return trial.suggest_categorical(name, list(self.choices))
        if self.integer:
            return trial.suggest_int(name, self.low, self.high, log=self.log)
        return trial.suggest_float(name, float(self.low), float(self.high), log=self.log)


def _param(preset: str, key: str, spec: Any, k_max: int, where: str) -> Param:
    """A space entry read and checked: ``{low, high, log}``, ``[values]``, or ``k: {low}`` (up to ``k_max``)."""
    at = f"spaces.{preset}.{key}"
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(at, "is an empty list of values", where)
        return Param(key, choices=tuple(spec))
    if not isinstance(spec, dict) or set(spec) - {"low", "high", "log"}:
        raise ConfigError(at, f"must be {{low, high, log}} or a list of values, got {brief(spec)}", where)
    low, high = spec.get("low"), spec.get("high", k_max if key == "k" else None)
    if key == "k" and "high" in spec:
        raise ConfigError(at, "takes low only: K runs up to the budget's K", where)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
    if not numbers:
        raise ConfigError(at, f"needs numeric low and high, got {brief(spec)}", where)
    if low > high:
        what = f"the budget's K = {k_max}" if key == "k" else f"high {high}"
        raise ConfigError(at, f"is an empty range: low {low} is above {what}", where)
    if spec.get("log") and low <= 0:
        raise ConfigError(at, f"is log-scaled and needs low > 0, got {low}", where)
    return Param(key, low, high, bool(spec.get("log", False)))


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """A family's space at one scale: the preset it searches around, its budget K, its parameters, and whether its
    D_rel is drawn from D_f (``forget``: then every searched draw takes it from the split's relearn pool)."""

    preset: str
    k: int
    params: tuple[Param, ...]
    forget: bool = True

    def size(self) -> int | None:
        """The number of configurations of a finite space (None when any parameter is a float range)."""
        sizes = [p.size() for p in self.params]
        return None if None in sizes else math.prod(sizes)

    def as_dict(self) -> dict:
        return {p.key: dataclasses.asdict(p) for p in self.params}

    def identity(self, scale: str) -> dict:
        """What a search's journal is keyed by besides the checkpoint: the preset's resolved config (two families
        may share a space: LoRA on D_f, retain or probe data) at the budget's K, and the space."""
        base = dataclasses.asdict(resolve_attack(self.preset, scale, k=self.k))
        return {"preset": self.preset, "config": base, "space": self.as_dict()}

    def preset_values(self, scale: str) -> dict:
        """The preset's own values of the searched parameters (K: the budget's), those inside the space: the first
        trial of every search, so a search always weighs the preset it is compared with."""
        base, out = dataclasses.asdict(resolve_attack(self.preset, scale, k=self.k)), {}
        for p in self.params:
            value: Any = self.k if p.key == "k" else functools.reduce(lambda d, part: d[part], p.key.split("."), base)
            inside = value in p.choices if p.choices is not None else p.low <= value <= p.high
            if inside:
                out[p.key] = value
        return out

    def config(self, scale: str, values: dict, seed: int, utility: tuple[str, ...] = (), pool: tuple[int, ...] = ()):
        """The preset at ``scale`` with the sampled ``values`` (a LoRA rank keeps the preset's alpha / r), K and the
        D_rel draw ``seed``; ``utility``: the roles its utility proxy is scored on (a trial's); ``pool``: the D_f
        records D_rel is drawn from (the split's relearn pool; empty: all of D_f)."""
        base = resolve_attack(self.preset, scale, k=self.k)
        sets = {key: value for key, value in values.items() if key != "k"}
        if "train.lora.r" in sets and base.train.lora is not None:
            sets["train.lora.alpha"] = round(sets["train.lora.r"] * base.train.lora.alpha / base.train.lora.r)
        overrides = [f"{key}={value}" for key, value in sets.items()]
        cfg = resolve_attack(self.preset, scale, overrides, values.get("k", self.k), seed)
        return dataclasses.replace(cfg, utility=list(utility), pool=list(pool))


def resolve_searches(
    budget, scale: str, utility: tuple[str, ...], missing: list[str], corpus: bool = False
) -> dict[str, SearchSpace]:
    """preset → its search space for every attacker preset of ``budget`` that ``configs/search.yaml`` gives one
    (its largest K in the budget), each space checked by resolving its corners; nothing without a ``search`` block.
    The benchmark must name a utility proxy the data holds. ``corpus``: the benchmark relearns from its forget
    corpus (no family draws D_rel from D_f's records). Every refusal is one line before any compute."""
    if budget.search is None:
        return {}
    require("optuna", "a budget with searched attacks (search:)", SEARCH_INSTALL)
    if budget.search.executor == "ray" and budget.search.workers > 1:
        require("ray", RAY_TRIALS, RAY_INSTALL)
    if not utility:
        raise InputError("this budget searches attacks under a utility bound; the benchmark names no utility splits")
    absent = [role for role in utility if role in missing]
    if absent:
        raise InputError(f"the searched attacks' utility proxy reads the {', '.join(absent)} split(s); the data lacks")
    rules, where = search_rules(), shown(SEARCH)
    budget_k: dict[str, int] = {}
    for entry in budget.attackers:
        budget_k[entry.preset] = max([*entry.k, budget_k.get(entry.preset, 0)])
    spaces = {}
    for preset, k in budget_k.items():
        raw = rules["spaces"].get(preset)
        if raw is None:
            continue
        if not isinstance(raw, dict):
            raise ConfigError(f"spaces.{preset}", f"must map override keys to ranges, got {brief(raw)}", where)
        raw = dict(raw)
        mini = raw.pop("mini", {})
        if scale == "mini":
            raw.update(mini)
        params = tuple(_param(preset, key, spec, k, where) for key, spec in raw.items())
        if not params:
            raise ConfigError(f"spaces.{preset}", "names no parameter", where)
        cfg = resolve_attack(preset, scale, k=k)
        space = SearchSpace(preset, k, params, cfg.data == "forget" and cfg.name != "format_probe" and not corpus)
        for corner in ("low", "high"):  # every override key and value valid for the preset, before any compute
            values = {p.key: (p.choices[0] if p.choices else getattr(p, corner)) for p in params}
            try:
                space.config(scale, values, 0)
            except ConfigError as err:
                raise ConfigError(f"spaces.{preset}", f"sets what the preset refuses: {err}", where) from None
        spaces[preset] = space
    return spaces


def split_for(spaces: dict[str, SearchSpace], n: int) -> SearchSplit | None:
    """The audit's one split of its ``n`` forget records (:func:`margincal.data.draws.search_split`): the relearn pool
    as large as the largest K of a family that draws D_rel from D_f; None without searches."""
    if not spaces:
        return None
    k_pool = max((space.k for space in spaces.values() if space.forget), default=0)
    return search_split(n, k_pool, search_rules()["split_seed"])
