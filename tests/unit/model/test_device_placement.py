"""Tensors a function makes itself live on its inputs' device (the GPU acceptance run's failures, caught on a CPU).

The first H100 run (benchmarks/RESULTS.md) failed where a helper built an index on the CPU and met a CUDA tensor (the
gradnorm detector's EOS mask). Here the inputs live
on the ``meta`` device: a CPU tensor meeting one raises exactly as it does against a CUDA one, and no data is needed.
"""

from __future__ import annotations

import torch
from conftest import load_benchmark

from margincal.evaluation.metrics import group_mean, prob_normalised, without_eos
from margincal.evaluation.mia import _nll_without_eos
from margincal.mini.data import MiniConfig, generate
from margincal.model.quantize import reference_4bit
from margincal.model.scoring import TokenStats

META = torch.device("meta")


def _stats() -> TokenStats:
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return TokenStats(gold=torch.zeros(2, 3, device=META), mask=mask.to(META))


def test_the_eos_mask_and_the_gradnorm_loss_stay_on_the_statistics_device():
    stats = _stats()
    assert without_eos(stats).device == META
    assert _nll_without_eos(stats).device == META


def test_group_means_and_option_probabilities_stay_on_the_values_device():
    values = torch.zeros(4, device=META)
    assert group_mean(values, [0, 0, 1, 1], 2).device == META
    assert prob_normalised(torch.zeros(2, device=META), values, [0, 0, 1, 1]).device == META


def test_the_pure_torch_4bit_codebook_runs_on_the_weights_device():
    assert reference_4bit(torch.zeros(4, 64, device=META), "nf4").device == META


def test_attention_flops_count_grouped_query_heads_like_full_ones():
    """By hand, q [1, 4, 3, 8] against key/value [1, 2, 3, 8]: QKᵀ and PV are each 2·(4·3·3·8) = 576 FLOPs (1152);
    the backward's five matmuls 5·576 = 2880. torch 2.11's own formula refused these shapes on the H100."""
    cell_speed = load_benchmark("speed/cell_speed")
    q, kv = (1, 4, 3, 8), (1, 2, 3, 8)
    assert cell_speed.gqa_sdpa_flops(q, kv, kv) == 1152
    assert cell_speed.gqa_sdpa_backward_flops(q, q, kv, kv) == 2880


def test_the_acceptance_cells_data_is_within_the_generators_reach():
    """The first H100 run's cell stopped at the data: TOFU's 117 world facts exceed the generator's 48."""
    sizes = load_benchmark("gpu/acceptance").CELL_SIZES
    splits = generate(MiniConfig(n_templates=10, **sizes)).splits
    assert (len(splits["forget10"]), len(splits["holdout"]), len(splits["world_facts"])) == (40, 40, 40)
