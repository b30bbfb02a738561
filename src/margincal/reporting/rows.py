"""What a panel's report reads of its cell records and how it shows it: the column of each metric and attack, names
and number formats, the CSV rows, and the paired changes over seeds the tables and fronts report."""

from __future__ import annotations

import csv
import io
import logging
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from margincal.reporting import figures
from margincal.reporting.records import AttackResult, DoneRecord, FailedRecord, RoleResult, read_records
from margincal.results import metric_table as T
from margincal.results.stats import MeanInterval, mean_interval

log = logging.getLogger(__name__)
ATTACKER_NAMES = {
    "lora_r8": "LoRA",
    "lora_r32": "LoRA-r32",
    "fpft": "FPFT",
    "soft_prompt_20": "Soft20",
    "soft_prompt_100": "Soft100",
    "adaptive": "Adaptive",
    "linear_probe": "Probe",
}
ROLE_NAMES = {"reference": "θ_ref", "theta0": "θ0", "baseline": "baseline", "mc": "MC"}
HEADLINE = T.metrics("delta", "F_agg", "mia_agg", "model_utility")  # T1's metric columns
FORGET_QUALITY = T.METRICS["forget_quality"]  # T1's KS-p column: bold at p ≥ 0.05
# the forget metrics each attack record holds, with how each is read from it
ATTACKED: tuple[tuple[T.Metric, Callable[[AttackResult], float | None]], ...] = (
    (T.FORGET_ROUGE, lambda a: a.rouge_l),
    (T.FACT_RECALL, lambda a: a.fact_recall),
)
PAIRED_KEYS = {"MU": "mu", "K20": "k20_rouge_l", "MIA adv": "mia_advantage"}  # the fronts' paired comparison


def attack_column(label: str) -> str:
    """``lora_r8@20`` → ``K20-LoRA`` (the paper's column names)."""
    preset, k = label.rsplit("@", 1)
    return f"K{k}-{ATTACKER_NAMES.get(preset, preset)}"


# (column, value of one model's record, lower is better, format)
Column = tuple[str, Callable[[RoleResult], float | None], bool, str]


def column(name: str) -> Column:
    """The column of metric ``name`` of the metric table: its label, direction and format, read from a model's
    summary by :func:`~margincal.results.metric_table.read` (MUSE's stand-ins included)."""
    metric = T.METRICS[name]
    return metric.display, lambda m: T.read(name, m.summary), metric.lower_is_better, metric.fmt


def attack_columns(label: str, facts: bool) -> list[Column]:
    """The held-out forget ROUGE-L after attack ``label`` (and its fact recall with ``facts``): the forget metrics
    read from the model's attack record (None where the model has none of that label), with their directions and
    formats."""
    return [
        (
            attack_column(label) + ("" if metric is T.FORGET_ROUGE else f" {metric.label}"),
            lambda m, read=read: read(m.attacks[label]) if label in m.attacks else None,
            metric.lower_is_better,
            metric.fmt,
        )
        for metric, read in ATTACKED[: 2 if facts else 1]
    ]


def metrics(attack_labels: list[str], facts: bool = False) -> list[Column]:
    """The head-to-head columns; ``facts`` adds each attack's held-out fact recall (benchmarks with attribute
    values, the mini's) beside its ROUGE-L."""
    return [column(m.name) for m in HEADLINE] + [c for lab in attack_labels for c in attack_columns(lab, facts)]


def load_cells(results: Path) -> tuple[list[DoneRecord], list[FailedRecord], list[tuple[str, str]]]:
    """(done, failed, bad) cell records of a results directory (:func:`~margincal.reporting.records.read_records`),
    done ones in the paper's row order."""
    done, failed, bad = read_records(results / "cells")
    if not (done or failed or bad):
        raise FileNotFoundError(f"no cell records in {results / 'cells'}; run `margincal panel` first")
    return sorted(done, key=_order), failed, bad


def _order(rec: DoneRecord) -> tuple:
    """Rows by loss family (gradient, preference, distillation) as in the paper, then method, seed, variant."""
    c = rec.cell
    return (list(figures.FAMILY_COLORS).index(rec.family), c.method, c.seed, c.variant)


def _group(rec: DoneRecord) -> tuple[str, str, str]:
    c = rec.cell
    return c.benchmark, c.model, c.tier


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _signed(spec: str) -> str:
    """The format spec of a change: the metric's own, always with its sign."""
    return "+" + spec.lstrip("+")


def _src(rec: DoneRecord) -> str:
    return f"cells/{rec.id}.json"


def _csv(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerows([header, *rows])
    return buf.getvalue()


def pareto_row(rec: DoneRecord, role: str, label: str) -> dict:
    """One row of ``pareto.json``: a cell's ``baseline`` (configuration ``baseline``) or ``mc`` (configuration = the
    cell's variant) with MU, the ``label`` attack's held-out ROUGE-L and fact recall, MIA advantage, privleak, Δ and
    the optimizer steps behind the released checkpoint (a monitored polish: the step it selected)."""
    summary, attack = rec.models[role].summary, rec.models[role].attacks.get(label)
    if role == "baseline":  # records written before a field existed lack it: the row says null
        configuration, steps = "baseline", rec.unlearn.get("steps_run")
    else:
        info = rec.polish
        configuration, steps = (
            rec.cell.variant,
            info["selected"] if info.get("selected") is not None else info.get("steps"),
        )
    return {
        "base": rec.cell.method,
        "configuration": configuration,
        "seed": rec.cell.seed,
        "mu": summary.get(T.MODEL_UTILITY.name),
        "k20_rouge_l": None if attack is None else attack.rouge_l,
        "k20_fact_recall": None if attack is None else attack.fact_recall,
        "mia_advantage": summary.get(T.ADVANTAGE.name),
        "privleak": summary.get("privleak"),
        "delta": summary.get("delta"),
        "steps_run": steps,
        "source": _src(rec),
    }


def seed_table(rows: list[dict], value: Callable[[dict], object]) -> dict[int, dict[str, object]]:
    """Pareto rows as seed → configuration → ``value(row)``, rows whose value is None left out."""
    table: dict[int, dict[str, object]] = defaultdict(dict)
    for r in rows:
        if (v := value(r)) is not None:
            table[r["seed"]][r["configuration"]] = v
    return table


def paired_change(rows: list[dict], a: str, b: str, key: str) -> MeanInterval:
    """x̄ ± t·s/√n over the seeds with both configurations of ``key``: the per-seed change a − b of pareto rows."""
    pairs = [v for v in seed_table(rows, lambda r: r[key]).values() if a in v and b in v]
    return mean_interval([v[a] - v[b] for v in pairs])


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def change_over_seeds(recs: list[DoneRecord], change: Callable[[DoneRecord], float | None]) -> tuple[MeanInterval, int]:
    """A paired change per cell record, averaged over methods within each seed, then x̄ ± t·s/√n over seeds (methods
    are fixed, seeds random). Only methods run at every seed enter. Returns the interval and their count."""
    runs = defaultdict(dict)
    for rec in recs:
        runs[rec.cell.method][rec.cell.seed] = change(rec)
    seeds = sorted({rec.cell.seed for rec in recs})
    full = [m for m, by_seed in runs.items() if sorted(by_seed) == seeds]
    return mean_interval([_mean([runs[m][s] for m in full]) for s in seeds]), len(full)


def _file_part(name: str) -> str:
    """An axis name as part of a file name: a YAML path's stem, other characters than letters, digits, ``.``,
    ``_`` and ``-`` as ``-`` (a benchmark or model family given as a path names no directory)."""
    stem = Path(name).stem if name.endswith((".yaml", ".yml")) else name
    return re.sub(r"[^\w.-]+", "-", stem)
