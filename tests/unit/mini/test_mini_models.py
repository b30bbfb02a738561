"""The mini benchmark's defining property at reduced size: θ0 memorises the forget set, θ_ref cannot guess it."""

import dataclasses

import pytest

from margincal.config.settings import EvalSettings, resolve_benchmark
from margincal.data import benchmarks
from margincal.evaluation.evaluators import evaluate
from margincal.mini.data import generate
from margincal.mini.models import STAGES, retain_split, stage_keys
from margincal.model.loading import load_model, load_tokenizer
from margincal.pipeline.panel import load_panel
from margincal.store.stage_store import Store


@pytest.fixture(scope="module")
def built(memorising_mini):
    """The session's memorising smoke mini (conftest): its config, benchmark, model paths and store."""
    cfg = memorising_mini.cfg
    return cfg, generate(cfg.mini.data), memorising_mini.paths, Store(cfg.store_dir)


def test_theta0_memorises_and_reference_does_not(built):
    cfg, bench, paths, _ = built
    tok = load_tokenizer(paths.tokenizer)
    forget, retain = bench.split("forget10"), bench.split(retain_split("forget10"))[:30]
    spec = dataclasses.replace(resolve_benchmark("mini"), max_new_tokens=40)
    scores = {}
    for name, path in (("theta0", paths.theta0), ("ref", paths.ref)):
        model = load_model(path)
        f = evaluate(model, tok, spec, {"forget": forget}, EvalSettings(), parts=("diagnosis", "rouge"))
        r = evaluate(model, tok, spec, {"forget": retain}, EvalSettings(), parts=("rouge",))
        scores[name] = (f["summary"]["forget_Q_A_ROUGE"], r["summary"]["forget_Q_A_ROUGE"], f["summary"]["m"])
    assert scores["theta0"][0] >= 0.75  # memorised the forget authors
    assert scores["ref"][0] <= scores["theta0"][0] - 0.3  # the answer cannot be read off the question
    assert min(scores["theta0"][1], scores["ref"][1]) >= 0.75  # both know the retain authors
    assert scores["theta0"][2] > scores["ref"][2]  # θ0's forget margin sits above the reference's


def test_models_are_store_stages_keyed_by_their_settings(built):
    cfg, _, paths, store = built
    keys = stage_keys(cfg.mini, "forget10")
    kept = [s for s in STAGES if s != "mini-base"]  # the base model is built only to build θ0 and θ_ref
    assert [paths.tokenizer, paths.theta0, paths.ref] == [
        store.path(stage, keys[stage]) / ("tokenizer" if stage == "mini-tokenizer" else "model") for stage in kept
    ]
    assert all(store.meta(stage, keys[stage])["manifest"]["versions"]["torch"] for stage in kept)
    longer = stage_keys(dataclasses.replace(cfg.mini, max_length=cfg.mini.max_length + 1), "forget10")
    assert all(longer[s] != keys[s] for s in STAGES)  # the tokenizer's setting reaches every model downstream
    steps = dataclasses.replace(cfg.mini.finetune, steps=cfg.mini.finetune.steps + 1)
    finetuned = stage_keys(dataclasses.replace(cfg.mini, finetune=steps), "forget10")
    assert [finetuned[s] == keys[s] for s in STAGES] == [True, True, False, False]
    other_tier = stage_keys(cfg.mini, "forget05")
    assert [other_tier[s] == keys[s] for s in STAGES] == [True, True, True, False]
    with pytest.raises(ValueError, match="unknown forget tier"):
        stage_keys(cfg.mini, "forget7x")


def test_one_tier_parser():
    """``forgetNN`` tiers are parsed once (data/benchmarks.py); the mini models' retain split is that parser's."""
    from margincal.mini import models

    assert models.retain_split is benchmarks.retain_split
    tiers = ("forget01", "forget05", "forget10", "news", "forget", "forgetx")
    assert [benchmarks.forget_pct(t) for t in tiers] == [1, 5, 10, None, None, None]
    assert [retain_split(t) for t in ("forget01", "forget05", "forget10")] == ["retain99", "retain95", "retain90"]
    assert benchmarks.tier_fields("forget01") == {"tier": "forget01", "pct": "01", "retain_pct": "99"}
    assert benchmarks.tier_fields("news") == {"tier": "news"}
    for bad in ("news", "forget", "forget1x", "retain90"):
        with pytest.raises(ValueError, match=f"unknown forget tier '{bad}'; use forget01, forget05 or forget10"):
            retain_split(bad)
    tofu = resolve_benchmark("mini")
    assert benchmarks.fill_split("retain{retain_pct}", tofu, "forget05") == "retain95"
    with pytest.raises(ValueError, match="tier 'news' does not fit the .* split 'forget{pct}'; use forget01, forget05"):
        benchmarks.fill_split("forget{pct}", tofu, "news")
    with pytest.raises(ValueError, match="unknown forget tier 'news'"):
        stage_keys(load_panel("demo").mini, "news")
