"""The one registry kind: methods, attackers, evaluators, stage kinds, MC variant presets and the metric table's
functions are each a :class:`~margincal.core.registry.Registry`, frozen once their modules are imported."""

import pytest

from margincal.core.errors import InputError
from margincal.core.registry import Registry


def test_a_registry_names_what_it_holds_and_refuses_a_second_registration():
    methods = Registry("method", "methods", fold_case=True, entries={"NPO": 1})

    @methods.register("GradDiff")
    def graddiff():
        return 2

    assert methods.lookup("npo") == 1 and methods["GRADDIFF"] is graddiff and "Npo" in methods
    assert list(methods) == ["npo", "graddiff"] and len(methods) == 2 and 3 not in methods
    with pytest.raises(InputError, match=r"^unknown method 'SimNPO'; known methods: graddiff, npo$"):
        methods.lookup("SimNPO")
    with pytest.raises(ValueError, match="method 'npo' is registered twice"):
        methods.add("npo", 3)
    assert methods.freeze() is methods
    with pytest.raises(ValueError, match="method 'SimNPO' is registered after the methods were frozen"):
        methods.add("SimNPO", 4)
    assert list(methods) == ["npo", "graddiff"]


def test_every_registry_is_one_kind_and_frozen_after_import():
    from margincal.config.settings import MC_VARIANTS
    from margincal.evaluation.evaluators import EVALUATORS
    from margincal.methods import METHODS, get_method
    from margincal.pipeline.graph import STAGE_KINDS
    from margincal.results.metric_table import VALUES
    from margincal.training.attacks import ATTACKERS, get_attacker

    registries = (METHODS, ATTACKERS, EVALUATORS, STAGE_KINDS, MC_VARIANTS, VALUES)
    assert all(isinstance(r, Registry) and r.frozen for r in registries) and set(EVALUATORS) == {
        "tofu",
        "muse",
        "wmdp",
    }
    assert get_method("npo").name == "NPO" and get_attacker("lora") is ATTACKERS["lora"]
    with pytest.raises(InputError, match="unknown attacker 'nope'; known attackers: adaptive, "):
        get_attacker("nope")
