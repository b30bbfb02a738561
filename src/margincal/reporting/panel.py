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

import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

from margincal.core.artifacts import atomic_write_text, check_owned_dir, inside, own
from margincal.core.errors import InputError
from margincal.core.inputs import read_json
from margincal.reporting import figures
from margincal.reporting.panel_tables import PanelTables
from margincal.reporting.records import CellCost, DoneRecord, check_results
from margincal.reporting.rows import ROLE_NAMES, _csv, _fmt, _mean, attack_column, load_cells, log
from margincal.reporting.tables import markdown_table
from margincal.results import metric_table as T
from margincal.results.stats import MIN_BOOTSTRAP_N, correlation


class Report(PanelTables):
    def __init__(self, results: Path, out: Path, copy_cells: bool = False):
        self.results, self.out, self.copy_cells = results, out, copy_cells
        self.done, self.failed, self.bad = load_cells(results)
        for name, why in self.bad:
            log.warning("skipped cells/%s (listed in report.md): %s", name, why)
        if not self.done:
            first = f" (first: cells/{self.bad[0][0]}: {self.bad[0][1]})" if self.bad else ""
            why = f"no record is of the cell-record schema{first}" if self.bad else "every cell failed"
            raise InputError(f"{results / 'cells'}: {why}; nothing to report")
        self.labels = list(dict.fromkeys(lab for r in self.done for lab in r.models["mc"].attacks))
        self.meta = _panel_meta(results / "panel.json")
        config = self.meta.get("manifest", {}).get("config", {})
        listed = [v if isinstance(v, str) else v.get("name") for v in config.get("variants", [])]
        found = dict.fromkeys(r.cell.variant for r in self.done)
        self.variants = [v for v in listed if v in found] + [v for v in found if v not in listed]  # panel order
        self.main_variant = "reference" if "reference" in self.variants else self.variants[0]
        self.headline = [lab for lab in self.labels if lab.endswith("@20")] or self.labels[:2]
        self.facts = any(a.fact_recall is not None for r in self.done for a in r.models["baseline"].attacks.values())
        # what the attacks' held-out score is: ROUGE-L, or accuracy where every cell is a multiple-choice benchmark
        wmdp = all(T.METRICS["forget_wmdp_acc"].name in r.models["baseline"].summary for r in self.done)
        self.score = "accuracy" if self.done and wmdp else "ROUGE-L"
        self.parts: list[str] = []
        self.csvs: dict[str, str] = {}
        self.written: list[str] = []  # figure files, for the output directory's marker

    def cells(self, variant: str | None = None, seed: int | None = None) -> list[DoneRecord]:
        """The done records of MC variant ``variant`` and seed ``seed`` (None: any), in the report's row order."""
        return [
            r
            for r in self.done
            if (variant is None or r.cell.variant == variant) and (seed is None or r.cell.seed == seed)
        ]

    # ------------------------------------------------------------------------------------------ figures
    def figure(self, name: str, path: Path | None, caption: str) -> None:
        if path is not None:
            self.written.append(name)
            self.parts += [f"![{Path(name).stem}]({name})", "", f"*{caption}*", ""]

    def cliff_and_pareto(self) -> None:
        recs = self.cells(self.main_variant, min(r.cell.seed for r in self.done))
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
                model = rec.models[role]
                delta = T.read("delta", model.summary)
                if delta is not None:
                    runs[rec.cell.method, role, rec.family].append((delta, model.attacks[lab].rouge_l))
        rows = [
            [method, role, family, len(v), _mean([d for d, _ in v]), _mean([r for _, r in v])]
            for (method, role, family), v in runs.items()
        ]
        points = [(d, r, role, family) for _, role, family, _, d, r in rows]
        x, y = [p[0] for p in points], [p[1] for p in points]
        pearson, spearman = correlation(x, y, "pearson"), correlation(x, y, "spearman")
        n_seeds = len({r.cell.seed for r in self.cells(self.main_variant)})
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
        recs = [r for r in self.cells(self.main_variant) if r.examples][:limit]
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
            cell = rec.cell
            for ex in rec.examples[:2]:
                self.parts += [
                    f"**{cell.method} (seed {cell.seed}, {cell.variant})**: {ex.question}  gold: *{ex.gold}*",
                    "",
                ]
                rows = [
                    [ROLE_NAMES.get(role, role), a.before or "(empty)", a.attacked or "(empty)"]
                    for role, a in ex.answers.items()
                ]
                rows = [[c.replace("|", "/") for c in row] for row in rows]
                self.parts += [markdown_table(["model", "answer", f"after {ex.attack}"], rows), ""]

    def cost(self) -> None:
        """Per method and MC variant, the mean over its cells of what each cell's own stages cost (cells whose
        record has a cost: those run since costs were recorded)."""
        groups: dict[tuple[str, str], list[CellCost]] = {}
        for rec in self.done:
            if rec.cost is not None and rec.cost.by_kind:
                groups.setdefault((rec.cell.method, rec.cell.variant), []).append(rec.cost)
        if not groups:
            return
        kinds = ("unlearn", "polish", "attack", "evaluate")
        rows = []
        for (method, variant), costs in sorted(groups.items()):
            means = [_mean([c.by_kind.get(kind) for c in costs]) for kind in kinds]
            speed = _mean([c.unlearn_tokens_per_s for c in costs])
            peak = max((c.peak_memory_gib for c in costs if c.peak_memory_gib is not None), default=None)
            devices = sorted({d for c in costs for d in c.devices})
            total = _mean([c.seconds for c in costs])
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
        self.head_to_head()
        self.robustness_matrix()
        self.seed_changes()
        self.ablations()
        self.pareto_fronts()
        self.k_sweep()
        self.membership()
        self.cliff_and_pareto()
        self.examples()
        self.cost()
        if self.failed:
            rows = [[r.id, r.error.replace("|", "/")[:200]] for r in self.failed]
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
                shutil.copy2(self.results / "cells" / f"{rec.id}.json", cells / f"{rec.id}.json")
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


def write_report(results: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a panel results directory into ``out`` (default: the results directory), a directory
    that is new, empty or margincal's alone (:func:`~margincal.core.artifacts.check_owned_dir`); returns the path of
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
