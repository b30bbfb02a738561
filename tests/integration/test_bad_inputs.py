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
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from margincal.auditing.card import SCHEMA
from margincal.cli import build_parser, main
from margincal.core.artifacts import own
from margincal.data import hub

RECORDS = ROOT / "results/mini/head2head/cells"
AUDIT = ROOT / "results/audit/demo-worst"  # a card of this schema

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
AUDIT_MODELS = ["audit", "--model", "{theta0}", "--out", "runs/a", "--models"]
AUDIT_EXPORT = ["audit", "--model", "{theta0}", "--data", "{export}"]
AUDIT_MINI = ["audit", "--model", "{theta0}", "--data", "{data}", "--benchmark", "mini", "--out", "runs/a",
              "attackers=[{preset: lora_r8, k: [4]}]", "headline=lora_r8@4"]  # fmt: skip

AUDIT_FLOOR = ["audit", "--ref", "{ref}", "--theta0", "{theta0}", "--data", "{data}", "--benchmark", "mini", "--out",
               "runs/a", "attackers=[{preset: lora_r8, k: [4]}]", "headline=lora_r8@4", "--model"]  # fmt: skip

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
    (
        "anchors-out-not-safetensors",
        ["anchors", "--ref", "{ref}", "--forget", "{forget}", "--out", "{user}/t.json"],
        2,
        "is a .safetensors file",
    ),
    (
        "anchors-forget-missing",
        ["anchors", "--ref", "{ref}", "--forget", "./nope.json", "--out", "{user}/a.safetensors"],
        2,
        "no such file",
    ),
    ("mini-export-user-folder", ["mini", "export", "{user}"], 2, "already exists"),
    # configuration values and ranges
    ("unlearn-unknown-method", [*UNLEARN[:2], "NoSuch", *UNLEARN[3:]], 2, "unknown method 'NoSuch'; known"),
    ("unlearn-steps-0", [*UNLEARN, "train.steps=0"], 2, r"train\.steps must be an integer in \[1, 1 000 000\], got 0"),
    ("unlearn-steps-float", [*UNLEARN, "train.steps=2.5"], 2, r"train\.steps expects an integer, got 2\.5"),
    ("unlearn-lr-0", [*UNLEARN, "train.lr=0"], 2, r"train\.lr must be a positive number, got 0"),
    ("unlearn-lr-text", [*UNLEARN, "train.lr=fast"], 2, r"train\.lr expects a number, got 'fast'"),
    ("unlearn-batch-0", [*UNLEARN, "train.batch_size=0"], 2, r"batch_size must be an integer in \[1, 65 536\]"),
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
    ("polish-without-ref", [*POLISH[:7], *POLISH[9:], "--out", "runs/p"], 2, r"give ref \(--ref\)"),
    ("polish-probe-is-forget", [*POLISH[:-1], "{forget}", "--out", "runs/p"], 2, "probe corpus .* overlaps"),
    ("polish-mc-steps-0", [*POLISH, "--out", "runs/p", "train.steps=0"], 2, r"train\.steps must be"),
    (
        "attack-k-too-big",
        [*ATTACK, "--k", "100000"],
        2,
        r"K = \[100000\] in k \(--k, --k-sweep\): K must be at least 1 and below",
    ),
    ("attack-k-sweep-too-big", [*ATTACK, "--k-sweep", "1,3,100000"], 2, r"K = \[100000\] in k \(--k, --k-sweep\)"),
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
    ("forget-missing", [*DIAGNOSE[:4], "{bad}/none.json"], 2, r"the QA file .*none\.json: no such file"),
    ("forget-empty", [*DIAGNOSE[:4], "{bad}/empty.json"], 2, "is empty"),
    ("forget-malformed", [*DIAGNOSE[:4], "{bad}/broken.json"], 2, "is not valid JSON .* at line 1, column"),
    ("forget-jsonl-bad-line", [*DIAGNOSE[:4], "{bad}/broken.jsonl"], 2, "broken.jsonl line 2 is not valid JSON"),
    ("forget-numeric-answer", [*DIAGNOSE[:4], "{bad}/numeric.json"], 2, r"row 0: 'answer' must be a string, got 42"),
    (
        "forget-perturbed-not-text",
        [*DIAGNOSE[:4], "{bad}/perturbed.json"],
        2,
        "'perturbed_answer' must be a string or a list",
    ),
    ("forget-no-fields", [*DIAGNOSE[:4], "{bad}/fields.json"], 2, r"row 0 lacks 'gt' of a completion row"),
    ("forget-is-dir", [*DIAGNOSE[:4], "{bad}"], 2, "is a directory, not a file; give a TOFU-format"),
    ("forget-no-records", [*DIAGNOSE[:4], "{bad}/list.json"], 2, "holds no QA records"),
    ("forget-answer-too-long", [*DIAGNOSE[:4], "{bad}/long.json"], 2, r"record 0 .*max_length=128"),
    ("unlearn-retain-malformed", [*_U[:-1], "{bad}/broken.json", "--out", "runs/u"], 2, "not valid JSON"),
    # searched attacks (issue 42): the bound and the trial count checked with the budget, before any model is read
    (
        "audit-search-epsilon-zero",
        [*AUDIT_MINI, "--budget", "worst", "search.epsilon=0"],
        2,
        r"epsilon must be in \(0, 1\]",
    ),
    ("audit-search-epsilon-above-one", [*AUDIT_MINI, "--budget", "worst", "search.epsilon=1.5"], 2, r"in \(0, 1\]"),
    ("audit-control-not-audited", [*AUDIT_MINI, "--control", "Oracle"], 2, r"--control Oracle: no audited check"),
    (
        "audit-search-too-many-trials",
        [*AUDIT_MINI, "--budget", "worst", "search.trials=500"],
        2,
        r"trials must be .*200",
    ),
    (
        "unlearn-oracle-imitation-without-ref",
        [*_U[:2], "OracleImitation", *_U[3:], "--out", "runs/u"],
        2,
        r"give it as ref \(--ref\)",
    ),
    # models and tokenizers
    ("model-missing", ["diagnose", "--model", "./no-such-model", "--forget", "{forget}"], 2, "no such model directory"),
    # prompt templates: every model of a comparison scored under one, a given one rendered as given (issue 41)
    (
        "audit-checkpoint-without-chat-template",
        [*AUDIT_FLOOR, "npo={nochat}"],
        2,
        r"renders prompts with template mini .*, npo .* with qa",
    ),
    (
        "audit-checkpoint-other-chat-template",
        [*AUDIT_FLOOR, "npo={otherchat}"],
        2,
        "renders prompts with template mini",
    ),
    (
        "evaluate-reference-other-template",
        [*EVALUATE, "--reference", "{bad}/qa-reference.json"],
        2,
        "was scored with template qa",
    ),
    (
        "evaluate-reference-of-an-older-margincal",
        [*EVALUATE, "--reference", "{bad}/old-reference.json"],
        2,
        "names no result kind .an older margincal wrote it.: write it again",
    ),
    (
        "template-mini-without-chat-template",
        ["diagnose", "--model", "{nochat}", "--forget", "{forget}", "--template", "mini"],
        2,
        "template 'mini' renders prompts through the tokenizer's chat template",
    ),
    ("model-without-tokenizer", ["diagnose", "--model", "{notok}", "--forget", "{forget}"], 2, "has no tokenizer"),
    ("tokenizer-without-pad-or-eos", ["diagnose", "--model", "{nopad}", "--forget", "{forget}"], 2, "neither a pad"),
    # panels (dry run: configuration and data, no model)
    ("panel-name-typo", ["panel", "mini-head2hed", "--dry-run"], 2, "unknown panel .* known: demo"),
    ("panel-k-too-big", [*DRY, "attackers=[{preset: lora_r8, k: [100000]}]"], 2, r"K = \[100000\] in the attackers"),
    ("panel-unknown-tier", [*DRY, "tiers=[forget07]"], 2, "unknown mini split 'forget07'"),
    ("panel-bad-tier-name", [*DRY, "tiers=[last10]"], 2, "tier 'last10' does not fit"),
    ("panel-method-steps-0", [*DRY, "method_overrides={NPO: {train: {steps: 0}}}"], 2, r"steps must be"),
    ("panel-unknown-key", [*DRY, "nosuch=1"], 2, r"unknown config key\(s\) \['nosuch'\]"),
    ("panel-out-read-only", ["panel", "demo", "out=/proc/margincal-panel"], 2, "out /proc/margincal-panel cannot be"),
    ("demo-store-read-only", ["demo", "store=/proc/margincal-store"], 2, "store /proc/margincal-store cannot be"),
    # issue 29: config files of the wrong shape, entries without their required keys, values out of range, named
    ("panel-file-is-list", ["panel", "{bad}/list.yaml", "--dry-run"], 2, "list.yaml must hold a mapping .* got a list"),
    ("panel-file-is-scalar", ["panel", "{bad}/scalar.yaml", "--dry-run"], 2, "scalar.yaml must hold a mapping"),
    (
        "panel-attacker-no-preset",
        [*DRY, "attackers=[{k: [4]}]"],
        2,
        r"attackers\[0\] misses required key\(s\) \['preset'\]",
    ),
    ("panel-variant-no-name", [*DRY, "variants=[{preset: reference}]"], 2, r"variants\[0\] misses required key"),
    (
        "panel-k-text-in-file",
        ["panel", "{bad}/k.yaml", "--dry-run"],
        2,
        r"k\.yaml: attackers\[0\]\.k\[1\] expects an integer",
    ),
    ("panel-negative-kappa", [*DRY, "mc.kappa=-1"], 2, r"override mc\.kappa=-1: mc\.kappa must be a positive number"),
    (
        "panel-variant-set-kappa",
        [*DRY, "variants=[{name: v, set: {kappa: -2}}]"],
        2,
        r"variants\[0\]\.set\.kappa must be",
    ),
    ("panel-eval-batch-0", [*DRY, "eval.batch_size=0"], 2, r"eval\.batch_size must be an integer ≥ 1, got 0"),
    ("panel-store-is-file", [*DRY, "store={userfile}"], 2, "store must be a directory, got the file"),
    (
        "panel-out-user-folder",
        [*DRY, "out={user}"],
        2,
        r"out .*user holds files margincal did not write \(thesis\.tex\)",
    ),
    ("panel-seed-negative", [*DRY, "seeds=[-1]"], 2, r"seeds\[0\] must be an integer in \[0, 2\^32\)"),
    ("panel-name-a-path", [*DRY, "name=../x"], 2, "it names the output directory"),
    ("panel-models-not-a-list", [*DRY, "models=mini"], 2, r"models expects a list, got a string"),
    ("panel-nan-learning-rate", [*DRY, "mc.train.lr=.nan"], 2, r"mc\.train\.lr expects a finite number, got nan"),
    ("override-value-not-yaml", [*DRY, "seeds=[1,"], 2, r"override 'seeds=\[1,': the value is not valid YAML"),
    (
        "polish-other-method",
        [*POLISH[:2], "{unlearned}", *POLISH[3:], "--out", "runs/p"],
        2,
        "was unlearned with GradDiff",
    ),
    (
        "polish-method-json-list",
        [*POLISH[:2], "{badmethod}", *POLISH[3:], "--out", "runs/p"],
        2,
        r"method\.json: must be a mapping",
    ),
    ("polish-negative-kappa", [*POLISH, "--out", "runs/p", "kappa=-1"], 2, "kappa must be a positive number, got -1"),
    (
        "unlearn-overwrite-dir-holding-a-result",
        [*_U, "--out", "{usermodel}", "--overwrite"],
        2,
        r"did not write \(eval\.json, model\.safetensors, notes\.txt\)",
    ),
    ("report-out-user-folder", ["report", "{results}", "--out", "{user}"], 2, "holds files margincal did not write"),
    (
        "report-into-unowned-results",
        ["report", "{userresults}"],
        2,
        r"RESULTS .* holds files margincal did not write \(cells, notes.*; write the report elsewhere with --out DIR",
    ),
    # issue 38: names that become paths
    ("audit-name-dotdot", ["audit", "--model", "..={theta0}", "--out", "runs/a"], 2, r"'\.\.' is not a valid name"),
    ("audit-name-too-long", ["audit", "--model", "x" * 300 + "={theta0}", "--out", "runs/a"], 2, "not a valid name"),
    ("audit-name-card-file", ["audit", "--model", "figures={theta0}", "--out", "runs/a"], 2, "names a file of the"),
    ("audit-models-file-name", [*AUDIT_MODELS, "{bad}/models-dotdot.txt"], 2, r"models-dotdot\.txt line 2: the check"),
    ("audit-models-file-binary", [*AUDIT_MODELS, "{bad}/models-binary.txt"], 2, r"models-binary\.txt is not UTF-8"),
    ("audit-models-file-empty-path", [*AUDIT_MODELS, "{bad}/models-empty.txt"], 2, r"line 1: 'npo=' names no check"),
    ("audit-models-file-spaces", [*AUDIT_MODELS, "{bad}/models-spaces.txt"], 2, "line 1: .* holds a space"),
    ("audit-from-panel-name", ["audit", "--from-panel", "{dotdotresults}", "--out", "runs/a"], 2, r"'\.\.' is not a"),
    ("panel-variant-path", [*DRY, "variants=[{name: ../x, preset: reference}]"], 2, r"variants\[0\]\.name must be"),
    ("panel-variant-separator", [*DRY, "variants=[{name: a/b}]"], 2, "it becomes part of cell ids"),
    # issue 38: inputs first, then outputs
    ("audit-out-over-export-ref", [*AUDIT_EXPORT, "--out", "{refentry}", "--overwrite"], 2, "would replace the input"),
    (
        "audit-out-over-export-theta0",
        [*AUDIT_EXPORT, "--out", "{theta0entry}", "--overwrite"],
        2,
        "would replace the input",
    ),
    (
        "audit-tier-not-the-exports",
        [*AUDIT_EXPORT, "--tier", "forget05", "--out", "runs/a"],
        2,
        r"the mini export .* is of forget10",
    ),
    ("unlearn-out-dangling-link", [*_U, "--out", "{dangling}"], 2, "links to .*nowhere, which does not exist"),
    ("report-out-dangling-link", ["report", "{results}", "--out", "{dangling}"], 2, "which does not exist"),
    # issue 38: bounded parsing
    ("panel-yaml-alias-bomb", ["panel", "{bad}/bomb.yaml", "--dry-run"], 2, "expands to more than 100,000 values"),
    ("panel-yaml-deep", ["panel", "{bad}/deep.yaml", "--dry-run"], 2, "nested deeper than 64 levels"),
    ("override-yaml-deep", [*DRY, "mc=" + "[" * 5000 + "]" * 5000], 2, "nested deeper than 64 levels"),
    ("forget-json-deep", [*DIAGNOSE[:4], "{bad}/deep.json"], 2, "is nested 100000 deep; margincal reads JSON at most"),
    ("forget-json-huge-integer", [*DIAGNOSE[:4], "{bad}/hugeint.json"], 2, "holds an integer of 5000 digits"),
    ("audit-draws-huge", [*AUDIT_EXPORT, "--out", "runs/a", "draws=100000000"], 2, r"draws must be an integer in \[1"),
    ("panel-k-list-long", [*DRY, "attackers=[{preset: lora_r8, k: [" + ", ".join(["4"] * 65) + "]}]"], 2, "at most 64"),
    ("panel-seeds-many", [*DRY, f"seeds=[{', '.join(map(str, range(1001)))}]"], 2, r"seeds may hold at most 1000"),
    ("panel-cells-many", [*DRY, "methods=[all]", f"seeds=[{', '.join(map(str, range(1000)))}]"], 2, "at most 10,000"),
    ("unlearn-steps-huge", [*UNLEARN, "train.steps=10000000"], 2, r"train\.steps must be an integer in \[1, 1 000"),
    # issue 59: every input through one checked door (its kind, a byte cap, no empty file, the missing field named)
    ("audit-model-is-a-data-file", [*AUDIT_MINI[:2], "{forget}", *AUDIT_MINI[3:]], 2, "is a file, not a directory"),
    ("audit-claimed-device", [*AUDIT_MINI, "--claimed", "/dev/zero"], 2, "--claimed /dev/zero is a character device"),
    ("evaluate-reference-device", [*EVALUATE, "--reference", "/dev/zero"], 2, "/dev/zero is a character device"),
    ("forget-device", [*DIAGNOSE[:4], "/dev/zero"], 2, "/dev/zero is a character device, not a file"),
    ("forget-fifo", [*DIAGNOSE[:4], "{fifo}"], 2, r"is a FIFO \(named pipe\), not a file"),
    ("forget-link-loop", [*DIAGNOSE[:4], "{loop}"], 2, "is a symbolic link loop"),
    ("model-holds-a-fifo", [*DIAGNOSE[:2], "{fifomodel}", *DIAGNOSE[3:]], 2, r"tokenizer\.json is a FIFO"),
    ("forget-question-megabytes", [*DIAGNOSE[:4], "{bad}/megaquestion.json"], 2, "question is 2,000,000 characters"),
    ("forget-wmdp-row-without-choices", [*DIAGNOSE[:4], "{bad}/nochoices.json"], 2, "row 0 has no 'choices' field"),
    (
        "diagnose-model-path-missing",
        ["diagnose", "--model", "runs/npo", "--forget", "{forget}"],
        2,
        "'runs/npo' is no local directory .* hub id it cannot be fetched either",
    ),  # fmt: skip
    ("attack-preset-empty-file", [*ATTACK, "--attacker", "{bad}/empty.yaml"], 2, r"empty\.yaml is empty"),
    ("attack-preset-only-comments", [*ATTACK, "--attacker", "{bad}/comments.yaml"], 2, "holds only comments"),
    ("attack-preset-directory", [*ATTACK, "--attacker", "{bad}/preset.yaml"], 2, "is a directory, not a file"),
    ("attack-preset-file-missing", [*ATTACK, "--attacker", "{bad}/none.yaml"], 2, r"none\.yaml: no such file"),
    ("panel-file-empty", ["panel", "{bad}/empty.yaml", "--dry-run"], 2, r"empty\.yaml is empty"),
    ("audit-models-file-only-comments", [*AUDIT_MODELS, "{bad}/models-comments.txt"], 2, "holds only comments"),
    ("report-results-link-loop", ["report", "{loop}"], 2, "RESULTS .* is a symbolic link loop"),
    ("report-cells-link-loop", ["report", "{loopcells}", "--out", "runs/r"], 2, r"cells is a symbolic link loop"),
    (
        "audit-from-panel-cells-link-loop",
        ["audit", "--from-panel", "{loopcells}", "--out", "runs/a"],
        2,
        r"cells is a symbolic link loop",
    ),  # fmt: skip
    # issue 38: refuse what is not what it claims
    ("evaluate-reference-nan", [*EVALUATE, "--reference", "{bad}/nan-reference.json"], 2, "non-finite number NaN"),
    (
        "evaluate-reference-overflow",
        [*EVALUATE, "--reference", "{bad}/inf-reference.json"],
        2,
        r"summary\.m is not a f",
    ),
    (
        "audit-ref-logs-with-export",
        [*AUDIT_EXPORT, "--out", "runs/a", "--ref-logs", "{bad}/nan-logs.json"],
        2,
        r"--ref-logs with the mini export .*: the export gives θ_ref",
    ),
    ("audit-ref-logs-nan", [*AUDIT_MINI, "--ref-logs", "{bad}/nan-logs.json"], 2, "--ref-logs .* non-finite number"),
    ("export-json-nan", [*AUDIT_MODELS[:3], "--data", "{nanexport}", "--out", "runs/a"], 2, r"mini\.json holds the"),
    ("model-pickle-weights", [*DIAGNOSE[:2], "{pickled}", *DIAGNOSE[3:]], 2, r"holds pickle weights \(pytorch_model"),
    (
        "audit-pickle-adapter",
        [*AUDIT_MINI, "--model", "{pickadapter}", "--base", "{theta0}"],
        2,
        r"holds pickle weights \(adapter_model\.bin\)",
    ),
    ("model-tokenizer-past-embedding", [*DIAGNOSE[:2], "{bigvocab}", *DIAGNOSE[3:]], 2, "has ids up to 399, but the"),
    # issue 74: one clear refusal, with the closest name, in one printable line
    ("evaluate-data-one-file", [*EVALUATE[:-1], "{forget}"], 2, r"--data '.*forget10\.json' is not a directory"),
    ("flag-typo-before-missing", ["diagnose", "--modle", "x"], 2, r"unrecognized argument --modle \(did you mean"),
    ("flag-typo-with-value", [*DIAGNOSE, "--batch-sise=4"], 2, r"argument --batch-sise \(did you mean --batch-size"),
    ("mini-export-store-link-loop", ["mini", "export", "runs/m", "--store", "{loop}"], 2, r"is a link loop, not a dir"),
    ("audit-store-link-loop", [*AUDIT_MINI, "--store", "{loop}"], 2, r"the store .* is a link loop, not a directory"),
    ("command-typo", ["diagnos"], 2, r"invalid choice: 'diagnos' .* \(did you mean diagnose\?\)"),
    ("override-key-typo", [*DRY, "seds=[1]"], 2, r"unknown config key\(s\) \['seds'\] in PanelConfig \(did you mean"),
    ("name-with-escape-codes", [*DIAGNOSE[:4], "x\x1b[31mred\u202e.json"], 2, r"x\\x1b\[31mred\\u202e\.json: no such"),
    ("model-weights-of-another-arch", [*DIAGNOSE[:2], "{wrongarch}", *DIAGNOSE[3:]], 2, "not those of the gpt2 model"),
    (
        "audit-adapter-other-base",
        [*AUDIT_MINI, "--model", "{gptadapter}", "--base", "{theta0}"],
        2,
        r"targets modules \(c_attn\) that its base",
    ),
    ("forget-duplicated-records", [*DIAGNOSE[:4], "{bad}/dup.json"], 2, r"rows 0 and 2 hold the same question"),
    (
        "audit-forget-duplicated",
        [*AUDIT_MODELS[:3], "--data", "{dupdata}", "--benchmark", "mini", "--out", "runs/a"],
        2,
        "forget10 split: rows 0 and 1 hold the same question",
    ),
    (
        "model-truncated-safetensors",
        ["diagnose", "--model", "{truncated}", "--forget", "{forget}"],
        2,
        r"model\.safetensors is not a readable safetensors file",
    ),
    (
        "argparse-error-one-line",
        [*DIAGNOSE, "--batch-size", "x"],
        2,
        r"--batch-size: expected a positive integer, got 'x' \(see margincal diagnose --help\)",
    ),
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
    (bad / "perturbed.json").write_text('[{"question": "q", "answer": "a", "perturbed_answer": 3}]')
    (bad / "list.yaml").write_text("- demo\n- seeds: [0]\n")
    (bad / "scalar.yaml").write_text("demo\n")
    (bad / "k.yaml").write_text("extends: demo\nattackers:\n  - {preset: lora_r8, k: [1, abc]}\n")
    usermodel = work / "usermodel"  # a user's model folder into which `evaluate --out` wrote a result
    usermodel.mkdir()
    shutil.copy(smoke_mini.paths.theta0 / "model.safetensors", usermodel)
    (usermodel / "notes.txt").write_text("a user's notes\n")
    (usermodel / "eval.json").write_text(json.dumps({"rouge_l": 0.5, "manifest": {"versions": {"torch": "x"}}}))
    results = work / "results"  # a panel's results, margincal's own
    (results / "cells").mkdir(parents=True)
    for record in sorted(RECORDS.glob("*.json"))[:4]:
        shutil.copy(record, results / "cells")
    own(results, ["cells"])
    userresults = work / "userresults"  # cell records in a folder margincal does not own
    shutil.copytree(results / "cells", userresults / "cells")
    (userresults / "notes.txt").write_text("mine\n")
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
    for name, method in (("unlearned", {"name": "GradDiff", "hparams": {}, "state": {}}), ("badmethod", [1])):
        shutil.copytree(smoke_mini.paths.theta0, models / name / "model")  # an unlearn output: model/ + method.json
        (models / name / "method.json").write_text(json.dumps(method))
        (models / name / "stage.json").write_text(json.dumps({"stage": "unlearn"}))
    nochat = models / "nochat"  # θ0 saved without its chat template (a checkpoint saved by another trainer)
    shutil.copytree(smoke_mini.paths.theta0, nochat)
    (nochat / "chat_template.jinja").unlink()
    otherchat = models / "otherchat"  # θ0 saved with another chat template
    shutil.copytree(smoke_mini.paths.theta0, otherchat)
    jinja = otherchat / "chat_template.jinja"
    jinja.write_text("{{ 'Be brief. ' }}" + jinja.read_text())
    (bad / "qa-reference.json").write_text(
        json.dumps(
            {
                "kind": "evaluation",
                "schema_version": 1,
                "benchmark": "mini",
                "model": "m",
                "tier": "forget10",
                "summary": {},
                "template": {"name": "qa", "mode": "tags", "chat_template": None},
            }  # fmt: skip
        )
    )
    (bad / "old-reference.json").write_text(json.dumps({"benchmark": "mini", "summary": {}}))
    truncated = models / "truncated"
    shutil.copytree(smoke_mini.paths.theta0, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    hostile = _hostile(root, work, bad, smoke_mini)
    worst = json.loads((AUDIT / "card.json").read_text())  # two audits that merge: a committed card's halves
    assert worst["schema"] == SCHEMA, "the committed card this sandbox merges is of an older schema"
    names = list(worst["checkpoints"])
    for name, checkpoints in (("audit-a", names[:4]), ("audit-b", names[4:])):
        card = {**worst, "checkpoints": {c: worst["checkpoints"][c] for c in checkpoints}}
        (work / name).mkdir()
        (work / name / "card.json").write_text(json.dumps(card))
    fields = {
        **hostile,
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
        "truncated": str(truncated),
        "nochat": str(nochat),
        "otherchat": str(otherchat),
        "unlearned": str(models / "unlearned"),
        "badmethod": str(models / "badmethod"),
        "usermodel": str(usermodel),
        "results": str(results),
        "userresults": str(userresults),
    }
    return work, fields, smoke_mini.root / "store"


def _hostile(root: Path, work: Path, bad: Path, smoke_mini) -> dict[str, str]:
    """The inputs of issue 38's rows: hostile files in ``bad``, exports and result folders in ``work``, models under
    ``root/models``; returns their placeholders."""
    import torch
    from safetensors.torch import save_file

    (bad / "models-dotdot.txt").write_text("# audited\n..=/tmp/x\n")
    (bad / "models-binary.txt").write_bytes(b"\xff\xfe\x00model\n")
    (bad / "models-empty.txt").write_text("npo=\n")
    (bad / "models-spaces.txt").write_text("my model/dir\n")
    (bad / "models-comments.txt").write_text("# nothing audited yet\n\n")
    (bad / "empty.yaml").write_text("\n")
    (bad / "comments.yaml").write_text("# lr: 1e-4\n")
    (bad / "preset.yaml").mkdir()
    (bad / "nochoices.json").write_text('[{"question": "Which toxin?", "answer": 3}]')
    (bad / "megaquestion.json").write_text(json.dumps([{"question": "x" * 2_000_000, "answer": "a"}]))
    special = root / "special"  # kinds no walk of the sandbox may open: a FIFO, link loops
    special.mkdir()
    os.mkfifo(special / "fifo")
    (special / "loop").symlink_to(special / "loop")
    (special / "loopresults").mkdir()
    (special / "loopresults" / "cells").symlink_to(special / "loopresults" / "cells")
    fifomodel = special / "fifomodel"  # a checkpoint whose tokenizer.json is a FIFO: a loader's read would hang
    shutil.copytree(smoke_mini.paths.theta0, fifomodel)
    (fifomodel / "tokenizer.json").unlink()
    os.mkfifo(fifomodel / "tokenizer.json")
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)
    ]
    (bad / "bomb.yaml").write_text("extends: demo\n" + "\n".join(lines) + "\n")
    (bad / "deep.yaml").write_text("extends: demo\nmc: " + "[" * 5000 + "]" * 5000 + "\n")
    (bad / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (bad / "hugeint.json").write_text('[{"question": "q", "answer": "a", "n": ' + "9" * 5000 + "}]")
    (bad / "nan-reference.json").write_text('{"benchmark": "mini", "summary": {"m": NaN}, "splits": {}}')
    (bad / "inf-reference.json").write_text('{"benchmark": "mini", "summary": {"m": 1e999}, "splits": {}}')
    (bad / "nan-logs.json").write_text('{"forget_truth_ratio": {"value_by_index": {"0": {"score": NaN}}}}')
    rows = json.loads((smoke_mini.data / "forget10.json").read_text())
    (bad / "dup.json").write_text(json.dumps([rows[0], rows[1], rows[0]]))
    dupdata = work / "dupdata"
    shutil.copytree(smoke_mini.data, dupdata)
    (dupdata / "forget10.json").write_text(json.dumps([rows[0], rows[0], *rows[1:]]))
    export = work / "export"  # a mini export: splits and mini.json naming θ0 and θ_ref
    shutil.copytree(smoke_mini.data, export)
    mini = {"kind": "mini_export", "schema_version": 1, "dir": str(export), "theta0": str(smoke_mini.paths.theta0),
            "ref": str(smoke_mini.paths.ref), "tier": "forget10", "retain": "retain90",
            "splits": sorted(p.stem for p in smoke_mini.data.glob("*.json"))}  # fmt: skip
    (export / "mini.json").write_text(json.dumps(mini))
    nanexport = work / "nanexport"
    shutil.copytree(export, nanexport)
    (nanexport / "mini.json").write_text(json.dumps({**mini, "seconds": float("nan")}))
    (work / "dangling").symlink_to(work / "nowhere")
    dotdot = work / "dotdotresults"  # a panel's results whose record names its method `..`
    shutil.copytree(work / "results", dotdot)
    record = sorted((dotdot / "cells").glob("*.json"))[0]
    data = json.loads(record.read_text())
    data["cell"]["method"] = ".."
    record.write_text(json.dumps(data))
    models = root / "models"
    pickled = models / "pickled"
    shutil.copytree(smoke_mini.paths.theta0, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    pickadapter = models / "pickadapter"
    pickadapter.mkdir(parents=True)
    (pickadapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "x", "peft_type": "LORA"}))
    (pickadapter / "adapter_model.bin").write_bytes(b"\x80\x04not really a pickle")
    bigvocab = models / "bigvocab"  # a tokenizer with ids past the model's embedding
    shutil.copytree(smoke_mini.paths.theta0, bigvocab)
    config = json.loads((bigvocab / "config.json").read_text())
    (bigvocab / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    wrongarch = models / "wrongarch"  # Llama weights under a GPT-2 config
    shutil.copytree(smoke_mini.paths.theta0, wrongarch)
    gpt2 = {"model_type": "gpt2", "vocab_size": 400, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 128}
    (wrongarch / "config.json").write_text(json.dumps(gpt2))
    gptadapter = models / "gptadapter"  # a LoRA adapter made for GPT-2 modules
    gptadapter.mkdir()
    adapter = {"base_model_name_or_path": str(smoke_mini.paths.theta0), "peft_type": "LORA", "r": 2,
               "target_modules": ["c_attn"], "lora_alpha": 4}  # fmt: skip
    (gptadapter / "adapter_config.json").write_text(json.dumps(adapter))
    save_file({"base_model.model.transformer.h.0.attn.c_attn.lora_A.weight": torch.zeros(2, 32)},
              gptadapter / "adapter_model.safetensors")  # fmt: skip
    places = {
        "dupdata": dupdata,
        "export": export,
        "nanexport": nanexport,
        "dangling": work / "dangling",
        "dotdotresults": dotdot,
        "refentry": smoke_mini.paths.ref.parent,
        "theta0entry": smoke_mini.paths.theta0.parent,
        "pickled": pickled,
        "pickadapter": pickadapter,
        "bigvocab": bigvocab,
        "wrongarch": wrongarch,
        "gptadapter": gptadapter,
        "fifo": special / "fifo",
        "loop": special / "loop",
        "loopcells": special / "loopresults",
        "fifomodel": fifomodel,
    }
    return {name: str(path) for name, path in places.items()}


@pytest.mark.parametrize(("case", "argv", "code", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, argv, code, message, sandbox, capsys, monkeypatch):
    work, fields, store = sandbox
    monkeypatch.chdir(work)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # no hub here: a name that could be a hub id says so at once
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
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


def _sigterm(*_args, **_kwargs):
    import os
    import signal
    import time

    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # the handler stops the run here


def _bug(*_args, **_kwargs):
    raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


def _value_bug(*_args, **_kwargs):  # a bare ValueError deep inside the training loop: a bug, not a bad input
    raise ValueError("unsupported operand type(s) for +: too many values to unpack")


@pytest.mark.parametrize(
    ("target", "effect", "code", "message"),
    [
        ("margincal.pipeline.graph.unlearn_stage", _interrupt, 130, "margincal unlearn: interrupted"),
        ("margincal.model.loading.LlamaForCausalLM.save_pretrained", _disk_full, 2, "No space left on device; nothing"),
        ("margincal.pipeline.graph.unlearn_stage", _sigterm, 143, "margincal unlearn: terminated (SIGTERM)"),
        (
            "margincal.pipeline.graph.unlearn_stage",
            _bug,
            1,
            "margincal unlearn: internal error: TypeError: unsupported",
        ),
        (
            "margincal.training.loop.make_optimizer",
            _value_bug,
            1,
            "margincal unlearn: internal error: ValueError: unsup",
        ),
    ],
    ids=[
        "ctrl-c-during-training",
        "disk-full-while-saving",
        "sigterm-during-training",
        "a-bug-during-training",
        "a-bare-value-error-deep-in-training",
    ],
)
def test_failure_during_the_run_leaves_nothing(target, effect, code, message, sandbox, capsys, monkeypatch, tmp_path):
    """Ctrl-C or SIGTERM in the middle of training, a full disk while saving, a bug: exit code, one line, no output,
    no temp; a bug's traceback goes to a log file that the line names."""
    import transformers

    work, fields, store = sandbox
    monkeypatch.chdir(work)
    monkeypatch.setenv("MARGINCAL_LOGS", str(tmp_path / "logs"))
    if target.startswith("margincal.model.loading.LlamaForCausalLM"):
        monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", effect)
    else:
        monkeypatch.setattr(target, effect)
    before = _tree(work)
    argv = [_fill(a, fields) for a in [*UNLEARN, "train.steps=2", "train.batch_size=2"]]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert _tree(work) == before  # no runs/u, no .u.tmp-* directory
    if code == 1:
        (log,) = (tmp_path / "logs").iterdir()
        assert str(log) in err and "Traceback" in log.read_text() and "unsupported operand" in log.read_text()


# Every command that writes, with its output at a user's folder ({user}) or file ({userfile}); --overwrite where the
# command has it, so the refusal is the ownership rule's, not the "already exists" one.
WRITERS = {
    "demo": ["demo", "out={user}"],
    "unlearn": [*_U, "--out", "{user}", "--overwrite"],
    "polish": [*POLISH, "--out", "{user}", "--overwrite"],
    "attack": [*ATTACK, "--out", "{userfile}", "--overwrite"],
    "evaluate": [*EVALUATE, "--out", "{userfile}", "--overwrite"],
    "diagnose": [*DIAGNOSE, "--out", "{userfile}", "--overwrite"],
    "panel": ["panel", "demo", "out={user}"],
    "mini export": ["mini", "export", "{user}", "--overwrite"],
    "report": ["report", "{results}", "--out", "{user}"],
    "audit": ["audit", "--model", "{theta0}", "--out", "{user}", "--overwrite"],
    "population": ["population", "audit-a", "audit-b", "--out", "{user}", "--overwrite"],
    "anchors": [
        "anchors",
        "--ref",
        "{ref}",
        "--forget",
        "{forget}",
        "--out",
        "{usermodel}/model.safetensors",
        "--overwrite",
    ],  # a user's weights file: not an anchor table margincal wrote
}
READ_ONLY = {"methods"}  # commands that write nothing


def _commands(parser, prefix: str = "") -> dict:
    """Every (sub)command of the CLI by its full name."""
    import argparse

    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix}{name} ")
                out.update(nested or {f"{prefix}{name}": sub})
    return out


def test_every_writer_refuses_what_margincal_did_not_write(sandbox, capsys, monkeypatch):
    """Each command with an output refuses a user's folder or file, even with --overwrite, and leaves it as it was;
    a new command must be listed here (WRITERS) or declared read-only."""
    commands = _commands(build_parser())
    assert set(commands) == set(WRITERS) | READ_ONLY, "classify every command as a writer or read-only"
    for name, sub in commands.items():
        outputs = [a for a in sub._actions if "--out" in a.option_strings or a.dest in ("dir", "overrides")]
        assert bool(outputs) == (name in WRITERS), name
    work, fields, store = sandbox
    monkeypatch.chdir(work)
    monkeypatch.setenv("MARGINCAL_STORE", str(store))
    before = _tree(work)
    for name, argv in WRITERS.items():
        assert main([_fill(a, fields) for a in argv]) == 2, name
        err = capsys.readouterr().err
        assert re.search("did not write", err) and len(err.strip().splitlines()) == 1, (name, err)
    assert _tree(work) == before


def test_a_users_path_reaches_the_terminal_escaped(tmp_path, monkeypatch, capsys):
    """A command's result lines and progress lines show a path with escape codes and a right-to-left mark escaped,
    line breaks kept (issue 74: names printed safely everywhere, not only on error lines)."""
    import logging

    from margincal.cli import main
    from margincal.core.terminal import _PrintableFormatter

    record = logging.LogRecord("margincal", logging.INFO, __file__, 0, "run x\x1b[2Jy\nnext\u202e", None, None)
    assert _PrintableFormatter("%(message)s").format(record) == "run x\\x1b[2Jy\nnext\\u202e"
    monkeypatch.setenv("MARGINCAL_STORE", str(tmp_path / "store"))
    out = tmp_path / "x\x1b[31mred\u202e"
    assert main(["mini", "export", str(out)]) == 0
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err and "\u202e" not in printed.out + printed.err
    assert f"--data {tmp_path}/x\\x1b[31mred\\u202e --out npo_mc.json" in printed.out
