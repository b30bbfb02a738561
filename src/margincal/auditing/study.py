"""A searched family's trials as an Optuna study kept in the store: the preset first, then a Latin-hypercube start
over the space seeded per search, then seeded TPE; no configuration twice; resumable from its journal
(``configs/search.yaml`` states the rule; :mod:`margincal.auditing.search` runs each trial as an attack node)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from margincal.auditing.spaces import SearchSpace, search_rules
from margincal.core.artifacts import config_key


def open_study(store_root: Path, key: str):
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


def search_seed(identity: dict) -> int:
    """The seed of one search (its start design and every sampler), from what the search is of, its code excepted:
    the audited checkpoint, the family, ε, the split and the data. Two checkpoints, or two audits of other data or
    bounds, draw other configurations; a search run again draws the same ones."""
    return int(config_key("search-seed", {k: v for k, v in identity.items() if k != "code"}, ())[:7], 16)


def start_design(space: SearchSpace, n: int, seed: int) -> list[dict]:
    """The start of a search after the preset: ``n`` points of a scrambled Latin hypercube over the space (scipy's
    ``qmc.LatinHypercube``, centred-discrepancy optimised, seeded), each parameter's range cut into ``n`` strata of
    equal probability (log-scaled where the range is) with one point in each, so that the first ``n`` trials cover
    every parameter's whole range instead of clustering."""
    from scipy.stats import qmc

    if n == 0:
        return []
    unit = qmc.LatinHypercube(d=len(space.params), optimization="random-cd", rng=seed).random(n)
    return [{p.key: p.at(float(u)) for p, u in zip(space.params, row, strict=True)} for row in unit]


def every_configuration(space: SearchSpace) -> list[dict]:
    """Every configuration of a finite space, in the order of its parameters' values."""
    values = [p.choices if p.choices is not None else range(p.low, p.high + 1) for p in space.params]
    return [dict(zip((p.key for p in space.params), combo, strict=True)) for combo in itertools.product(*values)]


def _sampler(seed: int, after_repeat: bool):
    """The sampler of a trial nothing was enqueued for: uniform at random right after a configuration was drawn
    twice, else seeded TPE (the start design and a finite space's configurations are enqueued before it)."""
    import optuna

    if after_repeat:
        return optuna.samplers.RandomSampler(seed=seed)
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


def completed_trials(
    study,
    space: SearchSpace,
    scale: str,
    finite: bool,
    wanted: int,
    seed: int,
    objective: Callable,
    workers: int = 1,
    run_batch: Callable | None = None,
) -> list[dict]:
    """Runs ``study`` until it holds ``wanted`` complete trials and returns its first ``wanted`` as records (number,
    params, selection score, utility, feasibility, stage key). A new study enqueues the preset's values, then every
    configuration of a finite space (``finite``: no larger than the trials) or the start design
    (:func:`start_design`); each later trial's sampler is seeded by the search's seed plus its number
    (:func:`_sampler`), so a resumed search draws what an uninterrupted one would. A configuration drawn a second
    time is never run: its trial is marked failed (``repeats``: the earlier trial) and the next one is drawn at
    random. A finite space stops when every configuration ran.

    Trials are asked ``workers`` at a time, each batch asked before any of it is told (its later trials sampled
    without the earlier ones' scores), handed to ``run_batch([(number, values), ...])`` (which may run them at once:
    :class:`margincal.auditing.trials.TrialPool`), then told in trial order; ``workers`` = 1 is the one-by-one
    search."""
    from optuna.trial import TrialState

    if not study.trials:
        study.enqueue_trial(space.preset_values(scale))
        start = every_configuration(space) if finite else start_design(space, search_rules()["startup_trials"], seed)
        for values in start:
            study.enqueue_trial(values)
    size = space.size()
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    seen = {_frozen(t.params): t.number for t in done}
    while len(done) < wanted and (size is None or len(seen) < size):
        batch: list = []
        while len(done) + len(batch) < wanted and len(batch) < workers and (size is None or len(seen) < size):
            last = study.trials[-1] if study.trials else None
            after_repeat = last is not None and "repeats" in last.user_attrs
            study.sampler = _sampler(seed + len(study.trials), after_repeat)
            trial = study.ask()
            values = {p.key: p.suggest(trial) for p in space.params}
            if _frozen(values) in seen:
                trial.set_user_attr("repeats", seen[_frozen(values)])
                study.tell(trial, state=TrialState.FAIL)
                continue
            seen[_frozen(values)] = trial.number
            batch.append((trial, values))
        if run_batch is not None:
            run_batch([(trial.number, values) for trial, values in batch])
        for trial, values in batch:
            study.tell(trial, objective(trial, values))
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return [
        {
            "trial": t.number,
            "params": t.params,
            "value": t.value,
            "utility": t.user_attrs["utility"],
            "feasible": t.constraints["utility"] <= 0,
            "key": t.user_attrs["key"],
        }
        for t in done[:wanted]
    ]


def _frozen(values: dict) -> tuple:
    """A configuration as a hashable value (the same values, whatever their order)."""
    return tuple(sorted(values.items()))
