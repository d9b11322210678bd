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
cannot read the producer's placement as it is (``autoshard.graph.copies``).

Ties: the parameter/sink pairs always; repeated layers
(``autoshard.graph.ties``) when ``ties=True``.

A rule that raises while it enumerates a call's strategies or describes its
compute stops the build with one :class:`GraphBuildError` line naming the fx
node, the op and the call's arguments (tensors as ``f32[8, 4]``): the model
is fine, the rule is not, and the user needs to know which call to report.

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> from costmodel.mesh import MeshSpec
>>> from hw_profiles import load
>>> g = build_graph(trace_joint(*mlp.tiny(device="meta")), MeshSpec((2,)), load("h100-sxm-80gb"))
>>> g.nodes[g.params["layers.0.w1.weight"]].kind, len(g.matrices) <= len(g.edges)
('param', True)
"""

from __future__ import annotations

import hashlib
import logging
import operator
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.fx as fx

from costmodel.bucketing import DEFAULT_BUCKET_BYTES, bucket_share, dtype_itemsize
from costmodel.compute import op_time_s
from costmodel.mesh import MeshSpec
from costmodel.placements import Placement
from hw_profiles import HardwareProfile

from autoshard.graph.copies import copy_intervals, param_gather_schedule, view_copy_rule
from autoshard.graph.edges import EdgePricer
from autoshard.graph.liveness import alias_ends, compute_liveness, is_view_op
from autoshard.graph.memory import OptimizerMemory, local_bytes
from autoshard.graph.node_ids import LOSS, TANGENT, OpId, TensorId
from autoshard.graph.placements import leaf_placements, replicated
from autoshard.graph.recompute import edge_rule, expand_compute, expand_memory, reader_span, state_signature
from autoshard.graph.regions import RegionAnalysis, analyse_regions
from autoshard.graph.states import RECOMPUTE
from autoshard.graph.strategy_graph import NODE_KINDS, BuildStats, GraphEdge, GraphNode, StrategyGraph
from autoshard.graph.tied_memory import InputCopy, TiedMemory
from autoshard.graph.ties import UnionFind, repeated_groups
from autoshard.rules import OpStrategy, RuleError, RuleRegistry, TensorMeta, load_rules, op_name
from autoshard.trace import TracedGraph, tensor_arg_nodes

__all__ = ["NODE_KINDS", "GraphBuildError", "GraphNode", "GraphEdge", "BuildStats", "StrategyGraph", "build_graph",
           "describe_call"]

log = logging.getLogger(__name__)

Restrict = Callable[[fx.Node, tuple[OpStrategy, ...]], "tuple[OpStrategy, ...] | list[OpStrategy]"]
"""Keeps a subset of an op node's strategies (``build_graph(restrict=...)``)."""

class GraphBuildError(ValueError):
    """A rule failed on one call of the graph; the message is one line naming the node, the op and the call."""


_DTYPE_SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
                torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                torch.bool: "b8"}


def describe_call(op: Any, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """``aten.index_select.default(f32[8, 4], 0, i64[])``: an op's call with tensors as dtype and shape.

    >>> describe_call(torch.ops.aten.index_select.default,
    ...               (TensorMeta((8, 4), torch.float32), 0, TensorMeta((), torch.int64)), {})
    'aten.index_select.default(f32[8, 4], 0, i64[])'
    """

    def one(value: Any) -> str:
        if isinstance(value, TensorMeta):
            return f"{_DTYPE_SHORT.get(value.dtype, str(value.dtype).replace('torch.', ''))}{list(value.shape)}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(one(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        return repr(value)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return f"{op_name(op)}({', '.join(parts)})"


def _dtype_key(metas: tuple[TensorMeta | None, ...]) -> str:
    """The compute dtype of a call: its first floating tensor (fp32 otherwise)."""
    for meta in metas:
        if meta is not None and meta.dtype.is_floating_point:
            return str(meta.dtype)
    return "torch.float32"


class _Builder:
    """One build; the phases are methods so that each reads on its own."""

    def __init__(self, traced: TracedGraph, mesh: MeshSpec, profile: HardwareProfile, rules: RuleRegistry,
                 optimizer: OptimizerMemory, allow_uneven: bool, restrict: Restrict | None = None) -> None:
        self.traced = traced
        self.restrict = restrict
        self.mesh = mesh
        self.mesh_shape = mesh.shape
        self.profile = profile
        self.rules = rules
        self.optimizer = optimizer
        self.allow_uneven = allow_uneven
        self.pricer = EdgePricer(mesh, profile)
        self.nodes: list[GraphNode] = []
        self.edges: list[GraphEdge] = []
        self.index: dict[str, int] = {}
        self.fx_index: dict[str, int] = {}  # fx node name -> graph node (placeholders and ops)
        self.producer: dict[str, tuple[int, int]] = {}  # fx node name -> (graph node, output)
        self.union = UnionFind(0)
        self.seconds = {"strategies": 0.0, "compute": 0.0, "edges": 0.0, "ties": 0.0}
        self._compute_cache: dict[str, np.ndarray] = {}
        self._memory_cache: dict[tuple[str, bool], np.ndarray] = {}
        # a restriction returns one tuple per signature (SeededRestriction caches it): its digest is
        # computed once per tuple, not per node (repr of ~100 strategies: 0.5 ms, 5,500 nodes of an 8B)
        self._kept_digests: dict[int, tuple[tuple[OpStrategy, ...], str]] = {}
        self.uncovered: set[str] = set()
        self.analysis = RegionAnalysis((), {}, {})
        self.tied: TiedMemory | None = None
        self.copy_live: list[tuple[tuple[int, int], ...]] = []
        self.copy_live_recomputed: list[tuple[tuple[int, int], ...]] = []
        self._view_cols: dict[int, np.ndarray] = {}

    # -- nodes ---------------------------------------------------------------
    def add(self, node: GraphNode) -> int:
        if node.name in self.index:
            raise ValueError(f"graph: duplicate node name {node.name!r}")
        self.index[node.name] = len(self.nodes)
        self.nodes.append(node)
        self.union.parent.append(len(self.union.parent))
        return len(self.nodes) - 1

    def leaf(self, name: str, kind: str, target: str, meta: TensorMeta, *, live: tuple[int, int] | None,
             memory_per_byte: float = 1.0, cost: Callable[[int], float] | None = None,
             placements: tuple[tuple[Placement, ...], ...] | None = None) -> int:
        """A node whose strategies are whole-tensor placements."""
        options = placements if placements is not None else leaf_placements(meta.shape, self.mesh_shape)
        strategies = tuple(OpStrategy((p,), ()) for p in options)
        shard = np.array([local_bytes(meta, p, self.mesh_shape) for p in options], dtype=np.float64)
        compute = np.array([cost(int(b) // max(meta.itemsize, 1)) if cost else 0.0 for b in shard])
        signature = f"{kind}|{meta}|{len(options)}"
        return self.add(GraphNode(name, kind, target, strategies, compute, shard * memory_per_byte, live,
                                  (meta,), signature))

    def rule_failed(self, node: fx.Node, what: str, exc: Exception) -> GraphBuildError:
        """The one-line error of a rule that raised on ``node``'s call."""
        info = self.traced.nodes[node.name]
        if isinstance(exc, RuleError) and exc.__cause__ is not None:
            exc = exc.__cause__  # the registry's wrapper names the call too: report the rule's own error once
        detail = " ".join(str(exc).split()) or "(no message)"
        return GraphBuildError(
            f"graph: node {node.name} ({op_name(info.op)}): the sharding rule failed to {what} for the call "
            f"{describe_call(info.op, info.args, info.kwargs)} on mesh {'x'.join(map(str, self.mesh_shape))}: "
            f"{type(exc).__name__}: {detail}"
        )

    def op_node(self, node: fx.Node, live: tuple[int, int], owns_memory: bool) -> int:
        strategies, compute, memory, signature = self._op_strategies(node, owns_memory)
        info = self.traced.nodes[node.name]
        member = self.analysis.members.get(node.name)
        region = self.analysis.region_of.get(node.name, -1)
        name = str(OpId(node.name))
        if member is None:
            return self.add(GraphNode(name, "op", op_name(info.op), strategies, compute, memory, live,
                                      info.outputs, signature, (), region))
        states = member.states
        i = self.add(GraphNode(name, "op", op_name(info.op), strategies * len(states),
                               expand_compute(compute, states), expand_memory(memory, states), live, info.outputs,
                               state_signature(signature, states), states, region))
        if owns_memory:
            own = self.tied.pieces(i, node.name, live[0], memory)
            self.nodes[i] = replace(self.nodes[i], live=own)
        return i

    def _op_strategies(self, node: fx.Node, owns_memory: bool) -> tuple[tuple[OpStrategy, ...], np.ndarray,
                                                                         np.ndarray, str]:
        """The op's strategies (after ``restrict``), compute and memory per strategy, and signature."""
        info = self.traced.nodes[node.name]
        start = time.perf_counter()
        try:
            strategies = tuple(self.rules.strategies(
                info.op, info.args, info.kwargs, self.mesh_shape, allow_uneven=self.allow_uneven, out_meta=info.outputs
            ))
        except Exception as exc:  # any failure inside a rule: one line naming the call, not a traceback
            raise self.rule_failed(node, "enumerate its strategies", exc) from exc
        if self.rules.rule_for(info.op) is None:
            self.uncovered.add(op_name(info.op))
        signature = f"{op_name(info.op)}|{info.args!r}|{info.kwargs!r}|{info.outputs!r}|{self.allow_uneven}"
        run, scalar = self._access(node, info)
        if run != float("inf") or scalar:  # contiguous tensor-only ops keep the signature they always had
            signature += f"|run={run:g}|scalar={scalar}"
        if self.restrict is not None:
            kept = tuple(self.restrict(node, strategies))
            if not kept:
                raise ValueError(f"graph: the strategy restriction left {node.name} ({op_name(info.op)}) no strategy")
            if kept != strategies:
                # equal signatures must mean equal lists (edge matrices and ties are shared by signature)
                known = self._kept_digests.get(id(kept))
                if known is None or known[0] is not kept:
                    known = self._kept_digests[id(kept)] = (
                        kept, hashlib.blake2b(repr(kept).encode(), digest_size=10).hexdigest())
                signature += "|kept:" + known[1]
                strategies = kept
        self.seconds["strategies"] += time.perf_counter() - start
        start = time.perf_counter()
        compute = self._compute_cache.get(signature)
        if compute is None:
            dtype = _dtype_key(info.inputs + info.outputs)
            try:
                op = str(info.op)  # an op's own vector fraction (costmodel.compute); once, not per strategy
                compute = np.array([self._op_time(info, s, dtype, run, scalar, op) for s in strategies],
                                   dtype=np.float64)
            except Exception as exc:  # a rule's compute description that fails on a local call
                raise self.rule_failed(node, "describe its compute", exc) from exc
            self._compute_cache[signature] = compute
        memory = self._memory_cache.get((signature, owns_memory))
        if memory is None:
            memory = np.array([
                sum(local_bytes(m, p, self.mesh_shape) for m, p in zip(info.outputs, s.output_placements) if m is not None)
                if owns_memory else 0
                for s in strategies
            ], dtype=np.float64)
            self._memory_cache[(signature, owns_memory)] = memory
        self.seconds["compute"] += time.perf_counter() - start
        return strategies, compute, memory, signature

    def _access(self, node: fx.Node, info: Any) -> tuple[float, bool]:
        """(innermost run, scalar operand) of the node's kernel (``autoshard.graph.access``)."""
        from autoshard.graph.access import has_scalar_operand, inner_run, reduced_dims

        scalar = has_scalar_operand(info.op, node.args, dict(node.kwargs))
        try:
            call = self.rules.op_call(info.op, info.args, info.kwargs, out_meta=info.outputs)
            kind = self.rules.compute_kind(info.op, info.args, info.kwargs, out_meta=info.outputs).kind
        except Exception:  # noqa: BLE001 - no call to read (data-dependent outputs): price it contiguous
            return float("inf"), scalar
        out = node.meta.get("val")
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        ins = [a.meta.get("val") for a in node.all_input_nodes]
        return inner_run(kind, ins, outs, reduced=reduced_dims(call) if kind == "reduction" else None), scalar

    def _op_time(self, info: Any, strategy: OpStrategy, dtype: str, run: float = float("inf"),
                 scalar: bool = False, op: str | None = None) -> float:
        work = self.rules.strategy_compute(info.op, info.args, info.kwargs, self.mesh_shape, strategy,
                                           out_meta=info.outputs)
        outputs = [local_bytes(m, p, self.mesh_shape) for m, p in zip(info.outputs, strategy.output_placements)
                   if m is not None]  # what the op allocates on a rank (fresh pages, costmodel.compute)
        # an op of a step pays, beyond its time alone, the step's own per-op cost (measured by a
        # profile correction, hw_profiles.correction; 0 otherwise); a view runs no kernel
        in_step = self.profile.device.step_op_s if work.kind != "view" else 0.0
        try:
            return in_step + op_time_s(work.kind, flops=work.flops, bytes_accessed=work.bytes_accessed, dtype=dtype,
                                       profile=self.profile, run_elems=run, scalar_operand=scalar,
                                       output_bytes=outputs, op=op)
        except ValueError:  # a dtype the profile has no peak for (fp64, ints): price as fp32
            return in_step + op_time_s(work.kind, flops=work.flops, bytes_accessed=work.bytes_accessed,
                                       dtype="torch.float32", profile=self.profile, run_elems=run,
                                       scalar_operand=scalar, output_bytes=outputs, op=op)

    # -- edges ---------------------------------------------------------------
    def edge(self, src: int, src_output: int, dst: int, dst_input: int,
             dst_placement: Callable[[OpStrategy], Any], share: float = 1.0, *, view: bool = False,
             src_fx: str | None = None) -> InputCopy:
        """Add the edge; returns what the reader's copy bound needs (``tied_memory``).
        ``view``: the reader is a view op; ``src_fx``: the producer's fx name (None: a leaf)."""
        start = time.perf_counter()
        u, v = self.nodes[src], self.nodes[dst]
        tensor = u.outputs[src_output]
        if tensor is None:
            raise ValueError(f"graph: {v.name} reads output {src_output} of {u.name}, which is not a tensor")
        rule = edge_rule(self.analysis, src_fx, u.states, v.name, v.states) if (u.states or v.states) else None
        key = (u.signature, src_output, v.signature, dst_input, v.kind, view, rule)
        copies: list[np.ndarray] = []

        def placements() -> tuple[list[Any], list[Any]]:
            return ([s.output_placements[src_output] for s in u.strategies], [dst_placement(s) for s in v.strategies])

        def adjust(matrix: np.ndarray) -> np.ndarray:
            if view:
                matrix, cols = view_copy_rule(matrix, *placements())
                copies.append(cols)
            return rule.apply(matrix) if rule is not None else matrix

        matrix = self.pricer.matrix_index(key, tensor.shape, tensor.itemsize, placements, share=share,
                                          adjust=adjust if (view or rule is not None) else None)
        self.edges.append(GraphEdge(src, dst, src_output, dst_input, tensor, matrix))
        self.seconds["edges"] += time.perf_counter() - start
        view_cols = None
        if view:
            view_cols = self._view_cols.get(matrix)
            if view_cols is None:
                view_cols = copies[0] if copies else view_copy_rule(self.pricer.matrices[matrix], *placements())[1]
                self._view_cols[matrix] = view_cols
        return self.pricer.matrices[matrix], tensor, dst_input, view_cols, src, src_output

    def read(self, fx_name: str) -> tuple[int, int]:
        if fx_name not in self.producer:
            raise ValueError(f"graph: {fx_name} is read before it is made (not a tensor?)")
        return self.producer[fx_name]


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
) -> StrategyGraph:
    """The strategy graph of ``traced`` on ``mesh`` priced with ``profile`` (module docstring).

    ``optimizer``: what the optimizer holds and costs (AdamW by default);
    ``ties``: tie repeated layers; ``allow_uneven``: let rules split tensor
    dims that the mesh dim size does not divide; ``on_progress(done, total)``
    is called as op nodes are built; ``restrict(fx_node, strategies)`` returns
    the strategies to keep for an op node (a search-space restriction: the
    result is then optimal only over what it keeps); ``bucket_bytes``: the
    runtime's gradient bucket cap, which prices gradient reductions
    (``costmodel.bucketing``; 0 = one collective per gradient);
    ``recompute``: give the forward ops of repeated blocks recomputation
    states (``autoshard.graph.recompute``; a model without repeated blocks
    gets none either way); ``gather``: when parameter copies are held
    (``autoshard.graph.copies``: ``reader``, as autoshard's runtime gathers,
    or ``fsdp2``, as FSDP2 does: then gradients are also reduced per unit,
    in ``reduce_dtype`` when given, ``costmodel.bucketing``).
    """
    rules = rules or load_rules()
    optimizer = optimizer or OptimizerMemory()
    b = _Builder(traced, mesh, profile, rules, optimizer, allow_uneven, restrict)
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
            _add_op(b, walk, node)
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


def _time_axis(b: _Builder, traced: TracedGraph, recompute: bool, gather: str) -> _Walk:
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


def _add_constant(b: _Builder, walk: _Walk, node: fx.Node) -> None:
    """Step 2a: a tensor the forward made from Python data, held all step like a buffer, no gradient."""
    kind, name = walk.leaf_names.get(node, ("", ""))
    if kind != "constant":
        raise GraphBuildError(f"graph: {node.name} reads attribute {node.target!r}, which the trace does not "
                              "list as a tensor constant")
    i = b.leaf(str(TensorId("constant", name)), "constant", name, TensorMeta.of(node.meta.get("val")), live=None)
    walk.constants[name] = i
    b.fx_index[node.name] = i
    b.producer[node.name] = (i, 0)


def _add_leaf(b: _Builder, walk: _Walk, node: fx.Node) -> None:
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


def _add_op(b: _Builder, walk: _Walk, node: fx.Node) -> None:
    """Step 2c: an op node, its input edges, and the copies a redistribution of each input holds."""
    liveness, analysis = walk.liveness, b.analysis
    owner = liveness.owner[node.name]
    i = b.op_node(node, liveness.intervals[owner] if owner == node.name else (liveness.time[node.name],) * 2,
                  owns_memory=owner == node.name)
    b.fx_index[node.name] = i
    b.producer[node.name] = (i, 0)
    view = is_view_op(node.target)
    span = reader_span(analysis, node.name, liveness.time[node.name], walk.alias_end[node.name] if view else None,
                       _forward_end(analysis, node.name))
    recomputed = RECOMPUTE in b.nodes[i].states
    copies, lives = [], []
    for position, arg in enumerate(tensor_arg_nodes(node)):
        src, out = b.read(arg.name)
        copies.append(b.edge(src, out, i, position, lambda s, position=position: s.input_placements[position],
                             view=view, src_fx=b.nodes[src].name if b.nodes[src].kind == "op" else None))
        live = (copy_intervals(span, False), copy_intervals(span, True) if recomputed else ())
        if walk.param_copy_live is not None and liveness.owner[arg.name] in walk.param_copy_live.params:
            gathered = (walk.param_copy_live(node.name),)  # a parameter's gather, on the schedule asked for
            live = (gathered, gathered if recomputed else ())
        lives.append(live)
        b.copy_live.append(live[0])
        b.copy_live_recomputed.append(live[1])
    b.tied.input_copies(i, copies, lives)


def _same_placement(s: OpStrategy) -> Any:
    return s.output_placements[0]


def _add_sinks(b: _Builder, walk: _Walk, bucket_bytes: int, gather: str = "reader",
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


def _finish(b: _Builder, walk: _Walk, grads: dict[str, int], *, ties: bool, bucket_bytes: int) -> StrategyGraph:
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


def _tie_repeated(b: _Builder, gm: fx.GraphModule) -> None:
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
