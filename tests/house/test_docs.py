"""The documentation: a README of one screen whose two commands come first, and the docs site built with
``mkdocs build --strict`` (a broken link, a page missing from the nav or a generated reference page that fails to
build stops it)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_the_readme_is_one_screen_with_the_two_commands_first():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    first = "\n".join(lines[:30])
    assert '.venv/bin/pip install torch==2.13.0 -e ".[dev]" && .venv/bin/margincal demo' in first
    assert ".venv/bin/python -m pytest -q" in first


def test_docs_holds_documentation_only():
    kinds = {p.suffix for p in (ROOT / "docs").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert kinds == {".md", ".py", ".png", ".js"}  # pages, the hook, the records' figures, MathJax's settings


def _hooks():
    """``docs/hooks.py`` as a module (it is not a package of the project)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("margincal_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_and_figures_are_current():
    """The reference pages read on the repository as on the site: committed, and what the code generates now; the
    figures the pages show are the committed records' own (``python docs/hooks.py`` writes both)."""
    hooks = _hooks()
    assert hooks.stale_pages() == []
    assert set(hooks.FIGURES) == {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs" / "figures").glob("*")}


MACHINE_PATH = re.compile(r"(?<![\w.<>~-])/(?:work|home|Users|root|opt|tmp|mnt|scratch|srv|private|var)/")


def test_no_committed_record_or_page_names_a_machine_path():
    """Records, pages and the shipped models' files name paths relative to the repository, the run or the store
    (``<store>/...``, ``<venv>/...`` where a record cites a file outside them), never the machine that made them."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    kinds = (".json", ".md", ".csv", ".yaml", ".jsonl", ".txt")
    roots = ("results/", "docs/", "benchmarks/results/", "src/margincal/mini/shipped/", "README.md")
    found = []
    for name in tracked.splitlines():
        if name.startswith(roots) and name.endswith(kinds):
            text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
            found += [f"{name}: {m.group(0)}" for m in MACHINE_PATH.finditer(text)][:1]
    hooks = _hooks()
    found += [f"docs/{path} (generated)" for path, page in hooks.PAGES.items() if MACHINE_PATH.search(page())]
    assert not found, found[:10]


def test_the_site_builds_strictly_with_its_generated_reference(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml")]
    run += ["-d", str(tmp_path)]
    done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "margincal audit" in cli and "--budget" in cli  # every command's help, from the parser
    config = (tmp_path / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert "MCConfig" in config and "kl_weight" in config and "a positive number" in config  # fields and checks
    metrics = (tmp_path / "reference" / "metrics" / "index.html").read_text(encoding="utf-8")
    assert "forget_Q_A_ROUGE" in metrics and "(evaluation.metrics)" in metrics and "what it measures" in metrics
    for page in ("index.html", "results/index.html", "guides/audit/index.html", "getting-started/index.html"):
        assert '<img alt="' in (tmp_path / page).read_text(encoding="utf-8"), page  # the records' figures shown
    concepts = (tmp_path / "concepts" / "index.html").read_text(encoding="utf-8")
    assert concepts.count('class="arithmatex"') >= 10 and "\\hat t_\\theta" in concepts  # equations for MathJax
    assert "GradDiff" in (tmp_path / "reference" / "methods" / "index.html").read_text(encoding="utf-8")
    assert "def evaluate" not in (api := (tmp_path / "reference" / "api" / "index.html").read_text(encoding="utf-8"))
    assert "diagnose" in api and "AuditCard" in api


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _command_lines(text: str) -> list[str]:
    """Every ``margincal`` command line of the shell blocks of a page (continuations joined, comments cut)."""
    found = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            for part in re.split(r"\s*(?:&&|;)\s*", line.split("  #")[0].strip()):
                command = re.match(r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?margincal\s+(.*)$", part)
                if command:
                    found.append(command.group(1).split(" | ")[0].split(" > ")[0])
    return found


def test_every_documented_command_line_parses_and_every_python_block_compiles():
    """The docs' examples stay true to the CLI: each ``margincal ...`` line a page shows parses with the parser the
    command runs (an option renamed or removed stops here), and each Python block is valid Python. Run end to end
    elsewhere: the API's docstring examples and the quickstart (tests/integration/test_api.py), the mini's polish,
    attack and diagnose commands (tests/unit/mc/test_bounds.py, tests/e2e/test_example_hf_trainer.py), the demo
    (tests/e2e/test_demo_e2e.py); the real-scale pages need a GPU or the hub and say so."""
    from margincal.cli import build_parser, parse_args

    checked = 0
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for line in _command_lines(text):
            args = shlex.split(line)
            if "--help" not in args and "-h" not in args:
                try:
                    parse_args(build_parser(), args)
                except SystemExit:
                    raise AssertionError(f"{page.relative_to(ROOT)}: `margincal {line}` does not parse") from None
            checked += 1
        for block in re.findall(r"```python\n(.*?)```", text, re.S):
            compile(block, str(page), "exec")
    assert checked >= 30


def test_every_population_predictor_has_a_human_axis_label():
    from margincal.auditing.population import PREDICTOR_LABELS, PREDICTORS

    assert PREDICTOR_LABELS.keys() == PREDICTORS.keys() and all(k not in v for k, v in PREDICTOR_LABELS.items())


def _cells(line: str) -> int:
    """The cells of a Markdown table row (pipes escaped as ``\\|`` stay inside a cell)."""
    return len(re.split(r"(?<!\\)\|", line.strip().strip("|")))


def test_generated_markdown_renders_as_tables():
    """Every table of every committed card, report and write-up under results/ (and of the docs) renders: its
    header, separator and rows have one number of cells (an unescaped ``|`` in a cell would break the row)."""
    pages = [*(ROOT / "results").rglob("*.md"), *_pages()]
    tables = 0
    for page in pages:
        lines = re.split(r"\r\n|\r|\n", page.read_text(encoding="utf-8"))  # CommonMark's line endings only
        for i, line in enumerate(lines[:-1]):
            if line.startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
                width, tables, j = _cells(line), tables + 1, i + 1
                while j < len(lines) and lines[j].startswith("|"):
                    assert _cells(lines[j]) == width, f"{page.relative_to(ROOT)}:{j + 1}: {lines[j][:80]}"
                    j += 1
    assert tables > 100


def test_every_relative_link_of_the_readme_and_the_pages_resolves_in_the_repository():
    """A reader on the repository page follows the README's and the pages' links to files that exist (the reference
    pages are committed for this)."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not link.startswith(("http://", "https://", "mailto:")) and not (page.parent / link).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {link}")
    assert not broken
