"""How the CLI shows what the library returns when it is more than a line or two: the methods table
(``margincal methods``) and a panel's plan (``margincal panel --dry-run``)."""

from __future__ import annotations

from margincal.config.settings import FAMILIES, resolve_method
from margincal.methods import METHODS, get_method
from margincal.pipeline.executors import dry_run
from margincal.pipeline.panel import PanelConfig

PAPER_FORGET = 400  # |D_f| of TOFU forget10: the size `margincal methods` shows the paper schedules at


def methods_table() -> str:
    """Every registered method with its family, source, hyperparameters and its schedules at paper scale (TOFU
    forget10) and at mini scale."""
    runs = {key: {s: resolve_method(key, s, n_forget=PAPER_FORGET) for s in ("paper", "mini")} for key in METHODS}
    hparams = {key: get_method(run["paper"].name, **run["paper"].hparams).hparams() for key, run in runs.items()}
    ordered = sorted(METHODS, key=lambda k: (FAMILIES.index(get_method(k).family), k))
    lines = [
        f"{len(METHODS)} methods (configs/methods/<name>.yaml; `margincal unlearn --method NAME`); schedules at",
        f"paper scale for TOFU forget10 (|D_f| = {PAPER_FORGET}), and at mini scale\n",
    ]
    for key in ordered:
        cls, paper, mini = METHODS[key], runs[key]["paper"], runs[key]["mini"]
        shown_hp = ", ".join(f"{k}={v}" for k, v in hparams[key].items())
        mini_hp = "".join(f", {k}={v}" for k, v in mini.hparams.items() if paper.hparams.get(k) != v)
        p, m = paper.train, mini.train
        lines += [
            f"{cls.name:<11} {get_method(key).family:<13} {cls.source}",
            f"{'':<11} hparams: {shown_hp}",
            f"{'':<11} paper: lr {p.lr:g}, {p.steps} steps, batch {p.batch_size}×{p.grad_accum};  "
            f"mini: lr {m.lr:g}, {m.steps} steps, batch {m.batch_size}{mini_hp}",
        ]
    return "\n".join(lines)


def dry_run_table(cfg: PanelConfig) -> str:
    """A panel's cells, how many of each cell's stages the store holds and every training stage's schedule."""
    rows = dry_run(cfg)
    lines = [f"panel {cfg.name}: {len(rows)} cells; store {cfg.store_dir}; out {cfg.out_dir}"]
    if rows:
        lines.append(f"models: {rows[0]['models']}")
    for row in rows:
        missing = [label for label, done in row["stages"].items() if not done]
        cached = len(row["stages"]) - len(missing)
        todo = f"to run: {', '.join(missing)}" if missing else "all cached"
        plan = row["plan"]
        size = f" (|D_f| = {plan.n_forget})" if plan.n_forget is not None else ""
        lines.append(f"  {row['id']}{size}: {cached}/{len(row['stages'])} stages cached; {todo}")
        shown = set()  # an attacker's schedule is the same on every model: one line each
        for node in plan.graph.nodes:
            what = node.label.split("/", 1)[1] if node.kind == "attack" else node.label
            if node.kind != "evaluate" and what not in shown:
                shown.add(what)
                lines.append(f"      {what:<24} {node.schedule()}")
    return "\n".join(lines)
