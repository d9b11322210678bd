r"""Traced joint graph + op rules + cost model -> the strategy graph of a training step.

Nodes (one per tensor-producing op of the joint graph, plus leaves and sinks):

- **op**: every ATen call except tuple access (``getitem`` reads output k of
  its producer, so readers are wired to that output directly). Strategies
  from the rules; cost = compute time of the busiest rank's local shard
  (``costmodel.compute.op_time_s`` of the rule's ``OpCompute``, with the
  innermost contiguous run and the scalar-operand flag that
  ``autoshard.graph.access`` reads off the traced tensors' strides: the same
  for every strategy, sharding keeps the layout); memory = its outputs' local
  bytes over their live interval (views own none).
- **param / buffer / input / constant / tangent**: the graph's leaves.
  Strategies = every even placement of the whole tensor
  (``autoshard.graph.placements``); the tangent (d loss / d loss, a scalar)
  is replicated. A constant is a tensor the forward made from Python data
  (``TracedGraph.constants``): like a buffer, it is held all step and has no
  gradient. A parameter holds its
  shard and optimizer state all step, and its cost is the optimizer update on
  its shard. An input's shard is held all step too (the training loop keeps
  its batch until the step ends).
- **grad** sinks: one per parameter with a gradient. The gradient must leave
  the graph in the parameter's placement, already reduced: the sink is tied to
  the parameter (same strategy index) and the edge from the op making the
  gradient prices the redistribution (``P(sum) -> S(0)`` is FSDP's
  reduce_scatter, ``P(sum) -> R`` DDP's all_reduce). The sink holds the
  gradient shard from then to the optimizer step.
- **opt_temp**: what the optimizer step allocates for a parameter beyond its
  state (``OptimizerMemory.step_temp_bytes``), tied to the parameter, live at
  the step only.
- **buffer update** sinks (tied to their buffer) and one **loss** sink (the
  loss is returned replicated, equal on every rank).

- **memory** nodes: memory-only nodes tied to the node whose choice they
  follow (``autoshard.graph.tied_memory``): the pieces of a recomputable
  value's memory, and upper bounds on redistributed copies and gradient
  bucket payloads (``autoshard.graph.copies``).

Recomputation (``recompute=True``, the default): the forward ops of each
repeated block that may be recomputed get one copy of their strategy list
per state (keep / hold / recompute), priced as they would run
(``autoshard.graph.recompute``, regions from ``autoshard.graph.regions``).

Edges: one per (reader, tensor input), matrix from ``autoshard.graph.edges``;
on an edge into a view, a redistribution is allowed only where the view
cannot read the producer's placement as it is, except into a growing view
(``expand``), whose input is the cheaper side to copy (``autoshard.graph.copies``).

Ties: the parameter/sink pairs always; repeated layers
(``autoshard.graph.ties``) when ``ties=True``.

A rule that raises while it enumerates a call's strategies or describes its
compute stops the build with one :class:`GraphBuildError` line naming the fx
node, the op and the call's arguments (tensors as ``f32[8, 4]``): the model
is fine, the rule is not, and the user needs to know which call to report.

This module is the walk over the traced graph (time axis, leaves, ops, sinks,
ties, in that order); what one node is (its strategies, compute, memory and
edges) is :class:`autoshard.graph.build_state.BuildState`.

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> from costmodel.mesh import MeshSpec
>>> from hw_profiles import load
>>> g = build_graph(trace_joint(*mlp.tiny(device="meta")), MeshSpec((2,)), load("h100-sxm-80gb"))
>>> g.nodes[g.params["layers.0.w1.weight"]].kind, len(g.matrices) <= len(g.edges)
('param', True)
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.fx as fx

from costmodel.buckets.grouping import DEFAULT_BUCKET_BYTES, bucket_share, dtype_itemsize
from costmodel.compute import op_time_s
from costmodel.expert_parallel import DEFAULT_IMBALANCE
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

from autoshard.graph.build_state import BuildState, GraphBuildError, Restrict
from autoshard.graph.copies import copy_intervals, growing_view, param_gather_schedule
from autoshard.graph.liveness import alias_ends, compute_liveness, is_view_op
from autoshard.graph.memory import OptimizerMemory, local_bytes
from autoshard.graph.node_ids import LOSS, TANGENT, MemoryPieceId, TensorId
from autoshard.graph.placements import replicated
from autoshard.graph.recompute import reader_span
from autoshard.graph.regions import RegionAnalysis, analyse_regions
from autoshard.graph.states import RECOMPUTE
from autoshard.graph.strategy_graph import NODE_KINDS, BuildStats, GraphEdge, GraphNode, StrategyGraph
from autoshard.graph.tied_memory import BOUND, TiedMemory
from autoshard.graph.ties import repeated_groups
from autoshard.rules import OpStrategy, RuleRegistry, TensorMeta, load_rules
from autoshard.rules.expand import exchange_memory, exchange_pricer
from autoshard.trace import TracedGraph, tensor_arg_nodes

_EXCHANGE_PART = 99
"""Part number of an exchange's temporaries among its op's ``in`` bounds (those count from 0 by interval)."""

__all__ = ["NODE_KINDS", "GraphBuildError", "GraphNode", "GraphEdge", "BuildStats", "StrategyGraph", "build_graph"]


def build_graph(
    traced: TracedGraph,
    mesh: MeshSpec,
    profile: HardwareProfile,
    *,
    rules: RuleRegistry | None = None,
    optimizer: OptimizerMemory | None = None,
    ties: bool = True,
    allow_uneven: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    restrict: Restrict | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    recompute: bool = True,
    gather: str = "reader",
    reduce_dtype: str | None = None,
    expert_imbalance: float = DEFAULT_IMBALANCE,
) -> StrategyGraph:
    """The strategy graph of ``traced`` on ``mesh`` priced with ``profile`` (module docstring).

    ``optimizer``: what the optimizer holds and costs (AdamW by default);
    ``ties``: tie repeated layers; ``allow_uneven``: let rules split tensor
    dims that the mesh dim size does not divide; ``on_progress(done, total)``
    is called as op nodes are built; ``restrict(fx_node, strategies)`` returns
    the strategies to keep for an op node (a search-space restriction: the
    result is then optimal only over what it keeps); ``bucket_bytes``: the
    runtime's gradient bucket cap, which prices gradient reductions
    (``costmodel.buckets.grouping``; 0 = one collective per gradient);
    ``recompute``: give the forward ops of repeated blocks recomputation
    states (``autoshard.graph.recompute``; a model without repeated blocks
    gets none either way); ``gather``: when parameter copies are held
    (``autoshard.graph.copies``: ``reader``, as autoshard's runtime gathers,
    or ``fsdp2``, as FSDP2 does: then gradients are also reduced per unit,
    in ``reduce_dtype`` when given, ``costmodel.buckets.grouping``);
    ``expert_imbalance``: the busiest expert-parallel rank's routed tokens over the mean,
    which prices a strategy with an exchange (:func:`_price_exchanges`).
    """
    if not expert_imbalance >= 1.0:
        raise ValueError(f"expert_imbalance: {expert_imbalance} is below 1 (the busiest rank gets at least the mean)")
    rules = rules or load_rules()
    optimizer = optimizer or OptimizerMemory()
    b = BuildState(traced, mesh, profile, rules, optimizer, allow_uneven, restrict)
    walk = _time_axis(b, traced, recompute, gather)
    fx_nodes = [n for n in traced.graph_module.graph.nodes if n.op in ("placeholder", "get_attr", "call_function")]
    total_ops = sum(1 for n in fx_nodes if n.op == "call_function")
    done = 0
    for node in fx_nodes:
        if node.op == "get_attr":
            _add_constant(b, walk, node)
        elif node.op == "placeholder":
            _add_leaf(b, walk, node)
        elif node.target is operator.getitem:
            src, _ = b.read(node.args[0].name)
            b.producer[node.name] = (src, int(node.args[1]))
        elif isinstance(node.meta.get("val"), (torch.Tensor, tuple, list)):  # else no tensor made (symbolic sizes)
            _add_op(b, walk, node, expert_imbalance)
            done += 1
            if on_progress is not None and done % 64 == 0:
                on_progress(done, total_ops)
    if on_progress is not None:
        on_progress(total_ops, total_ops)
    grads = _add_sinks(b, walk, bucket_bytes, gather, reduce_dtype)
    return _finish(b, walk, grads, ties=ties, bucket_bytes=bucket_bytes)


@dataclass(slots=True)
class _Walk:
    """What the steps of :func:`build_graph` share: the time axis, the names of the
    graph's leaves, and the nodes made so far for them."""

    traced: TracedGraph
    liveness: Any
    """``autoshard.graph.liveness`` of the graph (with recomputation phases when asked)."""
    alias_end: Mapping[str, int]
    param_copy_live: Any
    """When gathered parameter copies are held (``autoshard.graph.copies``), or None."""
    leaf_names: Mapping[fx.Node, tuple[str, str]] = field(default_factory=dict)
    """Placeholder or attribute -> (kind, name): ``param``, ``buffer``, ``input``, ``constant``."""
    params: dict[str, int] = field(default_factory=dict)
    buffers: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, int] = field(default_factory=dict)
    constants: dict[str, int] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.liveness.end


def _time_axis(b: BuildState, traced: TracedGraph, recompute: bool, gather: str) -> _Walk:
    """Step 1: liveness on the step's time axis (with the recomputation phases of
    the checkpoint regions when ``recompute``), aliases' ends, the parameter gather schedule."""
    gm = traced.graph_module
    kept = {traced.loss.name} | {n.name for n in traced.buffer_updates.values()}
    liveness = compute_liveness(gm, outputs_live_to_end=frozenset(kept))
    if recompute:
        b.analysis = analyse_regions(traced, liveness)
        liveness = b.analysis.liveness  # the time axis with the recomputation phases
    b.tied = TiedMemory(b, b.analysis)
    leaf_names = {node: (kind, name) for kind, table in (("param", traced.params), ("buffer", traced.buffers),
                                                         ("input", traced.inputs),
                                                         ("constant", getattr(traced, "constants", {})))
                  for name, node in table.items()}
    return _Walk(traced, liveness, alias_ends(gm, liveness), param_gather_schedule(traced, liveness, gather),
                 leaf_names)


def _add_constant(b: BuildState, walk: _Walk, node: fx.Node) -> None:
    """Step 2a: a tensor the forward made from Python data, held all step like a buffer, no gradient."""
    kind, name = walk.leaf_names.get(node, ("", ""))
    if kind != "constant":
        raise GraphBuildError(f"graph: {node.name} reads attribute {node.target!r}, which the trace does not "
                              "list as a tensor constant")
    i = b.leaf(str(TensorId("constant", name)), "constant", name, TensorMeta.of(node.meta.get("val")), live=None)
    walk.constants[name] = i
    b.fx_index[node.name] = i
    b.producer[node.name] = (i, 0)


def _add_leaf(b: BuildState, walk: _Walk, node: fx.Node) -> None:
    """Step 2b: a placeholder: a parameter (with its optimizer temporary), a buffer, an input or the loss tangent."""
    optimizer, profile, end = b.optimizer, b.profile, walk.end
    meta = TensorMeta.of(node.meta.get("val"))
    kind, name = walk.leaf_names.get(node, ("tangent", "tangent"))
    if kind == "param":
        fqn = name
        numel_dtype = meta.dtype

        def update_cost(numel: int, dtype: torch.dtype = numel_dtype) -> float:
            return optimizer.update_time_s(numel, dtype, profile)

        per_byte = 1.0 + optimizer.state_bytes(meta.dtype) / meta.itemsize
        if walk.param_copy_live is not None and optimizer.mixed_precision:  # priced as FSDP2 holds it
            per_byte = optimizer.fsdp2_shard_bytes() / meta.itemsize
        i = b.leaf(str(TensorId("param", fqn)), "param", fqn, meta, live=None, memory_per_byte=per_byte, cost=update_cost)
        walk.params[fqn] = i
        temp = optimizer.step_temp_bytes(meta.dtype) / meta.itemsize
        if temp:  # held during the optimizer step only, laid out like the parameter
            t = b.leaf(str(TensorId("opt_temp", fqn)), "opt_temp", fqn, meta, live=(end, end + 1), memory_per_byte=temp)
            b.union.union(i, t)
    elif kind == "buffer":
        i = b.leaf(str(TensorId("buffer", name)), "buffer", name, meta, live=None)
        walk.buffers[name] = i
    elif kind == "input":  # the caller holds its batch for the whole step
        i = b.leaf(str(TensorId("input", name)), "input", name, meta, live=(0, end + 1))
        walk.inputs[name] = i
    else:  # the loss tangent
        i = b.leaf(str(TANGENT), TANGENT.kind, "tangent", meta, live=walk.liveness.intervals[node.name],
                   placements=(replicated(len(b.mesh.shape)),))
    b.fx_index[node.name] = i
    b.producer[node.name] = (i, 0)


def _add_op(b: BuildState, walk: _Walk, node: fx.Node, expert_imbalance: float = DEFAULT_IMBALANCE) -> None:
    """Step 2c: an op node, its input edges, and the copies a redistribution of each input holds."""
    liveness, analysis = walk.liveness, b.analysis
    owner = liveness.owner[node.name]
    i = b.op_node(node, liveness.intervals[owner] if owner == node.name else (liveness.time[node.name],) * 2,
                  owns_memory=owner == node.name)
    _price_exchanges(b, i, node, expert_imbalance)
    b.fx_index[node.name] = i
    b.producer[node.name] = (i, 0)
    view = is_view_op(node.target)
    as_it_comes = view and not _grows(b, node)  # copies.view_copy_rule; a growing view's copy may come before it
    span = reader_span(analysis, node.name, liveness.time[node.name], walk.alias_end[node.name] if view else None,
                       _forward_end(analysis, node.name))
    recomputed = RECOMPUTE in b.nodes[i].states
    copies, lives = [], []
    for position, arg in enumerate(tensor_arg_nodes(node)):
        src, out = b.read(arg.name)
        copies.append(b.edge(src, out, i, position, lambda s, position=position: s.input_placements[position],
                             view=as_it_comes, src_fx=b.nodes[src].name if b.nodes[src].kind == "op" else None))
        live = (copy_intervals(span, False), copy_intervals(span, True) if recomputed else ())
        if walk.param_copy_live is not None and liveness.owner[arg.name] in walk.param_copy_live.params:
            gathered = (walk.param_copy_live(node.name),)  # a parameter's gather, on the schedule asked for
            live = (gathered, gathered if recomputed else ())
        lives.append(live)
        b.copy_live.append(live[0])
        b.copy_live_recomputed.append(live[1])
    b.tied.input_copies(i, copies, lives)
    _exchange_temporaries(b, i, node, liveness.time[node.name], expert_imbalance)


def _grows(b: BuildState, node: fx.Node) -> bool:
    """Whether view ``node``'s output has more elements than its first tensor input
    (``autoshard.graph.copies.growing_view``: ``expand``)."""
    info = b.traced.nodes.get(node.name)
    if info is None or not info.inputs or not info.outputs or info.outputs[0] is None:
        return False
    return growing_view(info.inputs[0].numel, info.outputs[0].numel)


def _price_exchanges(b: BuildState, i: int, node: fx.Node, imbalance: float) -> None:
    """Strategies with an exchange are not local ops: their price is the exchange's, from the
    price function its kind registered (``autoshard.rules.expand.exchange_pricer``; experts:
    ``autoshard.rules.experts.exchange_strategy_price``, compute at the imbalanced load plus the
    exchanges on the strategy's mesh dim; context parallelism:
    ``autoshard.rules.context_parallel.context_exchange_price``, the simulated gather and
    chunks), not the rule's compute on local shards. A recomputed state runs the forward,
    exchanges included, twice."""
    n = b.nodes[i]
    if all(s.exchange is None for s in n.strategies):
        return  # every node without an exchange: its price untouched
    info = b.traced.nodes[node.name]
    call = b.rules.op_call(info.op, info.args, info.kwargs, out_meta=info.outputs)
    dtype = str(info.inputs[0].dtype) if info.inputs else "torch.float32"
    base = len(n.strategies) // max(1, len(n.states))
    compute = np.array(n.compute_s, dtype=np.float64)  # a copy: the array may be shared by signature
    for j, s in enumerate(n.strategies):
        if s.exchange is None:
            continue
        try:
            pricer = exchange_pricer(s.exchange[0])
        except KeyError as exc:
            raise GraphBuildError(f"graph: node {node.name}: {exc.args[0]}") from None
        work, exchange_s = pricer(call, s, mesh=b.mesh, profile=b.profile, imbalance=imbalance)
        seconds = 0.0 if work is None else _work_time_s(work, dtype, b.profile)
        again = 2.0 if n.states and n.states[j // base] == RECOMPUTE else 1.0
        in_step = b.profile.device.in_step_s(0.0 if work is None else work.bytes_accessed)
        compute[j] = again * (in_step + seconds + exchange_s)
    b.nodes[i] = replace(n, compute_s=compute)


def _exchange_temporaries(b: BuildState, i: int, node: fx.Node, time: int, imbalance: float) -> None:
    """What an exchange holds beside its op while it runs (the function its kind registered,
    ``autoshard.rules.expand.exchange_memory``; context parallelism: the gathered K/V; experts:
    the dispatched tokens at the imbalanced capacity): a tied
    memory-only bound over the op's time, so the memory limit sees it. A bound, as a reader's
    input copies are: the assembler does not count it into the plan's memory."""
    n = b.nodes[i]
    held = [None if s.exchange is None else exchange_memory(s.exchange[0]) for s in n.strategies]
    if all(f is None for f in held):
        return
    info = b.traced.nodes[node.name]
    call = b.rules.op_call(info.op, info.args, info.kwargs, out_meta=info.outputs)
    memory = np.array([0 if f is None else f(call, s, mesh=b.mesh, profile=b.profile, imbalance=imbalance)
                       for f, s in zip(held, n.strategies)],
                      dtype=np.float64)
    name = str(MemoryPieceId("in", n.name, _EXCHANGE_PART))
    j = b.add(GraphNode(name, "memory", BOUND, n.strategies, np.zeros(len(n.strategies)), memory, (time, time + 1),
                        (), f"memory|exchange|{n.signature}", n.states, n.region))
    b.union.union(i, j)


def _work_time_s(work: Any, dtype: str, profile: HardwareProfile) -> float:
    """An exchange's ``OpCompute`` in seconds (fp32 where the profile has no peak for ``dtype``, as ops are)."""
    try:
        return op_time_s(work.kind, flops=work.flops, bytes_accessed=work.bytes_accessed, dtype=dtype, profile=profile)
    except ValueError:
        return op_time_s(work.kind, flops=work.flops, bytes_accessed=work.bytes_accessed, dtype="torch.float32",
                         profile=profile)


def _same_placement(s: OpStrategy) -> Any:
    return s.output_placements[0]


def _add_sinks(b: BuildState, walk: _Walk, bucket_bytes: int, gather: str = "reader",
               reduce_dtype: str | None = None) -> dict[str, int]:
    """Step 3: the sinks (gradients, buffer updates, the loss) and the gradients' payloads; the gradient sinks."""
    traced, liveness, end, mesh = walk.traced, walk.liveness, walk.end, b.mesh
    grads: dict[str, int] = {}
    producers: list[tuple[int, int, float]] = []
    grad_bytes = {fqn: TensorMeta(b.nodes[walk.params[fqn]].outputs[0].shape, g.meta["val"].dtype).numel
                  * g.meta["val"].dtype.itemsize for fqn, g in traced.grads.items() if g is not None}
    total_grad_bytes = sum(grad_bytes.values())
    for fqn, gnode in traced.grads.items():
        if gnode is None:
            continue
        param = b.nodes[walk.params[fqn]]
        meta = TensorMeta(param.outputs[0].shape, gnode.meta["val"].dtype)
        held = meta  # priced as FSDP2 reduces: the reduced shard is in the reduce dtype
        if gather == "fsdp2" and reduce_dtype:
            held = TensorMeta(param.outputs[0].shape, getattr(torch, reduce_dtype.removeprefix("torch.")))
        # the op's output *is* the gradient while it is made (autograd hands it to
        # .grad without a copy): the sink holds it from the next time on
        start = liveness.time[gnode.name] + 1
        sink = b.add(GraphNode(
            str(TensorId("grad", fqn)), "grad", fqn, param.strategies, np.zeros(len(param.strategies)),
            np.array([local_bytes(held, s.output_placements[0], mesh.shape) for s in param.strategies],
                     dtype=np.float64),
            (start, end + 1), (meta,), f"grad|{param.signature}",
        ))
        src, out = b.read(gnode.name)
        b.edge(src, out, sink, 0, _same_placement,
               share=bucket_share(grad_bytes[fqn], total_grad_bytes, bucket_bytes))
        b.copy_live.append(())  # the reduction's output is the sink's own memory
        b.copy_live_recomputed.append(())
        b.union.union(walk.params[fqn], sink)
        grads[fqn] = sink
        producers.append((src, liveness.time[gnode.name], float(grad_bytes[fqn])))
    for fqn, unode in traced.buffer_updates.items():
        buffer = b.nodes[walk.buffers[fqn]]
        sink = b.add(GraphNode(
            str(TensorId("buffer_update", fqn)), "buffer_update", fqn, buffer.strategies, np.zeros(len(buffer.strategies)),
            np.zeros(len(buffer.strategies)), None, buffer.outputs, f"buffer_update|{buffer.signature}",
        ))
        src, out = b.read(unode.name)
        b.edge(src, out, sink, 0, _same_placement)
        b.copy_live.append(())
        b.copy_live_recomputed.append(())
        b.union.union(walk.buffers[fqn], sink)
    rep = replicated(len(mesh.shape))
    loss_meta = TensorMeta.of(traced.loss.meta["val"])
    sink = b.add(GraphNode(str(LOSS), LOSS.kind, "loss", (OpStrategy((rep,), (rep,)),), np.zeros(1), np.zeros(1),
                           None, (loss_meta,), "loss"))
    src, out = b.read(traced.loss.name)
    b.edge(src, out, sink, 0, _same_placement)
    b.copy_live.append(())
    b.copy_live_recomputed.append(())
    if gather == "fsdp2":  # FSDP2 reduces each unit's gradients together, cast to its reduce dtype
        blocks = tuple(walk.traced.blocks)
        units = [next((u for u in blocks if fqn == u or fqn.startswith(u + ".")), "") for fqn in grads]
        itemsize = {g.meta["val"].dtype.itemsize for g in traced.grads.values() if g is not None}
        scale = dtype_itemsize(reduce_dtype) / min(itemsize) if reduce_dtype and itemsize else 1.0  # a bound
        spans = walk.param_copy_live.spans  # a unit reduces after its backward; the root's copies live all step
        ends = {u: spans.backward.get(u, (0, 0))[1] for u in spans.order} | {"": spans.end}
        b.tied.gradient_payloads(producers, bucket_bytes, units=units, scale=scale, backward_end=ends)
    else:
        b.tied.gradient_payloads(producers, bucket_bytes)
    return grads


def _finish(b: BuildState, walk: _Walk, grads: dict[str, int], *, ties: bool, bucket_bytes: int) -> StrategyGraph:
    """Step 4: tie repeated layers (and their copies), count, and freeze the graph."""
    traced = walk.traced
    start = time.perf_counter()
    required = tuple(tuple(g) for g in b.union.groups())
    if ties:
        _tie_repeated(b, traced.graph_module)
        b.tied.tie_copies()
    groups = tuple(tuple(g) for g in b.union.groups())
    b.seconds["ties"] = time.perf_counter() - start
    counts = [len(n.strategies) for n in b.nodes if n.kind == "op"]
    stats = BuildStats(
        seconds=dict(b.seconds), op_nodes=len(counts),
        strategies_mean=float(np.mean(counts)) if counts else 0.0, strategies_max=max(counts, default=0),
        pairs_planned=b.pricer.pairs_planned, uncovered_ops=tuple(sorted(b.uncovered)),
    )
    return StrategyGraph(
        mesh=b.mesh, profile=b.profile, nodes=tuple(b.nodes), edges=tuple(b.edges),
        matrices=tuple(b.pricer.matrices), ties=groups, required_ties=required, index=dict(b.index),
        params=walk.params, grads=grads, inputs=walk.inputs, buffers=walk.buffers,
        param_aliases=dict(getattr(traced, "param_aliases", {}) or {}), end_time=walk.end, optimizer=b.optimizer,
        stats=stats, bucket_bytes=int(bucket_bytes), constants=walk.constants, regions=b.analysis.regions,
        copy_live=tuple(b.copy_live), copy_live_recomputed=tuple(b.copy_live_recomputed),
        follows={b.index[name]: b.index[m.follows] for name, m in b.analysis.members.items()
                 if m.follows is not None and name in b.index and m.follows in b.index},
        times=dict(walk.liveness.time),
    )


def _forward_end(analysis: RegionAnalysis, name: str) -> int | None:
    member = analysis.members.get(name)
    return None if member is None else member.forward_end + 1


def _tie_repeated(b: BuildState, gm: fx.GraphModule) -> None:
    """Union the nodes that repeated-layer detection groups (same strategy list only)."""

    def signature(node: fx.Node) -> str:
        i = b.fx_index.get(node.name)
        if i is not None:
            n = b.nodes[i]
            return n.kind + "|" + n.signature
        return f"{node.op}|{node.target}|{node.args[1:] if node.target is operator.getitem else ''}"

    for group in repeated_groups(gm, signature):
        members = [b.fx_index[name] for name in group if name in b.fx_index]
        members = [m for m in members if b.nodes[m].kind in ("op", "param", "buffer")]
        for m in members[1:]:
            if b.nodes[m].signature == b.nodes[members[0]].signature:
                b.union.union(members[0], m)
