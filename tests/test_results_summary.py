"""benchmarks/results_summary.py prints the committed testbed write-up's derived numbers from its cell records."""

import sys
from pathlib import Path

from conftest import load_benchmark

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "testbed"


def test_summary_reproduces_the_testbed_write_up(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["results_summary.py", "--results", str(RESULTS)])
    load_benchmark("results_summary").main()
    out = capsys.readouterr().out
    # the numbers quoted in docs/results/testbed/README.md
    assert "baseline: crossed (Δ ≤ 0) 30/45; K20 0.466, facts 0.284, MU 0.657" in out
    assert "mc: crossed (Δ ≤ 0) 33/45; K20 0.412, facts 0.205, MU 0.599" in out
    assert "θ_ref K20 floor 0.391" in out and "θ0 ceiling 0.969" in out
    assert "deploy/deployment: MC K20 below baseline (seed means) for 2/15" in out
    assert "ablations/NPO: baseline Δ -5.00; MC Δ reference -2.90, forget_only -2.68, two_sided -4.92" in out
    assert "pearson +0.100 [-0.47, +0.58] (n = 26)" in out
    assert "ksweep lora_r8@100: baseline 0.521, MC 0.467 (max 0.770)" in out
