"""Time the stages of one panel cell on a random-weight model of a real shape (no download).

    python benchmarks/speed/cell_speed.py --shape mini                         # CPU, seconds
    python benchmarks/speed/cell_speed.py --shape llama-3.2-1b --device cuda   # GPU, bf16
    python benchmarks/speed/cell_speed.py --shape llama-3.1-8b --device cuda --fpft-memory

Each stage runs margincal's own code on synthetic token ids of the benchmark's lengths:

* ``eval``: :func:`margincal.model.scoring.score_dataset` (the one scoring pass every probability metric reads);
* ``generate``: :func:`margincal.model.generation.generate_answers` (batched, left-padded, KV cache) for a fixed number
  of new tokens;
* ``polish``: MC polish steps of :func:`margincal.mc.polish.polish` on an NPO base (native NPO + hinge + KL probe,
  LoRA r = 32, single-sample steps as the frozen configuration);
* ``attack``: K20-LoRA relearn steps (:func:`margincal.training.attacks.lora_relearn`, batch 10);
* ``fpft`` (``--fpft-memory``): full-parameter attack steps with the chosen optimizer and activation checkpointing,
  with peak GPU memory.

Reported per stage: seconds per step (or per pass), tokens/s and model-FLOPs utilisation, where FLOPs are counted by
``torch.utils.flop_counter.FlopCounterMode`` on one step (the matmuls and attention the step executes) and divided by
the step time and the device's dense peak (bf16 tensor-core peak for known GPUs; on other devices the measured
throughput of a large matmul, reported as ``of_matmul_peak``), and the stage's peak memory (``peak_memory_gib``:
allocated GPU memory, or on a Linux CPU the process's peak resident set within the stage; ``--stages polish,attack``
skips the evaluation and generation stages). The anchor model shares the policy's weights (timing
only: the anchor forward costs the same). Results go to ``benchmarks/results/cell_speed_<shape>_<device>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from shapes import MINI_VOCAB, SHAPES
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from margincal.core.artifacts import cpu_name
from margincal.data.records import EncodedQA

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets.
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "GB10": 500e12}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_model(shape: str, dtype: torch.dtype, device: str, attn: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from margincal.model.loading import attention_backend

    config = LlamaConfig(
        **{"vocab_size": MINI_VOCAB, **SHAPES[shape]},
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attention_backend(attn, dtype, device)
        )
    return model.eval()


def examples(n: int, prompt: int, answer: int, vocab: int, seed: int) -> list[EncodedQA]:
    rng = random.Random(seed)
    ids = lambda k: [rng.randrange(3, vocab) for _ in range(k)]  # noqa: E731
    return [EncodedQA(index=i, prompt_ids=ids(prompt), answer_ids=ids(answer)) for i in range(n)]


def peak_flops(device: str, dtype: torch.dtype) -> tuple[float | None, float]:
    """(data-sheet peak or None, measured large-matmul throughput) in FLOP/s."""
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    sheet = next((v for k, v in PEAKS.items() if k in name), None) if device.startswith("cuda") else None
    n = 8192 if device.startswith("cuda") else 1024
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    sync(device)
    reps = 20 if device.startswith("cuda") else 5
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return sheet, 2 * n**3 * reps / (time.perf_counter() - start)


def _query_heads(query_shape: tuple, *shapes: tuple) -> list[tuple]:
    """Key/value shapes with the query's head count: a grouped-query kernel broadcasts each key/value head to its
    group, so attention costs what it costs with as many key/value heads as query heads."""
    return [(shape[0], query_shape[1], *shape[2:]) for shape in shapes]


def gqa_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Forward attention FLOPs, 2·2·b·h_q·s_q·s_k·d (QKᵀ and PV), with grouped-query key/value (torch < 2.13's formula
    refuses them: the GPU machine's torch 2.11 failed the 1B shape's 32 query / 8 key-value heads)."""
    return sdpa_flop_count(query_shape, *_query_heads(query_shape, key_shape, value_shape))


def gqa_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    """Backward attention FLOPs (torch's five-matmul count) with grouped-query key/value, as ``gqa_sdpa_flops``."""
    return sdpa_backward_flop_count(grad_out_shape, query_shape, *_query_heads(query_shape, key_shape, value_shape))


_ATEN = torch.ops.aten
GQA_FORMULAS = {
    **dict.fromkeys((_ATEN._scaled_dot_product_efficient_attention, _ATEN._scaled_dot_product_flash_attention,
                     _ATEN._scaled_dot_product_cudnn_attention), gqa_sdpa_flops),
    **dict.fromkeys((_ATEN._scaled_dot_product_efficient_attention_backward,
                     _ATEN._scaled_dot_product_flash_attention_backward,
                     _ATEN._scaled_dot_product_cudnn_attention_backward), gqa_sdpa_backward_flops),
}  # fmt: skip


def count_flops(fn) -> float:
    """FLOPs ``fn`` executes, by torch's counter with grouped-query attention counted (``GQA_FORMULAS``)."""
    with FlopCounterMode(display=False, custom_mapping=GQA_FORMULAS) as counter:
        fn()
    return float(counter.get_total_flops())


class StepTimer:
    """A training-loop hook that records a synchronised timestamp after every step."""

    def __init__(self, device: str):
        self.device, self.times = device, []

    def __call__(self, step: int, model) -> dict:
        sync(self.device)
        self.times.append(time.perf_counter())
        return {}

    def per_step(self, n: int) -> float:
        """Mean duration of the last ``n`` steps (earlier ones are warm-up)."""
        gaps = [b - a for a, b in zip(self.times, self.times[1:], strict=False)][-n:]
        if len(gaps) < n:
            raise RuntimeError(f"only {len(gaps)} timed steps, {n} requested")
        return sum(gaps) / n


def stage_row(seconds: float, tokens: int, flops: float, peaks: tuple[float | None, float]) -> dict:
    sheet, measured = peaks
    achieved = flops / seconds
    return {
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tflops_per_s": achieved / 1e12,
        "mfu": achieved / sheet if sheet else None,
        "of_matmul_peak": achieved / measured,
    }


def reset_peak_memory(device: str) -> None:
    """Start a new peak-memory window: CUDA's allocator peak, or on Linux the process's peak RSS (``VmHWM``, reset by
    writing 5 to ``/proc/self/clear_refs``)."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    elif Path("/proc/self/clear_refs").exists():
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_gib(device: str) -> float | None:
    """Peak memory since :func:`reset_peak_memory`: allocated GPU memory, or the process's resident set on CPU."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    line = next(x for x in status.read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 2**20  # kB → GiB


def run(args: argparse.Namespace, save=lambda result: None) -> dict:
    """All stages; ``save(result)`` runs after each one, so a stage that fails (e.g. out of memory) keeps the
    earlier numbers."""
    from margincal.config.settings import AttackConfig, LoraSpec, MCConfig, TrainConfig
    from margincal.mc.loss import anchor_tables
    from margincal.mc.polish import mc_objective, polish, polish_input
    from margincal.methods.base import get_method
    from margincal.model.generation import generate_answers
    from margincal.model.scoring import score_dataset
    from margincal.training.attacks import lora_relearn
    from margincal.training.loop import nll_objective, train

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {
        "auto": torch.bfloat16 if device.startswith("cuda") else torch.float32,
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
    }[args.dtype]
    model = build_model(args.shape, dtype, device, args.attn)
    vocab = model.config.vocab_size
    n_params = sum(p.numel() for p in model.parameters())
    peaks = peak_flops(device, dtype)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=None, batch_decode=lambda ids, **_: [""] * len(ids))
    prompt, answer = args.prompt_len, args.answer_len
    out: dict = {
        "shape": args.shape,
        "params": n_params,
        "device": torch.cuda.get_device_name()
        if device.startswith("cuda")
        else f"cpu ({cpu_name()}, {torch.get_num_threads()} threads)",
        "dtype": str(dtype).removeprefix("torch."),
        "attn": model.config._attn_implementation,
        "prompt_len": prompt,
        "answer_len": answer,
        "peak_flops_sheet": peaks[0],
        "matmul_flops_measured": peaks[1],
        "torch": torch.__version__,
        "stages": {},
    }
    stages = out["stages"]

    out["model_memory_gib"] = peak_memory_gib(device)

    # evaluation pass: every probability metric of a split reads one score_dataset call
    wanted = set(args.stages.split(","))
    data = examples(args.eval_n, prompt, answer, vocab, 0)
    if "eval" in wanted:
        reset_peak_memory(device)
        score_dataset(model, data[: args.eval_batch], 0, args.eval_batch)
        flops = count_flops(lambda: score_dataset(model, data[: args.eval_batch], 0, args.eval_batch))
        sync(device)
        start = time.perf_counter()
        score_dataset(model, data, 0, args.eval_batch)
        sync(device)
        seconds = time.perf_counter() - start
        row = stage_row(seconds, len(data) * (prompt + answer), flops * len(data) / args.eval_batch, peaks)
        stages["eval"] = {**row, "n": len(data), "batch": args.eval_batch, "peak_memory_gib": peak_memory_gib(device)}
        save(out)

    # greedy generation with the KV cache (new tokens/s; FLOP utilisation is not the point of decoding)
    if "generate" in wanted:
        reset_peak_memory(device)
        gen = examples(args.gen_batch, prompt, 0, vocab, 1)
        generate_answers(model, tok, gen, 4, args.gen_batch)
        sync(device)
        start = time.perf_counter()
        generate_answers(model, tok, gen, args.gen_tokens, args.gen_batch)
        sync(device)
        seconds = time.perf_counter() - start
        stages["generate"] = {
            "seconds": seconds,
            "new_tokens_per_s": args.gen_batch * args.gen_tokens / seconds,
            "batch": args.gen_batch,
            "new_tokens": args.gen_tokens,
            "peak_memory_gib": peak_memory_gib(device),
        }
        save(out)

    # MC polish on an NPO base: frozen configuration (LoRA r = 32, single-sample forget/retain/probe steps)
    reset_peak_memory(device)
    forget, retain = examples(64, prompt, answer, vocab, 2), examples(64, prompt, answer, vocab, 3)
    probe = examples(64, prompt, args.probe_answer_len, vocab, 4)
    method = get_method("NPO")
    method.prepare(model, forget, tok)
    steps = args.warmup + args.steps + 1  # the hook stamps the end of every step: n + 1 stamps time n steps
    mc = MCConfig(n_pool=64, check_every=1)
    mc = dataclasses.replace(mc, train=dataclasses.replace(mc.train, steps=steps))
    timer = StepTimer(device)
    with tempfile.TemporaryDirectory() as cache:
        inp = polish_input(method, mc, {"ref": (model, "bench")}, forget, retain, probe, 0, Path(cache))
        polished, _ = polish(model, dataclasses.replace(inp, hook=timer), merge=False)
    seconds = timer.per_step(args.steps)
    objective = mc_objective(method, model, anchor_tables(model, "count", forget[:1], 0, None), mc)
    flops = count_flops(lambda: _polish_step(polished, objective, forget, retain, probe))
    polish_tokens = 2 * (prompt + answer) + prompt + args.probe_answer_len
    stages["polish"] = {
        **stage_row(seconds, polish_tokens, flops, peaks),
        "steps_timed": args.steps,
        "peak_memory_gib": peak_memory_gib(device),
    }
    save(out)
    polished = objective = None  # free the polished copy before the attacks

    # K20-LoRA relearn steps (batch 10)
    reset_peak_memory(device)
    d_rel = examples(20, prompt, answer, vocab, 5)
    cfg = AttackConfig(
        k=20, train=TrainConfig(steps=steps, batch_size=10, lr=1e-4, scheduler="constant", lora=LoraSpec(r=8, alpha=16))
    )
    timer = StepTimer(device)
    attacked = lora_relearn(model, d_rel, cfg, tok, hook=timer)
    del attacked
    seconds = timer.per_step(args.steps)
    flops = count_flops(lambda: _lora_step(model, d_rel, cfg))
    stages["attack_lora"] = {
        **stage_row(seconds, 10 * (prompt + answer), flops, peaks),
        "batch": 10,
        "peak_memory_gib": peak_memory_gib(device),
    }
    save(out)

    if args.fpft_memory:
        reset_peak_memory(device)
        for p in model.parameters():
            p.requires_grad_(True)
        optimizer = args.fpft_optimizer
        if optimizer == "auto":
            optimizer = "paged_adamw_8bit" if device.startswith("cuda") else "adamw"
        tc = TrainConfig(
            steps=steps, batch_size=10, lr=1e-5, scheduler="constant", optimizer=optimizer, gradient_checkpointing=True
        )
        from margincal.data.records import cycle

        timer = StepTimer(device)
        train(model, nll_objective, cycle(d_rel, 10, 0, 0), tc, "fpft", hook=timer, hook_every=1)
        row = {
            "seconds": timer.per_step(args.steps),
            "optimizer": optimizer,
            "gradient_checkpointing": True,
            "peak_memory_gib": peak_memory_gib(device),
        }
        stages["attack_fpft"] = row
    return out


def _polish_step(policy, objective, forget, retain, probe) -> None:
    """One forward/backward of the MC objective (FLOP counting), as a training step runs it."""
    from margincal.data.records import collate

    batch = {"forget": collate(forget[:1], 0), "retain": collate(retain[:1], 0), "probe": collate(probe[:1], 0)}
    loss, _ = objective(policy, batch)
    loss.backward()
    policy.zero_grad(set_to_none=True)


def _lora_step(model, d_rel, cfg) -> None:
    """One forward/backward of the K20-LoRA attack (FLOP counting)."""
    from margincal.data.records import collate
    from margincal.model.loading import clone_model
    from margincal.training.loop import attach_lora, nll_objective

    net = attach_lora(clone_model(model), cfg.train.lora)
    loss, _ = nll_objective(net, collate(d_rel[:10], 0))
    loss.backward()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="mini", choices=sorted(SHAPES))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--attn", default="auto", help="attention backend (auto: flash_attention_2 or sdpa)")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (Llama-3 chat prompt of a TOFU Q)")
    parser.add_argument("--answer-len", type=int, default=48, help="answer tokens (a TOFU answer)")
    parser.add_argument("--probe-answer-len", type=int, default=128, help="answer tokens of an Alpaca probe example")
    parser.add_argument("--eval-n", type=int, default=256)
    parser.add_argument("--eval-batch", type=int, default=32)
    parser.add_argument("--gen-batch", type=int, default=32)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per training stage")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--fpft-memory", action="store_true", help="also time full-parameter attack steps")
    parser.add_argument("--stages", default="eval,generate", help="optional stages before polish and attack")
    parser.add_argument("--fpft-optimizer", default="auto", help="auto: paged_adamw_8bit on CUDA, else adamw")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    tag = "cuda" if args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    out = Path(args.out or Path(__file__).parents[1] / "results" / f"cell_speed_{args.shape}_{tag}.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(result: dict) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(out)

    result = run(args, save)
    save(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
