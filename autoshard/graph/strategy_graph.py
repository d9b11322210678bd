"""The strategy graph as data: its nodes (strategies with compute and memory
per strategy), edges (which output feeds which input, with a shared cost
matrix) and the graph of one training step on one mesh and profile.

:mod:`autoshard.graph.builder` builds it from a traced graph; the problem
export, the plan assembly and the memory passes read it. The module holds the
types only, so that the build steps (``autoshard.graph.tied_memory``,
``autoshard.graph.copies``) can make nodes without importing the builder.

>>> from autoshard.graph.strategy_graph import NODE_KINDS
>>> "param" in NODE_KINDS and "op" in NODE_KINDS
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from costmodel.buckets.grouping import DEFAULT_BUCKET_BYTES
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

from autoshard.graph.memory import OptimizerMemory
from autoshard.graph.regions import Region
from autoshard.rules import OpStrategy, TensorMeta

__all__ = ["NODE_KINDS", "GraphNode", "GraphEdge", "BuildStats", "StrategyGraph"]

NODE_KINDS = ("op", "param", "buffer", "input", "constant", "tangent", "grad", "opt_temp", "buffer_update", "loss",
              "memory")


@dataclass(frozen=True, slots=True, eq=False)
class GraphNode:
    """One node of the strategy graph."""

    name: str
    """Unique: the fx name for ops; ``param:<fqn>``, ``input:<name>``,
    ``buffer:<fqn>``, ``grad:<fqn>``, ``opt_temp:<fqn>``, ``buffer_update:<fqn>``, ``constant:<name>``,
    ``tangent``, ``loss``, ``memory:...``: spelled and read only by ``autoshard.graph.node_ids``."""
    kind: str
    """One of :data:`NODE_KINDS`."""
    target: str
    """``aten.mm.default`` for ops; the parameter/buffer/input name for the others."""
    strategies: tuple[OpStrategy, ...]
    """Candidate strategies (leaves and sinks: one output placement each)."""
    compute_s: np.ndarray
    """Compute time of each strategy on the busiest rank (seconds)."""
    memory_bytes: np.ndarray
    """Memory of each strategy on the busiest rank, counted over :attr:`live`."""
    live: tuple[int, int] | None
    """``[start, end)`` on the step's time axis; None: all step."""
    outputs: tuple[TensorMeta | None, ...]
    """Global metadata of each output."""
    signature: str
    """Identity of the strategy list (equal signatures, equal lists)."""
    states: tuple[int, ...] = ()
    """Recomputation states of the list, state-major (``autoshard.graph.recompute``);
    empty: the node has no states (every strategy keeps)."""
    region: int = -1
    """Index in :attr:`StrategyGraph.regions` of the block whose forward it is (-1: none)."""


@dataclass(frozen=True, slots=True)
class GraphEdge:
    """Output ``src_output`` of node ``src`` read as tensor input ``dst_input`` of ``dst``."""

    src: int
    dst: int
    src_output: int
    dst_input: int
    tensor: TensorMeta
    """Global shape and dtype of the tensor carried."""
    matrix: int
    """Index in :attr:`StrategyGraph.matrices`."""


@dataclass(frozen=True, slots=True)
class BuildStats:
    """What building took."""

    seconds: Mapping[str, float]
    """Wall time per phase: ``strategies``, ``compute``, ``edges``, ``ties``."""
    op_nodes: int
    strategies_mean: float
    strategies_max: int
    pairs_planned: int
    """Placement pairs priced by the redistribution planner."""
    uncovered_ops: tuple[str, ...]
    """Ops without a rule (run replicated)."""


@dataclass(frozen=True, slots=True, eq=False)
class StrategyGraph:
    """The strategy graph of one training step on one mesh and profile."""

    mesh: MeshSpec
    profile: HardwareProfile
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    matrices: tuple[np.ndarray, ...]
    """Shared edge cost matrices (seconds, ``inf`` = forbidden)."""
    ties: tuple[tuple[int, ...], ...]
    """Tie groups: :attr:`required_ties` merged with repeated layers (when built with ``ties=True``)."""
    required_ties: tuple[tuple[int, ...], ...]
    """Ties that training semantics need whatever the options: a parameter with its
    gradient sink and optimizer temporary, a buffer with its update."""
    index: Mapping[str, int]
    """Node name -> index."""
    params: Mapping[str, int]
    """Parameter FQN -> its node."""
    grads: Mapping[str, int]
    """Parameter FQN -> its gradient sink (parameters with a gradient only)."""
    inputs: Mapping[str, int]
    """Forward argument name -> its node."""
    buffers: Mapping[str, int]
    param_aliases: Mapping[str, tuple[str, ...]]
    """Canonical parameter FQN -> other names of the same (tied) parameter."""
    end_time: int
    """The optimizer step on the time axis."""
    optimizer: OptimizerMemory
    stats: BuildStats
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Gradient bucket cap the gradient edges were priced with (0: no buckets)."""
    constants: Mapping[str, int] = field(default_factory=dict)
    """Tensor constant name (``_tensor_constant0``) -> its node."""
    regions: tuple[Region, ...] = ()
    """Checkpoint regions (``autoshard.graph.regions``); empty: no recomputation."""
    copy_live: tuple[tuple[tuple[int, int], ...], ...] = ()
    """Per edge: the intervals of a redistributed copy when its reader runs once."""
    copy_live_recomputed: tuple[tuple[tuple[int, int], ...], ...] = ()
    """Per edge: the intervals of the copy when its reader is recomputed (empty: never)."""
    follows: Mapping[int, int] = dataclasses.field(default_factory=dict)
    """View node -> the node whose recomputation state it takes (``autoshard.graph.recompute``, C4)."""
    times: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """fx node name -> its time on the graph's time axis (``live`` intervals use it; with regions,
    it has a recomputation phase before each region's ``t_rc``)."""

    def has_exchanges(self) -> bool:
        """Whether some op node offers a strategy with an expert-parallel exchange, which
        ``expert_imbalance`` priced (``autoshard.graph.builder``; context-parallel ones do not read it)."""
        return any(s.exchange is not None and s.exchange[0] == "expert_dispatch"
                   for n in self.nodes if n.kind == "op" for s in n.strategies)
