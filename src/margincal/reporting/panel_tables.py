"""The tables of a panel's report (:mod:`margincal.reporting.panel` assembles them with the figures), each a CSV
and a Markdown section read from the cell records, each a method named for what it shows: ``head_to_head`` (T1),
``robustness_matrix`` (T2, cross-axis), ``seed_changes`` (baseline → MC over seeds), ``ablations`` (T3),
``pareto_fronts``, ``k_sweep`` and ``membership`` (the MIA table); the columns they show and the paired changes over
seeds are :mod:`margincal.reporting.rows`'s."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from margincal.core.artifacts import atomic_write_text, inside, json_text
from margincal.reporting import figures, fronts
from margincal.reporting.records import DoneRecord, RoleResult
from margincal.reporting.rows import (
    ATTACKER_NAMES,
    FORGET_QUALITY,
    PAIRED_KEYS,
    Column,
    _csv,
    _file_part,
    _fmt,
    _group,
    _mean,
    _signed,
    _src,
    attack_column,
    attack_columns,
    change_over_seeds,
    column,
    metrics,
    paired_change,
    pareto_row,
    seed_table,
)
from margincal.reporting.tables import arrow, markdown_table
from margincal.results import metric_table as T
from margincal.results.stats import mean_interval, win_count

FRONT_PLANES = {"MU": ("mu", -1.0), "MIA adv": ("mia_advantage", 1.0)}  # plane → (key, sign making it a cost)


class PanelTables:
    """The tables of :class:`~margincal.reporting.panel.Report` (its cell records, output directory and sections)."""

    def head_to_head(self) -> None:
        """Head-to-head per (benchmark, model, tier) at the main variant and the smallest seed."""
        seed = min(r.cell.seed for r in self.done)
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
                b, m = rec.models["baseline"], rec.models["mc"]
                cells = []
                for _, get, lower, spec in cols:
                    vb, vm = get(b), get(m)
                    cells.append("—" if vb is None or vm is None else arrow(vb, vm, lower, spec))
                ks = T.read(FORGET_QUALITY.name, m.summary)
                ks_s = _fmt(ks, FORGET_QUALITY.fmt)
                ks_s = f"**{ks_s}**" if ks is not None and ks >= 0.05 else ks_s
                rows.append([rec.cell.method, rec.family, *cells, ks_s, f"[json]({_src(rec)})"])
                csv_rows.append(
                    [
                        rec.cell.method,
                        rec.family,
                        *[v for c in cols for v in (c[1](b), c[1](m))],
                        ks,
                        _src(rec),
                    ]
                )
            wins = [
                str(win_count([(c[1](r.models["baseline"]), c[1](r.models["mc"])) for r in recs], c[2])) for c in cols
            ]
            n_ks = sum((T.read(FORGET_QUALITY.name, r.models["mc"].summary) or 0) >= 0.05 for r in recs)
            rows.append([f"**MC wins (of {len(recs)})**", "", *wins, f"{n_ks} (KS ≥ 0.05)", ""])
            self.parts += [markdown_table(header, rows), ""]
            ref = recs[0].models
            anchors = ", ".join(
                f"{name} " + " / ".join(_fmt(c[1](ref[role]), ".3f") for c in attack_columns(lab, self.facts))
                for role, name in (("theta0", "θ0 (recovery ceiling)"), ("reference", "θ_ref"))
                for lab in self.headline[:1]
            )
            self.parts += [
                f"m_ref = {recs[0].m_ref:+.3f}. Each cell is baseline → MC; **bold** marks an MC improvement; win "
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

    def robustness_matrix(self) -> None:
        """Cross-axis matrix: per (benchmark, model, tier, variant) axis, MC wins / populated paired cells."""
        cols = metrics(self.headline, self.facts)[1:]  # all but Δ
        groups = defaultdict(list)
        for rec in self.done:
            groups[(*_group(rec), rec.cell.variant)].append(rec)
        header = ["Axis (benchmark / model / tier / variant)", "n", *[f"{c[0]} ({'↓' if c[2] else '↑'})" for c in cols]]
        rows, csv_rows = [], []
        totals = {c[0]: [] for c in cols}
        for key, recs in groups.items():
            seeds = sorted({r.cell.seed for r in recs})
            axis = " / ".join(key) + (f" ({len(seeds)} seeds)" if len(seeds) > 1 else "")
            row = [axis, str(len(recs))]
            for name, get, lower, _ in cols:
                pairs = [(get(r.models["baseline"]), get(r.models["mc"])) for r in recs]
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
                if len({r.cell.seed for r in self.done}) > 1
                else ""
            ),
            "",
        ]
        self.csvs["t2.csv"] = _csv(["axis", "metric", "wins", "n", "ci_low", "ci_high"], csv_rows)

    def seed_changes(self) -> None:
        """Per method at the main variant, over seeds: baseline and MC means and the paired MC − baseline difference
        with its 95 % Student-t interval; the last row averages the difference over the methods of each seed first,
        so its interval is over seeds too (methods are fixed, seeds random)."""
        recs = self.cells(self.main_variant)
        if len({r.cell.seed for r in recs}) < 2:
            return
        cols = [column(T.DELTA.name), column(T.MODEL_UTILITY.name)]
        cols += [c for lab in self.headline for c in attack_columns(lab, self.facts)]
        by_method = defaultdict(dict)
        for rec in recs:
            by_method[rec.cell.method][rec.cell.seed] = rec
        seeds = sorted({r.cell.seed for r in recs})

        def diff(rec: DoneRecord, get: Callable[[RoleResult], float | None]) -> float | None:
            b, m = get(rec.models["baseline"]), get(rec.models["mc"])
            return None if b is None or m is None else m - b

        header = ["Method", "seeds", *[f"{c[0]} ({'↓' if c[2] else '↑'})" for c in cols]]
        rows, csv_rows = [], []
        for method, runs in by_method.items():
            row = [method, str(len(runs))]
            for name, get, _, spec in cols:
                base = mean_interval([get(r.models["baseline"]) for r in runs.values()])
                mc = mean_interval([get(r.models["mc"]) for r in runs.values()])
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

    def ablations(self) -> None:
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
        main = {(r.cell.method, r.cell.seed): r.models["mc"] for r in self.cells(self.main_variant)}
        # paired changes (metric, against): against the main variant's MC, or against the cell's own baseline
        paired = (("mu", "main"), ("attack", "main"), ("attack", "baseline"))
        names = {"main": f"`{self.main_variant}`", "baseline": "baseline"}
        header = [
            "Variant",
            "crossed / n",
            *[c[0] for c in cols.values()],
            *[f"{cols[k][0]} − {names[a]}" for k, a in paired],
        ]

        def change(rec: DoneRecord, get: Callable[[RoleResult], float | None], against: str) -> float | None:
            key = (rec.cell.method, rec.cell.seed)
            ref = main.get(key) if against == "main" else rec.models["baseline"]
            v, r = get(rec.models["mc"]), ref and get(ref)
            return None if v is None or r is None else v - r

        rows, csv_rows = [], []
        for variant in self.variants:
            recs = self.cells(variant)
            mc = [r.models["mc"] for r in recs]
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

    def pareto_fronts(self) -> None:
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
        self.parts += [
            "## Pareto fronts of the polish configurations (per base)",
            "",
            f"Seed means with 95 % Student-t intervals over seeds (`*`: cut to the metric's range, MU and K20 in "
            f"[0, 1], MIA advantage in [0, 0.5]); K20 is {attack_column(lab)} held-out "
            "ROUGE-L. `front`: the configurations no other fixed one beats on both axes of that plane "
            "(higher MU, lower MIA advantage, lower K20); `baseline` (no polish) counts as a fixed "
            "configuration. `controlled` is placed against that front: below (some fixed configuration "
            "is at least as good on both axes and better on one), above (it beats a front point) or on.",
            "",
        ]
        placements, paired = [], []
        for base in dict.fromkeys(r["base"] for r in rows):
            mine = [r for r in rows if r["base"] == base]
            table, placed = _base_front(mine)
            placements += [[base, *p] for p in placed]
            if {"controlled", "reference"} <= {r["configuration"] for r in mine}:
                changes = [paired_change(mine, "controlled", "reference", k) for k in PAIRED_KEYS.values()]
                paired.append([base, *[c.format("+.3f") for c in changes]])
            self.parts += [f"### {base}", "", table, ""]
        self.controlled_against_fronts(placements, paired)
        self.figure(
            "fronts.png",
            figures.fronts(rows, self.out / "fronts.png"),
            "Per base: every configuration's seed mean in the (MU, K20) and (MIA advantage, K20) planes; "
            "controlled MC as a star, the unpolished baseline as a circle.",
        )

    def controlled_against_fronts(self, placements: list[list[str]], paired: list[list[str]]) -> None:
        """The fronts' closing subsections: where controlled MC lies against each base's front per plane
        (``placements``), and its paired change against reference MC per base (``paired``); each only when it has
        rows."""
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

    def k_sweep(self) -> None:
        """Per attacker preset run at several budgets K: per method the held-out ROUGE-L, baseline → MC, as means over
        seeds; θ0 (ceiling) and θ_ref (floor); the MC − baseline change averaged over methods per seed with its
        t-interval over seeds; and the K-curve figure."""
        presets = defaultdict(list)
        for lab in self.labels:
            presets[lab.rsplit("@", 1)[0]].append(lab)
        recs = self.cells(self.main_variant)
        for preset, labs in presets.items():
            if len(labs) < 2:
                continue
            labs = sorted(labs, key=lambda lab: int(lab.rsplit("@", 1)[1]))  # columns in budget order
            header = ["Method", "seeds", *[attack_column(lab) for lab in labs]]
            name = ATTACKER_NAMES.get(preset, preset)
            self.parts += [
                f"## K-sweep: {name} (held-out {self.score}, baseline → MC, ↓)",
                "",
                markdown_table(header, _k_sweep_rows(recs, labs)),
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
                        r.cell.method,
                        r.cell.seed,
                        lab,
                        r.models["baseline"].attacks[lab].rouge_l,
                        r.models["mc"].attacks[lab].rouge_l,
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

    def membership(self) -> None:
        """Membership inference per method and seed at the main variant: each detector's raw AUC and the advantage,
        baseline → MC (only when the records hold MIA metrics)."""
        recs = self.cells(self.main_variant)
        present = {d: a for d, a in T.MIA_AUC.items() if a.name in recs[0].models["mc"].summary}
        if not present:
            return
        adv = T.ADVANTAGE
        header = ["Method", *[a.display for a in present.values()], adv.display]
        rows, csv_rows = [], []
        for rec in recs:
            b, m = rec.models["baseline"].summary, rec.models["mc"].summary
            cells = [arrow(b[a.name], m[a.name], a.lower_is_better, a.fmt) for a in present.values()]
            adv_s = arrow(b[adv.name], m[adv.name], adv.lower_is_better, adv.fmt) if adv.name in m else "—"
            rows.append([f"{rec.cell.method} (s{rec.cell.seed})", *cells, adv_s])
            csv_rows.append(
                [
                    rec.cell.method,
                    rec.cell.seed,
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


RANGES = {"mu": (0.0, 1.0), "k20_rouge_l": (0.0, 1.0), "mia_advantage": (0.0, 0.5)}  # what each metric can take


def _base_front(rows: list[dict]) -> tuple[str, list[list[str]]]:
    """One base's pareto rows as its fronts table (each configuration's seed means with their intervals, and the
    planes whose front it is on), and where ``controlled`` lies against the front of each plane: one row (plane,
    placement on the seed means, placements per seed, the fixed configurations dominating it) per plane it has."""
    configs = list(dict.fromkeys(r["configuration"] for r in rows))
    stats = {
        c: {
            k: mean_interval([r[k] for r in rows if r["configuration"] == c], bounds=RANGES.get(k))
            for k in ("mu", "k20_rouge_l", "mia_advantage", "privleak", "delta", "steps_run")
        }
        for c in configs
    }
    marks, placements = {}, []
    for plane, (key, sign) in FRONT_PLANES.items():
        points = {
            c: (sign * stats[c][key].mean, stats[c]["k20_rouge_l"].mean)
            for c in configs
            if stats[c][key].n and stats[c]["k20_rouge_l"].n
        }
        fixed = {c: pt for c, pt in points.items() if c != "controlled"}
        marks[plane] = set(fronts.front(fixed))
        if "controlled" in points:
            placements.append([plane, *_placement(rows, points["controlled"], fixed, key, sign)])
    table = [
        [
            f"`{c}`",
            *[stats[c][k].format(".3f") for k in ("mu", "k20_rouge_l", "mia_advantage")],
            stats[c]["privleak"].format(".1f"),
            stats[c]["delta"].format("+.2f"),
            stats[c]["steps_run"].format(".0f"),
            *["front" if c in marks[p] else "" for p in FRONT_PLANES],
        ]
        for c in configs
    ]
    header = ["configuration", "MU", "K20", "MIA adv", "privleak", "Δ", "steps", *[f"{p} plane" for p in FRONT_PLANES]]
    return markdown_table(header, table), placements


def _placement(
    rows: list[dict], controlled: fronts.Point, fixed: dict[str, fronts.Point], key: str, sign: float
) -> list[str]:
    """Where controlled MC (its seed-mean point ``controlled``) lies against the front of the ``fixed`` points in the
    plane of ``sign`` × ``key`` and K20: on the seed means, the count of seeds per placement in each seed, and the
    fixed configurations dominating it."""
    by_seed = seed_table(
        rows,
        lambda r: None if r[key] is None or r["k20_rouge_l"] is None else (sign * r[key], r["k20_rouge_l"]),
    )
    per_seed = fronts.seed_placements(by_seed, "controlled").most_common()
    return [
        fronts.placement(controlled, fixed),
        ", ".join(f"{k} {v}/{sum(n for _, n in per_seed)}" for k, v in per_seed),
        ", ".join(f"`{c}`" for c in fronts.dominators(controlled, fixed)),
    ]


def _k_sweep_rows(recs: list[DoneRecord], labs: list[str]) -> list[list[str]]:
    """The K-sweep's rows over the attacks ``labs`` of one preset: per method the held-out ROUGE-L baseline → MC as
    means over its seeds, θ0 and θ_ref (attacked once per seed), and the MC − baseline change averaged over the
    methods per seed with its interval over seeds."""
    by_method = defaultdict(dict)
    for rec in recs:
        by_method[rec.cell.method][rec.cell.seed] = rec
    per_seed = list({rec.cell.seed: rec for rec in recs}.values())  # θ0 and θ_ref are attacked once per seed
    rows = []
    for method, by_seed in by_method.items():
        runs = list(by_seed.values())
        rows.append(
            [
                method,
                str(len(runs)),
                *[arrow(_rouge(runs, "baseline", lab), _rouge(runs, "mc", lab), True) for lab in labs],
            ]
        )
    for role, name in (("theta0", "θ0 (ceiling)"), ("reference", "θ_ref (floor)")):
        rows.append([name, str(len(per_seed)), *[_fmt(_rouge(per_seed, role, lab), ".3f") for lab in labs]])
    changes = [
        change_over_seeds(
            recs,
            lambda r, lab=lab: r.models["mc"].attacks[lab].rouge_l - r.models["baseline"].attacks[lab].rouge_l,
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
    return rows


def _rouge(runs: list[DoneRecord], role: str, lab: str) -> float | None:
    """The mean held-out ROUGE-L of model ``role`` after attack ``lab`` over the cell records ``runs``."""
    return _mean([r.models[role].attacks[lab].rouge_l for r in runs])
