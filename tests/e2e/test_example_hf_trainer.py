"""examples/hf_trainer_mc.py runs as written (smoke size) on the smoke mini's models and split files."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

EXAMPLE = ROOT / "examples" / "hf_trainer_mc.py"


def test_the_hf_trainer_example_unlearns_polishes_and_monitors(smoke_mini, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, str(EXAMPLE), "--data", str(smoke_mini.data), "--theta0", str(smoke_mini.paths.theta0),
               "--ref", str(smoke_mini.paths.ref), "--unlearn-steps", "2", "--polish-steps", "3", "--every", "2",
               "--out", str(out)]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [row["step"] for row in summary["trace"]][:2] == [0, 2] and summary["trace"][-1]["step"] in (2, 3)
    assert {"delta_unlearned", "delta_polished", "m_ref"} <= set(summary)
    assert (out / "model" / "model.safetensors").is_file() and (out / "anchors.safetensors").is_file()
    assert "Δ on D_f" in run.stdout
    from margincal.cli import main  # the CLI's diagnostic of the saved checkpoint equals the example's (API) one

    forget = smoke_mini.data / "forget10.json"
    assert main(["diagnose", "--model", str(out / "model"), "--forget", str(forget), "--ref", str(smoke_mini.paths.ref),
                 "--out", str(tmp_path / "diagnosis.json")]) == 0  # fmt: skip
    diagnosis = json.loads((tmp_path / "diagnosis.json").read_text())
    assert diagnosis["delta"] == pytest.approx(summary["delta_polished"], abs=1e-4)
    assert diagnosis["m_ref"] == pytest.approx(summary["m_ref"], abs=1e-4)


def test_margincal_anchors_writes_the_table_the_mixin_reads(smoke_mini, tmp_path):
    import torch

    from margincal.cli import main
    from margincal.data.tofu import load_qa_json
    from margincal.integrations.hf import ForgetRetainDataset
    from margincal.mc.loss import AnchorTable, anchor_tables
    from margincal.model.loading import load_model, load_tokenizer

    forget, out = smoke_mini.data / "forget10.json", tmp_path / "anchors.safetensors"
    assert main(["anchors", "--ref", str(smoke_mini.paths.ref), "--forget", str(forget), "--out", str(out)]) == 0
    tokenizer = load_tokenizer(smoke_mini.paths.ref)
    table = AnchorTable.load(out, tokenizer)
    assert table.meta["template"] == "mini" and table.meta["anchor_model"] == str(smoke_mini.paths.ref)
    encoded = ForgetRetainDataset.from_records(tokenizer, load_qa_json(forget)).streams["forget"]
    expected = anchor_tables(load_model(smoke_mini.paths.ref), "", encoded, tokenizer.pad_token_id)
    assert all(torch.equal(table.tables[k], expected[k]) for k in expected)
    assert main(["anchors", "--ref", str(smoke_mini.paths.ref), "--forget", str(forget), "--out", str(out)]) != 0
