"""The solve chooses expert parallelism where its price pays and not where it does not.

A Mixtral with eight large experts (d 1024, h 4096) on 4 H100s: replicated or
FSDP experts pay a gradient reduction or gathers of ~200 MB per step, the
expert-parallel strategy (``autoshard.rules.experts``, priced by
``costmodel.expert_parallel`` at the load imbalance option) keeps each rank's
two experts and pays four token all-to-alls: the solve picks it for both the
forward and the backward experts node, the plan records the exchange and the
imbalance, and ``explain`` shows it. The tiny Mixtral (d 64): its exchanges'
latency costs more than its experts' compute, so no exchange is chosen.
"""

from __future__ import annotations

import importlib.util

import pytest

from autoshard.plan.explain import explain_text
from autoshard.plan.format import Plan
from autoshard.search.solve import prepare, solve_prepared
from examples.models import hf, mlp

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

BIG = {"hidden_size": 1024, "intermediate_size": 4096, "num_local_experts": 8, "num_hidden_layers": 1,
       "batch_size": 4, "seq_len": 64, "device": "meta"}
SOLVE = {"profile": "h100-sxm-80gb", "device_type": "cpu", "time_limit": 10, "recompute": "none"}


def _experts(plan: Plan) -> list:
    return [n for n in plan.nodes if n.op.startswith("autoshard.experts")]


@pytest.fixture(scope="module")
def big():
    model, inputs = hf.hf_mixtral(**BIG)
    return prepare(model, inputs, (4,), ("ep",), **SOLVE)


def test_many_large_experts_on_four_ranks_run_expert_parallel(big) -> None:
    plan = solve_prepared(big, time_limit=10)
    nodes = _experts(plan)
    assert [n.op for n in nodes] == ["autoshard.experts.default", "autoshard.experts_backward.default"]
    assert all(n.exchange == ("expert_dispatch", 0) for n in nodes)
    assert all(p.startswith("S(0)") for p in nodes[0].inputs[3:])  # each rank holds its 2 of the 8 experts
    assert plan.options["expert_imbalance"] == 1.25
    again = Plan.from_dict(plan.to_dict())
    assert [n.exchange for n in _experts(again)] == [n.exchange for n in nodes]
    text = explain_text(plan)
    assert "expert parallel: 2 ops" in text
    assert "| experts (autoshard.experts.default) | - | 0 (ep) | 4 | 1.25 |" in text


def test_the_imbalance_option_prices_the_exchange_strategy(big) -> None:
    def ep_price(prep) -> float:
        node = next(n for n in prep.graph.nodes if n.target == "autoshard.experts.default")
        return max(c for s, c in zip(node.strategies, node.compute_s) if s.exchange is not None)

    model, inputs = hf.hf_mixtral(**BIG)
    skewed = prepare(model, inputs, (4,), ("ep",), **SOLVE, expert_imbalance=3.0)
    assert ep_price(skewed) > 1.5 * ep_price(big)
    assert skewed.options["expert_imbalance"] == 3.0
    with pytest.raises(ValueError, match=r"^expert_imbalance: must be a number >= 1"):
        prepare(model, inputs, (4,), ("ep",), **SOLVE, expert_imbalance=0.5)


def test_tiny_experts_do_not_pay_for_the_exchange() -> None:
    model, inputs = hf.hf_mixtral(num_hidden_layers=1)
    prep = prepare(model, inputs, (4,), ("ep",), **SOLVE)
    node = next(n for n in prep.graph.nodes if n.target == "autoshard.experts.default")
    assert any(s.exchange is not None for s in node.strategies)  # offered, and priced above the local ones
    plan = solve_prepared(prep, time_limit=10)
    assert all(n.exchange is None for n in _experts(plan))
    assert "expert parallel" not in explain_text(plan)


def test_a_model_without_experts_records_no_imbalance() -> None:
    model, inputs = mlp.tiny(device="meta")
    prep = prepare(model, inputs, (4,), ("dp",), **SOLVE)
    assert "expert_imbalance" not in prep.options
    assert all(n.exchange is None for n in solve_prepared(prep, time_limit=10).nodes)


def test_the_plan_service_path_keeps_the_exchange(big) -> None:
    """A plan assembled from the request's JSON (what ``autoshard serve`` receives) records the same
    exchanges as the local plan: the request's strategy lists carry them."""
    import json

    from autoshard.assembly.assemble import assemble_plan
    from autoshard.assembly.from_graph import plan_from_solution, plan_request
    from autoshard.assembly.request import PlanRequest
    from autoshard.graph.problem import to_problem
    from solver import Problem
    from solver import solve as solve_problem

    problem = to_problem(big.graph, memory_limit=big.graph.profile.device.memory_bytes)
    solution = solve_problem(problem, time_limit=10)
    local = plan_from_solution(big.graph, problem, solution, fingerprint=big.fingerprint, options=big.options)
    body = json.loads(json.dumps(plan_request(big.graph, problem, fingerprint=big.fingerprint, options=big.options,
                                              timings={}, solve={"time_limit": 10})))
    request = PlanRequest.from_dict(body["autoshard"])
    remote = assemble_plan(request.assembly, Problem.from_dict(body), solution, fingerprint=request.fingerprint,
                           options=request.options)
    assert any(n.exchange is not None for n in _experts(local))
    assert [n.exchange for n in _experts(remote)] == [n.exchange for n in _experts(local)]


@pytest.mark.slow  # two searches of two layouts each: ~25 CPU s
def test_the_mesh_search_chooses_expert_parallelism_where_it_pays() -> None:
    """Over every layout of 4 devices (4, 2x2), the search keeps a plan whose experts run
    expert-parallel for the large Mixtral, and none for the tiny one, whose exchanges' latency
    costs more than its experts' compute or gradient reduction."""
    from autoshard.search.mesh_search import search_mesh

    found = {}
    for label, kwargs in (("large", BIG), ("tiny", {"num_hidden_layers": 1, "device": "meta"})):
        model, inputs = hf.hf_mixtral(**kwargs)
        # the whole search's time: both layouts built and solved even on a loaded machine
        plan = search_mesh(model, inputs, 4, 4, jobs=1, cache_dir=False, **{**SOLVE, "time_limit": 300})
        assert len(plan.options["mesh_search"]["layouts"]) == 2
        found[label] = {n.exchange for n in _experts(plan)}
    assert found["large"] and None not in found["large"]
    assert found["tiny"] == {None}


def test_a_pinned_expert_split_the_mesh_does_not_divide_is_one_line() -> None:
    """4 experts on a mesh dim of 3: no expert-parallel strategy is offered, and a pin asking for
    the split names the tensor, its shape and the mesh in one line."""
    from autoshard.search.pins import PinError

    model, inputs = hf.hf_mixtral(num_hidden_layers=1, device="meta", batch_size=3)
    prep = prepare(model, inputs, (3,), ("ep",), **SOLVE)
    node = next(n for n in prep.graph.nodes if n.target == "autoshard.experts.default")
    assert all(s.exchange is None for s in node.strategies)
    with pytest.raises(PinError) as err:
        solve_prepared(prep, pins={"*.experts.gate_up_proj": "S(0)"}, time_limit=10)
    message = str(err.value)
    assert "\n" not in message and "gate_up_proj" in message and "cannot take S(0) on mesh 3" in message


def test_a_routing_the_dispatch_does_not_recognise_falls_back_and_says_so(caplog) -> None:
    """Experts whose activation the op does not cover keep transformers' own code (sort, histc,
    grouped matmuls): the solve plans it with today's placements, no experts node, no exchange,
    and the log says once which class was kept and why."""
    import logging

    model, inputs = hf.hf_mixtral(num_hidden_layers=1, hidden_act="tanh", device="meta")
    with caplog.at_level(logging.WARNING, logger="autoshard.trace.experts"):
        plan = solve_prepared(prepare(model, inputs, (4,), ("ep",), **SOLVE), time_limit=10)
    assert not _experts(plan) and all(n.exchange is None for n in plan.nodes)
    lines = [r.getMessage() for r in caplog.records if "MixtralExperts" in r.getMessage()]
    assert lines == ["MixtralExperts: experts kept as traced (activation 'tanh'), no expert-parallel strategy for it"]


def test_the_dispatched_tokens_are_a_memory_bound_at_the_experts_time(big) -> None:
    from autoshard.rules import load_rules
    from autoshard.rules.experts import exchange_strategy_memory

    graph, rules = big.graph, load_rules()
    for target in ("autoshard.experts.default", "autoshard.experts_backward.default"):
        node = next(n for n in graph.nodes if n.target == target)
        bound = graph.nodes[graph.index[f"memory:in:{node.name}:99"]]
        assert bound.live[1] - bound.live[0] == 1
        info = big.traced.nodes[node.name]
        call = rules.op_call(info.op, info.args, info.kwargs, out_meta=info.outputs)
        for j, s in enumerate(node.strategies):
            if s.exchange is None:
                assert bound.memory_bytes[j] == 0
            else:
                held = exchange_strategy_memory(call, s, mesh=graph.mesh, profile=graph.profile)
                assert held > 0 and bound.memory_bytes[j] == held
