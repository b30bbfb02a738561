"""The mini models shipped with margincal are what the build makes: keyed by their settings and BUILD_VERSION, tied
to the build's behaviour by a tiny build's fingerprint, copied into a store instead of trained."""

import dataclasses
import filecmp
import hashlib
import json
import shutil

import pytest

from margincal.core.inputs import read_json
from margincal.mini import models, shipped
from margincal.mini.models import SHIPPED, STAGES, build_mini_models, stage_keys
from margincal.store.stage_store import Store

REBUILD = "run `python -m margincal.mini.shipped`"


def _digests(root):
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.glob("mini-*/*/*/*"))
        if p.is_file()
    }


def test_the_shipped_models_are_what_the_build_makes(tmp_path):
    """Every shipped set's entries are under the keys its settings give now, nothing else is shipped, the manifest's
    version is the code's, and a tiny build now gives the fingerprint recorded when they were built (its data and
    vocabulary equal, its losses within RTOL: another CPU's rounding passes, another build does not). Seeds fix
    every byte: the tiny build made again in another store is byte-identical."""
    first = shipped.fingerprint(tmp_path / "a")
    assert shipped.problems(current=first) == []
    assert shipped.fingerprint(tmp_path / "b") == first
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b") and len(_digests(tmp_path / "a")) > 10
    manifest = read_json(SHIPPED / shipped.MANIFEST)
    assert manifest["build_version"] == models.BUILD_VERSION and manifest["built_on"]
    assert sorted(manifest["sets"]) == ["demo", "memorising", "smoke"]


def test_each_way_of_going_stale_is_one_line_naming_the_rebuild(monkeypatch, tmp_path):
    recorded = read_json(SHIPPED / shipped.MANIFEST)["fingerprint"]
    assert shipped.problems(current=recorded) == []
    within = {**recorded, "final_nll": {s: v * (1 + shipped.RTOL / 10) for s, v in recorded["final_nll"].items()}}
    assert shipped.problems(current=within) == []
    changed = {**recorded, "final_nll": {s: v * 1.001 for s, v in recorded["final_nll"].items()}}
    assert shipped.problems(current=changed) == [
        "the mini build now makes other models than BUILD_VERSION 1 did (its fingerprint changed): raise "
        f"BUILD_VERSION in margincal/mini/models.py and {REBUILD}"
    ]
    assert shipped.problems(current={**recorded, "vocab": "0" * 64}) == shipped.problems(current=changed)

    smoke = shipped.SETS["smoke"]
    monkeypatch.setitem(
        shipped.SETS, "smoke", dataclasses.replace(smoke, overrides=(*smoke.overrides, "max_length=95"))
    )
    lacks, unused = shipped.problems()
    assert lacks.startswith("the shipped set 'smoke' lacks mini-") and lacks.endswith(
        f" (its settings or the build changed): {REBUILD}"
    )
    shared = set(shipped.SETS["memorising"].entries())  # the two smoke sets share their tokenizer
    assert (
        unused == f"shipped entries no set needs: {', '.join(e for e in smoke.entries() if e not in shared)}: {REBUILD}"
    )
    monkeypatch.setitem(shipped.SETS, "smoke", smoke)

    before = stage_keys(smoke.config(), "forget10")
    monkeypatch.setattr(models, "BUILD_VERSION", 2)
    monkeypatch.setattr(shipped, "BUILD_VERSION", 2)
    assert all(k != before[s] for s, k in stage_keys(smoke.config(), "forget10").items())  # every key moves
    assert shipped.problems() == [f"the shipped mini models are of BUILD_VERSION 1, the code's is 2: {REBUILD}"]
    assert shipped.problems(tmp_path) == [f"no shipped mini models at {tmp_path}: {REBUILD}"]


def test_a_rebuild_of_the_same_version_that_builds_otherwise_is_refused(tmp_path):
    """Replacing shipped models by other ones under the same keys would leave every store's copies silently stale:
    the rebuild stops before building anything and says to raise the version."""
    source = tmp_path / "shipped"
    source.mkdir()
    manifest = read_json(SHIPPED / shipped.MANIFEST)
    manifest["fingerprint"]["final_nll"]["mini-ref"] += 0.01
    (source / shipped.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="raise BUILD_VERSION in margincal/mini/models.py, then run this again"):
        shipped.rebuild(source, log=lambda line: pytest.fail(f"built something: {line}"))
    assert sorted(p.name for p in source.iterdir()) == [shipped.MANIFEST]


def test_an_empty_store_starts_from_the_shipped_models(tmp_path):
    """The demo's mini in an empty store: its tokenizer, θ0 and θ_ref copied under the keys a build gives (the
    same bytes and stage.json as shipped; no base model trained). ``Store.adopt`` copies only a finished entry."""
    demo = shipped.SETS["demo"].config()
    keys = stage_keys(demo, "forget10")
    store = Store(tmp_path / "store")
    paths = build_mini_models(demo, "forget10", store)
    assert sorted(p.name for p in store.root.iterdir() if not p.name.startswith(".")) == [
        "mini-ref",
        "mini-theta0",
        "mini-tokenizer",
    ]
    for stage, path in zip((STAGES[0], STAGES[2], STAGES[3]), (paths.tokenizer, paths.theta0, paths.ref), strict=True):
        assert path.parent == store.path(stage, keys[stage])
        names = sorted(f.name for f in path.iterdir())
        assert filecmp.cmpfiles(path, SHIPPED / stage / keys[stage] / path.name, names, shallow=False)[0] == names
    assert store.meta(STAGES[2], keys[STAGES[2]]) == read_json(SHIPPED / STAGES[2] / keys[STAGES[2]] / "stage.json")

    smoke = shipped.SETS["smoke"].config()
    tokenizer = STAGES[0], stage_keys(smoke, "forget10")[STAGES[0]]
    Store(tmp_path / "copy").adopt(*tokenizer, SHIPPED.joinpath(*tokenizer))
    assert (tmp_path / "copy" / tokenizer[0] / tokenizer[1] / "tokenizer").is_dir()
    with pytest.raises(ValueError, match="is not a finished store entry"):
        Store(tmp_path / "copy").adopt(STAGES[0], "0" * 16, tmp_path / "store")
    shutil.rmtree(tmp_path / "copy")


def test_saved_tokenizers_load_in_transformers_4_and_5(tiny_tokenizer, tmp_path):
    """``save_tokenizer`` writes the 4.x names (transformers 5's ``TokenizersBackend`` and list of extra special
    tokens are unreadable in 4.x, CI's lower-bounds pass): the tokenizer loads back with the same ids and special
    tokens here, and every shipped tokenizer, saved on one version and read on the other, is in that form."""
    from transformers import AutoTokenizer

    from margincal.model.loading import save_tokenizer

    save_tokenizer(tiny_tokenizer, tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    text = " Ann Bel writes sea novels."
    assert loaded(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert loaded.all_special_tokens == tiny_tokenizer.all_special_tokens
    configs = [tmp_path / "tok" / "tokenizer_config.json", *SHIPPED.glob("mini-*/*/*/tokenizer_config.json")]
    assert len(configs) == 1 + 8  # two tokenizer stages (the smoke sets share one) and six models
    for path in configs:
        config = read_json(path)
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in config, path
        assert not isinstance(config.get("extra_special_tokens"), list), path


def test_shipped_weights_are_checked_against_their_manifest_and_a_damaged_store_copy_is_replaced(tmp_path):
    """Issue 74: a copy of margincal whose shipped θ0 has one flipped byte is refused when adopted (and named stale
    by the check); a store entry cut short is copied again from the shipped one, never handed out."""
    from margincal.core.errors import InputError

    smoke = shipped.SETS["smoke"].config()
    keys = stage_keys(smoke, "forget10")
    copy = tmp_path / "shipped"
    shutil.copytree(SHIPPED, copy)
    weights = copy / STAGES[2] / keys[STAGES[2]] / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(InputError, match="model/model.safetensors is not the file it was .*reinstall margincal"):
        build_mini_models(smoke, "forget10", Store(tmp_path / "store"), source=copy)
    assert not Store(tmp_path / "store").done(STAGES[2], keys[STAGES[2]])
    assert shipped.problems(copy) == [f"the shipped files differ from the digests their manifest records: {REBUILD}"]

    store = Store(tmp_path / "store")
    paths = build_mini_models(smoke, "forget10", store)
    held = paths.theta0 / "model.safetensors"
    held.write_bytes(held.read_bytes()[:-100])
    again = build_mini_models(smoke, "forget10", store)
    shipped_weights = SHIPPED / STAGES[2] / keys[STAGES[2]] / "model" / "model.safetensors"
    assert again.theta0 == paths.theta0 and held.read_bytes() == shipped_weights.read_bytes()


def test_a_tokenizer_saved_by_transformers_5_loads_where_its_class_is_unknown(tiny_tokenizer, tmp_path, monkeypatch):
    """Issue 74: open-unlearning under transformers 5 saves ``tokenizer_class: TokenizersBackend``, which 4.x lacks
    (a ValueError there; CI's lower-bounds pass reads it for real, here transformers' refusal is replayed): the
    tokenizer is read from its tokenizer.json with the same ids; without one it stops with the fix in one line."""
    from transformers import AutoTokenizer

    from margincal.core.errors import InputError
    from margincal.model.loading import load_tokenizer, save_tokenizer

    save_tokenizer(tiny_tokenizer, tmp_path / "tok")
    config = read_json(tmp_path / "tok" / "tokenizer_config.json")
    (tmp_path / "tok" / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "TokenizersBackend"})
    )
    text = " Ann Bel writes sea novels."
    assert load_tokenizer(tmp_path / "tok")(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]

    def unknown(*args, **kwargs):
        raise ValueError("Tokenizer class TokenizersBackend does not exist or is not currently imported.")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", unknown)
    loaded = load_tokenizer(tmp_path / "tok")
    assert type(loaded).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert (
        loaded(text)["input_ids"] == tiny_tokenizer(text)["input_ids"] and loaded.eos_token == tiny_tokenizer.eos_token
    )
    (tmp_path / "tok" / "tokenizer.json").unlink()
    (tmp_path / "tok" / "vocab.json").write_text("{}")
    with pytest.raises(InputError, match="TokenizersBackend does not exist .* install the transformers that saved it"):
        load_tokenizer(tmp_path / "tok")
