"""mkdocs hook: the reference pages generated from the code at build time (never hand-copied).

* ``reference/cli.md``: every command's ``--help``, from the parser ``margincal`` itself builds;
* ``reference/config.md``: every settings dataclass with its fields' types, defaults and range checks;
* ``reference/metrics.md``: the metric table's rows, per benchmark kind, in the order evaluate writes them;
* ``reference/methods.md``: the methods registry with family, source and shipped defaults.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Callable
from unittest import mock

from mkdocs.structure.files import File

INTRO = "*Generated from the code when the site is built (`docs/hooks.py`).*\n\n"


def _first_paragraph(obj: object) -> str:
    return " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def cli_page() -> str:
    """Each command's help as ``margincal COMMAND --help`` prints it."""
    from margincal.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    out = ["# CLI reference\n", INTRO, "```text\n" + parser.format_help() + "```\n"]
    for name, command in sub.choices.items():
        out.append(f"## margincal {name}\n\n```text\n{command.format_help()}```\n")
    return "\n".join(out)


def _checks(cls: type) -> dict[str, str]:
    """The range rules ``cls.__post_init__`` applies (``check_fields``), by field, read from a default instance."""
    import margincal.typed as typed

    seen: dict[str, str] = {}

    def record(obj: object, **rules: typed.Rule) -> None:
        seen.update({name: what for name, (_, what) in rules.items()})

    module = inspect.getmodule(cls)
    try:
        with mock.patch.object(module, "check_fields", record, create=True):
            cls()
    except Exception:  # a dataclass with required fields: its checks run when it is built
        return {}
    return seen


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`"
    if field.default_factory is not dataclasses.MISSING:
        return f"`{field.default_factory()!r}`"
    return "required"


def config_page() -> str:
    """Every settings dataclass of :mod:`margincal.config` (and the panel's and audit budget's), field by field."""
    from margincal import config
    from margincal.auditing.plan import AuditBudget, SearchBlock
    from margincal.pipeline.panel import PanelConfig

    classes = [c for _, c in inspect.getmembers(config, dataclasses.is_dataclass) if c.__module__ == config.__name__]
    classes.sort(key=lambda c: inspect.getsourcelines(c)[1])
    out = ["# Configuration reference\n", INTRO]
    out.append(
        "Settings come from the shipped YAML files under `configs/` and from `key=value` overrides (dotted keys); "
        "every value is checked against these dataclasses before any model is loaded. The defaults below are the "
        "only defaults.\n"
    )
    for cls in [*classes, PanelConfig, AuditBudget, SearchBlock]:
        hints = typing.get_type_hints(cls)
        checks = _checks(cls)
        out.append(f"## {cls.__name__}\n\n{_first_paragraph(cls)}\n")
        out.append("| field | type | default | check |\n|---|---|---|---|")
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            kind = getattr(hints.get(field.name), "__name__", None) or str(hints.get(field.name, ""))
            kind = kind.replace("typing.", "").replace("margincal.config.", "")
            row = (field.name, f"`{kind}`", _default(field), checks.get(field.name, ""))
            out.append("| " + " | ".join(_cell(v) for v in row) + " |")
        out.append("")
    return "\n".join(out)


def metrics_page() -> str:
    """The metric table: every key evaluate writes, with its direction, format and the function computing it."""
    import margincal.evaluation.evaluators  # noqa: F401  (registers every metric function)
    from margincal.evaluation import metric_table as T

    out = ["# Metric reference\n", INTRO]
    out.append(
        "Every number `margincal evaluate` writes is one row of `margincal.evaluation.metric_table`, in the order "
        "it is written; its function is registered with `@metric_value` in the module named.\n"
    )
    for kind, rows in {**T.TABLES, "any (asked for)": (T.MMLU,)}.items():
        out.append(f"## {kind}\n\n| key | label | roles | better | format | group | computed by |")
        out.append("|---|---|---|---|---|---|---|")
        for row in rows:
            if not isinstance(row, T.Metric):
                continue
            fn: Callable | None = T.VALUES.get(row.value) if row.value else None
            where = f"`{row.value}` ({fn.__module__})" if fn else "`margincal.evaluation.mmlu`"
            roles = ", ".join(row.roles) or "summary: " + ", ".join(row.inputs)
            cells = (f"`{row.name}`", row.display, roles, row.better or "", f"`{row.fmt}`", row.group, where)
            out.append("| " + " | ".join(_cell(v) for v in cells) + " |")
        out.append("")
    return "\n".join(out)


def methods_page() -> str:
    """The methods registry: family, source (the class docstring's first paragraph) and shipped defaults."""
    from margincal.config_files import CONFIG_DIR
    from margincal.methods import METHODS

    out = ["# Methods reference\n", INTRO]
    out.append(
        "`margincal methods` prints the same registry; each method's shipped settings are "
        "`configs/methods/<name>.yaml`.\n\n| method | family | source and loss | settings file |\n|---|---|---|---|"
    )
    for key in sorted(METHODS, key=lambda k: (METHODS[k].family, k)):
        cls = METHODS[key]
        shipped = CONFIG_DIR / "methods" / f"{key}.yaml"
        file = f"`configs/methods/{shipped.name}`" if shipped.exists() else ""
        out.append(f"| {cls.name} | {cls.family} | {_cell(_first_paragraph(cls))} | {file} |")
    return "\n".join(out) + "\n"


PAGES = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/metrics.md": metrics_page,
    "reference/methods.md": methods_page,
}


def on_files(files, config):
    """Add the generated reference pages to the site."""
    for path, page in PAGES.items():
        files.append(File.generated(config, path, content=page()))
    return files


ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):(<code>)~?")  # a Sphinx role before its rendered name


def on_page_content(html, page, config, files):
    """The API docstrings' Sphinx cross-reference roles shown as their names (``:func:`x``` → ``x``), and the "::"
    that opens a literal block as a colon."""
    return ROLE.sub(r"\1", html).replace("::</p>", ":</p>")  # and an RST literal block's "::" as a colon
