"""Speed of a full TOFU-format evaluation of the mini θ0: seconds per stage, tokens/s and the total.

    .venv/bin/python benchmarks/eval_speed.py [--repeats 3] [--batch-size 32] [--no-gradnorm] [key=value ...]

Stages: the scoring passes (gold, paraphrased and all perturbed answers of every split: forward only), greedy
generation (KV cache, left padding) and the per-sample gradient-norm MIA; "total" is one ``evaluate_stage`` call
(every metric of the benchmark's evaluator) as every evaluate stage of a panel cell runs it. Tokens/s counts the
scored sequence tokens (prompt + answer) for scoring and the generated tokens for generation. Uses the demo panel's
mini θ0 and splits (cached models, built on first use); ``key=value`` arguments are demo panel overrides (e.g.
``mini.data.seed=1``).
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace

import torch

from margincal.cli import _quiet_libraries
from margincal.config import EvalSettings
from margincal.data.records import encode_qa
from margincal.evaluation.mia import gradnorm_scores
from margincal.generation import generate_answers
from margincal.pipeline.cell import panel_workspace
from margincal.scoring import score_dataset
from margincal.stages import evaluate_stage


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-gradnorm", action="store_true")
    parser.add_argument("overrides", nargs="*", help="demo panel overrides (key=value)")
    args = parser.parse_args()
    _quiet_libraries()
    _, _, ws = panel_workspace("demo", args.overrides)
    tok, model, spec, splits = ws.tokenizer, ws.frozen("theta0"), ws.benchmark, ws.eval_splits
    settings = EvalSettings(batch_size=args.batch_size, gradnorm=not args.no_gradnorm)

    scored = []
    for role, records in splits.items():
        scored += encode_qa(tok, records, spec.max_length)
        if role == "holdout":  # MIA non-members: gold answers only
            continue
        if role in ("forget", "retain"):
            scored += encode_qa(tok, records, spec.max_length, "paraphrased_answer")
        scored += encode_qa(tok, [replace(r, answer=a) for r in records for a in r.perturbed_answers], spec.max_length)
    prompts = [
        e
        for name in ("forget", "retain", "real_authors", "world_facts")
        for e in encode_qa(tok, splits[name], spec.max_length)
    ]
    members = encode_qa(tok, splits["forget"] + splits["holdout"], spec.max_length)

    def generate():
        return generate_answers(model, tok, prompts, spec.max_new_tokens, args.batch_size, spec.stop)

    score_tokens = sum(len(e.prompt_ids) + len(e.answer_ids) for e in scored)
    t_score = best_of(args.repeats, lambda: score_dataset(model, scored, tok.pad_token_id, args.batch_size))
    gen_tokens = sum(len(tok(a, add_special_tokens=False)["input_ids"]) + 1 for a in generate())
    t_gen = best_of(args.repeats, generate)
    rows = [
        ("scoring (forward)", t_score, f"{len(scored)} sequences, {score_tokens / t_score:,.0f} tokens/s"),
        ("generation (greedy, KV cache)", t_gen, f"{len(prompts)} prompts, {gen_tokens / t_gen:,.0f} new tokens/s"),
    ]
    if settings.gradnorm:
        t_grad = best_of(1, lambda: gradnorm_scores(model, members, tok.pad_token_id))
        rows.append(("gradnorm MIA (1 backward/sample)", t_grad, f"{len(members) / t_grad:,.1f} samples/s"))
    total = best_of(args.repeats, lambda: evaluate_stage(model, ws, settings))
    rows.append(("total: evaluate_stage (all metrics)", total, ""))
    print(f"mini θ0 on {platform.machine()}, {torch.get_num_threads()} torch threads, best of {args.repeats}\n")
    print("| stage | seconds | throughput |\n|---|---|---|")
    for name, seconds, note in rows:
        print(f"| {name} | {seconds:.2f} | {note} |")


if __name__ == "__main__":
    main()
