import dataclasses

import pytest

from margincal.cli import build_parser, load_demo_config, main
from margincal.config import CONFIG_DIR, MCConfig, apply_overrides, build, read_yaml


def test_mc_yaml_is_the_frozen_default():
    assert build(MCConfig, read_yaml(CONFIG_DIR / "mc.yaml")) == MCConfig()
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


def test_demo_config_overrides():
    cfg = load_demo_config(None, ["seed=7", "out_dir=/tmp/x", "mc.kappa=2.0", "attack.k=10"])
    assert (cfg.seed, cfg.out_dir, cfg.mc.kappa, cfg.attack.k) == (7, "/tmp/x", 2.0, 10)
    assert cfg.mc.kl_weight == 0.05  # from mc.yaml
    assert dataclasses.is_dataclass(cfg.mini)


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
    assert main(["demo", "methods=[Foo]", f"out_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'Foo'" in err and "graddiff" in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_every_registered_method_has_a_config_with_provenance():
    from margincal.methods import METHODS, get_method
    from margincal.unlearn import method_run

    for key, cls in METHODS.items():
        spec = read_yaml(CONFIG_DIR / "methods" / f"{key}.yaml")
        assert spec["name"] == cls.name and spec["source"]
        assert spec["train"]["paper"]["provenance"] and spec["train"]["mini"]["provenance"]
        run = method_run(cls.name)
        assert get_method(cls.name, **run.hparams).hparams() == {**get_method(cls.name).hparams(), **run.hparams}
        assert run.train.steps > 0 and run.train.lr > 0


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
