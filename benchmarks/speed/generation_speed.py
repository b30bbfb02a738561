"""Greedy generation, margincal's against open-unlearning's way, on the same models and prompts in one process.

    .venv/bin/python benchmarks/speed/generation_speed.py                     # the demo's trained θ0, 5 repeats
    .venv/bin/python benchmarks/speed/generation_speed.py --model ref --max-new-tokens 200
    .venv/bin/python benchmarks/speed/generation_speed.py --model theta0 --model ref --from-panel runs/demo  # all
    .venv/bin/python benchmarks/speed/generation_speed.py --repeats 1 mini.data.n_authors=20 ...  # demo panel overrides

The prompts are the evaluation splits of the demo panel's mini (forget, holdout, retain, real authors, world facts:
what ``evaluate_tofu`` decodes), tokenised as the evaluation tokenises them. The models (``--model``, repeatable):
the demo's trained θ0 (``theta0``) or θ_ref (``ref``), built into the store on first use, or ``NAME=CHECKPOINT`` (a
directory, a store stage directory, or a LoRA adapter on the base its ``adapter_config.json`` names); ``--from-panel
DIR`` adds every checkpoint of a finished panel (its baselines and MC polishes, named as ``margincal audit
--from-panel`` names them). Trained models end their answers with EOS at their own lengths (a random-weight model
never stops early, which hides what batching does); an unlearned model may not, and runs some answers to the token
limit. Two ways, alternating, each ``--repeats`` times, on ``--threads`` torch threads and ``--device``:

* ``open-unlearning``: its TOFU evaluator's decoding (``src/evals/metrics/utils.py:eval_text_similarity`` at
  locuslab/open-unlearning d3d7cf9; configs ``eval/tofu.yaml`` and ``generation/default.yaml``): batches of 32 in
  dataset order (no sorting), left padding, ``model.generate(do_sample=False, use_cache=True)`` with the default
  dynamic KV cache, a batch running until every row has emitted EOS or ``max_new_tokens``, answers decoded with
  special tokens skipped and stripped. The one difference kept on purpose: the attention mask comes from the
  padding, where open-unlearning's collator masks every pad-token id (pad = EOS in its tokenizers would also mask a
  prompt's own EOS tokens, changing answers, not speed);
* ``margincal``: :func:`margincal.model.generation.generate_answers` at the evaluation's generation batch size.

Per model it reports each way's best and median seconds, their ratio (open-unlearning / margincal, best and
median), whether every answer is the same string, and the work each way does in token passes (one token through
the model): with L_i the generated length of answer i (up to and including its EOS, at most ``max_new_tokens``),
open-unlearning's batch b of n_b rows padded to P_b prompt tokens costs n_b · (P_b + max_{i∈b} L_i − 1), margincal's
(batches in increasing prompt length, a row leaving at its EOS) n_b · P_b + Σ_{i∈b} (L_i − 1). Results:
``benchmarks/results/generation_speed_<device>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPEN_UNLEARNING_BATCH = 32  # configs/eval/tofu.yaml: batch_size
DEMO_MODELS = {"theta0": "theta0", "ref": "ref"}  # --model name -> the demo workspace's frozen model


def open_unlearning_answers(model, tokenizer, examples, max_new_tokens: int) -> tuple[list[str], list[int]]:
    """open-unlearning's TOFU decoding (module docstring): dataset-order batches of 32, left padding, dynamic cache.
    Returns the answers and each one's generated length L_i (through its first EOS, at most ``max_new_tokens``)."""
    import torch

    from margincal.data.records import padded

    device = next(model.parameters()).device
    answers, lengths = [], []
    with torch.no_grad():
        for start in range(0, len(examples), OPEN_UNLEARNING_BATCH):
            batch = examples[start : start + OPEN_UNLEARNING_BATCH]
            ids, attn = padded([e.generation_prompt for e in batch], tokenizer.pad_token_id, left=True)
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=attn.to(device),
                do_sample=False,
                top_p=None,
                temperature=None,
                max_new_tokens=max_new_tokens,
                use_cache=True,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new = out[:, ids.size(1) :].cpu()
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            answers += [t.strip() for t in texts]
            ended = (new == tokenizer.eos_token_id).int()
            lengths += [int(row.argmax()) + 1 if row.any() else new.size(1) for row in ended]
    return answers, lengths


def token_passes(prompts: list[int], lengths: list[int], batch: int) -> dict[str, int]:
    """Token passes of each way (module docstring) from prompt lengths and generated lengths L_i."""
    ou = 0
    for start in range(0, len(prompts), OPEN_UNLEARNING_BATCH):
        rows = range(start, min(start + OPEN_UNLEARNING_BATCH, len(prompts)))
        ou += len(rows) * (max(prompts[i] for i in rows) + max(lengths[i] for i in rows) - 1)
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    mc = 0
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        mc += len(rows) * max(prompts[i] for i in rows) + sum(lengths[i] - 1 for i in rows)
    return {"open-unlearning": ou, "margincal": mc}


def models_to_measure(args: argparse.Namespace) -> list[str]:
    """``--model`` values then ``--from-panel``'s ``NAME=CHECKPOINT`` entries, each name once."""
    wanted = list(args.model or ["theta0"])
    if args.from_panel:
        from margincal.cli.commands import panel_checkpoints

        wanted += panel_checkpoints(Path(args.from_panel))
    names = [m.partition("=")[0] for m in wanted]
    if len(set(names)) != len(names):
        raise SystemExit(f"generation_speed: a model name is given twice: {names}")
    for m in wanted:
        if m not in DEMO_MODELS and "=" not in m:
            raise SystemExit(f"generation_speed: --model {m}: give theta0, ref or NAME=CHECKPOINT")
    return wanted


def load(ws, spec: str, device: str):
    """The model of one ``--model`` value, in evaluation mode on ``device``."""
    from margincal.auditing.plan import checkpoint

    if spec in DEMO_MODELS:
        return ws.frozen(DEMO_MODELS[spec]).to(device).eval()
    name, _, path = spec.partition("=")
    return checkpoint(path, name=name, identify=False).load("float32", device).eval()


def compare(model, tok, examples, new_tokens: int, batch: int, repeats: int, device: str) -> dict:
    """Both ways on one model, alternating, ``repeats`` times each: seconds, ratios, answers and token passes."""
    import torch

    from margincal.model.generation import generate_answers

    def timed(run):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        if device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    ways = {
        "open-unlearning": lambda: open_unlearning_answers(model, tok, examples, new_tokens),
        "margincal": lambda: generate_answers(model, tok, examples, new_tokens, batch),
    }
    seconds = {name: [] for name in ways}
    answers = {}
    for _ in range(repeats):
        for name, run in ways.items():
            took, answers[name] = timed(run)
            seconds[name].append(took)
    (ou_answers, lengths), mc_answers = answers["open-unlearning"], answers["margincal"]
    ou, mc = seconds["open-unlearning"], seconds["margincal"]
    pairs = list(zip(ou_answers, mc_answers, strict=True))
    return {
        "seconds": seconds,
        "best": {"open-unlearning": min(ou), "margincal": min(mc)},
        "median": {"open-unlearning": statistics.median(ou), "margincal": statistics.median(mc)},
        "ratio_best": min(ou) / min(mc),
        "ratio_median": statistics.median(ou) / statistics.median(mc),
        "answers_equal": sum(a == b for a, b in pairs),
        "answers_differ": [{"open-unlearning": a, "margincal": b} for a, b in pairs if a != b][:10],
        "generated_tokens": {"mean": statistics.mean(lengths), "max": max(lengths)},
        "at_token_limit": sum(n == new_tokens for n in lengths),
        "token_passes": token_passes([len(e.generation_prompt) for e in examples], lengths, batch),
    }


def measure(args: argparse.Namespace) -> dict:
    import torch

    from margincal.config.settings import EvalSettings
    from margincal.core.artifacts import cpu_name
    from margincal.core.terminal import quiet_libraries
    from margincal.data.records import encode_qa
    from margincal.pipeline.cell import panel_workspace

    quiet_libraries()
    torch.set_num_threads(args.threads)
    wanted = models_to_measure(args)
    ws = panel_workspace("demo", [*args.overrides, f"store={args.store}"])[-1]
    tok, spec = ws.tokenizer, ws.benchmark
    examples = [e for records in ws.eval_splits.values() for e in encode_qa(tok, records, spec.max_length)]
    new_tokens = args.max_new_tokens or spec.max_new_tokens
    batch = EvalSettings().generation_batch_size
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({cpu_name()})"
    models = {}
    for spec_ in wanted:
        model = load(ws, spec_, args.device)
        models[spec_.partition("=")[0]] = compare(model, tok, examples, new_tokens, batch, args.repeats, args.device)
        del model
    return {
        "cpu": cpu_name(),
        "device": device,
        "threads": args.threads,
        "torch": torch.__version__,
        "prompts": len(examples),
        "splits": {name: len(records) for name, records in ws.eval_splits.items()},
        "max_new_tokens": new_tokens,
        "batch": {"open-unlearning": OPEN_UNLEARNING_BATCH, "margincal": batch},
        "repeats": args.repeats,
        "models": models,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", action="append", metavar="theta0|ref|NAME=CHECKPOINT", help="a model to measure (repeatable)"
    )
    parser.add_argument("--from-panel", metavar="DIR", help="also every checkpoint of this finished panel")
    parser.add_argument("--max-new-tokens", type=int, help="default: the benchmark's (the mini's: 48)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--store", default=str(ROOT / "runs" / "store"), help="where the demo's models are stored")
    parser.add_argument("--out", help="result JSON (default benchmarks/results/generation_speed_<device>.json)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="demo panel overrides")
    args = parser.parse_args(argv)
    result = measure(args)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"generation_speed_{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as handle:
        json.dump(result, handle, indent=1)
    Path(handle.name).replace(out)
    print(
        f"{result['prompts']} prompts, ≤{result['max_new_tokens']} new tokens, {result['device']}, "
        f"{result['threads']} threads, best of {args.repeats}:"
    )
    for name, r in result["models"].items():
        best, med, work = r["best"], r["median"], r["token_passes"]
        print(
            f"  {name}: open-unlearning {best['open-unlearning']:.2f} s, margincal {best['margincal']:.2f} s: "
            f"{r['ratio_best']:.2f}× (medians {med['open-unlearning']:.2f} / {med['margincal']:.2f} s: "
            f"{r['ratio_median']:.2f}×); token passes {work['open-unlearning']} / {work['margincal']} "
            f"({work['open-unlearning'] / work['margincal']:.2f}×); {r['at_token_limit']} answers at the limit; "
            f"answers equal {r['answers_equal']}/{result['prompts']}"
        )


if __name__ == "__main__":
    main()
