"""The core path runs without the optional packages (lm-eval, ray, submitit, datasets; bitsandbytes and rouge-score
where a machine lacks them, as the lent GPU machine does): each is imported where a feature first needs it, and a
missing one stops with one line naming the feature and the install command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from margincal.core.errors import MissingPackageError, require

HIDDEN = ("lm_eval", "ray", "submitit", "datasets", "tensorboard")


def test_a_missing_package_is_one_line_naming_the_feature(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(MissingPackageError, match=r"^the Ray executor needs the package ray, which is not install"):
        require("ray", "the Ray executor", "pip install ray")
    assert require("json", "x", "y").dumps([1]) == "[1]"


@pytest.mark.parametrize(
    ("module", "call", "message"),
    [
        ("rouge_score", lambda: __import__("margincal.evaluation.metrics").evaluation.metrics._scorer(), "ROUGE-L"),
        (
            "lm_eval",
            lambda: __import__("margincal.evaluation.mmlu").evaluation.mmlu.lm_eval_accuracy(None, None, ["mmlu"]),
            "MMLU",
        ),
    ],
)
def test_features_name_their_missing_package(module, call, message, monkeypatch):
    from margincal.evaluation import metrics

    metrics._scorer.cache_clear()
    for name in [m for m in sys.modules if m == module or m.startswith(f"{module}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    try:
        with pytest.raises(MissingPackageError, match=f"{message}.* needs the package {module}"):
            call()
    finally:
        metrics._scorer.cache_clear()


@pytest.mark.parametrize(
    ("executor", "module", "message"),
    [("ray", "ray", "the Ray executor (executor: ray)"), ("slurm", "submitit", "the SLURM executor (executor: slurm)")],
)
def test_an_executor_without_its_package_stops_before_any_cell(
    executor, module, message, monkeypatch, capsys, tmp_path
):
    from margincal.cli import main

    monkeypatch.setitem(sys.modules, module, None)
    overrides = [f"executor={executor}", "slurm.backend=local", f"store={tmp_path}", f"out={tmp_path / 'out'}"]
    assert main(["panel", "demo", "--dry-run", *overrides]) == 2
    err = capsys.readouterr().err
    assert f"{message} needs the package {module}" in err and len(err.strip().splitlines()) == 1
    assert f"pip install 'margincal[{executor}]'" in err


def test_the_core_path_imports_and_runs_without_the_optional_packages():
    """A fresh interpreter where lm-eval, ray, submitit and datasets cannot be imported: every margincal module
    imports and `margincal methods` runs."""
    code = (
        "import sys, pkgutil, importlib\n"
        f"for name in {HIDDEN!r}: sys.modules[name] = None\n"
        "import margincal\n"
        "for m in pkgutil.walk_packages(margincal.__path__, 'margincal.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "from margincal.cli import main\n"
        "sys.exit(main(['methods']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GradDiff" in done.stdout


def test_an_installed_optional_package_says_nothing_at_import():
    """bitsandbytes imported after the CLI set up its terminal prints nothing: on a CPU with AVX512-BF16 (the AMD
    EPYC machines) it warns at import that the optional ``kernels`` package is missing, a line no user can act on."""
    pytest.importorskip("bitsandbytes")
    code = "from margincal.core.terminal import quiet_libraries; quiet_libraries(); import bitsandbytes, peft"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "" and done.stderr == ""
