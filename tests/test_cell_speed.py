"""benchmarks/cell_speed.py runs every stage at the mini shape and reports consistent numbers."""

import argparse
from pathlib import Path

import pytest
from conftest import load_benchmark


def _module():
    return load_benchmark("cell_speed")


def test_cell_speed_mini_stages():
    cs = _module()
    args = argparse.Namespace(
        shape="mini",
        device="cpu",
        dtype="float32",
        attn="auto",
        prompt_len=16,
        answer_len=8,
        probe_answer_len=8,
        eval_n=8,
        eval_batch=4,
        gen_batch=2,
        gen_tokens=4,
        steps=2,
        warmup=1,
        fpft_memory=True,
        fpft_optimizer="auto",
        stages="eval,generate",
    )
    out = cs.run(args)
    stages = out["stages"]
    assert set(stages) == {"eval", "generate", "polish", "attack_lora", "attack_fpft"}
    assert out["params"] == 984192 and out["attn"] == "sdpa"
    for name in ("eval", "polish", "attack_lora"):
        row = stages[name]
        assert row["seconds"] > 0 and row["mfu"] is None  # no data-sheet peak on a CPU
        assert row["tflops_per_s"] * 1e12 == pytest.approx(row["of_matmul_peak"] * out["matmul_flops_measured"])
    # a polish step = forget + retain (prompt + answer each) + the probe example
    assert stages["polish"]["tokens_per_s"] * stages["polish"]["seconds"] == pytest.approx(2 * 24 + 16 + 8)
    assert stages["attack_fpft"]["optimizer"] == "adamw"
    if Path("/proc/self/status").exists():  # per-stage peak resident set (Linux): at least the model itself
        assert all(row["peak_memory_gib"] >= out["model_memory_gib"] * 0.5 > 0 for row in stages.values())
