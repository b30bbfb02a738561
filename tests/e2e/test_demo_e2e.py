"""End-to-end: the demo (a shipped panel) at smoke size through the CLI, plus mini model cache reuse."""

import json
import math
from pathlib import Path

import pytest

from margincal.cli import main
from tests.conftest import SMOKE


@pytest.fixture(scope="module")
def demo_run(smoke_mini, tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")  # its own folder: the smoke root is shared by every module of a worker
    args = ["demo", *SMOKE, f"out={root / 'run'}", f"store={root / 'demo-store'}"]
    assert main(args) == 0
    return root


def test_demo_runs_the_panel_path_and_writes_its_report(demo_run):
    out = demo_run / "run"
    text = (out / "report.md").read_text()
    assert "## T1 head-to-head" in text and "GradDiff" in text and "NPO" in text and "cliff.png" in text
    assert "## Example generations" in text and "after lora_r8@4" in text
    assert (out / "cliff.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "panel.json").read_text())
    assert summary["counts"] == {"done": 4, "failed": 0} and summary["manifest"]["versions"]["torch"]
    assert "## Pareto fronts of the polish configurations" in text and "`controlled`" in text
    for method in ("GradDiff", "NPO"):  # controlled MC beside reference MC: monitored, a released step, a trace
        record = json.loads((out / "cells" / f"mini_mini_forget10_{method}_s0_controlled.json").read_text())
        assert record["polish"]["selected"] in (0, 4) and set(record["polish"]["monitor_seconds"]) >= {"forget", "mia"}
        trace = json.loads((Path(record["sources"]["mc/polish"]) / "trace.json").read_text())
        assert [r["step"] for r in trace["rows"]][0] == 0 and set(trace["reference_auc"]) == {"loss", "min_k", "zlib"}
        assert (Path(record["sources"]["mc/polish"]) / "trace.png").read_bytes()[:4] == b"\x89PNG"
    for method in ("GradDiff", "NPO"):
        record = json.loads((out / "cells" / f"mini_mini_forget10_{method}_s0_reference.json").read_text())
        assert set(record["models"]) == {"reference", "theta0", "baseline", "mc"}
        n_forget = json.loads((Path(record["sources"]["theta0/evaluate"]) / "eval.json").read_text())
        n_forget = n_forget["splits"]["forget"]["n"]
        for role, row in record["models"].items():
            attack = row["attacks"]["lora_r8@4"]
            assert 0.0 <= attack["rouge_l"] <= 1.0 and attack["diagnosis"]["n"] == n_forget - 4  # D_f \ D_rel only
            if role != "reference":
                assert row["summary"]["delta"] == pytest.approx(row["summary"]["m"] - record["m_ref"])
        example = record["examples"][0]
        assert example["gold"] and set(example["answers"]) == {"reference", "theta0", "baseline", "mc"}


def test_second_build_reuses_stored_models(smoke_mini, tmp_path):
    """A store given the smoke mini's tokenizer, θ0 and θ_ref (copied from the shipped set, no base model built):
    building again touches none of their files."""
    from margincal.mini.models import build_mini_models
    from margincal.store.stage_store import Store

    store = tmp_path / "store"
    build_mini_models(smoke_mini.cfg.mini, "forget10", Store(store))
    assert sorted(p.parent.parent.parent.name for p in store.glob("mini-*/*/model/model.safetensors")) == [
        "mini-ref",
        "mini-theta0",
    ]
    stamp = {p: p.stat().st_mtime_ns for p in store.glob("mini-*/*/*/*")}
    build_mini_models(smoke_mini.cfg.mini, "forget10", Store(store))
    assert stamp and stamp == {p: p.stat().st_mtime_ns for p in store.glob("mini-*/*/*/*")}


SMOKE_LAYERS = {"RMU": ["hparams.layer=1", "hparams.trained_layers=2"]}  # the smoke model has two decoder layers


def test_every_method_unlearns_the_mini_model_through_the_cli(smoke_mini, tmp_path):
    """`margincal unlearn` for all 16 registered methods on the smoke mini θ0 and TOFU-format split files (the
    oracle-imitation control with θ_ref as --ref)."""
    import torch

    from margincal.cli import main
    from margincal.methods import METHODS
    from margincal.model.loading import load_model

    theta0, data = smoke_mini.paths.theta0, smoke_mini.data
    before = load_model(theta0).state_dict()
    for cls in METHODS.values():
        out = tmp_path / cls.name
        args = ["unlearn", "--method", cls.name, "--model", str(theta0), "--schedule", "mini", "--out", str(out)]
        args += ["--forget", str(data / "forget10.json"), "--retain", str(data / "retain90.json")]
        args += ["--env", str(data / "world_facts.json"), "train.steps=2", *SMOKE_LAYERS.get(cls.name, [])]
        args += ["--ref", str(smoke_mini.paths.ref)] if cls.prepares_with == "ref" else []
        assert main(args) == 0, cls.name
        history = json.loads((out / "history.json").read_text())
        assert len(history) == 2 and all(math.isfinite(r["loss"]) for r in history)
        cost = json.loads((out / "stage.json").read_text())["cost"]  # what the unlearning cost, as in the store
        assert cost["tokens"] > 0 and cost["seconds"] > 0 and cost["peak_memory_gib"] > 0, cls.name
        after = load_model(out).state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before), f"{cls.name} changed no weight"
