"""Each option declared once: the CLI's flags, the library's signatures and the config dataclasses agree on every
option they share (its default, whether it is required), and an option only one of them has is declared so here,
with the reason. A new flag or keyword that drifts, or appears on one side alone, fails this test."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from margincal import api
from margincal.auditing.prepare import AuditRequest
from margincal.cli import build_parser
from margincal.config.settings import EvalSettings

# command → the library function it calls
COMMANDS = {
    "unlearn": "unlearn",
    "polish": "polish",
    "attack": "attack",
    "evaluate": "evaluate",
    "diagnose": "diagnose",
    "anchors": "anchors",
    "audit": "audit",
    "population": "population",
    "panel": "run_panel",
    "report": "report",
}
# flags a command has and its function has not, each standing for a keyword it does have or a file it writes
CLI_ONLY = {
    "out": "a command writes its result where the library returns it (save it with Result.save)",
    "overwrite": "goes with --out",
    "k_sweep": "several budgets: the library's k takes a list",
    "dry_run": "the plan printed (margincal.pipeline.panel.load_panel in Python)",
    "model": "audit's repeated --model entries are the library's models",
    "batch_size": "an EvalSettings field (settings=)",
    "generation_batch_size": "an EvalSettings field (settings=)",
    "mmlu": "an EvalSettings field (settings=)",
    "no_gradnorm": "EvalSettings.gradnorm (settings=)",
}
# keywords a function has and its command has not
API_ONLY = {
    "tokenizer": "a model in memory's tokenizer",
    "log": "progress lines: the CLI prints them",
    "command": "the command line recorded in the result: the CLI's own",
    "settings": "EvalSettings whole: the CLI sets its fields by flags",
    "mc": "MCConfig whole or a mapping: the CLI gives key=value overrides",
    "kappa": "a field of MCConfig: the CLI gives kappa=...",
    "kl_weight": "a field of MCConfig: the CLI gives kl_weight=...",
    "models": "audit's models in memory or by path: the CLI's --model",
    "report": "run_panel's report: margincal demo writes it, margincal report after a panel",
}
# requirements only the CLI has: a command that trains writes its model somewhere
CLI_REQUIRED = {("unlearn", "out"), ("polish", "out")}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in ("help", "func")}


def _empty_list(action: argparse.Action) -> bool:
    """A flag whose absence gives an empty list (``nargs='*'``, ``append``)."""
    return action.nargs == "*" or isinstance(action, argparse._AppendAction)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_cli_and_the_library_agree_on_every_option_they_share(command):
    flags = _flags(_subparsers()[command])
    parameters = inspect.signature(getattr(api, COMMANDS[command])).parameters
    drift = []
    for dest, action in flags.items():
        if dest not in parameters:
            if dest not in CLI_ONLY:
                drift.append(f"--{dest} has no keyword in api.{COMMANDS[command]} and is not declared CLI-only")
            continue
        default = parameters[dest].default
        required = default is inspect.Parameter.empty
        cli_required = action.required and not (_empty_list(action) and not action.option_strings)
        if cli_required != required and (command, dest) not in CLI_REQUIRED:
            drift.append(f"{dest}: required by the {'CLI' if cli_required else 'library'} alone")
        absent = [] if action.nargs == "*" and not action.option_strings else action.default  # what argparse gives
        same = absent == default or (_empty_list(action) and isinstance(absent, list) and tuple(absent) == default)
        if not required and not same:
            drift.append(f"{dest}: CLI default {action.default!r}, library default {default!r}")
    for name, parameter in parameters.items():
        if name not in flags and name not in API_ONLY and parameter.kind is parameter.KEYWORD_ONLY:
            drift.append(f"api.{COMMANDS[command]}'s {name} has no flag and is not declared library-only")
    assert not drift, f"margincal {command}: " + "; ".join(drift)


def test_evaluation_flags_leave_evaluation_settings_at_their_dataclass_defaults():
    """--batch-size, --generation-batch-size and --mmlu default to None (EvalSettings' own), --no-gradnorm to off;
    the help names the dataclass's default."""
    fields = {f.name: f.default for f in dataclasses.fields(EvalSettings)}
    for command, parser in _subparsers().items():
        flags = _flags(parser)
        for dest in ("batch_size", "generation_batch_size", "mmlu"):
            if dest in flags:
                assert flags[dest].default is None, f"margincal {command} --{dest}"
                if fields[dest] is not None:
                    assert f"default {fields[dest]}" in flags[dest].help, f"margincal {command} --{dest}"
        if "no_gradnorm" in flags:
            assert flags["no_gradnorm"].default is False and fields["gradnorm"] is True


def test_the_audit_request_takes_the_audit_defaults():
    """Every field of AuditRequest that audit() also takes has audit()'s default where it has one."""
    parameters = inspect.signature(api.audit).parameters
    for field in dataclasses.fields(AuditRequest):
        if field.name in parameters and field.default is not dataclasses.MISSING:
            assert field.default == parameters[field.name].default, field.name


# keywords whose default is worked out from other inputs where a function has them, so it differs on purpose
DERIVED = {
    ("diagnose", "benchmark"): "tofu, or muse-news for aggregate='median'",
    ("audit", "benchmark"): "the mini benchmark for a mini export, else tofu",
    ("audit", "scale"): "mini on the mini benchmark, else paper",
    ("mini_export", "tier"): "the mini export writes one tier's splits, forget10 unless asked",
    ("mini_export", "panel"): "a panel's mini settings, not a panel to run",
    ("run_panel", "panel"): "the panel run",
    ("population", "command"): "the call recorded names its own function",
    ("audit", "command"): "the call recorded names its own function",
}


def test_a_keyword_the_library_functions_share_has_one_default():
    """Where two public functions take the same keyword with a default, the defaults are equal, or the function's
    default is worked out from its other inputs and declared so above."""
    defaults: dict[str, dict[str, object]] = {}
    for name in api.__all__:
        function = getattr(api, name)
        if not (inspect.isfunction(function) and name[0].islower()):
            continue
        for parameter in inspect.signature(function).parameters.values():
            if parameter.default is not inspect.Parameter.empty and (name, parameter.name) not in DERIVED:
                defaults.setdefault(parameter.name, {})[name] = parameter.default
    drift = {key: by for key, by in defaults.items() if len({repr(v) for v in by.values()}) > 1}
    assert not drift and len(defaults["dtype"]) == 7 and len(defaults["store"]) == 6
