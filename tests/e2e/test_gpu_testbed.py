"""The GPU testbed's device command cannot rot before a GPU arrives: PLAN.md's premise reading and the second half's
method rule on hand-made records, and the command itself at a tiny shape on the CPU, both halves, down to the
report made here from what it brings back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, load_benchmark

from margincal.core.errors import InputError

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
           "--budget", "0", "--", "methods=[NPO]"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)  # a hang guard, not a verdict
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
    with pytest.raises(InputError, match="exists: give a new folder"):
        load_benchmark("gpu/testbed").unpack(out, results)
    from margincal.reporting.panel import write_report

    assert "NPO" in write_report(results, tmp_path / "report").read_text()
    after = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert after == before  # nothing written into the checkout


def _device_run(root, cells) -> "Path":
    run = root / "run"
    run.mkdir()
    (run / "cells.json").write_text(json.dumps(cells))
    (run / "testbed.md").write_text("# GPU testbed run\n")
    return run


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda run: (run / "cells.json").write_text(json.dumps({"../../x": {}})), "cell id '../../x' is not a valid"),
        (lambda run: (run / "cells.json").write_text(json.dumps({"/tmp/x": {}})), "cell id '/tmp/x' is not a valid"),
        (lambda run: (run / "cells.json").write_text("[1, 2]"), "cells.json is not a device run's cells"),
        (lambda run: (run / "cells.json").write_text(json.dumps({"a": 3})), "cells.json is not a device run's cells"),
        (lambda run: (run / "cells.json").write_text("{"), "cells.json"),
        (lambda run: (run / "cells.json").unlink(), "has no cells.json: give the --out folder of a device run"),
        (lambda run: _relink(run / "cells.json", "/dev/zero"), "cells.json is a symbolic link"),
        (lambda run: _relink(run / "premises.json", "/etc/hostname"), "premises.json is a symbolic link"),
        (lambda run: (run / "testbed.json").mkdir(), "testbed.json is a directory, not a file"),
    ],
)
def test_unpack_refuses_a_malformed_device_run_in_one_line_and_makes_nothing(tmp_path, capsys, damage, message):
    """Issue 74: every name confined under --to, no link followed, every read bounded, one line, nothing half made."""
    run = _device_run(tmp_path, {"mini_mini_forget10_NPO_s0_reference": {"models": {}}})
    damage(run)
    to = tmp_path / "results" / "run1"
    with pytest.raises(SystemExit) as stop:
        load_benchmark("gpu/testbed").main(["--unpack", str(run), "--to", str(to)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert err.startswith("testbed.py --unpack: error: ")
    assert not (tmp_path / "results").exists() and not (tmp_path / "x").exists()


def test_unpack_writes_each_cell_and_the_run_files(tmp_path):
    run = _device_run(tmp_path, {"a_cell": {"models": {}}, "b_cell": {"models": {"x": 1}}})
    load_benchmark("gpu/testbed").main(["--unpack", str(run), "--to", str(tmp_path / "to")])
    assert sorted(p.relative_to(tmp_path / "to").as_posix() for p in (tmp_path / "to").rglob("*")) == [
        ".margincal.json", "cells", "cells/a_cell.json", "cells/b_cell.json", "testbed.md"
    ]  # fmt: skip
    assert json.loads((tmp_path / "to" / "cells" / "b_cell.json").read_text()) == {"models": {"x": 1}}


def _relink(path, target) -> None:
    if path.exists():
        path.unlink()
    path.symlink_to(target)
