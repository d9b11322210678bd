"""autoshard.calibrate.output: a profile is validated before it is written,
absurd figures are refused naming the field, figures above the base
datasheet are warnings, and a refused profile leaves the old file intact."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from autoshard.calibrate.output import check_profile, to_json, write_profile
from hw_profiles import ProfileError, load

# a datasheet base (the warnings compare against datasheet figures): the H100 as shipped before it
# was rebuilt from measurements
H100 = load(Path(__file__).resolve().parents[2] / "costmodel" / "h100_sxm_80gb_datasheet.json")
GOOD = load("cpu-gloo").to_dict()


def _with(path, value):
    data = copy.deepcopy(GOOD)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path,value,field",
    [
        (("device", "launch_s"), float("nan"), "device.launch_s"),
        (("device", "memory_bandwidth_Bps"), 1e20, "device.memory_bandwidth_Bps"),
        (("device", "peak_flops", "fp32"), 0.0, "device.peak_flops.fp32"),
        (("device", "peak_flops", "bf16"), -5.0, "device.peak_flops.bf16"),
        (("interconnect", 0, "collectives", "all_reduce", "alpha_s"), float("inf"),
         "interconnect[0].collectives.all_reduce.alpha_s"),
    ],
)
def test_absurd_figure_is_refused_naming_the_field_and_nothing_is_written(tmp_path, path, value, field):
    target = tmp_path / "profile.json"
    target.write_text("previous\n")
    data = _with(path, value)
    with pytest.raises(ProfileError, match=field.replace("[", r"\[").replace("]", r"\]")):
        check_profile(data, base=None)
    with pytest.raises(ProfileError, match=field.replace("[", r"\[").replace("]", r"\]")):
        write_profile(target, data)
    assert target.read_text() == "previous\n"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left


def test_figures_above_the_datasheet_are_warnings():
    data = copy.deepcopy(H100.to_dict())
    data["device"]["peak_flops"]["bf16"] = 2e15
    data["device"]["efficiency"]["memory"] = [[1e6, 1.0], [1e9, 1.0]]
    data["device"]["memory_bandwidth_Bps"] = 5e12
    data["interconnect"][0]["collectives"]["all_gather"]["beta_s_per_byte"] = 1e-12
    warnings = check_profile(data, base=H100)
    assert any(w.startswith("device.peak_flops.bf16") for w in warnings)
    assert any(w.startswith("device.memory_bandwidth_Bps") for w in warnings)
    assert any(w.startswith("interconnect[0].collectives.all_gather.beta_s_per_byte") for w in warnings)
    assert check_profile(H100.to_dict(), base=H100) == []


def test_written_profile_round_trips_and_keeps_curves_on_one_line(tmp_path):
    target = tmp_path / "p.json"
    write_profile(target, GOOD)
    assert json.loads(target.read_text()) == GOOD
    assert '"matmul": [[' in target.read_text()
    assert to_json([]) == "[]" and to_json({}) == "{}"
