"""The package's folders are its layers, as the "Layers" table of ``docs/architecture.md`` declares them, and the
layers hold over ``src/margincal`` (every import, function-local ones too): the table names every folder of the
package once and nothing else, no module sits outside a folder but the package root, no module imports from a later
layer, a ground folder imports only itself and the ground folders named before it, the graph has no circles, and
importing the report layer leaves torch unloaded. Planted breaches show that each check can fail."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SRC = ROOT / "src"


def read_layers(readme: Path = ROOT / "docs" / "architecture.md") -> dict[str, int]:
    """Folder (as a module prefix) → layer number, from the table under the architecture page's ``### Layers``
    heading, in the table's order; ``margincal`` is the package root."""
    text = readme.read_text(encoding="utf-8").split("### Layers", 1)[1].split("\n### ", 1)[0]
    layers = {}
    for row in re.findall(r"^\| (\d+) [^|]+\| ([^|]+) \|", text, flags=re.M):
        for name in re.findall(r"`([\w.]+)`", row[1]):
            layers["margincal" if name == "margincal" else f"margincal.{name}"] = int(row[0])
    return layers


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module → the margincal modules it imports anywhere in its source (``from a import b`` names ``a.b`` when that
    is a module, else ``a``)."""
    paths = {}
    for path in sorted((src / "margincal").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of the folder ``module`` lives in (the package root's for ``margincal`` itself; None when the table
    names neither)."""
    parts = module.split(".")
    return layers.get(".".join(parts[:2]) if len(parts) > 1 else module)


def folder_of(module: str) -> str:
    """``margincal.<folder>`` for a module in a folder, ``margincal`` for the root."""
    return ".".join(module.split(".")[:2])


def breaches(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every module outside the table, every import of a ground folder but of itself or one named before it in the
    ground row, and every upward import, one line each."""
    found = [f"{m}: in no layer" for m in graph if layer_of(m, layers) is None]
    ground = [name for name, layer in layers.items() if layer == 1]
    for module, targets in sorted(graph.items()):
        own = layer_of(module, layers)
        for target in sorted(targets):
            if (module, target) == ("margincal", "margincal.api"):  # the root's lazy face (PEP 562)
                continue
            if own == 1 and module != "margincal":
                folder, other = folder_of(module), folder_of(target)
                if other not in ground or ground.index(other) > ground.index(folder):
                    found.append(f"{module} (ground) imports {target}")
            elif own is not None and (layer_of(target, layers) or 0) > own:
                found.append(f"{module} (layer {own}) imports {target} (layer {layer_of(target, layers)})")
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_table_names_every_folder_once_and_the_root_holds_no_other_module():
    layers = read_layers()
    assert sorted(set(layers.values())) == list(range(1, 10))
    package = SRC / "margincal"
    folders = sorted(f"margincal.{p.name}" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert sorted(name for name in layers if name != "margincal") == folders
    assert [p.name for p in package.glob("*.py")] == ["__init__.py"]


def test_a_folder_the_table_does_not_name_is_found(tmp_path):
    shutil.copytree(SRC / "margincal", tmp_path / "margincal", ignore=shutil.ignore_patterns("configs", "__pycache__"))
    (tmp_path / "margincal" / "extras").mkdir()
    (tmp_path / "margincal" / "extras" / "__init__.py").write_text("")
    (tmp_path / "margincal" / "loose.py").write_text("")
    assert breaches(import_graph(tmp_path), read_layers()) == [
        "margincal.extras: in no layer",
        "margincal.loose: in no layer",
    ]


def test_no_upward_import_and_no_circle():
    graph = import_graph(SRC)
    assert breaches(graph, read_layers()) == []
    assert circles(graph) == []


@pytest.mark.parametrize(
    "module, planted, expected",
    [
        (
            "config/settings.py",
            "from margincal.training.attacks import ATTACKERS",
            "margincal.config.settings (ground) imports margincal.training.attacks",
        ),
        (
            "core/inputs.py",
            "from margincal.config.settings import brief",
            "margincal.core.inputs (ground) imports margincal.config.settings",
        ),
        (
            "reporting/panel.py",
            "from margincal.pipeline.cell import run_cell",
            "margincal.reporting.panel (layer 2) imports margincal.pipeline.cell (layer 7)",
        ),
        (
            "evaluation/tofu.py",
            "from ..mc.polish import run_polish",
            "margincal.evaluation.tofu (layer 5) imports margincal.mc.polish (layer 6)",
        ),
    ],
)
def test_a_planted_upward_import_is_found(tmp_path, module, planted, expected):
    shutil.copytree(SRC / "margincal", tmp_path / "margincal", ignore=shutil.ignore_patterns("configs", "__pycache__"))
    path = tmp_path / "margincal" / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _planted():\n    {planted}\n", encoding="utf-8")
    assert breaches(import_graph(tmp_path), read_layers()) == [expected]


def test_a_planted_circle_is_found(tmp_path):
    shutil.copytree(SRC / "margincal", tmp_path / "margincal", ignore=shutil.ignore_patterns("configs", "__pycache__"))
    path = tmp_path / "margincal" / "model" / "scoring.py"
    path.write_text(path.read_text(encoding="utf-8") + "\n\ndef _planted():\n    import margincal.model.margin\n")
    assert circles(import_graph(tmp_path)) == [["margincal.model.margin", "margincal.model.scoring"]]


def test_the_report_layer_imports_without_torch():
    layers = read_layers()
    modules = sorted(m for m in import_graph(SRC) if layer_of(m, layers) <= 2)
    assert "margincal.reporting.panel" in modules
    code = (
        f"import sys\nfor m in {modules!r}:\n    __import__(m)\nprint(sorted(m for m in sys.modules if m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_command_line_help_runs_without_torch():
    """``margincal --help`` (every command's parser built, the libraries quieted) leaves torch unloaded: a command
    imports the library only when it runs (its imports in ``cli/`` marked ``# lazy: help``)."""
    code = (
        "import sys\nfrom margincal.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "COMMAND" in done.stdout and done.stderr.strip().splitlines()[-1] == "False"


def test_readme_files_table_names_every_module():
    """Every module file of ``src/margincal`` is named in the architecture page's "Files" table: by its path, or by its
    file name in its package's row; and every path the table names exists."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("### Files", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for path, holds in re.findall(r"^\| (`[^|]+`) \| (.+) \|$", text, flags=re.M):
        for name in re.findall(r"`([^`]+)`", path):
            rows[name] = holds
    assert [name for name in rows if not (ROOT / name).exists() and not (ROOT / "src/margincal" / name).exists()] == []
    missing = []
    for path in sorted((SRC / "margincal").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        package = path.parent.relative_to(ROOT).as_posix() + "/"
        if rel in rows or path.name in ("__init__.py", "__main__.py"):
            continue
        if not (package in rows and f"`{path.name}`" in rows[package]):
            missing.append(rel)
    assert missing == []


STAGE_MODULES = ("margincal.pipeline.stages", "margincal.training.loop", "margincal.training.unlearning",
"margincal.mc.polish",
                 "margincal.training.attacks", "margincal.pipeline.graph", "margincal.pipeline.cell",
                 "margincal.auditing.prepare", "margincal.auditing.search", "margincal.auditing.report",
                 "margincal.mini.models")  # fmt: skip


def test_the_cli_is_a_thin_layer_over_the_library():
    """No module under ``cli/`` imports a stage, the training loop, the graph runner or the audit's runner (every
    command calls :mod:`margincal.api`), and ``cli/commands.py`` stays at most 350 lines."""
    graph = import_graph(SRC)
    reached = {(m, t) for m, targets in graph.items() if m.startswith("margincal.cli") for t in targets}
    assert sorted((m, t) for m, t in reached if t in STAGE_MODULES) == []
    assert len((SRC / "margincal" / "cli" / "commands.py").read_text().splitlines()) <= 350
