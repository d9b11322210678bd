"""The strategy graph of a training step: nodes, shared edge matrices priced by
the redistribution planner, memory with liveness, required and repeated ties."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from costmodel.buckets.grouping import amortized_cost_s, bucket_share
from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from costmodel.placements import parse_placements as pp
from costmodel.redistribute import plan_redistribute
from hw_profiles import load

from autoshard.graph.builder import GraphBuildError, build_graph
from autoshard.graph.copies import growing_view
from autoshard.graph.memory import OptimizerMemory
from autoshard.graph.problem import to_problem
from autoshard.rules import OpCompute, R, RuleRegistry, S, SingleDimStrategy
from autoshard.trace import trace_joint
from examples.models import mlp


@pytest.fixture(scope="module")
def graph():
    traced = trace_joint(*mlp.tiny(device="meta", n_layers=6))
    return build_graph(traced, MeshSpec((2, 2)), load("h100-sxm-80gb"))


def test_every_op_and_leaf_has_strategies_and_every_parameter_a_gradient_sink(graph) -> None:
    kinds = {n.kind for n in graph.nodes}
    assert {"op", "param", "input", "grad", "loss", "tangent"} <= kinds
    assert all(len(n.strategies) == len(n.compute_s) == len(n.memory_bytes) >= 1 for n in graph.nodes)
    assert set(graph.grads) == set(graph.params)
    for fqn, sink in graph.grads.items():
        assert graph.nodes[sink].strategies is graph.nodes[graph.params[fqn]].strategies
        assert any({graph.params[fqn], sink} <= set(g) for g in graph.required_ties)


def test_edge_matrices_are_the_planner_costs_between_chosen_placements() -> None:
    graph = build_graph(trace_joint(*mlp.tiny(device="meta", n_layers=6)), MeshSpec((2, 2)), load("h100-sxm-80gb"),
                        recompute=False)
    rng = np.random.default_rng(0)
    checked = 0
    for e in rng.choice(len(graph.edges), size=60, replace=False):
        edge = graph.edges[e]
        u, v = graph.nodes[edge.src], graph.nodes[edge.dst]
        matrix = graph.matrices[edge.matrix]
        assert matrix.shape == (len(u.strategies), len(v.strategies))
        a, b = rng.integers(len(u.strategies)), rng.integers(len(v.strategies))
        src = u.strategies[a].output_placements[edge.src_output]
        dst = v.strategies[b].input_placements[edge.dst_input] if v.kind == "op" else v.strategies[b].output_placements[0]
        if v.kind == "op" and v.target in _VIEWS and src != dst and not growing_view(
                edge.tensor.numel, v.outputs[0].numel) and any(
                s.input_placements[edge.dst_input] == src for s in v.strategies):
            assert matrix[a, b] == np.inf  # the view reads src as it is; its readers redistribute
            continue
        plan = plan_redistribute(src, dst, graph.mesh, edge.tensor.shape, edge.tensor.itemsize, graph.profile)
        expected = plan.cost_s
        if v.kind == "grad":  # a gradient reduction pays its share of one bucket's latency
            expected = amortized_cost_s(plan, _share(graph, v.target), graph.mesh, graph.profile)
        assert matrix[a, b] == pytest.approx(expected, rel=1e-12, abs=0)
        checked += 1
    assert checked > 20


_VIEWS = ("aten.t.default", "aten.view.default", "aten._unsafe_view.default", "aten.transpose.int",
          "aten.unsqueeze.default", "aten.expand.default", "aten.permute.default")


def test_a_view_keeps_its_input_layout_where_it_can_and_the_copy_moves_to_its_reader(graph) -> None:
    """A parameter gathered into its ``t`` would stay gathered until the backward
    reads the view; the view rule makes the ``mm`` gather it instead (held one step)."""
    for edge in graph.edges:
        u, v = graph.nodes[edge.src], graph.nodes[edge.dst]
        if u.kind != "param" or v.target != "aten.t.default":
            continue
        matrix = graph.matrices[edge.matrix]
        for a, su in enumerate(u.strategies):
            finite = [b for b in range(len(v.strategies)) if np.isfinite(matrix[a, b])]
            assert finite and all(v.strategies[b].input_placements[0] == su.output_placements[0] for b in finite)


def _share(graph, fqn: str) -> float:
    def nbytes(i: int) -> int:
        return graph.nodes[i].outputs[0].numel * graph.nodes[i].outputs[0].itemsize

    total = sum(nbytes(graph.params[f]) for f in graph.grads)
    return bucket_share(nbytes(graph.params[fqn]), total, graph.bucket_bytes)


def _grad_reduction_costs(graph) -> dict[str, float]:
    """Cost of every gradient edge between the all-reduce placements P(sum)P(sum) -> RR."""
    out = {}
    for edge in graph.edges:
        v, u = graph.nodes[edge.dst], graph.nodes[edge.src]
        if v.kind != "grad":
            continue
        rows = [a for a, s in enumerate(u.strategies) if s.output_placements[edge.src_output] == pp("P(sum)P(sum)")]
        cols = [b for b, s in enumerate(v.strategies) if s.output_placements[0] == pp("RR")]
        if rows and cols:
            out[v.name] = float(graph.matrices[edge.matrix][rows[0], cols[0]])
    return out


def test_gradient_all_reduces_are_priced_with_one_bucket_latency_shared(graph) -> None:
    bucketed = _grad_reduction_costs(graph)
    alone = _grad_reduction_costs(build_graph(trace_joint(*mlp.tiny(device="meta", n_layers=6)), MeshSpec((2, 2)),
                                              load("h100-sxm-80gb"), bucket_bytes=0))
    assert bucketed and bucketed.keys() == alone.keys()
    latency = collective_time_s("all_reduce", 0, (0, 1), graph.mesh, graph.profile)
    # every gradient saves a part of the latency, and all together pay about one
    assert all(bucketed[k] < alone[k] for k in alone)
    saved = sum(alone[k] - bucketed[k] for k in alone)
    assert saved == pytest.approx((len(alone) - sum(_share(graph, k[len("grad:"):]) for k in alone)) * latency, rel=1e-9)


def test_repeated_layers_share_matrices_and_are_tied(graph) -> None:
    assert len(graph.matrices) < len(graph.edges) / 3
    w1 = [graph.params[f"layers.{i}.w1.weight"] for i in range(6)]
    tied = [g for g in graph.ties if w1[2] in g]
    assert tied and w1[3] in tied[0]


def test_no_ties_keeps_the_parameter_gradient_ties(graph) -> None:
    problem = to_problem(graph, ties=False)
    assert problem.ties == graph.required_ties
    assert all(len({graph.nodes[i].kind for i in g}) > 1 for g in problem.ties)


def test_parameter_memory_counts_optimizer_state_and_views_own_nothing(graph) -> None:
    i = graph.params["layers.0.w1.weight"]
    node = graph.nodes[i]
    full = 32 * 16 * 4
    # AdamW in fp32: parameter + two moments, on the all-replicated strategy
    assert node.memory_bytes[0] == 3 * full and node.live is None
    sharded = [k for k, s in enumerate(node.strategies) if "".join(map(str, s.output_placements[0])) == "S(0)S(0)"][0]
    assert node.memory_bytes[sharded] == 3 * full / 4
    views = [n for n in graph.nodes if n.kind == "op" and n.target in ("aten.t.default", "aten.view.default")]
    assert views and all(not n.memory_bytes.any() for n in views)


def test_optimizer_choice_changes_parameter_memory() -> None:
    assert OptimizerMemory("sgd").state_bytes(torch.float32) == 0
    assert OptimizerMemory("adamw").state_bytes(torch.bfloat16) == 4
    assert OptimizerMemory("adamw", mixed_precision=True).state_bytes(torch.bfloat16) == 12
    assert OptimizerMemory("adamw", implementation="foreach").step_temp_bytes(torch.float32) == 4
    with pytest.raises(ValueError, match="unknown 'lion'"):
        OptimizerMemory("lion")


def test_restriction_hook_keeps_what_it_returns(graph) -> None:
    traced = trace_joint(*mlp.tiny(device="meta"))
    small = build_graph(traced, MeshSpec((2, 2)), load("h100-sxm-80gb"), restrict=lambda node, s: s[:2])
    # per recomputation state, at most the two kept placements
    assert all(len(n.strategies) <= 2 * max(1, len(n.states)) for n in small.nodes if n.kind == "op")


# ------------------------------------------------------------------ tensor constants


class _Scaled(torch.nn.Module):
    """``(x @ w) * torch.tensor([1, ..., n])``: one tensor constant of shape (n,)."""

    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8, 8))
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x @ self.w) * torch.tensor([float(i + 1) for i in range(self.n)])).sum()


def test_a_tensor_constant_is_a_leaf_with_every_even_placement_and_no_gradient() -> None:
    traced = trace_joint(_Scaled(), (torch.ones(4, 8),))
    graph = build_graph(traced, MeshSpec((2,)), load("cpu-gloo"))
    assert list(graph.constants) == ["_tensor_constant0"]
    node = graph.nodes[graph.constants["_tensor_constant0"]]
    assert (node.name, node.kind, node.target, node.live) == ("constant:_tensor_constant0", "constant",
                                                              "_tensor_constant0", None)
    assert [str(s.output_placements[0][0]) for s in node.strategies] == ["R", "S(0)"]
    assert list(node.memory_bytes) == [32.0, 16.0]  # held all step, like a buffer
    assert not any(n.kind == "grad" and n.target == "_tensor_constant0" for n in graph.nodes)
    readers = [graph.nodes[e.dst].name for e in graph.edges if e.src == graph.constants["_tensor_constant0"]]
    assert readers == ["lift_fresh_copy"]


def test_the_graph_hash_names_constants_and_stays_the_same_across_traces() -> None:
    from autoshard.plan.fingerprint import graph_hash

    def hashed(n: int) -> str:
        return graph_hash(trace_joint(_Scaled(n), (torch.ones(4, 8),)))

    assert hashed(8) == hashed(8)
    assert hashed(8) != hashed(1)  # a (1,) constant broadcasts: same code, other constant


# ------------------------------------------------------------------ rules that fail


def _registry_with(failing: str) -> RuleRegistry:
    """A registry whose one rule, for ``aten.addmm``, raises in ``failing`` (``strategies`` or
    ``compute``); every other op of the MLP has no rule (replicate-only)."""
    registry = RuleRegistry()

    def broken(call):
        raise ZeroDivisionError("deliberately broken\nover two lines")

    def rows(call):
        return [SingleDimStrategy(S(0), (R, S(0), R))]

    compute = broken if failing == "compute" else (lambda call: OpCompute("matmul", 1.0, 1.0))
    registry.family("demo")(torch.ops.aten.addmm.default, compute=compute)(broken if failing == "strategies" else rows)
    return registry


@pytest.mark.parametrize("failing, what", [("strategies", "enumerate its strategies"),
                                           ("compute", "describe its compute")])
def test_a_failing_rule_is_one_line_naming_the_node_the_op_and_the_call(failing, what, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="autoshard.rules")  # the ops without a rule
    traced = trace_joint(*mlp.tiny(device="meta"))
    with pytest.raises(GraphBuildError) as info:
        build_graph(traced, MeshSpec((2, 2)), load("cpu-gloo"), rules=_registry_with(failing))
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)
    assert message.startswith("graph: node addmm (aten.addmm.default): the sharding rule failed to " + what)
    assert "aten.addmm.default(f32[32], f32[8, 16], f32[16, 32])" in message
    assert "on mesh 2x2: ZeroDivisionError: deliberately broken over two lines" in message


def test_an_expert_exchange_pays_the_steps_cost_per_byte_its_compute_touches() -> None:
    """A profile correction's per-byte cost of an op in a step (``step_byte_s``) is charged to the
    expert-parallel strategies' compute as to every other op (their price is the exchange's own)."""
    import dataclasses

    from costmodel.mesh import MeshSpec
    from hw_profiles import load

    from autoshard.graph.builder import build_graph
    from autoshard.trace import trace_joint
    from benchmarks.common.models import load as load_model

    pytest.importorskip("transformers")
    traced = trace_joint(*load_model("hf.hf_mixtral", {"num_hidden_layers": 1}, device="meta"))
    base = load("h100-sxm-80gb")
    costly = dataclasses.replace(base, device=dataclasses.replace(base.device, step_byte_s=1e-9))
    graphs = [build_graph(traced, MeshSpec((2,), ("ep",)), p, recompute=False) for p in (base, costly)]
    paid = [(n0.compute_s[j], n1.compute_s[j]) for n0, n1 in zip(graphs[0].nodes, graphs[1].nodes)
            for j, s in enumerate(n0.strategies) if s.exchange is not None and s.exchange[0] == "expert_dispatch"]
    priced = [(before, after) for before, after in paid if before > 0]  # the experts ops (not their followers)
    assert priced and all(after > before for before, after in priced)
