"""Evaluation speed at a model shape: this checkout, and optionally a baseline commit measured in the same run.

    .venv/bin/python benchmarks/speed/eval_speed.py --shape 20m [--repeats 2] [--threads 2]
    .venv/bin/python benchmarks/speed/eval_speed.py --shape 100m --baseline b9495e1       # against a commit
    .venv/bin/python benchmarks/speed/eval_speed.py --shape mini --repeats 1 mini.data.n_authors=20 ...  # overrides

One full TOFU-format evaluation (``evaluate``, TOFU's evaluator: every metric, gradnorm MIA included, no reference) of a
random-weight Llama of the shape on the demo panel's mini splits (1040 scored sequences, 288 greedy answers of up
to 48 tokens; ``key=value`` demo panel overrides change them), in a fresh worker process per source tree: this
checkout and, with ``--baseline REV``, a git worktree of that commit (removed afterwards), each on ``--threads``
torch threads. The worker is this checkout's and runs on the baseline's ``src``: a commit whose API it no longer
reaches (b9495e1 and later run) stops with that tree's error. Per part it reports the best run's seconds: the
scoring passes (``score_dataset``), greedy generation (``generate_answers``), the gradnorm MIA
(``gradnorm_scores``), everything else of the evaluation, the evaluation total, and the start-up of a process
that imports what ``margincal evaluate`` imports before reading a model (best of ``--repeats`` too). Parts are timed
by wrapping those functions inside the one evaluation, so they sum to its total. With a baseline it then compares
every number of the two evaluations' results (metrics, per-sample scores, margins) and every generated answer:
equal when within ``--rtol`` relative (or 1e-9 absolute). Shapes: ``mini`` (the demo model's), ``20m``, ``100m``
(the mini tokenizer's vocabulary) and ``llama-3.2-1b`` (its real config; use ``--device cuda``). Results:
``benchmarks/results/eval_speed_<shape>_<device>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shapes import SHAPES

ROOT = Path(__file__).resolve().parents[2]
PARTS = {  # part -> (module, function name) wrapped by the worker; a name missing from a tree is not timed there
    "scoring": [("margincal.evaluation.tofu", "score_dataset")],
    "generation": [("margincal.evaluation.tofu", "generate_answers")],
    "gradnorm": [("margincal.evaluation.mia", "gradnorm_scores")],
}
STARTUP = "import margincal.cli, margincal.pipeline.stages"


def worker(args: argparse.Namespace) -> dict:
    """Runs inside the tree under test (its ``src`` on PYTHONPATH): times the evaluation and returns its result."""
    import importlib

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from margincal.config.settings import EvalSettings
    from margincal.evaluation.evaluators import evaluate
    from margincal.pipeline.cell import panel_workspace

    try:
        from margincal.core.terminal import quiet_libraries
    except ImportError:  # a baseline tree from before margincal.core.terminal (ed55049)
        from margincal.cli import _quiet_libraries as quiet_libraries

    quiet_libraries()
    torch.set_num_threads(args.threads)
    ws = panel_workspace("demo", [*args.overrides, f"store={args.store}"])[-1]  # last in every version (b9495e1: 3)
    tok = ws.tokenizer
    shape = {"vocab_size": len(tok), **SHAPES[args.shape]}
    config = LlamaConfig(
        **shape,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").eval()
    settings = EvalSettings(batch_size=args.batch_size)
    spent = {part: 0.0 for part in PARTS}

    def timed(part: str, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                spent[part] += time.perf_counter() - start

        return wrapper

    for part, targets in PARTS.items():
        for module_name, name in targets:
            module = importlib.import_module(module_name)
            if hasattr(module, name):
                setattr(module, name, timed(part, getattr(module, name)))
    runs = []
    for _ in range(args.repeats):
        spent.update(dict.fromkeys(spent, 0.0))
        start = time.perf_counter()
        result = evaluate(model, tok, ws.benchmark, ws.eval_splits, settings)
        total = time.perf_counter() - start
        runs.append({"total": total, **spent, "other": total - sum(spent.values())})
    best = min(runs, key=lambda r: r["total"])
    return {"params": sum(p.numel() for p in model.parameters()), "runs": runs, "best": best, "result": result}


def startup_seconds(src: Path, repeats: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", STARTUP], env=env, check=True)
        times.append(time.perf_counter() - start)
    return min(times)


def leaves(obj, path: str = ""):
    """(path, value) of every number and string in a nested result."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{path}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def compare(a: dict, b: dict, rtol: float) -> dict:
    """Every leaf of two evaluation results: numbers within ``rtol`` relative (1e-9 absolute), strings equal."""
    la, lb = dict(leaves(a)), dict(leaves(b))
    mismatches, worst, n = [], 0.0, 0
    for path in sorted(set(la) | set(lb)):
        x, y = la.get(path), lb.get(path)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
            if x != y:
                mismatches.append(f"{path}: {x!r} vs {y!r}")
            continue
        n += 1
        if math.isnan(x) and math.isnan(y):
            continue
        diff = abs(x - y)
        rel = diff / max(abs(x), abs(y)) if diff > 1e-9 else 0.0
        worst = max(worst, rel)
        if rel > rtol:
            mismatches.append(f"{path}: {x!r} vs {y!r} (relative {rel:.2e})")
    return {"numbers": n, "leaves": len(set(la) | set(lb)), "max_relative": worst, "mismatches": mismatches}


def run_tree(src: Path, args: argparse.Namespace, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--shape",
        args.shape,
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--repeats",
        str(args.repeats),
        "--batch-size",
        str(args.batch_size),
        "--store",
        args.store,
        "--worker-out",
        str(out),
        *args.overrides,
    ]
    subprocess.run(cmd, env=env, check=True)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="mini", choices=sorted(SHAPES))
    parser.add_argument("--baseline", help="commit to compare against (default: none, this checkout alone)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="evaluations per tree; the fastest is reported")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--store", default=str(ROOT / "runs" / "store"), help="artifact store (mini tokenizer)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/eval_speed_<shape>_<device>.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="demo panel overrides (the splits)")
    args = parser.parse_args(argv)
    if args.worker:
        Path(args.worker_out).write_text(json.dumps(worker(args)))
        return

    from margincal.core.artifacts import atomic_write_json, cpu_name, git_commit

    with tempfile.TemporaryDirectory(prefix="eval_speed_") as tmp:
        trees = {"current": ROOT / "src"}
        if args.baseline:
            tree = Path(tmp) / "baseline"
            git = ["git", "-C", str(ROOT), "worktree"]
            subprocess.run([*git, "add", "--detach", str(tree), args.baseline], check=True, capture_output=True)
            trees = {"baseline": tree / "src", **trees}
        try:
            runs = {name: run_tree(src, args, Path(tmp) / f"{name}.json") for name, src in trees.items()}
            for name, src in trees.items():
                runs[name]["best"]["startup"] = startup_seconds(src, args.repeats)
        finally:
            if args.baseline:
                subprocess.run([*git, "remove", "--force", str(tree)], check=True)
    check = compare(runs["baseline"]["result"], runs["current"]["result"], args.rtol) if args.baseline else None
    device = cpu_name() if args.device == "cpu" else args.device
    summary = {
        "shape": args.shape,
        "params": runs["current"]["params"],
        "device": device,
        "threads": args.threads,
        "baseline": args.baseline,
        "current": git_commit(),
        "repeats": args.repeats,
        "overrides": args.overrides,
        "seconds": {name: r["best"] for name, r in runs.items()},
        "runs": {name: r["runs"] for name, r in runs.items()},
        "equal_results": check,
    }
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"eval_speed_{args.shape}_{args.device}.json")
    atomic_write_json(out, summary)
    print(
        f"\n{args.shape} ({summary['params'] / 1e6:.1f}M parameters) on {device}, {args.threads} threads, "
        f"best of {args.repeats}; baseline {args.baseline or 'none'}, current {summary['current']}\n"
    )
    names = list(runs)
    head = " | ".join(f"{name} s" for name in names) + (" | speed-up" if args.baseline else "")
    print(f"| part | {head} |\n|---|{'---|' * (len(names) + bool(args.baseline))}")
    for part in ("scoring", "generation", "gradnorm", "other", "total", "startup"):
        cells = [f"{runs[name]['best'][part]:.2f}" for name in names]
        if args.baseline:
            cells.append(f"{runs['baseline']['best'][part] / runs['current']['best'][part]:.2f}x")
        print(f"| {'evaluation total' if part == 'total' else part} | {' | '.join(cells)} |")
    if check is not None:
        print(
            f"\nresults compared: {check['numbers']} numbers and {check['leaves'] - check['numbers']} other leaves, "
            f"max relative difference {check['max_relative']:.2e}, {len(check['mismatches'])} beyond rtol {args.rtol}"
        )
        for line in check["mismatches"][:20]:
            print("  ", line)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
