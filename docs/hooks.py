"""The reference pages generated from the code (never hand-copied), committed so that they read on the repository
too: ``python docs/hooks.py`` writes them, and the site build (this file is its mkdocs hook) stops on a page that is
no longer what the code generates (``tests/house/test_docs.py`` checks the same).

* ``reference/cli.md``: every command's ``--help``, from the parser ``margincal`` itself builds;
* ``reference/config.md``: every settings dataclass with its fields' types, defaults and range checks;
* ``reference/metrics.md``: the metric table's rows, per benchmark kind, in the order evaluate writes them;
* ``reference/methods.md``: the methods registry as ``margincal methods`` prints it (family, source, schedules).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import typing
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from margincal.reporting.tables import markdown_table

INTRO = "*Generated from the code by `python docs/hooks.py`; the site build and the tests check it is current.*\n\n"
DOCS = Path(__file__).resolve().parent


def _first_paragraph(obj: object) -> str:
    return " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())


def cli_page() -> str:
    """Each command's help as ``margincal COMMAND --help`` prints it."""
    from margincal.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width: the page's is fixed
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    out = ["# CLI reference\n", INTRO, "```text\n" + parser.format_help() + "```\n"]
    for name, command in sub.choices.items():
        out.append(f"## margincal {name}\n\n```text\n{command.format_help()}```\n")
    return "\n".join(out)


def _checks(cls: type) -> dict[str, str]:
    """The range rules ``cls.__post_init__`` applies (``check_fields``), by field, read from a default instance."""
    import margincal.config.typed as typed

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
    """Every settings dataclass of :mod:`margincal.config.settings` (and the panel's and audit budget's), field by
    field."""
    from margincal.auditing.plan import AuditBudget, SearchBlock
    from margincal.config import settings
    from margincal.pipeline.panel import PanelConfig

    classes = [
        c for _, c in inspect.getmembers(settings, dataclasses.is_dataclass) if c.__module__ == settings.__name__
    ]
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
        rows = []
        for field in (f for f in dataclasses.fields(cls) if f.init):
            kind = getattr(hints.get(field.name), "__name__", None) or str(hints.get(field.name, ""))
            kind = kind.replace("typing.", "").replace("margincal.config.settings.", "")
            rows.append([field.name, f"`{kind}`", _default(field), checks.get(field.name, "")])
        table = markdown_table(["field", "type", "default", "check"], rows)
        out.append(f"## {cls.__name__}\n\n{_first_paragraph(cls)}\n\n{table}\n")
    return "\n".join(out)


def metrics_page() -> str:
    """The metric table: every key evaluate writes, what it measures (its function's docstring, where it is defined),
    the splits it is computed on and its direction."""
    import margincal.evaluation.evaluators  # noqa: F401  (registers every metric function)
    from margincal.results import metric_table as T

    out = ["# Metric reference\n", INTRO]
    out.append(
        "Every number `margincal evaluate` writes is one row of `margincal.results.metric_table`, in the order "
        "it is written; what it measures is the docstring of the function computing it (registered with "
        "`@metric_value` where it is defined: the last column). *on*: the splits it is computed on, or the summary "
        "entries an aggregate reads; *better*: its direction.\n"
    )
    header = ["key", "what it measures", "on", "better", "computed by"]
    for kind, rows in {**T.TABLES, "any (asked for)": (T.MMLU,)}.items():
        cells = []
        for row in (r for r in rows if isinstance(r, T.Metric)):
            fn: Callable | None = T.VALUES.get(row.value) if row.value else None
            what = _first_paragraph(fn) if fn else "MMLU accuracy through lm-eval (`margincal.evaluation.mmlu`)."
            module = getattr(fn, "__module__", "")
            where = f"`{row.value}` ({module.removeprefix('margincal.')})" if fn else "`evaluation.mmlu`"
            on = ", ".join(row.roles) or ", ".join(f"`{i}`" for i in row.inputs)
            cells.append([f"`{row.name}`", what, on, row.better or "", where])
        out.append(f"## {kind}\n\n{markdown_table(header, cells)}\n")
    return "\n".join(out)


def methods_page() -> str:
    """The methods registry as ``margincal methods`` prints it (:func:`margincal.cli.show.methods_table`)."""
    from margincal.cli.show import methods_table

    out = ["# Methods reference\n", INTRO]
    out.append(
        "`margincal methods` prints this table; each method's shipped settings are `configs/methods/<name>.yaml`.\n"
    )
    return "\n".join(out) + f"\n```text\n{methods_table()}\n```\n"


API_SECTIONS = {  # a section by the module that defines each name of margincal.api.__all__ (in that order)
    "The stages": ("margincal.api.evaluation", "margincal.api.training"),
    "Audits and panels": ("margincal.api.audits", "margincal.api.panels", "margincal.api.mini"),
    "Errors": ("margincal.core.errors",),
    "Results": ("margincal.results.outputs", "margincal.results.base", "margincal.results.cards"),
}


def _api_sections() -> dict[str, list[str]]:
    """``margincal.api.__all__`` grouped by :data:`API_SECTIONS`; a name of another module stops the page."""
    import margincal.api as api

    sections: dict[str, list[str]] = {section: [] for section in API_SECTIONS}
    for name in api.__all__:
        module = inspect.unwrap(getattr(api, name)).__module__
        section = next((s for s, modules in API_SECTIONS.items() if module in modules), None)
        if section is None:
            raise ValueError(f"margincal.api.{name} is defined in {module}, which no API section names")
        sections[section].append(name)
    return sections


def api_page() -> str:
    """The Python API: a table of every name ``import margincal`` exposes with its first docstring line and the file
    defining it (what the repository shows), then mkdocstrings' directives (what the site renders from them)."""
    import margincal.api as api

    sections = _api_sections()
    listed = [name for names in sections.values() for name in names]
    out = ["# Python API\n", INTRO]
    out.append(
        "Everything `import margincal` exposes. Each stage is a function on the model you hold (a path, a hub id or an "
        "in-memory model) returning a typed result with `.save()`; `margincal.load()` reads any saved result back. "
        "The site renders each signature and docstring below the table; on the repository, the file named holds them."
        "\n"
    )
    rows = []
    for name in listed:
        obj = getattr(api, name)
        source = inspect.getsourcefile(inspect.unwrap(obj))
        where = "src/" + Path(source).as_posix().split("/src/", 1)[1] if source and "/src/" in source else ""
        rows.append([f"`{name}`", _first_sentence(obj), f"`{where}`"])
    out.append(markdown_table(["name", "what it is", "defined in"], rows) + "\n")
    out.append("::: margincal.api\n    options:\n      show_root_heading: false\n      members: false\n")
    for section, names in sections.items():
        out.append(f"## {section}\n\n" + "\n".join(f"::: margincal.api.{name}" for name in names) + "\n")
    return "\n".join(out)


def _first_sentence(obj: object, width: int = 160) -> str:
    """The first sentence of ``obj``'s docstring (cut at a word past ``width`` characters), its Sphinx roles and
    reST literals shown as code."""
    text = _first_paragraph(obj)
    text = re.sub(r":(?:class|func|meth|mod|data|attr|exc):`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    head = re.split(r"(?<=\.)\s(?=[A-Z])", text, maxsplit=1)[0]
    if len(head) > width:
        head = head[:width].rsplit(" ", 1)[0] + " …"
    return head.replace("|", "\\|")


PAGES = {
    "reference/api.md": api_page,
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/metrics.md": metrics_page,
    "reference/methods.md": methods_page,
}


# the figures the pages show, copied from the committed records that hold them (never drawn twice)
FIGURES = {
    "figures/testbed-cliff.png": "results/testbed/head2head/cliff.png",
    "figures/testbed-pareto.png": "results/testbed/head2head/pareto.png",
    "figures/population.png": "results/audit/population.png",
    "figures/mini-cliff.png": "results/mini/head2head/cliff.png",
    "figures/card-ksweep.png": "results/audit/demo-standard/figures/NPO+MC-ksweep-lora_r8.png",
    "figures/card-margins.png": "results/audit/demo-standard/figures/NPO+MC-margins.png",
    "figures/card-search.png": "results/audit/demo-worst-valid/figures/NPO+MC-search.png",
}


def stale_pages() -> list[str]:
    """The committed reference pages and figures that differ from what the code generates now or the records hold."""
    stale = [path for path, page in PAGES.items() if (DOCS / path).read_text(encoding="utf-8") != page()]
    copies = [path for path, source in FIGURES.items() if not _same(DOCS / path, DOCS.parent / source)]
    return stale + copies


def _same(copy: Path, source: Path) -> bool:
    return copy.is_file() and copy.read_bytes() == source.read_bytes()


def on_pre_build(config):
    """Stop the build on a reference page the code no longer generates."""
    from mkdocs.exceptions import PluginError

    stale = stale_pages()
    if stale:
        raise PluginError(f"{', '.join(stale)}: generated from older code; run `python docs/hooks.py`")


ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):(<code>)~?")  # a Sphinx role before its rendered name


def on_page_content(html, page, config, files):
    """The API docstrings' Sphinx cross-reference roles shown as their names (``:func:`x``` → ``x``), and the "::"
    that opens a literal block as a colon."""
    return ROLE.sub(r"\1", html).replace("::</p>", ":</p>")  # and an RST literal block's "::" as a colon


if __name__ == "__main__":
    for path, page in PAGES.items():
        (DOCS / path).write_text(page(), encoding="utf-8")
        print(f"wrote docs/{path}")
    for path, source in FIGURES.items():
        (DOCS / path).parent.mkdir(exist_ok=True)
        (DOCS / path).write_bytes((DOCS.parent / source).read_bytes())
        print(f"copied {source} to docs/{path}")
