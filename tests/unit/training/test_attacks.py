"""Each attacker changes only what it should; the adaptive attacker ascends m_β; margin flips; the K-sweep."""

import pytest
import torch

from margincal.config.settings import AttackConfig, LoraSpec, TrainConfig
from margincal.data.records import collate
from margincal.model.margin import diagnostic_positions, smoothed_margin
from margincal.model.scoring import forward_answer, score_dataset
from margincal.training.attacks import get_attacker, margin_flips
from tests.conftest import RECORDS, make_workspace


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def changed(a, b):
    return {k for k in a if not torch.equal(a[k], b[k])}


def attack(name, model, tokenizer, examples, **extra):
    lora = LoraSpec(r=4, alpha=8) if name in ("lora", "adaptive") else None
    cfg = AttackConfig(name=name, k=2, train=TrainConfig(steps=4, batch_size=2, lr=5e-2, lora=lora), **extra)
    return get_attacker(name)(model, examples[:2], cfg, tokenizer)


def test_soft_prompt_leaves_every_weight_bit_identical(tiny_model, tiny_tokenizer, tiny_examples):
    before = state(tiny_model)
    attacked = attack("soft_prompt", tiny_model, tiny_tokenizer, tiny_examples, n_soft=3)
    base = attacked.peft_model.get_base_model().state_dict()
    assert not changed(before, tiny_model.state_dict()) and not changed(before, base)
    trained = [n for n, p in attacked.named_parameters() if p.requires_grad]
    assert trained == ["peft_model.prompt_encoder.default.embedding.weight"]
    batch = collate(tiny_examples, tiny_tokenizer.pad_token_id)  # logits stay aligned with the answer tokens
    assert forward_answer(attacked, batch)[0].shape == forward_answer(tiny_model, batch)[0].shape


def test_the_soft_prompt_starts_from_a_real_prompts_token_embeddings(tiny_model, tiny_tokenizer, tiny_examples):
    """peft's TEXT initialisation: the virtual tokens start as the embeddings of SOFT_PROMPT_TEXT's tokens, repeated
    and cut to n_soft (by hand: ids a b c and n_soft 7 give a b c a b c a)."""
    from margincal.training.attacks import SOFT_PROMPT_TEXT, text_init_ids

    ids = tiny_tokenizer(SOFT_PROMPT_TEXT)["input_ids"]
    assert text_init_ids(tiny_tokenizer, 2 * len(ids) + 1) == ids + ids + ids[:1]
    assert text_init_ids(tiny_tokenizer, 2) == ids[:2]
    cfg = AttackConfig(name="soft_prompt", k=2, n_soft=5, train=TrainConfig(steps=1, batch_size=2, lr=1e-30))
    attacked = get_attacker("soft_prompt")(tiny_model, tiny_examples[:2], cfg, tiny_tokenizer)
    start = tiny_model.get_input_embeddings().weight[text_init_ids(tiny_tokenizer, 5)]
    assert torch.allclose(attacked.peft_model.prompt_encoder["default"].embedding.weight, start, atol=1e-6)


def test_lora_keeps_base_weights_and_fpft_changes_them(tiny_model, tiny_tokenizer, tiny_examples):
    before = state(tiny_model)
    lora = attack("lora", tiny_model, tiny_tokenizer, tiny_examples)
    fpft = attack("fpft", tiny_model, tiny_tokenizer, tiny_examples)
    assert not changed(before, tiny_model.state_dict())  # the released model is never touched
    weights = {k for k in before if k.endswith("proj.weight")}
    assert weights <= changed(before, lora.state_dict())  # only through the merged low-rank update
    assert changed(before, fpft.state_dict()) >= weights | {"model.embed_tokens.weight"}


def test_linear_probe_retrains_only_the_untied_unembedding(tiny_model, tiny_tokenizer, tiny_examples):
    before = state(tiny_model)
    probe = attack("linear_probe", tiny_model, tiny_tokenizer, tiny_examples)
    after = probe.state_dict()
    assert changed(before, after) == {"lm_head.weight"}
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert tiny_model.config.tie_word_embeddings and not probe.config.tie_word_embeddings


def test_adaptive_attacker_raises_the_smoothed_margin_on_d_rel(tiny_model, tiny_tokenizer, tiny_examples):
    d_rel = tiny_examples[:2]
    stats = score_dataset(tiny_model, d_rel, tiny_tokenizer.pad_token_id)
    cols = diagnostic_positions(stats)
    batch = collate(d_rel, tiny_tokenizer.pad_token_id)

    def m_beta(model):
        with torch.no_grad():
            logits, targets, _, _ = forward_answer(model, batch)
        rows = torch.arange(len(d_rel))
        return float(smoothed_margin(logits[rows, cols], targets[rows, cols], 120.0).mean())

    attacked = attack("adaptive", tiny_model, tiny_tokenizer, tiny_examples)
    assert m_beta(attacked) > m_beta(tiny_model) + 0.1


def test_margin_flip_groups():
    flips = margin_flips(before=[-1.0, -2.0, 0.5, -0.1], after=[0.3, -0.5, 1.0, 2.0], rouge=[1.0, 0.2, 0.9, 0.5])
    assert flips["flipped"] == {"n": 2, "mean_rouge_l": 0.75}
    assert flips["stayed"] == {"n": 1, "mean_rouge_l": 0.2} and flips["already"]["n"] == 1


def test_attack_stage_scores_the_held_out_set_with_the_benchmark_evaluator(tiny_model, tiny_tokenizer):
    from margincal.config.settings import EvalSettings
    from margincal.pipeline.stages import attack_stage

    ws = make_workspace(tiny_model, tiny_tokenizer)
    cfg = AttackConfig(k=2, train=TrainConfig(steps=2, batch_size=2, lr=1e-2, lora=LoraSpec(r=2, alpha=2)))
    res = attack_stage(tiny_model, cfg, ws, EvalSettings(batch_size=4), m_ref=-1.0)
    assert len(res["heldout"]) == 2 and sum(g["n"] for g in res["flips"].values()) == 2
    assert res["diagnosis"]["m_ref"] == -1.0 and res["diagnosis"]["aggregate"] == "mean"
    assert res["rouge_l"] == pytest.approx(sum(s["rouge_l"] for s in res["samples"]) / 2)  # TOFU: recall


def test_muse_attack_numbers_use_muse_prompts_f1_and_median(tiny_model, tiny_tokenizer):
    """Post-attack MUSE numbers come from the MUSE evaluator: few-shot prompts, stop strings, ROUGE-L F1 and the
    median m (before, the attack scored zero-shot recall and a mean m against a median m_ref)."""
    from margincal.config.settings import EvalSettings
    from margincal.evaluation.evaluators import evaluate
    from margincal.pipeline.stages import attack_stage

    ws = make_workspace(tiny_model, tiny_tokenizer, "muse-news", max_length=128)
    ws.eval_splits["forget_icl"] = list(RECORDS[:2])
    cfg = AttackConfig(k=1, train=TrainConfig(steps=1, batch_size=1, lr=1e-9, lora=LoraSpec(r=2, alpha=2)))
    res = attack_stage(tiny_model, cfg, ws, EvalSettings(batch_size=4), m_ref=0.0)
    assert res["diagnosis"]["aggregate"] == "median"
    assert res["rouge_l"] == pytest.approx(sum(s["rouge_l_f1"] for s in res["samples"]) / len(res["samples"]))
    held = {"forget": [RECORDS[i] for i in res["heldout"]], "forget_icl": ws.eval_splits["forget_icl"]}
    direct = evaluate(
        tiny_model,
        tiny_tokenizer,
        ws.benchmark,
        held,
        EvalSettings(batch_size=4),
        {"summary": {"m": 0.0}},
        ("diagnosis",),
    )
    # an attack at lr 1e-9 leaves the model as it was: its numbers are the evaluator's on the held-out set
    assert res["diagnosis"]["m"] == pytest.approx(direct["summary"]["m"], abs=1e-4)


def test_unknown_attacker_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown attacker"):
        get_attacker("gradient_magic")


def test_a_soft_prompted_model_decodes_prompts_of_every_length_in_one_batch_as_greedy_decoding_defines(
    tiny_model, tiny_tokenizer, tiny_examples, monkeypatch
):
    """Greedy answers to prompts of four lengths, decoded in one left-padded batch with the virtual tokens before
    the padding, must equal the definition: each prompt alone, every next token the argmax of the transformers
    model's logits on [virtual tokens; prompt; answer so far], recomputed without a cache. (peft's own ``generate``
    under prompt tuning, which decoded soft prompts before, did not: 0 of 20 answers of a trained mini soft prompt
    equal, with peft 0.21 and transformers 5.24.) Answers sharing a prompt must score as one sample at a time."""
    from dataclasses import replace

    import margincal.model.generation as generation
    from margincal.data.records import encode_qa
    from margincal.model.scoring import answer_token_stats, concat_stats

    attacked = attack("soft_prompt", tiny_model, tiny_tokenizer, tiny_examples, n_soft=3)
    pad, eos = tiny_tokenizer.pad_token_id, tiny_tokenizer.eos_token_id
    records = [replace(r, question=r.question + " born" * i) for i, r in enumerate(RECORDS)]
    examples = encode_qa(tiny_tokenizer, records, 64)
    assert len({len(e.generation_prompt) for e in examples}) == len(examples) == 4
    batches, greedy = [], generation.greedy_tokens
    monkeypatch.setattr(generation, "greedy_tokens", lambda *a, **k: batches.append(a[1].shape) or greedy(*a, **k))
    batched = generation.generate_answers(attacked, tiny_tokenizer, examples, 6, batch_size=4)
    assert len(batches) == 1 and batches[0][0] == 4
    base, virtual = generation.soft_prompt_parts(attacked)
    defined = []
    with torch.no_grad():
        for e in examples:
            ids, new = list(e.generation_prompt), []
            for _ in range(6):
                embeds = torch.cat([virtual, base.get_input_embeddings()(torch.tensor([ids]))], dim=1)
                token = int(base(inputs_embeds=embeds).logits[0, -1].argmax())
                if token == eos:
                    break
                ids.append(token)
                new.append(token)
            defined.append(tiny_tokenizer.decode(new, skip_special_tokens=True).strip())
    assert batched == defined
    shared = examples + encode_qa(tiny_tokenizer, [replace(r, answer=r.answer[::-1]) for r in records], 64)
    got = score_dataset(attacked, shared, pad, batch_size=4)
    want = concat_stats([answer_token_stats(attacked, collate([e], pad)).materialized() for e in shared])
    assert torch.allclose(got.gold, want.gold, atol=1e-5) and torch.equal(got.mask, want.mask)


def test_the_attacker_registry_is_the_list_config_checks_presets_against():
    from margincal.config.settings import ATTACKER_KINDS
    from margincal.training.attacks import ATTACKERS, register_attacker

    assert set(ATTACKERS) == set(ATTACKER_KINDS)
    with pytest.raises(ValueError, match="not in margincal.config.settings.ATTACKER_KINDS"):
        register_attacker("unlisted")


def test_in_context_relearning_places_d_rel_before_each_held_out_question(tiny_model, tiny_tokenizer):
    """No weight changes; the attack's numbers are the evaluator's on the held-out records with the K D_rel pairs
    as the prompt's shots (TOFU's evaluator takes them as a ``forget_icl`` split)."""
    from margincal.config.settings import EvalSettings
    from margincal.config.typed import ConfigError
    from margincal.data.draws import relearn_split
    from margincal.evaluation.evaluators import evaluate
    from margincal.pipeline.stages import attack_stage

    ws = make_workspace(tiny_model, tiny_tokenizer, max_length=128)
    res = attack_stage(tiny_model, AttackConfig(name="in_context", k=2), ws, EvalSettings(batch_size=4))
    rel, held = relearn_split(4, 2, 0)
    assert res["heldout"] == held
    shots = {"forget": [RECORDS[i] for i in held], "forget_icl": [RECORDS[i] for i in rel]}
    direct = evaluate(
        tiny_model, tiny_tokenizer, ws.benchmark, shots, EvalSettings(batch_size=4), None, ("diagnosis", "rouge")
    )
    alone = {"forget": shots["forget"]}
    plain = evaluate(tiny_model, tiny_tokenizer, ws.benchmark, alone, EvalSettings(), None, ("diagnosis", "rouge"))
    assert [s["generated"] for s in res["samples"]] == [s["generated"] for s in direct["splits"]["forget"]["samples"]]
    assert res["diagnosis"]["m"] == direct["splits"]["forget"]["diagnosis"]["m"]
    assert res["diagnosis"]["m"] != plain["splits"]["forget"]["diagnosis"]["m"]  # the shots changed the prompt
    with pytest.raises(ConfigError, match="must be forget for in_context"):
        AttackConfig(name="in_context", data="retain")


def test_retain_data_attacks_train_on_retain_records_and_score_every_forget_record(tiny_model, tiny_tokenizer):
    from margincal.config.settings import EvalSettings
    from margincal.pipeline.stages import attack_stage

    ws = make_workspace(tiny_model, tiny_tokenizer)
    ws.train["retain"] = ws.train["retain"][:3]
    train = TrainConfig(steps=1, batch_size=3, lr=1e-2, lora=LoraSpec(r=2, alpha=2))
    cfg = AttackConfig(k=3, data="retain", train=train)
    res = attack_stage(tiny_model, cfg, ws, EvalSettings(batch_size=4))
    assert res["heldout"] == [0, 1, 2, 3]  # all of D_f
    ws.train.pop("probe")
    with pytest.raises(ValueError, match="needs the probe split; the workspace holds none"):
        attack_stage(tiny_model, AttackConfig(k=1, data="probe"), ws, EvalSettings())


def test_the_format_probe_keeps_each_records_best_wording(tiny_model, tiny_tokenizer):
    """Every forget question asked in K wordings; per record the answer whose ROUGE-L is highest (the original
    wording first), each sample naming its wording; K above the formats given stops."""
    from margincal.config.settings import EvalSettings
    from margincal.config.typed import ConfigError
    from margincal.evaluation.evaluators import evaluate
    from margincal.pipeline.stages import attack_stage, reworded

    ws = make_workspace(tiny_model, tiny_tokenizer, max_length=128)
    formats = ["{question}", "Tell me: {question}"]
    res = attack_stage(tiny_model, AttackConfig(name="format_probe", k=2, formats=formats), ws, EvalSettings())
    assert res["heldout"] == [0, 1, 2, 3]
    scores = [
        evaluate(tiny_model, tiny_tokenizer, ws.benchmark, {"forget": reworded(RECORDS, f)}, EvalSettings(), None,
                 ("diagnosis", "rouge"))["splits"]["forget"]["samples"]
        for f in formats
    ]  # fmt: skip
    best = [max(a["rouge_l"], b["rouge_l"]) for a, b in zip(*scores, strict=True)]
    assert [s["rouge_l"] for s in res["samples"]] == best
    assert res["rouge_l"] == pytest.approx(sum(best) / 4)
    assert all(s["format"] in formats for s in res["samples"])
    assert reworded(RECORDS[:1], "Tell me: {question}")[0].question == "Tell me: " + RECORDS[0].question
    with pytest.raises(ConfigError, match=r"k must be in \[1, 2\] for format_probe"):
        AttackConfig(name="format_probe", k=3, formats=formats)
    with pytest.raises(ConfigError, match="must hold {question} once"):
        AttackConfig(name="format_probe", k=1, formats=["Tell me {name}: {question}"])
