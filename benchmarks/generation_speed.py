"""Greedy generation, margincal's against open-unlearning's way, on the same model and prompts in one process.

    .venv/bin/python benchmarks/generation_speed.py                     # the demo's trained θ0, 5 repeats
    .venv/bin/python benchmarks/generation_speed.py --model ref --max-new-tokens 200
    .venv/bin/python benchmarks/generation_speed.py --repeats 1 mini.data.n_authors=20 ...  # demo panel overrides

The prompts are the evaluation splits of the demo panel's mini (forget, holdout, retain, real authors, world facts:
what ``evaluate_tofu`` decodes), tokenised as the evaluation tokenises them. The model is the demo's trained θ0 or
θ_ref (``--model``; built into the store on first use), whose answers end with EOS at their own lengths, as a real
model's do (a random-weight model never stops early, which hides what batching does). Two ways, alternating, each
``--repeats`` times, on ``--threads`` torch threads:

* ``open-unlearning``: its TOFU evaluator's decoding (``src/evals/metrics/utils.py:eval_text_similarity`` at
  locuslab/open-unlearning d3d7cf9; configs ``eval/tofu.yaml`` and ``generation/default.yaml``): batches of 32 in
  dataset order (no sorting), left padding, ``model.generate(do_sample=False, use_cache=True)`` with the default
  dynamic KV cache, a batch running until every row has emitted EOS or ``max_new_tokens``, answers decoded with
  special tokens skipped and stripped. The one difference kept on purpose: the attention mask comes from the
  padding, where open-unlearning's collator masks every pad-token id (pad = EOS in its tokenizers would also mask a
  prompt's own EOS tokens, changing answers, not speed);
* ``margincal``: :func:`margincal.generation.generate_answers` at the evaluation's generation batch size.

It reports each way's best and median seconds, their ratio (open-unlearning / margincal, best and median) and
whether every answer is the same string. Results: ``benchmarks/results/generation_speed_<model>_cpu.json``
(or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPEN_UNLEARNING_BATCH = 32  # configs/eval/tofu.yaml: batch_size


def open_unlearning_answers(model, tokenizer, examples, max_new_tokens: int) -> list[str]:
    """open-unlearning's TOFU decoding (module docstring): dataset-order batches of 32, left padding, dynamic cache."""
    import torch

    from margincal.data.records import padded

    answers = []
    with torch.no_grad():
        for start in range(0, len(examples), OPEN_UNLEARNING_BATCH):
            batch = examples[start : start + OPEN_UNLEARNING_BATCH]
            ids, attn = padded([e.generation_prompt for e in batch], tokenizer.pad_token_id, left=True)
            out = model.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=False,
                top_p=None,
                temperature=None,
                max_new_tokens=max_new_tokens,
                use_cache=True,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(out[:, ids.size(1) :], skip_special_tokens=True)
            answers += [t.strip() for t in texts]
    return answers


def measure(args: argparse.Namespace) -> dict:
    import torch

    from margincal.artifacts import cpu_name
    from margincal.config import EvalSettings
    from margincal.data.records import encode_qa
    from margincal.generation import generate_answers
    from margincal.pipeline.cell import panel_workspace
    from margincal.terminal import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(args.threads)
    ws = panel_workspace("demo", [*args.overrides, f"store={args.store}"])[-1]
    model = ws.frozen({"theta0": "theta0", "ref": "ref"}[args.model]).eval()
    tok, spec = ws.tokenizer, ws.benchmark
    examples = [e for records in ws.eval_splits.values() for e in encode_qa(tok, records, spec.max_length)]
    new_tokens = args.max_new_tokens or spec.max_new_tokens
    batch = EvalSettings().generation_batch_size
    ways = {
        "open-unlearning": lambda: open_unlearning_answers(model, tok, examples, new_tokens),
        "margincal": lambda: generate_answers(model, tok, examples, new_tokens, batch),
    }
    seconds = {name: [] for name in ways}
    answers = {}
    for _ in range(args.repeats):
        for name, run in ways.items():
            start = time.perf_counter()
            answers[name] = run()
            seconds[name].append(time.perf_counter() - start)
    ou, mc = seconds["open-unlearning"], seconds["margincal"]
    same = sum(a == b for a, b in zip(answers["open-unlearning"], answers["margincal"], strict=True))
    return {
        "model": args.model,
        "cpu": cpu_name(),
        "threads": args.threads,
        "torch": torch.__version__,
        "prompts": len(examples),
        "splits": {name: len(records) for name, records in ws.eval_splits.items()},
        "max_new_tokens": new_tokens,
        "batch": {"open-unlearning": OPEN_UNLEARNING_BATCH, "margincal": batch},
        "seconds": seconds,
        "best": {"open-unlearning": min(ou), "margincal": min(mc)},
        "median": {"open-unlearning": statistics.median(ou), "margincal": statistics.median(mc)},
        "ratio_best": min(ou) / min(mc),
        "ratio_median": statistics.median(ou) / statistics.median(mc),
        "answers_equal": same,
        "answers_differ": [
            {"open-unlearning": a, "margincal": b}
            for a, b in zip(answers["open-unlearning"], answers["margincal"], strict=True)
            if a != b
        ][:10],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["theta0", "ref"], default="theta0", help="the demo's θ0 or θ_ref")
    parser.add_argument("--max-new-tokens", type=int, help="default: the benchmark's (open-unlearning's TOFU: 200)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--store", default=str(ROOT / "runs" / "store"), help="where the demo's models are stored")
    parser.add_argument("--out", help="result JSON (default benchmarks/results/generation_speed_<model>_cpu.json)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="demo panel overrides")
    args = parser.parse_args(argv)
    result = measure(args)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"generation_speed_{args.model}_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as handle:
        json.dump(result, handle, indent=1)
    Path(handle.name).replace(out)
    best, med = result["best"], result["median"]
    print(
        f"{result['prompts']} prompts, ≤{result['max_new_tokens']} new tokens, {result['cpu']}, "
        f"{result['threads']} threads: open-unlearning {best['open-unlearning']:.2f} s, margincal "
        f"{best['margincal']:.2f} s (best of {args.repeats}): {result['ratio_best']:.2f}× "
        f"(medians {med['open-unlearning']:.2f} / {med['margincal']:.2f} s: {result['ratio_median']:.2f}×); "
        f"answers equal {result['answers_equal']}/{result['prompts']}"
    )


if __name__ == "__main__":
    main()
