import dataclasses

import pytest

from margincal.cli import build_parser, main
from margincal.config.files import CONFIG_DIR, read_yaml
from margincal.config.settings import BenchmarkSpec, MCConfig, resolve_method
from margincal.config.typed import apply_overrides, build


def test_mc_yaml_is_the_frozen_default():
    from margincal.config.settings import resolve_mc

    assert set(read_yaml(CONFIG_DIR / "mc.yaml")) == {"mini"}  # real scale: nothing overridden
    assert resolve_mc("reference", "paper") == MCConfig()
    mc = MCConfig()
    assert (mc.kappa, mc.kl_weight, mc.train.lora.r, mc.n_pool, mc.train.steps, mc.train.batch_size) == (
        5.0,
        0.05,
        32,
        200,
        80,
        1,
    )


def test_overrides_parse_yaml_scalars_and_nest():
    data = apply_overrides({"a": {"b": 1}}, ["a.b=2.5", "a.c=[1, 2]", "seed=3", "name=x"])
    assert data == {"a": {"b": 2.5, "c": [1, 2]}, "seed": 3, "name": "x"}
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides({}, ["novalue"])


def test_nested_partial_override_keeps_other_defaults():
    cfg = build(MCConfig, {"train": {"lora": {"r": 8}}})
    assert cfg.train.lora.r == 8 and cfg.train.lora.alpha == 32 and cfg.train.steps == 80


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ValueError, match="valid keys"):
        build(MCConfig, {"kapa": 1.0})


def test_demo_is_a_panel_with_overrides(tmp_path):
    from margincal.pipeline.panel import expand_cells, load_panel
    from margincal.pipeline.plan import plan_cell

    cfg = load_panel("demo", ["seeds=[7]", f"out={tmp_path / 'x'}", "mc.kappa=2.0"])
    assert (cfg.seeds, cfg.out_dir, cfg.methods) == ([7], tmp_path / "x", ["GradDiff", "NPO"])
    mc = plan_cell(cfg, expand_cells(cfg)[0]).mc
    assert (mc.kappa, mc.kl_weight, mc.train.seed) == (2.0, 0.05, 7)  # panel override, MCConfig default, cell seed
    assert dataclasses.is_dataclass(cfg.mini)


def test_a_panel_extends_another_merging_mappings_and_replacing_the_rest(tmp_path):
    from margincal.pipeline.panel import load_panel

    (tmp_path / "parent.yaml").write_text(
        "name: parent\nmethods: [NPO, GradDiff]\nseeds: [0]\nmini: {arch: {hidden_size: 48}, base: {steps: 7}}\n"
    )
    (tmp_path / "child.yaml").write_text(
        f"extends: {tmp_path / 'parent.yaml'}\nname: child\nmethods: [NPO]\nmini: {{base: {{steps: 9}}}}\n"
    )
    cfg = load_panel(tmp_path / "child.yaml", ["seeds=[1,2]"])
    assert (cfg.name, cfg.methods, cfg.seeds) == ("child", ["NPO"], [1, 2])
    assert (cfg.mini.arch.hidden_size, cfg.mini.base.steps) == (48, 9)  # the parent's arch, the child's steps
    (tmp_path / "parent.yaml").write_text(f"extends: {tmp_path / 'child.yaml'}\nname: parent\n")
    with pytest.raises(ValueError, match="extends itself: child -> parent -> child"):
        load_panel(tmp_path / "child.yaml")


def test_one_layering_order_for_mc_methods_and_attacks():
    from margincal.config.settings import resolve_attack, resolve_mc, resolve_method

    # defaults → shipped YAML → panel → key=value, the later winning
    mc = resolve_mc("two_sided", "paper", {"kappa": 3.0, "kl_weight": 0.5}, ["kappa=4"], seed=2)
    assert (mc.kappa, mc.kl_weight, mc.retain_hinge_weight, mc.train.seed) == (4.0, 0.0, 1.0, 2)
    run = resolve_method("NPO", "mini", panel={"hparams": {"beta": 0.3}}, overrides=["hparams.beta=0.4"])
    assert run.name == "NPO" and run.hparams["beta"] == 0.4 and run.train.steps == 60
    attack = resolve_attack("lora_r8", "mini", ["train.steps=7"], k=5, seed=3)
    assert (attack.train.lr, attack.train.steps, attack.k, attack.train.seed) == (2e-3, 7, 5, 3)


def test_paper_schedule_keeps_optimizer_accumulation_and_dual_warmup():
    from margincal.config.settings import resolve_method

    npo = resolve_method("NPO", "paper", n_forget=400)  # TOFU forget10: 400 QA, effective batch 4 x 4 = 16
    assert npo.train.optimizer == "paged_adamw_32bit"  # was silently dropped (plain AdamW)
    assert (npo.train.batch_size, npo.train.grad_accum, npo.train.steps) == (4, 4, 10 * 25)
    assert npo.train.warmup_ratio == pytest.approx(0.1) and npo.train.lr == 1e-5
    pdu = resolve_method("PDU", "paper", n_forget=400)
    assert pdu.hparams["dual_warmup_steps"] == 5 * 25  # open-unlearning's 5 dual warm-up epochs


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    assert "key=value" in capsys.readouterr().out


def test_cli_bad_override_is_a_clear_error(capsys):
    assert main(["demo", "no_such_key=1"]) == 2
    assert "unknown config key" in capsys.readouterr().err


def test_cli_unknown_method_lists_known_ones(capsys, tmp_path):
    assert main(["demo", "methods=[Foo]", f"out={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'Foo'" in err and "graddiff" in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_every_registered_method_has_a_config_with_provenance():
    from margincal.config.settings import resolve_method
    from margincal.methods import METHODS, get_method

    for key, cls in METHODS.items():
        spec = read_yaml(CONFIG_DIR / "methods" / f"{key}.yaml")
        assert spec["name"] == cls.name and spec["source"]
        assert spec["train"]["paper"]["provenance"] and spec["train"]["mini"]["provenance"]
        run = resolve_method(cls.name, "mini")
        assert get_method(cls.name, **run.hparams).hparams() == {**get_method(cls.name).hparams(), **run.hparams}
        assert run.train.steps > 0 and run.train.lr > 0


def _restated(cls, hparams: dict, given: dict, where: str) -> list[str]:
    """Entries of ``hparams`` equal to what ``cls`` resolves without them (its dataclass defaults ← ``given``)."""
    from margincal.methods.base import method_class
    from margincal.methods.defenses import Defense

    fields = {f.name: f for f in dataclasses.fields(cls) if f.compare}
    current = {n: f.default for n, f in fields.items() if f.default is not dataclasses.MISSING} | given
    found = [f"{where}.{k}" for k, v in hparams.items() if k in current and v == current[k]]
    if issubclass(cls, Defense) and "base_hparams" in hparams:
        base = method_class(hparams.get("base", given.get("base", cls.base)))
        own = hparams["base_hparams"] or {}
        found += [f"{where}.base_hparams"] * (not own)
        found += _restated(base, own, given.get("base_hparams", {}), f"{where}.base_hparams")
    return found


def test_method_yamls_hold_only_overrides():
    """No ``hparams`` entry of configs/methods/*.yaml (nor of its ``train.mini`` section) restates what the method
    resolves to without it: the dataclass fields are the one source of defaults, the YAML holds overrides only."""
    from margincal.methods import METHODS

    restated = []
    for key, cls in METHODS.items():
        spec = read_yaml(CONFIG_DIR / "methods" / f"{key}.yaml")
        top = spec.get("hparams") or {}
        restated += _restated(cls, top, {}, f"{key}.hparams")
        mini = spec["train"]["mini"].get("hparams") or {}
        restated += _restated(cls, mini, top, f"{key}.train.mini.hparams")
    assert not restated, f"hparams equal to the dataclass defaults: {restated}"


def test_shipped_methods_report_their_configured_family():
    """``method_class(name).family`` (what cell records store) agrees with the resolved method's family at both
    scales and with the YAML's ``family``."""
    from margincal.config.settings import resolve_method
    from margincal.methods import METHODS, get_method

    for key, cls in METHODS.items():
        spec = read_yaml(CONFIG_DIR / "methods" / f"{key}.yaml")
        for scale in ("mini", "paper"):
            run = resolve_method(cls.name, scale, n_forget=400)
            assert get_method(run.name, **run.hparams).family == cls.family == spec["family"], (key, scale)


def test_cli_methods_lists_the_registry(capsys):
    from margincal.methods import METHODS

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(cls.name in out for cls in METHODS.values()) and "mini: lr" in out


def test_numeric_fields_accept_yaml_exponent_strings():
    cfg = build(MCConfig, apply_overrides({}, ["kappa=2", "train.lr=1e-4", "train.steps=40"]))
    assert cfg.kappa == 2.0 and isinstance(cfg.kappa, float) and cfg.train.lr == 1e-4 and cfg.train.steps == 40
    with pytest.raises(ValueError, match="expects a number"):
        build(MCConfig, apply_overrides({}, ["kappa=abc"]))


def test_mc_mini_scale_learning_rate_rule():
    from margincal.config.settings import resolve_mc

    assert resolve_mc("reference", "paper").train.lr == 1e-4  # real scale: frozen default
    mini = resolve_mc("reference", "mini")
    assert mini.train.lr == 2e-3  # 1e-4 x the mini attacker's LoRA factor 20 (configs/mc.yaml provenance)
    assert dataclasses.replace(mini, train=dataclasses.replace(mini.train, lr=1e-4)) == MCConfig()
    assert resolve_mc("reference", "mini", overrides=["train.lr=5e-4"]).train.lr == 5e-4
    with pytest.raises(ValueError, match="unknown MC scale"):
        resolve_mc("reference", "huge")


def test_method_overrides_star_applies_to_every_method():
    from margincal.pipeline.panel import load_panel, method_spec

    star = 'method_overrides={"*": {stop: {tol: 0.1}, train: {steps: 7}}, NPO: {train: {steps: 9}}}'
    cfg = load_panel("demo", [star])
    npo, gd = method_spec(cfg, "NPO"), method_spec(cfg, "GradDiff")
    assert (npo.train.steps, gd.train.steps) == (9, 7)
    assert npo.stop.tol == gd.stop.tol == 0.1 and npo.stop.min_epochs == 3
    assert method_spec(load_panel("demo"), "NPO").stop is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "must be a mapping of key: value, got a list"),
        ({"kappa": None}, "kappa expects a number, got null"),
        ({"kappa": float("inf")}, "kappa expects a finite number, got inf"),
        ({"kappa": True}, "kappa expects a number, got a boolean"),
        ({"kappa": -1}, "kappa must be a positive number, got -1.0"),
        ({"token_weights": 3}, "token_weights expects a string, got 3"),
        (
            {"train": {"lora": {"target_modules": "q_proj"}}},
            r"train\.lora\.target_modules expects a list, got a string",
        ),
        ({"train": {"lora": {"target_modules": [1]}}}, r"train\.lora\.target_modules\[0\] expects a string, got 1"),
        ({"train": {"seed": 2**40}}, r"train\.seed must be an integer in \[0, 2\^32\)"),
        ({"train": [1]}, r"train must be a mapping of key: value, got a list"),
        ({"margin_anchor": "base"}, "margin_anchor must be one of ref, theta0, got 'base'"),
    ],
)
def test_build_checks_shape_type_and_range(data, message):
    """The typed spec of a config: shape, None only for optional fields, finite numbers, element types, ranges."""
    from margincal.config.typed import ConfigError

    with pytest.raises(ConfigError, match=message):
        build(MCConfig, data)


def test_errors_name_the_layer_that_set_the_key(tmp_path):
    """A panel error names its file (through `extends`) or the override that set the key; a key no layer sets
    names the error's own source."""
    from margincal.config.typed import ConfigError, override_layers, sourced
    from margincal.pipeline.panel import load_panel

    parent = tmp_path / "parent.yaml"
    parent.write_text("extends: demo\nmc: {kappa: -1}\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {parent}\nseeds: [0]\n")
    with pytest.raises(ConfigError, match=rf"^{parent}: mc\.kappa must be a positive number, got -1\.0$"):
        load_panel(child)
    with pytest.raises(ConfigError, match=r"^override mc\.kappa=0: mc\.kappa must be"):
        load_panel(child, ["mc.kappa=0"])
    layers = [("a.yaml", {"x": {"y": 1}}), *override_layers(["z=[1]"])]
    assert sourced(ConfigError("z[0].w", "bad"), layers).source == "override z=[1]"
    assert sourced(ConfigError("x.y.k", "bad"), layers).source == "a.yaml"
    assert sourced(ConfigError("q", "bad", "b.yaml"), layers).source == "b.yaml"


def test_a_method_yaml_without_a_scale_stops_naming_the_file(tmp_path):
    path = tmp_path / "mymethod.yaml"
    path.write_text("name: GradDiff\nfamily: gradient\ntrain:\n  paper: {lr: 1.0e-5, epochs: 5}\n")
    assert resolve_method(str(path), "paper", n_forget=40).train.steps == 50
    with pytest.raises(ValueError) as err:
        resolve_method(str(path), "mini")
    assert str(err.value) == f"{path}: no train.mini schedule; a method YAML gives train.paper and train.mini"


def test_membership_roles_are_a_field_of_the_benchmark_spec():
    from margincal.config.settings import resolve_benchmark
    from margincal.config.typed import ConfigError

    assert resolve_benchmark("tofu").membership == resolve_benchmark("mini").membership == ("forget", "holdout")
    assert resolve_benchmark("muse-news").membership == ("mia_forget", "mia_holdout")
    data = {"name": "b", "kind": "tofu", "splits": {}, "train_splits": {}}
    for bad in (["forget"], ["forget", "forget"], ["a", "b", "c"]):
        with pytest.raises(ConfigError, match="membership must be two distinct roles"):
            build(BenchmarkSpec, {**data, "membership": bad})
