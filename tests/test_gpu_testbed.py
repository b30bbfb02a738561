"""The GPU testbed's device command cannot rot before a GPU arrives: PLAN.md's premise reading and the second half's
method rule on hand-made records, and the command itself at a tiny shape on the CPU, both halves, down to the
report made here from what it brings back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "testbed.py"


def _method(delta: float, plateau: bool = True, certified: bool = False, retain: float = 1.0) -> dict:
    return {"delta": delta, "plateau": plateau, "certified": certified, "retain_rougeL": retain}


def _premises(theta0_forget: float = 0.95) -> dict:
    return {
        "models": {"theta0": {"forget_rougeL": theta0_forget}},
        "methods": {
            "NPO": _method(-4.0),
            "SimNPO": _method(3.5, certified=True),
            "UNDIAL": _method(5.0, certified=True, retain=0.7),
            "RMU": _method(0.6),
            "GradDiff": _method(2.0, plateau=False),  # above, but stopped by the step cap
        },
        "kl_probe": {"polish": {"0.0": {"probe_kl": 2.47}, "0.05": {"probe_kl": 2.14}}},
    }


def test_the_premises_are_read_as_the_plan_says_and_order_the_second_half():
    testbed, summary = load_benchmark("gpu/testbed"), load_benchmark("results_summary")
    reading = summary.premise_reading(_premises())
    assert reading == {
        "p1": True,
        "methods": 5,
        "capped": ["GradDiff"],
        "above": ["RMU", "SimNPO", "UNDIAL"],
        "certified": ["SimNPO", "UNDIAL"],
        "kept": ["RMU", "SimNPO"],
        "row": ["SimNPO"],
        "p3": True,
        "p3_drop": pytest.approx(1 - 2.14 / 2.47),
    }
    methods, why = testbed.mc_methods(_premises())
    assert methods == ["UNDIAL", "SimNPO", "GradDiff", "RMU", "NPO"]  # Δ at the plateau, largest first
    assert why == "5 methods by Δ at the plateau, largest first (3 above the cliff)"
    assert testbed.mc_methods(_premises(theta0_forget=0.89)) == ([], testbed.mc_methods({})[1])
    assert summary.premise_reading({"methods": {}})["p1"] is None  # a first half cut short before θ0's scores
    probe_worse = _premises()
    probe_worse["kl_probe"]["polish"]["0.05"]["probe_kl"] = 2.35  # 4.9 % lower: not enough
    assert summary.premise_reading(probe_worse)["p3"] is False


def test_the_second_half_alone_needs_the_first_halfs_records(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--half", "mc", "--out", str(tmp_path)], capture_output=True)
    assert done.returncode == 2 and b"give --premises FILE" in done.stderr


def test_the_testbed_command_at_a_tiny_shape_on_the_cpu(tmp_path):
    """Both halves as run.sh runs them (one method, given on the command line, since a tiny mini memorises nothing
    and P1 would stop the second half): the premises measured and copied out, the panel cell run on the first half's
    stored models, --out within the device tool's 8 files, and a report made here from the unpacked records."""
    before = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True).stdout
    out, work = tmp_path / "out", tmp_path / "work"
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--out", str(out), "--work", str(work), "--methods", "NPO",
           "--budget", "400", "--", "methods=[NPO]"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "cells.json", "premises.json", "premises.md", "testbed.json", "testbed.md"
    ]  # fmt: skip
    report = json.loads((out / "testbed.json").read_text())
    assert {k: v["status"] for k, v in report["halves"].items()} == {"premises": "ok", "mc": "ok"}, report["halves"]
    premises = json.loads((out / "premises.json").read_text())
    assert premises["complete"] and list(premises["methods"]) == ["NPO"] and premises["n_forget"] == 10
    assert set(premises["seconds"]) == {"workspace", "reference_scores", "kl_probe"}
    assert report["reading"]["methods"] == 1 and report["mc"]["why"] == "methods given on the command line"
    [(cell, record)] = json.loads((out / "cells.json").read_text()).items()
    assert cell == "mini_mini_forget10_NPO_s0_reference" and report["mc"]["cells"] == [cell]
    assert set(record["models"]) == {"reference", "theta0", "baseline", "mc"}
    assert all(m["attacks"] for m in record["models"].values())
    assert "training mini" not in (work / "logs" / "mc.log").read_text()  # the first half's models, from the store
    assert len(list((work / "store" / "unlearn").glob("*/stage.json"))) == 1  # and its baseline, the panel's stage
    results = tmp_path / "results"
    load_benchmark("gpu/testbed").unpack(out, results)
    with pytest.raises(FileExistsError):
        load_benchmark("gpu/testbed").unpack(out, results)
    from margincal.reporting.panel import write_report

    assert "NPO" in write_report(results, tmp_path / "report").read_text()
    after = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert after == before  # nothing written into the checkout
