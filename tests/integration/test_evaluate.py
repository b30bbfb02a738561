"""`margincal evaluate` end to end on the smoke mini models: mini, TOFU and MUSE layouts, reference reuse."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import margincal
from margincal.cli import main
from margincal.data.tofu import load_split

TOFU_FILES = {  # TOFU hub config name -> mini split, as locuslab/TOFU lays them out
    "forget10_perturbed": "forget10",
    "holdout10": "holdout",
    "retain_perturbed": "retain90",
    "real_authors_perturbed": "real_authors",
}


def rows(path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def reference(smoke_mini, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "ref.json"
    ref = smoke_mini.paths.ref
    args = ["evaluate", "--model", str(ref), "--benchmark", "mini", "--data", str(smoke_mini.data), "--out", str(out)]
    assert main(args) == 0
    return out


def test_reference_against_itself_and_theta0(smoke_mini, reference, tmp_path):
    data, paths = str(smoke_mini.data), smoke_mini.paths
    base = ["evaluate", "--benchmark", "mini", "--data", data, "--reference", str(reference)]
    assert main([*base, "--model", str(paths.ref), "--out", str(tmp_path / "self.json")]) == 0
    self_eval = json.loads((tmp_path / "self.json").read_text())["summary"]
    assert self_eval["forget_quality"] == pytest.approx(1.0) and self_eval["privleak"] == pytest.approx(0.0)
    assert self_eval["delta"] == pytest.approx(0.0)
    assert main([*base, "--model", str(paths.theta0), "--out", str(tmp_path / "theta0.json")]) == 0
    record = json.loads((tmp_path / "theta0.json").read_text())
    summary = record["summary"]
    assert record["kind"] == "evaluation" and record["benchmark"] == "mini" and record["manifest"]["git_commit"]
    assert record["cached"] is False
    # the same evaluation again is a store hit: read, not recomputed, the same numbers, the file a typed result
    assert main([*base, "--model", str(paths.theta0), "--out", str(tmp_path / "again.json")]) == 0
    again = margincal.load(tmp_path / "again.json")
    assert isinstance(again, margincal.Evaluation) and again.cached is True and again.summary == summary
    assert again.splits == record["splits"] and again.template == record["template"]
    for name in ("loss", "min_k", "min_k_plus_plus", "zlib", "gradnorm"):
        assert 0.0 <= summary[f"mia_{name}_auc"] <= 1.0
    assert 0.0 < summary["model_utility"] <= 1.0 and 0.0 <= summary["forget_quality"] <= 1.0
    assert summary["mia_advantage"] == pytest.approx(
        sum(abs(summary[f"mia_{n}_auc"] - 0.5) for n in ("loss", "min_k", "min_k_plus_plus", "zlib", "gradnorm")) / 5
    )
    assert summary["F_agg"] == pytest.approx(
        (summary["forget_Q_A_Prob"] + summary["forget_Q_A_ROUGE"]) / 4
        + (summary["exact_memorization"] + summary["extraction_strength"]) / 4
    )


def test_tofu_layout_json_and_parquet(smoke_mini, tmp_path):
    data = tmp_path / "tofu"
    data.mkdir()
    for config, split in TOFU_FILES.items():
        (data / f"{config}.json").write_text(json.dumps(rows(smoke_mini.data / f"{split}.json")))
    world = rows(smoke_mini.data / "world_facts.json")
    pq.write_table(pa.Table.from_pylist(world), data / "world_facts_perturbed.parquet")
    assert len(load_split(data, "world_facts_perturbed")) == len(world)
    out = tmp_path / "tofu.json"
    args = ["evaluate", "--model", str(smoke_mini.paths.theta0), "--benchmark", "tofu", "--data", str(data)]
    assert main([*args, "--out", str(out), "--no-gradnorm"]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert "model_utility" in summary and "mia_gradnorm_auc" not in summary and "mia_zlib_auc" in summary


def test_muse_layout_knowmem_verbmem_and_privleak(smoke_mini, tmp_path):
    data = tmp_path / "muse"
    forget, retain = rows(smoke_mini.data / "forget10.json"), rows(smoke_mini.data / "retain90.json")
    layout = {
        "knowmem/forget_qa": forget[1:],
        "knowmem/forget_qa_icl": forget[:1],  # one shot: two put some prompts past the mini's 128 positions
        "knowmem/retain_qa": retain[1:8],
        "knowmem/retain_qa_icl": retain[:1],
        "privleak/forget": [{"text": f"{r['question']} {r['answer']}"} for r in forget],
        "privleak/holdout": [
            {"text": f"{r['question']} {r['answer']}"} for r in rows(smoke_mini.data / "holdout.json")
        ],
        "verbmem/forget": [{"prompt": r["question"], "gt": r["answer"]} for r in forget],
    }
    for name, content in layout.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / f"{name}.json").write_text(json.dumps(content))
    out = tmp_path / "muse.json"
    args = ["evaluate", "--model", str(smoke_mini.paths.theta0), "--benchmark", "muse-news", "--data", str(data)]
    assert main([*args, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    summary = record["summary"]
    assert {"forget_knowmem_rouge_l_f1", "retain_knowmem_rouge_l_f1", "mia_loss_auc", "mia_min_k_auc"} <= set(summary)
    assert record["splits"]["forget"]["diagnosis"]["aggregate"] == "median"
    verbmem = record["splits"]["verbmem"]
    assert verbmem["n"] == len(forget) and summary["forget_verbmem_rouge_l_f1"] == verbmem["rouge_l_f1"]
    assert [s["gold"] for s in verbmem["samples"]] == [r["answer"] for r in forget]


def test_missing_hub_or_directory_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="no such data file or directory"):
        load_split(tmp_path / "nope", "forget10_perturbed")
    with pytest.raises(FileNotFoundError, match=r"split 'holdout10' not found"):
        load_split(tmp_path, "holdout10")
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--benchmark", "nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err
