"""The GPU testbed (issue 64): the plateau testbed's question asked of a 62M-parameter mini at TOFU forget10's size,
as one prepared device command, by the rules of ``results/testbed-gpu/PLAN.md`` (committed before any GPU number).

    .venv/bin/python benchmarks/gpu/prepare.py     # here, once: the wheels the machine lacks, into .gpu-carry/
    # then through the device tool, right after the acceptance run (benchmarks/gpu/run.sh):
    #   run(command="bash benchmarks/gpu/run.sh testbed", carry=[".gpu-carry"], timeout_s=540)
    python benchmarks/gpu/testbed.py --tiny --out DIR                        # the same at a tiny shape on the CPU
    python benchmarks/gpu/testbed.py --unpack OUT --to results/testbed-gpu/run1   # here: the records for a report

Two halves, each its own process under its own time limit within ``--budget`` (default 480 s):

1. ``premises`` (``benchmarks/premises.py --panel testbed-gpu``): the mini models built on the device (every
   stage fp32 with TF32 matmuls), θ0's and θ_ref's scores (P1), the 15 baselines trained to their plateau and
   scored (P2; each baseline is the panel's own unlearn stage, stored, so the second half reads it), the KL probe
   polish at λ_KL = 0 and the configured λ_KL (P3). Its ``premises.json`` is rewritten
   after every method, so a half cut short by its limit keeps what it measured.
2. ``mc`` (``margincal panel testbed-gpu methods=[...]``): for the methods :func:`mc_methods` orders from the
   premises (none when P1 fails; else by Δ at the plateau, largest first), the panel's cells: baseline, MC polish,
   K20-LoRA of each, full evaluations. Cells finish one by one; those done when the limit comes are kept.

``--half mc --premises FILE`` runs the second half alone on a bare machine (a later session, FILE carried with the
tree): it rebuilds the models and retrains each baseline it needs by the same rules, and reads FILE for the methods
and their order; ``--methods A,B`` names them instead (and says so). ``--half premises`` runs the first alone.

Writes under ``--out`` (the device tool brings back at most 8 files): ``testbed.json`` (environment, each half's
status, seconds and log tail, the rule's reading, the methods run), ``testbed.md``, ``premises.json``,
``premises.md`` (when the first half finished), ``cells.json`` (every cell record the second half finished, by id);
``run.sh`` adds ``run.log``. Checkpoints, the store and the logs stay under ``--work`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "benchmarks")]  # acceptance.py; premises.py
from acceptance import DeviceRun, run_child  # noqa: E402  (this folder's scripts, not a package)
from results_summary import MEMORISED, premise_reading  # noqa: E402  (the one reading of premises.json)

PANEL = "testbed-gpu"
BUDGET = 480  # seconds for both halves; with run.sh's install (~15 s) the command fits timeout_s=540
PREMISES_LIMIT = 320  # the first half's share when both run (PLAN.md's estimate: about 260 s on an H100)
# the same halves at a tiny shape on the CPU: a 1-layer mini of 12 authors, two methods, a few steps each
TINY = [
    "device=cpu",
    "methods=[NPO, SimNPO]",
    "mini.data={n_authors: 12, n_holdout_authors: 2, n_real_authors: 4, n_world_facts: 6, n_templates: 10, "
    "probe: authors, n_probe: 20, n_background_authors: 4}",
    "mini.arch={vocab_size: 400, hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2}",
    "mini.base={steps: 4, batch_size: 8}",
    "mini.finetune={steps: 4, batch_size: 8}",
    'method_overrides={"*": {stop: {tol: 0.05, min_epochs: 2}, train: {scheduler: constant, steps: 6}}}',
    "mc.train.steps=2",
    "attackers=[{preset: lora_r8, k: [4], set: {train.steps: 2, train.batch_size: 4}}]",
    "eval.batch_size=8",
    "eval.gradnorm=false",
]


def mc_methods(premises: dict) -> tuple[list[str], str]:
    """The second half's methods and why: none when P1 failed or was not measured; else every method the first half
    measured, by Δ at the plateau, largest first (those above the cliff lead; PLAN.md: a budget that ends early
    ends where the premise is weakest)."""
    reading = premise_reading(premises)
    if not reading["p1"]:
        return [], "P1 failed or was not measured: no MC result is read (PLAN.md)"
    methods = premises["methods"]
    order = sorted(methods, key=lambda m: -methods[m]["delta"])
    return order, f"{len(order)} methods by Δ at the plateau, largest first ({len(reading['above'])} above the cliff)"


def child(args: argparse.Namespace) -> None:
    """One half in this process (``--stage``): the premises script, or the panel through margincal's command line."""
    import torch

    torch.set_float32_matmul_precision("high")  # TF32 matmuls for the fp32 stages on a GPU (PLAN.md)
    work = Path(args.work)
    overrides = [f"store={work / 'store'}", f"out={work / 'panel'}", *(TINY if args.tiny else []), *args.overrides]
    if args.stage == "premises":
        import premises as premises_script  # benchmarks/premises.py

        premises_script.main(["--panel", PANEL, "--out", str(work / "premises"), *overrides])
        return
    from margincal.cli import main as margincal

    sys.exit(margincal(["panel", PANEL, *overrides, f"methods=[{', '.join(args.methods.split(','))}]"]))


def _half(args: argparse.Namespace, stage: str, limit: float, work: Path, extra: list[str] = ()) -> dict:
    cmd = [sys.executable, __file__, "--stage", stage, "--work", str(work), "--out", args.out, *extra]
    cmd += ["--tiny"] * args.tiny + ["--", *args.overrides]
    return run_child(cmd, limit, work / "logs" / f"{stage}.log")


def _cells(work: Path) -> dict:
    """Every finished cell record of the second half, by cell id (not a temporary file a killed write left)."""
    cells = sorted((work / "panel" / "cells").glob("*.json"))
    return {p.stem: json.loads(p.read_text()) for p in cells if not p.name.startswith(".")}


def markdown(report: dict) -> str:
    """The run's status in a few lines: each half, the premises' reading, the cells."""
    env = report["env"]
    lines = [f"# GPU testbed run: {env.get('device')}", "",
             f"torch {env.get('torch')}, transformers {env.get('transformers')}; commit {report['commit']}", "",
             "| half | status | seconds | limit |", "|---|---|---|---|"]  # fmt: skip
    for n, r in report["halves"].items():
        lines.append(f"| {n} | {r['status']} | {r['seconds']} | {'none' if r['limit'] is None else r['limit']} |")
    reading = report.get("reading")
    if reading:
        drop = "" if reading["p3_drop"] is None else f" (probe KL {reading['p3_drop']:.1%} lower)"
        lines += ["", f"P1 (θ0 memorises, forget ROUGE-L ≥ {MEMORISED}): {reading['p1']}; P3: {reading['p3']}{drop}",
                  f"P2: {len(reading['above'])} of {reading['methods']} above the cliff at their plateau "
                  f"{reading['above']}; certified {reading['certified']}; the whole row {reading['row']}; "
                  f"stopped by the cap {reading['capped']}"]  # fmt: skip
    if "mc" in report:
        lines += ["", f"Second half: {report['mc']['why']}; ran {len(report['mc']['cells'])} of "
                  f"{len(report['mc']['methods'])} cells: {', '.join(report['mc']['cells'])}"]  # fmt: skip
    return "\n".join(lines) + "\n"


UNPACKED = ("premises.json", "premises.md", "testbed.json", "testbed.md")  # copied beside the cells when present


def _run_file(run: Path, name: str) -> Path | None:
    """``run/name`` when it is a regular file there (None: absent); a link, a folder or a device stops (a link is
    never followed: its target is not what the device wrote)."""
    from margincal.core.errors import InputError
    from margincal.core.inputs import path_kind

    path = run / name
    if os.path.islink(path):
        raise InputError(f"{path} is a symbolic link: a device run's folder holds regular files only")
    kind = path_kind(path)
    if kind == "missing":
        return None
    if kind != "file":
        raise InputError(f"{path} is a {kind}, not a file: a device run's folder holds regular files only")
    return path


def unpack(run: Path, to: Path) -> None:
    """A device run's records as a panel results folder (``cells/<id>.json``, ``premises.*``) for ``margincal
    report`` here. Everything is read and checked first (each file bounded by margincal's JSON limit, links refused,
    every cell id a valid file name, so nothing lands outside ``to``), then written into a temporary folder renamed
    into place: a malformed run is one line and leaves nothing; a folder ``to`` that exists is refused."""
    from margincal.core.artifacts import check_name, publish_dir
    from margincal.core.errors import InputError
    from margincal.core.inputs import checked, read_bytes, read_json

    checked(run, "--unpack", "directory", "the --out folder of a device run")
    if os.path.lexists(to):
        raise InputError(f"--to {to} exists: give a new folder")
    found = _run_file(run, "cells.json")
    if found is None:
        raise InputError(f"{run} has no cells.json: give the --out folder of a device run")
    cells = read_json(found, "cells.json")
    if not isinstance(cells, dict) or not all(isinstance(r, dict) for r in cells.values()):
        raise InputError(f"{found} is not a device run's cells (an object of cell records by id)")
    for cell in cells:
        check_name(cell, f"{found}: cell id")
    copies = {name: read_bytes(path, name) for name in UNPACKED if (path := _run_file(run, name)) is not None}
    with publish_dir(to) as tmp:
        (tmp / "cells").mkdir()
        for cell, record in cells.items():
            (tmp / "cells" / f"{cell}.json").write_text(json.dumps(record, indent=2) + "\n")
        for name, data in copies.items():
            (tmp / name).write_bytes(data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for testbed.json/md, premises.json/md, cells.json")
    parser.add_argument("--work", help="folder for the store, the panel and logs (default: temporary, removed)")
    parser.add_argument("--half", choices=("all", "premises", "mc"), default="all", help="which halves (default all)")
    parser.add_argument("--premises", help="the first half's premises.json, for --half mc")
    parser.add_argument("--methods", help="comma-separated methods for the second half instead of the rule's")
    parser.add_argument(
        "--budget", type=float, default=BUDGET, help=f"wall seconds for both halves ({BUDGET}; 0: no limit)"
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny shape on the CPU (the suite's test)")
    parser.add_argument("--unpack", help="a device run's --out folder, written as a results folder (with --to)")
    parser.add_argument("--to", help="the results folder --unpack writes (must not exist)")
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="panel overrides (key=value) after --")
    args = parser.parse_args(argv)
    if args.unpack:
        if not args.to:
            parser.error("--unpack writes the folder --to names: give --to")
        from margincal.core.errors import InputError

        try:
            return unpack(Path(args.unpack), Path(args.to))
        except (InputError, OSError) as err:
            parser.exit(2, f"testbed.py --unpack: error: {' '.join(str(err).split())}\n")
    if args.stage:
        return child(args)
    if not args.out:
        parser.error("--out is required")
    if args.half == "mc" and not (args.premises or args.methods):
        parser.error("--half mc reads the first half's records: give --premises FILE (or --methods A,B)")
    run = DeviceRun(args, "testbed", "halves", markdown)
    out, work, report, left = run.out, run.work, run.report, run.left
    try:
        premises: dict = json.loads(Path(args.premises).read_text()) if args.premises else {}
        if args.half in ("all", "premises"):
            limit = left() if args.half == "premises" else run.limit(PREMISES_LIMIT)
            print(f"[{run.elapsed():6.1f}s] premises (at most {limit:.0f} s)", flush=True)
            report["halves"]["premises"] = _half(args, "premises", limit, work)
            for name in ("premises.json", "premises.md"):
                if (work / "premises" / name).exists():
                    shutil.copy2(work / "premises" / name, out / name)
            premises = json.loads((out / "premises.json").read_text()) if (out / "premises.json").exists() else {}
        if premises:
            report["reading"] = premise_reading(premises)
        run.save()
        if args.half in ("all", "mc"):
            methods, why = (
                (args.methods.split(","), "methods given on the command line")
                if args.methods
                else (mc_methods(premises))
            )
            report["mc"] = {"methods": methods, "why": why, "cells": []}
            if methods and left() >= 20:
                print(f"[{run.elapsed():6.1f}s] mc: {why} (at most {left():.0f} s)", flush=True)
                report["halves"]["mc"] = _half(args, "mc", left(), work, ["--methods", ",".join(methods)])
                cells = _cells(work)
                report["mc"]["cells"] = sorted(cells)
                (out / "cells.json").write_text(json.dumps(cells, indent=2, default=str) + "\n")
            elif methods:
                report["halves"]["mc"] = {"status": "not run: the budget was spent", "seconds": 0, "limit": 0}
        run.save()
    finally:
        run.close()


if __name__ == "__main__":
    main()
