from dataclasses import replace

import pytest
import torch

from margincal.config.settings import LoraSpec, TrainConfig
from margincal.data.records import QARecord, cycle, encode_qa
from margincal.model.loading import load_model, merge_lora, save_model
from margincal.training.loop import NonFiniteLossError, nll_objective, train
from tests.conftest import tensorboard_scalars


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
    from margincal.config.settings import PlateauStop
    from margincal.training.unlearning import plateau_rule

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
    from margincal.config.settings import PlateauStop

    with pytest.raises(ValueError, match="tol|min_epochs"):
        PlateauStop(tol=tol, min_epochs=min_epochs)


def test_report_to_tensorboard_writes_every_step_of_the_one_loop(tiny_model, tiny_tokenizer, tiny_examples, tmp_path):
    """Inside ``recording(dir, "tensorboard")`` each step's loss, gradient norm, objective terms and learning rate
    (the rate that step used: linear decay from 1e-2 over 3 steps) are event files read back at steps 1..3; a
    second run of one description is ``#2``; outside a recording, or with ``none``, nothing is written."""
    pytest.importorskip("tensorboard")
    from margincal.training.curves import recording

    cfg = TrainConfig(steps=3, batch_size=2, lr=1e-2, scheduler="linear", warmup_ratio=0.0)
    stream = cycle(tiny_examples, 2, tiny_tokenizer.pad_token_id, seed=0)
    with recording(tmp_path / "stage", "tensorboard"):
        _, first = train(tiny_model, nll_objective, stream, cfg, desc="fit")
        _, second = train(tiny_model, nll_objective, stream, replace(cfg, steps=2), desc="fit")
    train(tiny_model, nll_objective, stream, replace(cfg, steps=1), desc="outside")
    with recording(tmp_path / "off", "none"):
        train(tiny_model, nll_objective, stream, replace(cfg, steps=1), desc="off")
    series = tensorboard_scalars(tmp_path / "stage" / "tensorboard")
    assert set(series) == {f"{run}/{k}" for run in ("fit", "fit#2") for k in ("loss", "grad_norm", "nll", "lr")}
    for run, result in (("fit", first), ("fit#2", second)):
        for key in ("loss", "grad_norm", "nll"):
            expected = [(i + 1, pytest.approx(r[key], rel=1e-6)) for i, r in enumerate(result.history)]
            assert series[f"{run}/{key}"] == expected
    assert series["fit/lr"] == [
        (1, pytest.approx(1e-2)),
        (2, pytest.approx(1e-2 * 2 / 3)),
        (3, pytest.approx(1e-2 / 3)),
    ]
    assert not (tmp_path / "off").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["stage"]


def test_report_to_is_checked_before_any_compute(monkeypatch):
    import sys

    from margincal.core.errors import InputError, MissingPackageError
    from margincal.training.curves import check_report_to

    with pytest.raises(InputError, match=r"^--report-to 'wandb': use one of none, tensorboard$"):
        check_report_to("wandb", "--report-to")
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # find_spec: not installed
    with pytest.raises(MissingPackageError, match=r"pip install 'margincal\[tensorboard\]'$"):
        check_report_to("tensorboard")
