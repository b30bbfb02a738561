"""The GPU acceptance run cannot rot before a GPU arrives: its script runs at a tiny shape on the CPU, stage by stage
under time limits, and what travels to the lent machine (tree + carried wheels) is checked to fit in 64 MiB."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, load_benchmark

GPU = ROOT / "benchmarks" / "gpu"


def test_what_travels_is_margincals_closure_and_fits_in_64_mib():
    """carry.json (written by prepare.py) names exactly the packages margincal needs that the lent machine lacks,
    at this environment's versions; with the working tree they fit the device tool's 64 MiB, so a new dependency
    or a grown tree fails here (rerun prepare.py; shrink the tree or let it leave a package out, and say so)."""
    prepare = load_benchmark("gpu/prepare")
    python, present = prepare.machine_packages()
    assert python == "3.12" and {"torch", "transformers", "peft", "accelerate", "pyarrow"} <= present
    pins = prepare.closure(prepare.core_requirements(), present, python)
    assert set(pins) == {
        *("bitsandbytes", "datasets", "defusedxml", "dill", "multiprocess", "nltk", "rouge-score"),
        *("pydantic", "pydantic-core", "annotated-types", "typing-inspection"),  # the API's argument checks
    }
    record = json.loads((GPU / "carry.json").read_text())
    assert {**record["packages"], **record["left_out"]}.keys() == pins.keys()  # versions: prepare.py --check
    assert record["left_out"] == {}  # bitsandbytes travels (NF4 and paged 8-bit AdamW on the GPU)
    carry = sum(p["bytes"] for p in record["packages"].values())  # the demo's mini models travel in the tree
    assert prepare.tree_bytes() + carry <= prepare.LIMIT == 64 * 2**20
    # extras are not carried: lm-eval and ray are needed only for MMLU and the Ray executor
    assert not {"lm-eval", "ray"} & {prepare.normalize(r.name) for r in prepare.core_requirements()}


def test_prepare_leaves_the_largest_packages_out_until_it_fits():
    prepare = load_benchmark("gpu/prepare")
    mib = 2**20
    assert prepare.fit({"a": 40 * mib, "b": 1 * mib, "c": 2 * mib}, 30 * mib) == (["b", "c"], ["a"])
    assert prepare.fit({"a": 40 * mib, "b": 1 * mib}, 10 * mib) == (["a", "b"], [])


def test_a_stage_past_its_time_limit_is_reported_and_the_run_goes_on(tmp_path):
    acceptance = load_benchmark("gpu/acceptance")
    args = acceptance.argparse.Namespace(out=str(tmp_path / "out"), tiny=True, npo_steps=1, mc_steps=1)
    row = acceptance.run_stage(args, "cell", 0.5, tmp_path / "work")
    assert row["status"] == "timed out after 0 s" and row["limit"] == 0 and "result" not in row
    assert not (tmp_path / "out").exists()  # the stage writes into --work only


def _check_cell_speed(out: dict) -> None:
    """benchmarks/speed/cell_speed.py at its mini shape (prompt 16, answer 8, probe answer 8 tokens; 2 timed steps):
    every stage, consistent numbers."""
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


def test_the_speed_stage_at_a_tiny_shape(tmp_path):
    """Stage 2 (and 5's path: the full-parameter attack) in this process: cell_speed.py through the stage's own
    command line, at its mini shape on the CPU."""
    acceptance = load_benchmark("gpu/acceptance")
    args = acceptance.argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path), tiny=True)
    _check_cell_speed(acceptance.speed_stage(args, "llama-3.2-1b"))


def test_the_acceptance_run_at_a_tiny_shape_on_the_cpu(tmp_path):
    """The script as run.sh runs it, at a tiny shape (the cell and the audit each in its own timed process; the
    speed stage, same code at its own cost, in the test above): both end "ok" with their numbers, the cell went
    through the panel's stages, the audit gave its quick budget (NF4 included) reusing every stage the cell stored
    (θ_ref's, θ0's and the NPO checkpoint's evaluations and attacks), and --out holds only the report."""
    before = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True).stdout
    out, work = tmp_path / "out", tmp_path / "work"
    cmd = [sys.executable, str(GPU / "acceptance.py"), "--tiny", "--out", str(out), "--work", str(work),
           "--npo-steps", "2", "--mc-steps", "2", "--budget", "0", "--stages", "cell,audit"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)  # a hang guard, not a verdict
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "acceptance.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["acceptance.json", "acceptance.md"]
    stages = report["stages"]
    assert {k: v["status"] for k, v in stages.items()} == {"cell": "ok", "audit": "ok"}, stages
    assert report["env"]["device"].startswith("cpu") and report["env"]["bitsandbytes"]
    cell = stages["cell"]["result"]
    assert cell["counts"] == {"done": 1, "failed": 0} and cell["npo_steps"]["run"] == 2
    assert set(cell["summaries"]) == {"reference", "theta0", "baseline", "mc"}
    kinds = [row["stage"] for row in stages["cell"]["store_stages"]]
    assert sorted(set(kinds)) == ["attack", "evaluate", "polish", "unlearn"] and kinds.count("evaluate") == 4
    assert stages["audit"]["result"]["attacks"] == ["lora_r8@4"]
    assert stages["audit"]["result"]["quantization"] == ["nf4"]
    log = (work / "logs" / "audit.log").read_text()  # the cell's stages reused (same batch sizes), NF4 alone new
    reused = [
        f"{role}/{stage}" for role in ("reference", "theta0", "npo") for stage in ("evaluate", "attack/lora_r8@4/d0")
    ]
    assert all(f"{stage}: cached" in log for stage in reused) and "9 stages (6 cached)" in log, log
    text = (out / "acceptance.md").read_text()
    assert "| cell | ok |" in text and "NPO 2 of" in text and "| unlearn |" in text
    after = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert after == before  # nothing written into the checkout


def test_the_bitsandbytes_wheel_keeps_only_the_machines_cuda_library(tmp_path):
    """prepare.slim drops the native libraries of other CUDA, ROCm and XPU releases and their RECORD lines; every
    other file and line stays byte for byte; a wheel without the machine's CUDA library is refused."""
    import zipfile

    prepare = load_benchmark("gpu/prepare")
    files = {
        "bitsandbytes/__init__.py": b"x = 1\n",
        "bitsandbytes/libbitsandbytes_cpu.so": b"cpu" * 100,
        "bitsandbytes/libbitsandbytes_cuda128.so": b"128" * 1000,
        "bitsandbytes/libbitsandbytes_cuda130.so": b"130" * 1000,
        "bitsandbytes/libbitsandbytes_rocm71.so": b"rocm" * 1000,
        "bitsandbytes/libbitsandbytes_xpu2026.so": b"xpu" * 1000,
    }
    record = "".join(f"{name},sha256=h{i},{len(data)}\n" for i, (name, data) in enumerate(files.items()))
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("bitsandbytes-0.50.2.dist-info/RECORD", record + "bitsandbytes-0.50.2.dist-info/RECORD,,\n")
    assert prepare.slim(wheel, "130") > 0
    with zipfile.ZipFile(wheel) as z:
        kept = [n for n in z.namelist() if not n.endswith("RECORD")]
        assert kept == ["bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so",
                        "bitsandbytes/libbitsandbytes_cuda130.so"]  # fmt: skip
        assert z.read("bitsandbytes/libbitsandbytes_cuda130.so") == files["bitsandbytes/libbitsandbytes_cuda130.so"]
        lines = z.read("bitsandbytes-0.50.2.dist-info/RECORD").decode().splitlines()
    assert lines == ["bitsandbytes/__init__.py,sha256=h0,6", "bitsandbytes/libbitsandbytes_cpu.so,sha256=h1,300",
                     "bitsandbytes/libbitsandbytes_cuda130.so,sha256=h3,3000",
                     "bitsandbytes-0.50.2.dist-info/RECORD,,"]  # fmt: skip
    with pytest.raises(SystemExit, match="no libbitsandbytes_cuda126"):
        prepare.slim(wheel, "126")  # only cuda130 is left
    assert prepare.machine_cuda() == "130"


def test_the_generation_stage_at_a_tiny_shape(tmp_path):
    """Stage 4 as --tiny runs it: a tiny mini built into the work folder's store, both ways' answers on θ0 and θ_ref
    compared. (On the GPU the demo's models come from the shipped set, which travels with the tree.)"""
    acceptance = load_benchmark("gpu/acceptance")
    args = acceptance.argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path), tiny=True)
    result = acceptance.generation_stage(args)
    assert {p.name for p in (tmp_path / "mini-store").iterdir()} >= {"mini-theta0", "mini-ref"}
    assert set(result["models"]) == {"theta0", "ref"} and result["max_new_tokens"] == 8
    for model in result["models"].values():
        assert model["answers_equal"] == result["prompts"] > 0 and len(model["seconds"]["margincal"]) == 1
    assert "| generation | ok | 1.0 | theta0: open-unlearning" in acceptance.markdown(
        {"env": {}, "commit": "c", "stages": {"generation": {"status": "ok", "seconds": 1.0, "result": result}}}
    )
