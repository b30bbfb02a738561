"""Every registered method runs a few unlearning steps and an MC polish on a tiny model."""

import pytest
import torch

from margincal.config import LoraSpec, MCConfig, TrainConfig
from margincal.methods import METHODS, get_method
from margincal.polish import anchor_margins, polish
from margincal.unlearn import unlearn


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_unlearns_and_polishes(name, tiny_model, tiny_tokenizer, tiny_examples):
    pad = tiny_tokenizer.pad_token_id
    method = get_method(name)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    model, result = unlearn(tiny_model, method, tiny_examples, tiny_examples, TrainConfig(steps=2, batch_size=2), pad)
    assert len(result.history) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history)
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())  # θ0 untouched
    table = anchor_margins(tiny_model, "tiny", tiny_examples, pad)
    cfg = MCConfig(train=TrainConfig(steps=2, batch_size=1, lr=1e-3, lora=LoraSpec(r=2, alpha=2)))
    _, polished = polish(model, method, tiny_model, table, tiny_examples, tiny_examples, tiny_examples, cfg, pad)
    assert {"native", "hinge", "kl"} <= set(polished.history[0])
