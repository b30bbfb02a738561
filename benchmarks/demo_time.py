"""Time the mini demo: a cold run (empty model cache, builds θ0/θ_ref) and a warm rerun (cached models).

    .venv/bin/python benchmarks/demo_time.py [key=value ...]

Prints wall seconds for both runs and the per-stage timings the demo records. Bars (issue #2): cold ≤ 10 min
on a 2-core CPU (aim 5), warm ≤ 2 min.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from margincal.cli import _quiet_libraries, load_demo_config
from margincal.pipeline.demo import run_demo


def main(overrides: list[str]) -> None:
    _quiet_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for label in ("cold", "warm"):
            cfg = load_demo_config(None, [*overrides, f"cache_dir={tmp}/cache", f"out_dir={tmp}/{label}"])
            start = time.perf_counter()
            report = run_demo(cfg)
            rows.append((label, time.perf_counter() - start))
            timings = json.loads((Path(report).parent / "results.json").read_text())["timings_s"]
        for label, seconds in rows:
            print(f"{label:>5} run: {seconds:7.1f} s")
        print("warm-run stages:", ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
