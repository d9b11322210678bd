"""A plan priced as FSDP2 runs (``gather="fsdp2"``): its gradient reductions per unit, in FSDP2's
reduce dtype, and a parameter's gathered copies counted once per pass (costmodel.buckets.grouping,
autoshard.program.memory)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from costmodel.buckets.grouping import dtype_itemsize, group_buckets
from costmodel.mesh import MeshSpec
from costmodel.placements import parse_placements as pp
from costmodel.redistribute_steps import RedistributeStep
from hw_profiles import load

from autoshard.program.actions import ProgramNode, build_step_program
from autoshard.program.memory import exact_timeline, param_view_roots, timeline_peak
from autoshard.program.schedule import Schedule
from autoshard.plan.options import SolveOptions

RS = RedistributeStep("reduce_scatter", (0,), 4096, 1e-3, pp("P(sum)"), pp("S(0)"), reduce_op="sum", tensor_dim=0)


def test_units_make_one_bucket_each_issued_with_their_last_gradient():
    # the backward makes layers.1's gradients, the root's output head, layers.0's, then the root's embedding
    order = ["grad:layers.1.w", "grad:layers.1.b", "grad:output.weight", "grad:layers.0.w", "grad:tok.weight"]
    units = {"grad:layers.1.w": "layers.1", "grad:layers.1.b": "layers.1", "grad:output.weight": "",
             "grad:layers.0.w": "layers.0", "grad:tok.weight": ""}
    items = [(name, "torch.bfloat16", [RS]) for name in order]
    buckets = group_buckets(items, MeshSpec((2,)), load("cpu-gloo"), cap=0, units=units)
    # the root's bucket waits for its last gradient: it is issued last, whatever the cap (0: none)
    assert [b.members for b in buckets] == [("grad:layers.1.w", "grad:layers.1.b"), ("grad:layers.0.w",),
                                            ("grad:output.weight", "grad:tok.weight")]
    assert [b.bytes for b in buckets] == [8192, 4096, 8192]
    assert group_buckets(items, MeshSpec((2,)), load("cpu-gloo"), cap=0) == ()  # without units: the cap rules


def test_a_reduce_dtype_casts_the_payload_and_the_collective_carries_it():
    items = [(f"grad:layers.0.w{k}", "torch.bfloat16", [RS]) for k in range(3)]
    units = {name: "layers.0" for name, _, _ in items}
    profile = load("cpu-gloo")
    (plain,) = group_buckets(items, MeshSpec((2,)), profile, units=units)
    (fp32,) = group_buckets(items, MeshSpec((2,)), profile, units=units, reduce_dtype="float32")
    assert (plain.dtype, plain.bytes) == ("torch.bfloat16", 3 * 4096)
    assert (fp32.dtype, fp32.bytes) == ("float32", 2 * 3 * 4096)
    assert fp32.cost_s > plain.cost_s and fp32.pack_s > plain.pack_s
    assert dtype_itemsize("torch.float16") == 2
    with pytest.raises(ValueError, match="int8"):
        dtype_itemsize("int8")


def test_reduce_dtype_is_refused_where_autoshards_runtime_would_run_the_plan():
    with pytest.raises(ValueError, match="gather='fsdp2'"):
        SolveOptions(reduce_dtype="float32")
    with pytest.raises(ValueError, match="expected one of"):
        SolveOptions(gather="fsdp2", reduce_dtype="fp31")
    assert SolveOptions(gather="fsdp2", reduce_dtype="float32").reduce_dtype == "float32"


def _graph_with_a_weight_read_twice():
    """param ``w`` (64 bytes), its transpose ``t``, and two readers gathering ``w`` and ``t`` over [2, 6)."""
    node = lambda name, kind, target="": SimpleNamespace(name=name, kind=kind, target=target, strategies=())
    nodes = [node("param:w", "param"), node("t", "op", "aten.t.default"), node("mm", "op", "aten.mm.default"),
             node("mm_1", "op", "aten.mm.default")]
    edge = lambda src, dst: SimpleNamespace(src=src, dst=dst, src_output=0, dst_input=0, shape=(4, 4), itemsize=4,
                                            copy_live=((2, 6),), copy_live_recomputed=())
    graph = SimpleNamespace(nodes=nodes, edges=[edge(0, 1), edge(0, 2), edge(1, 3)], mesh=SimpleNamespace(shape=(2,)))
    problem = SimpleNamespace(nodes=[SimpleNamespace(memory_bytes=np.array([32.0]), live=None)]
                              + [SimpleNamespace(memory_bytes=np.array([0.0]), live=(0, 8)) for _ in range(3)])
    copies = [(1, pp("R"), False), (2, pp("R"), False)]  # the reader of w and the reader of t gather
    return graph, problem, copies


def test_a_parameters_copies_in_one_pass_count_once_as_fsdp2_gathers_it_once():
    graph, problem, copies = _graph_with_a_weight_read_twice()
    roots = param_view_roots(graph, {"aten.t.default"})
    assert roots == {0: 0, 1: 0}
    ops = [ProgramNode("t", ("param:w",)), ProgramNode("mm", ("param:w",)), ProgramNode("mm_1", ("t",))]
    program = build_step_program(ops, Schedule(3, 0, ()), keep={"mm", "mm_1"})
    per_reader = exact_timeline(graph, problem, [0] * 4, copies, (), program=program)
    fsdp2 = exact_timeline(graph, problem, [0] * 4, copies, (), program=program, param_views=roots)
    assert timeline_peak(per_reader) == 32 + 2 * 64  # the runtime's per-reader gathers: two tensors
    assert timeline_peak(fsdp2) == 32 + 64  # FSDP2: one unsharded parameter, the transpose a view of it


def test_an_fsdp2_priced_plan_reduces_each_block_in_fp32():

    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import llama3

    model, inputs = llama3.tiny(device="meta", dtype="bfloat16", batch_size=4)
    plans = {}
    for reduce_dtype in (None, "float32"):
        prep = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo", gather="fsdp2", reduce_dtype=reduce_dtype,
                       recompute="none")
        plans[reduce_dtype] = solve_prepared(prep, baseline="fsdp", time_limit=10)
    plain, fp32 = plans[None], plans["float32"]
    units = [{".".join(m.split(":")[1].split(".")[:2]) if m.startswith("grad:layers.") else "" for m in b.members}
             for b in fp32.buckets]
    assert all(len(u) == 1 for u in units)  # a bucket is one unit's
    assert sorted(u.pop() for u in units) == ["", "layers.0", "layers.1"]  # one per block, and the root's
    assert {b.dtype for b in fp32.buckets} == {"float32"} and {b.dtype for b in plain.buckets} == {"torch.bfloat16"}
    assert [b.bytes for b in fp32.buckets] == [2 * b.bytes for b in plain.buckets]
    assert fp32.options["reduce_dtype"] == "float32" and "reduce_dtype" not in plain.options
    assert fp32.estimate.comm_s > plain.estimate.comm_s
    assert fp32.estimate.peak_memory_bytes >= plain.estimate.peak_memory_bytes


def test_with_mixed_precision_fsdp2_holds_the_fp32_shard_and_fp32_reduced_gradients():
    # FSDP2 keeps the fp32 shard itself (the all-gather casts it to bf16), not a bf16 shard beside a master copy,
    # and reduces into fp32 gradient shards: 12 + 4 bytes per element and rank for AdamW, as the reader's 14 + 2
    from autoshard.search.solve import prepare
    from examples.models import llama3

    model, inputs = llama3.tiny(device="meta", dtype="bfloat16", batch_size=4)
    sizes = {}
    for gather, reduce_dtype in (("reader", None), ("fsdp2", "float32")):
        graph = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo", gather=gather, reduce_dtype=reduce_dtype,
                        mixed_precision=True, recompute="none").graph
        wq = graph.nodes[graph.params["layers.0.attention.wq.weight"]]
        k = next(k for k, s in enumerate(wq.strategies) if str(s.output_placements[0][0]) == "S(0)")
        grad = next(n for n in graph.nodes if n.name == "grad:layers.0.attention.wq.weight")
        sizes[gather] = (wq.memory_bytes[k], grad.memory_bytes[k])
    per_rank = 64 * 64 // 4  # wq of dim 64, sharded 4 ways
    assert sizes["reader"] == (per_rank * (2 + 12), per_rank * 2)
    assert sizes["fsdp2"] == (per_rank * 12, per_rank * 4)


def test_the_programs_bound_is_above_the_exact_peak_when_priced_as_fsdp2_reduces():
    # the integer program charges FSDP2's reductions an upper bound (autoshard.graph.tied_memory): its
    # memory at the plan's choice, bound nodes in, copies out, is never below the exact timeline's peak
    from autoshard.search.solve import prepare, solve_prepared
    from benchmarks.memory_fidelity import plan_choice
    from examples.models import llama3

    model, inputs = llama3.tiny(device="meta", dtype="bfloat16", batch_size=4)
    prep = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo", gather="fsdp2", reduce_dtype="float32",
                   mixed_precision=True, recompute="none")
    plan = solve_prepared(prep, baseline="fsdp", time_limit=10)
    events: dict[int, float] = {}
    always = 0.0
    for node, k in zip(prep.graph.nodes, plan_choice(prep.graph, plan)):
        m = float(node.memory_bytes[k])
        if node.live is None:
            always += m
        elif m:
            events[node.live[0]] = events.get(node.live[0], 0.0) + m
            events[node.live[1]] = events.get(node.live[1], 0.0) - m
    level, program = always, always
    for t in sorted(events):
        level += events[t]
        program = max(program, level)
    assert program >= plan.estimate.peak_memory_bytes
    # and the bound follows FSDP2's order: a block's gradients wait for its reduction, whose payload
    # is held until the next block's reduction (the exact timeline's rule), not one step
    graph = prep.graph
    producer = {graph.nodes[e.dst].target: graph.nodes[e.src].name for e in graph.edges
                if graph.nodes[e.dst].kind == "grad"}
    live = {n.name: n.live for n in graph.nodes if n.kind == "memory"}
    spans = {}
    for unit in ("layers.1", "layers.0"):
        names = [producer[f] for f in producer if f.startswith(unit + ".")]
        payloads = {live[f"memory:payload:{n}"] for n in names if f"memory:payload:{n}" in live}
        waits = {live[f"memory:waiting:{n}"][1] for n in names if f"memory:waiting:{n}" in live}
        assert len(payloads) == 1 and waits == {next(iter(payloads))[0] + 1}, (unit, payloads, waits)
        spans[unit] = next(iter(payloads))
    assert spans["layers.1"][1] == spans["layers.0"][0] > spans["layers.1"][0] + 1  # held until the next unit's
