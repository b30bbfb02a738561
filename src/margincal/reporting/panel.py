"""``margincal report``: the paper's tables and figures from a panel's cell records.

Reads ``<results>/cells/*.json`` (written by :func:`margincal.pipeline.cell.run_cell`) and writes ``report.md``,
one CSV per table and PNG figures. Tables: T1 head-to-head (baseline → MC per method, bold where MC improves, win
counts), T2 cross-axis matrix (paired MC wins / populated cells with 95 % Clopper–Pearson CIs), the seed table (per
method, means over seeds and the paired MC − baseline difference with its Student-t interval), T3 ablation matrix
(MC variants averaged over bases and seeds, and each one's paired change against the main variant), the K-sweep
(means over seeds, the paired change per K), and the per-detector MIA table with the advantage. Figures: the cliff
figure, the K-curve, the bridge scatter (Δ vs post-attack ROUGE-L with Pearson/Spearman and bootstrap CIs) and the
Pareto movement plot. Every row names the cell record it was read from (``cells/<id>.json``, which lists the store
directory of every stage), and every CSV row carries that path.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from margincal.artifacts import atomic_write_text, check_owned_dir, inside, json_text, own
from margincal.errors import InputError
from margincal.evaluation import metric_table as T
from margincal.evaluation.stats import MIN_BOOTSTRAP_N, MeanInterval, correlation, mean_interval, win_count
from margincal.inputs import read_json
from margincal.reporting import figures, fronts
from margincal.reporting.records import check_results, read_records
from margincal.reporting.tables import arrow, markdown_table

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
ATTACKED = (T.FORGET_ROUGE, T.FACT_RECALL)  # read from each attack record under their forget split keys
PAIRED_KEYS = {"MU": "mu", "K20": "k20_rouge_l", "MIA adv": "mia_advantage"}  # the fronts' paired comparison


def attack_column(label: str) -> str:
    """``lora_r8@20`` → ``K20-LoRA`` (the paper's column names)."""
    preset, k = label.rsplit("@", 1)
    return f"K{k}-{ATTACKER_NAMES.get(preset, preset)}"


# (column, value of one model's record, lower is better, format)
Column = tuple[str, Callable[[dict], float | None], bool, str]


def column(name: str) -> Column:
    """The column of metric ``name`` of the metric table: its label, direction and format, read from a model's
    summary by :func:`~margincal.evaluation.metric_table.read` (MUSE's stand-ins included)."""
    metric = T.METRICS[name]
    return metric.display, lambda m: T.read(name, m["summary"]), metric.lower_is_better, metric.fmt


def attack_columns(label: str, facts: bool) -> list[Column]:
    """The held-out forget ROUGE-L after attack ``label`` (and its fact recall with ``facts``): the forget metrics'
    split keys read from the model's attack record, with their directions and formats."""
    return [
        (
            attack_column(label) + ("" if metric is T.FORGET_ROUGE else f" {metric.label}"),
            lambda m, key=metric.split_key: m["attacks"].get(label, {}).get(key),
            metric.lower_is_better,
            metric.fmt,
        )
        for metric in ATTACKED[: 2 if facts else 1]
    ]


def metrics(attack_labels: list[str], facts: bool = False) -> list[Column]:
    """The head-to-head columns; ``facts`` adds each attack's held-out fact recall (benchmarks with attribute
    values, the mini's) beside its ROUGE-L."""
    return [column(m.name) for m in HEADLINE] + [c for lab in attack_labels for c in attack_columns(lab, facts)]


def load_cells(results: Path) -> tuple[list[dict], list[dict], list[tuple[str, str]]]:
    """(done, failed, bad) cell records of a results directory (:func:`~margincal.reporting.records.read_records`),
    done ones in the paper's row order."""
    done, failed, bad = read_records(results / "cells")
    if not (done or failed or bad):
        raise FileNotFoundError(f"no cell records in {results / 'cells'}; run `margincal panel` first")
    return sorted(done, key=_order), failed, bad


def _order(rec: dict) -> tuple:
    """Rows by loss family (gradient, preference, distillation) as in the paper, then method, seed, variant."""
    c = rec["cell"]
    return (list(figures.FAMILY_COLORS).index(rec["family"]), c["method"], c["seed"], c["variant"])


def _group(rec: dict) -> tuple[str, str, str]:
    c = rec["cell"]
    return c["benchmark"], c["model"], c["tier"]


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _signed(spec: str) -> str:
    """The format spec of a change: the metric's own, always with its sign."""
    return "+" + spec.lstrip("+")


def _src(rec: dict) -> str:
    return f"cells/{rec['id']}.json"


def _csv(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerows([header, *rows])
    return buf.getvalue()


class Report:
    def __init__(self, results: Path, out: Path, copy_cells: bool = False):
        self.results, self.out, self.copy_cells = results, out, copy_cells
        self.done, self.failed, self.bad = load_cells(results)
        for name, why in self.bad:
            log.warning("skipped cells/%s (listed in report.md): %s", name, why)
        if not self.done:
            first = f" (first: cells/{self.bad[0][0]}: {self.bad[0][1]})" if self.bad else ""
            why = f"no record is of the cell-record schema{first}" if self.bad else "every cell failed"
            raise InputError(f"{results / 'cells'}: {why}; nothing to report")
        self.labels = list(dict.fromkeys(lab for r in self.done for lab in r["models"]["mc"]["attacks"]))
        self.meta = _panel_meta(results / "panel.json")
        config = self.meta.get("manifest", {}).get("config", {})
        listed = [v if isinstance(v, str) else v.get("name") for v in config.get("variants", [])]
        found = dict.fromkeys(r["cell"]["variant"] for r in self.done)
        self.variants = [v for v in listed if v in found] + [v for v in found if v not in listed]  # panel order
        self.main_variant = "reference" if "reference" in self.variants else self.variants[0]
        self.headline = [lab for lab in self.labels if lab.endswith("@20")] or self.labels[:2]
        self.facts = any("fact_recall" in a for r in self.done for a in r["models"]["baseline"]["attacks"].values())
        # what the attacks' held-out score is: ROUGE-L, or accuracy where every cell is a multiple-choice benchmark
        wmdp = all(T.METRICS["forget_wmdp_acc"].name in r["models"]["baseline"]["summary"] for r in self.done)
        self.score = "accuracy" if self.done and wmdp else "ROUGE-L"
        self.parts: list[str] = []
        self.csvs: dict[str, str] = {}
        self.written: list[str] = []  # figure files, for the output directory's marker

    def cells(self, variant: str | None = None, seed: int | None = None) -> list[dict]:
        return [
            r
            for r in self.done
            if (variant is None or r["cell"]["variant"] == variant) and (seed is None or r["cell"]["seed"] == seed)
        ]

    # ------------------------------------------------------------------------------------------ tables
    def t1(self) -> None:
        """Head-to-head per (benchmark, model, tier) at the main variant and the smallest seed."""
        seed = min(r["cell"]["seed"] for r in self.done)
        groups = defaultdict(list)
        for rec in self.cells(self.main_variant, seed):
            groups[_group(rec)].append(rec)
        cols = metrics(self.headline, self.facts)
        for (bench, model, tier), recs in groups.items():
            self.parts += [
                f"## T1 head-to-head: {bench} / {model} / {tier} (MC variant `{self.main_variant}`, seed {seed})",
                "",
            ]
            header = [
                "Method",
                "Family",
                *[f"{c[0]} ({'↓' if c[2] else '↑'})" for c in cols],
                f"{FORGET_QUALITY.display} (MC)",
                "source",
            ]
            rows, csv_rows = [], []
            for rec in recs:
                b, m = rec["models"]["baseline"], rec["models"]["mc"]
                cells = []
                for _, get, lower, spec in cols:
                    vb, vm = get(b), get(m)
                    cells.append("—" if vb is None or vm is None else arrow(vb, vm, lower, spec))
                ks = T.read(FORGET_QUALITY.name, m["summary"])
                ks_s = _fmt(ks, FORGET_QUALITY.fmt)
                ks_s = f"**{ks_s}**" if ks is not None and ks >= 0.05 else ks_s
                rows.append([rec["cell"]["method"], rec["family"], *cells, ks_s, f"[json]({_src(rec)})"])
                csv_rows.append(
                    [
                        rec["cell"]["method"],
                        rec["family"],
                        *[v for c in cols for v in (c[1](b), c[1](m))],
                        ks,
                        _src(rec),
                    ]
                )
            wins = [
                str(win_count([(c[1](r["models"]["baseline"]), c[1](r["models"]["mc"])) for r in recs], c[2]))
                for c in cols
            ]
            n_ks = sum((T.read(FORGET_QUALITY.name, r["models"]["mc"]["summary"]) or 0) >= 0.05 for r in recs)
            rows.append([f"**MC wins (of {len(recs)})**", "", *wins, f"{n_ks} (KS ≥ 0.05)", ""])
            self.parts += [markdown_table(header, rows), ""]
            ref = recs[0]["models"]
            keys = ("rouge_l", "fact_recall") if self.facts else ("rouge_l",)
            anchors = ", ".join(
                f"{name} " + " / ".join(_fmt(ref[role]["attacks"].get(lab, {}).get(k), ".3f") for k in keys)
                for role, name in (("theta0", "θ0 (recovery ceiling)"), ("reference", "θ_ref"))
                for lab in self.headline[:1]
            )
            self.parts += [
                f"m_ref = {recs[0]['m_ref']:+.3f}. Each cell is baseline → MC; **bold** marks an MC improvement; win "
                "counts carry 95 % Clopper–Pearson intervals (ties at the printed precision are decided at full "
                "precision). Δ = m(D_f) − m_ref (≤ 0: crossed the cliff). "
                f"Reference points under {attack_column(self.headline[0]) if self.headline else 'the attack'}"
                f"{' (ROUGE-L / fact recall)' if self.facts else ''}: {anchors}. "
                + (
                    "Fact recall: the share of the held-out answers' attribute values the attacked model states. "
                    if self.facts
                    else ""
                ),
                "",
            ]
            name = f"t1_{'_'.join(_file_part(x) for x in (bench, model, tier))}.csv"
            head = [
                "method",
                "family",
                *[f"{c[0]}_{side}" for c in cols for side in ("baseline", "mc")],
                "ks_p_mc",
                "source",
            ]
            self.csvs[name] = _csv(head, csv_rows)

    def t2(self) -> None:
        """Cross-axis matrix: per (benchmark, model, tier, variant) axis, MC wins / populated paired cells."""
        cols = metrics(self.headline, self.facts)[1:]  # all but Δ
        groups = defaultdict(list)
        for rec in self.done:
            groups[(*_group(rec), rec["cell"]["variant"])].append(rec)
        header = ["Axis (benchmark / model / tier / variant)", "n", *[f"{c[0]} ({'↓' if c[2] else '↑'})" for c in cols]]
        rows, csv_rows = [], []
        totals = {c[0]: [] for c in cols}
        for key, recs in groups.items():
            seeds = sorted({r["cell"]["seed"] for r in recs})
            axis = " / ".join(key) + (f" ({len(seeds)} seeds)" if len(seeds) > 1 else "")
            row = [axis, str(len(recs))]
            for name, get, lower, _ in cols:
                pairs = [(get(r["models"]["baseline"]), get(r["models"]["mc"])) for r in recs]
                totals[name] += pairs
                wc = win_count(pairs, lower)
                row.append(str(wc))
                csv_rows.append([axis, name, wc.wins, wc.n, wc.low, wc.high])
            rows.append(row)
        total = ["**Total**", str(len(self.done))] + [str(win_count(totals[c[0]], c[2])) for c in cols]
        rows.append(total)
        self.parts += [
            "## T2 cross-axis robustness matrix",
            "",
            markdown_table(header, rows),
            "",
            "Cells: MC wins / populated paired cells (baseline vs MC of the same base) with the exact 95 % "
            "Clopper–Pearson interval of the win rate."
            + (
                " The interval treats cells as independent draws; seeds of one method are not, so with "
                "several seeds read it as descriptive and take the seed table's intervals for claims."
                if len({r["cell"]["seed"] for r in self.done}) > 1
                else ""
            ),
            "",
        ]
        self.csvs["t2.csv"] = _csv(["axis", "metric", "wins", "n", "ci_low", "ci_high"], csv_rows)

    def seeds(self) -> None:
        """Per method at the main variant, over seeds: baseline and MC means and the paired MC − baseline difference
        with its 95 % Student-t interval; the last row averages the difference over the methods of each seed first,
        so its interval is over seeds too (methods are fixed, seeds random)."""
        recs = self.cells(self.main_variant)
        if len({r["cell"]["seed"] for r in recs}) < 2:
            return
        cols = [column(T.DELTA.name), column(T.MODEL_UTILITY.name)]
        cols += [c for lab in self.headline for c in attack_columns(lab, self.facts)]
        by_method = defaultdict(dict)
        for rec in recs:
            by_method[rec["cell"]["method"]][rec["cell"]["seed"]] = rec
        seeds = sorted({r["cell"]["seed"] for r in recs})

        def diff(rec: dict, get: Callable[[dict], float | None]) -> float | None:
            b, m = get(rec["models"]["baseline"]), get(rec["models"]["mc"])
            return None if b is None or m is None else m - b

        header = ["Method", "seeds", *[f"{c[0]} ({'↓' if c[2] else '↑'})" for c in cols]]
        rows, csv_rows = [], []
        for method, runs in by_method.items():
            row = [method, str(len(runs))]
            for name, get, _, spec in cols:
                base = mean_interval([get(r["models"]["baseline"]) for r in runs.values()])
                mc = mean_interval([get(r["models"]["mc"]) for r in runs.values()])
                change = mean_interval([diff(r, get) for r in runs.values()])
                row.append(f"{_fmt(base.mean, spec)} → {_fmt(mc.mean, spec)}, {change.format(_signed(spec))}")
                csv_rows.append([method, name, len(runs), base.mean, mc.mean, change.mean, change.low, change.high])
            rows.append(row)
        pooled, n_full = ["**mean over methods**", ""], 0
        for name, get, _, spec in cols:
            change, n_full = change_over_seeds(recs, lambda r, get=get: diff(r, get))
            pooled.append(change.format(_signed(spec)))
            csv_rows.append(["mean over methods", name, len(seeds), None, None, change.mean, change.low, change.high])
        pooled[1] = f"{len(seeds)} × {n_full}"
        rows.append(pooled)
        self.parts += [
            f"## Seeds: baseline → MC over {len(seeds)} seeds (MC variant `{self.main_variant}`)",
            "",
            markdown_table(header, rows),
            "",
            "Each cell: baseline mean → MC mean over the seeds, then the mean paired change MC − baseline "
            "with its 95 % Student-t interval (t with n − 1 degrees of freedom; 4.30 at three seeds). The "
            f"last row averages the change over the {n_full} methods run at every seed, "
            "per seed, and gives the interval over seeds.",
            "",
        ]
        self.csvs["seeds.csv"] = _csv(
            ["method", "metric", "n", "baseline", "mc", "change", "ci_low", "ci_high"], csv_rows
        )

    def t3(self) -> None:
        """Ablation matrix: each MC variant averaged over the (base, seed) cells it was run on, and its paired change
        against the main variant's MC of the same base and seed (mean over bases per seed, t-interval over seeds)."""
        if len(self.variants) < 2:
            return
        lab = self.headline[0] if self.headline else None
        attack: Column = attack_columns(lab, False)[0] if lab else ("—", lambda m: None, True, ".3f")
        cols = {
            "delta": column(T.DELTA.name),
            "mu": column(T.MODEL_UTILITY.name),
            "f_rouge": column(T.FORGET_ROUGE.name),
            "attack": attack,
        }  # CSV name → column
        main = {(r["cell"]["method"], r["cell"]["seed"]): r["models"]["mc"] for r in self.cells(self.main_variant)}
        # paired changes (metric, against): against the main variant's MC, or against the cell's own baseline
        paired = (("mu", "main"), ("attack", "main"), ("attack", "baseline"))
        names = {"main": f"`{self.main_variant}`", "baseline": "baseline"}
        header = [
            "Variant",
            "crossed / n",
            *[c[0] for c in cols.values()],
            *[f"{cols[k][0]} − {names[a]}" for k, a in paired],
        ]

        def change(rec: dict, get: Callable[[dict], float | None], against: str) -> float | None:
            key = (rec["cell"]["method"], rec["cell"]["seed"])
            ref = main.get(key) if against == "main" else rec["models"]["baseline"]
            v, r = get(rec["models"]["mc"]), ref and get(ref)
            return None if v is None or r is None else v - r

        rows, csv_rows = [], []
        for variant in self.variants:
            recs = self.cells(variant)
            mc = [r["models"]["mc"] for r in recs]
            means = {k: _mean([c[1](m) for m in mc]) for k, c in cols.items()}
            crossed = sum(d is not None and d <= 0 for d in (cols["delta"][1](m) for m in mc))
            changes = [change_over_seeds(recs, lambda r, get=cols[k][1], a=a: change(r, get, a))[0] for k, a in paired]
            rows.append(
                [
                    f"`{variant}`",
                    f"{crossed}/{len(recs)}",
                    *[_fmt(means[k], c[3]) for k, c in cols.items()],
                    *[
                        "—" if variant == self.main_variant and a == "main" else c.format(_signed(cols[k][3]))
                        for (k, a), c in zip(paired, changes, strict=True)
                    ],
                ]
            )
            csv_rows.append(
                [
                    variant,
                    crossed,
                    len(recs),
                    *means.values(),
                    *[x for c in changes for x in (c.mean, c.low, c.high)],
                    ";".join(_src(r) for r in recs),
                ]
            )
        self.parts += [
            "## T3 ablation matrix (MC variants, mean over bases and seeds)",
            "",
            markdown_table(header, rows),
            "",
            "crossed: MC checkpoints with Δ ≤ 0. F-ROUGE is the unattacked forget ROUGE-L. The last columns "
            f"are paired changes of the variant's MC, against `{self.main_variant}` MC or against the "
            "baseline of the same base and seed, averaged over the bases per seed, with the 95 % Student-t "
            "interval over seeds.",
            "",
        ]
        self.csvs["t3.csv"] = _csv(
            [
                "variant",
                "crossed",
                "n",
                *cols,
                *[f"{k}_vs_{a}{x}" for k, a in paired for x in ("", "_low", "_high")],
                "sources",
            ],
            csv_rows,
        )

    def fronts(self) -> None:
        """Per base, the polish configurations (and the unpolished baseline) in the planes (MU, K20) and (MIA
        advantage, K20): seed means with Student-t intervals, the Pareto front of the fixed configurations
        (:mod:`margincal.reporting.fronts`) and where ``controlled`` lies against it; ``pareto.json`` holds every
        (base, configuration, seed) row."""
        if len(self.variants) < 2 or not self.headline:
            return
        lab = self.headline[0]
        rows = [pareto_row(r, "baseline", lab) for r in self.cells(self.main_variant)]
        rows += [pareto_row(r, "mc", lab) for r in self.done]
        atomic_write_text(self.out / "pareto.json", json_text(rows))
        self.written.append("pareto.json")
        planes = {"MU": ("mu", -1.0), "MIA adv": ("mia_advantage", 1.0)}  # (key, sign making it a cost)
        self.parts += [
            "## Pareto fronts of the polish configurations (per base)",
            "",
            f"Seed means with 95 % Student-t intervals over seeds; K20 is {attack_column(lab)} held-out "
            "ROUGE-L. `front`: the configurations no other fixed one beats on both axes of that plane "
            "(higher MU, lower MIA advantage, lower K20); `baseline` (no polish) counts as a fixed "
            "configuration. `controlled` is placed against that front: below (some fixed configuration "
            "is at least as good on both axes and better on one), above (it beats a front point) or on.",
            "",
        ]
        placements, paired = [], []
        for base in dict.fromkeys(r["base"] for r in rows):
            mine = [r for r in rows if r["base"] == base]
            configs = list(dict.fromkeys(r["configuration"] for r in mine))
            stats = {
                c: {
                    k: mean_interval([r[k] for r in mine if r["configuration"] == c])
                    for k in ("mu", "k20_rouge_l", "mia_advantage", "privleak", "delta", "steps_run")
                }
                for c in configs
            }
            marks = {}
            for plane, (key, sign) in planes.items():
                points = {
                    c: (sign * stats[c][key].mean, stats[c]["k20_rouge_l"].mean)
                    for c in configs
                    if stats[c][key].n and stats[c]["k20_rouge_l"].n
                }
                fixed = {c: pt for c, pt in points.items() if c != "controlled"}
                marks[plane] = set(fronts.front(fixed))
                if "controlled" in points:
                    by_seed = seed_table(
                        mine,
                        lambda r, k=key, s=sign: (
                            None if r[k] is None or r["k20_rouge_l"] is None else (s * r[k], r["k20_rouge_l"])
                        ),
                    )
                    per_seed = fronts.seed_placements(by_seed, "controlled").most_common()
                    beaten_by = fronts.dominators(points["controlled"], fixed)
                    placements.append(
                        [
                            base,
                            plane,
                            fronts.placement(points["controlled"], fixed),
                            ", ".join(f"{k} {v}/{sum(n for _, n in per_seed)}" for k, v in per_seed),
                            ", ".join(f"`{c}`" for c in beaten_by),
                        ]
                    )
            if {"controlled", "reference"} <= set(configs):
                paired.append(
                    [
                        base,
                        *[
                            paired_change(mine, "controlled", "reference", k).format("+.3f")
                            for k in PAIRED_KEYS.values()
                        ],
                    ]
                )
            table = [
                [
                    f"`{c}`",
                    *[stats[c][k].format(".3f") for k in ("mu", "k20_rouge_l", "mia_advantage")],
                    stats[c]["privleak"].format(".1f"),
                    stats[c]["delta"].format("+.2f"),
                    stats[c]["steps_run"].format(".0f"),
                    *["front" if c in marks[p] else "" for p in planes],
                ]
                for c in configs
            ]
            header = [
                "configuration",
                "MU",
                "K20",
                "MIA adv",
                "privleak",
                "Δ",
                "steps",
                *[f"{p} plane" for p in planes],
            ]
            self.parts += [f"### {base}", "", markdown_table(header, table), ""]
        if placements:
            self.parts += [
                "### Controlled MC against the fronts",
                "",
                "`controlled is`: placed on the seed means; `per seed`: placed in each seed against that "
                "seed's fixed configurations (the count of seeds per outcome); `dominated by`: the fixed "
                "configurations whose seed means are at least as good on both axes and better on one.",
                "",
                markdown_table(["base", "plane", "controlled is", "per seed", "dominated by"], placements),
                "",
            ]
        if paired:
            self.parts += [
                "### Controlled − reference MC, paired by seed",
                "",
                "Per base, the seed mean of (controlled − reference) with its 95 % Student-t interval over "
                "seeds (MU ↑, K20 ↓, MIA advantage ↓).",
                "",
                markdown_table(["base", *PAIRED_KEYS], paired),
                "",
            ]
        self.figure(
            "fronts.png",
            figures.fronts(rows, self.out / "fronts.png"),
            "Per base: every configuration's seed mean in the (MU, K20) and (MIA advantage, K20) planes; "
            "controlled MC as a star, the unpolished baseline as a circle.",
        )

    def k_sweep(self) -> None:
        """Per attacker preset run at several budgets K: per method the held-out ROUGE-L, baseline → MC, as means over
        seeds; θ0 (ceiling) and θ_ref (floor); the MC − baseline change averaged over methods per seed with its
        t-interval over seeds; and the K-curve figure."""
        presets = defaultdict(list)
        for lab in self.labels:
            presets[lab.rsplit("@", 1)[0]].append(lab)
        recs = self.cells(self.main_variant)
        by_method = defaultdict(dict)
        for rec in recs:
            by_method[rec["cell"]["method"]][rec["cell"]["seed"]] = rec
        per_seed = {rec["cell"]["seed"]: rec for rec in recs}  # θ0 and θ_ref are attacked once per seed

        def rouge(runs: list[dict], role: str, lab: str) -> float | None:
            return _mean([r["models"][role]["attacks"][lab]["rouge_l"] for r in runs])

        for preset, labs in presets.items():
            if len(labs) < 2:
                continue
            labs = sorted(labs, key=lambda lab: int(lab.rsplit("@", 1)[1]))  # columns in budget order
            header = ["Method", "seeds", *[attack_column(lab) for lab in labs]]
            rows = [
                [
                    method,
                    str(len(runs)),
                    *[
                        arrow(rouge(list(runs.values()), "baseline", lab), rouge(list(runs.values()), "mc", lab), True)
                        for lab in labs
                    ],
                ]
                for method, runs in by_method.items()
            ]
            for role, name in (("theta0", "θ0 (ceiling)"), ("reference", "θ_ref (floor)")):
                rows.append(
                    [
                        name,
                        str(len(per_seed)),
                        *[_fmt(rouge(list(per_seed.values()), role, lab), ".3f") for lab in labs],
                    ]
                )
            changes = [
                change_over_seeds(
                    recs,
                    lambda r, lab=lab: (
                        r["models"]["mc"]["attacks"][lab]["rouge_l"]
                        - r["models"]["baseline"]["attacks"][lab]["rouge_l"]
                    ),
                )
                for lab in labs
            ]
            rows.append(
                [
                    "**MC − baseline, mean over methods**",
                    f"{len(per_seed)} × {changes[0][1]}",
                    *[c.format("+.3f") for c, _ in changes],
                ]
            )
            name = ATTACKER_NAMES.get(preset, preset)
            self.parts += [
                f"## K-sweep: {name} (held-out {self.score}, baseline → MC, ↓)",
                "",
                markdown_table(header, rows),
                "",
                "Method rows: means over the seeds each method ran. The last row is the paired change "
                "averaged over the methods run at every seed, per seed, with its 95 % Student-t interval "
                "over seeds.",
                "",
            ]
            self.csvs[f"ksweep_{preset}.csv"] = _csv(
                ["method", "seed", "attack", "baseline", "mc", "source"],
                [
                    [
                        r["cell"]["method"],
                        r["cell"]["seed"],
                        lab,
                        r["models"]["baseline"]["attacks"][lab]["rouge_l"],
                        r["models"]["mc"]["attacks"][lab]["rouge_l"],
                        _src(r),
                    ]
                    for r in recs
                    for lab in labs
                ],
            )
            self.figure(
                f"kcurve_{preset}.png",
                figures.k_curve(recs, labs, inside(self.out, f"kcurve_{preset}.png"), self.score),
                f"K-curve ({name}): held-out {self.score} vs K; thin lines per (method, seed), thick lines the "
                "mean; red dashed θ0, dotted θ_ref (first seed).",
            )

    def mia(self) -> None:
        recs = self.cells(self.main_variant)
        present = {d: a for d, a in T.MIA_AUC.items() if a.name in recs[0]["models"]["mc"]["summary"]}
        if not present:
            return
        adv = T.ADVANTAGE
        header = ["Method", *[a.display for a in present.values()], adv.display]
        rows, csv_rows = [], []
        for rec in recs:
            b, m = rec["models"]["baseline"]["summary"], rec["models"]["mc"]["summary"]
            cells = [arrow(b[a.name], m[a.name], a.lower_is_better, a.fmt) for a in present.values()]
            adv_s = arrow(b[adv.name], m[adv.name], adv.lower_is_better, adv.fmt) if adv.name in m else "—"
            rows.append([f"{rec['cell']['method']} (s{rec['cell']['seed']})", *cells, adv_s])
            csv_rows.append(
                [
                    rec["cell"]["method"],
                    rec["cell"]["seed"],
                    *[v for a in present.values() for v in (b[a.name], m[a.name])],
                    b.get(adv.name),
                    m.get(adv.name),
                    _src(rec),
                ]
            )
        self.parts += [
            "## Membership inference per detector (raw AUC, baseline → MC, ↓)",
            "",
            markdown_table(header, rows),
            "",
            "Members = forget, non-members = holdout; advantage = mean over detectors of |AUC − 0.5| "
            "(an AUC far below 0.5 is an overshoot past chance, not privacy).",
            "",
        ]
        head = [
            "method",
            "seed",
            *[f"{d}_{s}" for d in present for s in ("baseline", "mc")],
            *[f"{adv.display}_{s}" for s in ("baseline", "mc")],
            "source",
        ]
        self.csvs["mia.csv"] = _csv(head, csv_rows)

    # ------------------------------------------------------------------------------------------ figures
    def figure(self, name: str, path: Path | None, caption: str) -> None:
        if path is not None:
            self.written.append(name)
            self.parts += [f"![{Path(name).stem}]({name})", "", f"*{caption}*", ""]

    def cliff_and_pareto(self) -> None:
        recs = self.cells(self.main_variant, min(r["cell"]["seed"] for r in self.done))
        self.parts += ["## Figures", ""]
        self.figure(
            "cliff.png",
            figures.panel_cliff(recs, self.out / "cliff.png"),
            "Margin cliff: forget-set margin diagnostic m(D_f) per method, baseline (gray circles) and MC "
            "(blue triangles), against m_ref (red dashed); shaded: the baseline cliff gap; MU annotated.",
        )
        if (lab := self.headline[0] if self.headline else None) is None:
            return
        self.figure(
            "pareto.png",
            figures.pareto(recs, lab, self.out / "pareto.png", self.score),
            f"Movement from baseline (circles) to MC (triangles) in the plane of {attack_column(lab)} "
            "ROUGE-L vs model utility, colored by loss family; θ_ref and θ0 marked.",
        )
        # Seeds of one (method, checkpoint) are not independent points: average them, so that n counts points.
        runs = defaultdict(list)
        for rec in self.cells(self.main_variant):
            for role in ("baseline", "mc"):
                model = rec["models"][role]
                delta = T.read("delta", model["summary"])
                if delta is not None:
                    runs[rec["cell"]["method"], role, rec["family"]].append(
                        (delta, model["attacks"][lab][T.FORGET_ROUGE.split_key])
                    )
        rows = [
            [method, role, family, len(v), _mean([d for d, _ in v]), _mean([r for _, r in v])]
            for (method, role, family), v in runs.items()
        ]
        points = [(d, r, role, family) for _, role, family, _, d, r in rows]
        x, y = [p[0] for p in points], [p[1] for p in points]
        pearson, spearman = correlation(x, y, "pearson"), correlation(x, y, "spearman")
        n_seeds = len({r["cell"]["seed"] for r in self.cells(self.main_variant)})
        self.figure(
            "bridge.png",
            figures.bridge(points, pearson, spearman, self.out / "bridge.png", self.score),
            f"Bridge: cliff gap Δ vs {attack_column(lab)} held-out {self.score} per (method, checkpoint) point"
            + (f", each the mean over the seeds it ran (of {n_seeds})" if n_seeds > 1 else "")
            + f". {pearson}; {spearman} (95 % percentile bootstrap CIs of 2000 paired resamples of the points; "
            f"none below n = {MIN_BOOTSTRAP_N}).",
        )
        self.csvs["bridge.csv"] = _csv(["method", "checkpoint", "family", "seeds", "delta", "rouge_l"], rows)

    def examples(self, limit: int = 4) -> None:
        """Held-out forget questions with each model's greedy answer before and after the first attack (the first
        ``limit`` cells of the main variant and seed; older records without examples are skipped)."""
        recs = [r for r in self.cells(self.main_variant) if r.get("examples")][:limit]
        if not recs:
            return
        self.parts += [
            "## Example generations",
            "",
            "Held-out forget questions (never in the attacker's D_rel): each model's greedy answer, and its "
            "answer after the attack named in the last column.",
            "",
        ]
        for rec in recs:
            cell = rec["cell"]
            for ex in rec["examples"][:2]:
                self.parts += [
                    f"**{cell['method']} (seed {cell['seed']}, {cell['variant']})**: "
                    f"{ex['question']}  gold: *{ex['gold']}*",
                    "",
                ]
                rows = [
                    [ROLE_NAMES.get(role, role), a["before"] or "(empty)", a["attacked"] or "(empty)"]
                    for role, a in ex["answers"].items()
                ]
                rows = [[c.replace("|", "/") for c in row] for row in rows]
                self.parts += [markdown_table(["model", "answer", f"after {ex['attack']}"], rows), ""]

    def cost(self) -> None:
        """Per method and MC variant, the mean over its cells of what each cell's own stages cost (cells whose
        record has a cost: those run since costs were recorded)."""
        groups: dict[tuple[str, str], list[dict]] = {}
        for rec in self.done:
            if rec.get("cost") and rec["cost"]["by_kind"]:
                groups.setdefault((rec["cell"]["method"], rec["cell"]["variant"]), []).append(rec["cost"])
        if not groups:
            return
        kinds = ("unlearn", "polish", "attack", "evaluate")
        rows = []
        for (method, variant), costs in sorted(groups.items()):
            means = [_mean([c["by_kind"].get(kind) for c in costs]) for kind in kinds]
            speed = _mean([c["unlearn_tokens_per_s"] for c in costs])
            peak = max((c["peak_memory_gib"] for c in costs if c["peak_memory_gib"] is not None), default=None)
            devices = sorted({d for c in costs for d in c["devices"]})
            total = _mean([c["seconds"] for c in costs])
            seconds = [_fmt(m, ".1f") for m in [*means, total]]
            rows.append(
                [
                    method,
                    variant,
                    str(len(costs)),
                    *seconds,
                    _fmt(speed, ",.0f"),
                    _fmt(peak, ".2f"),
                    " / ".join(devices),
                ]
            )
        header = ["method", "MC variant", "cells", *(f"{k} (s)" for k in kinds), "total (s)"]
        header += ["unlearn tokens/s", "peak memory (GiB)", "device"]
        self.parts += [
            "## Cost per cell (mean over a method's cells)",
            "",
            "Wall seconds of the cell's own stages when they ran (unlearning, the MC polish, and the evaluations and "
            "attacks of the baseline and the MC model; θ_ref's and θ0's, shared by every cell, are left out), the "
            "unlearning's tokens per second, the largest peak memory (GPU allocated, or the process's peak RSS) and "
            "the device. A stage read from the store keeps the cost of the run that computed it.",
            "",
            markdown_table(header, rows),
            "",
        ]
        self.csvs["cost.csv"] = _csv(header, rows)

    # ------------------------------------------------------------------------------------------ assembly
    def write(self) -> list[str]:
        """Write the report's files into ``out``; returns their names."""
        meta = self.meta
        man = meta.get("manifest", {})
        name = meta.get("name", self.results.name)
        self.parts = [
            f"# margincal panel report: {name}",
            "",
            f"{len(self.done)} cells done, {len(self.failed)} failed"
            + (f"; panel run {meta['seconds']:.0f} s" if "seconds" in meta else "")
            + (f", git `{man.get('git_commit', '?')[:12]}`, created {man.get('created', '?')}" if man else "")
            + ". Every number is read from the cell record named in its row (`cells/<id>.json`); each record lists "
            "the store directory of every stage it came from (`sources`), whose `stage.json` holds the stage's "
            "config and manifest.",
            "",
        ]
        self.t1()
        self.t2()
        self.seeds()
        self.t3()
        self.fronts()
        self.k_sweep()
        self.mia()
        self.cliff_and_pareto()
        self.examples()
        self.cost()
        if self.failed:
            rows = [[r["id"], r.get("error", "?").replace("|", "/")[:200]] for r in self.failed]
            self.parts += ["## Failed cells", "", markdown_table(["cell", "error"], rows), ""]
        if self.bad:
            rows = [[f"cells/{name}", why.replace("|", "/")[:200]] for name, why in self.bad]
            self.parts += [
                "## Records not read",
                "",
                "Not of the cell-record schema; no number above comes from them.",
                "",
                markdown_table(["record", "why"], rows),
                "",
            ]
        for fname, text in self.csvs.items():
            atomic_write_text(inside(self.out, fname), text)
        if self.copy_cells:  # keep the sources next to the report
            cells = self.out / "cells"
            cells.mkdir(exist_ok=True)
            for rec in self.done + self.failed:
                shutil.copy2(self.results / "cells" / f"{rec['id']}.json", cells / f"{rec['id']}.json")
            self.written.append("cells")
        atomic_write_text(self.out / "report.md", "\n".join(self.parts) + "\n")
        return ["report.md", *self.csvs, *self.written]


def _panel_meta(path: Path) -> dict:
    """The panel's ``panel.json`` (name, run time, manifest) when it is a readable mapping, else nothing: the
    report's header is then shorter, its numbers the same."""
    try:
        meta = read_json(path)  # bounded and strict, as every file margincal reads
    except (OSError, ValueError):
        return {}
    ok = isinstance(meta, dict) and isinstance(meta.get("manifest", {}), dict)
    return meta if ok and isinstance(meta.get("manifest", {}).get("config", {}), dict) else {}


def _file_part(name: str) -> str:
    """An axis name as part of a file name: a YAML path's stem, other characters than letters, digits, ``.``,
    ``_`` and ``-`` as ``-`` (a benchmark or model family given as a path names no directory)."""
    stem = Path(name).stem if name.endswith((".yaml", ".yml")) else name
    return re.sub(r"[^\w.-]+", "-", stem)


def pareto_row(rec: dict, role: str, label: str) -> dict:
    """One row of ``pareto.json``: a cell's ``baseline`` (configuration ``baseline``) or ``mc`` (configuration = the
    cell's variant) with MU, the ``label`` attack's held-out ROUGE-L and fact recall, MIA advantage, privleak, Δ and
    the optimizer steps behind the released checkpoint (a monitored polish: the step it selected)."""
    model, summary = rec["models"][role], rec["models"][role]["summary"]
    attack = model["attacks"].get(label, {})
    if role == "baseline":  # records written before a field existed lack it: the row says null
        configuration, steps = "baseline", rec["unlearn"].get("steps_run")
    else:
        info = rec["polish"]
        configuration, steps = (
            rec["cell"]["variant"],
            info["selected"] if info.get("selected") is not None else info.get("steps"),
        )
    return {
        "base": rec["cell"]["method"],
        "configuration": configuration,
        "seed": rec["cell"]["seed"],
        "mu": summary.get(T.MODEL_UTILITY.name),
        "k20_rouge_l": attack.get("rouge_l"),
        "k20_fact_recall": attack.get("fact_recall"),
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


def change_over_seeds(recs: list[dict], change: Callable[[dict], float | None]) -> tuple[MeanInterval, int]:
    """A paired change per cell record, averaged over methods within each seed, then x̄ ± t·s/√n over seeds (methods
    are fixed, seeds random). Only methods run at every seed enter. Returns the interval and their count."""
    runs = defaultdict(dict)
    for rec in recs:
        runs[rec["cell"]["method"]][rec["cell"]["seed"]] = change(rec)
    seeds = sorted({rec["cell"]["seed"] for rec in recs})
    full = [m for m, by_seed in runs.items() if sorted(by_seed) == seeds]
    return mean_interval([_mean([runs[m][s] for m in full]) for s in seeds]), len(full)


def write_report(results: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a panel results directory into ``out`` (default: the results directory), a directory
    that is new, empty or margincal's alone (:func:`~margincal.artifacts.check_owned_dir`); returns the path of
    ``report.md``. The files are made in a temporary sibling and moved in when all of them are made, so a failure
    leaves ``out`` as it was."""
    results = check_results(results, "RESULTS")  # before anything is made
    hint = "choose a new or empty directory" if out else "write the report elsewhere with --out DIR"
    out = check_owned_dir(out or results, "--out" if out else "RESULTS", hint)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.report-", dir=out.parent))
    try:
        names = Report(results, stage, copy_cells=out.resolve() != results.resolve()).write()
        out.mkdir(exist_ok=True)
        own(out, names)  # first: a move that fails half-way leaves files a rerun may replace
        for name in names:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
            os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out / "report.md"
