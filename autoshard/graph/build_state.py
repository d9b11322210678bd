"""The strategy graph under construction: nodes and edges as the build's walk adds
them (``autoshard.graph.builder``), each op's strategies from the rules with their
compute and memory, and one error line naming the call when a rule fails.

Why apart from the walk: the walk (``build_graph``) says in which order a traced
graph's nodes become graph nodes (time axis, leaves, ops, sinks, ties); this
module says what one node is (strategies, costs, edges priced by
``autoshard.graph.edges``), whatever the order.

>>> describe_call(torch.ops.aten.mm.default, (TensorMeta((8, 4), torch.float32), TensorMeta((4, 2), torch.float32)), {})
'aten.mm.default(f32[8, 4], f32[4, 2])'
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np
import torch  # noqa: F401 - the doctests' name
import torch.fx as fx

from costmodel.compute import op_time_s
from costmodel.mesh import MeshSpec
from costmodel.placements import Placement
from hw_profiles import HardwareProfile

from autoshard.graph.copies import view_copy_rule
from autoshard.graph.edges import EdgePricer
from autoshard.graph.memory import OptimizerMemory, local_bytes
from autoshard.graph.node_ids import OpId
from autoshard.graph.placements import leaf_placements
from autoshard.graph.recompute import edge_rule, expand_compute, expand_memory, state_signature
from autoshard.graph.regions import RegionAnalysis
from autoshard.graph.strategy_graph import GraphEdge, GraphNode
from autoshard.graph.tied_memory import InputCopy, TiedMemory
from autoshard.graph.ties import UnionFind
from autoshard.graph.token_splits import factors_signature, token_rows_needed, token_split_factors
from autoshard.rules import OpCall, OpStrategy, RuleError, RuleRegistry, TensorMeta, op_name
from autoshard.rules.registry import describe_call as rules_describe_call
from autoshard.trace import TracedGraph, tensor_arg_nodes

__all__ = ["GraphBuildError", "BuildState", "Restrict", "describe_call"]

Restrict = Callable[[fx.Node, tuple[OpStrategy, ...]], "tuple[OpStrategy, ...] | list[OpStrategy]"]
"""Keeps a subset of an op node's strategies (``build_graph(restrict=...)``)."""


class GraphBuildError(ValueError):
    """A rule failed on one call of the graph; the message is one line naming the node, the op and the call."""


def describe_call(op: Any, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """``aten.index_select.default(f32[8, 4], 0, i64[])``: an op's call with tensors as
    dtype and shape, in the rules' wording (:func:`autoshard.rules.registry.describe_call`)
    with short dtype names.

    >>> describe_call(torch.ops.aten.index_select.default,
    ...               (TensorMeta((8, 4), torch.float32), 0, TensorMeta((), torch.int64)), {})
    'aten.index_select.default(f32[8, 4], 0, i64[])'
    """
    return rules_describe_call(OpCall(op, tuple(args), kwargs, (), ()), short_dtypes=True)


def _dtype_key(metas: tuple[TensorMeta | None, ...]) -> str:
    """The compute dtype of a call: its first floating tensor (fp32 otherwise)."""
    for meta in metas:
        if meta is not None and meta.dtype.is_floating_point:
            return str(meta.dtype)
    return "torch.float32"


class BuildState:
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
        self._token_memo: dict[tuple[int, int], set[int]] = {}
        self._token_rows = token_rows_needed(traced, mesh.shape)

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
            factors = self._token_factors(node)
            strategies = tuple(self.rules.strategies(
                info.op, info.args, info.kwargs, self.mesh_shape, allow_uneven=self.allow_uneven, out_meta=info.outputs,
                strided_factors=factors))
        except Exception as exc:  # any failure inside a rule: one line naming the call, not a traceback
            raise self.rule_failed(node, "enumerate its strategies", exc) from exc
        if self.rules.rule_for(info.op) is None:
            self.uncovered.add(op_name(info.op))
        signature = (f"{op_name(info.op)}|{info.args!r}|{info.kwargs!r}|{info.outputs!r}|{self.allow_uneven}"
                     + factors_signature(factors))
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

    def _token_factors(self, node: fx.Node) -> tuple[int, ...]:
        """Strided token-row splits the producers hand over (``autoshard.graph.token_splits``), on
        meshes with a dim that does not divide the batch only (:func:`token_rows_needed`)."""
        if not self._token_rows:
            return ()
        reads = [self.producer[a.name] for a in tensor_arg_nodes(node) if a.name in self.producer]
        return token_split_factors([(i, self.nodes[i].strategies, out) for i, out in reads], self._token_memo)

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
        # an op of a step pays, beyond its time alone, the step's own cost per op and per byte it
        # touches, cold in a step (measured by a profile correction, hw_profiles.correction; 0
        # otherwise); a view runs no kernel
        in_step = self.profile.device.in_step_s(work.bytes_accessed) if work.kind != "view" else 0.0
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
