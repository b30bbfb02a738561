"""Every script in ``benchmarks/`` runs as its docstring says, at its smallest setting on the smoke mini, so none can
rot unnoticed (``eval_speed.py``'s default baseline did: its worker called an API that had changed)."""

import json
from pathlib import Path

import pytest
from conftest import MINI_SMOKE, ROOT, SMOKE, load_benchmark

BENCHMARKS = ROOT / "benchmarks"
SMALL = ["variants=[reference]", "methods=[NPO]"]
NPO_ONLY = "method_overrides={NPO: {train: {steps: 3}}}"  # SMOKE's also names GradDiff


def _argv(script: str, tmp: Path, store: Path) -> list[str]:
    """The script's command line at its smallest setting (``store``: a store holding the smoke mini's models)."""
    demo = [*SMOKE, NPO_ONLY, f"store={store}"]
    return {
        "attack_sweep": [*demo, "attack.lora_r8.train.steps=2", "attack.fpft.train.steps=2",
                         "--method", "NPO", "--budgets", "2", "--k", "4", "--attackers", "lora_r8", "fpft"],
        "demo_seeds": [*demo, *SMALL, "seeds=[0,1]", f"out={tmp / 'seeds'}"],
        "speed/eval_speed": ["--shape", "mini", "--repeats", "1", "--batch-size", "16", "--store", str(store),
                       "--out", str(tmp / "eval_speed.json"), *MINI_SMOKE],
        "mc_sweep": [*demo, "--method", "NPO", "--runs", "steps=2", "steps=2,kl=0"],
        "speed/monitor_cost": [*demo, "mc.monitor.n=4", "--method", "NPO", "--repeats", "1"],
        "unlearn_sweep": [*demo, "--method", "NPO", "--runs", "steps=2", "--out", str(tmp / "unlearn.md")],
        "fuzz_inputs": ["--examples", "2", "--targets", "names"],  # every target: tests/e2e/test_fuzz_inputs.py
    }[script]  # fmt: skip


LIBRARIES = {"speed/shapes"}  # modules the scripts import, not scripts
# scripts whose own test runs them as documented: benchmarks/<script>.py -> the test that does
TESTED_ELSEWHERE = {
    "speed/demo_time": "test_install.py::test_installed_wheel_lists_methods_and_times_the_demo",  # from the wheel
    "speed/cell_speed": "test_gpu_acceptance.py::test_the_speed_stage_at_a_tiny_shape",
    "results_summary": "test_results_summary.py::test_summary_reproduces_the_testbed_write_up",
    "worst_case_summary": "test_results_summary.py::test_the_worst_case_readings_of_the_issue_58_rerun",
    "gpu/acceptance": "test_gpu_acceptance.py::test_the_acceptance_run_at_a_tiny_shape_on_the_cpu",
    "gpu/prepare": "test_gpu_acceptance.py::test_what_travels_is_margincals_closure_and_fits_in_64_mib",
    "gpu/testbed": "test_gpu_testbed.py::test_the_testbed_command_at_a_tiny_shape_on_the_cpu",
    "speed/generation_speed": "test_gpu_acceptance.py::test_the_generation_stage_at_a_tiny_shape",  # through its main()
    "premises": "test_gpu_testbed.py::test_the_testbed_command_at_a_tiny_shape_on_the_cpu",  # its first half
    "speed/audit_log_summary": "test_benchmarks.py::test_the_audit_log_summary_adds_seconds_per_kind_of_work",
}
PRINTS = {  # a line each script prints when it ran to its end
    "attack_sweep": "fpft",
    "demo_seeds": "θ_ref",
    "speed/eval_speed": "evaluation total",
    "mc_sweep": "steps=2,kl=0",
    "speed/monitor_cost": "monitored",
    "unlearn_sweep": "steps=2",
    "fuzz_inputs": "0 failed the property",
}


def test_generation_speed_counts_token_passes_as_its_docstring_says():
    """Prompts of 3, 5, 4 tokens, answers of 2, 7, 1 generated tokens: open-unlearning's one batch (of ≤ 32) is padded
    to 5 and runs until its longest answer, 3 · (5 + 7 − 1) = 33; margincal in batches of 2 by prompt length, (3, 4)
    then (5): 2 · 4 + (1 + 0) and 1 · 5 + 6, so 9 + 11 = 20."""
    module = load_benchmark("speed/generation_speed")
    assert module.token_passes([3, 5, 4], [2, 7, 1], batch=2) == {"open-unlearning": 33, "margincal": 20}


def test_the_audit_log_summary_adds_seconds_per_kind_of_work(tmp_path, capsys):
    """Three trials (one read from the store, which is not counted), a candidate run, a graph attack and an
    evaluation, as ``margincal audit`` prints them: seconds per kind, most first, and the 2 trials run in 6 s of trial
    time, 20 a minute."""
    log = tmp_path / "audit.log"
    log.write_text(
        "audit (worst): 1 checkpoint(s), 75 stages (0 cached) in store\n"
        "  [1/75] reference/evaluate: 5.2 s\n"
        "  [2/75] reference/attack/lora_r8@20/d0: 2.5 s\n"
        "  search G lora_r8 [1/3] lr 0.002: selection ROUGE-L 0.693 (15 records), utility 1.000, 2.0 s\n"
        "  search G lora_r8 [2/3] lr 0.001: selection ROUGE-L 0.7 (15 records), utility 1.000, cached\n"
        "  search G fpft [3/3] lr 0.01: selection ROUGE-L 0.3 (15 records), utility 0.1, 4.0 s\n"
        "  [preset] theta0/searched/G/fpft/preset/d2: 1.5 s\n"
    )
    load_benchmark("speed/audit_log_summary").main(str(log))
    out = capsys.readouterr().out.splitlines()
    assert [line.split() for line in out[:-1]] == [
        ["graph", "evaluate", "5.2", "s", "1"], ["trial", "fpft", "4.0", "s", "1"],
        ["graph", "attack", "lora_r8", "2.5", "s", "1"], ["trial", "lora_r8", "2.0", "s", "1"],
        ["candidate", "fpft", "1.5", "s", "1"],
    ]  # fmt: skip
    assert out[-1] == "total 15.2 s; 2 trials in 6.0 s: 20.0 trials/min"


def test_every_benchmark_script_has_a_smoke_test():
    scripts = {p.relative_to(BENCHMARKS).with_suffix("").as_posix() for p in BENCHMARKS.rglob("*.py")}
    assert scripts == set(PRINTS) | set(TESTED_ELSEWHERE) | LIBRARIES
    for test in TESTED_ELSEWHERE.values():
        file, name = test.split("::")
        [path] = (ROOT / "tests").rglob(file)
        assert f"def {name}(" in path.read_text()


@pytest.mark.parametrize("script", sorted(PRINTS))
def test_benchmark_script_runs_at_its_smallest_setting(script, smoke_mini, tmp_path, monkeypatch, capsys):
    """In-process (the store's smoke models reused), from an empty working directory: it ends, prints its result
    and writes nowhere but where it was told (its default folders stay as they were)."""
    store = tmp_path / "store"
    results = sorted((BENCHMARKS / "results").iterdir())
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    module = load_benchmark(script)
    argv = _argv(script, tmp_path, store)
    module.main(argv)
    out = capsys.readouterr().out
    assert PRINTS[script] in out
    assert sorted((BENCHMARKS / "results").iterdir()) == results and not any(work.iterdir())
    if script == "speed/eval_speed":
        summary = json.loads((tmp_path / "eval_speed.json").read_text())
        assert summary["baseline"] is None and set(summary["seconds"]) == {"current"}
        best = summary["seconds"]["current"]
        assert best["total"] == pytest.approx(sum(best[p] for p in ("scoring", "generation", "gradnorm", "other")))
