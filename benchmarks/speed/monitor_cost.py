"""What the held-out monitors cost: one baseline polished with and without them, in one process.

    .venv/bin/python benchmarks/speed/monitor_cost.py [--panel demo] [--method GradDiff] [--repeats 2] [key=value ...]

Unlearns θ0 with the panel's first cell (``unlearn_stage``), then polishes copies of it (``polish_stage``) with the
cell's MC configuration, unmonitored and monitored (``monitor`` on, nothing controlled), each ``--repeats`` times,
alternating, and prints the median wall time of each whole polish stage (the monitors' set-up, θ_ref's AUCs on
their samples, included), the monitors' seconds per signal (``seconds/*`` of the trace) and the monitored stage's
extra time as a share of it. No attack is run. ``key=value`` are panel overrides (``mc.monitor.n=32``,
``mc.monitor.every=20``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from margincal.config.settings import MonitorConfig
from margincal.core.terminal import quiet_libraries
from margincal.model.loading import clone_model
from margincal.pipeline.cell import panel_workspace
from margincal.pipeline.stages import polish_stage, reference_margin, unlearn_stage


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--panel", default="demo")
    parser.add_argument("--method", default="GradDiff")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    quiet_libraries()
    plan, ws = panel_workspace(args.panel, [f"methods=[{args.method}]", "variants=[reference]", *args.overrides])
    m_ref = reference_margin(ws, plan.eval)
    base, res = unlearn_stage(plan.method, ws, plan.cell.seed)
    monitor = plan.mc.monitor or MonitorConfig()
    configs = {
        "unmonitored": dataclasses.replace(plan.mc, monitor=None, control=None),
        "monitored": dataclasses.replace(plan.mc, monitor=monitor, control=None),
    }
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    signals: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, mc in configs.items():
            start = time.perf_counter()
            _, result = polish_stage(clone_model(base), plan.method, mc, ws, m_ref, res.method_state)
            seconds[name].append(time.perf_counter() - start)
            if result.trace:
                for key in {k for row in result.trace for k in row if k.startswith("seconds/")}:
                    total = sum(row.get(key, 0.0) for row in result.trace)
                    signals.setdefault(key.removeprefix("seconds/"), []).append(total)
    polish = {name: statistics.median(v) for name, v in seconds.items()}
    spent = {name: statistics.median(v) for name, v in signals.items()}
    print(f"{args.panel} {args.method}: MC polish of {plan.mc.train.steps} steps, monitors every {monitor.every} "
          f"steps on ≤ {monitor.n} records, median of {args.repeats}")  # fmt: skip
    for name, value in polish.items():
        print(f"  {name:<12} {value:7.2f} s")
    for name, value in spent.items():
        print(f"  monitor {name:<10} {value:6.2f} s ({value / polish['monitored']:.1%} of the monitored polish)")
    extra = polish["monitored"] - polish["unmonitored"]
    print(f"  monitored - unmonitored {extra:6.2f} s = {extra / polish['monitored']:.1%} of the monitored polish; "
          f"monitored / unmonitored = {polish['monitored'] / polish['unmonitored']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
