"""Rules on the source that ruff does not hold: the formatter checks all of ``src/`` (no ``# fmt: skip``), no
function re-imports a name its module already imports at the top, and a function imports from margincal only where
that keeps something light, saying why (``# lazy: <reason>``), in at most :data:`MAX_LAZY` places; modules and
functions stay short."""

from __future__ import annotations

import ast
import re

from conftest import ROOT

SRC = ROOT / "src" / "margincal"
# `# fmt: skip` lines allowed in src/: only a table of numbers that reads better aligned may take one (none does now)
FMT_SKIPS = 0
# Why a margincal import may sit in a function rather than at its module's top, named on its line as `# lazy: <reason>`
# (on the `from` line of a multi-line one). Each moved to the top would load what the reason names on import of the
# module; `--help` and `import margincal` are checked torch-free in tests/house/test_layers.py. No `cycle`: that test
# also finds a circle through a function-local import, so moving one to the top can never be what closes one.
LAZY_REASONS = {
    "help": "keeps the command line's start and `margincal --help` light: a command imports the library when it runs",
    "torch": "keeps a torch-free module (the package root, a reader of stored results) torch-free",
    "plots": "keeps matplotlib unloaded in a module that draws a figure in one function only",
}
MAX_LAZY = 40  # function-local margincal imports in src/, all reasons together


def test_the_formatter_checks_all_of_src():
    skips = []
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        skips += [f"{path.relative_to(SRC)}:{i}" for i, line in enumerate(lines, 1) if "fmt: skip" in line]
    assert len(skips) <= FMT_SKIPS, skips


def reimports(source: str) -> list[str]:
    """Function-local imports of a name the module already imports at its top level."""
    tree = ast.parse(source)
    top = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            top |= {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            top |= {(alias.name, None) for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import) and node.col_offset > 0:
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                name = (module, alias.name) if module is not None else (alias.name, None)
                if name in top:
                    found.append(f"line {node.lineno}: {'.'.join(filter(None, name))}")
    return found


def test_no_function_reimports_a_top_level_import():
    assert {str(p.relative_to(SRC)): reimports(p.read_text(encoding="utf-8")) for p in SRC.rglob("*.py")} == {
        str(p.relative_to(SRC)): [] for p in SRC.rglob("*.py")
    }
    planted = (
        "from margincal.config.settings import build\n\n\ndef f():\n    from margincal.config.settings import build\n"
    )
    assert reimports(planted) == ["line 5: margincal.config.settings.build"]


def lazy_imports(source: str) -> list[tuple[int, str | None]]:
    """(line, reason) of every function-local import from margincal (``from margincal...``, a relative one, or
    ``import margincal...``): the word after ``# lazy:`` on its first line, None when there is none."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):  # a nested function's imports are met again from each enclosing one
            if isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] == "margincal"
            else:
                ours = isinstance(node, ast.Import) and any(a.name.split(".")[0] == "margincal" for a in node.names)
            if ours:
                reason = re.search(r"#\s*lazy:\s*(\w+)", lines[node.lineno - 1])
                found[node.lineno] = reason and reason.group(1)
    return sorted(found.items())


def lazy_breaches(sources: dict[str, str], limit: int = MAX_LAZY) -> list[str]:
    """Each function-local margincal import of ``sources`` (name → source) without an accepted reason, and their
    number when it is over ``limit``, one line each."""
    found = [(f"{name}:{line}", why) for name, source in sources.items() for line, why in lazy_imports(source)]
    out = [
        f"{where}: reason {why!r} not in LAZY_REASONS" if why else f"{where}: no # lazy: reason"
        for where, why in found
        if why not in LAZY_REASONS
    ]
    if len(found) > limit:
        out.append(f"{len(found)} function-local margincal imports (at most {limit})")
    return out


def test_function_local_margincal_imports_say_why_and_are_few():
    sources = {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}
    assert lazy_breaches(sources) == []
    planted = (
        "from margincal.config.settings import build\n\n\ndef f():\n"
        "    from margincal.model.loading import load_model\n"
        "    from margincal.cli import parsers  # lazy: help\n"
        "    from .tofu import (  # lazy: speed\n        load_split,\n    )\n"
        "    import margincal.api as api\n"
    )
    assert lazy_breaches({"planted.py": planted}, limit=3) == [
        "planted.py:5: no # lazy: reason",
        "planted.py:7: reason 'speed' not in LAZY_REASONS",
        "planted.py:10: no # lazy: reason",
        "4 function-local margincal imports (at most 3)",
    ]


MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80  # a module's lines; a function's, from `def` to its last line


def oversized(sources: dict[str, str]) -> list[str]:
    """Modules over :data:`MAX_FILE_LINES` lines and functions over :data:`MAX_FUNCTION_LINES` (docstring included)."""
    sizes = {name: len(text.splitlines()) for name, text in sources.items()}
    out = [f"{name}: {size} lines" for name, size in sizes.items() if size > MAX_FILE_LINES]
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return out


def test_modules_and_functions_stay_short():
    assert oversized({str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}) == []
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert oversized({"a.py": long_function, "b.py": "x = 1\n" * (MAX_FILE_LINES + 1)}) == [
        f"b.py: {MAX_FILE_LINES + 1} lines",
        f"a.py:1 f: {MAX_FUNCTION_LINES + 1} lines",
    ]
