"""Time the mini demo: a cold run (empty store, builds θ0/θ_ref) and a warm rerun (stored models).

    .venv/bin/python benchmarks/demo_time.py [key=value ...]    # demo panel overrides, e.g. seeds=[1] mc.kappa=2

Runs ``margincal demo`` (the shipped panel ``configs/panels/demo.yaml`` and its report) twice in a temporary
directory, each in a fresh process (as a user runs it: nothing cached in memory) with its own store; the warm run's
store starts with a copy of the mini model stages the cold run built (so it recomputes every pipeline stage but not
the models). Prints wall seconds for both runs (process start-up included) and the warm run's seconds per stage
(summed over its store entries). Bars (issue #2): cold ≤ 10 min on a 2-core CPU
(aim 5), warm ≤ 2 min.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from margincal.mini.models import STAGES

CLI = "import sys; from margincal.cli import main; sys.exit(main(sys.argv[1:]))"  # the margincal command


def main(overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for label in ("cold", "warm"):
            if label == "warm":
                for stage in STAGES:
                    shutil.copytree(Path(tmp, "cold-store", stage), Path(tmp, "warm-store", stage))
            argv = ["demo", *overrides, f"out={tmp}/{label}", f"store={tmp}/{label}-store"]
            start = time.perf_counter()
            if subprocess.run([sys.executable, "-c", CLI, *argv]).returncode != 0:
                raise SystemExit(f"margincal {' '.join(argv)} failed")
            rows.append((label, time.perf_counter() - start))
        timings: Counter[str] = Counter()
        for meta in Path(tmp, "warm-store").glob("*/*/stage.json"):
            info = json.loads(meta.read_text())
            if info["stage"] not in STAGES:
                timings[info["stage"]] += info["seconds"]
        for label, seconds in rows:
            print(f"{label:>5} run: {seconds:7.1f} s")
        print("warm-run stages:", ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
