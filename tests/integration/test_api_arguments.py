"""Issue 74: every public function's arguments are checked by name before any model is read (one ``InputError``
line naming the function, the argument, what it must be and what it got), and a model meets only its own tokenizer.

Each bad call names a model that does not exist (``never-read``): had the function read anything before refusing,
it would stop on the missing path instead of with the line expected, and nothing is written."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch

import margincal
from margincal.config.typed import brief
from margincal.core.errors import InputError
from margincal.mini.models import train_mini_tokenizer

NEVER = "never-read"
MODEL_KINDS = "a checkpoint directory, a hub id \\(a string\\) or a transformers model in memory"
RECORD_KINDS = "a TOFU-format file or a list of QARecord or of TOFU rows \\(dicts\\)"

BAD_CALLS = [
    (
        "unlearn",
        (NEVER, "NPO", "f.json"),
        {"retain": "r.json", "overrides": "train.steps=1"},
        "unlearn: overrides must be a list of strings, not 'train.steps=1' \\(a str\\)",
    ),
    ("unlearn", (None, "NPO", "f.json"), {"retain": "r.json"}, f"unlearn: model must be {MODEL_KINDS}, not None"),
    ("diagnose", (42, "f.json"), {}, f"diagnose: model must be {MODEL_KINDS}, not 42 \\(an int\\)"),
    ("unlearn", (NEVER, "NPO", "f.json"), {"retain": None}, f"unlearn: retain must be {RECORD_KINDS}, not None"),
    (
        "unlearn",
        (NEVER, "NPO", "f.json"),
        {"retain": "r.json", "seed": "zero"},
        "unlearn: seed must be an integer, not 'zero' \\(a str\\)",
    ),
    (
        "attack",
        (NEVER, "f.json"),
        {"k": math.nan},
        "attack: k must be an integer or a list of integers or None, not nan \\(a float\\)",
    ),
    (
        "attack",
        (NEVER, "f.json"),
        {"k": True},
        "attack: k must be an integer or a list of integers or None, not True \\(a bool\\)",
    ),
    (
        "diagnose",
        (NEVER, "f.json"),
        {"batch_size": 2.5},
        "diagnose: batch_size must be an integer or None, not 2.5 \\(a float\\)",
    ),
    ("diagnose", (NEVER, "f.json"), {"device": None}, "diagnose: device must be a string, not None"),
    ("diagnose", (NEVER, "f.json"), {"reff": NEVER}, "diagnose: no argument 'reff' \\(did you mean ref\\?\\)"),
    ("diagnose", (NEVER,), {}, "diagnose: forget is required"),
    (
        "evaluate",
        (NEVER,),
        {"overwrite": True},
        "evaluate: no argument 'overwrite'; it takes model, tokenizer, benchmark, data, tier, reference",
    ),
    ("polish", (NEVER, "f.json"), {"retain": "r.json", "probe": None}, f"polish: probe must be {RECORD_KINDS}"),
    ("audit", (42,), {"out": "o"}, "audit: models must be a checkpoint .* or a list of them or a mapping of names"),
    ("audit", (), {"out": "o", "overwrite": "yes"}, "audit: overwrite must be True or False, not 'yes' \\(a str\\)"),
    ("run_panel", ("demo",), {"overrides": "seeds=\\[0\\]"}, "run_panel: overrides must be a list of strings"),
    ("mini_export", (None,), {}, "mini_export: directory must be a string or a Path, not None"),
    ("load", (None,), {}, "load: path must be a string or a Path, not None"),
    ("population", ("a.json",), {"out": "o"}, "population: audits must be a list of paths, not 'a.json' \\(a str\\)"),
]


@pytest.mark.parametrize(("function", "args", "kwargs", "expected"), BAD_CALLS, ids=[c[-1][:48] for c in BAD_CALLS])
def test_a_bad_argument_is_refused_by_name_before_anything_is_read(function, args, kwargs, expected, tmp_path):
    kwargs = {k: v.replace("\\", "") if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(InputError, match=f"^{expected}"):
        getattr(margincal.api, function)(*args, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_passed_as_the_model_is_named_by_its_type_alone(tiny_tokenizer):
    with pytest.raises(InputError) as caught:
        margincal.diagnose(tiny_tokenizer, "f.json")
    assert str(caught.value) == (
        "diagnose: model must be a checkpoint directory, a hub id (a string) or a transformers model in memory, "
        f"not a {type(tiny_tokenizer).__name__}"
    )


def _in_memory(smoke_mini):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(smoke_mini.paths.theta0)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_a_tokenizer_of_another_vocabulary_is_refused_with_a_model_in_memory(smoke_mini):
    """The silent wrong answer of issue 74: a 300-token tokenizer with the mini θ0 in memory flipped the verdict."""
    model, own = _in_memory(smoke_mini)
    questions = [r["question"] for r in json.loads((smoke_mini.data / "forget10.json").read_text())]
    other = train_mini_tokenizer(questions, 300)
    forget = smoke_mini.data / "forget10.json"
    rows = model.config.vocab_size
    with pytest.raises(InputError) as caught:
        margincal.diagnose(model, forget, tokenizer=other)
    assert re.fullmatch(
        f"the tokenizer given for in-memory LlamaForCausalLM [0-9a-f]+ has {len(other)} tokens, but the model's "
        f"embedding has {rows} rows: this tokenizer is not the model's; pass the tokenizer saved with the model",
        str(caught.value),
    )
    with pytest.raises(InputError, match="this tokenizer is not the model's"):
        margincal.unlearn(model, "NPO", forget, retain=smoke_mini.data / "retain90.json", tokenizer=other)
    assert margincal.diagnose(model, forget, tokenizer=own).n > 0  # its own tokenizer is taken


def test_a_reference_saved_with_another_tokenizer_is_refused_before_it_is_scored(smoke_mini, tmp_path, monkeypatch):
    """θ_ref's saved tokenizer maps two tokens to each other's ids (same size, other vocabulary): refused naming it,
    and θ_ref is never scored."""
    ref = tmp_path / "ref"
    shutil.copytree(smoke_mini.paths.ref, ref)
    spec = json.loads((ref / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (ref / "tokenizer.json").write_text(json.dumps(spec))
    import margincal.api.evaluation as evaluation

    monkeypatch.setattr(evaluation, "evaluate_stage", lambda *a, **k: pytest.fail("a model was scored"))
    with pytest.raises(InputError) as caught:
        margincal.diagnose(str(smoke_mini.paths.theta0), smoke_mini.data / "forget10.json", ref=str(ref))
    assert str(caught.value) == (
        f"{ref} was saved with another tokenizer than the one this run encodes with (their vocabularies differ): "
        "give models that share one tokenizer"
    )


def test_models_of_two_vocabulary_sizes_and_a_model_never_loaded_are_refused(smoke_mini):
    from transformers import LlamaForCausalLM

    model, tokenizer = _in_memory(smoke_mini)
    forget = smoke_mini.data / "forget10.json"
    config = model.config.to_dict() | {"vocab_size": model.config.vocab_size + 16}
    wider = LlamaForCausalLM(type(model.config).from_dict(config))
    with pytest.raises(InputError, match="^these models do not share one vocabulary \\(embedding rows: "):
        margincal.diagnose(model, forget, ref=wider, tokenizer=tokenizer)
    with torch.device("meta"):
        ghost = LlamaForCausalLM(model.config)
    with pytest.raises(InputError, match="^the LlamaForCausalLM given is on the meta device"):
        margincal.diagnose(ghost, forget, tokenizer=tokenizer)
    with pytest.raises(InputError, match="^the LlamaForCausalLM given is on the meta device"):
        margincal.diagnose(model, forget, ref=ghost, tokenizer=tokenizer)  # θ_ref checked with the model, first


def test_data_names_a_directory_of_splits_not_one_file(smoke_mini, tmp_path):
    one = smoke_mini.data / "forget10.json"
    expected = (
        f"--data {brief(str(one))} is not a directory: give the directory that holds the benchmark's split files "
        "(forget10.json, retain90.json, ...; margincal mini export DIR writes the mini's) or a hub dataset id; "
        "a single QA file goes to --forget"
    )
    with pytest.raises(InputError) as caught:
        margincal.evaluate(str(smoke_mini.paths.theta0), benchmark="mini", data=one)
    assert str(caught.value) == expected


@pytest.mark.parametrize(
    ("file", "content", "expected"),
    [
        ("r.json", {"kind": ["evaluation"]}, "r.json: its kind is a list, not a name: not a result margincal wrote"),
        ("r.json", {"kind": {"a": 1}}, "r.json: its kind is a dict, not a name: not a result margincal wrote"),
    ],
)
def test_load_refuses_a_hostile_result_in_one_line(tmp_path, file, content, expected):
    (tmp_path / file).write_text(json.dumps(content))
    with pytest.raises(InputError) as caught:
        margincal.load(tmp_path / file)
    assert str(caught.value) == f"{tmp_path}/{expected}"


@pytest.mark.parametrize(
    ("stage", "method", "expected"),
    [
        ({"stage": "unlearn", "info": [1]}, {}, "stage.json: info is a list, not an object"),
        ({"stage": "unlearn", "manifest": [1]}, {}, "stage.json: manifest is a list, not an object"),
        ({"stage": "unlearn"}, [1], "method.json: the file is a list, not an object"),
        (
            {"stage": "polish", "manifest": {"config": {"method": "NPO"}}},
            {},
            "manifest.config.method is a str, not an object",
        ),
    ],
)
def test_load_refuses_a_hostile_stage_folder_in_one_line(tmp_path, stage, method, expected):
    (tmp_path / "stage.json").write_text(json.dumps(stage))
    (tmp_path / "history.json").write_text("[]")
    (tmp_path / "method.json").write_text(json.dumps(method))
    with pytest.raises(InputError, match=expected.replace(".", "\\.")):
        margincal.load(tmp_path)


def test_claimed_utility_metrics_of_open_unlearning_are_compared_not_listed_as_unknown(tmp_path):
    """Issue 74: the nine model-utility inputs in a TOFU_SUMMARY.json carry the names margincal computes them under."""
    from margincal.auditing.interop import read_claimed
    from margincal.results.metric_table import MU_KEYS

    (tmp_path / "TOFU_SUMMARY.json").write_text(json.dumps({name: 0.5 for name in (*MU_KEYS, "forget_quality")}))
    claim = read_claimed(tmp_path / "TOFU_SUMMARY.json")
    assert claim["not_compared"] == [] and sorted(claim["metrics"]) == sorted((*MU_KEYS, "forget_quality"))
