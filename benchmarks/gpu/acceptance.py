"""The GPU acceptance run: a bare lent GPU machine to measured numbers in one prepared command of under 4 minutes
(with the machine's start, under 5 of the session's 15 device minutes; the GPU testbed, benchmarks/gpu/testbed.py,
takes the next 9).

    .venv/bin/python benchmarks/gpu/prepare.py     # here, where pip works: the wheels the machine lacks
    # then, through the device tool, as one call:
    #   run(command="bash benchmarks/gpu/run.sh", carry=[".gpu-carry"], timeout_s=230)
    python benchmarks/gpu/acceptance.py --tiny --out DIR     # the same stages at a tiny shape on a CPU (the test)

Stages, each in its own process under its own time limit (a stage that fails or runs out of time is reported with
the end of its log, and the next one still runs), in this order:

1. ``env`` (this process): Python, torch, CUDA, transformers, peft, accelerate and the optional packages found
   (bitsandbytes, rouge-score, datasets; lm-eval and ray are not needed: the stages import the core path only, and
   a missing optional package is one line where a feature needs it), the device and its memory;
2. ``cell``: one panel cell at a real shape through the panel's own stages: a random-weight Llama-3.2-1B-shaped θ0
   and θ_ref saved as local Hugging Face checkpoints with a Llama-3-format tokenizer, TOFU-shaped data at a tenth
   of TOFU's sizes (``CELL_SIZES``: forget10 40 questions, holdout 40, a 40-question retain subset, 20 real
   authors, 40 world facts, a 100-example probe; answers of at most 64 new tokens, which random weights always
   reach), bf16: NPO at the paper schedule (capped at ``--npo-steps``, and said), the MC polish (``--mc-steps``),
   the K20-LoRA attack of every model and the full TOFU evaluation (generation and gradnorm MIA included) of each;
   wall seconds per stage (from the store, also of a cell cut short by its limit); a failed cell's traceback. (Run
   5 ran the cell at TOFU's full sizes to its end: benchmarks/RESULTS.md.)
3. ``audit``: ``margincal audit --budget quick`` of the cell's NPO checkpoint against its θ_ref and θ0 (the NF4
   attack where bitsandbytes travelled);
4. ``generation``: ``benchmarks/speed/generation_speed.py`` on the device: open-unlearning's TOFU decoding against
   margincal's on the demo's trained θ0 and θ_ref (the shipped mini models, which travel with the tree), fp32,
   2 repeats each, answers compared (issue 42's generation ratio);
5. ``speed-1b``: ``benchmarks/speed/cell_speed.py`` at the Llama-3.2-1B shape (scoring, generation, MC polish and
   K20-LoRA steps, 5 timed steps each: tokens/s, MFU, peak memory);
6. ``speed-8b`` (only when ``--stages`` names it; run 2 measured it): ``cell_speed.py`` at the Llama-3.1-8B shape
   with full-parameter attack steps (paged 8-bit AdamW; not run without bitsandbytes, and said).

Random weights make every number a cost, never a result: no answer is learned or forgotten. Writes
``acceptance.json`` and ``acceptance.md`` under ``--out`` after every stage (the end of a failed stage's log is in
the JSON; the device tool brings back at most 8 files) and nothing else outside ``--work`` (checkpoints, data, the
store, a log per stage; default: a temporary folder, removed at the end). ``--tiny`` runs stages 1 to 5
at a tiny shape on the CPU with a few steps each (stage 4 on a tiny mini built into ``--work``, stage 5 at
cell_speed's mini shape with the full-parameter attack, so stage 6's path runs too); ``--stages cell,audit`` runs
only those.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "speed"))  # cell_speed.py, generation_speed.py, shapes.py: the stages'
# stage -> its time limit in seconds on a GPU (the whole run stays under --budget: each stage gets at most what is left)
# The panel's own stages run first: the first H100 run (benchmarks/RESULTS.md) found its CUDA failures there, and a
# cell cut short still reports the seconds of each stage it stored. The audit reuses every stage the cell stored (the
# same batch sizes, so the same store keys); its own are the three NF4 quantizations and their evaluations.
# Estimated from runs 2 and 5 (benchmarks/RESULTS.md): the cell at a tenth of TOFU's sizes about 85 s (build 15,
# four evaluations of 64-token answers about 5 s each, NPO 20 and MC 40 steps about 25, four attacks about 16, the
# process and model loads about 20), the audit's NF4 quantizations and their evaluations about 40 s, the generation
# comparison 15 s, speed-1b 40 s: about 180 s of a 190 s budget.
LIMITS = {"cell": 95, "audit": 45, "generation": 20, "speed-1b": 40}
OPTIONAL_STAGES = {"speed-8b": 70}  # run only when --stages names them
TINY_LIMITS = {"cell": 240, "audit": 240, "generation": 240, "speed-1b": 120}
# the generation stage's mini under --tiny, trained in seconds (its answers need not stop: it tests the path)
TINY_MINI = [
    "mini.data.n_authors=10",
    "mini.data.n_holdout_authors=2",
    "mini.data.n_real_authors=4",
    "mini.data.n_world_facts=6",
    "mini.data.n_probe=10",
    "mini.arch.hidden_size=32",
    "mini.arch.intermediate_size=64",
    "mini.arch.num_layers=1",
    "mini.arch.num_heads=2",
    "mini.arch.vocab_size=400",
    "mini.base.steps=5",
    "mini.finetune.steps=5",
]
# the cell's data: TOFU's shapes (10 questions an author, 5 perturbed answers) at a tenth of its forget10 size
CELL_SIZES = dict(n_authors=40, n_holdout_authors=4, n_real_authors=20, n_world_facts=40, n_probe=100, n_perturbed=5)
OPTIONAL = ("bitsandbytes", "rouge-score", "nltk", "datasets", "lm-eval", "ray")  # distribution names


def env_stage() -> dict:
    """Versions (read from the packages' metadata: this process imports neither torch nor the optional packages),
    the device (asked of nvidia-smi: no CUDA context is held here while the stages run) and the CPU."""
    import importlib.metadata

    from margincal.core.artifacts import cpu_name

    out = {"python": platform.python_version(), "cpu": cpu_name()}
    for name in ("torch", "transformers", "peft", "accelerate", *OPTIONAL):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["device"] = f"cpu ({out['cpu']})"
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True)
        out["device"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else smi.stderr
    return out


def speed_stage(args: argparse.Namespace, shape: str) -> dict:
    """``cell_speed.py``'s stages at ``shape`` (the full-parameter attack at 8B, with paged 8-bit AdamW)."""
    import cell_speed

    fpft = shape == "llama-3.1-8b" or args.tiny
    argv = ["--shape", "mini" if args.tiny else shape, "--out", str(Path(args.work) / f"{shape}.json")]
    if args.tiny:
        argv += ["--device", "cpu", "--prompt-len", "16", "--answer-len", "8", "--probe-answer-len", "8",
                 "--eval-n", "8", "--eval-batch", "4", "--gen-batch", "2", "--gen-tokens", "4", "--steps", "2",
                 "--warmup", "1"]  # fmt: skip
    else:  # 5 timed steps after 1 warm-up: run 2's 10 + 2 did not fit 60 s at 1B
        argv += ["--steps", "5", "--warmup", "1", "--eval-n", "128", "--gen-tokens", "32"]
    if fpft:
        if not args.tiny and importlib.util.find_spec("bitsandbytes") is None:
            return {"skipped": "the 8B full-parameter attack needs paged 8-bit AdamW: bitsandbytes did not travel"}
        argv += ["--fpft-memory", "--stages", "polish,attack"] if not args.tiny else ["--fpft-memory"]
    cell_speed.main(argv)
    return json.loads((Path(args.work) / f"{shape}.json").read_text())


def generation_stage(args: argparse.Namespace) -> dict:
    """``generation_speed.py``'s comparison on the demo's θ0 and θ_ref (copied from the shipped set into a store
    under ``--work``; under ``--tiny`` a tiny mini built there), on the device."""
    import generation_speed

    out = Path(args.work) / "generation.json"
    small = ["--device", "cpu", "--repeats", "1", "--max-new-tokens", "8"] if args.tiny else ["--device", "cuda"]
    small += [] if args.tiny else ["--repeats", "2"]
    models = ["--model", "theta0", "--model", "ref"]
    store = ["--store", str(Path(args.work) / "mini-store")]
    generation_speed.main([*small, *store, *models, "--out", str(out), *(TINY_MINI if args.tiny else [])])
    return json.loads(out.read_text())


def _data_and_models(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """TOFU-sized splits in the mini layout and θ0 / θ_ref (random weights, one seed each) saved as HF checkpoints
    with a Llama-3-format tokenizer; (benchmark YAML, model family YAML)."""
    import torch
    import yaml
    from shapes import SHAPES
    from transformers import AutoModelForCausalLM, LlamaConfig

    from margincal.config.files import CONFIG_DIR
    from margincal.mini.data import MiniConfig, generate
    from margincal.mini.formats import llama3_tokenizer

    if args.tiny:
        sizes = dict(n_authors=20, n_holdout_authors=2, n_real_authors=4, n_world_facts=6, n_probe=20, n_perturbed=3)
        arch = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    else:
        sizes = CELL_SIZES
        arch = SHAPES["llama-3.2-1b"]
    bench = generate(MiniConfig(n_templates=10, **sizes))
    bench.to_json_dir(work / "data")
    texts = [t for split in bench.splits.values() for r in split for t in (r.question, r.answer)]
    tokenizer = llama3_tokenizer(texts, vocab_size=400 if args.tiny else 4000)
    config = LlamaConfig(**arch, max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    for seed, role in enumerate(("theta0", "ref")):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.save_pretrained(work / role)
        tokenizer.save_pretrained(work / role)
        del model
    spec = yaml.safe_load((CONFIG_DIR / "benchmarks" / "mini.yaml").read_text())
    spec.update(name="tofu-shaped", source=str(work / "data"), max_length=512, max_new_tokens=8 if args.tiny else 64,
                retain_n=16 if args.tiny else 40)  # fmt: skip
    benchmark = work / "tofu-shaped.yaml"
    benchmark.write_text(yaml.safe_dump(spec))
    family = work / "llama-random.yaml"
    family.write_text(yaml.safe_dump({"name": "llama-random", "kind": "hf", "target": str(work / "theta0"),
                                      "references": {"forget10": str(work / "ref")}, "template": "llama3",
                                      "dtype": "float32" if args.tiny else "bfloat16"}))  # fmt: skip
    return benchmark, family


def npo_optimizer(tiny: bool) -> tuple[str, str | None]:
    """NPO's paper optimizer (bitsandbytes' paged 32-bit AdamW) where one step of it runs here, else AdamW and why."""
    if tiny:
        return "adamw", "the tiny CPU run uses AdamW"
    try:
        import bitsandbytes as bnb
        import torch

        param = torch.nn.Parameter(torch.zeros(64, device="cuda"))
        param.grad = torch.ones_like(param)
        bnb.optim.PagedAdamW32bit([param]).step()
        return "paged_adamw_32bit", None
    except Exception as err:  # not installed, or its CUDA library does not load here: measured with AdamW, and said
        return "adamw", f"paged_adamw_32bit did not run here ({type(err).__name__}: {err})"


def eval_batches(args: argparse.Namespace) -> tuple[int, int]:
    """(scoring, generation) batch sizes of the cell's evaluations; the audit uses the same, so it reuses the cell's
    stored evaluations of θ_ref, θ0 and the NPO checkpoint (batch sizes are in every evaluation's store key)."""
    return (4, 4) if args.tiny else (64, 256)


def _panel_overrides(
    args: argparse.Namespace, work: Path, files: tuple[Path, Path], optimizer: str, steps: int | None
) -> list[str]:
    """The one-cell panel: NPO (its paper schedule, or ``steps`` steps), reference-anchored MC, K20-LoRA."""
    benchmark, family = files
    train = f"optimizer: {optimizer}" + (f", steps: {steps}" if steps else "")
    score, generate = eval_batches(args)
    attack = (
        "{preset: lora_r8, k: [4], set: {train.steps: 2, train.batch_size: 4}}"
        if args.tiny
        else ("{preset: lora_r8, k: [20]}")
    )
    return [f"benchmark={benchmark}", f"models=[{family}]", "tiers=[forget10]", "methods=[NPO]", "seeds=[0]",
            "variants=[reference]", f"attackers=[{attack}]", "scale=paper",
            f"method_overrides={{NPO: {{train: {{{train}}}}}}}", f"mc.train.steps={args.mc_steps}",
            f"eval.batch_size={score}", f"eval.generation_batch_size={generate}", f"store={work / 'store'}",
            f"out={work / 'panel'}"]  # fmt: skip


def cell_stage(args: argparse.Namespace, work: Path) -> dict:
    """One cell of the panel machinery at a real shape; per-stage seconds are read from the store by the parent."""
    from margincal.pipeline.executors import run_panel
    from margincal.pipeline.panel import expand_cells, load_panel
    from margincal.pipeline.plan import plan_cell

    start = time.perf_counter()
    files = _data_and_models(args, work)
    built = time.perf_counter() - start
    optimizer, why = npo_optimizer(args.tiny)
    uncapped = load_panel("mini-head2head", _panel_overrides(args, work, files, optimizer, steps=None))
    paper = plan_cell(uncapped, expand_cells(uncapped)[0]).method.train
    cfg = load_panel("mini-head2head", _panel_overrides(args, work, files, optimizer, steps=args.npo_steps or None))
    counts = run_panel(cfg)["counts"]
    [record] = [json.loads(p.read_text()) for p in (work / "panel" / "cells").glob("*.json")]
    return {
        "build_seconds": built,
        "npo_steps": {
            "run": args.npo_steps or paper.steps,
            "paper": paper.steps,
            "batch": paper.batch_size * paper.grad_accum,
        },
        "npo_optimizer": optimizer if why is None else f"{optimizer}: {why}",
        "counts": counts,
        **({"error": record["error"], "traceback": record.get("traceback", "")[-4000:]} if "error" in record else {}),
        "summaries": {role: m["summary"] for role, m in record.get("models", {}).items()},
        "attacks": {role: m["attacks"] for role, m in record.get("models", {}).items()},
    }


def audit_stage(args: argparse.Namespace, work: Path) -> dict:
    """``margincal audit --budget quick`` of the cell's NPO checkpoint (its store stage directory), against the
    cell's θ_ref and θ0."""
    from margincal.cli import main as margincal

    unlearned = sorted((work / "store" / "unlearn").glob("*/stage.json"))  # stored even if the cell ran out of time
    if not unlearned:
        return {"skipped": "the cell stage stored no NPO checkpoint to audit"}
    npo = unlearned[0].parent
    device = ["--device", "cpu"] if args.tiny else ["--device", "cuda", "--dtype", "bfloat16"]
    score, generate = eval_batches(args)
    budget = ["attackers=[{preset: lora_r8, k: [4], set: {train.steps: 2, train.batch_size: 4}}]",
              "headline=lora_r8@4"] if args.tiny else []  # fmt: skip
    argv = ["audit", "--model", f"npo={npo}", "--data", str(work / "data"), "--benchmark",
            str(work / "tofu-shaped.yaml"), "--ref", str(work / "ref"), "--theta0", str(work / "theta0"),
            "--budget", "quick", "--scale", "paper", "--store", str(work / "store"), "--batch-size", str(score),
            "--generation-batch-size", str(generate), *device, "--out", str(work / "audit"), *budget]  # fmt: skip
    start = time.perf_counter()
    rc = margincal(argv)
    if rc != 0:
        raise RuntimeError(f"margincal audit exited {rc}")
    card = json.loads(next((work / "audit").glob("*/card.json")).read_text())
    return {"seconds": time.perf_counter() - start, "attacks": sorted(card["attacks"]),
            "quantization": sorted(card.get("quantization", {}))}  # fmt: skip


def store_seconds(store: Path) -> list[dict]:
    """Every finished store stage of the run, in the order it finished: its kind and wall seconds."""
    rows = []
    for meta in store.glob("*/*/stage.json"):
        info = json.loads(meta.read_text())
        rows.append({"stage": info["stage"], "seconds": info["seconds"], "finished": meta.stat().st_mtime})
    return [{k: r[k] for k in ("stage", "seconds")} for r in sorted(rows, key=lambda r: r["finished"])]


def child(args: argparse.Namespace) -> None:
    """Run one stage in this process and write its result to ``<work>/<stage>.result.json``; exit 1 where the stage
    recorded an error (a cell the panel recorded as failed)."""
    work = Path(args.work)
    stage = args.stage
    if stage.startswith("speed-"):
        result = speed_stage(args, {"speed-1b": "llama-3.2-1b", "speed-8b": "llama-3.1-8b"}[stage])
    elif stage == "generation":
        result = generation_stage(args)
    elif stage == "cell":
        result = cell_stage(args, work)
    else:
        result = audit_stage(args, work)
    (work / f"{stage}.result.json").write_text(json.dumps(result, indent=2, default=str))
    if "error" in result:
        sys.exit(1)


class DeviceRun:
    """One prepared device command's bookkeeping, shared by this script and ``testbed.py``: ``--out`` made, ``--work``
    (default: a temporary folder, removed at the end), the report (commit, ``--tiny``, environment, and ``parts``:
    a row per stage or half) written as ``<name>.json`` and ``<name>.md`` by :meth:`save`, the seconds of
    ``--budget`` left (``--budget 0``: no budget, every part runs to its end under no limit: the suite's tests,
    whose verdicts never depend on elapsed time)."""

    def __init__(self, args: argparse.Namespace, name: str, parts: str, markdown) -> None:
        self.args, self.name, self.markdown = args, name, markdown
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.start = time.perf_counter()
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix=f"margincal-{name}-"))
        git = ["git", "-C", str(ROOT), "describe", "--always", "--dirty"]
        commit = subprocess.run(git, capture_output=True, text=True).stdout.strip() or "unknown"
        self.report: dict = {"commit": commit, "tiny": args.tiny, "env": env_stage(), parts: {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds of ``--budget`` left, less 5 for writing the report (unbounded with ``--budget 0``)."""
        return math.inf if self.args.budget == 0 else self.args.budget - self.elapsed() - 5

    def limit(self, cap: float) -> float:
        """A part's time limit: ``cap``, or what the budget has left if less (unbounded with ``--budget 0``)."""
        return math.inf if self.args.budget == 0 else min(cap, self.left())

    def save(self) -> None:
        self.report["seconds"] = round(self.elapsed(), 1)
        (self.out / f"{self.name}.json").write_text(json.dumps(self.report, indent=2, default=str) + "\n")
        (self.out / f"{self.name}.md").write_text(self.markdown(self.report))

    def close(self) -> None:
        """Remove a temporary ``--work`` and print the report."""
        if not self.args.work:
            shutil.rmtree(self.work, ignore_errors=True)
        print(self.markdown(self.report))


def run_child(cmd: list[str], limit: float, log_path: Path) -> dict:
    """``cmd`` in a process group of its own, logging to ``log_path``, killed with its children after ``limit``
    seconds (``math.inf``: never): its status, seconds and limit, and the end of its log where it did not end
    well."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=None if math.isinf(limit) else limit)
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            status = f"timed out after {limit:.0f} s"
    seconds = round(time.perf_counter() - start, 1)
    row = {"status": status, "seconds": seconds, "limit": None if math.isinf(limit) else round(limit)}
    if status != "ok":
        row["log_tail"] = log_path.read_text(errors="replace")[-4000:]
    return row


def run_stage(args: argparse.Namespace, stage: str, limit: float, work: Path) -> dict:
    """``stage`` in a child process killed after ``limit`` seconds: status, seconds, its result or log tail."""
    steps = ["--npo-steps", str(args.npo_steps), "--mc-steps", str(args.mc_steps), *(["--tiny"] * args.tiny)]
    cmd = [sys.executable, __file__, "--stage", stage, "--work", str(work), "--out", args.out, *steps]
    row = run_child(cmd, limit, work / "logs" / f"{stage}.log")
    result = work / f"{stage}.result.json"
    if result.exists():
        row["result"] = json.loads(result.read_text())
        result.unlink()
    if stage == "cell" and (work / "store").exists():
        row["store_stages"] = store_seconds(work / "store")
    return row


def _speed(row: dict) -> str:
    """One cell_speed stage in a few words: throughput (or seconds per step), MFU, peak memory."""
    rate = row.get("tokens_per_s", row.get("new_tokens_per_s"))
    words = [f"{rate:.0f} tok/s" if rate else f"{row['seconds']:.2f} s/step ({row.get('optimizer')})"]
    if row.get("mfu"):
        words.append(f"MFU {row['mfu']:.2f}")
    if row.get("peak_memory_gib"):
        words.append(f"{row['peak_memory_gib']:.1f} GiB")
    return ", ".join(words)


def markdown(report: dict) -> str:
    """The run as a Markdown table: one row per stage, then the cell's per-stage seconds."""
    env = report["env"]
    lines = [f"# GPU acceptance run: {env.get('device')}", "",
             f"torch {env.get('torch')}, transformers {env.get('transformers')}, "
             f"peft {env.get('peft')}, bitsandbytes {env.get('bitsandbytes')}; commit {report['commit']}", "",
             "| stage | status | seconds | numbers |", "|---|---|---|---|"]  # fmt: skip
    for name, row in report["stages"].items():
        result = row.get("result", {})
        if "stages" in result:  # cell_speed
            numbers = "; ".join(f"{k} {_speed(v)}" for k, v in result["stages"].items())
        elif "skipped" in result:
            numbers = result["skipped"]
        elif name == "generation":
            numbers = "; ".join(
                f"{model}: open-unlearning {r['best']['open-unlearning']:.2f} s, margincal "
                f"{r['best']['margincal']:.2f} s, {r['ratio_best']:.2f}× (medians {r['ratio_median']:.2f}×), "
                f"answers equal {r['answers_equal']}/{result['prompts']}"
                for model, r in result.get("models", {}).items()
            )
        elif name == "cell":
            steps = result.get("npo_steps", {})
            numbers = f"NPO {steps.get('run')} of {steps.get('paper')} paper steps" + (
                f"; failed: {result['error']}" if "error" in result else ""
            )
        elif name == "audit":
            numbers = (
                f"attacks {', '.join(result.get('attacks', []))}; quantized {', '.join(result.get('quantization', []))}"
            )
        else:
            numbers = ""
        lines.append(f"| {name} | {row['status']} | {row['seconds']} | {numbers} |")
    cell = report["stages"].get("cell", {})
    if cell.get("store_stages"):
        lines += ["", "Cell stages (store, in finishing order):", "", "| stage | seconds |", "|---|---|"]
        lines += [f"| {r['stage']} | {r['seconds']:.1f} |" for r in cell["store_stages"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for acceptance.json, acceptance.md and stage logs")
    parser.add_argument("--work", help="folder for checkpoints, data and the store (default: temporary, removed)")
    parser.add_argument(
        "--budget", type=float, default=190, help="wall seconds for all stages (default 190; 0: no limit)"
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny shape on the CPU (the suite's test)")
    parser.add_argument("--npo-steps", type=int, default=20, help="cap on NPO's paper schedule (default 20; 0: none)")
    parser.add_argument("--mc-steps", type=int, default=40, help="MC polish steps (default 40; the frozen MC: 80)")
    parser.add_argument("--stages", help="comma-separated stages (default: all but speed-8b; --tiny has no speed-8b)")
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        return child(args)
    limits = TINY_LIMITS if args.tiny else LIMITS
    if args.stages:
        known = limits if args.tiny else {**limits, **OPTIONAL_STAGES}
        unknown = set(args.stages.split(",")) - set(known)
        if unknown:
            parser.error(f"unknown stages {sorted(unknown)}; known: {', '.join(known)}")
        limits = {k: v for k, v in known.items() if k in args.stages.split(",")}
    run = DeviceRun(args, "acceptance", "stages", markdown)  # after the arguments are checked: nothing made before
    report = run.report
    try:
        for stage, limit in limits.items():
            left = run.left()
            if left < 20:
                report["stages"][stage] = {"status": "not run: the budget was spent", "seconds": 0, "limit": 0}
                continue
            print(f"[{run.elapsed():6.1f}s] {stage} (at most {run.limit(limit):.0f} s)", flush=True)
            report["stages"][stage] = run_stage(args, stage, run.limit(limit), run.work)
            print(f"[{run.elapsed():6.1f}s] {stage}: {report['stages'][stage]['status']}", flush=True)
            run.save()
    finally:
        run.close()


if __name__ == "__main__":
    main()
