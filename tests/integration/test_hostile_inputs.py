"""Hostile inputs (issue 38): a checkpoint's own code never runs, names never escape an output directory, parsing is
bounded, and what is not what it claims stops before any compute. The CLI-level refusals of each class are rows of
``tests/integration/test_bad_inputs.py``; here are the properties the rows cannot show."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from margincal.config.typed import brief, describe
from margincal.core.artifacts import OutputError, check_name, inside, json_text, publish_dir
from margincal.core.inputs import MAX_DEPTH, MAX_YAML_DEPTH, InputError, parse_json, parse_yaml, read_json
from margincal.reporting.records import check_record
from margincal.reporting.rows import pareto_row

EVIL = """from pathlib import Path
Path({marker!r}).write_text("the checkpoint's code ran")
"""


def _evil(root: Path, source: Path, model_type: str) -> tuple[Path, Path]:
    """A copy of the checkpoint ``source`` whose config and tokenizer config point ``auto_map`` at a module of the
    checkpoint that writes a marker file when imported; ``model_type`` is the architecture its config names."""
    path, marker = root / f"evil-{model_type}", root / f"ran-{model_type}"
    shutil.copytree(source, path)
    config = json.loads((path / "config.json").read_text())
    config.update(
        model_type=model_type, auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    )
    (path / "config.json").write_text(json.dumps(config))
    (path / "evil.py").write_text(EVIL.format(marker=str(marker)))
    return path, marker


@pytest.fixture(scope="module")
def evil(smoke_mini, tmp_path_factory):
    return _evil(tmp_path_factory.mktemp("evil"), smoke_mini.paths.theta0, "evil-causal-lm")


def test_the_loaders_never_run_a_checkpoints_code_with_y_on_stdin(evil, monkeypatch):
    """Every loader margincal has, called directly (no CLI guard), with `y` answering any prompt: each refuses with
    one line naming the rule, and the checkpoint's module is never imported."""
    from margincal.model import loading as models

    path, marker = evil
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 100))
    for load in (
        models.check_checkpoint,
        models.model_config,
        models.load_model,
        models.load_tokenizer,
        models.load_checkpoint,
    ):
        with pytest.raises(ValueError, match="never runs a checkpoint's own code"):
            load(path)
    assert not marker.exists()
    assert sys.stdin.read() == "y\n" * 100  # nothing read the terminal


BUDGET = ["attackers=[{preset: lora_r8, k: [4]}]", "headline=lora_r8@4"]  # K below the smoke mini's |D_f| = 10
TRAIN = "--forget {forget} --retain {retain} --out {out}"
AUDIT = "audit --data {data} --benchmark mini --out {out}"
PROBE = "--probe {probe}"
COMMANDS = {  # every command that loads a model, with {evil} at each flag that names one (split on spaces)
    "diagnose --model": "diagnose --model {evil} --forget {forget}",
    "diagnose --ref": "diagnose --model {theta0} --ref {evil} --forget {forget}",
    "evaluate": "evaluate --model {evil} --benchmark mini --data {data}",
    "unlearn": f"unlearn --method NPO --model {{evil}} {TRAIN}",
    "polish --ref": f"polish --method NPO --model {{theta0}} --theta0 {{theta0}} --ref {{evil}} {PROBE} {TRAIN}",
    "attack": "attack --model {evil} --forget {forget} --scale mini --k 4",
    "anchors": "anchors --ref {evil} --forget {forget} --out {out}.safetensors",
    "audit --model": f"{AUDIT} --model {{evil}}",
    "audit --ref": f"{AUDIT} --model {{theta0}} --ref {{evil}}",
    "audit --theta0": f"{AUDIT} --model {{theta0}} --theta0 {{evil}}",
}


def _fill(arg: str, fields: dict[str, str]) -> str:
    for name, value in fields.items():
        arg = arg.replace(f"{{{name}}}", value)
    return arg


def test_no_command_runs_a_checkpoints_code(evil, smoke_mini, tmp_path, monkeypatch, capsys):
    """Each model-loading command with the checkpoint at each of its model flags, `y` on stdin: exit 2 with one line,
    nothing written, the module never imported."""
    from margincal.cli import main

    path, marker = evil
    monkeypatch.setenv("MARGINCAL_STORE", str(smoke_mini.root / "store"))
    fields = {
        "evil": str(path),
        "theta0": str(smoke_mini.paths.theta0),
        "data": str(smoke_mini.data),
        "forget": str(smoke_mini.data / "forget10.json"),
        "retain": str(smoke_mini.data / "retain90.json"),
        "probe": str(smoke_mini.data / "probe.json"),
        "out": str(tmp_path / "out"),
    }
    for name, argv in COMMANDS.items():
        monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 100))
        budget = BUDGET if argv.startswith("audit") else []
        assert main([_fill(a, fields) for a in [*argv.split(), *budget]]) == 2, name
        err = capsys.readouterr().err
        assert "never runs a checkpoint's own code" in err and len(err.strip().splitlines()) == 1, (name, err)
    assert not marker.exists() and not list(tmp_path.iterdir())


def test_a_piped_yes_into_the_audit_runs_nothing(evil, smoke_mini, tmp_path):
    """The reported case, as a user's shell runs it: `yes | margincal audit --model DIR`."""
    path, marker = evil
    argv = [
        sys.executable,
        "-m",
        "margincal.cli",
        "audit",
        "--model",
        str(path),
        "--data",
        str(smoke_mini.data),
        "--benchmark",
        "mini",
        "--out",
        str(tmp_path / "card"),
        *BUDGET,
    ]
    done = subprocess.run(argv, input="y\n" * 1000, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "never runs a checkpoint's own code" in done.stderr
    assert not marker.exists() and not (tmp_path / "card").exists()


def test_a_supported_architecture_naming_custom_code_loads_without_it(smoke_mini, tmp_path, monkeypatch):
    """A Llama checkpoint whose config also has an ``auto_map`` (as Phi-3's does) loads as transformers' own Llama:
    the named module is never imported."""
    from margincal.model.loading import load_model

    path, marker = _evil(tmp_path, smoke_mini.paths.theta0, "llama")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 100))
    model = load_model(path)
    assert type(model).__name__ == "LlamaForCausalLM" and not marker.exists()


# ------------------------------------------------------------------------------------------------ names and paths


@pytest.mark.parametrize("name", ["NPO", "NPO+MC_s1", "lora_r8@20", "a.b-c", "x" * 100, "_", "9"])
def test_valid_names(name):
    assert check_name(name, "name") == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "-rf", "+x", "@x", "a b", "x" * 101, "é", "a\0b", 3, None]
)
def test_names_that_are_refused(name):
    with pytest.raises(OutputError, match="is not a valid name: it becomes part of a path"):
        check_name(name, "name")


def test_a_write_outside_its_directory_is_refused_even_for_a_name_that_passed(tmp_path):
    """The second line of defence: whatever a name holds, the path it makes must resolve inside the root (symbolic
    links followed)."""
    root = tmp_path / "out"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    assert inside(root, "a", "card.json") == root / "a" / "card.json"
    for parts in (("..", "card.json"), ("../out2",), ("/etc/passwd",), ("link", "x"), (".",)):
        with pytest.raises(OutputError, match="is not inside"):
            inside(root, *parts)


def test_overwrite_through_a_symbolic_link_replaces_its_target_and_leaves_nothing(tmp_path):
    target, link = tmp_path / "results-1", tmp_path / "latest"
    with publish_dir(target) as tmp:
        (tmp / "a.txt").write_text("old")
    link.symlink_to(target)
    with publish_dir(link) as tmp:
        (tmp / "a.txt").write_text("new")
    assert link.is_symlink() and (target / "a.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "results-1"]  # no .latest.old-*, no temp


# ------------------------------------------------------------------------------------------------ bounded parsing


def test_json_is_read_strictly_and_within_bounds(tmp_path):
    assert parse_json('{"a": [1, 2.5, null, "NaN"]}', "x") == {"a": [1, 2.5, None, "NaN"]}
    deepest = parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x")  # at the bound: read
    for _ in range(MAX_DEPTH - 1):
        deepest = deepest[0]
    assert deepest == []
    cases = {
        "[" * 100_000 + "]" * 100_000: "nested 100000 deep; margincal reads JSON at most 64 deep",
        '{"summary": {"m": NaN}}': "non-finite number NaN",
        '{"a": [1, -Infinity]}': "non-finite number -Infinity",
        '{"summary": {"delta": 1e999}}': r"summary\.delta is not a finite number",
        '{"n": ' + "9" * 5000 + "}": "an integer of 5000 digits",
        '{"a": ': "is not valid JSON: Expecting value at line 1, column 7",
    }
    for text, message in cases.items():
        with pytest.raises(InputError, match=message):
            parse_json(text, "f.json")
    assert parse_json('["[[[", "]]"]', "x") == ["[[[", "]]"]  # brackets inside strings do not count
    path = tmp_path / "r.json"
    path.write_text('{"summary": {"m": NaN}}')
    with pytest.raises(InputError, match=r"--reference .*r\.json holds the non-finite number NaN"):
        read_json(path, "--reference")


def test_what_margincal_writes_is_strict_json():
    text = json_text({"delta": float("nan"), "rows": [float("inf"), 1.5], "path": Path("/x")})
    assert json.loads(text) == {"delta": None, "rows": [None, 1.5], "path": "/x"}
    assert "NaN" not in text and "Infinity" not in text


def _alias_bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_yaml_is_bounded_while_it_is_composed():
    """An alias bomb (9 lines that expand to 9^9 values), a 5000-deep document and a recursive alias each stop
    during composition, at the line that crossed the bound; modest aliases still work."""
    assert parse_yaml("a: &x {k: 1}\nb: *x\nc: [*x, *x]\n") == {"a": {"k": 1}, "b": {"k": 1}, "c": [{"k": 1}] * 2}
    for text, message in (
        (_alias_bomb(), "expands to more than 100,000 values"),
        ("[" * 5000 + "]" * 5000, f"nested deeper than {MAX_YAML_DEPTH} levels"),
        ("a: &a [1, *a]\n", "the alias \\*a is inside the node it names"),
    ):
        with pytest.raises(yaml.YAMLError, match=message):
            parse_yaml(text)


def test_messages_show_a_bounded_view_of_any_value():
    """A value of any size (an aliased structure of 9^6 leaves, a megabyte string) is described in a short line
    (reprlib's bounded view: the whole text is never formed; no wall-clock bound, which a loaded machine breaks)."""
    shared: list = ["x"] * 9
    for _ in range(5):
        shared = [shared] * 9
    for value in (shared, "y" * 2**20, {str(i): i for i in range(10**5)}):
        assert len(describe(value)) < 120 and len(brief(value)) < 100


def test_a_config_file_too_large_is_refused_before_it_is_read(tmp_path):
    from margincal.config.files import read_yaml

    path = tmp_path / "big.yaml"
    with open(path, "w") as f:
        f.truncate(2**20 + 1)
    with pytest.raises(ValueError, match=r"big\.yaml is larger than 1 MiB, the most margincal reads for it"):
        read_yaml(path)


def test_forget_records_must_be_distinct():
    from margincal.data.records import QARecord, check_distinct

    check_distinct([QARecord("q1", "a"), QARecord("q2", "a"), QARecord("", "p1"), QARecord("", "p2")], "f")
    with pytest.raises(ValueError, match=r"f: rows 0 and 2 hold the same question \('q1'\)"):
        check_distinct([QARecord("q1", "a"), QARecord("q2", "b"), QARecord(" q1 ", "c")], "f")
    with pytest.raises(ValueError, match="rows 0 and 1 hold the same text"):
        check_distinct([QARecord("", "passage"), QARecord("", "passage")], "f")


def test_stdin_is_never_read_by_a_command(monkeypatch, capsys):
    """`margincal` swaps stdin for an empty stream while a command runs and gives it back after."""
    from margincal.cli import main

    seen = []
    monkeypatch.setattr("margincal.cli.commands._cmd_methods", lambda args: seen.append(sys.stdin.read()) or 0)
    stdin = io.StringIO("y\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["methods"]) == 0
    assert seen == [""] and sys.stdin is stdin


def test_extends_is_read_beside_the_file_that_names_it(tmp_path, monkeypatch):
    """``extends: parent.yaml`` is the file beside the panel, not one in the working directory; a bare name is a
    shipped panel."""
    from margincal.pipeline.panel import panel_layers

    (tmp_path / "panels").mkdir()
    (tmp_path / "panels" / "parent.yaml").write_text("extends: demo\nname: beside\n")
    (tmp_path / "panels" / "child.yaml").write_text("extends: parent.yaml\nseeds: [3]\n")
    (tmp_path / "parent.yaml").write_text("name: from-the-working-directory\n")
    monkeypatch.chdir(tmp_path)
    layers = panel_layers(tmp_path / "panels" / "child.yaml")
    assert [data.get("name") for _, data in layers][-2:] == ["beside", None]
    assert layers[0][0] == "configs/panels/demo.yaml"
    (tmp_path / "panels" / "orphan.yaml").write_text("extends: ./missing.yaml\n")
    with pytest.raises(ValueError, match=r"extends names './missing.yaml', but there is no file"):
        panel_layers(tmp_path / "panels" / "orphan.yaml")


def test_a_report_reads_records_written_before_a_field_existed():
    """A cell record without ``unlearn.steps_run`` or ``polish.steps`` (written before they existed; the schema does
    not require them) gives Pareto rows that say null there: no internal error (it was one on the committed
    results/testbed/ablations)."""
    source = sorted((ROOT / "results/mini/head2head/cells").glob("*.json"))[0]
    data = json.loads(source.read_text())
    data["unlearn"].pop("steps_run", None)
    data["polish"].pop("steps", None)
    data["polish"].pop("selected", None)
    record = check_record(data, source.stem)
    label = next(iter(record.models["mc"].attacks))
    assert pareto_row(record, "baseline", label)["steps_run"] is None
    assert pareto_row(record, "mc", label)["steps_run"] is None
