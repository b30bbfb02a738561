"""Time the mini demo: a cold run (an empty store: the mini models come from the shipped set, or are built where the
overrides change their settings) and a warm rerun (stored models).

    .venv/bin/python benchmarks/speed/demo_time.py [key=value ...]    # demo panel overrides, e.g. seeds=[1] mc.kappa=2

Runs ``margincal demo`` (the shipped panel ``configs/panels/demo.yaml`` and its report) twice in a temporary
directory, each in a fresh process (as a user runs it: nothing cached in memory) with its own store; the warm run's
store starts with a copy of the mini model stages the cold run stored (so it recomputes every pipeline stage but not
the models). Prints wall seconds for both runs (process start-up included) and the warm run's seconds per stage
(summed over its store entries). Bar (issue 63): cold ≤ 2 min on 2 CPU cores.
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
                    if Path(tmp, "cold-store", stage).is_dir():  # the base model only where the models were built
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
        built = Path(tmp, "cold-store", STAGES[1]).is_dir()  # the base model is trained only to build θ0 and θ_ref
        print("mini models:", "built by the cold run" if built else "copied from the shipped set")
        print("warm-run stages:", ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
