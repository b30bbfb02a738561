"""The audit: its statistics on hand-checked arrays, open-unlearning logs, pinned hub revisions, budgets, the
bitsandbytes quantizer against its documented codebook, and the sanity anchors end to end on the smoke mini."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

import margincal
from margincal.auditing.card import added, added_fraction, fmt_fraction, pooled_bootstrap, recovered
from margincal.auditing.interop import read_retain_logs, summary
from margincal.auditing.plan import load_budget
from margincal.auditing.rules import CardRules, ClaimedRule, DegenerateRule, card_rules
from margincal.config.settings import resolve_attack
from margincal.config.typed import ConfigError, build
from margincal.core.errors import InputError
from margincal.data.hub import pinned, split_revision
from margincal.data.records import QARecord
from margincal.evaluation.metrics import repeated_ngrams
from margincal.evaluation.tofu import records_digest
from margincal.results.cards import CheckpointCard, Estimate, Lineage, Sanity
from margincal.results.metric_table import MU_KEYS

# QLoRA (Dettmers et al. 2023), Appendix E: the 16 NormalFloat4 values bitsandbytes documents for NF4
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
       0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]  # fmt: skip


def test_recovered_fraction_of_hand_arrays():
    floor, ceiling = np.zeros((1, 4)), np.ones((1, 4))
    value, boot = recovered(np.full((1, 4), 0.25), floor, ceiling)
    assert value == Estimate(value=0.25, ci=[0.25, 0.25]) and boot.shape == (2000,)
    # pooled over two draws: attacked means 0.2 and 0.6 -> 0.4 of a floor-to-ceiling gap of 1
    value, _ = recovered(np.array([[0.2, 0.2], [0.6, 0.6]]), np.zeros((2, 2)), np.ones((2, 2)))
    assert value.value == pytest.approx(0.4)
    assert 0.2 <= value.ci[0] < 0.4 < value.ci[1] <= 0.6  # the draws are resampled: the spread between them
    # what the attack added, on the same records: 0.6 − 0.25 = 0.35 of ROUGE-L, 0.35 / 0.5 of a gap of 0.5
    attacked, unattacked = np.array([[0.5, 0.7]]), np.full((1, 2), 0.25)
    plus = added(attacked, unattacked)
    assert plus.value == pytest.approx(0.35) and 0.25 <= plus.ci[0] < 0.35 < plus.ci[1] <= 0.45
    share = added_fraction(attacked, unattacked, np.zeros((1, 2)), np.full((1, 2), 0.5))
    assert share.value == pytest.approx(0.7)


def test_the_sanity_rule_and_degenerate_answers_by_hand():
    claimed = ClaimedRule(0.01, {"privleak": 1.0, "forget_quality": 0.5}, ["forget_quality"])
    rules = CardRules(ceiling_tolerance=0.1, min_gap=0.05, degenerate=DegenerateRule(3, 0.5, 4, 0.25), claimed=claimed)
    assert rules.sanity(floor=0.2, ceiling=0.9, theta0=0.95) == Sanity(valid=True, why=None)
    lowered = rules.sanity(floor=0.2, ceiling=0.8, theta0=0.95)  # θ0 lost 0.15 > 0.1 under the attack
    assert not lowered.valid and lowered.why.startswith("it lowers θ0 from 0.950 to 0.800")
    close = rules.sanity(floor=0.5, ceiling=0.52, theta0=0.55)
    assert not close.valid and close.why == "the floor 0.500 is within 0.05 of the ceiling 0.520"
    assert card_rules() == CardRules(0.1, 0.05, DegenerateRule(3, 0.5, 4, 0.25), claimed)  # the shipped rules
    # claims: |0.50 − 0.505| ≤ 0.01; privleak |10 − 12| > 1.0; forget_quality log10(1e-3 / 2e-3) = −0.301 within 0.5,
    # log10(1e-3 / 1e-1) = −2 not; a p-value of 0 has no log; a file's own tolerance 0.2 wins over 0.01
    assert claimed.within("forget_Q_A_ROUGE", 0.50, 0.505, None) == (pytest.approx(-0.005), 0.01, True)
    assert claimed.within("privleak", 10.0, 12.0, None) == (-2.0, 1.0, False)
    assert claimed.within("forget_quality", 1e-3, 2e-3, None) == (pytest.approx(-0.30103), 0.5, True)
    assert claimed.within("forget_quality", 1e-3, 1e-1, None)[2] is False
    assert claimed.within("forget_quality", 0.0, 1e-1, None) == (float("inf"), 0.5, False)
    assert claimed.within("model_utility", 0.5, 0.6, 0.2)[1:] == (0.2, True)
    # "a b c a b c a b c": 7 word 3-grams, 4 repeat an earlier one (4/7 >= 0.5); "a b c a": 2 < 4 n-grams
    assert repeated_ngrams("a b c a b c a b c", 3) == (pytest.approx(4 / 7), 7)
    assert rules.degenerate("A b c a b c a b c") and not rules.degenerate("a b c a")
    assert not rules.degenerate("The author was born in Paris in 1961 to a family of tailors")


def test_pooled_bootstrap_pairs_the_arrays():
    a = np.array([[0.0, 1.0, 2.0, 3.0]])
    same = pooled_bootstrap([a, a], lambda x, y: x - y)
    assert np.all(same == 0)  # identical resample indices for every array
    assert np.array_equal(pooled_bootstrap([a], lambda x: x), pooled_bootstrap([a], lambda x: x))  # seeded


def _ou_log(n: int) -> dict:
    return {
        "forget_truth_ratio": {"agg_value": 0.6, "value_by_index": {str(i): {"score": 0.1 * i} for i in range(n)}},
        "mia_min_k": {"agg_value": 0.42},
        "forget_Q_A_ROUGE": {"agg_value": 0.3, "value_by_index": {}},
    }


def test_open_unlearning_retain_logs_become_the_reference(tmp_path):
    log = _ou_log(12)  # keys in JSON order "0", "1", "10", "11", "2", ...: read in index order
    path = tmp_path / "TOFU_EVAL.json"
    path.write_text(json.dumps(dict(sorted(log.items()))))
    forget = [QARecord(f"q{i}", f"a{i}") for i in range(12)]
    ref = read_retain_logs(path, forget)
    assert ref["reference"]["splits"]["forget"]["truth_ratios"] == pytest.approx([0.1 * i for i in range(12)])
    assert ref["reference"]["summary"] == {"mia_min_k_auc": 0.42}
    assert ref["reference"]["splits"]["forget"]["digest"] == records_digest(forget)
    with pytest.raises(ValueError, match="holds 12 forget truth ratios; the forget split audited has 10"):
        read_retain_logs(path, forget[:10])
    path.write_text(json.dumps({"forget_quality": 0.5}))
    with pytest.raises(ValueError, match="not its TOFU_SUMMARY.json"):
        read_retain_logs(path, forget)
    assert summary({"forget_Q_A_ROUGE": 0.5, "mia_min_k_auc": 0.7, "m": 1.0, "privleak": None}) == {
        "forget_Q_A_ROUGE": 0.5,
        "mia_min_k": 0.7,
    }


def test_hub_revisions_pin_to_commits(tmp_path, monkeypatch):
    assert split_revision("org/model@v1") == ("org/model", "v1")
    assert split_revision("org/model") == ("org/model", None)
    with pytest.raises(ValueError, match="give a revision after '@'"):
        split_revision("org/model@")
    sha = "a" * 40
    assert pinned("org/model", sha) == f"org/model@{sha}"
    refs = tmp_path / "models--org--model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("b" * 40)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pinned("org/model") == "org/model@" + "b" * 40  # offline: the local cache's ref
    assert pinned("org/model", "v2") == "org/model@v2"  # not cached, no hub: stays unpinned


def test_budgets_and_the_epoch_schedule():
    quick = load_budget("quick")
    assert [s.label for s in quick.specs()] == ["lora_r8@5", "lora_r8@20"] and quick.quantizers == ["nf4"]
    standard = load_budget("standard", ["draws=2"])
    assert standard.draws == 2 and set(standard.quantizers) == {"nf4", "fp4", "int8"}
    assert load_budget("paper").headline == "lora_r8@20"
    with pytest.raises(ConfigError, match=r"draws must be an integer in \[1, 100\]"):
        load_budget("quick", ["draws=0"])
    with pytest.raises(ValueError, match="unknown audit budget 'huge'"):
        load_budget("huge")
    # one epoch over D_rel at open-unlearning's relearn batch of 8 x 4
    assert resolve_attack("fpft_epoch", "paper", k=20).train.steps == 1
    assert resolve_attack("fpft_epoch", "paper", k=100).train.steps == math.ceil(100 / 32)
    assert resolve_attack("fpft_epoch", "mini", k=20).train.lr == 6e-4


def test_the_codebooks_are_bitsandbytes_documented_tables():
    import bitsandbytes.functional as F

    from margincal.model.quantize import CODEBOOKS

    assert CODEBOOKS["nf4"] == tuple(NF4)
    for quant_type, values in CODEBOOKS.items():
        assert F.get_4bit_type(quant_type, device="cpu").tolist() == pytest.approx(values, abs=1e-7)


def _aligned_model(tiny_tokenizer):
    """Every projection's rows (in_features) a multiple of the 64-weight block, as in every real model."""
    from margincal.mini.models import MiniArch, new_mini_model

    arch = MiniArch(vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2)
    return new_mini_model(arch, tiny_tokenizer, seed=0)


def test_nf4_weights_of_aligned_layers_are_bitsandbytes_codebook_values(tiny_tokenizer, tmp_path):
    """The quantizer is bitsandbytes': each block of 64 weights dequantizes to absmax × the NF4 value nearest to
    w / absmax (QLoRA's documented codebook), checked by hand on one 64-aligned layer, on every CPU; the loader's
    own check agrees and keeps nothing in full precision."""
    import bitsandbytes.functional as F

    from margincal.model.quantize import load_quantized, resolve_quantizer

    model = _aligned_model(tiny_tokenizer)
    model.save_pretrained(tmp_path / "m")
    original = model.model.layers[0].mlp.up_proj.weight.detach().flatten()
    quantized, check = load_quantized(tmp_path / "m", resolve_quantizer("nf4"))
    layer = quantized.model.layers[0].mlp.up_proj
    assert type(layer).__name__ == "Linear4bit"
    dequantized = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state).flatten().float()
    blocks = original.view(-1, 64)
    absmax = blocks.abs().max(dim=1, keepdim=True).values
    codes = torch.tensor(NF4)
    nearest = codes[(blocks / absmax).unsqueeze(-1).sub(codes).abs().argmin(-1)]
    torch.testing.assert_close(dequantized.view(-1, 64), nearest * absmax, rtol=1e-3, atol=1e-6)
    checked = {"model.layers.0.self_attn.q_proj": {"shape": [64, 64], "off_codebook": 0.0}}
    assert check == {"codebook": "nf4", "layers_4bit": 14, "checked": checked, "full_precision": []}
    assert quantized(input_ids=torch.tensor([[1, 2, 3]])).logits.isfinite().all()


def test_a_bfloat16_checkpoint_holds_the_codebook_at_bfloat16_rounding(tiny_tokenizer, tmp_path):
    """A GPU loads bf16 checkpoints and bitsandbytes dequantizes to bf16 (3 significant digits): every weight is on
    the codebook up to that rounding, so the check passes (at 1e-3 relative it flagged most of them)."""
    from margincal.model.quantize import load_quantized, resolve_quantizer

    _aligned_model(tiny_tokenizer).to(torch.bfloat16).save_pretrained(tmp_path / "m")
    quantized, check = load_quantized(tmp_path / "m", resolve_quantizer("nf4"))
    layer = quantized.model.layers[0].self_attn.q_proj
    assert layer.weight.quant_state.dtype == torch.bfloat16
    assert check["checked"]["model.layers.0.self_attn.q_proj"]["off_codebook"] == 0.0 and not check["full_precision"]


def _off_codebook_when(monkeypatch, unaligned_only: bool) -> None:
    """bitsandbytes as the AVX512-BF16 EPYC runs it (issue 39): right absmax, values off the codebook for layers
    whose rows are not a multiple of the block (``unaligned_only``) or, worse, for every layer."""
    import bitsandbytes.functional as F

    real = F.dequantize_4bit

    def skewed(a, state, *args, **kwargs):
        out = real(a, state, *args, **kwargs)
        return out.roll(1, dims=-1) if state.shape[-1] % 64 or not unaligned_only else out

    monkeypatch.setattr(F, "dequantize_4bit", skewed)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_layers_bitsandbytes_did_not_quantize_to_the_codebook_are_kept_in_full_precision(
    quant_type, tiny_model, tmp_path, monkeypatch
):
    """The tiny model's attention and up/gate projections have 32-weight rows. Whatever this CPU's bitsandbytes
    does with them, margincal computes nothing under a codebook it did not apply: each 4-bit layer holds the
    codebook, or it was kept in full precision (its weights exactly the checkpoint's). Where the unaligned layers
    are off it (forced here, as the AVX512-BF16 EPYC does), all 12 of them are reloaded in full precision and named."""
    from margincal.model.quantize import load_quantized, off_codebook, resolve_quantizer

    tiny_model.save_pretrained(tmp_path / "m")
    weights = dict(tiny_model.named_parameters())
    quantized, check = load_quantized(tmp_path / "m", resolve_quantizer(quant_type))  # as this CPU runs it
    for name, module in quantized.named_modules():
        if type(module).__name__ == "Linear4bit":
            assert off_codebook(module, weights[f"{name}.weight"], quant_type) <= 0.01
        elif name in check["full_precision"]:
            assert torch.equal(module.weight, weights[f"{name}.weight"])
    _off_codebook_when(monkeypatch, unaligned_only=True)
    quantized, check = load_quantized(tmp_path / "m", resolve_quantizer(quant_type))
    layers = [(n, m) for n, m in tiny_model.named_modules() if n.startswith("model.layers")]
    unaligned = [n for n, m in layers if isinstance(m, torch.nn.Linear) and m.in_features == 32]
    assert sorted(check["full_precision"]) == sorted(unaligned) and len(unaligned) == 12
    assert check["checked"]["model.layers.0.self_attn.q_proj"]["off_codebook"] > 0.5
    assert check["checked"]["model.layers.0.mlp.down_proj"]["off_codebook"] == 0.0
    kinds = {n: type(m).__name__ for n, m in quantized.named_modules() if n in unaligned or n.endswith("down_proj")}
    assert kinds == {n: "Linear" for n in unaligned} | {f"model.layers.{i}.mlp.down_proj": "Linear4bit" for i in (0, 1)}
    for name in unaligned:
        assert torch.equal(quantized.get_submodule(name).weight, weights[f"{name}.weight"])


def test_an_aligned_layer_off_the_codebook_stops_the_load_with_one_line(tiny_model, tmp_path, monkeypatch):
    import bitsandbytes

    from margincal.core.artifacts import cpu_name
    from margincal.core.errors import CodebookError
    from margincal.model.quantize import load_quantized, resolve_quantizer

    tiny_model.save_pretrained(tmp_path / "m")
    _off_codebook_when(monkeypatch, unaligned_only=False)
    with pytest.raises(CodebookError) as err:
        load_quantized(tmp_path / "m", resolve_quantizer("nf4"))
    message = str(err.value)
    assert "\n" not in message and "model.layers.0.mlp.down_proj (32, 64)" in message
    assert f"bitsandbytes {bitsandbytes.__version__}" in message and cpu_name() in message


SMOKE_BUDGET = [
    "attackers=[{preset: lora_r8, k: [4], set: {train.steps: 3, train.batch_size: 4}}]",
    "headline=lora_r8@4",
]


@pytest.fixture(scope="module")
def audited(memorising_mini):
    """θ0, θ_ref, a GradDiff checkpoint and an undertrained one (one GradDiff step) audited side by side."""
    from margincal.cli import main

    root = memorising_mini.root
    store = root / "store"
    theta0, ref, data = memorising_mini.paths.theta0, memorising_mini.paths.ref, memorising_mini.data
    for name, steps in (("graddiff", 12), ("undertrained", 1)):
        assert main(["unlearn", "--method", "GradDiff", "--model", str(theta0), "--forget", str(data / "forget10.json"),
                     "--retain", str(data / "retain90.json"), "--scale", "mini", "--out", str(root / name),
                     f"train.steps={steps}"]) == 0  # fmt: skip
    args = ["audit", "--model", f"original={theta0}", "--model", f"retrained={ref}",
            "--model", f"graddiff={root / 'graddiff'}", "--model", f"undertrained={root / 'undertrained'}",
            "--data", str(data), "--benchmark", "mini", "--ref", str(ref), "--theta0", str(theta0),
            "--store", str(store), "--batch-size", "16", *SMOKE_BUDGET]  # fmt: skip
    assert main([*args, "--out", str(root / "card")]) == 0
    return root, args


def test_audit_sanity_anchors(audited):
    root, _ = audited
    card = json.loads((root / "card" / "card.json").read_text())
    cards = card["checkpoints"]
    original, retrained, graddiff = cards["original"], cards["retrained"], cards["graddiff"]
    # θ_ref audited against itself: Δ = 0 and nothing recovered beyond the floor; θ0: Δ > 0 and at the ceiling
    assert retrained["delta"]["value"] == 0.0 and retrained["delta"]["ci"] == [0.0, 0.0]
    assert original["delta"]["value"] > 0.5
    for verdicts in ("attacks", "quantization"):
        for label, v in original[verdicts].items():
            # θ0 audited: its unattacked level is the ceiling's, and what it added is what θ0 gained
            assert v["unattacked_rouge_l"] == v["detail"]["rouge_l"]["ceiling_unattacked"], label
            assert v["added"]["value"] == pytest.approx(v["rouge_l"] - v["unattacked_rouge_l"]), label
            if v["sanity"]["valid"]:
                assert v["recovered_fraction"]["value"] == pytest.approx(1.0), label
                assert retrained[verdicts][label]["recovered_fraction"]["value"] == pytest.approx(0.0), label
            else:  # an invalid attack gives no fraction, and says why in numbers
                assert v["recovered_fraction"]["value"] is None, label
                assert v["recovered_fraction"]["why"].startswith("invalid at this scale"), label
    assert original["weight_distance"] == 0.0 and graddiff["weight_distance"] > 0
    assert original["quantization"]["nf4"]["rouge_l"] >= 0.9  # NF4 keeps θ0's memory (measured: 1.000)
    # GradDiff unlearned: below θ0 on the margin axis, and below one step of it
    undertrained = cards["undertrained"]
    assert graddiff["delta"]["value"] < undertrained["delta"]["value"] < original["delta"]["value"]
    attacked = {n: c["attacks"]["lora_r8@4"]["rouge_l"] for n, c in cards.items()}
    assert attacked["graddiff"] < attacked["undertrained"]  # measured (AMD EPYC): 0.707 < 0.883 held-out ROUGE-L
    # the smoke attack (3 steps) lowers θ0's held-out ROUGE-L from 1.000 to 0.870: invalid at this scale, said so
    assert original["attacks"]["lora_r8@4"]["sanity"] == {
        "valid": False,
        "why": "it lowers θ0 from 1.000 to 0.870 (more than the tolerance 0.1)",
    }
    required = {"delta", "certified", "mia", "utility", "attacks", "quantization", "reference"}
    for name in cards:
        one = json.loads((root / "card" / name / "card.json").read_text())
        assert required <= set(one) and "ci" in one["delta"]
        attack = one["attacks"]["lora_r8@4"]
        assert {"budget", "recovered_fraction", "rouge_l", "fact_recall"} <= set(attack)
        assert attack["budget"]["k"] == 4 and attack["budget"]["steps"] == 3
        assert set(one["mia"]["detectors"]["loss"]) >= {"auc", "advantage", "overshoot"}
        assert one["quantization"]["nf4"]["budget"]["quant_type"] == "nf4"
        assert one["reference"]["reference"]["serves_as"] == "floor"
        template = {"name": "mini", "mode": "separate", "chat_template": one["checkpoint"]["template"]["chat_template"]}
        assert one["checkpoint"]["template"] == one["reference"]["theta0"]["template"] == template
        assert set(attack["degenerate"]) == {"share", "unattacked_share", "flagged"}
    typed = margincal.load(root / "card")  # card.json is the AuditCard saved: its JSON, kind and version first
    assert [*card][:2] == ["kind", "schema_version"] and typed.to_dict() == {
        k: card[k] for k in card if k != "manifest"
    }
    assert typed.checkpoints["graddiff"] == margincal.load(root / "card" / "graddiff")
    population = json.loads((root / "card" / "population.json").read_text())
    assert population["n_checkpoints"] == 4
    assert set(population["predictors"]["delta"]) == {"spearman", "pearson"}
    pairs = {(p["checkpoint"], p["versus"]) for p in card["paired"]}
    assert len(pairs) == 6 and ("undertrained", "graddiff") in pairs  # every pair of four checkpoints
    text = (root / "card" / "card.md").read_text()
    assert "## Side by side" in text and "## Population" in text and "bitsandbytes 4-bit, nf4" in text
    # every table of numbers renders: each of its rows has its header's columns (a `|` in a cell is escaped)
    tables = [t for t in re.findall(r"(?:^\|.*\|\n)+", text, flags=re.M) if not t.startswith("| question |")]
    columns = [{len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()} for table in tables]
    assert len(tables) > 5 and all(len(c) == 1 for c in columns) and "advantage \\|AUC − 0.5\\|" in text
    assert (root / "card" / "figures" / "original-margins.png").stat().st_size > 0
    assert json.loads((root / "card" / "open-unlearning" / "graddiff_TOFU_SUMMARY.json").read_text())


def test_the_per_sample_export_holds_every_answer_of_the_card(audited):
    import pyarrow.parquet as pq

    from margincal.auditing.exports import SCHEMA

    root, _ = audited
    table = pq.read_table(root / "card" / "samples.parquet")
    assert [(f.name, str(f.type)) for f in table.schema] == [(n, "double" if t == "float64" else t) for n, t in SCHEMA]
    assert table.schema.metadata[b"schema"] == b"1"
    rows = table.to_pylist()
    card = json.loads((root / "card" / "graddiff" / "card.json").read_text())
    # 6 models (4 audited, θ_ref, θ0) × (10 unattacked + 6 held out under lora_r8@4 + 10 under nf4) records
    assert len(rows) == 6 * (10 + 6 + 10)
    mine = [r for r in rows if r["model"] == "graddiff" and r["row"] == "lora_r8@4"]
    assert sum(r["rouge_l"] for r in mine) / len(mine) == pytest.approx(card["attacks"]["lora_r8@4"]["rouge_l"])
    assert json.loads(mine[0]["config"]) == card["attacks"]["lora_r8@4"]["budget"] and mine[0]["draw"] == 0
    before = [r for r in rows if r["model"] == "graddiff" and r["kind"] == "unattacked"]
    assert [r["record"] for r in before] == list(range(10)) and before[0]["draw"] is None


def test_retain_only_and_out_of_domain_relearning(audited, memorising_mini, capsys):
    """The retain and probe threat families: D_rel drawn from those splits, every forget record scored, each row
    with floor and ceiling; data without the probe split stops before compute."""
    import shutil

    import pyarrow.parquet as pq

    from margincal.cli import main

    root, _ = audited
    small = "set: {train.steps: 2, train.batch_size: 4}"
    budget = [f"attackers=[{{preset: lora_r8_retain, k: [4], {small}}}, {{preset: lora_r8_ood, k: [4], {small}}}]",
              "headline=lora_r8_retain@4", "quantizers=[]"]  # fmt: skip
    args = ["audit", "--model", f"graddiff={root / 'graddiff'}", "--data", str(memorising_mini.data), "--benchmark",
            "mini", "--ref", str(memorising_mini.paths.ref), "--theta0", str(memorising_mini.paths.theta0),
            "--store", str(root / "store"), *budget]  # fmt: skip
    assert main([*args, "--out", str(root / "families")]) == 0
    card = json.loads((root / "families" / "graddiff" / "card.json").read_text())
    for label, data in (("lora_r8_retain@4", "retain"), ("lora_r8_ood@4", "probe")):
        row = card["attacks"][label]
        assert row["budget"]["data"] == data and row["budget"]["k"] == 4
        assert {"floor", "ceiling", "unattacked", "added"} <= set(row["detail"]["rouge_l"])
    samples = pq.read_table(root / "families" / "samples.parquet").to_pylist()
    retain_rows = [r for r in samples if r["model"] == "graddiff" and r["row"] == "lora_r8_retain@4"]
    assert [r["record"] for r in retain_rows] == list(range(10))  # every forget record is scored
    unattacked = [r for r in samples if r["model"] == "graddiff" and r["kind"] == "unattacked"]
    assert card["attacks"]["lora_r8_retain@4"]["unattacked_rouge_l"] == pytest.approx(
        sum(r["rouge_l"] for r in unattacked) / len(unattacked)
    )
    noprobe = root / "noprobe"
    shutil.copytree(memorising_mini.data, noprobe)
    (noprobe / "probe.json").unlink()
    args[args.index(str(memorising_mini.data))] = str(noprobe)
    capsys.readouterr()
    assert main([*args, "--out", str(root / "never")]) == 2
    assert "the budget's attacks on probe data draw from it" in capsys.readouterr().err
    assert not (root / "never").exists()
    args[args.index(str(noprobe))] = str(memorising_mini.data)
    # in-context relearning: on this fixture's tokenizer one pair before a question already exceeds max_length 96
    assert main([*args, "attackers=[{preset: in_context, k: [1]}]", "headline=in_context@1", "--out", "never"]) == 2
    assert "1 forget QA pairs before a question exceed the 96 tokens" in capsys.readouterr().err


def test_a_second_audit_reuses_every_stage(audited, capsys):
    from margincal.cli import main

    root, args = audited
    capsys.readouterr()
    assert main([*args, "--out", str(root / "again")]) == 0
    out = capsys.readouterr().out
    stages = re.search(r"(\d+) stages \((\d+) cached\)", out)
    assert stages and stages[1] == stages[2] == "18"  # 6 models × (evaluate, attack, quantize), all reused
    # the library on the same inputs: the same stages, read from the store, and the card the CLI wrote, typed
    theta0, ref = args[args.index("--theta0") + 1], args[args.index("--ref") + 1]
    models = {
        "original": theta0,
        "retrained": ref,
        "graddiff": root / "graddiff",
        "undertrained": root / "undertrained",
    }
    lines: list[str] = []
    card = margincal.audit(
        {name: str(path) for name, path in models.items()}, out=root / "api", data=args[args.index("--data") + 1],
        benchmark="mini", ref=ref, theta0=theta0, store=args[args.index("--store") + 1], settings={"batch_size": 16},
        overrides=SMOKE_BUDGET, log=lines.append,
    )  # fmt: skip
    assert "18 stages (18 cached)" in lines[0] and card == margincal.load(root / "api")
    written = margincal.load(root / "again")
    assert isinstance(written, margincal.AuditCard) and written.checkpoints == card.checkpoints
    assert card.delta("retrained") == 0.0 and card.headline == "lora_r8@4"
    assert card.recovered("original") == written.checkpoints["original"].attacks["lora_r8@4"].recovered_fraction.value
    # `margincal evaluate` of θ_ref on the audit's data and settings is the audit's stored evaluation of θ_ref
    data, store = args[args.index("--data") + 1], args[args.index("--store") + 1]
    capsys.readouterr()
    evaluate = [
        "evaluate",
        "--model",
        ref,
        "--benchmark",
        "mini",
        "--data",
        data,
        "--store",
        store,
        "--batch-size",
        "16",
    ]
    assert main([*evaluate, "--out", str(root / "ref.json")]) == 0
    assert "(read from the store)" in capsys.readouterr().out
    evaluation = margincal.load(root / "ref.json")
    assert evaluation.cached and evaluation.summary["m"] == card.checkpoints["retrained"].delta.m_ref


def test_a_model_held_in_memory_gets_the_card_its_saved_directory_gets(audited, tmp_path):
    """``margincal.audit`` on a model in memory (no tokenizer: θ0's scores it) runs the graph its saved directory
    runs: the same identity, so every stage is read from the store, and the same card but for the name it is shown
    by and the margincal run a directory's ``stage.json`` names; the temporary copy is gone afterwards."""
    from transformers import AutoModelForCausalLM

    root, args = audited
    theta0, ref = args[args.index("--theta0") + 1], args[args.index("--ref") + 1]
    data, store = args[args.index("--data") + 1], Path(args[args.index("--store") + 1])
    model = AutoModelForCausalLM.from_pretrained(root / "graddiff" / "model")
    lines: list[str] = []
    card = margincal.audit(
        {"graddiff": model}, out=tmp_path / "held", data=data, benchmark="mini", ref=ref, theta0=theta0,
        store=store, settings={"batch_size": 16}, overrides=SMOKE_BUDGET, log=lines.append,
    )  # fmt: skip
    assert "9 stages (9 cached)" in lines[0]  # θ_ref, θ0 and the held model: evaluate, attack, quantize each
    held, saved = card.checkpoints["graddiff"], margincal.load(root / "card").checkpoints["graddiff"]
    assert (held.checkpoint.model, held.provenance.model) == ("LlamaForCausalLM held in memory",) * 2
    assert held.provenance.produced_by is None and saved.provenance.produced_by is not None
    shown = {"checkpoint": {"model": None}, "provenance": {"model": None, "produced_by": None}}

    def unnamed(c):
        return {k: {**v, **shown[k]} if k in shown else v for k, v in c.to_dict().items()}

    assert held.checkpoint.identity == saved.checkpoint.identity and unnamed(held) == unnamed(saved)
    assert not any((store / "held").iterdir())
    with pytest.raises(InputError, match="graddiff is held without its tokenizer and no θ0 gives one"):
        margincal.audit({"graddiff": model}, out=tmp_path / "never", data=data, benchmark="mini", ref=ref)
    with pytest.raises(InputError, match="must be a transformers model \\(with a config\\), not Linear"):
        margincal.audit(torch.nn.Linear(1, 1), out=tmp_path / "never", data=data, benchmark="mini", theta0=theta0)
    assert not (tmp_path / "never").exists()


def test_an_audit_of_a_panels_models_shares_the_panels_stages(audited, memorising_mini):
    """The audit named θ_ref and θ0 by their entries in the panel's store, on the same data (its facts included),
    template, settings and attack seed (D_rel draw 0 = seed 0): the panel's cell finds their evaluations and
    attacks stored, and only those."""
    from margincal.pipeline.panel import expand_cells
    from margincal.pipeline.plan import plan_cell
    from margincal.store.stage_store import Store

    cfg = memorising_mini.cfg
    plan = plan_cell(cfg, expand_cells(cfg)[0])
    store = Store(cfg.store_dir)
    shared = [n.label for n in plan.graph.nodes if store.done(n.kind, n.key)]
    assert shared == ["reference/evaluate", "reference/attack/lora_r8@4", "theta0/evaluate", "theta0/attack/lora_r8@4"]


def test_only_the_stores_own_entries_name_a_model(memorising_mini, tmp_path):
    """A model directory is named by its store entry only inside that store: a copy elsewhere, with its stage.json
    saying the same, is identified by its weights (a foreign checkpoint cannot claim another's stored results)."""
    import shutil

    from margincal.auditing.plan import checkpoint
    from margincal.store.stage_store import Store

    store = Store(memorising_mini.cfg.store_dir)
    ref = memorising_mini.paths.ref
    assert checkpoint(str(ref), store=store).identity == f"{ref.parent.parent.name}/{ref.parent.name}"
    spoof = tmp_path / ref.parent.parent.name / ref.parent.name
    shutil.copytree(ref.parent, spoof)
    assert checkpoint(str(spoof / "model"), store=store).identity.startswith("local@")
    assert store.entry(spoof) is None and store.entry(ref) == store.entry(ref.parent)


def test_audit_stops_before_any_compute(audited, memorising_mini, tiny_model, tiny_tokenizer, tmp_path, capsys):
    import shutil

    from margincal.cli import main

    root, args = audited
    base = [a for a in args if a not in SMOKE_BUDGET]

    def error(extra: list[str]) -> str:
        capsys.readouterr()
        assert main([*extra, "--out", str(tmp_path / "x")]) == 2
        return capsys.readouterr().err

    assert "K must be at least 1 and below |D_f|" in error([*base, "attackers=[{preset: lora_r8, k: [5000]}]",
                                                            "headline=lora_r8@5000"])  # fmt: skip
    no_holdout = tmp_path / "data"
    shutil.copytree(memorising_mini.data, no_holdout)
    (no_holdout / "holdout.json").unlink()
    moved = [str(no_holdout) if a == str(memorising_mini.data) else a for a in base]
    assert "an audit needs its forget and holdout splits" in error(moved)
    other = tmp_path / "other"
    tiny_model.save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    assert "has another tokenizer" in error([*args, "--model", f"other={other}"])
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/nowhere/base"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    err = error(
        ["audit", "--model", str(adapter), "--data", str(memorising_mini.data), "--benchmark", "mini", *SMOKE_BUDGET]
    )
    assert "LoRA adapter whose base model (/nowhere/base) is missing" in err or "safetensors" in err
    assert "unknown quantizer preset 'nf3'" in error([*base, "quantizers=[nf3]"])
    assert "names θ_ref or θ0" in error([*base, "--model", f"theta0={memorising_mini.paths.theta0}"])
    exported = tmp_path / "exported"
    shutil.copytree(memorising_mini.data, exported)
    partial = {
        "kind": "mini_export",
        "schema_version": 1,
        "theta0": str(memorising_mini.paths.theta0),
        "tier": "forget10",
    }
    (exported / "mini.json").write_text(json.dumps(partial))
    assert "mini.json" in (
        err := error(["audit", "--model", str(memorising_mini.paths.theta0), "--data", str(exported)])
    )
    assert "ref" in err


def test_without_a_reference_the_card_names_what_it_cannot_give(audited, memorising_mini):
    from margincal.cli import main

    root, _ = audited
    args = ["audit", "--model", str(root / "graddiff"), "--data", str(memorising_mini.data), "--benchmark", "mini",
            "--store", str(root / "store"), *SMOKE_BUDGET, "--out", str(root / "alone")]  # fmt: skip
    assert main(args) == 0
    card = json.loads((root / "alone" / "graddiff" / "card.json").read_text())
    assert card["delta"]["value"] is None and card["delta"]["ci"] is None and card["reference"] == {}
    assert card["attacks"]["lora_r8@4"]["recovered_fraction"]["value"] is None
    assert card["attacks"]["lora_r8@4"]["rouge_l"] is not None  # the attack still ran: its ROUGE-L is reported
    assert len(card["unavailable"]) == 3 and "no --ref" in card["unavailable"][0]


def test_open_unlearning_retain_logs_give_what_theta_ref_gives(audited, memorising_mini):
    """θ_ref's own evaluation written as open-unlearning's TOFU_EVAL.json: forget_quality and privleak read from the
    log equal those computed against θ_ref."""
    from margincal.cli import main

    root, _ = audited
    with_ref = json.loads((root / "card" / "graddiff" / "card.json").read_text())
    ref_eval = json.loads((Path(json.loads((root / "card" / "card.json").read_text())["sources"]["reference/evaluate"])
                           / "eval.json").read_text())  # fmt: skip
    ratios = ref_eval["splits"]["forget"]["truth_ratios"]
    by_index = {str(i): {"score": r} for i, r in enumerate(ratios)}
    log = {"forget_truth_ratio": {"agg_value": 0.0, "value_by_index": by_index},
           "mia_min_k": {"agg_value": ref_eval["summary"]["mia_min_k_auc"]}}  # fmt: skip
    (root / "TOFU_EVAL.json").write_text(json.dumps(log))
    data = str(memorising_mini.data)
    args = ["audit", "--model", f"graddiff={root / 'graddiff'}", "--data", data, "--benchmark", "mini",
            "--ref-logs", str(root / "TOFU_EVAL.json"), "--store", str(root / "store"), "--batch-size", "16",
            *SMOKE_BUDGET, "--out", str(root / "logs")]  # fmt: skip
    assert main(args) == 0
    card = json.loads((root / "logs" / "graddiff" / "card.json").read_text())
    assert card["forget"]["forget_quality"] == pytest.approx(with_ref["forget"]["forget_quality"])
    assert card["mia"]["privleak"] == pytest.approx(with_ref["mia"]["privleak"])
    assert card["delta"]["value"] is None and "open_unlearning_logs" in card["reference"]


def test_a_name_past_the_rule_still_cannot_write_outside_the_card(audited, monkeypatch, capsys):
    """The name rule switched off (a name that slipped past it): the card's writer still refuses a path outside
    --out, exit 2, and nothing is written beside --out (every stage is cached, so this runs no compute)."""
    import margincal.auditing.inputs
    import margincal.auditing.plan
    import margincal.core.artifacts
    from margincal.cli import main

    root, args = audited
    for module in (margincal.core.artifacts, margincal.auditing.inputs, margincal.auditing.plan):
        monkeypatch.setattr(module, "check_name", lambda name, what: name)
    outside = root / "escape"
    outside.mkdir()
    before = sorted(p.name for p in outside.iterdir())
    capsys.readouterr()
    argv = [
        "audit",
        "--model",
        f"..={root / 'graddiff'}",
        *args[args.index("--data") :],
        "--out",
        str(outside / "card"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is not inside" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in outside.iterdir()) == before  # no card.json beside --out, no card, no temp


def test_a_searched_audit_selects_and_reports_on_fixed_sets_and_resumes(audited, memorising_mini, capsys):
    """The worst budget on one checkpoint: the LoRA family searched (2 TPE trials, the first the preset itself) and
    the format probe enumerated (K 1 and 2, each once). D_f is split once into a relearn pool, a selection set and
    a report set: every LoRA trial, whatever its K, trains inside the pool and is scored on the whole selection set;
    the winner is the best trial within the utility bound there; the preset and the winner are reported on the whole
    report set on every draw (utility scored on each), θ_ref and θ0 attacked by them; rows name the K they ran at;
    its preset file resolves to its config. The journal deleted, a longer search samples the same first trials again
    (each trial's sampler seeded by its number): every one is read from the store. A trial a killed run left
    running is marked failed."""
    import dataclasses

    import pyarrow.parquet as pq
    from optuna.trial import TrialState

    from margincal.auditing.spaces import search_rules
    from margincal.auditing.study import open_study
    from margincal.cli import main
    from margincal.config.settings import resolve_attack
    from margincal.data.draws import search_split

    root, _ = audited
    data = memorising_mini.data
    budget = ["--budget", "worst", "attackers=[{preset: lora_r8, k: [4]}, {preset: format_probe, k: [2]}]",
              "headline=lora_r8@4", "quantizers=[]", "draws=2", "search.trials=2", "search.epsilon=0.5"]  # fmt: skip
    args = ["audit", "--model", f"graddiff={root / 'graddiff'}", "--data", str(data), "--benchmark", "mini", "--ref",
            str(memorising_mini.paths.ref), "--theta0", str(memorising_mini.paths.theta0), "--store",
            str(root / "store"), "--batch-size", "16", *budget]  # fmt: skip
    assert main([*args, "--out", str(root / "worst")]) == 0
    card = json.loads((root / "worst" / "graddiff" / "card.json").read_text())
    lora, probe = card["searched"]["lora_r8"], card["searched"]["format_probe"]
    assert lora["trials"] == 2 and lora["sampler"] == "Latin hypercube start, then TPE"
    assert lora["history"][0]["params"] == {"train.lr": 2e-3, "train.steps": 20, "train.lora.r": 8, "k": 4}
    best = None
    for t in lora["history"]:  # the best so far over the trials within the bound
        best = t["value"] if t["feasible"] and (best is None or t["value"] > best) else best
        assert t["best_so_far"] == best
    # the worst case: the preset first among the candidates, then every other trial within the bound on draw 0 in
    # order of its selection score, each run on both draws and read on the selection set. LoRA on this fixture: the
    # preset lowers θ0 on the 3 selection records (1.000 to about 0.6; at a8a2fda it was reported as the winner,
    # chosen before its sanity was checked), and so does the other trial where it stays within the bound (whether it
    # does depends on the trained fixture's weights, which seed the search and differ by CPU): no attack is valid and
    # the card says which constraint each candidate broke
    checked = lora["candidates"]
    others = sorted((t for t in lora["history"][1:] if t["feasible"]), key=lambda t: -t["value"])
    assert [c["row"] for c in checked] == ["preset", *[f"t{t['trial']}" for t in others]]
    assert all(len(c["utility_by_draw"]) == 2 and c["broken"] for c in checked)
    assert "it lowers θ0 from 1.000 to 0.6" in checked[0]["broken"][0]
    assert lora["searched"] is None and lora["winner"] is None and set(lora["detail"]) == {"preset"}
    assert lora["why_none"].startswith("no valid attack in this family at this scale: ")
    # the format probe: both wordings valid and tied on the selection records: the preset is the worst case
    assert [c["row"] for c in probe["candidates"]] == ["preset", "t1"] and probe["winner"]["row"] == "preset"
    assert probe["searched"]["label"] == probe["preset"]["label"] == "format_probe@2"
    assert probe["gap"]["recovered_fraction"] == 0.0
    assert probe["sampler"] == "every configuration (finite space)"
    assert sorted(t["params"]["k"] for t in probe["history"]) == [1, 2]
    # one split of the 10 forget records: pool 4 (the budget's K), selection 3, report 3; the format probe, which
    # trains on no forget record, also selects on the pool
    split = search_split(10, 4, search_rules()["split_seed"])
    assert lora["split"] == {"seed": split.seed, "pool": [*split.pool], "selection": [*split.selection],
                             "report": [*split.report]}  # fmt: skip
    assert lora["selected_on"] == 3 and probe["selected_on"] == 7 and probe["split"]["report"] == [*split.report]
    heldout = set(split.selection) | set(split.report)
    study, _ = open_study(root / "store", Path(lora["journal"]).parent.name)
    for t in study.get_trials(states=(TrialState.COMPLETE,)):  # every trial, whatever its K, inside the pool
        result = json.loads((root / "store" / "attack" / t.user_attrs["key"] / "attack.json").read_text())
        assert heldout <= set(result["heldout"]) and result["k"] == t.params["k"]
    assert lora["detail"]["preset"]["rouge_l"]["records"] == 2 * 3  # R whole, 2 draws
    rows = probe["detail"]
    assert rows["winner"]["rouge_l"]["records"] == rows["preset"]["rouge_l"]["records"] == 2 * 3
    assert {"floor", "ceiling"} <= set(rows["winner"]["rouge_l"])
    assert len(probe["bound"]["winner"]["utility_by_draw"]) == 2 and probe["bound"]["winner"]["within_bound"]
    assert lora["preset"]["label"].startswith("lora_r8@4 (")
    samples = pq.read_table(root / "worst" / "samples.parquet").to_pylist()
    searched_rows = {r["row"] for r in samples if r["kind"] == "searched" and r["model"] == "graddiff"}
    assert "searched format_probe@2 of graddiff" in searched_rows
    drawn: dict = {}
    for r in samples:
        if r["kind"] == "searched":
            drawn.setdefault((r["model"], r["row"], r["draw"]), set()).add(r["record"])
    lora_rows = [records for (_, row, _), records in drawn.items() if "lora_r8" in row]
    assert len(lora_rows) == 3 * 2 and all(heldout <= records for records in lora_rows)  # every reported draw
    assert not (root / "worst" / "graddiff" / "searched" / "lora_r8.yaml").exists()
    winner = resolve_attack(str(root / "worst" / "graddiff" / "searched" / "format_probe.yaml"), "mini", k=2, seed=0)
    assert dataclasses.asdict(winner) == {**probe["winner"]["config"], "utility": []}
    assert (root / "worst" / "figures" / "graddiff-search.png").is_file()
    assert "worst case recovered, report set" in (root / "worst" / "card.md").read_text()
    # resumed from nothing: the journal deleted, 3 trials sample the first 2 again (all stored) and one more
    journal = root / "store" / lora["journal"]  # named inside the store, no machine path
    assert journal.parent.parent == root / "store" / "search" and journal.is_file()
    journal.unlink()
    capsys.readouterr()
    assert main([*args, "search.trials=3", "--out", str(root / "worst3")]) == 0
    out = capsys.readouterr().out
    searched = [line for line in out.splitlines() if "search graddiff lora_r8" in line]
    assert len(searched) == 3 and all(line.endswith("cached") for line in searched[:2]), searched
    history = json.loads((root / "worst3" / "graddiff" / "card.json").read_text())["searched"]["lora_r8"]["history"]
    for line, t in zip(searched, history, strict=True):  # each line: the trial's score and the best so far
        best = t["best_so_far"]
        assert f"selection ROUGE-L {t['value']:.3f} " in line
        assert (f"best so far {best:.3f} (trial " if best is not None else "best so far none within the bound") in line
    # a trial left running by a killed run is marked failed when the study is opened again (its number is spent)
    study, _ = open_study(root / "store", journal.parent.name)
    study.ask()
    states = [t.state.name for t in open_study(root / "store", journal.parent.name)[0].trials]
    assert states == ["COMPLETE"] * 3 + ["FAIL"] + ["WAITING"] * 2  # the start design's last two, never asked


def test_claimed_numbers_are_checked_against_the_audits_own(audited, capsys):
    """``--claimed``: open-unlearning's summary of the audit's own evaluation reproduces metric by metric; one with
    ROUGE-L 0.2 lower and model utility 0.05 lower does not on those two (the bootstrap interval of the ROUGE-L mean
    does not reach the claim either), a metric the audit does not compute is listed, and bad claims stop before
    any output with one line."""
    from margincal.cli import main

    root, args = audited
    summary = json.loads((root / "card" / "open-unlearning" / "graddiff_TOFU_SUMMARY.json").read_text())
    honest, inflated = root / "honest.json", root / "inflated.json"
    honest.write_text(json.dumps(summary))
    own = json.loads((root / "card" / "open-unlearning" / "undertrained_TOFU_SUMMARY.json").read_text())
    changed = {**own, "forget_Q_A_ROUGE": own["forget_Q_A_ROUGE"] - 0.2, "forget_Q_A_gibberish": 0.9}
    changed["model_utility"] = own["model_utility"] - 0.05
    inflated.write_text(json.dumps(changed))
    claims = ["--claimed", f"graddiff={honest}", "--claimed", f"undertrained={inflated}"]
    assert main([*args, *claims, "--out", str(root / "claimed")]) == 0
    cards = json.loads((root / "claimed" / "card.json").read_text())["checkpoints"]
    good = cards["graddiff"]["reproduction"]
    assert good["reproduced"] == len(good["metrics"]) == len(summary) and good["not_compared"] == []
    assert set(MU_KEYS) <= set(good["metrics"])  # the nine utility inputs are compared too (issue 74)
    assert all(r["difference"] == 0.0 and r["reproduces"] for r in good["metrics"].values())
    assert good["metrics"]["forget_Q_A_ROUGE"]["ci"] is not None and good["metrics"]["model_utility"]["ci"] is None
    assert good["metrics"]["forget_quality"]["log10"] and good["metrics"]["privleak"]["tolerance"] == 1.0
    bad = cards["undertrained"]["reproduction"]
    rouge, utility = bad["metrics"]["forget_Q_A_ROUGE"], bad["metrics"]["model_utility"]
    assert not rouge["reproduces"] and not rouge["within_tolerance"] and rouge["claimed"] < rouge["ci"][0]
    assert not utility["reproduces"] and bad["not_compared"] == ["forget_Q_A_gibberish"]
    assert "reproduces" not in json.dumps(cards["original"])  # no claim, no section
    assert "| forget_Q_A_ROUGE |" in (root / "claimed" / "card.md").read_text()
    capsys.readouterr()
    bad_claims = {
        "name one as NAME=FILE": [str(honest)],
        "no audited checkpoint is named nobody": [f"nobody={honest}"],
        "tolerance must be a number ≥ 0": [f"graddiff={root / 'negative.json'}"],
        "expected a JSON object": [f"graddiff={root / 'list.json'}"],
        "none of its metrics is one the audit computes": [f"graddiff={root / 'unknown.json'}"],
    }
    (root / "negative.json").write_text(json.dumps({**summary, "tolerance": -1}))
    (root / "list.json").write_text("[1, 2]")
    (root / "unknown.json").write_text(json.dumps({"forget_Q_A_gibberish": 0.5}))
    for message, value in bad_claims.items():
        assert main([*args, "--claimed", *value, "--out", str(root / "never")]) == 2, message
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        assert not (root / "never").exists()


def test_the_card_says_where_each_checkpoint_came_from(audited, tmp_path):
    """The provenance block: a checkpoint margincal unlearned outside the store carries its producing run as its
    stage.json states it (unverified); the store's own models are verified; every card names the run's device and
    versions (bitsandbytes included). License and lineage by hand on made-up directories."""
    from margincal.auditing.plan import Checkpoint
    from margincal.auditing.provenance import lineage, read_license
    from margincal.core.artifacts import cpu_name

    root, _ = audited
    top = json.loads((root / "card" / "card.json").read_text())
    made = top["checkpoints"]["graddiff"]["provenance"]["produced_by"]
    assert made["verified"] is False and made["method"]["name"] == "GradDiff" and made["seed"] == 0
    assert isinstance(made["command"], str) and made["stage"] == "unlearn"  # (in-process here: pytest's argv)
    stored = top["checkpoints"]["retrained"]["provenance"]
    assert stored["produced_by"] is None or stored["produced_by"]["verified"] is True
    assert stored["license"] == "not stated" and stored["license_source"] is None
    run = top["provenance"]
    assert run["device"] == cpu_name() and run["versions"]["bitsandbytes"] != "not installed"
    assert len(run["graph_digest"]) == 16 and run["data"]["splits"] and run["command"].startswith("margincal ")
    text = (root / "card" / "card.md").read_text()
    assert "Provenance: identity" in text and f"Run on {cpu_name()}" in text
    # license: the model card's front matter first, then config.json, else not stated
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "README.md").write_text("---\nlanguage: en\nlicense: 'apache-2.0'\n---\n# model\nlicense: mit\n")
    (tmp_path / "a" / "config.json").write_text('{"license": "mit"}')
    assert read_license(tmp_path / "a") == ("apache-2.0", "README.md")
    (tmp_path / "a" / "README.md").write_text("# no front matter\nlicense: gpl\n")
    assert read_license(tmp_path / "a") == ("mit", "config.json")
    assert read_license(tmp_path) == ("not stated", None)
    # lineage: an adapter's base and the base's identity; a full model's config names one, unidentified
    adapter = Checkpoint("lora", str(tmp_path / "a"), "adapter@0123+local@4567", base="/models/base")
    assert lineage(adapter) == Lineage(base="/models/base", base_identity="local@4567", named_in="adapter_config.json")
    (tmp_path / "a" / "config.json").write_text('{"_name_or_path": "org/base-7b"}')
    full = Checkpoint("full", str(tmp_path / "a"), "local@89ab")
    assert lineage(full) == Lineage(base="org/base-7b", base_identity=None, named_in="config.json")


def test_the_card_says_what_each_checkpoint_cost(audited):
    """Every stage the audit ran records its cost in stage.json; a checkpoint's card sums its stages' seconds (by
    kind too) and tokens, takes the largest peak, and names the device."""
    from margincal.core.artifacts import cpu_name

    root, _ = audited
    top = json.loads((root / "card" / "card.json").read_text())
    for name in ("graddiff", "undertrained"):
        cost = top["checkpoints"][name]["cost"]
        assert cost["stages"] == 3 and set(cost["by_kind"]) == {"evaluate", "attack", "quantize"}  # SMOKE_BUDGET
        assert cost["seconds"] == pytest.approx(sum(cost["by_kind"].values())) and cost["seconds"] > 0
        assert cost["tokens"] > 1000 and cost["peak_memory_gib"] > 0.1 and cost["devices"] == [cpu_name()]
    assert "Cost: " in (root / "card" / "card.md").read_text()


def test_committed_cards_load_typed_and_write_back_byte_for_byte():
    """Every committed audit card loads as its typed class, ``card.json`` (written before cards named their kind) as
    an AuditCard and ``<name>/card.json`` as a CheckpointCard; sections an older schema lacks hold their defaults. A
    card of this schema written back (``to_dict``) is its file byte for byte, less the manifest (and the kind and
    version a top card gains)."""
    from margincal.auditing.card import SCHEMA
    from margincal.core.artifacts import json_text

    paths = sorted((ROOT / "results" / "audit").rglob("card.json"))
    tops = {path.parent for path in paths if (path.parent / "card.md").is_file() and (path.parent / "figures").is_dir()}
    assert len(paths) >= 90 and len(tops) >= 15
    # every audit's card.json (each holds all its checkpoints' cards), and one checkpoint's own card.json per audit
    first = {path.parent.parent: path for path in reversed(paths) if path.parent not in tops}
    for path in sorted({*[top / "card.json" for top in tops], *first.values()}):
        data = json.loads(path.read_text(encoding="utf-8"))
        card = margincal.load(path)
        assert type(card) is (margincal.AuditCard if "checkpoints" in data else CheckpointCard), path
        if data["schema"] == SCHEMA:
            written = card.to_dict()
            if "checkpoints" in data:
                assert (written.pop("kind"), written.pop("schema_version")) == ("audit", 1)
            kept = {k: v for k, v in data.items() if k not in ("manifest", "kind", "schema_version")}
            assert json_text(written) == json_text(kept), path
        elif "checkpoints" not in data and data["schema"] < 3:  # schema 3 added the searched attacks and costs
            assert card.searched == {} and card.cost is None and card.score == "ROUGE-L", path


def _population_card(
    delta: float, preset: float | None, searched: float | None, report: float | None, within: bool = True
) -> dict:
    """A checkpoint's card as its JSON holds it: the fields the population view reads, the rest empty."""
    from margincal.auditing.card import SCHEMA

    def fraction(value):
        why = {"why": "invalid at this scale"} if value is None else {}
        return {"recovered_fraction": {"value": value, "ci": None, **why}}

    budget = {"preset": "lora_r8", "attacker": "lora", "k": 20, "steps": 20, "lr": 2e-3, "batch_size": 4,
              "lora_rank": 8, "draws": 1, "scale": "mini"}  # fmt: skip
    search = {"k": 20, "epsilon": 0.05, "sampler": "TPE", "unattacked_utility": 0.8, "utility_bound": 0.75,
              "space": {}, "journal": "journal.log", "trials": 1, "feasible": 1, "winner": None, "history": [],
              "unattacked_selection": 0.1, "trials_to_90": None, "gap": None, "detail": {}}  # fmt: skip
    bound = {"utility_by_draw": [0.8], "worst_utility": 0.8, "within_bound": within}
    return {
        "schema": SCHEMA,
        "name": "c",
        "checkpoint": {"model": "c", "identity": "c", "base": None},
        "delta": {"value": delta, "ci": None, "m": 0.0, "m_ref": -4.48, "log_odds": None, "aggregate": "mean", "n": 10},
        "certified": None,
        "forget": {"forget_Q_A_ROUGE": 0.1 * delta},
        "mia": {"detectors": {}, "advantage": 0.2, "privleak": None},
        "utility": {},
        "weight_distance": 0.01,
        "attacks": {"lora_r8@20": {"budget": budget, **fraction(preset), "rouge_l": 0.5, "detail": {}}},
        "quantization": {},
        "searched": {
            "lora_r8": {
                **search,
                "searched": fraction(searched),
                "preset": fraction(report),
                "bound": {"winner": bound},
            }
        },
        "examples": {},
        "reference": {},
        "unavailable": [],
    }


def _typed(cards: dict[str, dict]) -> dict[str, CheckpointCard]:
    """The cards as the population view takes them (read as ``card.json``'s checkpoints are)."""
    return {name: build(CheckpointCard, card) for name, card in cards.items()}


def test_population_pairs_polishes_with_baselines_and_every_checkpoint_with_the_control():
    from margincal.auditing.population import pairings, population, population_markdown

    names = ["A", "A+MC", "B", "B+MC", "B+MC_controlled", "Oracle"]
    assert pairings(names, None) == {
        "MC − baseline": [("A+MC", "A"), ("B+MC", "B")],
        "MC_controlled − baseline": [("B+MC_controlled", "B")],
    }
    assert pairings(names, "Oracle")["baseline − Oracle"] == [("A", "Oracle"), ("B", "Oracle")]
    assert pairings(names, "Oracle")["MC − Oracle"] == [("A+MC", "Oracle"), ("B+MC", "Oracle")]
    seeded = ["A_s0", "A+MC_s0", "A_s1", "A+MC_s1", "A+MC_controlled_s1", "Oracle"]  # --from-panel of two seeds
    assert pairings(seeded, "Oracle") == {
        "MC − baseline": [("A+MC_s0", "A_s0"), ("A+MC_s1", "A_s1")],
        "MC_controlled − baseline": [("A+MC_controlled_s1", "A_s1")],
        "baseline − Oracle": [("A_s0", "Oracle"), ("A_s1", "Oracle")],
        "MC − Oracle": [("A+MC_s0", "Oracle"), ("A+MC_s1", "Oracle")],
        "MC_controlled − Oracle": [("A+MC_controlled_s1", "Oracle")],
    }
    cards = {  # (Δ, preset on all held-out, searched on the report set, preset on it)
        "A": _population_card(2.0, 0.8, 0.9, 0.7),
        "A+MC": _population_card(-1.0, 0.2, 0.5, 0.3),
        "B": _population_card(1.0, 0.6, 0.6, 0.6),
        "B+MC": _population_card(0.5, 0.5, 0.4, None),  # an invalid preset row on R: that pair is not populated
        "Oracle": _population_card(0.0, 0.9, 1.0, 0.9),
    }
    pop = population(_typed(cards), "lora_r8@20", control="Oracle")
    mc = pop["paired"]["MC − baseline"]
    # searched, report set: A+MC − A = −0.4, B+MC − B = −0.2; mean −0.3, t(0.975, 1) = 12.706 × s (0.1414) / √2 = 1.2706
    assert mc["worst_case"]["differences"] == pytest.approx([-0.4, -0.2])
    assert mc["worst_case"]["mean"] == pytest.approx(-0.3) and mc["worst_case"]["first_lower"] == 2
    assert mc["worst_case"]["ci"] == pytest.approx([-0.3 - 1.2706, -0.3 + 1.2706], abs=1e-4)
    assert mc["preset_report"]["differences"] == [pytest.approx(-0.4), None] and mc["preset_report"]["n"] == 1
    assert mc["preset_report"]["ci"] is None  # one populated pair: no interval
    assert mc["recovered_fraction"]["differences"] == pytest.approx([-0.6, -0.1])
    control = pop["paired"]["MC − Oracle"]["worst_case"]
    assert control["differences"] == pytest.approx([-0.5, -0.6]) and control["first_lower"] == 2
    assert pop["paired"]["baseline − Oracle"]["pairs"] == [["A", "Oracle"], ["B", "Oracle"]]
    # five checkpoints: a correlation gap but no interval (fewer than 10)
    gap = pop["worst_case"]["spearman_gap"]["delta"]
    assert gap["ci"] is None and gap["n"] == 4  # B+MC has no preset fraction on the report set
    text = "\n".join(population_markdown(pop, "figures/population.png"))
    assert "| MC − baseline | searched, report set | −0.30 [−1.57, +0.97] | 2/2 |" in text.replace("-", "−")
    # a winner that broke the utility bound on a reported draw is set aside from the worst case, and named
    cards["A+MC"] = _population_card(-1.0, 0.2, 0.5, 0.3, within=False)
    pop = population(_typed(cards), "lora_r8@20", control="Oracle")
    assert pop["worst_case"]["outside_bound"] == ["A+MC"]
    assert pop["paired"]["MC − baseline"]["worst_case"]["differences"] == [None, pytest.approx(-0.2)]
    assert "Set aside from the worst case: A+MC" in "\n".join(population_markdown(pop, None))


def _audit_dir(root: Path, names: dict[str, dict], **top) -> Path:
    """An audit's output directory as `margincal population` reads it: card.json with its checkpoint cards."""
    from margincal.auditing.card import SCHEMA

    card = {
        "schema": SCHEMA,
        "budget": {"name": "worst", "headline": "lora_r8@20"},
        "benchmark": "mini",
        "tier": "forget10",
        "reference": {
            "reference": {"identity": "mini-ref/1", "serves_as": "floor"},
            "theta0": {"identity": "mini-theta0/1", "serves_as": "ceiling"},
        },
        "checkpoints": names,
        "paired": [],
        "rules": {},
        "sources": {},
        "provenance": {"data": {"splits": {"forget": "f1"}}, "command": "margincal audit", "graph_digest": "g"},
        "manifest": {"git_commit": "c0ffee"},
        **top,
    }
    card["provenance"] |= {"versions": {}, "device": "AMD EPYC"}
    root.mkdir(parents=True)
    (root / "card.json").write_text(json.dumps(card), encoding="utf-8")
    return root


def test_population_merges_audits_of_one_budget_and_refuses_the_rest(tmp_path, capsys):
    from margincal.auditing.population import population
    from margincal.cli import main

    population_cards = {
        "A": _population_card(2.0, 0.8, 0.9, 0.7),
        "A+MC": _population_card(-1.0, 0.2, 0.5, 0.3),
        "B": _population_card(1.0, 0.6, 0.6, 0.6),
        "B+MC": _population_card(0.5, 0.5, 0.4, None),
    }
    first = _audit_dir(tmp_path / "population", population_cards)
    later = _audit_dir(tmp_path / "control", {"Oracle": _population_card(0.0, 0.9, 1.0, 0.9)})
    out = tmp_path / "merged"
    assert main(["population", str(first), str(later), "--control", "Oracle", "--out", str(out)]) == 0
    merged = json.loads((out / "population.json").read_text(encoding="utf-8"))
    # the same view as one audit of all five: MC − Oracle in the searched fraction, 0.5 − 1.0 and 0.4 − 1.0
    together = population(
        _typed({**population_cards, "Oracle": _population_card(0.0, 0.9, 1.0, 0.9)}), "lora_r8@20", "Oracle"
    )
    assert merged["paired"] == json.loads(json.dumps(together["paired"]))
    assert merged["paired"]["MC − Oracle"]["worst_case"]["differences"] == pytest.approx([-0.5, -0.6])
    assert [s["checkpoints"] for s in merged["sources"]] == [["A", "A+MC", "B", "B+MC"], ["Oracle"]]
    assert (out / "figures" / "population.png").is_file() and "MC − Oracle" in (out / "population.md").read_text()
    capsys.readouterr()

    other = _population_card(1.0, 0.5, 0.5, 0.5)
    refusals = {
        "budget": (
            _audit_dir(tmp_path / "b", {"C": other}, budget={"name": "quick", "headline": "lora_r8@20"}),
            "budget",
        ),
        "data": (
            _audit_dir(
                tmp_path / "d",
                {"C": other},
                provenance={"data": {"splits": {"forget": "f2"}}, "command": "", "graph_digest": ""},
            ),
            "other data",
        ),  # fmt: skip
        "reference": (
            _audit_dir(
                tmp_path / "r", {"C": other}, reference={"reference": {"identity": "mini-ref/2", "serves_as": "floor"}}
            ),
            "θ_ref or θ0 differs",
        ),
        "rebuilt": (  # same identities, but θ_ref's margin differs: a rebuild that was not bit-identical
            _audit_dir(tmp_path / "m", {"C": {**other, "delta": {**other["delta"], "m_ref": -4.8}}}),
            "m_ref/floor/ceiling -4.8000/none/none) differ",
        ),
        "name": (first, "'A' is also in an earlier audit"),
        "not an audit": (tmp_path / "population" / "figures", "no card.json"),
    }
    for what, (other, message) in refusals.items():
        target = tmp_path / f"out-{what.replace(' ', '-')}"
        assert main(["population", str(first), str(other), "--out", str(target)]) == 2, what
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1 and not target.exists(), (what, err)
    assert main(["population", str(first), str(later), "--control", "Z", "--out", str(tmp_path / "z")]) == 2
    assert "--control Z: no audited checkpoint" in capsys.readouterr().err
    assert main(["population", str(first), "--out", str(tmp_path / "one")]) == 2  # one audit writes its own
    assert not (tmp_path / "z").exists() and not (tmp_path / "one").exists()


def _searched_lora(root: Path, mini, out: str) -> dict:
    """The searched LoRA family of a one-draw, two-trial worst budget (K = 4, ε = 1) on the fixture's GradDiff
    checkpoint, written to ``root / out``: its card's ``searched.lora_r8``."""
    from margincal.cli import main

    budget = ["--budget", "worst", "attackers=[{preset: lora_r8, k: [4]}]", "headline=lora_r8@4", "quantizers=[]",
              "draws=1", "search.trials=2", "search.epsilon=1.0"]  # fmt: skip
    args = ["audit", "--model", f"graddiff={root / 'graddiff'}", "--data", str(mini.data), "--benchmark", "mini",
            "--ref", str(mini.paths.ref), "--theta0", str(mini.paths.theta0), "--store", str(root / "store"),
            "--batch-size", "16", *budget, "--out", str(root / out)]  # fmt: skip
    assert main(args) == 0
    return json.loads((root / out / "graddiff" / "card.json").read_text())["searched"]["lora_r8"]


def test_the_strongest_configuration_breaking_theta0_gives_way_to_the_next_valid_one(
    audited, memorising_mini, monkeypatch
):
    """Planted (fails at a8a2fda, which chose the 30 steps and vetoed them after selection): a finite LoRA space at a
    tenth of the preset's rate, one step (which changes nothing) or 30 (which relearns the forget answers: 0.74 on
    the selection set against 0.56 for one step, and the preset's 0.51, on this fixture). The 30 steps also lower
    θ0's own answers on the selection records (1.000 to 0.74, past the sanity rule's 0.10), as does the preset
    (0.69): the worst case is the one step, the strongest valid attack, and the card names what the other two
    broke."""
    from margincal.auditing import spaces

    rules = {**spaces.search_rules(), "spaces": {"lora_r8": {"train.steps": [1, 30], "train.lr": [2.0e-4]}}}
    monkeypatch.setattr(spaces, "search_rules", lambda: rules)
    root, _ = audited
    lora = _searched_lora(root, memorising_mini, "planted")
    values = {t["params"]["train.steps"]: t["value"] for t in lora["history"]}
    assert values[1] < values[30], values  # the 30 steps lead the search
    checked = {c["params"].get("train.steps"): c for c in lora["candidates"]}
    assert [c["row"] for c in lora["candidates"]][0] == "preset" and set(checked) == {None, 30, 1}
    assert "it lowers θ0" in checked[30]["broken"][0] and "it lowers θ0" in checked[None]["broken"][0]
    assert checked[1]["broken"] == [] and lora["winner"]["params"] == {"train.steps": 1, "train.lr": 2e-4}
    assert lora["searched"]["label"] == "lora_r8@4 (steps 1, lr 0.0002)" and lora["preset"]["label"] == "lora_r8@4"
    assert lora["searched"]["sanity"]["valid"]
    text = (root / "planted" / "card.md").read_text()
    assert "passed over: it broke the sanity rule on the selection records: it lowers θ0" in text


def test_a_card_never_shows_an_attack_that_breaks_the_sanity_rule_as_the_worst_case(
    audited, memorising_mini, monkeypatch
):
    """Planted (fails at a8a2fda, which chose the strongest trial within the bound and applied the sanity rule to it
    alone, after selection): a sanity rule no attack meets on the selection records (θ0 must gain 0.5 under it).
    Every candidate, the preset first, is checked and breaks it; the card shows no worst case, names what each broke,
    and the preset's row on the report set is still read by the card's own rule."""
    import dataclasses

    from margincal.auditing import candidates, spaces
    from margincal.auditing.rules import card_rules

    impossible = dataclasses.replace(card_rules(), ceiling_tolerance=-0.5)
    monkeypatch.setattr(candidates, "card_rules", lambda: impossible)
    rules = {**spaces.search_rules(), "spaces": {"lora_r8": {"train.steps": [1, 20]}}}
    monkeypatch.setattr(spaces, "search_rules", lambda: rules)
    root, _ = audited
    lora = _searched_lora(root, memorising_mini, "no-valid")
    assert lora["searched"] is None and lora["winner"] is None and "winner" not in lora["bound"]
    assert [c["row"] for c in lora["candidates"]] == ["preset", "t1"]
    assert all("it lowers θ0" in c["broken"][0] or "the floor" in c["broken"][0] for c in lora["candidates"])
    assert lora["why_none"].startswith("no valid attack in this family at this scale: the preset broke the sanity")
    assert lora["preset"]["sanity"]["valid"] is not None  # the preset's report-set row: the card's own rule
    text = (root / "no-valid" / "card.md").read_text()
    assert "no valid attack" in text and "passed over: it broke the sanity rule on the selection records" in text


def test_a_fraction_outside_floor_and_ceiling_is_said_in_words():
    """A recovered fraction below 0 scores under the attacked floor, above 1 over the attacked ceiling: the card says
    so beside the number instead of showing it as an ordinary fraction."""
    from margincal.results.cards import Estimate

    assert fmt_fraction(Estimate(value=0.42, ci=[0.31, 0.55])) == "0.42 [0.31, 0.55]"
    assert fmt_fraction(Estimate(value=-0.31, ci=[-0.5, -0.1])) == "below the floor (-0.31 [-0.50, -0.10])"
    assert fmt_fraction(Estimate(value=1.12)) == "above the ceiling (1.12)"
    assert fmt_fraction(Estimate(value=None, why="invalid")) == "—"


def test_the_card_becomes_a_hub_model_card_whose_model_index_parses(audited, tmp_path):
    """``--model-card`` writes each checkpoint's README.md beside its card: huggingface_hub loads it and its
    ``model-index`` holds Δ and every recovered fraction of the card, to the digit; a committed demo card with
    searched rows gives its worst cases too (offline: nothing is pushed)."""
    from huggingface_hub import ModelCard

    from margincal.auditing.modelcard import model_card_text
    from margincal.cli import main

    root, args = audited
    assert main([*args, "--out", str(tmp_path / "card"), "--model-card"]) == 0  # every stage read from the store
    card = margincal.load(tmp_path / "card" / "graddiff" / "card.json")
    loaded = ModelCard.load(tmp_path / "card" / "graddiff" / "README.md")
    results = {r.metric_name: r.metric_value for r in loaded.data.eval_results}
    assert loaded.data.model_name == "graddiff" and {r.task_type for r in loaded.data.eval_results} == {
        "relearn-robustness"
    }
    assert results["Δ = m(D_f) − m_ref"] == round(card.delta.value, 4)
    for label, row in {**card.attacks, **card.quantization}.items():
        if row.recovered_fraction.value is not None:
            assert results[f"recovered fraction: {label}"] == round(row.recovered_fraction.value, 4)
    assert "## Relearn robustness (margincal audit)" in loaded.text
    committed = margincal.load(ROOT / "results" / "audit" / "demo-worst-valid" / "card.json").checkpoints["NPO+MC"]
    text = model_card_text(committed, "mini", "forget10", "worst", "margincal audit ...")
    (tmp_path / "README.md").write_text(text, encoding="utf-8")
    searched = [r for r in ModelCard.load(tmp_path / "README.md").data.eval_results if "worst case" in r.metric_name]
    assert len(searched) == sum(s.searched is not None for s in committed.searched.values()) > 0


def test_a_search_with_two_workers_gives_one_card_serially_in_worker_processes_and_on_ray(
    audited, memorising_mini, tmp_path, capsys
):
    """search.workers=2 asks two trials at a time: run one after another in the audit's process, on two spawned
    worker processes and as Ray tasks (each trial on the threads a worker gets), the three audits' searched records
    are equal to the bit (trials, values, utilities, candidates, winner). The worker runs start from the serial run's
    store without its trials and journal: the workers compute every trial, and the search reads each from the store."""
    import shutil

    import torch
    from optuna.trial import TrialState

    from margincal.auditing.study import open_study
    from margincal.cli import main
    from margincal.pipeline.executors import usable_cpus

    pytest.importorskip("ray")
    root, _ = audited
    torch.set_num_threads(max(1, usable_cpus() // 2))  # what each of the two workers runs its trials on
    budget = ["--budget", "worst", "attackers=[{preset: lora_r8, k: [4]}]", "headline=lora_r8@4", "quantizers=[]",
              "draws=1", "search.trials=3", "search.epsilon=0.5", "search.workers=2"]  # fmt: skip
    searched = {}
    for executor in ("serial", "processes", "ray"):
        store = tmp_path / executor / "store"
        if executor == "serial":
            shutil.copytree(root / "store", store)
        else:  # the serial run's store less its trials and its journal
            shutil.copytree(tmp_path / "serial" / "store", store)
            journal = store / searched["serial"]["journal"]
            study, _ = open_study(store, journal.parent.name)
            for trial in study.get_trials(states=(TrialState.COMPLETE,)):
                shutil.rmtree(store / "attack" / trial.user_attrs["key"], ignore_errors=True)
            shutil.rmtree(store / "search")
        args = ["audit", "--model", f"graddiff={root / 'graddiff'}", "--data", str(memorising_mini.data),
                "--benchmark", "mini", "--ref", str(memorising_mini.paths.ref), "--theta0",
                str(memorising_mini.paths.theta0), "--store", str(store), "--batch-size", "16", *budget,
                f"search.executor={executor}", "--out", str(tmp_path / executor / "out")]  # fmt: skip
        capsys.readouterr()
        assert main(args) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if "search graddiff lora_r8" in line]
        assert len(lines) == 3
        assert all(line.endswith("cached") for line in lines) == (executor != "serial"), lines  # run by the workers
        card = json.loads((tmp_path / executor / "out" / "graddiff" / "card.json").read_text())
        searched[executor] = card["searched"]["lora_r8"]
    assert searched["serial"]["history"][0]["params"]["train.lr"] == 2e-3  # the preset first
    assert searched["processes"] == searched["serial"]
    assert searched["ray"] == searched["serial"]
