import pytest
import torch

from margincal.config import LoraSpec, TrainConfig
from margincal.data.records import QARecord, cycle, encode_qa
from margincal.models import load_model, merge_lora, save_model
from margincal.training import NonFiniteLossError, nll_objective, train


def test_full_training_lowers_nll_and_is_seeded(tiny_model, tiny_tokenizer, tiny_examples):
    cfg = TrainConfig(steps=30, batch_size=2, lr=1e-2, weight_decay=0.0)
    stream = cycle(tiny_examples, 2, tiny_tokenizer.pad_token_id, seed=0)
    model, result = train(tiny_model, nll_objective, stream, cfg)
    assert result.history[-1]["nll"] < result.history[0]["nll"] * 0.7
    assert len(result.history) == 30 and all("grad_norm" in r for r in result.history)


def test_same_seed_same_result(tiny_tokenizer, tiny_examples):
    from margincal.mini.models import new_mini_model
    from tests.conftest import TINY

    cfg = TrainConfig(steps=5, batch_size=2, lr=1e-2)
    runs = []
    for _ in range(2):
        model = new_mini_model(TINY, tiny_tokenizer, seed=3)
        stream = cycle(tiny_examples, 2, tiny_tokenizer.pad_token_id, seed=3)
        _, res = train(model, nll_objective, stream, cfg)
        runs.append([r["loss"] for r in res.history])
    assert runs[0] == runs[1]


def test_lora_trains_adapter_only(tiny_model, tiny_tokenizer, tiny_examples):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    cfg = TrainConfig(steps=3, batch_size=2, lr=1e-2, lora=LoraSpec(r=4, alpha=8))
    stream = cycle(tiny_examples, 2, tiny_tokenizer.pad_token_id, seed=0)
    peft_model, _ = train(tiny_model, nll_objective, stream, cfg)
    base = peft_model.get_base_model().state_dict()
    for key, value in before.items():
        weight_key = key.replace(".weight", ".base_layer.weight")
        current = base.get(weight_key, base.get(key))
        assert torch.equal(current, value), key
    merged = merge_lora(peft_model)
    changed = [k for k, v in merged.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and all("proj" in k for k in changed)


def test_nan_loss_stops_with_clear_error(tiny_model, tiny_tokenizer, tiny_examples):
    def bad(model, batch):
        loss, logs = nll_objective(model, batch)
        return loss * float("nan"), logs

    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    stream = cycle(tiny_examples, 2, tiny_tokenizer.pad_token_id, seed=0)
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 0"):
        train(tiny_model, bad, stream, TrainConfig(steps=3, batch_size=2))
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())


def test_too_long_example_and_empty_split_are_rejected(tiny_tokenizer):
    with pytest.raises(ValueError, match="max_length=8"):
        encode_qa(tiny_tokenizer, [QARecord("Where was Ann Bel born?", "Ann Bel was born in Port Ivo.")], 8)
    with pytest.raises(ValueError, match="empty"):
        encode_qa(tiny_tokenizer, [], 64)


def test_save_load_roundtrip_safetensors(tiny_model, tiny_tokenizer, tmp_path):
    path = save_model(tiny_model, tiny_tokenizer, tmp_path / "m")
    assert (path / "model.safetensors").exists() and not any(p.suffix == ".bin" for p in path.iterdir())
    loaded = load_model(path)
    for (k, v), (k2, v2) in zip(tiny_model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)


def test_plateau_rule_stops_at_the_first_flat_epoch():
    from margincal.config import PlateauStop
    from margincal.unlearn import plateau_rule

    # epochs of 2 steps with means 10, 6, 5, 4.9: improvements 4, 1, 0.1; total so far 4, 5, 5.1
    losses = [11, 9, 7, 5, 5, 5, 4.8, 5.0]
    rule = plateau_rule(PlateauStop(tol=0.05, min_epochs=3), epoch_steps=2)
    history = [{"loss": x} for x in losses]
    reached = [n for n in range(1, len(history) + 1) if rule(history[:n])]
    assert reached == [8]  # 0.1 ≤ 0.05 · 5.1 at epoch 4; epoch 3's 1.0 > 0.05 · 5 and mid-epoch never counts
    assert not plateau_rule(PlateauStop(tol=0.01, min_epochs=3), 2)(history)  # 0.1 > 0.01 · 5.1


def test_training_loop_obeys_a_stop_rule(tiny_model, tiny_tokenizer, tiny_examples):
    stream = cycle(tiny_examples, 2, tiny_tokenizer.pad_token_id, seed=0)
    _, result = train(
        tiny_model,
        nll_objective,
        stream,
        TrainConfig(steps=10, batch_size=2),
        stop_rule=lambda history: len(history) == 4,
    )
    assert (len(result.history), result.stopped_at) == (4, 4)


@pytest.mark.parametrize("tol,min_epochs", [(0.0, 3), (1.0, 3), (0.05, 1)])
def test_plateau_stop_ranges(tol, min_epochs):
    from margincal.config import PlateauStop

    with pytest.raises(ValueError, match="tol|min_epochs"):
        PlateauStop(tol=tol, min_epochs=min_epochs)
