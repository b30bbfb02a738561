"""Searched attacks: per threat family, the strongest valid attack on an audited checkpoint within a utility bound.

A budget's ``search:`` block (``configs/audit.yaml``) asks, per attacker preset that ``configs/search.yaml`` gives a
space (:mod:`margincal.auditing.spaces`), for ``trials`` attacks (:mod:`margincal.auditing.study`: the preset first,
then a Latin-hypercube start over the space seeded per audit and checkpoint, then seeded TPE with the utility bound
as its constraint; a finite space no larger than the trials is enumerated; no configuration twice). Every trial is an
attack stage of the audit's graph on D_rel draw 0, stored like any other (a finished trial never reruns), and
Optuna's journal lives in the store (``<store>/search/<key>/journal.log``): an interrupted search resumes where it
stopped and samples what an uninterrupted one would.

Which records do what is fixed once per audit (:func:`margincal.data.draws.search_split`, seeded by ``split_seed``, a
seed no draw uses): D_f splits into a relearn pool P (the largest K a searched family draws from D_f), a selection
set S and a report set R. Every searched draw of a family that trains on D_f (LoRA, FPFT, soft prompt, in-context
pairs), trial or reported, takes D_rel ⊂ P; so S and R are held out by every one of them, whatever its K. Per trial t
with attacked model θ_t:

* selection score s_t = the mean headline score (ROUGE-L of θ_t's greedy answers; WMDP: whether it answers right)
  over S, the same records for every trial (a family whose D_rel is not drawn from D_f, such as retain or probe
  relearning, the format probe or a corpus, selects on S ∪ P);
* utility u_t = :func:`margincal.pipeline.stages.utility_score` (the benchmark's ``utility`` splits, records no attack
  trains on); feasible when u_t ≥ u_0 − ε, u_0 the unattacked checkpoint's (the trial's Optuna constraint
  u_0 − ε − u_t ≤ 0, which TPE models).

The worst case (:mod:`margincal.auditing.candidates`) is then chosen among the preset and the trials by every
constraint a reported row must meet, each checked on S: a candidate runs on every draw the budget reports (D_rel
drawn from P with seed d) on the checkpoint (its utility scored on each), θ_ref and θ0, and is valid when its utility
stays within the bound on every draw and the cards' sanity rule holds on S. The preset and the worst case are read
on R only, never used to select, so their gap is measured on the same records and draws.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from margincal.auditing.candidates import choose, constraints_broken, why_none
from margincal.auditing.spaces import SearchSpace, search_rules
from margincal.auditing.study import completed_trials, history, open_study, search_seed
from margincal.auditing.trials import TrialPool
from margincal.core.artifacts import code_version, config_key

SEARCH_CODE = ("margincal.auditing.search", "margincal.auditing.study")  # the code a search's journal is keyed by
SEARCHED = "searched"  # a searched family's reported rows: <role>/searched/<checkpoint>/<preset>/<row>/d<draw>


def reported_label(name: str, preset: str, row: str, draw: int) -> str:
    """A reported row's label below its role and kind: ``<checkpoint>/<preset>/<row>/d<draw>`` (``row``: preset or
    winner)."""
    return f"{name}/{preset}/{row}/d{draw}"


def selection_score(result: dict, records: tuple[int, ...], field: str) -> float:
    """The mean ``field`` of an attack result's samples over ``records``, every one of which it must have held out
    (a D_rel ⊂ the relearn pool never holds a selection or report record: anything else is a bug)."""
    scored = dict(zip(result["heldout"], result["samples"], strict=True))
    trained = [i for i in records if i not in scored]
    if trained:
        raise RuntimeError(f"an attack trained on selection records {trained[:5]}: D_rel left the relearn pool")
    return sum(scored[i][field] for i in records) / len(records)


def describe_values(params: dict) -> str:
    """Searched values as the log, the card and its figures show them: ``lr 0.0031, steps 45, lora.r 16``."""
    shown = {key.removeprefix("train."): value for key, value in params.items()}
    return ", ".join(f"{key} {v:.3g}" if isinstance(v, float) else f"{key} {v}" for key, v in shown.items())


def searched_label(preset: str, k: int, params: dict) -> str:
    """A searched family's row named by what it ran: ``lora_r8@18 (lr 0.0031, steps 45, lora.r 16)``."""
    values = describe_values({key: value for key, value in params.items() if key != "k"})
    return f"{preset}@{k}{f' ({values})' if values else ''}"


class SearchProgress:
    """The searches' progress: their lines through ``log`` (one per trial and per candidate run) and, on a terminal,
    a tqdm bar over every trial of the audit's searches (none in a log file or CI: stderr not a terminal), which the
    lines are written above."""

    def __init__(self, total: int, log: Callable[[str], None] | None):
        import sys

        from tqdm.auto import tqdm

        self.log = log
        self.bar = tqdm(total=total, desc="searched trials", unit="trial", leave=False, disable=not sys.stderr.isatty())

    def say(self, line: str) -> None:
        """One line above the bar (nothing without ``log``)."""
        if self.log is not None:
            with self.bar.external_write_mode():
                self.log(line)

    def logger(self) -> Callable[[str], None] | None:
        """:meth:`say` where there is a ``log``, for the graph run's node lines."""
        return self.say if self.log is not None else None

    def trial_done(self, best: float | None) -> None:
        self.bar.update(1)
        if best is not None:
            self.bar.set_postfix(best=f"{best:.3f}", refresh=False)

    def close(self) -> None:
        self.bar.close()


def planned_trials(space: SearchSpace, trials: int) -> int:
    """The trials a family's search runs: every configuration of a finite space no larger than ``trials``, else
    ``trials``."""
    size = space.size()
    return size if size is not None and size <= trials else trials


def best_so_far(study, value: float, feasible: bool, number: int) -> tuple[float, int] | None:
    """(score, trial number) of the best feasible trial among ``study``'s complete ones and the one just scored
    (``value``, ``feasible``, ``number``): what a trial's line shows beside its own score; None while none is."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    scored = [(t.value, t.number) for t in done if t.constraints["utility"] <= 0]
    scored += [(value, number)] if feasible else []
    return max(scored, key=lambda vt: (vt[0], -vt[1])) if scored else None


@dataclasses.dataclass(frozen=True)
class FamilySearch:
    """One family's search on one audited checkpoint: what its trials and its candidates share. ``plan``: the
    audit's plan; ``run``: the graph run that executes and reads its attack nodes; ``name``: the checkpoint;
    ``preset``/``space``: the family; ``pool``: the relearn pool its D_rel draws come from (empty for a family that
    draws nothing from D_f); ``select``: the records every trial and candidate is scored on; ``bound``: the utility
    bound u_0 − ε; ``floor``/``ceiling``: the roles of θ_ref and θ0 (None where the audit lacks one); ``theta0``:
    θ0's unattacked score on ``select``; ``progress``: a line per trial and per candidate run, the bar; ``trial_pool``:
    where a batch of trials runs at once."""

    plan: Any
    run: Any
    name: str
    preset: str
    space: SearchSpace
    pool: tuple[int, ...]
    select: tuple[int, ...]
    bound: float
    floor: str | None
    ceiling: str | None
    theta0: float | None
    progress: SearchProgress
    trial_pool: TrialPool
    nodes: dict = dataclasses.field(default_factory=dict)  # trial number → its attack node, added once

    @property
    def roles(self) -> tuple[str, ...]:
        """The models a candidate runs on: the checkpoint, then θ_ref and θ0 where the audit has them."""
        return tuple(r for r in (self.name, self.floor, self.ceiling) if r is not None)

    @property
    def utility_roles(self) -> tuple[str, ...]:
        """The splits of the benchmark's utility proxy, scored on the checkpoint by every trial and candidate draw."""
        return tuple(self.plan.spec.utility)

    def score(self, label: str) -> float:
        """An attack result's mean headline score over the selection records."""
        return selection_score(self.run.read(label, "attack.json"), self.select, self.plan.spec.score_field)

    def trial_node(self, number: int, values: dict):
        """Trial ``number``'s attack node: ``values`` on D_rel draw 0 from the pool, its utility proxy scored."""
        if number not in self.nodes:
            cfg = self.space.config(self.plan.scale, values, 0, self.utility_roles, self.pool)
            self.nodes[number] = self.plan.attack_node(self.name, f"{self.name}/search/{self.preset}/t{number}", cfg)
        return self.nodes[number]

    def run_batch(self, batch: list[tuple[int, dict]]) -> None:
        """A batch of trials (number, values) run at once where the pool has workers (stored, read by the search)."""
        self.trial_pool.run([self.trial_node(n, values) for n, values in batch], self.run.store.done)

    def objective(self, wanted: int) -> Callable:
        """The search's objective: a trial runs its sampled ``values`` as an attack node (D_rel draw 0 from the pool,
        its utility proxy scored), stores its utility, its constraint against the bound and its stage key on the
        trial, logs one line (``[number/wanted]``) and returns its mean score over the selection records."""
        plan, name = self.plan, self.name

        def objective(trial, values: dict) -> float:
            node = self.trial_node(trial.number, values)
            start, cached = time.perf_counter(), self.run.store.done(node.kind, node.key)
            self.run.execute(node)
            value = self.score(node.label)
            utility = self.run.read(node.label, "attack.json")["utility"]["rouge_l"]
            trial.set_user_attr("utility", utility)
            trial.set_constraint("utility", self.bound - utility)
            trial.set_user_attr("key", node.key)
            best = best_so_far(trial.study, value, utility >= self.bound, trial.number)
            ok = "within" if utility >= self.bound else "OUTSIDE"
            self.progress.say(
                f"  search {name} {self.preset} [{trial.number + 1}/{wanted}] {describe_values(values)}: "
                f"selection {plan.spec.score_label} {value:.3f} ({len(self.select)} records), utility "
                f"{utility:.3f} ({ok} the bound {self.bound:.3f}), best so far "
                + (f"{best[0]:.3f} (trial {best[1] + 1}), " if best is not None else "none within the bound, ")
                + ("cached" if cached else f"{time.perf_counter() - start:.1f} s")
            )
            self.progress.trial_done(best[0] if best is not None else None)
            return value

        return objective

    def candidate(self, row: str, values: dict, trial: int | None) -> dict:
        """Runs ``values`` on every draw the budget reports on each of the roles (the checkpoint first, scoring its
        utility proxy; labels ``<role>/searched/<name>/<preset>/<row>/d<draw>``) and reads it on the selection
        records only (:mod:`margincal.auditing.candidates`): its pooled selection score, utility per draw, floor and
        ceiling, and the constraints it breaks."""
        plan, name = self.plan, self.name
        scores: dict[str, list[float]] = {}
        utilities = []
        for role in self.roles:
            for draw in range(plan.budget.draws):
                scored = self.utility_roles if role == name else ()
                cfg = self.space.config(plan.scale, values, draw, scored, self.pool)
                label = f"{role}/{SEARCHED}/{reported_label(name, self.preset, row, draw)}"
                self.run.execute(plan.attack_node(role, label, cfg), self.progress.logger(), f"[{row}]")
                scores.setdefault(role, []).append(self.score(label))
                if role == name:
                    utilities.append(self.run.read(label, "attack.json")["utility"]["rouge_l"])
        mean = {role: sum(v) / len(v) for role, v in scores.items()}
        floor, ceiling = mean.get(self.floor), mean.get(self.ceiling)
        return {
            "row": row,
            "trial": trial,
            "params": values,
            "k": values.get("k", self.space.k),
            "selection": mean[name],
            "utility_by_draw": utilities,
            "worst_utility": min(utilities),
            "within_bound": min(utilities) >= self.bound,
            "floor": floor,
            "ceiling": ceiling,
            "ceiling_unattacked": self.theta0 if ceiling is not None else None,
            "broken": constraints_broken(utilities, self.bound, floor, ceiling, self.theta0),
        }


def search_checkpoint(plan, ws, run, name: str, progress: SearchProgress, trial_pool: TrialPool) -> dict[str, dict]:
    """Every family's search on the audited checkpoint ``name`` (its model loaded once, every trial an attack node
    of ``plan``'s builder run through ``run``), then its worst case among the preset and the trials
    (:func:`margincal.auditing.candidates.choose`: each candidate run on the budget's draws on the checkpoint, θ_ref
    and θ0 and checked against every constraint on the selection records). Returns preset → the search record, whose
    ``reported`` rows (the preset and the winner) the card reads on the report set."""
    from margincal.pipeline.graph import REFERENCE, THETA0, stage_version  # lazy: torch
    from margincal.pipeline.stages import utility_score  # lazy: torch

    block, rules, split = plan.budget.search, search_rules(), plan.split
    key_field = plan.spec.score_field
    utility_roles = tuple(plan.spec.utility)
    unattacked_utility = utility_score(run.model(name), ws, plan.eval, utility_roles)["rouge_l"]
    bound = unattacked_utility - block.epsilon
    before = run.read(f"{name}/evaluate", "eval.json")["splits"]["forget"]["samples"]
    floor, ceiling = (role if role in plan.models else None for role in (REFERENCE, THETA0))
    theta0_before = run.read(f"{THETA0}/evaluate", "eval.json")["splits"]["forget"]["samples"] if ceiling else None
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
            "code": [stage_version("attack"), *map(code_version, SEARCH_CODE)],  # the trials' and its own
            **({"workers": block.workers} if block.workers > 1 else {}),  # trials asked at once change the sequence
        }
        seed = search_seed(identity)
        study, journal = open_study(run.store.root, config_key("search", identity, ()))
        size = space.size()
        finite = size is not None and size <= block.trials
        wanted = planned_trials(space, block.trials)
        theta0 = sum(theta0_before[i][key_field] for i in select) / len(select) if theta0_before else None
        family = FamilySearch(
            plan, run, name, preset, space, pool, select, bound, floor, ceiling, theta0, progress, trial_pool
        )
        objective = family.objective(wanted)
        workers, batch = block.workers, family.run_batch
        trials = completed_trials(study, space, plan.scale, finite, wanted, seed, objective, workers, batch)
        best, checked = choose(trials, space.preset_values(plan.scale), family.candidate, plan.budget.draws)
        record = {
            "preset": preset,
            "k": space.k,
            "space": space.as_dict(),
            "epsilon": block.epsilon,
            "sampler": "every configuration (finite space)" if finite else "Latin hypercube start, then TPE",
            "seed": seed,
            "score": plan.spec.score_label,  # the selection score: the benchmark's headline (ROUGE-L, accuracy)
            "unattacked_utility": unattacked_utility,
            "utility_bound": bound,
            "split": {"seed": split.seed, "pool": list(pool), "selection": list(select), "report": list(split.report)},
            "journal": journal.relative_to(run.store.root).as_posix(),  # in the store: no machine path on the card
            "trials": trials,
            "unattacked_selection": unattacked_s,
            **history(trials, unattacked_s),
            "candidates": checked,
            "winner": None,
            "why_none": None if best is not None else why_none(trials, checked),
            "reported": {"preset": _reported(checked[0])},
        }
        if best is not None:
            cfg = space.config(plan.scale, best["params"], 0)
            record["winner"] = {
                "row": best["row"],
                "trial": best["trial"],
                "params": best["params"],
                "value": best["selection"],
                "config": dataclasses.asdict(cfg),
            }
            record["reported"]["winner"] = _reported(best)
        records[preset] = record
    return records


def _reported(candidate: dict) -> dict:
    """What the card reads of a reported row: its stored runs (``row``), values, K and utility per draw."""
    keys = ("row", "params", "k", "utility_by_draw", "worst_utility", "within_bound")
    return {key: candidate[key] for key in keys}


def run_searches(plan, ws, run, log: Callable[[str], None] | None = None) -> dict[str, dict[str, dict]]:
    """checkpoint → preset → search record, for every audited checkpoint (nothing for a budget without search)."""
    if not plan.searches:
        return {}
    trials = sum(planned_trials(space, plan.budget.search.trials) for space in plan.searches.values())
    progress = SearchProgress(len(plan.audited) * trials, log)
    block = plan.budget.search
    trial_pool = TrialPool(block.executor, block.workers, run, run.store.root)
    try:
        return {name: search_checkpoint(plan, ws, run, name, progress, trial_pool) for name in plan.audited}
    finally:
        trial_pool.close()
        progress.close()


def preset_yaml(record: dict, scale: str) -> str:
    """A searched family's worst case as an attacker preset file (``--attacker FILE``, or a budget's ``preset:
    FILE``): the resolved config at the searched scale, with how it was found."""
    import yaml

    cfg = dict(record["winner"]["config"])
    for key in ("utility", "pool"):  # set by an audit's trials, never by a preset
        cfg.pop(key, None)
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k != "seed"}
    won = record["winner"]
    which = "the preset itself" if won.get("row") == "preset" or won["trial"] is None else f"trial {won['trial'] + 1}"
    head = (
        f"# The worst case of {record['preset']} (budget K {record['k']}; it ran at K {cfg['k']}) at the {scale} "
        "scale (margincal audit):\n"
        f"# {which} ({len(record['trials'])} trials), utility bound ε = {record['epsilon']}, "
        f"selection {record.get('score', 'ROUGE-L')} {won['value']:.3f} on "
        f"{len(record['split']['selection'])} records.\n"
        f"# Its values hold at the {scale} scale (no mini section).\n"
    )
    return head + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True)
