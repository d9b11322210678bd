r"""A solved plan's parameter communication apart: what a pipeline stage pays once a step.

A one-microbatch plan (the stage sub-mesh's solve, ``autoshard.search.pipeline_blocks``)
prices every collective as if the step were that one microbatch: FSDP's weight
all-gathers (again in the backward where it reshards after the forward), the
gradient reductions, and the per-op collectives of the activations (tensor
parallelism, re-layouts). A pipeline stage runs ``m`` microbatches, and its data
parallelism runs as torchtitan's and autoshard's pipeline runtime do
(``autoshard.runtime.pipeline_stages``: FSDP2 with ``reshard_after_forward=False``,
gradient sync only after the last microbatch): the weights are gathered **once** a
step, before the stage's first forward, and kept gathered to its last backward; the
gradients accumulate unsharded in the reduce dtype and are reduced **once**. Only the
activations' collectives repeat per microbatch.

**Which transfers are the parameters'** (``P``): a gather bucket whose members all read
a parameter (through views), a gradient bucket, an edge whose producer is a parameter
(through views: ``engine_pricing.param_of``) or whose reader leads to a gradient sink
(``engine_pricing.grad_of``). Their local re-layouts go with them.

**Figures** (``S(Q)``: the plan's schedule simulated, as ``engine_pricing.reprice`` does, with
only the transfers ``Q`` of the plan; ``T`` all of them, ``G_w`` the weight gathers):

    (a) per_microbatch_saving = S(T) - S(T \ P)        exposure the parameters' collectives add
    (a') activation_exposed_s = S(T \ P) - S(∅)         what a microbatch repeats: the other
                                                      collectives' exposure and local re-layouts
    (b) gather_exposed_s      = S(T \ P ∪ G_w) - S(T \ P)   the weight gathers' exposure, paid once a step
    (c) reduction_s           = S(T \ P ∪ G_r) - S(T \ P)   the gradient reductions' exposure (``G_r``),
                                                      paid once a step: they overlap the last
                                                      microbatch's backward as they overlap this one's
    (d) held_bytes            = sum_p g_p (1 + r)      g_p parameter p's bytes after its
                                                      all_gathers on the data dims, every mesh dim
                                                      but ``tp`` (the least over its edges: FSDP's
                                                      unsharded parameter, gathered over ``dp`` and
                                                      ``cp`` where it is sharded over both; a gather
                                                      over ``tp`` is a transient of one op), r = the
                                                      gradients' itemsize over the gathered one
                                                      (fp32 / bf16 = 2)

``S(T) - S(T \ P)`` is the part of the step's exposed communication that the
microbatches do not repeat; the plan's own step keeps the rest. (d) is what the stage
holds through the step beyond its sharded state: the gathered weights and their
unsharded gradient accumulators.

>>> # pc = param_comm(prep.graph, plan)
>>> # pc.per_microbatch_saving_s, pc.gather_exposed_s, pc.reduction_s, pc.held_bytes
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from autoshard.assembly.engine_pricing import chosen_strategies, edge_links, grad_of, param_of, simulate_moves
from autoshard.program.schedule import VIEW_OPS, schedule_transfers
from costmodel.buckets.grouping import dtype_itemsize

__all__ = ["ParamComm", "param_comm"]


@dataclass(frozen=True, slots=True)
class ParamComm:
    """(a)-(d) of one plan (module docstring)."""

    per_microbatch_saving_s: float
    activation_exposed_s: float
    gather_exposed_s: float
    reduction_s: float
    held_by_param: Mapping[str, float]
    """(d) per parameter FQN."""
    weight_transfers: int
    """Scheduled transfers that gather or re-lay a parameter."""
    gradient_transfers: int
    """Scheduled transfers that reduce a gradient."""

    @property
    def held_bytes(self) -> float:
        """(d): every parameter's."""
        return float(sum(self.held_by_param.values()))


def _classify(graph: Any, plan: Any) -> tuple[set[tuple[str, str, int]], set[tuple[str, str, int]], dict[str, str]]:
    """(weight edges, gradient edges, edge producer -> parameter) of the plan's redistributions."""
    reads, feeds = edge_links(graph)
    weights, grads, of_param = set(), set(), {}
    for r in plan.redistributions:
        edge = (r.tensor, r.to, r.input_index)
        src, dst = graph.index.get(r.tensor), graph.index.get(r.to)
        name = param_of(graph, src, reads) if src is not None else None
        if name is not None:
            weights.add(edge)
            of_param[r.tensor] = name
        elif dst is not None and (graph.nodes[dst].kind == "grad" or graph.nodes[dst].target in VIEW_OPS
                                  and grad_of(graph, dst, feeds) is not None):
            grads.add(edge)  # the reader is the gradient sink, or views that end in it
    return weights, grads, of_param


def _held_bytes(plan: Any, weights: set[tuple[str, str, int]], of_param: dict[str, str],
                grad_buckets: set[int]) -> dict[str, float]:
    """(d): the gathered weights and their unsharded gradient accumulators."""
    tp = {i for i, n in enumerate(plan.fingerprint.dim_names) if n == "tp"}
    gathered: dict[str, int] = {}
    for r in plan.redistributions:
        edge = (r.tensor, r.to, r.input_index)
        steps = [s for s in r.steps if s.collective == "all_gather" and not tp & set(s.mesh_dims)]
        if edge in weights and steps:
            # a step's bytes are its gathered output: the largest is the parameter after every data-dim gather
            name, nbytes = of_param[r.tensor], max(int(s.bytes) for s in steps)
            gathered[name] = min(gathered.get(name, nbytes), nbytes)
    gather_dtypes = {b.dtype for b in plan.gather_buckets}
    grad_dtypes = {plan.buckets[i].dtype for i in grad_buckets}
    ratio = 1.0
    if len(gather_dtypes) == 1 and len(grad_dtypes) == 1:  # else: one dtype for both (no mixed precision known)
        ratio = dtype_itemsize(grad_dtypes.pop()) / dtype_itemsize(gather_dtypes.pop())
    return {name: float(nbytes) * (1.0 + ratio) for name, nbytes in gathered.items()}


def param_comm(graph: Any, plan: Any, compute: Sequence[float] | None = None) -> ParamComm:
    """(a)-(d) of ``plan`` solved on ``graph`` (``prep.graph``) (module docstring); ``compute``: the
    plan's op times in plan order where the caller has them (``engine_pricing.chosen_strategies``).

    >>> # param_comm(prep.graph, plan).held_bytes   # 0 for a plan with no weight gathers
    """
    if plan.schedule is None:
        raise ValueError("plan: has no schedule (a plan file older than the schedule): cannot split its communication")
    weights, grads, of_param = _classify(graph, plan)
    if compute is None:
        compute = [float(node.compute_s[k]) for node, k in chosen_strategies(graph, plan)]
    tail = max(0.0, plan.estimate.compute_s - sum(compute))
    weight_gathers = {i for i, b in enumerate(plan.gather_buckets)
                      if b.members and all(tuple(m) in weights for m in b.members)}
    grad_buckets = {i for i, b in enumerate(plan.buckets) if all(m.startswith("grad:") for m in b.members)}

    def is_weight(item: Any) -> bool:
        return item.gather in weight_gathers if item.gather is not None else item.edge in weights

    def is_grad(item: Any) -> bool:
        return item.bucket in grad_buckets if item.bucket is not None else item.edge in grads

    def step_with(keep_weights: bool, keep_grads: bool) -> float:
        items = tuple(i for i in plan.schedule.items
                      if (keep_weights or not is_weight(i)) and (keep_grads or not is_grad(i)))
        moved = [r for r in plan.redistributions if (keep_weights or (r.tensor, r.to, r.input_index) not in weights)
                 and (keep_grads or (r.tensor, r.to, r.input_index) not in grads)]
        transfers, local = schedule_transfers(replace(plan.schedule, items=items), moved, plan.buckets,
                                              plan.gather_buckets)
        return simulate_moves(graph.profile, compute, transfers, local, tail)

    every, none = step_with(True, True), step_with(False, False)
    gathers, reductions = step_with(True, False), step_with(False, True)
    bare = simulate_moves(graph.profile, compute, [], [], tail)
    items = plan.schedule.items
    return ParamComm(max(0.0, every - none), max(0.0, none - bare), max(0.0, gathers - none),
                     max(0.0, reductions - none), _held_bytes(plan, weights, of_param, grad_buckets),
                     sum(map(is_weight, items)), sum(map(is_grad, items)))
