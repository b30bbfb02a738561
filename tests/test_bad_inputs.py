"""Bad inputs through the CLI: each stops before any compute with exit code 2 (130 for Ctrl-C), one clear line naming
the file, key or value, no traceback, and every input file and pre-existing output exactly as it was.

One row per case: ``(id, argv, expected exit code, regex the message must match)``. Placeholders in ``argv``:
{theta0} {ref} (the smoke mini models), {forget} {retain} {probe} {holdout} {data} (TOFU-format files of the smoke
mini), {user} (a folder holding a user's file), {userfile}, {result} (a result file margincal wrote), {bad} (a
folder of malformed inputs), {notok} (a model folder without tokenizer), {nopad} (a tokenizer with neither pad nor
EOS). Cases run in the sandbox as working directory.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from margincal.cli import main

_U = ["unlearn", "--method", "NPO", "--model", "{theta0}", "--forget", "{forget}", "--retain", "{retain}"]
UNLEARN = [*_U, "--out", "runs/u", "--schedule", "mini"]
POLISH = [
    "polish",
    "--model",
    "{theta0}",
    "--method",
    "NPO",
    "--theta0",
    "{theta0}",
    "--ref",
    "{ref}",
    "--forget",
    "{forget}",
    "--retain",
    "{retain}",
    "--probe",
    "{probe}",
]
ATTACK = ["attack", "--model", "{theta0}", "--forget", "{forget}", "--scale", "mini"]
EVALUATE = ["evaluate", "--model", "{theta0}", "--benchmark", "mini", "--data", "{data}"]
DIAGNOSE = ["diagnose", "--model", "{theta0}", "--forget", "{forget}"]
DRY = ["panel", "demo", "--dry-run"]

CASES = [
    # outputs: never replace what margincal did not write, check writability before compute
    ("unlearn-out-user-folder", [*_U, "--out", "{user}"], 2, "already exists; choose a new location"),
    ("unlearn-out-user-folder-overwrite", [*_U, "--out", "{user}", "--overwrite"], 2, "margincal did not write"),
    ("unlearn-out-inputs-folder", [*_U, "--out", "{data}", "--overwrite"], 2, "would replace the input"),
    ("unlearn-out-cwd", [*_U, "--out", "."], 2, "would replace the working directory"),
    ("unlearn-out-parent-of-cwd", [*_U, "--out", "..", "--overwrite"], 2, "would replace the working directory"),
    ("unlearn-out-is-file", [*_U, "--out", "{userfile}"], 2, "is a file; give a directory"),
    ("unlearn-out-under-file", [*_U, "--out", "{userfile}/model"], 2, "is a file, not a directory"),
    ("unlearn-out-read-only", [*_U, "--out", "/proc/margincal-out"], 2, "cannot be written"),
    ("polish-out-user-folder", [*POLISH, "--out", "{user}"], 2, "already exists"),
    ("attack-out-existing-result", [*ATTACK, "--out", "{result}"], 2, "already exists.*--overwrite"),
    ("attack-out-user-file-overwrite", [*ATTACK, "--out", "{userfile}", "--overwrite"], 2, "did not write"),
    ("evaluate-out-is-dir", [*EVALUATE, "--out", "{user}"], 2, "is a directory; give a file path"),
    ("diagnose-out-input-file", [*DIAGNOSE, "--out", "{forget}", "--overwrite"], 2, "would replace the input"),
    ("mini-export-user-folder", ["mini", "export", "{user}"], 2, "already exists"),
    # configuration values and ranges
    ("unlearn-unknown-method", [*UNLEARN[:2], "NoSuch", *UNLEARN[3:]], 2, "unknown method 'NoSuch'; known"),
    ("unlearn-steps-0", [*UNLEARN, "train.steps=0"], 2, r"train\.steps must be an integer ≥ 1, got 0"),
    ("unlearn-steps-float", [*UNLEARN, "train.steps=2.5"], 2, r"train\.steps expects an integer, got 2\.5"),
    ("unlearn-lr-0", [*UNLEARN, "train.lr=0"], 2, r"train\.lr must be a positive number, got 0"),
    ("unlearn-lr-text", [*UNLEARN, "train.lr=fast"], 2, r"train\.lr expects a number, got 'fast'"),
    ("unlearn-batch-0", [*UNLEARN, "train.batch_size=0"], 2, r"batch_size must be an integer ≥ 1"),
    ("unlearn-scheduler", [*UNLEARN, "train.scheduler=zigzag"], 2, r"scheduler must be one of linear"),
    ("unlearn-unknown-key", [*UNLEARN, "train.nosuch=1"], 2, r"unknown config key\(s\) \['nosuch'\]"),
    ("unlearn-unknown-hparam", [*UNLEARN, "hparams.nosuch=1"], 2, "nosuch"),
    ("unlearn-override-form", [*UNLEARN, "steps"], 2, "not of the form key=value"),
    ("unlearn-device-cuda", [*UNLEARN, "--device", "cuda"], 2, "--device cuda: no CUDA GPU is usable here"),
    ("unlearn-device-bogus", [*UNLEARN, "--device", "gpu0"], 2, "is not a torch device"),
    ("unlearn-max-length-0", [*UNLEARN, "--max-length", "0"], 2, "expected a positive integer, got 0"),
    ("unlearn-max-length-over-context", [*UNLEARN, "--max-length", "512"], 2, "exceeds the 128 positions"),
    ("polish-unknown-method", [*POLISH[:4], "NoSuch", *POLISH[5:], "--out", "runs/p"], 2, "unknown method"),
    ("polish-unknown-variant", [*POLISH, "--out", "runs/p", "--variant", "nosuch"], 2, "unknown MC variant"),
    ("polish-without-ref", [*POLISH[:7], *POLISH[9:], "--out", "runs/p"], 2, "give --ref"),
    ("polish-probe-is-forget", [*POLISH[:-1], "{forget}", "--out", "runs/p"], 2, "probe corpus .* overlaps"),
    ("polish-mc-steps-0", [*POLISH, "--out", "runs/p", "train.steps=0"], 2, r"train\.steps must be"),
    ("attack-k-too-big", [*ATTACK, "--k", "100000"], 2, r"K = \[100000\] in --k: K must be at least 1 and below"),
    ("attack-k-sweep-too-big", [*ATTACK, "--k-sweep", "1,3,100000"], 2, r"K = \[100000\] in --k-sweep"),
    ("attack-k-sweep-text", [*ATTACK, "--k-sweep", "1,x"], 2, "--k-sweep takes comma-separated integers"),
    ("attack-k-0", [*ATTACK, "--k", "0"], 2, "expected a positive integer, got 0"),
    ("attack-unknown-attacker", [*ATTACK, "--attacker", "nosuch"], 2, "unknown attacker preset 'nosuch'"),
    ("attack-batch-0", [*ATTACK, "--batch-size", "0"], 2, "expected a positive integer"),
    ("evaluate-unknown-benchmark", [*EVALUATE[:4], "nosuch", *EVALUATE[5:]], 2, "nosuch"),
    ("evaluate-unknown-tier", [*EVALUATE, "--tier", "forget07"], 2, "forget07"),
    ("evaluate-reference-malformed", [*EVALUATE, "--reference", "{bad}/broken.json"], 2, "is not valid JSON"),
    ("evaluate-reference-missing", [*EVALUATE, "--reference", "{bad}/none.json"], 2, "no such file"),
    ("mini-export-unknown-tier", ["mini", "export", "runs/x", "--tier", "forget07"], 2, "no tier 'forget07'"),
    # input files
    ("forget-missing", [*DIAGNOSE[:4], "{bad}/none.json"], 2, "QA file not found"),
    ("forget-empty", [*DIAGNOSE[:4], "{bad}/empty.json"], 2, "is empty"),
    ("forget-malformed", [*DIAGNOSE[:4], "{bad}/broken.json"], 2, "is not valid JSON .* at line 1, column"),
    ("forget-jsonl-bad-line", [*DIAGNOSE[:4], "{bad}/broken.jsonl"], 2, "is not valid JSON / JSON lines: .* line 2"),
    ("forget-numeric-answer", [*DIAGNOSE[:4], "{bad}/numeric.json"], 2, r"row 0: 'answer' must be a string, got 42"),
    ("forget-no-fields", [*DIAGNOSE[:4], "{bad}/fields.json"], 2, r"row 0 has no 'question'/'answer' fields"),
    ("forget-is-dir", [*DIAGNOSE[:4], "{bad}"], 2, "is a directory; give a TOFU-format"),
    ("forget-no-records", [*DIAGNOSE[:4], "{bad}/list.json"], 2, "holds no QA records"),
    ("forget-answer-too-long", [*DIAGNOSE[:4], "{bad}/long.json"], 2, r"record 0 .*max_length=128"),
    ("unlearn-retain-malformed", [*_U[:-1], "{bad}/broken.json", "--out", "runs/u"], 2, "not valid JSON"),
    # models and tokenizers
    ("model-missing", ["diagnose", "--model", "./no-such-model", "--forget", "{forget}"], 2, "not found"),
    ("model-without-tokenizer", ["diagnose", "--model", "{notok}", "--forget", "{forget}"], 2, "has no tokenizer"),
    ("tokenizer-without-pad-or-eos", ["diagnose", "--model", "{nopad}", "--forget", "{forget}"], 2, "neither a pad"),
    # panels (dry run: configuration and data, no model)
    ("panel-name-typo", ["panel", "mini-head2hed", "--dry-run"], 2, "unknown panel .* shipped panels: demo"),
    ("panel-k-too-big", [*DRY, "attackers=[{preset: lora_r8, k: [100000]}]"], 2, r"K = \[100000\] in the attackers"),
    ("panel-unknown-tier", [*DRY, "tiers=[forget07]"], 2, "unknown mini split 'forget07'"),
    ("panel-bad-tier-name", [*DRY, "tiers=[last10]"], 2, "tier 'last10' does not fit"),
    ("panel-method-steps-0", [*DRY, "method_overrides={NPO: {train: {steps: 0}}}"], 2, r"steps must be"),
    ("panel-unknown-key", [*DRY, "nosuch=1"], 2, r"unknown config key\(s\) \['nosuch'\]"),
    ("panel-out-read-only", ["panel", "demo", "out=/proc/margincal-panel"], 2, "out /proc/margincal-panel cannot be"),
    ("demo-store-read-only", ["demo", "store=/proc/margincal-store"], 2, "store /proc/margincal-store cannot be"),
]


def _fill(arg: str, fields: dict[str, str]) -> str:
    for name, value in fields.items():
        arg = arg.replace(f"{{{name}}}", value)
    return arg


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def sandbox(smoke_mini, tmp_path_factory):
    root = tmp_path_factory.mktemp("sandbox")
    work = root / "work"
    (work / "data").mkdir(parents=True)
    for name in ("forget10", "retain90", "probe", "holdout"):
        shutil.copy(smoke_mini.data / f"{name}.json", work / "data" / f"{name}.json")
    for name in ("holdout", "real_authors", "world_facts"):
        shutil.copy(smoke_mini.data / f"{name}.json", work / "data" / f"{name}.json")
    user = work / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("three years of work\n")
    (work / "notes.txt").write_text("a user's file\n")
    (work / "result.json").write_text(json.dumps({"rouge_l": 0.5, "manifest": {"versions": {"torch": "x"}}}))
    bad = work / "bad"
    bad.mkdir()
    (bad / "empty.json").write_text("")
    (bad / "broken.json").write_text('[{"question": "q", "answer": "a"')
    (bad / "broken.jsonl").write_text('{"question": "q", "answer": "a"}\n{"question": "q2",\n')
    (bad / "numeric.json").write_text('[{"question": "How many books?", "answer": 42}]')
    (bad / "fields.json").write_text('[{"prompt": "q", "completion": "a"}]')
    (bad / "list.json").write_text("[]")
    (bad / "long.json").write_text(json.dumps([{"question": "Tell me.", "answer": " ".join(["word"] * 300)}]))
    models = root / "models"
    notok = models / "notok"
    shutil.copytree(smoke_mini.paths.theta0, notok)
    for f in notok.glob("*"):
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            f.unlink()
    nopad = models / "nopad"
    shutil.copytree(smoke_mini.paths.theta0, nopad)
    config = json.loads((nopad / "tokenizer_config.json").read_text())
    config.update(pad_token=None, eos_token=None)
    (nopad / "tokenizer_config.json").write_text(json.dumps(config))
    fields = {
        "theta0": str(smoke_mini.paths.theta0),
        "ref": str(smoke_mini.paths.ref),
        "data": str(work / "data"),
        "forget": str(work / "data" / "forget10.json"),
        "retain": str(work / "data" / "retain90.json"),
        "probe": str(work / "data" / "probe.json"),
        "holdout": str(work / "data" / "holdout.json"),
        "user": str(user),
        "userfile": str(work / "notes.txt"),
        "result": str(work / "result.json"),
        "bad": str(bad),
        "notok": str(notok),
        "nopad": str(nopad),
    }
    return work, fields, smoke_mini.root / "store"


@pytest.mark.parametrize(("case", "argv", "code", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, argv, code, message, sandbox, capsys, monkeypatch):
    work, fields, store = sandbox
    monkeypatch.chdir(work)
    monkeypatch.setenv("MARGINCAL_STORE", str(store))
    before, store_before = _tree(work), _tree(store)
    args = [_fill(a, fields) for a in argv]
    try:
        rc = main(args)
    except SystemExit as stop:  # argparse rejects the value itself
        rc = stop.code
    err = capsys.readouterr().err
    assert rc == code, err
    assert re.search(message, err), err
    assert "Traceback" not in err and sum("error:" in line for line in err.splitlines()) == 1, err
    assert err.strip().splitlines()[-1].startswith("margincal"), err  # one line (argparse puts its usage above)
    assert _tree(work) == before  # inputs and pre-existing outputs untouched, nothing (half-)written
    assert _tree(store) == store_before


def test_table_covers_enough_cases():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


def _disk_full(*_args, **_kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize(
    ("target", "effect", "code", "message"),
    [
        ("margincal.stages.unlearn_stage", _interrupt, 130, "margincal unlearn: interrupted"),
        ("margincal.models.LlamaForCausalLM.save_pretrained", _disk_full, 2, "No space left on device; nothing"),
    ],
    ids=["ctrl-c-during-training", "disk-full-while-saving"],
)
def test_failure_during_the_run_leaves_nothing(target, effect, code, message, sandbox, capsys, monkeypatch):
    """Ctrl-C in the middle of training, or a full disk while saving: exit code, one line, no output, no temp."""
    import transformers

    work, fields, store = sandbox
    monkeypatch.chdir(work)
    if target.startswith("margincal.models.LlamaForCausalLM"):
        monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", effect)
    else:
        monkeypatch.setattr(target, effect)
    before = _tree(work)
    argv = [_fill(a, fields) for a in [*UNLEARN, "train.steps=2", "train.batch_size=2"]]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert _tree(work) == before  # no runs/u, no .u.tmp-* directory
