"""The mesh search's work bound (c2) before a plain layout's build, and the plain layouts' order.

(c2) (``mesh_stages.work_bound_s``) must stay below every built layout's own bound and every
plan's step (it never cuts a layout that could win), above the matmul bound (p2) it refines, and
cut a plain layout before its build when the best plan (a pp layout's) is faster. The plain
layouts' mesh-dim counts take turns in the search's order, so a deadline leaves no count untried.
"""

from __future__ import annotations

import math

import pytest
from hw_profiles import load as load_profile

import autoshard.search.mesh_search as search_module
from autoshard.plan.options import solve_options
from autoshard.search.mesh_layouts import MeshLayout, enumerate_layouts
from autoshard.search.mesh_search import _groups, _solve_layout, _Value, _Work, layout_bound
from autoshard.search.mesh_stages import layout_kind, model_shape, pipeline_bound_s, work_bound_s
from autoshard.search.solve import prepare, solve_prepared
from autoshard.trace import trace_joint
from examples.models import llama3


@pytest.fixture(scope="module")
def traced_llama():
    model, inputs = llama3.tiny(device="meta", batch_size=4, seq_len=64, max_seq_len=64, dim=256, n_layers=2,
                                vocab_size=512)
    return trace_joint(model, inputs, target_device="cpu")


@pytest.mark.parametrize("profile, share", [("h100-sxm-80gb", 0.5), ("cpu-gloo", 0.2)])
def test_work_bound_is_below_the_built_bound_and_the_step_and_above_the_matmul_bound(traced_llama, profile: str,
                                                                                   share: float) -> None:
    prof = load_profile(profile)
    options = solve_options(None, {"profile": prof, "device_type": "cpu", "time_limit": 2})
    prep = prepare(None, None, (2, 2), None, options, traced=traced_llama)
    plan = solve_prepared(prep, options)
    work = work_bound_s(traced_llama, 4, prof)
    assert pipeline_bound_s(model_shape(traced_llama), 4, prof) <= work <= layout_bound(prep, options)
    assert layout_bound(prep, options) <= plan.estimate.step_s
    # not a vacuous bound: a good part of what the built graph's own bound holds (the op launches,
    # the roofline of every op; left out: the optimizer update, each op's efficiency below its best,
    # which on the measured CPU profile (short runs, cache-size memory curve) is most of it)
    assert work >= share * layout_bound(prep, options)


def _work(traced, prof, layout: MeshLayout, best_s: float, bound_s: float) -> _Work:
    options = solve_options(None, {"profile": prof, "device_type": "cpu", "time_limit": 30})
    return _Work(traced, prof, (layout,), options, deadline=math.inf, time_limit=30.0, jobs=1,
                 incumbent=_Value(best_s), unsolved=_Value(1), emit=lambda i, text: None,
                 shape=model_shape(traced), work_bound_s=bound_s)


def test_a_plain_layout_is_cut_before_its_build_when_the_best_beats_its_work_bound(traced_llama,
                                                                                  monkeypatch) -> None:
    import json

    prof = load_profile("h100-sxm-80gb")
    bound = work_bound_s(traced_llama, 4, prof)
    built = []

    def fake_prepare(*args, **kwargs):
        built.append(args[2])
        raise RuntimeError("built")

    monkeypatch.setattr(search_module, "prepare", fake_prepare)
    layout = MeshLayout((2, 2), ("dp", "tp"))
    # a pp plan may price below every plain layout's work (the pipeline search prices its stages)
    monkeypatch.setattr(search_module, "_WORK", _work(traced_llama, prof, layout, 0.5 * bound, bound))
    row = json.loads(_solve_layout(0, None))["result"]
    assert row["outcome"] == "cut" and "before its build" in row["reason"]
    assert row["bound_s"] == pytest.approx(bound) and not built
    # a best the bound does not beat: the layout is built
    monkeypatch.setattr(search_module, "_WORK", _work(traced_llama, prof, layout, 2.0 * bound, bound))
    row = json.loads(_solve_layout(0, None))["result"]
    assert row["outcome"] == "error" and "built" in row["reason"] and built == [(2, 2)]


def test_plain_layouts_take_turns_by_mesh_dim_count_and_prefer_a_node_wide_inner_dim() -> None:
    layouts = enumerate_layouts(64, 8)
    order = [i for g in _groups(range(len(layouts)), layouts, "auto", False, 8) for i in g]
    assert sorted(order) == list(range(len(layouts)))
    dims = [len(layouts[i].shape) for i in order]
    first_2d, first_3d = dims.index(2), dims.index(3)
    # the first group of each count comes before the second group of any other
    second_3d_group = next(k for k in range(first_3d + 1, len(order)) if dims[k] == 3
                           and not _same_group(layouts, order[first_3d], order[k]))
    assert first_2d < second_3d_group
    assert layouts[order[first_2d]].shape[-1] == 8  # the 2-D layout whose inner dim fills a node
    assert all(layout_kind(lay) == "plain" for lay in layouts)


def _same_group(layouts, a: int, b: int) -> bool:
    from costmodel.mesh import MeshSpec

    from autoshard.graph.restrict import coarse_groups, coarse_mesh

    def key(i: int):
        shape = layouts[i].shape
        coarse = coarse_mesh(MeshSpec(shape), coarse_groups(shape))
        return coarse.shape, coarse.strides

    return key(a) == key(b)
