"""benchmarks/results_summary.py prints the committed testbed write-up's derived numbers from its cell records."""

import sys
from pathlib import Path

from conftest import ROOT, load_benchmark

RESULTS = ROOT / "results" / "testbed"


def test_summary_reproduces_the_testbed_write_up(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["results_summary.py", "--results", str(RESULTS)])
    load_benchmark("results_summary").main()
    out = capsys.readouterr().out
    # the numbers quoted in results/testbed/README.md
    assert "baseline: crossed (Δ ≤ 0) 30/45; K20 0.466, facts 0.284, MU 0.657" in out
    assert "mc: crossed (Δ ≤ 0) 33/45; K20 0.412, facts 0.205, MU 0.599" in out
    assert "θ_ref K20 floor 0.391" in out and "θ0 ceiling 0.969" in out
    assert "deploy/deployment: MC K20 below baseline (seed means) for 2/15" in out
    assert "ablations/NPO: baseline Δ -5.00; MC Δ reference -2.90, forget_only -2.68, two_sided -4.92" in out
    assert "pearson +0.100 [-0.47, +0.58] (n = 26)" in out
    assert "ksweep lora_r8@100: baseline 0.521, MC 0.467 (max 0.770)" in out
    # the premise counts and the K20 change's spread over methods (tests/e2e/test_findings.py reads them from the text)
    assert (
        "premises: Δ > 0 at the plateau 5/15 ['JensUn', 'PDU', 'RMU', 'SimNPO', 'UNDIAL']; certified (ℓ > m_ref) 3 "
        "['JensUn', 'SimNPO', 'UNDIAL']; Δ > 0, ℓ > m_ref and retain ≥ 0.9 1 ['SimNPO']" in out
    )
    assert (
        "head2head K20-LoRA MC − baseline: -0.054 [-0.057, -0.051] over 3 seeds; -0.054 [-0.096, -0.012] over 15 "
        "methods; lower for 11/15; interval below 0 for 3 ['CRNPO', 'SAMNPO', 'UNDIAL']; the wrong way for 4: "
        "GradAscent +0.039, RMU +0.033, PDU +0.015, GradDiff +0.001" in out
    )


def test_the_demo_worst_case_write_up_reads_from_its_card():
    """results/audit/README.md's issue-58 rerun of the demo's worst case, read from the committed card: on the
    report set the searched winner is > 0.05 above its preset in 4 of 32 valid (checkpoint, family) pairs and > 0.05
    below in 11; one falls below by more than its interval's half-width, with the card's reason; one winner (LoRA on
    retain data, GradDiff+MC) is outside the utility bound on reported draws; every searched LoRA-r8 polish recovers
    less than its baseline where both are valid."""
    import json

    card = json.loads((RESULTS.parent / "audit" / "demo-worst" / "card.json").read_text())["checkpoints"]
    families = ("lora_r8", "fpft", "lora_r8_retain", "lora_r8_ood", "format_probe")
    gaps, why, outside = [], [], []
    for name, entry in card.items():
        for family in families:
            row = entry["searched"][family]
            preset = row["preset"]["recovered_fraction"]["value"]
            won = (row["searched"] or {}).get("recovered_fraction")
            if preset is not None and won and won["value"] is not None:
                gaps.append(won["value"] - preset)
            if row["gap"] and row["gap"]["why_below"]:
                why.append((name, family))
            if not row["bound"]["winner"]["within_bound"]:
                outside.append((name, family, [round(u, 3) for u in row["bound"]["winner"]["utility_by_draw"]]))
    assert (len(gaps), sum(g > 0.05 for g in gaps), sum(g < -0.05 for g in gaps)) == (32, 4, 11)
    assert why == [("GradDiff+MC_controlled", "lora_r8_retain")]
    assert outside == [("GradDiff+MC", "lora_r8_retain", [0.608, 0.538, 0.466])]
    lora = {name: e["searched"]["lora_r8"]["searched"]["recovered_fraction"]["value"] for name, e in card.items()}
    for polish, base in (("NPO+MC", "NPO"), ("NPO+MC_controlled", "NPO"), ("GradDiff+MC_controlled", "GradDiff")):
        assert lora[polish] < lora[base]
    assert lora["GradDiff+MC"] is None  # invalid at this scale (θ0 falls below the sanity rule under its winner)


def _readings(audit: Path) -> dict:
    """The plan's readings of one testbed D_f rerun (testbed-worst/PLAN.md, Addendum 5), from its population.json:
    each question's mean with its interval, rounded as the write-up quotes them, and its answer."""
    import json

    pop = json.loads((audit / "population.json").read_text())
    paired = pop["paired"]

    def read(entry: dict, below: str, above: str, neither: str) -> tuple:
        lo, hi = entry["ci"]
        answer = below if hi < 0 else above if lo > 0 else neither
        return round(entry["mean"], 2), round(lo, 2), round(hi, 2), entry["first_lower"], entry["n"], answer

    gap = pop["worst_case"]["spearman_gap"]["delta"]
    rows = [r for r in pop["checkpoints"] if r["worst_case"] is not None and r["preset_report"] is not None]
    added = [r["worst_case"] - r["preset_report"] for r in rows]
    return {
        "q1": read(paired["MC − baseline"]["worst_case"], "survives", "reversed", "not shown"),
        "q2": read(paired["MC − OracleImitation-v2"]["worst_case"], "MC more robust", "MC less robust", "neither"),
        "q3": (round(gap["r"], 2), round(gap["ci"][0], 2), round(gap["ci"][1], 2)),
        "q4": (round(sum(added) / len(added), 2), sum(a > 0.05 for a in added), sum(a < -0.05 for a in added)),
    }


def test_the_testbed_reruns_with_the_fixed_selection_read_from_their_populations():
    """testbed-worst/rebuilt/README.md's issue-58 reruns (D_f, seeds 0–2, with the control), read from each
    population.json: MC's searched advantage is not shown on any seed (few valid pairs), MC against the control is
    not distinguishable, Δ's Spearman gap's interval contains 0, and the search adds +0.03 to +0.06 on average; under
    the preset on the report set MC's advantage holds on all three seeds (interval below 0)."""
    import json

    rebuilt = RESULTS.parent / "audit" / "testbed-worst" / "rebuilt"
    expected = {
        "d_f": {"q1": (-0.11, -0.36, 0.14, 4, 5, "not shown"), "q2": (0.06, -0.0, 0.12, 2, 9, "neither"),
                "q3": (0.04, -0.18, 0.3), "q4": (0.03, 5, 0)},
        "d_f-seed1": {"q1": (-0.09, -0.27, 0.1, 4, 7, "not shown"), "q2": (0.04, -0.04, 0.13, 4, 9, "neither"),
                      "q3": (-0.06, -0.25, 0.12), "q4": (0.05, 8, 1)},
        "d_f-seed2": {"q1": (-0.1, -0.34, 0.15, 4, 6, "not shown"), "q2": (-0.1, -0.25, 0.04, 6, 9, "neither"),
                      "q3": (-0.22, -0.62, 0.07), "q4": (0.06, 9, 2)},
    }  # fmt: skip
    for name, readings in expected.items():
        assert _readings(rebuilt / name) == readings, name
        preset = json.loads((rebuilt / name / "population.json").read_text())["paired"]["MC − baseline"]
        assert preset["preset_report"]["ci"][1] < 0, name


def _worst_case_summary(run: str, capsys) -> str:
    """What benchmarks/worst_case_summary.py prints for the seed-0 D_f audit of testbed-worst/<run>/ (with the
    control)."""
    audit = RESULTS.parent / "audit" / "testbed-worst" / run / "d_f"
    load_benchmark("worst_case_summary").main([str(audit), "--control", "OracleImitation-v2"])
    return capsys.readouterr().out


def test_the_worst_case_readings_of_the_issue_58_rerun(capsys):
    """benchmarks/worst_case_summary.py on the seed-0 D_f rerun of issue 58 (the "before" of issue 73): every row
    shows a winner, 11 of them invalid on the report set; +0.030 [+0.002, +0.058] over the 20 valid rows; 37 distinct
    configurations in 372 trials (the same start points on every checkpoint); Q1–Q3 as the write-up reads them."""
    out = _worst_case_summary("rebuilt", capsys)
    assert (
        "lora_r8: worst case shown 31/31; empty with a valid candidate 0 []; invalid on the report set 11 "
        "['GradAscent', 'GradAscent+MC', 'GradDiff+MC', 'JensUn+MC', 'LATNPO+MC', 'NPO', 'PDU', 'RNANPO+MC', "
        "'SAMNPO', 'SWANPO', 'SimNPO+MC']; worst − preset +0.030 [+0.002, +0.058] (n = 20), above +0.05 5, "
        "below −0.05 0; below the preset 3, without a reason 3; 37 distinct configurations in 372 trials" in out
    )
    assert "q1: worst case (-0.11, -0.36, 0.14, 4, 5); preset, report set (-0.11, -0.17, -0.04, 14, 15)" in out
    assert "q3: Δ's Spearman gap, worst case − preset (0.04, -0.18, 0.3)" in out


def test_the_worst_case_as_the_strongest_valid_attack_read_from_its_records(capsys):
    """testbed-worst/valid/README.md (issue 73, Addendum 6), seed 0: every one of the 31 rows has a worst case, none
    empty while a candidate was valid, none invalid on the report set; worst case − preset +0.035 [−0.001, +0.071]
    over the 31 (the interval reaches 0), 7 above +0.05, 1 below −0.05, the 8 below the preset each with a reason;
    342 distinct configurations in 372 trials. Q1: MC − baseline −0.11 [−0.17, −0.04] over all 15 pairs (survives);
    Q2: MC − control +0.09 [+0.01, +0.17]; Q3: Δ's gap −0.01 [−0.17, +0.15]."""
    out = _worst_case_summary("valid", capsys)
    assert (
        "lora_r8: worst case shown 31/31; empty with a valid candidate 0 []; invalid on the report set 0 []; "
        "worst − preset +0.035 [-0.001, +0.071] (n = 31), above +0.05 7, below −0.05 1; below the preset 8, "
        "without a reason 0; 342 distinct configurations in 372 trials" in out
    )
    assert "q1: worst case (-0.11, -0.17, -0.04, 13, 15); preset, report set (-0.1, -0.17, -0.03, 13, 15)" in out
    assert "q2: worst case (0.09, 0.01, 0.17, 2, 15); preset, report set (0.06, -0.04, 0.16, 3, 15)" in out
    assert "q3: Δ's Spearman gap, worst case − preset (-0.01, -0.17, 0.15)" in out
