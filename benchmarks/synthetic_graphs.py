"""Transformer-shaped synthetic strategy graphs, priced by our own cost model.

A graph is a stack of identical blocks (a transformer layer's forward ops,
then every block's backward ops in reverse order, as in a training step).
Each op node's strategies are placements of its output on a 2-D ``8x8`` mesh,
a random subset of 4-30 of all the placements its tensor admits (the same
subset in every block, so blocks repeat). Prices come from ``costmodel`` with
the H100 profile:

* node cost: the op's compute time for the largest local shard (matmul or
  elementwise roofline), so replicated work costs more than sharded work;
* edge cost: ``plan_redistribute`` from the producer's to the consumer's
  placement, the real cheapest collective sequence;
* memory: the output's largest local shard, live from the op until its
  backward op consumes it (activations) or always (parameters).

The memory limit sits between the smallest achievable peak (every node on its
least-memory strategy) and the peak of the memory-oblivious optimum, so it
binds. ``ties`` (optional) group the same node of every block, as autoshard's
graph builder emits them for repeated layers.

    from synthetic_graphs import transformer_problem
    problem = transformer_problem(layers=32, seed=0)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from costmodel.compute import op_time_s
from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, Replicate, Shard, format_placements
from costmodel.redistribute import plan_redistribute
from hw_profiles import load as load_profile
from solver.problem import Edge, Node, Problem

__all__ = ["transformer_problem", "BLOCK"]

MESH = MeshSpec((8, 8), ("dp", "tp"))
ITEMSIZE = 2  # bf16


@dataclass(frozen=True)
class OpSpec:
    name: str
    shape: tuple[int, ...]
    kind: str  # matmul | elementwise
    flops: float
    inputs: tuple[str, ...]  # producers inside the block ("prev" = previous block's output)
    param: bool = False


def _block(batch: int, seq: int, hidden: int, ffn: int) -> list[OpSpec]:
    tokens = batch * seq
    act = (batch, seq, hidden)
    mm = 2.0 * tokens * hidden
    return [
        OpSpec("w_qkv", (hidden, 3 * hidden), "elementwise", 0.0, (), True),
        OpSpec("w_o", (hidden, hidden), "elementwise", 0.0, (), True),
        OpSpec("w_up", (hidden, ffn), "elementwise", 0.0, (), True),
        OpSpec("w_down", (ffn, hidden), "elementwise", 0.0, (), True),
        OpSpec("norm1", act, "elementwise", 5.0 * tokens * hidden, ("prev",)),
        OpSpec("qkv", (batch, seq, 3 * hidden), "matmul", mm * 3 * hidden, ("norm1", "w_qkv")),
        OpSpec("attn", act, "matmul", 4.0 * tokens * seq * hidden, ("qkv",)),
        OpSpec("proj", act, "matmul", mm * hidden, ("attn", "w_o")),
        OpSpec("res1", act, "elementwise", 1.0 * tokens * hidden, ("prev", "proj")),
        OpSpec("norm2", act, "elementwise", 5.0 * tokens * hidden, ("res1",)),
        OpSpec("up", (batch, seq, ffn), "matmul", mm * ffn, ("norm2", "w_up")),
        OpSpec("act", (batch, seq, ffn), "elementwise", 4.0 * tokens * ffn, ("up",)),
        OpSpec("down", act, "matmul", mm * ffn, ("act", "w_down")),
        OpSpec("res2", act, "elementwise", 1.0 * tokens * hidden, ("res1", "down")),
    ]


BLOCK = [op.name for op in _block(1, 1, 1, 1)]


def _placements(rank: int) -> list[tuple]:
    per_dim = [Replicate(), Partial("sum")] + [Shard(d) for d in range(rank)]
    return list(itertools.product(per_dim, repeat=2))


def _required(consumer: OpSpec, weight: bool, out: tuple, rank: int) -> tuple:
    """The input placement a consumer's output placement ``out`` needs (one per mesh dim).

    Matmuls follow Megatron: output features sharded -> weight S(1), input R;
    contraction sharded (output partial) -> weight S(0), input S(last); batch
    or sequence sharded -> weight R, input sharded alike. Other ops take their
    input as their output (partial inputs are not accepted: replicate).
    """
    need = []
    for p in out:
        last = len(consumer.shape) - 1
        if consumer.kind == "matmul" and consumer.name != "attn":
            if isinstance(p, Shard) and p.dim == last:
                need.append(Shard(1) if weight else Replicate())
            elif isinstance(p, Partial):
                need.append(Shard(0) if weight else Shard(rank - 1))
            elif isinstance(p, Shard):
                need.append(Replicate() if weight else Shard(p.dim))
            else:
                need.append(Replicate())
        elif isinstance(p, Partial) or (isinstance(p, Shard) and p.dim >= rank):
            need.append(Replicate())
        else:
            need.append(p)
    return tuple(need)


def _local_numel(shape: tuple[int, ...], placement: tuple) -> int:
    local = list(shape)
    for p, m in zip(placement, MESH.shape):
        if isinstance(p, Shard):
            local[p.dim] = math.ceil(local[p.dim] / m)
    return int(np.prod(local))


def transformer_problem(*, layers: int, seed: int = 0, batch: int = 8, seq: int = 2048, hidden: int = 4096,
                        ffn: int = 14336, min_strategies: int = 4, max_strategies: int = 30,
                        ties: bool = False, limit_fraction: float = 0.3) -> Problem:
    """A training-step graph of ``layers`` blocks (about 30 nodes and 50 edges per block)."""
    rng = np.random.default_rng(seed)
    profile = load_profile("h100-sxm-80gb")
    specs = _block(batch, seq, hidden, ffn)
    # strategies per block op (shared by all blocks, so they repeat)
    strategies = {}
    for op in specs:
        options = [p for p in _placements(len(op.shape))
                   if not (op.param and any(isinstance(x, Partial) for x in p))]
        k = int(rng.integers(min_strategies, min(max_strategies, len(options)) + 1))
        picks = rng.choice(len(options), size=k, replace=False)
        strategies[op.name] = [options[i] for i in sorted(picks)]
    spec_of = {op.name: op for op in specs}

    def node_cost(op: OpSpec, placement: tuple) -> float:
        if op.param:
            return 0.0
        sharded = math.prod(m for p, m in zip(placement, MESH.shape) if not isinstance(p, Replicate))
        local = _local_numel(op.shape, placement)
        return op_time_s(op.kind, flops=op.flops / sharded, bytes_accessed=3.0 * local * ITEMSIZE,
                         dtype="bf16", profile=profile)

    def reshard(shape: tuple[int, ...], a: tuple, b: tuple) -> float:
        if a == b:
            return 0.0
        return plan_redistribute(a, b, MESH, shape, ITEMSIZE, profile).cost_s

    matrices: dict[tuple[str, str], np.ndarray] = {}

    def matrix(src: str, dst: str, shape: tuple[int, ...]) -> np.ndarray:
        """Cost of bringing src's output (shape ``shape``) to what dst's strategy needs of it."""
        key = (src, dst)
        if key not in matrices:
            consumer = spec_of[dst]
            weight = spec_of[src].param
            matrices[key] = np.array([
                [reshard(shape, a, _required(consumer, weight, b, len(shape))) for b in strategies[dst]]
                for a in strategies[src]])
        return matrices[key]

    nodes: list[Node] = []
    edges: list[Edge] = []
    index: dict[tuple[int, str], int] = {}
    fwd_step: dict[tuple[int, str], int] = {}
    steps = layers * sum(1 for op in specs if not op.param)  # F forward steps, then F backward

    def add_node(name: str, op: OpSpec, live: tuple[int, int] | None, backward: bool) -> int:
        strat = strategies[op.name]
        cost = np.array([node_cost(op, p) * (2.0 if backward else 1.0) for p in strat])
        memory = np.array([float(_local_numel(op.shape, p) * ITEMSIZE) for p in strat])
        nodes.append(Node(cost=cost, memory_bytes=memory, live=live, name=name,
                          strategies=tuple(format_placements(p) for p in strat)))
        return len(nodes) - 1

    # forward: the activation of step s lives until its gradient's step 2F-1-s
    step = 0
    prev = None
    for layer in range(layers):
        for op in specs:
            if op.param:
                index[(layer, op.name)] = add_node(f"L{layer}.{op.name}", op, None, False)
                continue
            index[(layer, op.name)] = add_node(f"L{layer}.{op.name}", op, (step, 2 * steps - step), False)
            fwd_step[(layer, op.name)] = step
            for src in op.inputs:
                if src == "prev":
                    if prev is None:
                        continue
                    src_id, src_name = prev, "res2"
                else:
                    src_id, src_name = index[(layer, src)], src
                edges.append(Edge(src_id, index[(layer, op.name)], matrix(src_name, op.name, spec_of[src_name].shape)))
            step += 1
        prev = index[(layer, "res2")]
    # backward: each op's gradient, in reverse; it reads its forward twin, the
    # previous gradient and, for matmuls, the weight whose gradient it makes
    grad_prev = None
    for layer in reversed(range(layers)):
        for op in reversed(specs):
            if op.param:
                continue
            at = 2 * steps - 1 - fwd_step[(layer, op.name)]
            gid = add_node(f"L{layer}.{op.name}.grad", op, (at, at + 2), True)
            edges.append(Edge(index[(layer, op.name)], gid, matrix(op.name, op.name, op.shape)))
            if grad_prev is not None:
                edges.append(Edge(grad_prev[0], gid, matrix(grad_prev[1], op.name, spec_of[grad_prev[1]].shape)))
            for src in op.inputs:
                if src != "prev" and spec_of[src].param:
                    edges.append(Edge(index[(layer, src)], gid, matrix(src, op.name, spec_of[src].shape)))
            grad_prev = (gid, op.name)
    problem = Problem(nodes=tuple(nodes), edges=tuple(edges), name=f"transformer-{layers}")
    limit = _binding_limit(problem, limit_fraction)
    tie_groups: tuple[tuple[int, ...], ...] = ()
    if ties:
        groups: dict[str, list[int]] = {}
        for i, node in enumerate(nodes):
            groups.setdefault(node.name.split(".", 1)[1], []).append(i)
        tie_groups = tuple(tuple(g) for g in groups.values() if len(g) > 1)
    return Problem(nodes=problem.nodes, edges=problem.edges, memory_limit=limit, ties=tie_groups,
                   name=problem.name)


def _binding_limit(problem: Problem, fraction: float) -> float:
    """A limit ``fraction`` of the way from the least-memory peak to the peak of the cheapest nodes."""
    from solver.evaluate import peak_memory

    least = [int(np.argmin(n.memory_bytes)) for n in problem.nodes]
    cheap = [int(np.argmin(n.cost)) for n in problem.nodes]
    low, high = peak_memory(problem, least)[0], peak_memory(problem, cheap)[0]
    return float(low + fraction * max(high - low, 0.0))
