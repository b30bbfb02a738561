"""The stage functions every entry point runs, and the bugs the single pipeline fixed (each test fails on the
pre-refactor code paths: PDU's λ reset, stale store keys, swallowed tracebacks, zlib on the raw string)."""

import dataclasses
import functools

import pytest
import torch

from margincal.config.settings import LoraSpec, MCConfig, TrainConfig, resolve_method
from margincal.core.artifacts import code_modules, code_tree, code_version
from margincal.methods.base import get_method
from margincal.model.loading import clone_model
from margincal.pipeline.graph import STAGE_KINDS, stage_version
from margincal.pipeline.stages import polish_stage, unlearn_stage
from tests.conftest import make_workspace


def test_pdu_polish_continues_the_unlearning_runs_dual_variable(tiny_model, tiny_tokenizer):
    ws = make_workspace(tiny_model, tiny_tokenizer)
    overrides = ["train.steps=3", "train.batch_size=2", "retain_batch_size=2", "hparams.dual_warmup_steps=0"]
    run = resolve_method("PDU", "mini", overrides=[*overrides, "hparams.retain_eps=0.0"])
    model, result = unlearn_stage(run, ws, seed=0)
    dual = result.method_state["dual"]
    alpha = get_method(run.name, **run.hparams).alpha
    assert result.method_state["steps_seen"] == 3 and dual != alpha  # λ moved during unlearning
    mc = MCConfig(kl_weight=0.0, train=TrainConfig(steps=1, batch_size=1, lr=1e-4, lora=LoraSpec(r=2, alpha=2)))
    _, polished = polish_stage(clone_model(model), run, mc, ws, None, result.method_state)
    assert polished.history[0]["dual"] == pytest.approx(dual)  # the polish's first step uses the carried λ
    _, fresh = polish_stage(clone_model(model), run, mc, ws, None)
    assert fresh.history[0]["dual"] == alpha  # what cells and `margincal polish` did before


def test_code_version_ignores_comments_and_docstrings_not_code():
    a = code_tree('def f(x):\n    """Doc."""\n    return x + 1  # note\n')[0]
    b = code_tree("def f(x):\n\n    return x + 1\n")[0]
    c = code_tree("def f(x):\n    return x + 2\n")[0]
    assert a == b != c
    assert code_version("margincal.training.unlearning") != code_version("margincal.mc.polish")
    assert len({stage_version(s) for s in ("unlearn", "polish", "evaluate", "attack")}) == 4


def test_no_stage_code_version_reads_the_result_types_or_the_report():
    """A stage's code version covers the code it runs: the margin diagnosis (``result_base``) but not the other
    typed results, the audit card's entries or the report, so a change to those leaves every stored stage valid."""
    for stage, kind in STAGE_KINDS.items():
        read = set(code_modules(*kind.modules))
        assert "margincal.results.base" in read, stage  # the margin diagnosis every evaluator returns
        assert not read & {"margincal.results.outputs", "margincal.results.cards", "margincal.api"}, stage
        assert not [m for m in read if m.startswith(("margincal.reporting.", "margincal.auditing."))], stage


def test_a_metric_module_change_moves_the_key_of_every_stage_reading_the_metric_table(monkeypatch):
    """Each metric table row's function is registered where it is defined (no string import), and each of those
    modules is in the code version of every stage that reads the table: one changed line in any of them gives every
    such stage a new version, so a new store key."""
    from margincal.core import artifacts
    from margincal.evaluation.evaluators import EVALUATORS
    from margincal.results import metric_table as T

    defining = {T.VALUES[row.value].__module__ for rows in T.TABLES.values() for row in rows}
    assert defining == {
        f"margincal.{m}" for m in ("results.metric_table", "evaluation.metrics", "evaluation.mia", "model.margin")
    } | {"margincal.evaluation.tofu", "margincal.evaluation.wmdp"}
    for kind, rows in T.TABLES.items():  # an evaluator imports every module its rows' functions are defined in
        assert {T.VALUES[row.value].__module__ for row in rows} <= set(code_modules(EVALUATORS[kind].__module__))
    reading = [s for s, k in STAGE_KINDS.items() if "margincal.results.metric_table" in code_modules(*k.modules)]
    assert reading == ["evaluate", "margin", "unlearn", "polish", "attack", "quantize"]
    before = {stage: stage_version(stage) for stage in reading}
    source = artifacts._module_source
    monkeypatch.setattr(artifacts, "code_tree", functools.cache(artifacts.code_tree))  # each module parsed once
    for module in sorted(defining):
        new = {module: source(module) + "\nCHANGED = 1\n"}
        monkeypatch.setattr(artifacts, "_module_source", lambda name, new=new: new.get(name) or source(name))
        code_modules.cache_clear(), code_version.cache_clear(), stage_version.cache_clear()
        assert all(stage_version(stage) != before[stage] for stage in reading), module
    monkeypatch.undo()  # as before: the same versions
    code_modules.cache_clear(), code_version.cache_clear(), stage_version.cache_clear()
    assert {stage: stage_version(stage) for stage in reading} == before


def test_store_keys_follow_the_code_version_and_the_resolved_spec(monkeypatch):
    from margincal.pipeline import graph
    from margincal.pipeline.panel import expand_cells, load_panel
    from margincal.pipeline.plan import plan_cell

    cfg = load_panel("demo", ["methods=[NPO]"])
    cell = expand_cells(cfg)[0]
    plan = plan_cell(cfg, cell)
    keys = plan.graph.keys()
    unlearn = plan.graph.node("baseline/unlearn")
    assert "provenance" not in str(unlearn.config)  # YAML comments/provenance never enter a key
    assert unlearn.config["run"]["train"]["steps"] == unlearn.steps == 60  # the resolved schedule, not raw YAML
    monkeypatch.setattr(graph, "stage_version", lambda stage: "changed" if stage == "unlearn" else "same")
    changed = plan_cell(cfg, cell).graph.keys()
    assert changed["baseline/unlearn"] != keys["baseline/unlearn"]  # a change to the unlearning code
    assert changed["mc/polish"] != keys["mc/polish"]  # ... and everything downstream of it
    monkeypatch.setattr(graph, "stage_version", lambda stage: "same")
    assert plan_cell(cfg, cell).graph.keys()["reference/evaluate"] == changed["reference/evaluate"]


def test_zlib_compresses_the_decoded_answer_tokens(tiny_tokenizer):
    from margincal.data.records import QARecord, encode_qa
    from margincal.evaluation.mia import answer_texts

    records = [QARecord("Where was Ann Bel born?", "Ann  Bel was born in Port Ivo.")]  # two spaces: not round-tripped
    examples = encode_qa(tiny_tokenizer, records, 64)
    text = answer_texts(tiny_tokenizer, examples)[0]
    assert text == tiny_tokenizer.decode(examples[0].answer_ids, skip_special_tokens=True) != records[0].answer


def test_cli_internal_error_is_one_line_and_a_log(monkeypatch, capsys, tmp_path):
    """An unexpected error (a bug, the machine out of memory) exits 1 with one line naming a log file that holds the
    traceback."""
    from margincal import cli

    def boom(args):
        raise RuntimeError("CUDA out of memory")

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), boom))
    monkeypatch.setenv("MARGINCAL_LOGS", str(tmp_path))
    assert cli.main(["methods"]) == 1
    err = capsys.readouterr().err
    (log,) = tmp_path.iterdir()
    assert err == f"margincal methods: internal error: RuntimeError: CUDA out of memory (traceback: {log})\n"
    assert "Traceback (most recent call last)" in log.read_text() and "in boom" in log.read_text()


def _with_func(parser, func):
    parser.set_defaults(func=func)
    sub = next(a for a in parser._actions if a.dest == "command")
    sub.choices["methods"].set_defaults(func=func)
    return parser


def test_gradient_accumulation_averages_micro_batch_losses():
    from margincal.training.loop import train

    def objective(model, batch):
        loss = ((model(batch) - 1.0) ** 2).mean()
        return loss, {"l": loss.item()}

    data = torch.arange(8, dtype=torch.float).reshape(4, 2)
    results = []
    for accum, stream in ((1, iter([data] * 5)), (2, iter([data[:2], data[2:]] * 5))):
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        cfg = TrainConfig(steps=3, batch_size=4 // accum, grad_accum=accum, lr=0.01, scheduler="constant")
        trained, result = train(model, objective, stream, cfg)
        results.append((trained.weight.detach().clone(), result.history[0]["loss"]))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-6)  # equal halves: the same update
    assert results[0][1] == pytest.approx(results[1][1])


def test_workspace_needs_the_reference_it_is_asked_for(tiny_model, tiny_tokenizer):
    ws = make_workspace(tiny_model, tiny_tokenizer)
    ws = dataclasses.replace(ws, models={"theta0": "x"}, _frozen={})
    with pytest.raises(ValueError, match="θ_ref"):
        ws.frozen("ref")


def test_a_new_stage_kind_is_one_registration(tmp_path, monkeypatch):
    """A stage kind declared by one registration (its runner, stage function and modules) is planned, keyed by its
    own code version and run through the store like the shipped kinds."""
    import json

    from margincal.config.settings import EvalSettings
    from margincal.core.registry import Registry
    from margincal.data.records import collate
    from margincal.pipeline import graph
    from margincal.store.stage_store import Store

    with pytest.raises(ValueError, match="registered after the stage kinds were frozen"):
        graph.stage_kind("count", collate, ())(lambda run, node, tmp: {})
    monkeypatch.setattr(graph, "STAGE_KINDS", Registry("stage kind", "stage kinds", entries=graph.STAGE_KINDS))

    @graph.stage_kind("count", collate, ("margincal.data.records",))
    def _count(run, node, tmp):
        (tmp / "count.json").write_text(json.dumps(node.config["n"]))
        return {"n": node.config["n"]}

    builder = graph.GraphBuilder(EvalSettings(), {"data": "none"}, "float32")
    key = builder.add("model/count", "count", "model", None, {"n": 3})
    run = graph.run_graph(builder.graph({"model": graph.ModelSource(path="unused")}), None, Store(tmp_path))
    assert json.loads((run.paths["model/count"] / "count.json").read_text()) == 3
    assert run.paths["model/count"].name == key and Store(tmp_path).done("count", key)
    assert graph.stage_version("count") not in {graph.stage_version(kind) for kind in ("evaluate", "attack")}
    with pytest.raises(ValueError, match="registered twice"):
        graph.stage_kind("count", collate, ())(_count)
