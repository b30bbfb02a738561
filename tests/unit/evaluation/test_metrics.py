"""TOFU metrics and MIA detectors on hand-built inputs with exact expected values."""

import math
import zlib

import pytest
import torch

from margincal.evaluation import metrics as M
from margincal.evaluation import mia
from margincal.model.scoring import TokenStats
from margincal.results import metric_table as T


def stats(gold, competitor, lengths, entropy=None, logp_sq=None):
    """Answer-aligned stats from per-row lists (rows right-padded to a common width)."""
    width = max(lengths)

    def pad(rows):
        return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float)

    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    ent = pad(entropy) if entropy else torch.zeros(len(lengths), width)
    sq = pad(logp_sq) if logp_sq else torch.zeros(len(lengths), width)
    return TokenStats(pad(gold), pad(competitor), ent, mask, torch.arange(len(lengths)), sq)


def test_rouge_l_recall_and_f1_on_fixed_strings():
    recall, f1 = M.rouge_l("the cat sat on the mat", "the cat on mat")  # LCS 4 of 6 gold words, 4 of 4 generated
    assert recall == pytest.approx(4 / 6) and f1 == pytest.approx(2 * (4 / 6) * 1 / (4 / 6 + 1))


def test_exact_memorization_and_extraction_strength():
    # row 0: hits [miss, hit, hit] + EOS; row 1: hits [hit, miss] + EOS; row 2: all miss (1 token) + EOS
    s = stats(
        gold=[[-1, -0.1, -0.2, -9], [-0.1, -2, -9], [-3, -9]],
        competitor=[[-0.5, -2, -3, -0.1], [-3, -1, -0.1], [-1, -0.1]],
        lengths=[4, 3, 2],
    )
    assert M.exact_memorization(s).tolist() == pytest.approx([2 / 3, 1 / 2, 0.0])  # the EOS position is dropped
    # ES = 1 − k*/L: row 0 suffix from k=1 → 1 − 1/3; row 1 no suffix → k = L−1 = 1 → 1/2; row 2 → 1/1 quirk
    assert M.extraction_strength(s).tolist() == pytest.approx([2 / 3, 1 / 2, 1.0])


def test_truth_ratio_and_its_aggregations_on_fixed_losses():
    ratios = M.truth_ratio(torch.tensor([1.0, 1.0]), torch.tensor([2.0, 0.0]))  # e^-2/e^-1 and e^0/e^-1
    assert ratios.tolist() == pytest.approx([math.exp(-1), math.e])
    assert M.closer_to_1_better(ratios) == pytest.approx(math.exp(-1))  # min(R, 1/R) = e^-1 for both
    assert M.true_better(ratios) == pytest.approx((1 - math.exp(-1) + 0.0) / 2)
    assert M.group_mean(torch.tensor([1.0, 3.0, 5.0]), [0, 0, 1], 2).tolist() == [2.0, 5.0]


def test_normalised_probability():
    # p_true = 1, two perturbed answers with p = 1/2 each → 1 / (1 + 1) = 1/2
    value = M.prob_normalised(torch.tensor([0.0]), torch.tensor([math.log(2), math.log(2)]), [0, 0])
    assert float(value) == pytest.approx(0.5)


def test_forget_quality_ks_p_values():
    assert M.forget_quality([0.1, 0.2, 0.3], [0.1, 0.2, 0.3]) == pytest.approx(1.0)
    # disjoint samples of 5: exact two-sided p = 2 / C(10, 5)
    assert M.forget_quality(range(5), range(10, 15)) == pytest.approx(2 / 252)


def test_model_utility_harmonic_mean_and_zero():
    values = dict.fromkeys(T.MU_KEYS, 0.5) | {"wf_Truth_Ratio": 1.0}
    assert T.model_utility(values, {}) == pytest.approx(9 / (8 * 2 + 1))
    assert T.model_utility(values | {"ra_Q_A_ROUGE": 0.0}, {}) == 0.0
    assert T.model_utility({"retain_Q_A_Prob": 1.0}, {}) is None  # MU needs all nine


def test_mia_scores_on_hand_built_stats():
    s = stats(
        gold=[[-1.0, -3.0, -2.0, -4.0, -0.5, -9.0]],
        competitor=[[0.0] * 6],
        lengths=[6],
        entropy=[[1.0] * 6],
        logp_sq=[[5.0] * 6],
    )
    assert float(mia.loss_score(s)) == pytest.approx(19.5 / 6)  # EOS included
    # min-k, k = 0.4 over the 5 non-EOS log-probs: lowest ⌊2⌋ = −4, −3 → 3.5
    assert float(mia.min_k_score(s)) == pytest.approx(3.5)
    # μ = −1, σ² = 5 − 1 = 4: z = (log p + 1)/2 → lowest two −1.5, −1 → 1.25
    assert float(mia.min_k_plus_plus_score(s)) == pytest.approx(1.25)
    assert float(mia.zlib_score(s, ["abc"])) == pytest.approx((19.5 / 6) / len(zlib.compress(b"abc")))


def test_auc_advantage_and_privleak():
    assert mia.auc([1, 2], [3, 4]) == 1.0  # forget losses all lower: fully separable
    assert mia.auc([1, 3], [2, 4]) == 0.75
    assert mia.auc([3, 4], [1, 2]) == 0.0  # reversed
    assert T.advantage({"a": 0.9, "b": 0.1}, {}) == pytest.approx(0.4)  # per detector, no cancellation
    assert T.privleak(0.8, 0.5) == pytest.approx(-60.0)
    assert T.privleak(0.5, 0.5) == pytest.approx(0.0)


def test_gradnorm_is_positive_capped_and_leaves_no_gradients(tiny_model, tiny_tokenizer, tiny_examples):
    scores, _ = mia.gradnorm_scores(tiny_model, tiny_examples, tiny_tokenizer.pad_token_id)
    assert scores.shape == (len(tiny_examples),) and bool((scores > 0).all()) and bool((scores <= 1e6).all())
    assert all(p.grad is None for p in tiny_model.parameters())


def test_fact_recall_counts_whole_word_values_case_insensitively():
    from margincal.data.records import QARecord

    assert M.fact_recall(["Velmora", "1953"], "Born in velmora in 1954.") == 0.5
    assert M.fact_recall(["The Silent Harbor", "cat"], "They wrote The Silent Harbor; a catalogue.") == 0.5
    with pytest.raises(ValueError, match="gold value"):
        M.fact_recall([], "anything")
    recs = [QARecord("q", "a b", meta={"content": {"city": "Ostrand"}}), QARecord("q", "c d")]
    _, samples = M.rouge_l_samples(recs, ["Ostrand it is", "c d"])
    assert samples[0]["fact_recall"] == 1.0 and "fact_recall" not in samples[1]
    assert M.mean_fact_recall(samples) is None and M.mean_fact_recall(samples[:1]) == 1.0
