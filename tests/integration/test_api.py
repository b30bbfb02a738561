"""margincal as a library: ``import margincal`` is light, its functions take a model in memory as well as a path,
their typed results save and load as the CLI's files, and settings come as dataclasses, mappings or overrides."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

import margincal
from margincal.config.settings import EvalSettings, MCConfig
from margincal.core.errors import InputError


def test_import_margincal_is_light_and_its_functions_are_the_apis():
    code = (
        "import sys, margincal\n"
        "light = 'torch' not in sys.modules and 'margincal.api' not in sys.modules\n"
        "api = margincal.api\n"
        "print(light, margincal.evaluate is api.evaluate, sorted(dir(margincal)) == sorted(margincal.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True", "True", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        margincal.nope  # noqa: B018


def test_the_package_root_exposes_every_name_of_the_api_and_its_page():
    """The root's name list is margincal.api.__all__ (in order), every name resolves, and the Python API page
    documents exactly these names (its ``::: margincal.api.<name>`` entries), ``InputError`` included."""
    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    documented = re.findall(r"^::: margincal\.api\.(\w+)$", page, flags=re.M)
    assert list(margincal.PUBLIC) == margincal.api.__all__
    assert sorted(documented) == sorted(margincal.api.__all__)
    assert all(getattr(margincal, name) is getattr(margincal.api, name) for name in margincal.PUBLIC)
    assert margincal.InputError is InputError


def test_a_model_in_memory_gets_the_numbers_its_directory_gets(smoke_mini, tmp_path):
    """θ0 and θ_ref loaded by the caller (transformers objects) are diagnosed and evaluated as their directories are:
    the same m, Δ, margins and summary; the forget split given as TOFU rows; the caller's tokenizer left unchanged."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths, data = smoke_mini.paths, smoke_mini.data
    model = AutoModelForCausalLM.from_pretrained(paths.theta0)
    ref = AutoModelForCausalLM.from_pretrained(paths.ref)
    tokenizer = AutoTokenizer.from_pretrained(paths.theta0)
    before = (tokenizer.pad_token, hasattr(tokenizer, "margincal_template"))
    rows = json.loads((data / "forget10.json").read_text())

    held = margincal.diagnose(model, rows, ref=ref, tokenizer=tokenizer, retain=data / "retain90.json")
    stored = margincal.diagnose(str(paths.theta0), data / "forget10.json", ref=str(paths.ref))
    assert held.model.startswith("in-memory LlamaForCausalLM") and held.forget == f"{len(rows)} records given"
    assert (held.m, held.m_ref, held.delta, held.certified) == (stored.m, stored.m_ref, stored.delta, stored.certified)
    assert held.diagnostic_margins == stored.diagnostic_margins and held.overlap_epsilon is not None
    assert (tokenizer.pad_token, hasattr(tokenizer, "margincal_template")) == before

    settings = {"gradnorm": False}  # a mapping of EvalSettings' fields
    in_memory = margincal.evaluate(model, tokenizer=tokenizer, benchmark="mini", data=data, settings=settings)
    on_disk = margincal.evaluate(str(paths.theta0), benchmark="mini", data=data, settings=["gradnorm=false"])
    assert in_memory.summary == on_disk.summary and not in_memory.cached and not on_disk.cached
    path = on_disk.save(tmp_path / "theta0.json")
    assert margincal.load(path) == on_disk

    # training stages on models in memory leave them as they were: unlearn copies θ0, polish copies θ̂
    def weights(m):
        return {k: v.clone() for k, v in m.state_dict().items()}

    def same(a, b):
        return a.keys() == b.keys() and all(__import__("torch").equal(a[k], b[k]) for k in a)

    before = weights(model)
    retain, probe = data / "retain90.json", data / "probe.json"
    u = margincal.unlearn(model, "GradDiff", rows, retain=retain, tokenizer=tokenizer, scale="mini",
                          overrides=["train.steps=2"])  # fmt: skip
    unlearned = weights(u.model)
    mc = MCConfig(kappa=2.0, kl_weight=0.5)  # taken whole, the keyword and the override on top
    p = margincal.polish(u, rows, retain=retain, probe=probe, theta0=model, ref=ref, tokenizer=tokenizer,
                         scale="mini", mc=mc, kl_weight=0.25, overrides=["train.steps=2"])  # fmt: skip
    assert same(weights(model), before) and same(weights(u.model), unlearned) and not same(unlearned, before)
    assert (u.steps, p.method, p.out, u.to_dict()["method"]) == (2, "GradDiff", None, "GradDiff")
    assert (p.mc["kappa"], p.mc["kl_weight"], p.mc["train"]["steps"], p.steps) == (2.0, 0.25, 2, 2)
    assert "model" not in u.to_dict() and margincal.load(u.save(tmp_path / "u.json")) == u  # the model not compared

    # one path: the same stages on the saved directories give the same run, weights and attack, read from the store
    # the second time; a call on a model in memory leaves no store of its own behind
    on_disk = margincal.unlearn(str(paths.theta0), "GradDiff", data / "forget10.json", retain=retain, scale="mini",
                                overrides=["train.steps=2"])  # fmt: skip
    assert on_disk.history == u.history and on_disk.model is None and same(weights(u.model), unlearned)
    from transformers import AutoModelForCausalLM as Auto

    assert same(weights(Auto.from_pretrained(Path(on_disk.out) / "model")), unlearned)
    attacks = [margincal.attack(m, rows, k=2, ref=r, tokenizer=tokenizer, scale="mini", overrides=["train.steps=1"])
               for m, r in ((u.model, ref), (on_disk.out, str(paths.ref)), (on_disk.out, str(paths.ref)))]  # fmt: skip
    assert attacks[0].results == attacks[1].results == attacks[2].results and attacks[0].m_ref == attacks[1].m_ref
    assert [a.cached for a in attacks] == [False, False, True]
    assert not (Path(os.environ["MARGINCAL_STORE"]) / "held").exists()


def test_inputs_are_refused_with_one_line_before_any_model_is_read(smoke_mini, tmp_path):
    paths, data = smoke_mini.paths, smoke_mini.data
    model = str(paths.theta0)
    linear = __import__("torch").nn.Linear(1, 1)
    with pytest.raises(InputError, match="must be a transformers model \\(with a config\\), not Linear"):
        margincal.diagnose(linear, data / "forget10.json")
    linear.config = None
    with pytest.raises(InputError, match="a model in memory needs its tokenizer in memory too"):
        margincal.diagnose(linear, data / "forget10.json")
    with pytest.raises(InputError, match="^diagnose: forget must be a TOFU-format .* not \\[1, 2\\] \\(a list\\)$"):
        margincal.diagnose(model, [1, 2])
    with pytest.raises(InputError, match="^evaluate: settings must be EvalSettings or .* not 3 \\(an int\\)$"):
        margincal.evaluate(model, benchmark="mini", data=data, settings=3)
    with pytest.raises(InputError, match="batch_size"):
        margincal.evaluate(model, benchmark="mini", data=data, settings={"batch_size": 0})
    (tmp_path / "old.json").write_text(json.dumps({"benchmark": "mini", "summary": {}}))
    with pytest.raises(InputError, match="names no result kind"):
        margincal.evaluate(model, benchmark="mini", data=data, reference=tmp_path / "old.json")
    assert EvalSettings() == margincal.api.common.settings_of(EvalSettings, None, "settings")
    splits = {"retain": data / "retain90.json", "probe": data / "probe.json", "method": "GradDiff", "scale": "mini"}
    with pytest.raises(InputError, match="^mc: an MCConfig is taken whole; give variant='controlled'"):
        margincal.polish(model, data / "forget10.json", **splits, variant="controlled", mc=MCConfig())
    with pytest.raises(InputError, match="kappa"):
        margincal.polish(model, data / "forget10.json", **splits, mc={"kappa": -1.0})
    with pytest.raises(InputError, match="^give theta0 \\(--theta0\\), the model before unlearning: the 'deployment'"):
        margincal.polish(model, data / "forget10.json", **splits, variant="deployment")
    with pytest.raises(InputError, match="^polish: kappa must be"):
        margincal.polish(model, data / "forget10.json", **splits, kappa="2")


def test_mc_settings_come_as_a_config_a_mapping_keywords_and_overrides_later_ones_winning():
    from margincal.api.training import _mc_given
    from margincal.config.settings import resolve_mc

    def resolved(variant="reference", mc=None, kappa=None, kl_weight=None, overrides=()):
        return resolve_mc(variant, "mini", overrides=overrides, given=_mc_given(mc, variant, kappa, kl_weight))

    base = resolved()
    assert resolved(mc=MCConfig(kappa=2.0)) == MCConfig(kappa=2.0)  # whole: the shipped mini settings do not apply
    assert resolved(mc={"kappa": 2.0}) == dataclasses.replace(base, kappa=2.0)
    assert resolved(kappa=2.0) == resolved(overrides=["kappa=2"]) == dataclasses.replace(base, kappa=2.0)
    assert resolved(mc={"kappa": 3.0, "train": {"steps": 7}}, kappa=2.0).kappa == 2.0
    assert resolved(mc={"train": {"steps": 7}}).train == dataclasses.replace(base.train, steps=7)
    assert resolved(mc={"kappa": 3.0}, overrides=["kappa=4"]).kappa == 4.0
    controlled = resolved("controlled", mc={"kappa": 2.0})
    assert controlled.control is not None and controlled.kappa == 2.0


EXAMPLE = ROOT / "examples" / "api_quickstart.py"


def smoke_export(smoke_mini, data: Path) -> Path:
    """The smoke mini's split files in ``data`` with the ``mini.json`` a mini export writes beside them."""
    from margincal.results.outputs import MiniExport

    shutil.copytree(smoke_mini.data, data)
    splits = sorted(p.stem for p in data.glob("*.json"))
    paths = smoke_mini.paths
    MiniExport(str(data), str(paths.theta0), str(paths.ref), "forget10", "retain90", splits).save(data / "mini.json")
    return data


def test_the_quickstart_runs_from_python_on_a_model_in_memory(smoke_mini, tmp_path, monkeypatch, capsys):
    """examples/api_quickstart.py at smoke size on the smoke mini's export (run in this process, as a notebook
    would): unlearn, diagnose, polish, attack and audit; its card is the typed result of the model it saved."""
    data = smoke_export(smoke_mini, tmp_path / "mini")
    monkeypatch.setenv("MARGINCAL_STORE", str(tmp_path / "store"))
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--data", str(data), "--out", str(tmp_path / "out"), "--smoke"])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["NPO", "NPO+MC", "attack", "audit"]
    card = margincal.load(tmp_path / "out" / "audit")
    assert isinstance(card, margincal.AuditCard) and list(card.checkpoints) == ["NPO+MC"]
    assert f"Δ {card.delta('NPO+MC'):+.3f}" in lines[3]
    assert (tmp_path / "out" / "npo_mc" / "model").is_dir()


RUN_IN_ORDER = ("load", "diagnose", "evaluate", "unlearn", "polish", "attack", "anchors", "audit", "report")
NOT_RUN = ("mini_export", "run_panel", "population")  # their examples say why; other tests run them


def _example(function) -> str:
    """The code of the ``Example...::`` block of ``function``'s docstring."""
    doc = inspect.getdoc(function)
    head = re.search(r"^Example[^\n]*::\n\n", doc, re.M)
    assert head, f"{function.__name__} has no example"
    block = doc[head.end() :].split("\n\n")[0]
    return textwrap.dedent(block)


def test_every_public_function_has_an_example_and_the_examples_run(smoke_mini, tmp_path, monkeypatch):
    """Each public function's docstring example, run in order in one namespace on the smoke mini (``mini``, a
    scratch ``tmp``, the working directory the repository's root); the three not run say so in their heading."""
    from margincal import api

    functions = [name for name in api.__all__ if name[0].islower()]
    assert sorted(functions) == sorted(RUN_IN_ORDER + NOT_RUN)
    for name in NOT_RUN:
        assert "not run by the tests" in inspect.getdoc(getattr(api, name)).split("Example", 1)[1].splitlines()[0]
    data = smoke_export(smoke_mini, tmp_path / "mini")
    monkeypatch.setenv("MARGINCAL_STORE", str(tmp_path / "store"))
    monkeypatch.chdir(ROOT)
    namespace = {"margincal": margincal, "mini": margincal.load(data / "mini.json"), "tmp": str(tmp_path)}
    for name in RUN_IN_ORDER:
        exec(compile(_example(getattr(api, name)), f"<example of {name}>", "exec"), namespace)  # noqa: S102
    assert namespace["a"].rouge_l(4) >= 0 and Path(namespace["p"].out, "model").is_dir()
    assert namespace["card"].headline == "lora_r8@4"
    # the directories unlearn and polish wrote load back as their results (the model stays on disk)
    for result in (namespace["u"], namespace["p"]):
        loaded = margincal.load(result.out)
        assert loaded == result and loaded.model is None and type(loaded) is type(result)
