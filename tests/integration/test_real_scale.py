"""The real-scale path without a hub: Llama-format checkpoints saved with ``save_pretrained`` and TOFU / MUSE-News /
Alpaca files in the hub layouts go through the real loaders and a full panel cell by their paths, exactly as hub ids
would (the benchmark and model-family YAMLs differ from the shipped ones only in their sources and sizes)."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from test_panel import FAST, MINI_SMOKE

from margincal.config.files import CONFIG_DIR
from margincal.data.alpaca import overlapping, sample_corpus
from margincal.data.hub import HubUnreachableError, require_hub
from margincal.data.records import QARecord, chunk_passages
from margincal.data.tofu import load_split
from margincal.mini.formats import llama2_tokenizer, llama3_tokenizer
from margincal.pipeline.executors import run_panel
from margincal.pipeline.panel import load_panel


def _rows(records, passage=False):
    if passage:
        return [{"text": r.answer} for r in records]
    return [
        {
            "question": r.question,
            "answer": r.answer,
            "paraphrased_answer": r.paraphrased_answer,
            "perturbed_answer": list(r.perturbed_answers),
        }
        for r in records
    ]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))


def tiny_llama_config(tokenizer):
    """A tiny Llama (grouped-query attention, as Llama-3) over ``tokenizer``'s vocabulary."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _family(tmp_path: Path, tokenizer, name: str, tier: str, template: str | None) -> Path:
    """θ0 and θ_ref: tiny random Llamas (:func:`tiny_llama_config`) saved as a hub checkpoint would be."""
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(tokenizer)
    dirs = {}
    for seed, role in enumerate(("full", "retain")):
        import torch

        torch.manual_seed(seed)
        dirs[role] = tmp_path / f"{name}_{role}"
        LlamaForCausalLM(config).save_pretrained(dirs[role], safe_serialization=True)
        tokenizer.save_pretrained(dirs[role])
    spec = {
        "name": name,
        "kind": "hf",
        "target": str(dirs["full"]),
        "references": {tier: str(dirs["retain"])},
        "dtype": "float32",
        **({"template": template} if template else {}),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _benchmark(tmp_path: Path, shipped: str, **changes) -> Path:
    spec = yaml.safe_load((CONFIG_DIR / "benchmarks" / f"{shipped}.yaml").read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key].update(value)
        else:
            spec[key] = value
    path = tmp_path / f"{shipped}-local.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _alpaca(tmp_path: Path, bench, planted: QARecord) -> Path:
    """tatsu-lab/alpaca layout (<dir>/default/train.parquet): instruction/input/output/text rows, with one row that
    copies a forget question (must be left out as overlapping) and one too long for max_length (skipped)."""
    rows = [{"instruction": r.question, "input": "", "output": r.answer, "text": ""} for r in bench.split("probe")]
    rows.append({"instruction": planted.question, "input": "", "output": "Something else.", "text": ""})
    rows.append({"instruction": "Write a long story.", "input": "about the sea", "output": "waves " * 600, "text": ""})
    _write(tmp_path / "alpaca" / "default" / "train.parquet", rows)
    return tmp_path / "alpaca"


def _overrides(tmp_path, benchmark, family, tier, *extra) -> list[str]:
    return [
        *MINI_SMOKE,
        *FAST,
        f"benchmark={benchmark}",
        f"models=[{family}]",
        f"tiers=[{tier}]",
        "methods=[NPO]",
        "method_overrides={NPO: {train: {steps: 3}}}",
        f"store={tmp_path / 'store'}",
        f"out={tmp_path / 'out'}",
        "eval.gradnorm=false",
        *extra,
    ]


def _panel(tmp_path, benchmark, family, tier, *extra):
    return load_panel("mini-head2head", _overrides(tmp_path, benchmark, family, tier, *extra))


def _texts(bench):
    return [t for s in bench.splits.values() for r in s for t in (r.question, r.answer)]


def _tofu_local(smoke_mini, tmp_path):
    """The smoke mini's splits in locuslab/TOFU's layout, a tofu benchmark YAML reading them and a Llama-3-format
    family: (benchmark YAML, family YAML, the mini benchmark)."""
    from margincal.mini.data import generate

    bench = generate(smoke_mini.cfg.mini.data)
    data = tmp_path / "TOFU"  # locuslab/TOFU layout: one file per config (JSON lines on the hub)
    layout = [
        ("forget10", "forget10", "json"),
        ("forget10_perturbed", "forget10", "jsonl"),
        ("holdout10", "holdout", "json"),
        ("retain90", "retain90", "parquet"),
        ("retain_perturbed", "retain90", "json"),
        ("real_authors_perturbed", "real_authors", "json"),
        ("world_facts_perturbed", "world_facts", "json"),
    ]
    for name, split, fmt in layout:
        _write(data / f"{name}.{fmt}", _rows(bench.split(split)))
    alpaca = _alpaca(tmp_path, bench, bench.split("forget10")[0])
    probe = {"source": str(alpaca), "name": "default/train", "n": None}
    benchmark = _benchmark(
        tmp_path,
        "tofu",
        source=str(data),
        max_new_tokens=8,
        retain_n=16,
        train_splits={"probe": probe, "env": {**probe, "n": 10}},
    )
    family = _family(tmp_path, llama3_tokenizer(_texts(bench)), "tiny-llama3", "forget10", "llama3")
    return benchmark, family, bench


def test_tofu_cell_from_local_files_at_paper_scale_with_a_llama3_format_family(smoke_mini, tmp_path, capsys):
    """A TOFU cell from hub-layout files and Llama-3-format checkpoints at paper scale: the epoch-based schedule
    becomes optimizer steps at the real |D_f|, once, in the plan; the dry run prints it and the unlearn stage records
    and runs exactly it (it used to record |D_f| = 0: 10 steps)."""
    import math

    from margincal.cli import main

    benchmark, family, bench = _tofu_local(smoke_mini, tmp_path)
    n = len(bench.split("forget10"))
    per_epoch = math.ceil(n / 16)  # PDU's paper schedule: batch 4 x 4 accumulation, 10 epochs, dual warm-up 5
    overrides = _overrides(
        tmp_path,
        benchmark,
        family,
        "forget10",
        "scale=paper",
        "methods=[PDU]",
        "method_overrides={PDU: {train: {optimizer: adamw}}}",
        "mc.train.steps=2",
    )
    assert main(["panel", "mini-head2head", "--dry-run", *overrides]) == 0
    out = capsys.readouterr().out
    assert f"(|D_f| = {n})" in out
    schedule = f"PDU: {10 * per_epoch} steps × batch 4×4, lr 1e-05 linear, warm-up 0.1"
    assert f"{schedule}, dual_warmup_steps {5 * per_epoch}" in out
    assert run_panel(load_panel("mini-head2head", overrides))["counts"] == {"done": 1, "failed": 0}
    [path] = (tmp_path / "out" / "cells").glob("*.json")
    record = json.loads(path.read_text())
    assert path.name == "tofu-local_tiny-llama3_forget10_PDU_s0_reference.json"
    unlearn = Path(record["sources"]["baseline/unlearn"])
    meta = json.loads((unlearn / "stage.json").read_text())
    recorded = meta["manifest"]["config"]["run"]
    assert recorded["train"]["steps"] == meta["info"]["steps"] == meta["info"]["steps_run"] == 10 * per_epoch
    assert recorded["hparams"]["dual_warmup_steps"] == 5 * per_epoch
    assert len(json.loads((unlearn / "history.json").read_text())) == 10 * per_epoch
    # the probe pool: every mini probe row kept, the planted forget question and the over-long row left out
    n_probe = len(bench.split("probe"))
    assert record["corpora"]["probe"] == {
        "pool": n_probe + 2,
        "seen": n_probe + 2,
        "overlapping": 1,
        "too_long": 1,
        "kept": n_probe,
        "ngram": 8,
    }
    assert record["corpora"]["env"]["kept"] == 10
    for role in ("reference", "theta0", "baseline", "mc"):
        summary = record["models"][role]["summary"]
        assert 0 <= summary["forget_Q_A_ROUGE"] <= 1 and summary["model_utility"] >= 0
    # the stages were keyed by the template: the same files under another template would not be reused
    evaluate = json.loads((Path(record["sources"]["reference/evaluate"]) / "stage.json").read_text())
    assert evaluate["manifest"]["config"]["data"]["template"]["name"] == "llama3"


@pytest.mark.parametrize(("shipped", "tier"), [("muse-news", "news"), ("muse-books", "books")])
def test_muse_cell_from_local_files_with_a_llama2_format_family(smoke_mini, tmp_path, shipped, tier):
    """MUSE-News and MUSE-Books (one layout, muse-bench/MUSE-<Name>: <config>/<split>) from local files: a whole cell,
    knowmem, verbmem (the forget passages' prefixes continued) and privleak in every evaluation."""
    from margincal.mini.data import generate

    bench = generate(smoke_mini.cfg.mini.data)
    forget, holdout, retain = bench.split("forget10"), bench.split("holdout"), bench.split("retain90")
    data = tmp_path / shipped
    verbmem = [{"prompt": " ".join(r.answer.split()[:3]), "gt": " ".join(r.answer.split()[3:])} for r in forget]
    _write(data / "verbmem" / "forget.json", verbmem)
    _write(data / "knowmem" / "forget_qa.json", _rows(forget[4:]))
    _write(data / "knowmem" / "forget_qa_icl.json", _rows(forget[:2]))
    _write(data / "knowmem" / "retain_qa.json", _rows(retain[4:20]))
    _write(data / "knowmem" / "retain_qa_icl.json", _rows(retain[:2]))
    _write(data / "privleak" / "forget.parquet", _rows(forget, passage=True))
    _write(data / "privleak" / "holdout.parquet", _rows(holdout, passage=True))
    _write(data / "raw" / "forget.json", _rows(forget, passage=True))
    _write(data / "raw" / "retain1.json", _rows(retain, passage=True))
    alpaca = _alpaca(tmp_path, bench, forget[5])
    probe = {"source": str(alpaca), "name": "default/train", "n": 12}
    benchmark = _benchmark(
        tmp_path,
        shipped,
        source=str(data),
        max_length=256,
        max_new_tokens=8,
        verbmem_new_tokens=6,
        train_splits={"probe": probe, "env": probe},
    )
    family = _family(tmp_path, llama2_tokenizer(_texts(bench)), "tiny-llama2", tier, None)
    cfg = _panel(tmp_path, benchmark, family, tier)
    assert run_panel(cfg)["counts"] == {"done": 1, "failed": 0}
    [path] = (tmp_path / "out" / "cells").glob("*.json")
    record = json.loads(path.read_text())
    summary = record["models"]["mc"]["summary"]
    read = {"forget_knowmem_rouge_l_f1", "retain_knowmem_rouge_l_f1", "forget_verbmem_rouge_l_f1", "privleak", "m"}
    assert read <= set(summary) and 0 <= summary["forget_verbmem_rouge_l_f1"] <= 1
    evaluation = json.loads((Path(record["sources"]["mc/evaluate"]) / "eval.json").read_text())
    samples = evaluation["splits"]["verbmem"]["samples"]
    assert len(samples) == len(forget) and samples[0]["gold"] == verbmem[0]["gt"]  # the continuation, decoded
    assert record["corpora"]["probe"]["kept"] == 12
    # unlearning trained on the raw forget news chunked as open-unlearning's PretrainingDataset (BOS + ≤ 256 tokens)
    from margincal.pipeline.cell import _WORKSPACES

    [ws] = _WORKSPACES.values()
    assert len(ws.train["forget"]) == len(chunk_passages(ws.tokenizer, [r.answer for r in forget], 256)) > 1
    assert all(e.prompt_ids == [ws.tokenizer.bos_token_id] and len(e.answer_ids) <= 256 for e in ws.train["forget"])
    from margincal.cli import main

    dry = ["panel", shipped, f"data={data}", f"models=[{family}]", f"store={tmp_path / 'store'}", "--dry-run"]
    small = ["attackers=[{preset: lora_r8, k: [4]}]", "benchmark=" + str(benchmark)]
    assert main([*dry, f"out={tmp_path / 'dry'}", *small]) == 0  # the shipped panel plans on these files
    # the audit of the cell's NPO checkpoint on these files, its tier the benchmark's own; the cell's attack and
    # every evaluation come from the store
    lora = "attackers=[{preset: lora_r8, k: [4], set: {train.steps: 3, train.batch_size: 4}}]"
    models = ["--model", f"npo={record['sources']['baseline/unlearn']}", "--ref", str(tmp_path / "tiny-llama2_retain")]
    args = ["audit", *models, "--theta0", str(tmp_path / "tiny-llama2_full"), "--benchmark", str(benchmark)]
    budget = [lora, "headline=lora_r8@4", "quantizers=[]", "draws=1", "--scale", "mini"]
    assert main([*args, *budget, "--store", str(tmp_path / "store"), "--out", str(tmp_path / "audit")]) == 0
    card = json.loads((tmp_path / "audit" / "npo" / "card.json").read_text())
    assert {"forget_knowmem_rouge_l_f1", "forget_verbmem_rouge_l_f1"} <= set(card["forget"])
    assert card["score"] == "ROUGE-L F1" and "floor" in card["attacks"]["lora_r8@4"]["detail"]["rouge_l"]


def test_probe_overlap_check_and_sampling(tiny_tokenizer):
    excluded = [QARecord("Where was Ann Bel born?", "Ann Bel was born in Port Ivo, a town by the northern sea.")]
    probe = [
        QARecord("where was ann bel born", "No idea."),  # the same question, normalised
        QARecord("Describe a town.", "It is said ann bel was born in port ivo a town by the sea."),  # an 8-gram
        QARecord("Name a colour.", "Blue."),
        QARecord("Describe Port Ivo.", "Port Ivo is a town."),  # shares words but no 8-gram
    ]
    assert overlapping(probe, excluded) == [0, 1]
    kept, report = sample_corpus(tiny_tokenizer, probe, None, 64, excluded)
    assert [e.index for e in kept] == [2, 3] and report["overlapping"] == 2 and report["kept"] == 2
    kept, report = sample_corpus(tiny_tokenizer, probe, 1, 64, None, seed=0)
    assert len(kept) == 1 and report["seen"] == 1


def test_mini_probe_is_disjoint_from_forget_and_retain(smoke_mini):
    from margincal.mini.data import generate

    bench = generate(smoke_mini.cfg.mini.data)
    assert overlapping(bench.split("probe"), bench.split("forget10") + bench.split("retain90")) == []


def test_hub_ids_fail_fast_with_the_local_alternative(monkeypatch):
    import margincal.data.hub as hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(HubUnreachableError, match="pass DIR instead"):
        from margincal.model.loading import load_model

        load_model("open-unlearning/tofu_Llama-3.2-1B-Instruct_full")
    with pytest.raises(HubUnreachableError, match=r"forget10\.json\|\.jsonl\|\.parquet"):
        load_split("locuslab/TOFU", "forget10")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    require_hub("locuslab/TOFU", "")  # offline mode: the local HF cache answers, no probe
