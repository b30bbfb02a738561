"""The one registry kind: methods, attackers and evaluators are each a :class:`~margincal.registry.Registry`."""

import pytest

from margincal.errors import InputError
from margincal.registry import Registry


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


def test_methods_attackers_and_evaluators_share_the_registry_kind():
    from margincal.attacks import ATTACKERS, get_attacker
    from margincal.evaluation.evaluators import EVALUATORS
    from margincal.methods import METHODS, get_method

    assert all(isinstance(r, Registry) for r in (METHODS, ATTACKERS, EVALUATORS)) and set(EVALUATORS) == {
        "tofu",
        "muse",
        "wmdp",
    }
    assert get_method("npo").name == "NPO" and get_attacker("lora") is ATTACKERS["lora"]
    with pytest.raises(InputError, match="unknown attacker 'nope'; known attackers: adaptive, "):
        get_attacker("nope")
