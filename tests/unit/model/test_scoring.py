import math

import torch

from margincal.data.records import EncodedQA, collate
from margincal.model.scoring import TokenStats, answer_logits, answer_targets, concat_stats, stats_from_logits

LN2, LN3 = math.log(2), math.log(3)


def hand_stats():
    # row 0: two answer tokens; row 1: one answer token + padding
    logits = torch.tensor(
        [
            [[LN2, 0.0, 0.0], [0.0, 0.0, 0.0]],  # p = (.5,.25,.25), then uniform
            [[0.0, 0.0, LN3], [5.0, 5.0, 5.0]],  # p = (.2,.2,.6); second position is padding
        ]
    )
    targets = torch.tensor([[0, 2], [1, 0]])
    mask = torch.tensor([[True, True], [True, False]])
    return stats_from_logits(logits, targets, mask)


def test_gold_competitor_entropy_exact():
    s = hand_stats()
    assert torch.allclose(s.gold[0], torch.tensor([math.log(0.5), math.log(1 / 3)]))
    assert torch.allclose(s.competitor[0], torch.tensor([math.log(0.25), math.log(1 / 3)]))
    assert torch.allclose(s.entropy[0], torch.tensor([1.5 * LN2, LN3]))
    # row 1: gold token 1 has p = .2, strongest competitor is token 2 with p = .6
    assert math.isclose(float(s.gold[1, 0]), math.log(0.2), rel_tol=1e-6)
    assert math.isclose(float(s.competitor[1, 0]), math.log(0.6), rel_tol=1e-6)


def test_margin_ties_and_padding():
    s = hand_stats()
    assert torch.allclose(s.margin, torch.tensor([[LN2, 0.0], [math.log(0.2 / 0.6), 0.0]]))  # tie -> 0, pad -> 0
    assert s.gold[1, 1] == 0 and s.entropy[1, 1] == 0  # padding zeroed
    assert torch.allclose(s.nll_sum(), torch.tensor([-(math.log(0.5) + math.log(1 / 3)), -math.log(0.2)]))
    assert torch.allclose(s.nll_mean(), torch.tensor([-(math.log(0.5) + math.log(1 / 3)) / 2, -math.log(0.2)]))
    total = -(math.log(0.5) + math.log(1 / 3) + math.log(0.2)) / 3
    assert math.isclose(float(s.token_mean_nll()), total, rel_tol=1e-6)


def test_answer_alignment_from_collated_batch():
    examples = [EncodedQA(0, [5, 6, 7], [8, 9]), EncodedQA(1, [5], [4, 3, 2])]
    batch = collate(examples, pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 4, 3, 2, 0]]
    assert batch["labels"].tolist() == [[-100, -100, -100, 8, 9], [-100, 4, 3, 2, -100]]
    # logits whose value at [b, pos, 0] is the position, so the gather is visible
    logits = torch.arange(5.0)[None, :, None].repeat(2, 1, 3)
    gathered, mask = answer_logits(logits, batch["answer_start"], batch["answer_len"])
    assert gathered[..., 0].tolist() == [
        [2.0, 3.0, 0.0],
        [0.0, 1.0, 2.0],
    ]  # predicting positions 3,4 and 1,2,3
    assert mask.tolist() == [[True, True, False], [True, True, True]]
    targets = answer_targets(batch["input_ids"], batch["answer_start"], batch["answer_len"])
    assert targets.tolist() == [[8, 9, 0], [4, 3, 2]]


def test_concat_pads_to_common_width():
    a, full = hand_stats().materialized(), hand_stats().materialized()
    a.index = torch.tensor([0, 1])
    cut = [t[:, :1] for t in (full.gold, full.competitor, full.entropy, full.mask)]
    b = TokenStats(*cut[:3], cut[3], torch.tensor([2, 3]), full.logp_sq[:, :1])
    c = concat_stats([a, b])
    assert c.mask.shape == (4, 2) and c.index.tolist() == [0, 1, 2, 3]
    assert c.mask[2:].tolist() == [[True, False], [True, False]]


def test_only_the_fields_a_loss_reads_are_computed():
    """An NLL-only loss never builds the competitor/entropy/E[(log p)^2] tensors (GBs at a 128k vocabulary)."""
    s = hand_stats()
    assert s.token_mean_nll() > 0 and all(v is None for v in s._fields.values())
    assert torch.allclose(s.margin[0], torch.tensor([math.log(2), 0.0]))  # reads the competitor only
    assert s._fields["competitor"] is not None and s._fields["entropy"] is None and s._fields["logp_sq"] is None


def test_dataset_kl_is_zero_against_itself_and_the_per_sample_mean_otherwise(tiny_model, tiny_tokenizer, tiny_examples):
    from margincal.mini.models import new_mini_model
    from margincal.model.scoring import dataset_kl, forward_answer, kl_divergence
    from tests.conftest import TINY

    pad = tiny_tokenizer.pad_token_id
    assert dataset_kl(tiny_model, tiny_model, tiny_examples, pad) == 0.0
    other = new_mini_model(TINY, tiny_tokenizer, seed=1)
    per_sample = []
    for ex in tiny_examples:  # one sample per batch: the KL probe's quantity for that sample alone
        with torch.no_grad():
            a, _, mask, _ = forward_answer(tiny_model, collate([ex], pad))
            b, _, _, _ = forward_answer(other, collate([ex], pad))
        per_sample.append(kl_divergence(a, b, mask).item())
    expected = sum(per_sample) / len(per_sample)
    assert math.isclose(dataset_kl(tiny_model, other, tiny_examples, pad, batch_size=3), expected, rel_tol=1e-5)


def test_shared_prompt_scoring_refuses_a_forward_that_drops_the_prompt_cache(tiny_model, tiny_tokenizer, tiny_examples):
    """The prompt's KV cache goes in under the keyword the model's forward names (``cache`` from transformers 5.24,
    ``past_key_values`` before); a forward that accepts it and does not use it would score answers without their
    prompt, so scoring stops instead."""
    from dataclasses import replace

    import pytest

    from margincal.data.records import encode_qa
    from margincal.model.scoring import cache_keyword, score_dataset
    from tests.conftest import RECORDS

    class DropsCache(torch.nn.Module):  # a wrapper (like peft's) that loses the cache on its way to the model
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_base_model(self):
            return self.inner

        def forward(self, **kwargs):
            kwargs.pop(cache_keyword(self.inner), None)
            return self.inner(**kwargs)

    shared = tiny_examples + encode_qa(tiny_tokenizer, [replace(r, answer=r.answer[::-1]) for r in RECORDS], 64)
    with pytest.raises(RuntimeError, match="did not extend the prompt cache"):
        score_dataset(DropsCache(tiny_model), shared, tiny_tokenizer.pad_token_id)
