"""The cell record's schema and the report's reading of it: bad records are named, the good ones reported."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import ROOT

from margincal.config.typed import ConfigError
from margincal.core.artifacts import OWNER, own
from margincal.reporting.panel import write_report
from margincal.reporting.records import SCHEMA, check_record, read_records

RECORDS = ROOT / "results/mini/head2head/cells"


def _good() -> dict:
    path = sorted(RECORDS.glob("*.json"))[0]
    return json.loads(path.read_text()), path.stem


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: {}, r"misses required key\(s\) \['id', 'status', 'cell', 'family', 'm_ref', 'models'"),
        (lambda r: {**r, "status": "running"}, "status must be one of done, got 'running'"),
        (lambda r: {**r, "schema": SCHEMA + 1}, f"schema must be one of {SCHEMA}, got {SCHEMA + 1}"),
        (lambda r: {**r, "id": "other"}, "id must be the file's name"),
        (lambda r: {**r, "cell": {**r["cell"], "seed": "zero"}}, r"cell\.seed expects an integer, got 'zero'"),
        (lambda r: {**r, "models": {"mc": r["models"]["mc"]}}, r"models misses the model\(s\) \['reference'"),
        (lambda r: {**r, "family": "other"}, "family must be one of gradient, preference, distillation"),
        (lambda r: {**r, "nosuch": 1}, r"unknown config key\(s\) \['nosuch'\]"),
    ],
)
def test_check_record_names_what_is_wrong(change, message):
    record, stem = _good()
    check_record(record, stem)  # a committed record (written before the schema field: version 1) is valid
    attack = record["models"]["mc"]["attacks"]  # an attacker set to score the utility proxy writes it beside
    scored = {label: {**a, "utility": {"rouge_l": 0.5, "n": 8}} for label, a in attack.items()}
    mc = {**record["models"]["mc"], "attacks": scored}
    assert check_record({**record, "models": {**record["models"], "mc": mc}}, stem).models["mc"].attacks
    with pytest.raises(ConfigError, match=message):
        check_record(change(record), stem)


def test_report_lists_bad_records_and_reports_the_good(tmp_path):
    results = tmp_path / "results"
    (results / "cells").mkdir(parents=True)
    good = sorted(RECORDS.glob("*.json"))[:4]
    for path in good:
        shutil.copy(path, results / "cells")
    (results / "cells" / "empty.json").write_text("{}")
    (results / "cells" / "truncated.json").write_text(good[0].read_text()[:100])
    (results / "cells" / "list.json").write_text("[1, 2]")
    own(results, ["cells"])
    done, failed, bad = read_records(results / "cells")
    assert len(done) == 4 and not failed and [name for name, _ in bad] == ["empty.json", "list.json", "truncated.json"]
    report = write_report(results).read_text()
    assert "4 cells done, 0 failed" in report and "## Records not read" in report
    assert "| cells/empty.json | misses required key(s)" in report
    assert "| cells/truncated.json | Unterminated string" in report or "cells/truncated.json" in report
    assert {"report.md", "cells"} <= set(json.loads((results / OWNER).read_text())["entries"])


def test_report_refuses_a_folder_of_a_user(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RECORDS, results / "cells")
    (results / "mine.txt").write_text("a user's file\n")
    with pytest.raises(ValueError, match=r"holds files margincal did not write \(cells, mine\.txt\)"):
        write_report(results)
    assert sorted(p.name for p in results.iterdir()) == ["cells", "mine.txt"]


def test_records_of_another_build_of_theta_ref_are_set_aside(tmp_path):
    """Two of the head-to-head records copied with another θ_ref margin (another build under the same store key): the
    report reads the 13 of the panel's build and names the two, with both margins; a record without m_ref is kept."""
    cells = tmp_path / "results" / "cells"
    shutil.copytree(RECORDS, cells)
    paths = sorted(cells.glob("*.json"))
    for path in paths[:2]:
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "m_ref": record["m_ref"] * 1.01}))
    done, failed, bad = read_records(cells)
    assert len(done) == 13 and not failed and [name for name, _ in bad] == [p.name for p in paths[:2]]
    m_ref = json.loads(paths[2].read_text())["m_ref"]
    assert f"differs from {m_ref:.4f} of the panel's other mini/mini/forget10 records" in bad[0][1]
    assert f"m_ref = {m_ref * 1.01:.4f}" in bad[0][1]
    nudged = json.loads(paths[0].read_text())
    paths[0].write_text(json.dumps({**nudged, "m_ref": m_ref * (1 + 1e-7)}))  # float noise: the same build
    paths[1].write_text(json.dumps({**json.loads(paths[1].read_text()), "m_ref": None}))
    assert [name for name, _ in read_records(cells)[2]] == []
