"""hw_profiles: shipped profiles validate, round-trip and cite a source for
every figure; malformed profiles are refused with the field named."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import pytest

import hw_profiles
from hw_profiles import ProfileError, available, load, load_dict, validate

REQUIRED = ("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "h100-sxm-96gb-500w", "b200", "mi300x", "cpu-gloo")
PUBLISHED = ("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "h100-sxm-96gb-500w")
MEASURED = ("cpu-gloo", "h100-sxm-80gb")
"""Profiles whose device figures were measured (``h100-sxm-80gb``: on one H100, its links published)."""
REPO = Path(__file__).resolve().parents[2]
"""Profiles whose efficiencies and collective figures come from published measurements."""


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


def _efficiency_fields(efficiency):
    """Dotted names of every efficiency figure (curves per dtype one by one)."""
    for key, value in efficiency.items():
        if key == "matmul_by_dtype":
            yield from (f"efficiency.matmul_by_dtype.{d}" for d in value)
        else:
            yield f"efficiency.{key}"


@pytest.mark.parametrize("name", REQUIRED)
def test_every_figure_has_a_source(name):
    data = _raw(name)
    device = data["device"]
    sources = device["sources"]
    figures = {"memory_bytes", "peak_flops", "memory_bandwidth_Bps", "launch_s"}
    assert figures <= set(sources), f"device.sources misses {figures - set(sources)}"
    if "efficiency" not in sources:  # else one source for every curve: each is cited on its own
        missing = set(_efficiency_fields(device["efficiency"])) - set(sources)
        assert not missing, f"device.sources misses {missing}"
    for i, tier in enumerate(data["interconnect"]):
        assert tier.get("source"), f"interconnect[{i}].source"
        for kind, fit in tier["collectives"].items():
            assert fit.get("source"), f"interconnect[{i}].collectives.{kind}.source"
            for j, curve in enumerate(fit.get("bus_bandwidth", [])):
                assert curve.get("source"), f"interconnect[{i}].collectives.{kind}.bus_bandwidth[{j}].source"
    expected = "measured" if name in MEASURED else ("published" if name in PUBLISHED else "datasheet")
    assert data["source"] == expected


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_profiles_cite_a_reference_or_say_why_not(name):
    """Every efficiency and collective figure is a citation: published ones with a URL,
    estimates with the assumption written beside them."""
    data = _raw(name)
    device = data["device"]
    cited = [(f"device.sources.{k}", v) for k, v in device["sources"].items() if k.startswith("efficiency")]
    for i, tier in enumerate(data["interconnect"]):
        for kind, fit in tier["collectives"].items():
            cited.append((f"interconnect[{i}].collectives.{kind}", fit))
            cited += [(f"interconnect[{i}].collectives.{kind}.bus_bandwidth[{j}]", c)
                      for j, c in enumerate(fit.get("bus_bandwidth", []))]
    assert cited
    for where, citation in cited:
        assert isinstance(citation, dict) and citation["source"] in hw_profiles.SOURCE_KINDS, where
        if citation["source"] == "published":
            assert "http" in citation["reference"], where
        elif citation["source"] == "measured":  # the measurement is kept in the repository
            assert (REPO / citation["reference"].split()[0].rstrip(";")).is_file(), where
        else:
            assert citation.get("note"), f"{where}: an {citation['source']} figure says what it assumes"
    # the efficiencies are published measurements, not the old guesses (the 500 W part: published
    # H100 measurements scaled by a stated assumption, so estimates that cite what they scale)
    expected = {"h100-sxm-96gb-500w": "estimate", "h100-sxm-80gb": "measured"}.get(name, "published")
    for field in _efficiency_fields(device["efficiency"]):
        citation = device["sources"][field]
        if name == "h100-sxm-80gb" and field.endswith(".fp8"):  # not measured on the H100: published
            assert citation["source"] == "published", field
            continue
        assert citation["source"] == expected and citation.get("reference"), field
        assert expected != "published" or "http" in citation["reference"], field


@pytest.mark.parametrize("name", [n for n in REQUIRED if n != "cpu-gloo"])
def test_gpu_profiles_price_every_collective_kind_on_every_tier(name):
    profile = load(name)
    assert profile.ranks_per_node == 8
    for tier in profile.interconnect:
        assert {k for k, _ in tier.collectives} == set(hw_profiles.COLLECTIVE_KINDS)
    inner, outer = profile.interconnect
    assert inner.collective("all_reduce").beta_s_per_byte < outer.collective("all_reduce").beta_s_per_byte


def test_h100_figures_are_the_ones_measured_on_the_h100():
    """The rebuilt profile carries the one-H100 calibration's figures, and the memory a
    process can allocate there (torch's total_memory), not the datasheet's 80 GiB."""
    measured = json.loads((REPO / "benchmarks/results/h100-2026-11-27/h100-80gb-hbm3-measured-1rank.json").read_text())
    device = load("h100-sxm-80gb").device
    assert device.memory_bytes == measured["device"]["memory_bytes"] == 85_017_493_504 < 80 * 2**30
    assert device.launch_s == measured["device"]["launch_s"]
    assert device.memory_bandwidth_Bps == measured["device"]["memory_bandwidth_Bps"]
    for dtype in ("bf16", "fp16", "fp32", "tf32"):
        assert device.peak_flops_for(dtype) == measured["device"]["peak_flops"][dtype]
    # the default memory limit leaves the caching allocator's headroom
    assert device.usable_memory_bytes == pytest.approx(device.memory_bytes / (1 + device.allocator_headroom))
    assert 0 < device.allocator_headroom < 0.25


def test_datasheet_headline_figures():
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
    data = _raw("h200-sxm-141gb")
    path.write_text(json.dumps(data))
    assert load(path).device.launch_s == 5e-6
    data["device"]["launch_s"] = 7e-6
    path.write_text(json.dumps(data))
    import os

    os.utime(path, ns=(1, 2_000_000_000_000_000_000))
    assert load(path).device.launch_s == 7e-6


# -- measured profiles: memory curve, calibration metadata, plausibility -------------


def test_memory_efficiency_may_be_a_curve_over_the_working_set():
    data = _raw("h200-sxm-141gb")
    data["device"]["efficiency"]["memory"] = [[4096, 0.3], [5e7, 1.0], [1e9, 0.8]]
    profile = load_dict(data)
    assert profile.device.efficiency.memory_curve == ((4096.0, 0.3), (5e7, 1.0), (1e9, 0.8))
    assert profile.to_dict() == data  # round-trips in the curve form
    assert load("h200-sxm-141gb").device.efficiency.memory_curve == ((1.0, 0.835),)  # the scalar form stays valid


def test_calibration_ranks_and_vector_efficiency_round_trip():
    data = _raw("h200-sxm-141gb")
    data["calibration"]["ranks"] = 4
    data["device"]["efficiency"]["vector"] = 0.05
    profile = load_dict(data)
    assert profile.calibration.ranks == 4 and profile.device.efficiency.vector == 0.05
    assert profile.to_dict() == data
    assert load("h200-sxm-141gb").device.efficiency.vector is None


def test_vector_fractions_per_op_round_trip_and_bad_keys_are_refused():
    data = _raw("h200-sxm-141gb")
    data["device"]["efficiency"]["vector"] = 0.05
    data["device"]["efficiency"]["vector_by_op"] = {"aten.gelu": 0.1, "aten._softmax": 0.02}
    profile = load_dict(data)
    assert profile.device.efficiency.vector_fraction("aten._softmax.default") == 0.02
    assert profile.device.efficiency.vector_fraction("aten.exp.default") == 0.05
    assert profile.to_dict() == data
    for bad in ({"gelu": 0.1}, {"aten.gelu": 0.0}, {"aten.gelu": 1.5}):
        data["device"]["efficiency"]["vector_by_op"] = bad
        with pytest.raises(ProfileError, match="vector_by_op"):
            load_dict(data)


@pytest.mark.parametrize(
    "path,value,field",
    [
        (("device", "efficiency", "memory"), [[1e9, 0.8], [4096, 0.3]], "device.efficiency.memory"),
        (("device", "efficiency", "memory"), [[4096, 1.3]], "device.efficiency.memory"),
        (("device", "launch_s"), float("nan"), "device.launch_s"),
        (("device", "memory_bandwidth_Bps"), float("inf"), "device.memory_bandwidth_Bps"),
        (("device", "memory_bandwidth_Bps"), 1e20, "device.memory_bandwidth_Bps"),
        (("device", "peak_flops", "fp32"), 0.0, "device.peak_flops.fp32"),
        (("device", "peak_flops", "bf16"), 1e30, "device.peak_flops.bf16"),
        (("device", "launch_s"), 60.0, "device.launch_s"),
        (("device", "memory_bytes"), 0, "device.memory_bytes"),
        (("interconnect", 0, "collectives", "all_reduce", "beta_s_per_byte"), 0.0,
         "interconnect[0].collectives.all_reduce.beta_s_per_byte"),
        (("interconnect", 0, "collectives", "all_gather", "alpha_s"), float("nan"),
         "interconnect[0].collectives.all_gather.alpha_s"),
        (("calibration", "fit_error", "all_reduce"), -0.1, "calibration.fit_error.all_reduce"),
        (("device", "efficiency", "vector"), 0.0, "device.efficiency.vector"),
    ],
)
def test_absurd_figures_are_refused_naming_the_field(tmp_path, path, value, field):
    bad = tmp_path / "bad.json"
    data = _mutate(path, value)
    bad.write_text(json.dumps(data))  # NaN / Infinity are written as JSON's extension tokens
    with pytest.raises(ProfileError) as info:
        load(bad)
    assert str(info.value).startswith(f"{bad}: {field}"), str(info.value)
    with pytest.raises(ProfileError, match=field.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        validate(data)


# -- citations: a published figure names its reference ---------------------------


@pytest.mark.parametrize(
    "path,field",
    [
        (("device", "sources", "efficiency.matmul"), "device.sources.efficiency.matmul.reference"),
        (("interconnect", 0, "collectives", "all_gather"), "interconnect[0].collectives.all_gather.reference"),
        (("interconnect", 0, "collectives", "all_reduce", "bus_bandwidth", 2),
         "interconnect[0].collectives.all_reduce.bus_bandwidth[2].reference"),
    ],
)
def test_published_figure_without_a_reference_is_refused_naming_the_field(tmp_path, path, field):
    data = _raw("h200-sxm-141gb")
    target = data
    for key in path:
        target = target[key]
    assert target["source"] == "published"
    del target["reference"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as info:
        load(bad)
    assert str(info.value).startswith(f"{bad}: {field}: a figure with source \"published\" needs a reference")
    target["reference"] = "  "  # blank is no reference either
    with pytest.raises(ProfileError, match="needs a reference"):
        validate(data)


def test_free_text_sources_of_older_profiles_still_load():
    data = _raw("b200")
    assert isinstance(data["device"]["sources"]["peak_flops"], str)
    assert load_dict(data).to_dict() == data


def test_new_fields_round_trip_and_default_to_the_old_prices():
    data = copy.deepcopy(_raw("h100-sxm-96gb-500w"))
    data["device"]["launch_scalar_s"] = 9e-6
    data["device"]["fresh_pages"] = {"above_bytes": 2**25, "Bps": 3.1e9}
    data["device"]["efficiency"]["run"] = [[1, 0.1], [32, 0.5], [1024, 1.0]]
    data["calibration"]["load"] = {"cores": 2, "own_threads": 4, "before": [5.1, 5.0, 4.9], "after": [6, 5, 5],
                                   "during_load1": [6.5], "foreign_runnable": [2.0], "foreign_load": 2.0,
                                   "threshold": 0.5, "foreign": True}
    data["calibration"]["warnings"] = ["calibrated under foreign load"]
    profile = load_dict(data)
    assert profile.to_dict() == data
    assert profile.device.launch_scalar_s == 9e-6 and profile.calibration.load.foreign
    assert profile.device.fresh_pages.above_bytes == 2**25 and profile.device.fresh_pages.Bps == 3.1e9
    assert profile.device.efficiency.matmul_curve("fp8") != profile.device.efficiency.matmul
    assert profile.device.efficiency.matmul_curve("int8") == profile.device.efficiency.matmul
    old = load("b200").device
    assert old.launch_scalar_s is None and old.efficiency.run == () and old.efficiency.matmul_by_dtype == ()
    assert old.fresh_pages is None
    data["device"]["fresh_pages"] = {"above_bytes": 2**25}
    with pytest.raises(ProfileError, match="fresh_pages"):
        load_dict(data)


@pytest.mark.parametrize(
    "path,value,field",
    [
        (("device", "efficiency", "matmul_by_dtype", "int4"), [[1e9, 0.5]], "device.efficiency.matmul_by_dtype.int4"),
        (("device", "efficiency", "run"), [[32, 0.5], [1, 0.1]], "device.efficiency.run"),
        (("device", "efficiency", "attention_backward"), [[1e12, 0.3], [1e9, 0.2]], "device.efficiency.attention_backward"),
        (("interconnect", 0, "collectives", "all_reduce", "bus_bandwidth", 0, "ranks"), 16,
         "interconnect[0].collectives.all_reduce.bus_bandwidth"),
        (("interconnect", 0, "collectives", "all_gather", "bus_bandwidth", 1, "points"), [[1e6, 1e11], [1e3, 1e9]],
         "interconnect[0].collectives.all_gather.bus_bandwidth[1].points"),
        (("interconnect", 0, "collectives", "all_gather", "bus_bandwidth", 1, "points"), [[1e6, 1e20]],
         "interconnect[0].collectives.all_gather.bus_bandwidth[1].points[0][1]"),
        (("device", "sources", "launch_s", "source"), "guess", "device.sources.launch_s"),
        (("calibration", "load"), {"cores": 2}, "calibration.load"),
    ],
)
def test_bad_new_fields_are_refused_naming_the_field(tmp_path, path, value, field):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutate(path, value)))
    with pytest.raises(ProfileError) as info:
        load(bad)
    assert str(info.value).startswith(f"{bad}: {field}"), str(info.value)
