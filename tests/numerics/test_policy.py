import dataclasses

import pytest

from workbench.errors import PolicyError
from workbench.numerics.policy import DEFAULT, Policy, current_policy, resolve_policy, use_policy


def test_replace_is_a_counterfactual():
    p = DEFAULT.replace(state_dtype="bf16")
    assert p.diff(DEFAULT) == {"state_dtype": ("bf16", "fp32")}
    assert p.label() == "state_dtype=bf16"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.state_dtype = "fp16"


@pytest.mark.parametrize("knob,value", [("state_dtype", "fp8"), ("chunk_size", 0), ("page_order", "random"),
                                        ("splitk", True), ("partition_size", -4)])
def test_invalid_values_name_the_knob(knob, value):
    with pytest.raises(PolicyError, match=knob):
        Policy(**{knob: value})


def test_unknown_knob_lists_valid_ones():
    with pytest.raises(PolicyError, match="valid knobs are"):
        DEFAULT.replace(stat_dtype="bf16")


def test_use_policy_restores_on_error():
    assert current_policy() is DEFAULT
    with pytest.raises(RuntimeError):
        with use_policy(prob_dtype="fp16") as p:
            assert current_policy() is p and p.prob_dtype == "fp16"
            with use_policy(splitk=4):
                assert current_policy().splitk == 4 and current_policy().prob_dtype == "fp16"
            raise RuntimeError
    assert current_policy() is DEFAULT


def test_resolve_policy_accepts_dicts_and_round_trips():
    assert resolve_policy({"splitk": 9}).splitk == 9
    p = Policy(state_dtype="fp16", chunk_size=32)
    assert Policy.from_dict(p.to_dict()) == p
    with pytest.raises(PolicyError):
        resolve_policy("bf16")


def test_parse_typed_knobs():
    import pytest

    from workbench.errors import PolicyError
    from workbench.numerics.policy import Policy

    p = Policy.parse("state_dtype:bf16, splitk=4")
    assert p.state_dtype == "bf16" and p.splitk == 4
    assert Policy.parse("", base=p) == p
    with pytest.raises(PolicyError, match="not knob:value"):
        Policy.parse("state_dtype")
    with pytest.raises(PolicyError, match="unknown policy knob"):
        Policy.parse("colour:red")
