"""Fuzz every input margincal reads from a user: panel files, ``key=value`` overrides, TOFU-format data files and cell
records, generated with hypothesis (wrong shapes, missing and extra keys, wrong types, out-of-range numbers,
unicode, huge values), each through the CLI in-process; and the hostile classes of issue 38: names with path segments
(panel variants, audit checkpoints), deep and aliased YAML and deep JSON, non-finite numbers in a reference result,
counts past their maxima (refused, and quickly).

    .venv/bin/python benchmarks/fuzz_inputs.py [--examples N] [--seed S] [--targets NAME ...]   # N per target (500)

For every generated input it asserts: exit status 0 (a valid input) or 2 (a bad one), and for 2 exactly one line on
stderr naming the command, no traceback, nothing written in the working directory or the store, no input
changed; inputs built to be invalid (an unknown key, a top level that is not a mapping, a missing required key)
must give 2. ``tests/e2e/test_fuzz_inputs.py`` runs the same targets with a bounded number of examples.
It prints, per target, the number of inputs generated, how many were accepted and refused, and every failure.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from margincal.cli import main as margincal

# ----------------------------------------------------------------------------------------------- values

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**32, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.5, 1e-300, 1e308, float("nan"), float("inf")]),
    TEXT,
    st.sampled_from(["", "../..", "/etc", "mini", "NPO", "forget10", "lora_r8", "reference", "∞", "𝔘𝔫𝔦"]),
)
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)

# ------------------------------------------------------------------------------------------- the targets


@dataclasses.dataclass
class Sandbox:
    """A working directory with a small panel, smoke-size mini data, a few cell records and a store."""

    work: Path
    store: Path
    data: Path
    records: Path  # a panel results directory: cells/ with valid records


BASE_PANEL = {  # a one-cell panel over the smoke mini (valid: its dry run exits 0)
    "extends": "demo",
    "name": "fuzz",
    "methods": ["NPO"],
    "attackers": [{"preset": "lora_r8", "k": [4], "set": {"train.steps": 3}}],
    "mini": {
        "data": {"n_authors": 20, "n_holdout_authors": 4, "n_real_authors": 5, "n_world_facts": 10, "n_probe": 30},
        "arch": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2, "vocab_size": 400},
        "base": {"steps": 20},
        "finetune": {"steps": 30},
    },
}
# key paths a mutation may set or delete (``[i]`` indexes a list)
PANEL_PATHS = [
    "name", "benchmark", "models", "models[0]", "tiers", "tiers[0]", "methods", "methods[0]", "seeds", "seeds[0]",
    "variants", "variants[0]", "attackers", "attackers[0]", "attackers[0].preset", "attackers[0].k",
    "attackers[0].k[0]", "attackers[0].set", "attackers[0].set.train.steps", "scale", "method_overrides",
    "method_overrides.NPO", "method_overrides.NPO.train.steps", "method_overrides.NPO.hparams.beta", "mc",
    "mc.kappa", "mc.kl_weight", "mc.train.lr", "mc.train.lora.r", "mc.token_weights", "data", "eval",
    "eval.batch_size", "eval.mmlu", "mini.arch.hidden_size", "mini.data.n_authors", "mini.max_length", "executor",
    "ray.cell_cpus", "dtype", "device", "out", "store", "extends",
]  # fmt: skip
MAPPINGS = ["", "mc", "mc.train", "eval", "mini", "mini.data", "ray", "attackers[0]", "method_overrides.NPO"]


def _walk(doc: Any, path: str) -> tuple[Any, Any] | None:
    """(container, key) of ``path`` in ``doc`` (the parents must exist), else None."""
    parts: list[Any] = []
    for part in path.split("."):
        name, _, index = part.partition("[")
        parts += [name] + ([int(index.rstrip("]"))] if index else [])
    node = doc
    for part in parts[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    ok = isinstance(node, dict) or isinstance(node, list) and isinstance(parts[-1], int) and parts[-1] < len(node)
    return (node, parts[-1]) if ok else None


@st.composite
def panel_document(draw) -> tuple[Any, bool]:
    """A panel document and whether it must be refused: the base panel under one to three mutations."""
    if draw(st.integers(0, 9)) == 0:  # a top level that is not a mapping
        return draw(st.one_of(st.lists(VALUE, max_size=3), SCALAR.filter(lambda v: v is not None))), True
    doc, invalid = copy.deepcopy(BASE_PANEL), False
    doc["mc"], doc["eval"] = {"train": {}}, {}
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "set", "delete", "unknown"]))
        if kind == "unknown":
            where = _walk(doc, draw(st.sampled_from(MAPPINGS)) + ".x") if draw(st.booleans()) else (doc, None)
            target = where[0] if where else None
            if isinstance(target, dict):
                key = draw(TEXT.filter(lambda k: k not in _FIELDS and k != "extends"))
                target[key] = draw(VALUE)
                invalid = True
            continue
        where = _walk(doc, draw(st.sampled_from(PANEL_PATHS)))
        if where is None:
            continue
        node, key = where
        if kind == "delete" and isinstance(node, dict):
            node.pop(key, None)
        elif isinstance(node, dict) or isinstance(node, list) and isinstance(key, int):
            node[key] = draw(VALUE)
    return doc, invalid


def _fields() -> set[str]:
    from margincal.config.settings import EvalSettings, MCConfig, TrainConfig
    from margincal.mini.models import MiniModelConfig
    from margincal.pipeline.panel import AttackerEntry, PanelConfig, RaySettings

    classes = (PanelConfig, MCConfig, TrainConfig, EvalSettings, MiniModelConfig, RaySettings, AttackerEntry)
    return {f.name for cls in classes for f in dataclasses.fields(cls)} | {"data", "arch", "base", "finetune"}


_FIELDS = _fields()


@st.composite
def overrides(draw) -> list[str]:
    """One to three ``key=value`` arguments: known or random keys, values dumped as YAML or raw text."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.one_of(st.sampled_from(PANEL_PATHS).map(lambda p: p.split("[")[0]), TEXT))
        value = draw(st.one_of(VALUE.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()), TEXT))
        out.append(f"{key}={value}")
    return out


QA_FIELDS = ["question", "answer", "paraphrased_answer", "perturbed_answer", "paraphrased_question"]


@st.composite
def qa_file(draw) -> tuple[bytes, bool]:
    """A TOFU-format file's bytes: JSON (a list of rows or one row per line) with mutated rows, or garbage."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64)), False
    if kind == 1:
        return draw(TEXT).encode(), False
    rows = [{"question": f"Who wrote book {i}?", "answer": f"Author {i}."} for i in range(3)]
    for _ in range(draw(st.integers(1, 3))):
        row = draw(st.sampled_from(rows))
        if draw(st.booleans()):
            row[draw(st.sampled_from(QA_FIELDS))] = draw(VALUE)
        else:
            row.pop(draw(st.sampled_from(QA_FIELDS)), None)
    doc = draw(st.sampled_from([rows, rows[0], {"data": rows}]))
    if isinstance(doc, list) and draw(st.booleans()):
        return "\n".join(json.dumps(r, allow_nan=True) for r in doc).encode(), False
    return json.dumps(doc, allow_nan=True).encode(), False


RECORD_PATHS = [
    "id", "status", "schema", "cell", "cell.seed", "cell.method", "cell.variant", "family", "m_ref", "models",
    "models.mc", "models.mc.summary", "models.mc.summary.delta", "models.mc.summary.model_utility",
    "models.baseline.summary.forget_Q_A_ROUGE", "models.mc.attacks", "models.mc.attacks.lora_r8@20",
    "models.mc.attacks.lora_r8@20.rouge_l", "models.baseline.attacks.lora_r8@20.diagnosis", "unlearn", "polish",
    "examples", "examples[0]", "examples[0].answers", "sources", "error",
]  # fmt: skip


@st.composite
def record(draw, base: dict) -> Any:
    """A cell record: a valid one under one to three mutations, or a list or a scalar."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.lists(VALUE, max_size=2), SCALAR))
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(RECORD_PATHS))
        where = _walk(doc, path)
        if where is None:
            continue
        node, key = where
        if draw(st.integers(0, 3)) == 0 and isinstance(node, dict):
            node.pop(key, None)
        else:
            node[key] = draw(VALUE)
    return doc


# names, nesting, non-finite numbers and counts (issue 38)

SEGMENT = st.sampled_from(["..", ".", "/", "\\", "a", "NPO", "~", "", " ", "\0", "é", "x" * 120, "-", "+", "@"])
NAMES = st.one_of(st.lists(SEGMENT, min_size=1, max_size=4).map("".join), TEXT)


def valid_name(name: str) -> bool:
    from margincal.core.artifacts import NAME

    return NAME.fullmatch(name) is not None


@st.composite
def nested_text(draw) -> tuple[str, bool]:
    """A YAML panel text that nests deep or repeats subtrees through aliases, and whether it crosses a bound (it must
    then be refused for that reason): nesting past 64 levels, or aliases expanding past 100 000 values. Depths stay
    clear of the bound itself (at most 50, or from 80 on)."""
    from margincal.core.inputs import MAX_YAML_NODES

    if draw(st.booleans()):
        depth = draw(st.one_of(st.integers(1, 50), st.integers(80, 20_000)))
        flow = draw(st.sampled_from(["[", "{a: "]))
        close = "]" if flow == "[" else "}"
        return f"extends: demo\nmc: {{set: {flow * depth}1{close * depth}}}\n", depth >= 80
    width, levels = draw(st.integers(2, 12)), draw(st.integers(1, 9))
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    size, total = 1 + width, 3  # l0's sequence; the root mapping and its extends pair
    for level in range(levels):
        size = size if level == 0 else 1 + width * size
        total += 1 + size  # the key l<level> and its value
    return "\n".join(["extends: demo", *lines]) + "\n", total > MAX_YAML_NODES


@st.composite
def deep_json(draw) -> tuple[str, bool]:
    """A QA file nesting arrays or objects ``depth`` deep, and whether that is past the bound of 64 (depths stay
    clear of it: at most 60, or from 70 on)."""
    depth = draw(st.one_of(st.integers(1, 60), st.integers(70, 200_000)))
    if draw(st.booleans()):
        return "[" * depth + "]" * depth, depth >= 70
    return '{"a": ' * depth + "1" + "}" * depth, depth >= 70


NON_FINITE = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])


@st.composite
def reference_file(draw) -> str:
    """θ_ref's evaluation result with a non-finite number at some key (always refused)."""
    value = draw(NON_FINITE)
    where = draw(st.sampled_from(["summary.m", "summary.mia_min_k_auc", "splits.forget.truth_ratios", "top"]))
    ratios = f"[0.5, {value}, 0.25]" if where == "splits.forget.truth_ratios" else "[0.5, 0.25]"
    m = value if where == "summary.m" else "0.1"
    auc = value if where == "summary.mia_min_k_auc" else "0.5"
    extra = f', "seconds": {value}' if where == "top" else ""
    return (f'{{"benchmark": "mini", "summary": {{"m": {m}, "mia_min_k_auc": {auc}}}, '
            f'"splits": {{"forget": {{"truth_ratios": {ratios}}}}}{extra}}}')  # fmt: skip


COUNTS = st.one_of(st.integers(0, 200), st.integers(10**3, 10**15))


@st.composite
def counts(draw) -> tuple[list[str], bool | None, int]:
    """Panel overrides setting one count that sizes the plan (steps, a K, the K list, the seeds), whether it is past
    its documented maximum (True: must be refused, at once; None: either), and the count (an audit's draws too)."""
    from margincal.config.typed import MAX_BUDGETS, MAX_SEEDS, MAX_STEPS

    n = draw(COUNTS)
    kind = draw(st.sampled_from(["steps", "k", "k_list", "seeds"]))
    if kind == "steps":
        return [f"mc.train.steps={n}"], (not 1 <= n <= MAX_STEPS) or None, n
    if kind == "k":  # the smoke mini's forget set is far below 1000 records: such a K is refused either way
        return [f"attackers=[{{preset: lora_r8, k: [{n}]}}]"], (n == 0 or n >= 1000) or None, n
    m = min(n, 10**5)
    if kind == "k_list":
        return [f"attackers=[{{preset: lora_r8, k: [{', '.join(['4'] * m)}]}}]"], (m > MAX_BUDGETS or m == 0) or None, n
    return [f"seeds=[{', '.join(str(i) for i in range(m))}]"], (m > MAX_SEEDS or m == 0) or None, n


# kinds of path, size caps and empty files (issue 59)

KINDS = {  # a kind of path where a file is expected → what the refusal must say
    "missing": "no such",
    "directory": "is a directory, not a file",
    "fifo": r"is a FIFO \(named pipe\), not a file",
    "link loop": "is a symbolic link loop",
    "dangling link": "is a symbolic link to .*, which does not exist",
    "device": "is a character device, not a file",
    "empty": "is empty",
    "blank": "is empty",
    "over the cap": "is larger than 1 MiB",
}
FILE_FLAGS = ["--forget", "--reference", "--claimed", "--models", "--attacker", "panel"]
CAPPED = ("--models", "--attacker", "panel")  # the text and YAML files, capped at 1 MiB (JSON files: 256 MiB)


def special_paths(root: Path) -> dict[str, Path]:
    """One path of every kind in :data:`KINDS` under ``root`` (outside the sandbox's working directory, so no walk of
    it opens a FIFO), each named like a YAML file so that a preset or panel name reads it as a file."""
    root.mkdir(parents=True, exist_ok=True)
    paths = {kind: root / f"{kind.replace(' ', '-')}.yaml" for kind in KINDS}
    paths["directory"].mkdir()
    os.mkfifo(paths["fifo"])
    paths["link loop"].symlink_to(paths["link loop"])
    paths["dangling link"].symlink_to(root / "nowhere")
    paths["device"] = Path("/dev/zero")
    paths["empty"].write_text("")
    paths["blank"].write_text("\n  \n")
    paths["over the cap"].write_text("# " + "x" * 2**20 + "\n")
    return paths


# ------------------------------------------------------------------------------------------- the property


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if "__pycache__" not in p.parts
    }


@dataclasses.dataclass
class Tally:
    generated: int = 0
    accepted: int = 0
    refused: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    strict: bool = True  # raise on the first failure (a test, which hypothesis then shrinks); else count them all


def run_cli(
    argv: list[str],
    box: Sandbox,
    tally: Tally,
    refuse: bool | None = None,
    writes: Path | None = None,
    check: Callable[[], list[str]] | None = None,
    expect: str | None = None,
    seconds: float | None = None,
) -> None:
    """Run ``margincal argv`` in ``box`` and check the property (``refuse``: True, the input must be refused;
    False, accepted; None, either; ``check``: further problems of an accepted run; ``expect``: a pattern a refusal's
    line must match; ``seconds``: the most the command may take); a violation is recorded in ``tally`` (and raised
    when it is strict)."""
    before, store = _tree(box.work), _tree(box.store)
    start = time.perf_counter()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), contextlib.chdir(box.work):
        try:
            rc = margincal(argv)
        except SystemExit as stop:
            rc = stop.code
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("         ")]  # log lines
    tally.generated += 1
    problems = []
    if rc == 0:
        tally.accepted += 1
        if refuse:
            problems.append("accepted an input built to be invalid")
        problems += check() if check else []
    elif rc == 2:
        tally.refused += 1
        if refuse is False:
            problems.append("refused an input it must accept")
        if len(lines) != 1 or not lines[0].startswith("margincal") or "error:" not in lines[0]:
            problems.append(f"stderr is not one error line: {text[-400:]!r}")
        elif expect is not None and not re.search(expect, lines[0]):
            problems.append(f"the refusal does not say why: {lines[0][:300]!r}")
    else:
        problems.append(f"exit status {rc}: {text[-400:]!r}")
    if seconds is not None and time.perf_counter() - start > seconds:
        problems.append(f"took {time.perf_counter() - start:.0f} s (at most {seconds:.0f} s)")
    if "Traceback" in text:
        problems.append(f"a traceback reached the user: {text[-600:]!r}")
    after = _tree(box.work)
    if rc != 0 or writes is None:
        if after != before:
            changed = sorted(set(after.items()) ^ set(before.items()))[:3]
            problems.append(f"the working directory changed: {changed}")
    else:  # an accepted command writes only its output
        kept = {k: v for k, v in before.items() if not k.startswith(str(writes.relative_to(box.work)))}
        if {k: v for k, v in after.items() if k in kept} != kept:
            problems.append("an input changed")
    if _tree(box.store) != store:
        problems.append("the store changed")
    if problems:
        tally.failures.append(f"{argv}: {'; '.join(problems)}")
        if tally.strict:
            raise AssertionError(tally.failures[-1])


def _reset(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def targets(box: Sandbox) -> dict[str, Callable[[int, int | None, Tally], None]]:
    """Per target: a function running ``n`` hypothesis examples (``seed``: derandomized runs) into a tally."""

    def fuzz(strategy, check) -> Callable[[int, int | None, Tally], None]:
        def go(n: int, seed: int | None, tally: Tally) -> None:
            options = dict(max_examples=n, deadline=None, database=None, derandomize=seed is None,
                           suppress_health_check=list(HealthCheck), print_blob=False)  # fmt: skip

            @settings(**options)
            @given(strategy)
            def run(example):
                check(example, tally)

            if seed is not None:
                from hypothesis import seed as with_seed

                run = with_seed(seed)(run)
            run()

        return go

    panel_file = box.work / "panel.yaml"

    def panel(example, tally):
        doc, invalid = example
        panel_file.write_text(yaml.safe_dump(doc, allow_unicode=True))
        run_cli(["panel", str(panel_file), "--dry-run", f"store={box.store}"], box, tally, invalid or None)

    base_file = box.work / "base.yaml"
    base_file.write_text(yaml.safe_dump(BASE_PANEL))

    def override(example, tally):
        run_cli(["panel", str(base_file), "--dry-run", f"store={box.store}", *example], box, tally)

    qa = box.work / "forget.json"

    def data(example, tally):
        content, invalid = example
        qa.write_bytes(content)
        argv = ["diagnose", "--model", str(box.work / "no-such-model"), "--forget", str(qa)]
        run_cli(argv, box, tally, invalid or None)

    cells = box.records / "cells"
    target = sorted(cells.glob("*.json"))[0]  # the record each example replaces (the others stay valid)
    original = target.read_text()
    out = box.work / "report-out"

    def records(example, tally):
        from margincal.reporting.records import check_record

        doc = example
        target.write_text(json.dumps(doc, allow_nan=True))
        try:
            check_record(doc, target.stem)
            valid = True
        except ValueError:
            valid = False

        def listed() -> list[str]:  # a record not of the schema is named as not read, and the report goes on
            report = (out / "report.md").read_text()
            named = "## Records not read" in report and f"| cells/{target.name} |" in report.split("not read")[-1]
            return [] if named or valid else ["a record not of the schema was not listed as not read"]

        _reset(out)
        try:
            run_cli(["report", str(box.records), "--out", str(out)], box, tally, False, writes=out, check=listed)
        finally:
            target.write_text(original)
            _reset(out)

    def names(example, tally):
        name = example
        run_cli(["panel", str(base_file), "--dry-run", f"store={box.store}",
                 f"variants=[{json.dumps({'name': name, 'preset': 'reference'})}]"], box, tally,
                None if valid_name(name) else True)  # fmt: skip
        run_cli(["audit", "--model", f"{name}={box.work / 'no-such-model'}", "--out", str(box.work / "card")], box,
                tally, True)  # fmt: skip

    def nesting(example, tally):
        (text, too_big), (deep, too_deep) = example
        panel_file.write_text(text)
        bound = "nested deeper than|expands to more than" if too_big else None
        argv = ["panel", str(panel_file), "--dry-run", f"store={box.store}"]
        run_cli(argv, box, tally, too_big or None, expect=bound)
        qa.write_text(deep)
        argv = ["diagnose", "--model", str(box.work / "no-such-model"), "--forget", str(qa)]
        run_cli(argv, box, tally, True, expect=r"nested \d+ deep" if too_deep else None)

    reference = box.work / "reference.json"

    def non_finite(example, tally):
        reference.write_text(example)
        argv = ["evaluate", "--model", str(box.work / "no-such-model"), "--benchmark", "mini", "--reference",
                str(reference)]  # fmt: skip
        run_cli(argv, box, tally, True, expect="not a finite number|non-finite number")

    def sizes(example, tally):
        from margincal.config.typed import MAX_DRAWS

        extra, too_many, n = example
        run_cli(["panel", str(base_file), "--dry-run", f"store={box.store}", *extra], box, tally, too_many,
                seconds=20)  # fmt: skip
        argv = ["audit", "--model", str(box.work / "no-such-model"), "--out", str(box.work / "card"), f"draws={n}"]
        run_cli(argv, box, tally, True, seconds=20, expect="draws must be" if not 1 <= n <= MAX_DRAWS else None)

    special = special_paths(box.work.parent / "special")
    nomodel = str(box.work / "no-such-model")

    def paths(example, tally):
        flag, kind = example
        if kind == "over the cap" and flag not in CAPPED:
            return
        path = str(special[kind])
        argv = {
            "--forget": ["diagnose", "--model", nomodel, "--forget", path],
            "--reference": ["evaluate", "--model", nomodel, "--benchmark", "mini", "--reference", path],
            "--claimed": ["audit", "--model", nomodel, "--out", str(box.work / "card"), "--claimed", path],
            "--models": ["audit", "--out", str(box.work / "card"), "--models", path],
            "--attacker": ["attack", "--model", nomodel, "--forget", path, "--attacker", path],
            "panel": ["panel", path, "--dry-run", f"store={box.store}"],
        }[flag]
        run_cli(argv, box, tally, True, expect=KINDS[kind], seconds=30)

    return {
        "paths": fuzz(st.tuples(st.sampled_from(FILE_FLAGS), st.sampled_from(list(KINDS))), paths),
        "names": fuzz(NAMES, names),
        "nesting": fuzz(st.tuples(nested_text(), deep_json()), nesting),
        "non-finite": fuzz(reference_file(), non_finite),
        "counts": fuzz(counts(), sizes),
        "panel files": fuzz(panel_document(), panel),
        "overrides": fuzz(overrides(), override),
        "data files": fuzz(qa_file(), data),
        "cell records": fuzz(record(json.loads(original)), records),
    }


def sandbox(root: Path, records_from: Path) -> Sandbox:
    """The fuzz sandbox under ``root``: an empty store and a results directory holding the cell records
    ``records_from`` (valid records of one panel)."""
    from margincal.core.artifacts import own

    work, store = root / "work", root / "store"
    results = work / "results"
    (results / "cells").mkdir(parents=True)
    for path in records_from:
        shutil.copy(path, results / "cells" / path.name)
    own(results, ["cells"])
    store.mkdir()
    return Sandbox(work, store, work / "data", results)


RECORDS = Path(__file__).resolve().parents[1] / "results/mini/head2head/cells"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500, help="examples per target (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    parser.add_argument("--targets", nargs="+", metavar="NAME", help="fuzz only these targets (default: all)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(Path(tmp) / ".hypothesis")  # its caches (unicode tables), not in the user's folder
        try:
            box = sandbox(Path(tmp), sorted(RECORDS.glob("*.json"))[:4])
            total = Tally()
            chosen = targets(box)
            unknown = set(args.targets or ()) - set(chosen)
            if unknown:
                parser.error(f"unknown targets {sorted(unknown)}; known: {', '.join(chosen)}")
            for name, go in chosen.items():
                if args.targets and name not in args.targets:
                    continue
                tally = Tally(strict=False)
                go(args.examples, args.seed, tally)
                counts = f"accepted {tally.accepted:>5}  refused {tally.refused:>5}  failed {len(tally.failures)}"
                print(f"{name:<14} generated {tally.generated:>5}  {counts}", flush=True)
                for failure in tally.failures:
                    print(f"    {failure}")
                total.generated += tally.generated
                total.failures += tally.failures
            print(f"total: {total.generated} inputs generated, {len(total.failures)} failed the property")
        finally:
            set_hypothesis_home_dir(None)


if __name__ == "__main__":
    main()
