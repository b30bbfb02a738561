"""Searched attacks: per threat family, the attack that recovers most on an audited checkpoint within a utility bound.

A budget's ``search:`` block (``configs/audit.yaml``) asks, per attacker preset that ``configs/search.yaml`` gives a
space, for ``trials`` attacks whose hyperparameters Optuna samples (seeded TPE with the utility bound as its
constraint, set by each trial; a finite space no larger than the trials is enumerated by Optuna's brute-force
sampler). Every trial is an attack stage of the audit's graph on D_rel draw 0, stored like any other (a finished
trial never reruns), and Optuna's journal lives in the store (``<store>/search/<key>/journal.log``): an interrupted
search resumes where it stopped, each trial's sampler seeded by its number, so a resumed search samples what an
uninterrupted one would.

The first trial is the preset itself (its values of the searched parameters, K the budget's), so the search always
weighs the attack it is compared with. Which records do what is fixed once per audit (:func:`margincal.data.draws.
search_split`, seeded by ``split_seed``, a seed no draw uses): D_f splits into a relearn pool P (the largest K a
searched family draws from D_f), a selection set S and a report set R. Every searched draw of a family that trains
on D_f (LoRA, FPFT, soft prompt, in-context pairs), trial or reported, takes D_rel ⊂ P; so S and R are held out by
every one of them, whatever its K. Objective and bound, per trial t with attacked model θ_t:

* selection score s_t = the mean headline score (ROUGE-L of θ_t's greedy answers; WMDP: whether it answers right)
  over S, the same records for every trial (a family whose D_rel is not drawn from D_f, such as retain or probe
  relearning, the format probe or a corpus, selects on S ∪ P);
* utility u_t = :func:`margincal.stages.utility_score` (the benchmark's ``utility`` splits, records no attack
  trains on); feasible when u_t ≥ u_0 − ε, u_0 the unattacked checkpoint's (the trial's Optuna constraint
  u_0 − ε − u_t ≤ 0, which TPE models).

The winner is the feasible trial with the highest s_t (the earliest on ties). The winner and the preset are then run
on the budget's draws d (D_rel drawn from P with seed d) on the checkpoint, θ_ref and θ0 (the sanity rule applies)
and both are read on R only, never used to select, so their gap is measured on the same records and draws. On the
checkpoint every reported draw also scores the utility proxy: a winner below u_0 − ε on any draw is reported as
outside the bound, with its utility per draw.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from margincal.artifacts import code_version, config_key
from margincal.config import resolve_attack
from margincal.config_files import CONFIG_DIR, read_yaml, shown
from margincal.data.draws import SearchSplit, search_split
from margincal.errors import InputError, require
from margincal.typed import MAX_DRAWS, ConfigError, brief

SEARCH = CONFIG_DIR / "search.yaml"
SEARCH_INSTALL = "pip install 'margincal[search]'"
SEARCHED = "searched"  # a searched family's reported rows: <role>/searched/<checkpoint>/<preset>/<row>/d<draw>


def reported_label(name: str, preset: str, row: str, draw: int) -> str:
    """A reported row's label below its role and kind: ``<checkpoint>/<preset>/<row>/d<draw>`` (``row``: preset or
    winner)."""
    return f"{name}/{preset}/{row}/d{draw}"


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


def selection_score(result: dict, records: tuple[int, ...], field: str) -> float:
    """The mean ``field`` of an attack result's samples over ``records``, every one of which it must have held out
    (a D_rel ⊂ the relearn pool never holds a selection or report record: anything else is a bug)."""
    scored = dict(zip(result["heldout"], result["samples"], strict=True))
    trained = [i for i in records if i not in scored]
    if trained:
        raise RuntimeError(f"an attack trained on selection records {trained[:5]}: D_rel left the relearn pool")
    return sum(scored[i][field] for i in records) / len(records)


def winner(trials: list[dict]) -> dict | None:
    """The feasible trial with the highest selection score, the earliest on ties; None when no trial is feasible."""
    feasible = [t for t in trials if t["feasible"]]
    return max(feasible, key=lambda t: (t["value"], -t["trial"])) if feasible else None


def describe_values(params: dict) -> str:
    """Searched values as the log, the card and its figures show them: ``lr 0.0031, steps 45, lora.r 16``."""
    shown = {key.removeprefix("train."): value for key, value in params.items()}
    return ", ".join(f"{key} {v:.3g}" if isinstance(v, float) else f"{key} {v}" for key, v in shown.items())


def searched_label(preset: str, k: int, params: dict) -> str:
    """A searched family's row named by what it ran: ``lora_r8@18 (lr 0.0031, steps 45, lora.r 16)``."""
    values = describe_values({key: value for key, value in params.items() if key != "k"})
    return f"{preset}@{k}{f' ({values})' if values else ''}"


def _study(store_root: Path, key: str):
    """The Optuna study of one search, its journal in the store (created, or loaded to resume); trials a killed run
    left running are marked failed (their stored stage, if it finished, is read again by the trial that reruns it)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder = store_root / "search" / key
    folder.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(folder / "journal.log")))
    study = optuna.create_study(storage=storage, study_name=key, direction="maximize", load_if_exists=True)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    return study, folder / "journal.log"


def _sampler(space: SearchSpace, seed: int, finite: bool):
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if finite:
            return optuna.samplers.BruteForceSampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=search_rules()["startup_trials"])


def history(trials: list[dict], unattacked: float | None) -> dict:
    """Best-so-far over feasible trials in trial order, and the trials needed to come within 10 % of the way from
    the unattacked selection score s_0 (the selection set before any attack) to the maximum: the first t with
    best_t ≥ s_0 + 0.9 (max − s_0)."""
    best, curve = None, []
    for t in trials:
        if t["feasible"] and (best is None or t["value"] > best):
            best = t["value"]
        curve.append(best)
    reach = None
    if best is not None:
        start = unattacked if unattacked is not None else 0.0
        goal = min(best, start + 0.9 * (best - start))  # a search that never beats s_0 reaches its best at once
        reach = next(i + 1 for i, b in enumerate(curve) if b is not None and b >= goal - 1e-12)
    return {"best_so_far": curve, "trials_to_90": reach}


def _completed_trials(study, space: SearchSpace, scale: str, finite: bool, wanted: int, objective: Callable) -> list:
    """Runs ``study`` until it holds ``wanted`` complete trials (the preset's values enqueued first in a new study,
    each trial's sampler seeded by its number); returns its first ``wanted`` complete trials as records (number,
    params, selection score, utility, feasibility, stage key)."""
    from optuna.trial import TrialState

    if not study.trials:
        study.enqueue_trial(space.preset_values(scale))
    while len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < wanted:
        study.sampler = _sampler(space, len(study.trials), finite)
        study.optimize(objective, n_trials=1)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))[:wanted]
    return [
        {
            "trial": t.number,
            "params": t.params,
            "value": t.value,
            "utility": t.user_attrs["utility"],
            "feasible": t.constraints["utility"] <= 0,
            "key": t.user_attrs["key"],
        }
        for t in done
    ]


@dataclasses.dataclass(frozen=True)
class FamilySearch:
    """One family's search on one audited checkpoint: what its trials and its reported rows share. ``plan``: the
    audit's plan; ``run``: the graph run that executes and reads its attack nodes; ``name``: the checkpoint;
    ``preset``/``space``: the family; ``pool``: the relearn pool its D_rel draws come from (empty for a family that
    draws nothing from D_f); ``bound``: the utility bound u_0 − ε; ``log``: a line per trial and per reported run."""

    plan: Any
    run: Any
    name: str
    preset: str
    space: SearchSpace
    pool: tuple[int, ...]
    bound: float
    log: Callable[[str], None] | None

    @property
    def utility_roles(self) -> tuple[str, ...]:
        """The splits of the benchmark's utility proxy, scored on the checkpoint by every trial and reported draw."""
        return tuple(self.plan.spec.utility)

    def objective(self, select: tuple[int, ...], wanted: int) -> Callable:
        """The Optuna objective: a trial samples the space's values and runs them as an attack node (D_rel draw 0
        from the pool, its utility proxy scored), stores its utility, its constraint against the bound and its stage
        key on the trial, logs one line (``[number/wanted]``) and returns its mean score over the selection set
        ``select``."""
        plan, space, name = self.plan, self.space, self.name

        def objective(trial) -> float:
            values = {p.key: p.suggest(trial) for p in space.params}
            cfg = space.config(plan.scale, values, 0, self.utility_roles, self.pool)
            node = plan.attack_node(name, f"{name}/search/{self.preset}/t{trial.number}", cfg)
            start, cached = time.perf_counter(), self.run.store.done(node.kind, node.key)
            self.run.execute(node)
            result = self.run.read(node.label, "attack.json")
            value = selection_score(result, select, plan.spec.score_field)
            utility = result["utility"]["rouge_l"]
            trial.set_user_attr("utility", utility)
            trial.set_constraint("utility", self.bound - utility)
            trial.set_user_attr("key", node.key)
            if self.log is not None:
                ok = "within" if utility >= self.bound else "OUTSIDE"
                self.log(
                    f"  search {name} {self.preset} [{trial.number + 1}/{wanted}] {describe_values(values)}: "
                    f"selection {plan.spec.score_label} {value:.3f} ({len(select)} records), utility {utility:.3f} "
                    f"({ok} the bound {self.bound:.3f}) "
                    + ("cached" if cached else f"{time.perf_counter() - start:.1f} s")
                )
            return value

        return objective

    def reported(self, rows: dict[str, dict], roles: list[str]) -> dict[str, dict]:
        """Runs every reported row (``rows``: row → its values, the preset's and the winner's) on the budget's draws
        on each of ``roles`` (the checkpoint first, scoring its utility proxy); returns row → its values, K, the
        checkpoint's utility per draw, the worst and whether it stays within the bound."""
        plan, name = self.plan, self.name
        reported = {}
        for row, values in rows.items():
            utilities = []
            for role in roles:
                for draw in range(plan.budget.draws):
                    scored = self.utility_roles if role == name else ()
                    cfg = self.space.config(plan.scale, values, draw, scored, self.pool)
                    label = f"{role}/{SEARCHED}/{reported_label(name, self.preset, row, draw)}"
                    self.run.execute(plan.attack_node(role, label, cfg), self.log, f"[{row}]")
                    if role == name:
                        utilities.append(self.run.read(label, "attack.json")["utility"]["rouge_l"])
            reported[row] = {
                "params": values,
                "k": values.get("k", self.space.k),
                "utility_by_draw": utilities,
                "worst_utility": min(utilities),
                "within_bound": min(utilities) >= self.bound,
            }
        return reported


def search_checkpoint(plan, ws, run, name: str, log: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Every family's search on the audited checkpoint ``name`` (its model loaded once, every trial an attack node
    of ``plan``'s builder run through ``run``), then the preset and the winner attacked on the budget's draws on the
    checkpoint (its utility proxy scored on each), θ_ref and θ0 (labels ``<role>/searched/<name>/<preset>/<row>/
    d<draw>``, :func:`reported_label`). Returns preset → the search record."""
    from margincal.pipeline.graph import REFERENCE, THETA0, stage_version  # lazy: torch
    from margincal.stages import utility_score  # lazy: torch

    block, rules, split = plan.budget.search, search_rules(), plan.split
    key_field = plan.spec.score_field
    utility_roles = tuple(plan.spec.utility)
    unattacked_utility = utility_score(run.model(name), ws, plan.eval, utility_roles)["rouge_l"]
    bound = unattacked_utility - block.epsilon
    before = run.read(f"{name}/evaluate", "eval.json")["splits"]["forget"]["samples"]
    roles = [name, *(r for r in (REFERENCE, THETA0) if r in plan.models)]
    records = {}
    for preset, space in plan.searches.items():
        pool = split.pool if space.forget else ()
        select = split.selecting(space.forget)
        unattacked_s = sum(before[i][key_field] for i in select) / len(select)  # s_0: S before any attack
        identity = {
            "model": plan.models[name].identity,
            "family": space.identity(plan.scale),
            "epsilon": block.epsilon,
            "split": {"pool": pool, "selection": select},
            "startup_trials": rules["startup_trials"],
            "data": plan.data_id,
            "train": plan.builder.train,
            "eval": plan.builder.eval,
            "utility": utility_roles,
            "code": [
                stage_version("attack"),
                code_version("margincal.auditing.search"),
            ],  # the trials' code and its own
        }
        study, journal = _study(run.store.root, config_key("search", identity, ()))
        size = space.size()
        finite = size is not None and size <= block.trials
        wanted = size if finite else block.trials
        family = FamilySearch(plan, run, name, preset, space, pool, bound, log)
        trials = _completed_trials(study, space, plan.scale, finite, wanted, family.objective(select, wanted))
        best = winner(trials)
        record = {
            "preset": preset,
            "k": space.k,
            "space": space.as_dict(),
            "epsilon": block.epsilon,
            "sampler": "brute force (finite space)" if finite else "TPE",
            "score": plan.spec.score_label,  # the selection score: the benchmark's headline (ROUGE-L, accuracy)
            "unattacked_utility": unattacked_utility,
            "utility_bound": bound,
            "split": {
                "seed": split.seed,
                "pool": list(pool),
                "selection": list(select),
                "report": list(split.report),
            },
            "journal": str(journal),
            "trials": trials,
            "unattacked_selection": unattacked_s,
            **history(trials, unattacked_s),
            "winner": None,
            "reported": {},
        }
        if best is not None:
            cfg = space.config(plan.scale, best["params"], 0)
            record["winner"] = {**best, "config": dataclasses.asdict(cfg)}
        rows = {"preset": space.preset_values(plan.scale)}
        if best is not None:
            rows["winner"] = best["params"]
        record["reported"] = family.reported(rows, roles)
        records[preset] = record
    return records


def run_searches(plan, ws, run, log: Callable[[str], None] | None = None) -> dict[str, dict[str, dict]]:
    """checkpoint → preset → search record, for every audited checkpoint (nothing for a budget without search)."""
    if not plan.searches:
        return {}
    return {name: search_checkpoint(plan, ws, run, name, log) for name in plan.audited}


def preset_yaml(record: dict, scale: str) -> str:
    """A searched winner as an attacker preset file (``--attacker FILE``, or a budget's ``preset: FILE``): the
    resolved config at the searched scale, with how it was found."""
    import yaml

    cfg = dict(record["winner"]["config"])
    for key in ("utility", "pool"):  # set by an audit's trials, never by a preset
        cfg.pop(key, None)
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k != "seed"}
    head = (
        f"# The searched winner of {record['preset']} (budget K {record['k']}; it ran at K {cfg['k']}) at the {scale} "
        "scale (margincal audit):\n"
        f"# trial {record['winner']['trial'] + 1} of {len(record['trials'])}, utility bound ε = {record['epsilon']}, "
        f"selection {record.get('score', 'ROUGE-L')} {record['winner']['value']:.3f} on "
        f"{len(record['split']['selection'])} records.\n"
        f"# Its values hold at the {scale} scale (no mini section).\n"
    )
    return head + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True)
