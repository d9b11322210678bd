"""hw_profiles: shipped profiles validate, round-trip and cite a source for
every figure; malformed profiles are refused with the field named."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

import hw_profiles
from hw_profiles import ProfileError, available, load, load_dict, validate

REQUIRED = ("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200", "mi300x", "cpu-gloo")


def _raw(name):
    return json.loads((resources.files("hw_profiles") / "data" / f"{name}.json").read_text())


def test_required_profiles_are_shipped():
    assert set(REQUIRED) <= set(available())


@pytest.mark.parametrize("name", REQUIRED)
def test_shipped_profile_validates_and_round_trips(name):
    data = _raw(name)
    validate(data)
    profile = load(name)
    assert profile.name == name and profile.to_dict() == data
    assert profile.fingerprint.startswith(f"{name}@sha256:")


@pytest.mark.parametrize("name", REQUIRED)
def test_every_figure_has_a_source(name):
    data = _raw(name)
    device = data["device"]
    figures = {"memory_bytes", "peak_flops", "memory_bandwidth_Bps", "launch_s", "efficiency"}
    assert figures <= set(device["sources"]), f"device.sources misses {figures - set(device['sources'])}"
    for i, tier in enumerate(data["interconnect"]):
        assert tier.get("source"), f"interconnect[{i}].source"
        for kind, fit in tier["collectives"].items():
            assert fit.get("source"), f"interconnect[{i}].collectives.{kind}.source"
    expected = "measured" if name == "cpu-gloo" else "datasheet"
    assert data["source"] == expected


@pytest.mark.parametrize("name", [n for n in REQUIRED if n != "cpu-gloo"])
def test_gpu_profiles_price_every_collective_kind_on_every_tier(name):
    profile = load(name)
    assert profile.ranks_per_node == 8
    for tier in profile.interconnect:
        assert {k for k, _ in tier.collectives} == set(hw_profiles.COLLECTIVE_KINDS)
    inner, outer = profile.interconnect
    assert inner.collective("all_reduce").beta_s_per_byte < outer.collective("all_reduce").beta_s_per_byte


def test_datasheet_headline_figures():
    assert load("h100-sxm-80gb").device.peak_flops_for("bf16") == 9.89e14
    assert load("a100-sxm-80gb").device.memory_bandwidth_Bps == 2.039e12
    assert load("mi300x").device.memory_bytes == 192 * 2**30
    assert load("b200").device.peak_flops_for("fp8") == 4.5e15


def test_design_md_example_is_a_valid_profile():
    from hw_profiles.profile import _EXAMPLE

    profile = load_dict(copy.deepcopy(_EXAMPLE))
    assert profile.interconnect[-1].ranks is None


def _mutate(path, value):
    data = _raw("h100-sxm-80gb")
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path,value,field",
    [
        (("format",), "autoshard.hw_profile/2", "format"),
        (("device", "memory_bandwidth_Bps"), KeyError, "device"),
        (("device", "peak_flops", "bf16"), -1.0, "device.peak_flops.bf16"),
        (("device", "efficiency", "memory"), 1.5, "device.efficiency.memory"),
        (("interconnect", 0, "collectives", "all_reduce", "alpha_s"), "fast", "interconnect[0].collectives.all_reduce.alpha_s"),
        (("interconnect", 0, "collectives", "broadcast"), {"alpha_s": 1e-6, "beta_s_per_byte": 1e-12}, "interconnect[0].collectives"),
        (("interconnect", 0, "ranks"), None, "interconnect[0].ranks"),
        (("interconnect", 1, "ranks"), 4, "interconnect[1].ranks"),
        (("device", "efficiency", "matmul"), [[1e12, 0.7], [1e9, 0.3]], "device.efficiency.matmul"),
        (("device", "launch_time"), 5e-6, "device"),
    ],
)
def test_malformed_profile_error_names_the_field(tmp_path, path, value, field):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutate(path, value)))
    with pytest.raises(ProfileError) as info:
        load(bad)
    message = str(info.value)
    assert message.startswith(f"{bad}: {field}"), message


def test_unknown_name_lists_available_profiles():
    with pytest.raises(ProfileError, match="h100-sxm-80gb"):
        load("h100")


def test_invalid_json_and_missing_file_are_profile_errors(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load(broken)
    with pytest.raises(ProfileError, match="cannot read"):
        load(tmp_path / "missing.json")


def test_load_by_path_reads_an_edited_file_again(tmp_path):
    path = tmp_path / "mine.json"
    data = _raw("h100-sxm-80gb")
    path.write_text(json.dumps(data))
    assert load(path).device.launch_s == 5e-6
    data["device"]["launch_s"] = 7e-6
    path.write_text(json.dumps(data))
    import os

    os.utime(path, ns=(1, 2_000_000_000_000_000_000))
    assert load(path).device.launch_s == 7e-6
