"""autoshard.plan.options.EngineOptions: priced-only engine features, recorded and refused."""

from __future__ import annotations

import pytest

from autoshard.plan.options import EngineOptions, refuse_engine_options


def test_every_engine_option_defaults_off():
    assert EngineOptions().to_dict() == {"float8_linears": False, "float8_all_gather": False, "async_tp": False}
    assert not EngineOptions().any


def test_engine_options_round_trip_through_the_plan_options():
    options = EngineOptions(float8_linears=True, float8_all_gather=True, async_tp=True)
    assert EngineOptions.from_dict(options.to_dict()) == options


@pytest.mark.parametrize("data, message", [
    ({"float8": True}, "engine.float8: unknown engine option"),
    ({"async_tp": "yes"}, "async_tp: must be true or false"),
    ({"float8_all_gather": True}, "float8_all_gather: needs float8_linears"),
    ([1], "engine: expected an object"),
])
def test_bad_engine_options_get_one_line_naming_them(data, message):
    with pytest.raises(ValueError, match=message) as info:
        EngineOptions.from_dict(data)
    assert "\n" not in str(info.value)


def test_the_runtime_check_refuses_only_plans_priced_with_a_feature_on():
    refuse_engine_options({})
    refuse_engine_options({"engine": EngineOptions().to_dict()})
    with pytest.raises(ValueError, match=r"^plan: priced with float8_linears \(torchtitan's engine features\)"):
        refuse_engine_options({"engine": {"float8_linears": True}})
