import json

import pytest

import margincal
from margincal.cli import main
from margincal.data.tofu import load_qa_json
from margincal.model.loading import save_model
from tests.conftest import RECORDS


def write_tofu(path, records, jsonl=False):
    rows = [{"question": r.question, "answer": r.answer, "perturbed_answer": ["x y z"]} for r in records]
    path.write_text("\n".join(json.dumps(r) for r in rows) if jsonl else json.dumps(rows))
    return path


def test_load_qa_json_array_and_lines(tmp_path):
    a = load_qa_json(write_tofu(tmp_path / "a.json", RECORDS))
    b = load_qa_json(write_tofu(tmp_path / "b.json", RECORDS, jsonl=True))
    assert a == b and a[0].question == RECORDS[0].question and a[0].perturbed_answers == ("x y z",)
    (tmp_path / "bad.json").write_text('[{"q": 1}]')
    with pytest.raises(ValueError, match="row 0 has 'q', which is no kind of row margincal reads"):
        load_qa_json(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        load_qa_json(tmp_path / "missing.json")


def test_diagnose_cli_against_itself(tiny_model, tiny_tokenizer, tmp_path, capsys):
    model_dir = save_model(tiny_model, tiny_tokenizer, tmp_path / "model")
    forget = write_tofu(tmp_path / "forget.json", RECORDS[:2])
    retain = write_tofu(tmp_path / "retain.json", RECORDS[2:])
    out = tmp_path / "diag.json"
    args = ["diagnose", "--model", str(model_dir), "--ref", str(model_dir), "--forget", str(forget)]
    assert main([*args, "--retain", str(retain), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "diagnosis" and result["schema_version"] == 1 and "manifest" in result
    d = margincal.load(out)  # the file is the typed result saved
    assert isinstance(d, margincal.Diagnosis) and d.to_dict() == {k: v for k, v in result.items() if k != "manifest"}
    assert d.delta == pytest.approx(0.0) and d.crossed is True  # a model is exactly at its own reference
    assert d.m >= d.log_odds and len(d.diagnostic_margins) == 2 and d.n == 2
    assert 0.0 <= d.overlap_epsilon <= 1.0 and d.model == d.ref == str(model_dir)
    assert "Δ = +0.000" in capsys.readouterr().out


def test_diagnose_missing_model_is_a_clear_error(tmp_path, capsys):
    forget = write_tofu(tmp_path / "forget.json", RECORDS[:1])
    assert main(["diagnose", "--model", str(tmp_path / "nope"), "--forget", str(forget)]) == 2
    assert "no such model directory" in capsys.readouterr().err


def test_unlearn_cli_on_files(tiny_model, tiny_tokenizer, tmp_path, capsys):
    import torch

    from margincal.model.loading import load_model

    model_dir = save_model(tiny_model, tiny_tokenizer, tmp_path / "theta0")
    forget = write_tofu(tmp_path / "forget.json", RECORDS[:2])
    retain = write_tofu(tmp_path / "retain.json", RECORDS[2:])
    out = tmp_path / "unlearned"
    args = [
        "unlearn",
        "--method",
        "NPO",
        "--model",
        str(model_dir),
        "--forget",
        str(forget),
        "--retain",
        str(retain),
        "--out",
        str(out),
        "--scale",
        "mini",
        "train.steps=3",
        "train.batch_size=2",
        "retain_batch_size=2",
        "train.lr=1e-2",
        "hparams.beta=0.5",
    ]
    assert main(args) == 0
    meta = json.loads((out / "stage.json").read_text())
    assert len(json.loads((out / "history.json").read_text())) == 3 == meta["info"]["steps_run"]
    assert meta["manifest"]["config"]["run"]["hparams"]["beta"] == 0.5
    method = json.loads((out / "method.json").read_text())
    assert (method["name"], method["hparams"]["beta"], method["state"]) == ("NPO", 0.5, {})
    before, after = load_model(model_dir).state_dict(), load_model(out).state_dict()  # the stage dir loads its model/
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert "3 steps in" in capsys.readouterr().out
    # the run is a stage of the store: the same run again is read back, --out a copy of the same weights
    again = tmp_path / "again"
    assert main([*args[: args.index("--out")], "--out", str(again), *args[args.index("--out") + 2 :]]) == 0
    assert "3 steps read from the store" in capsys.readouterr().out
    repeated = load_model(again).state_dict()
    assert all(torch.equal(after[k], repeated[k]) for k in after)
    assert margincal.load(again).history == margincal.load(out).history
