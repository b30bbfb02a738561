"""The evaluation's batched paths (per-sample gradient norms in one backward, length-sorted scoring, generation of
several splits at once) against the straightforward ones: the same numbers to 1e-5 relative."""

import collections
import copy
import dataclasses

import pytest
import torch
from conftest import TINY, load_benchmark
from transformers import AutoModelForCausalLM, LlamaConfig

from margincal.config.settings import EvalSettings
from margincal.data.records import batches, collate, padded
from margincal.evaluation import mia
from margincal.evaluation import tofu as tofu_eval
from margincal.evaluation.evaluators import evaluate
from margincal.mini.models import new_mini_model
from margincal.model.generation import generate_answers
from margincal.model.persample import Unsupported, per_sample_grad_norms
from margincal.model.scoring import answer_token_stats, concat_stats, score_dataset


def eval_speed():
    return load_benchmark("speed/eval_speed")


def assert_same_stats(got, want, rtol: float = 1e-5) -> None:
    """Every token statistic of ``got`` equals ``want``'s (rows in the same order)."""
    assert torch.equal(got.mask, want.mask) and torch.equal(got.index, want.index)
    for field in ("gold", "competitor", "entropy", "logp_sq"):
        assert torch.allclose(getattr(got, field), getattr(want, field), rtol=rtol, atol=1e-6), field


def per_sample_reference(model, examples, pad_id) -> torch.Tensor:
    """open-unlearning's way: one backward per sample, mean of the per-tensor gradient norms."""
    return torch.tensor([float(mia._per_sample_norms(model, collate([e], pad_id))[0].mean()) for e in examples])


def untied_with_biases(tokenizer):
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def with_lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "down_proj"], init_lora_weights=False))
    return lora


@pytest.mark.parametrize("build", ["tied", "untied_biases", "lora"])
def test_batched_gradnorm_equals_one_backward_per_sample(build, tiny_model, tiny_tokenizer, tiny_examples):
    model = {
        "tied": lambda: tiny_model,
        "untied_biases": lambda: untied_with_biases(tiny_tokenizer),
        "lora": lambda: with_lora(tiny_model),
    }[build]()
    pad = tiny_tokenizer.pad_token_id
    scores, stats = mia.gradnorm_scores(model, tiny_examples, pad, batch_size=3)
    assert all(p.grad is None for p in model.parameters())
    assert torch.allclose(scores, per_sample_reference(model, tiny_examples, pad), rtol=1e-5, atol=0)
    assert_same_stats(stats, score_dataset(model, tiny_examples, pad))
    trainable = sum(p.requires_grad for p in model.parameters())
    norms = per_sample_grad_norms(model, collate(tiny_examples, pad), mia._KeepStats())
    assert norms.shape == (len(tiny_examples), trainable)


def test_shared_linear_weight_falls_back_to_per_sample_backward(tiny_model, tiny_tokenizer, tiny_examples):
    layers = tiny_model.model.layers
    layers[1].mlp.up_proj.weight = layers[0].mlp.up_proj.weight
    pad = tiny_tokenizer.pad_token_id
    with pytest.raises(Unsupported, match="shared"):
        per_sample_grad_norms(tiny_model, collate(tiny_examples, pad), mia._KeepStats())
    scores, stats = mia.gradnorm_scores(tiny_model, tiny_examples, pad)
    assert torch.equal(scores, per_sample_reference(tiny_model, tiny_examples, pad))
    assert_same_stats(stats, score_dataset(tiny_model, tiny_examples, pad))


def test_gradnorm_is_zero_without_trainable_parameters(tiny_model, tiny_tokenizer, tiny_examples):
    for p in tiny_model.parameters():
        p.requires_grad_(False)
    scores, stats = mia.gradnorm_scores(tiny_model, tiny_examples, tiny_tokenizer.pad_token_id)
    assert torch.equal(scores, torch.zeros(4))
    assert_same_stats(stats, score_dataset(tiny_model, tiny_examples, tiny_tokenizer.pad_token_id))


def unsorted_scores(model, examples, pad_id, batch_size=32):
    """The scoring pass before length sorting: batches in the given order."""
    model.eval()
    with torch.no_grad():
        return concat_stats(
            [answer_token_stats(model, b).materialized() for b in batches(examples, batch_size, pad_id)]
        )


def test_sorted_scoring_keeps_the_order_and_the_values(tiny_model, tiny_tokenizer, tiny_examples):
    examples = [tiny_examples[i] for i in (2, 0, 3, 1, 0)]  # mixed lengths, one repeated
    pad = tiny_tokenizer.pad_token_id
    got, want = score_dataset(tiny_model, examples, pad, batch_size=2), unsorted_scores(tiny_model, examples, pad, 2)
    assert torch.equal(got.index, want.index) and torch.equal(got.mask, want.mask)
    for field in ("gold", "competitor", "entropy", "logp_sq"):
        assert torch.allclose(getattr(got, field), getattr(want, field), rtol=1e-5, atol=1e-6)


def one_at_a_time(model, tokenizer, examples, max_new_tokens, batch_size=32, stop=()):
    return [generate_answers(model, tokenizer, [e], max_new_tokens, 1, stop)[0] for e in examples]


def test_the_evaluation_equals_its_straightforward_paths(smoke_mini, monkeypatch):
    """Every number and string of a full evaluation of θ0 (every metric, on the first 12 records of each smoke mini
    split, in batches of 4): batched paths vs per-sample gradients, unsorted scoring batches and one prompt at a
    time in generation."""
    from margincal.pipeline.cell import workspace
    from margincal.pipeline.panel import expand_cells
    from margincal.pipeline.plan import plan_cell

    ws = workspace(plan_cell(smoke_mini.cfg, expand_cells(smoke_mini.cfg)[0]))
    model, settings = ws.frozen("theta0"), EvalSettings(batch_size=4)
    splits = {name: records[:12] for name, records in ws.eval_splits.items()}
    fast = evaluate(model, ws.tokenizer, ws.benchmark, splits, settings)

    def unsupported(*args, **kwargs):
        raise Unsupported("reference path")

    monkeypatch.setattr(mia, "per_sample_grad_norms", unsupported)
    monkeypatch.setattr(tofu_eval, "score_dataset", unsorted_scores)
    monkeypatch.setattr(tofu_eval, "generate_answers", one_at_a_time)
    slow = evaluate(model, ws.tokenizer, ws.benchmark, splits, settings)
    a, b = dict(eval_speed().leaves(fast)), dict(eval_speed().leaves(slow))
    assert a.keys() == b.keys() and len(a) > 300
    for path, x in a.items():
        y = b[path]
        if isinstance(x, float):
            assert x == pytest.approx(y, rel=1e-5, abs=1e-9), path
        else:
            assert x == y, path


def test_eval_speed_compare_flags_numbers_beyond_rtol_and_changed_strings():
    es = eval_speed()
    a = {"summary": {"m": 1.0, "n": 3, "ok": True}, "samples": [{"generated": "x", "rouge_l": 0.5}]}
    b = {"summary": {"m": 1.0 + 2e-6, "n": 3, "ok": True}, "samples": [{"generated": "x", "rouge_l": 0.5}]}
    same = es.compare(a, b, rtol=1e-5)
    assert same["mismatches"] == [] and same["numbers"] == 3 and same["max_relative"] == pytest.approx(2e-6, rel=1e-3)
    b["summary"]["m"], b["samples"][0]["generated"] = 1.1, "y"
    assert [m.split(":")[0] for m in es.compare(a, b, rtol=1e-5)["mismatches"]] == [
        "/samples[0]/generated",
        "/summary/m",
    ]


def test_a_reference_on_other_data_stops_before_any_forward_pass(tiny_model, tiny_tokenizer, monkeypatch):
    from conftest import RECORDS

    from margincal.config.settings import resolve_benchmark

    def no_forward(*args, **kwargs):
        raise AssertionError("a forward pass ran before the reference check")

    monkeypatch.setattr(tofu_eval, "generate_answers", no_forward)
    monkeypatch.setattr(tofu_eval, "score_dataset", no_forward)
    reference = {"splits": {"forget": {"digest": "0" * 16}}, "summary": {"m": 0.0}}
    with pytest.raises(ValueError, match="different forget split"):
        evaluate(
            tiny_model, tiny_tokenizer, resolve_benchmark("tofu"), {"forget": list(RECORDS)}, EvalSettings(), reference
        )


def test_out_of_memory_halves_the_generation_and_gradnorm_batches(
    tiny_model, tiny_tokenizer, tiny_examples, monkeypatch
):
    pad, sizes = tiny_tokenizer.pad_token_id, []
    want_text = generate_answers(tiny_model, tiny_tokenizer, tiny_examples, 4, batch_size=4)
    want_norms = mia.gradnorm_scores(tiny_model, tiny_examples, pad, batch_size=4)[0]
    from margincal.model import generation

    greedy = generation.greedy_tokens

    def small_only(model, ids, *args):
        sizes.append(len(ids))
        if sizes[-1] > 1:
            raise torch.cuda.OutOfMemoryError("simulated")
        return greedy(model, ids, *args)

    monkeypatch.setattr(generation, "greedy_tokens", small_only)
    assert generate_answers(tiny_model, tiny_tokenizer, tiny_examples, 4, batch_size=4) == want_text
    assert sizes == [4, 2, 1, 1, 1, 1]
    batched, sizes = mia.per_sample_grad_norms, []

    def norms_small_only(model, batch, losses):
        sizes.append(len(batch["input_ids"]))
        if sizes[-1] > 2:
            raise torch.cuda.OutOfMemoryError("simulated")
        return batched(model, batch, losses)

    monkeypatch.setattr(mia, "per_sample_grad_norms", norms_small_only)
    assert torch.allclose(mia.gradnorm_scores(tiny_model, tiny_examples, pad, batch_size=4)[0], want_norms, rtol=1e-6)
    assert sizes == [4, 2, 2]


def test_greedy_decoding_equals_generate_prompt_by_prompt(smoke_mini):
    """The batched, compacting decoder against the reference: ``model.generate`` (greedy) on each prompt alone, no
    padding. A random-weight model, 40 smoke-mini prompts of several lengths in batches of 16, answers of several
    lengths (rows left their batch at different steps), some cut at the token limit: the same tokens, so the same
    strings."""
    from margincal.data.records import encode_qa
    from margincal.model.generation import greedy_tokens
    from margincal.pipeline.cell import workspace
    from margincal.pipeline.panel import expand_cells
    from margincal.pipeline.plan import plan_cell

    ws = workspace(plan_cell(smoke_mini.cfg, expand_cells(smoke_mini.cfg)[0]))
    tok = copy.deepcopy(ws.tokenizer)
    model = new_mini_model(dataclasses.replace(TINY, vocab_size=len(tok)), tok, seed=0).eval()
    with torch.no_grad():  # weights large enough that greedy answers vary from token to token and prompt to prompt
        for weight in (w for w in model.parameters() if w.dim() == 2):
            weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(weight.numel()))
    records = [r for split in ws.eval_splits.values() for r in split][:40]
    examples = encode_qa(tok, records, ws.benchmark.max_length)
    new = 12

    def one_by_one(at_least: int = 0) -> list[list[int]]:
        alone = []
        for e in examples:
            prompt = torch.tensor([e.generation_prompt])
            settings = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            settings["min_new_tokens"] = at_least
            out = model.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, **settings
            )
            alone.append(out[0, prompt.size(1) :].tolist())
        return alone

    # a random model rarely emits EOS: its most frequent answer token that never opens an answer stands in for it
    answers = one_by_one(at_least=new)
    common = collections.Counter(t for a in answers for t in a[1:] if t not in {b[0] for b in answers}).most_common(1)
    tok.eos_token = tok.convert_ids_to_tokens(common[0][0])
    alone = one_by_one()
    lengths = [len(a) - (a[-1] == tok.eos_token_id) for a in alone]
    assert len({len(e.generation_prompt) for e in examples}) > 3 and len(set(lengths)) >= 3 and new in lengths
    assert generate_answers(model, tok, examples, new, batch_size=16) == [
        tok.decode(a, skip_special_tokens=True).strip() for a in alone
    ]
    chunk = sorted(range(16), key=lambda i: len(examples[i].generation_prompt))
    ids, attn = padded([examples[i].generation_prompt for i in chunk], tok.pad_token_id, left=True)
    tokens = greedy_tokens(model, ids, attn, new, tok.eos_token_id, tok.pad_token_id)
    for row, i in enumerate(chunk):
        assert tokens[row, : len(alone[i])].tolist() == alone[i]
        assert (tokens[row, len(alone[i]) :] == tok.pad_token_id).all()
