"""The mini benchmark's defining property at reduced size: θ0 memorises the forget set, θ_ref cannot guess it."""

import dataclasses

import pytest

from margincal.config import EvalSettings, resolve_benchmark
from margincal.data.mini import generate
from margincal.evaluation.evaluators import evaluate
from margincal.models import load_model, load_tokenizer
from margincal.pipeline.mini_models import build_mini_models, retain_split
from margincal.pipeline.panel import load_panel

MEDIUM = [
    "mini.data.n_authors=30",
    "mini.data.n_holdout_authors=4",
    "mini.data.n_real_authors=6",
    "mini.data.n_world_facts=10",
    "mini.data.n_probe=40",
    "mini.arch.hidden_size=64",
    "mini.arch.intermediate_size=192",
    "mini.arch.num_layers=2",
    "mini.arch.vocab_size=600",
    "mini.base.steps=60",
    "mini.finetune.steps=300",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = load_panel("demo", MEDIUM)
    bench = generate(cfg.mini.data)
    return cfg, bench, build_mini_models(bench, cfg.mini, cache_dir=tmp_path_factory.mktemp("cache"))


def test_theta0_memorises_and_reference_does_not(built):
    cfg, bench, paths = built
    tok = load_tokenizer(paths.tokenizer)
    forget, retain = bench.split("forget10"), bench.split(retain_split("forget10"))[:30]
    spec = dataclasses.replace(resolve_benchmark("mini"), max_new_tokens=40)
    scores = {}
    for name, path in (("theta0", paths.theta0), ("ref", paths.ref("forget10"))):
        model = load_model(path)
        f = evaluate(model, tok, spec, {"forget": forget}, EvalSettings(), parts=("diagnosis", "rouge"))
        r = evaluate(model, tok, spec, {"forget": retain}, EvalSettings(), parts=("rouge",))
        scores[name] = (f["summary"]["forget_Q_A_ROUGE"], r["summary"]["forget_Q_A_ROUGE"], f["summary"]["m"])
    assert scores["theta0"][0] >= 0.75  # memorised the forget authors
    assert scores["ref"][0] <= scores["theta0"][0] - 0.3  # the answer cannot be read off the question
    assert min(scores["theta0"][1], scores["ref"][1]) >= 0.75  # both know the retain authors
    assert scores["theta0"][2] > scores["ref"][2]  # θ0's forget margin sits above the reference's


def test_cache_key_tracks_the_config(built):
    cfg, _, paths = built
    other = dataclasses.replace(cfg.mini, max_length=cfg.mini.max_length + 1)
    assert other.cache_key() != cfg.mini.cache_key() and paths.root.name == cfg.mini.cache_key()
    with pytest.raises(ValueError, match="unknown forget tier"):
        retain_split("forget7x")
