"""Rules on the source that ruff does not hold: the formatter checks all of ``src/`` (no ``# fmt: skip``), and no
function re-imports a name its module already imports at the top."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "margincal"
# `# fmt: skip` lines allowed in src/: only a table of numbers that reads better aligned may take one (none does now)
FMT_SKIPS = 0


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
    planted = "from margincal.config import build\n\n\ndef f():\n    from margincal.config import build\n"
    assert reimports(planted) == ["line 5: margincal.config.build"]
