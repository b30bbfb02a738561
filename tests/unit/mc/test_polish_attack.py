import pytest
import torch

from margincal.config.settings import AttackConfig, LoraSpec, MCConfig, TrainConfig
from margincal.data.draws import relearn_split
from margincal.mc import loss
from margincal.mc.loss import anchor_tables
from margincal.mc.polish import PolishInput, polish, polish_pool
from margincal.methods import get_method
from margincal.model.loading import clone_model
from margincal.training.attacks import get_attacker


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_relearn_split_is_seeded_and_disjoint():
    rel, held = relearn_split(50, 20, seed=3)
    assert len(rel) == 20 and len(held) == 30 and not set(rel) & set(held) and set(rel) | set(held) == set(range(50))
    assert relearn_split(50, 20, seed=3) == (rel, held) and relearn_split(50, 20, seed=4) != (rel, held)
    with pytest.raises(ValueError, match="relearn budget"):
        relearn_split(10, 10, seed=0)
    with pytest.raises(ValueError, match="unknown attacker"):
        get_attacker("nope")


def test_lora_attack_leaves_released_model_untouched(tiny_model, tiny_tokenizer, tiny_examples):
    before = state(tiny_model)
    cfg = AttackConfig(k=2, train=TrainConfig(steps=3, batch_size=2, lr=1e-2, lora=LoraSpec(r=4, alpha=8)))
    rel, held = relearn_split(len(tiny_examples), cfg.k, cfg.train.seed)
    attacked = get_attacker(cfg.name)(tiny_model, [tiny_examples[i] for i in rel], cfg, tiny_tokenizer)
    assert len(held) == 2
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())
    assert any(not torch.equal(v, before[k]) for k, v in attacked.state_dict().items())
    assert not any("lora" in k for k in attacked.state_dict())  # merged for evaluation


def test_anchor_tables_cached_on_disk(tiny_model, tiny_tokenizer, tiny_examples, tmp_path, monkeypatch):
    pad = tiny_tokenizer.pad_token_id
    first = anchor_tables(tiny_model, "tiny", tiny_examples, pad, cache_dir=tmp_path)
    assert set(first) == {"margin", "entropy", "gold"} and first["margin"].shape[0] == len(tiny_examples)
    assert len(list((tmp_path / "anchors").iterdir())) == 1

    def boom(*args, **kwargs):
        raise AssertionError("recomputed instead of reading the cache")

    monkeypatch.setattr(loss, "score_dataset", boom)  # what anchor_tables scores with
    again = anchor_tables(tiny_model, "tiny", tiny_examples, pad, cache_dir=tmp_path)
    assert all(torch.equal(again[k], first[k]) for k in first)


def test_polish_runs_all_terms_and_leaves_input_untouched(tiny_model, tiny_tokenizer, tiny_examples):
    pad = tiny_tokenizer.pad_token_id
    method = get_method("NPO")
    method.prepare(tiny_model, tiny_examples, tiny_tokenizer)
    table = anchor_tables(tiny_model, "tiny", tiny_examples, pad)
    cfg = MCConfig(train=TrainConfig(steps=3, batch_size=1, lr=1e-3, lora=LoraSpec(r=4, alpha=4)))
    before = state(tiny_model)
    policy = clone_model(tiny_model)  # polish consumes the model it is given; the anchor stays untouched
    polished, result = polish(
        policy, PolishInput(method, cfg, tiny_model, table, tiny_examples, tiny_examples, tiny_examples, pad)
    )
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())
    row = result.history[0]
    assert {"native", "hinge", "kl"} <= set(row)
    assert row["loss"] == pytest.approx(row["native"] + row["hinge"] + 0.05 * row["kl"], rel=1e-5)
    # at the start the model is its own anchor: margin gap 0 gives hinge log(2)/κ and KL 0
    assert row["hinge"] == pytest.approx(0.6931472 / 5.0, rel=1e-4) and row["kl"] == pytest.approx(0.0, abs=1e-6)
    assert any(not torch.equal(v, before[k]) for k, v in polished.state_dict().items())


def test_polish_trains_its_input_in_place_without_a_second_model_copy(tiny_model, tiny_tokenizer, tiny_examples):
    """At 8B bf16 a deep copy inside polish() held one extra full model (+16 GB): the adapter now wraps the input."""
    pad = tiny_tokenizer.pad_token_id
    method = get_method("NPO")
    anchor = clone_model(tiny_model)
    method.prepare(anchor, tiny_examples, tiny_tokenizer)
    cfg = MCConfig(train=TrainConfig(steps=1, batch_size=1, lr=1e-3, lora=LoraSpec(r=2, alpha=2)))
    table = anchor_tables(anchor, "tiny", tiny_examples, pad)
    inp = PolishInput(method, cfg, anchor, table, tiny_examples, tiny_examples, tiny_examples, pad)
    peft_model, _ = polish(tiny_model, inp, merge=False)
    assert peft_model.get_base_model() is tiny_model


def test_polish_pool_is_capped_and_seeded(tiny_examples):
    assert polish_pool(tiny_examples, 200, seed=0) == list(tiny_examples)
    pool = polish_pool(tiny_examples, 2, seed=0)
    assert len(pool) == 2 and pool == polish_pool(tiny_examples, 2, seed=0)
