r"""Seeded search on N-D meshes: keep, per op node, the strategies near a coarse solution.

Why. On a mesh of ``n`` dims the rules give every op the product, over mesh
dims, of its single-dim strategies: ``O((d+1)^n)`` strategies per node (LLaMA
on 2x4x8: ~470 per node on average, up to 1,330). Edge matrices are priced over
the distinct placement pairs of the two ends, so their size and the pricing
time grow with the square of that: a 3-D mesh is out of reach for full
enumeration, while a 2-D mesh with the same devices is routine.

The restriction (coarse to fine). Let the fine mesh have dims ``0..n-1``.

1. *Coarse meshes.* Merge contiguous fine dims into two groups ``G_A, G_B``
   (``2x4x8 -> (2*4) x 8 = 8x8``). A merged dim has
   the size of the product and the stride of its innermost member, so the
   coarse mesh numbers the ranks exactly as the fine one does: its rank groups
   are unions of fine rank groups and the cost model prices its collectives on
   the same links (the coarse dim that spans nodes still spans nodes). Every
   such split seeds (:func:`seed_groupings`: ``2x4x8 -> 8x8`` and ``2x32``; the
   most balanced first, splits that leave a group of one rank or repeat a
   coarse mesh left out); steps 2-5 run on each and ``Sigma`` is the union of
   theirs. Why more than one: a coarse solve puts one idea per op on each of
   its two dims, so one split offers an op at most two of the three a
   ``dp x cp x tp`` mesh needs (batch, sequence, heads). Measured (the example
   LLaMA, one layer, dim 128, 2 heads, batch 2 x 16,384 tokens, ``2x2x2``
   named ``dp,cp,tp``, the sequence inputs pinned ``S(0)S(1)R``, H100
   profile): the balanced split ``2 x (2*2)`` splits the sequence over the
   merged ``4`` (two heads do not split 4 ways) and keeps no head or column
   split for the fine ``tp``: every attention and matmul ran whole on ``tp``,
   7.11 ms; with ``(2*2) x 2`` beside it, batch on ``dp``, the sequence on
   ``cp`` and Megatron's heads on ``tp``: 5.02 ms (the unrestricted search,
   stopped at 120 s unproven: 5.64 ms). ``2x2x4`` with 4 heads: 4.30 ->
   3.74 ms (unrestricted, 120 s: 4.83 ms); ``2x4x2`` 5.28 -> 4.00 ms,
   ``4x4x2`` (batch 4) 5.32 -> 4.04 ms. Where batch and heads alone split
   the mesh (256-2,048 tokens, batch 4-16) the plans were the same; each more
   coarse mesh costs its build and solve (about 2 s of the 5-6 s a ``prepare``
   took there). The split with ``dp`` alone also gives each coarse op what the
   fine ``cp`` needs below ``dp``: the merged ``cp x tp`` dim sees one ``dp``
   rank's sequences, so a row split of ``[B S, d]`` over it is the sequence
   of ``[B, S, d]`` (``S(0) -> S(1)`` of a view), not a strided split of the
   whole batch. The seeds share the time limit (:func:`seeded_restriction`).
2. *Seed.* Build and solve the strategy graph on the coarse mesh (exact over
   its own space, with the same memory limit). A coarse strategy of node ``v``
   is a pair of single-dim choices ``(c_A(v), c_B(v))``; a single-dim choice
   is the tuple of placements, on that mesh dim, of every output and input.
   A coarse choice ``S(d)`` on a merged dim of size ``m_0 m_1`` is the fine
   layout ``S(d)S(d)`` (split by ``m_0``, then each piece by ``m_1``: the same
   contiguous chunks), so every coarse plan is also a fine plan.
3. *Neighbourhood.* Let ``key(p)`` forget the split factor of a strided shard
   (``_S(d,sf=k) -> S(d)``: the factor depends on the mesh sizes, the layout
   idea does not). For an op signature ``sigma`` (op, shapes, args: what the
   builder keys strategy lists by) let

       Sigma(sigma) = {key(R...R)} u { key(c_g(v)) : v with signature sigma, g in {A, B} }

   and keep the fine strategies ``f = (f_0, ..., f_{n-1})`` of a node with
   signature ``sigma`` such that ``key(f_i) in Sigma(sigma)`` for every fine
   dim ``i``. Every fine dim may thus take any single-dim choice the seed used
   for that op anywhere (on either coarse dim), or replicate: the seed's own
   layout (``c_A`` on every dim of ``G_A``, ``c_B`` on ``G_B``) is kept, and
   so are its refinements that split the merged group between two ideas
   (data parallel across nodes and tensor parallel inside one on ``2x4``,
   say). ``Sigma`` has 1 to 3 members for most ops (more only where nodes of
   one signature were solved differently), so a node keeps at most
   ``|Sigma|^n`` strategies (27 for 3 on a 3-D mesh) instead of hundreds.
4. *Fallback.* The all-replicate strategy is always kept (``R`` is in every
   ``Sigma``), so every node has a strategy any neighbour can reach.
   Leaves (parameters, inputs, buffers) and sinks are not restricted: their
   lists are small and any layout of a parameter is reachable by the ops.
5. *The memory-light seed.* One more coarse solve seeds ``Sigma``: every
   parameter pinned to its lightest strategy (the least memory on the busiest
   rank: fully sharded where its shape allows; ties to the cheaper update, then
   the first), no memory limit. The seeds above may all hold every weight whole
   (the plan solved under the limit, when the coarse problem has none within it
   or within its time, is solved without one; the limit the seed is given need
   not be the fine solve's): then the ops that read a parameter (a view such as
   ``t``, which keeps its input's copy from the forward to the backward) keep
   only strategies that read it whole, whatever the parameter's own placement,
   and the fine solve's memory that no choice avoids is every weight on every
   rank (405B on 512 GPUs: 1.1 TB a rank, a "no plan fits" that was the
   restriction's, not the layout's). Pinned sharded, the coarse solve makes the
   views read the shards as they lie (a view reading its producer's placement
   exactly is the only pairing the copy rule leaves it) and the readers gather
   for their own time only, as FSDP does; its choices join ``Sigma``, so the
   fine graph keeps that layout and its mixes with the other seeds'. A hint,
   not a guarantee: it bounds what the parameters and their views hold, not
   every activation's layout.

Why it is reasonable. The coarse problem is the fine problem with the two
dims of a group forced to agree; where they should agree (the usual case: both
carry the same kind of parallelism), the seed is right and the fine solve only
re-prices it on the real mesh; where they should differ, the useful second
choice is nearly always one the seed already uses for the same op on the other
dim (data on one, tensor/sequence on the other), which the mixing in 3. keeps.
Since ``Sigma`` depends on the signature only, nodes with equal signatures get
equal kept lists, so repeated layers still share edge matrices and ties.

This is a *restriction, not an exact reduction*: the fine solve is optimal
over the kept strategies only, so its step time is never below that of the
full search and may be above it (measured in the task report / tests on
2x2x2, where full enumeration is feasible).

>>> from costmodel.mesh import MeshSpec
>>> coarse_groups((2, 4, 8)), coarse_mesh(MeshSpec((2, 4, 8)), ((0, 1), (2,))).shape
(((0, 1), (2,)), (8, 8))
>>> seed_groupings((2, 4, 8)), seed_groupings((2, 1, 4))
((((0, 1), (2,)), ((0,), (1, 2))), (((0,), (1, 2)),))
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch.fx as fx

from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, Placement, Replicate, Shard, StridedShard
from hw_profiles import HardwareProfile
from solver.backends import DEFAULT_BACKEND

from autoshard.sizes import format_bytes

from autoshard.graph.memory import OptimizerMemory
from autoshard.graph.strategy_graph import StrategyGraph
from autoshard.rules import OpStrategy

__all__ = ["SEARCH_MODES", "choose_search", "coarse_groups", "seed_groupings", "coarse_mesh", "dim_choice",
           "SeededRestriction", "SeedInfo", "seeded_restriction", "light_pins", "lightest_ops",
           "LIGHT_SEED_SHARE"]

log = logging.getLogger(__name__)

SEARCH_MODES = ("auto", "full", "seeded")

LIGHT_SEED_SHARE = 0.2
"""The least share of the seed's time limit the memory-light seed gets (step 5), after the others:
a seed may then take up to this much more than its limit (the solve after it is handed what is left
of the caller's deadline)."""

ChoiceKey = tuple[Any, ...]
"""A single-dim choice up to split factors: one key per output, then per input."""


def _key(p: Placement | None) -> Any:
    """A placement up to its strided split factor (``None``: not read / no tensor)."""
    if p is None:
        return None
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, (Shard, StridedShard)):
        return ("S", p.dim)
    if isinstance(p, Partial):
        return ("P", p.reduce_op)
    return repr(p)  # a placement kind this module does not know: compared exactly


def dim_choice(strategy: OpStrategy, dim: int) -> ChoiceKey:
    """The single-dim choice of ``strategy`` on mesh dim ``dim`` (placement keys
    of every output, then every input; ``None`` stays ``None``)."""
    return tuple(None if ps is None else _key(ps[dim])
                 for ps in (*strategy.output_placements, *strategy.input_placements))


def choose_search(mesh_shape: Sequence[int], search: str = "auto") -> str:
    """``full`` or ``seeded``: ``auto`` seeds meshes with 3 or more dims of size > 1
    (2-D meshes enumerate in seconds; 3-D ones take minutes to hours)."""
    if search not in SEARCH_MODES:
        raise ValueError(f"search: expected one of {SEARCH_MODES}, got {search!r}")
    if search != "auto":
        return search
    return "seeded" if sum(1 for m in mesh_shape if int(m) > 1) >= 3 else "full"


def coarse_groups(mesh_shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The split of the mesh dims into two contiguous groups whose sizes are the
    most balanced (ties: the first such split); size-1 dims are merged freely."""
    shape = tuple(int(m) for m in mesh_shape)
    if len(shape) < 2:
        raise ValueError(f"coarse_groups: need at least 2 mesh dims, got {shape}")
    best = min(range(1, len(shape)),
               key=lambda k: abs(math.log(math.prod(shape[:k])) - math.log(math.prod(shape[k:]))))
    return tuple(range(best)), tuple(range(best, len(shape)))


def seed_groupings(mesh_shape: Sequence[int]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """Every split of the mesh dims into two contiguous groups that a seed solves (module
    docstring, step 1): :func:`coarse_groups`' first, then the others in order; a split with a
    group of one rank (a 1-D coarse mesh) or the sizes of one already listed (size-1 dims moved
    across) is left out, unless it is the only one."""
    shape = tuple(int(m) for m in mesh_shape)
    first = coarse_groups(shape)
    out, sizes = [first], {(math.prod(shape[d] for d in first[0]), math.prod(shape[d] for d in first[1]))}
    for k in range(1, len(shape)):
        split = (math.prod(shape[:k]), math.prod(shape[k:]))
        if 1 in split or split in sizes:
            continue
        sizes.add(split)
        out.append((tuple(range(k)), tuple(range(k, len(shape)))))
    return tuple(out)


def coarse_mesh(mesh: MeshSpec, groups: Sequence[Sequence[int]]) -> MeshSpec:
    """The mesh with each group of contiguous dims merged into one. A merged dim
    keeps the rank numbering: size = product, stride = the innermost member's
    (valid when the group is contiguous in rank space, as in a row-major mesh)."""
    sizes, strides, names = [], [], []
    for group in groups:
        dims = list(group)
        if dims != list(range(dims[0], dims[0] + len(dims))):
            raise ValueError(f"coarse_mesh: group {tuple(group)} is not contiguous")
        for a, b in zip(dims, dims[1:]):
            if mesh.strides[a] != mesh.strides[b] * mesh.shape[b]:
                raise ValueError(f"coarse_mesh: dims {a} and {b} are not contiguous in rank space "
                                 f"(strides {mesh.strides})")
        sizes.append(math.prod(mesh.shape[d] for d in dims))
        strides.append(mesh.strides[dims[-1]])
        names.append("*".join(mesh.dim_names[d] for d in dims))
    return MeshSpec(tuple(sizes), tuple(names), tuple(strides))


@dataclass
class SeededRestriction:
    """``restrict(fx_node, strategies)`` for :func:`autoshard.graph.builder.build_graph`:
    keep the strategies whose every per-dim choice is in the node's allowed set
    (module docstring, step 3). Nodes the seed does not know keep everything."""

    allowed: Mapping[str, frozenset[ChoiceKey]]
    """Op signature -> allowed single-dim choice keys (replicate excluded: always allowed)."""
    signature_of: Mapping[str, str]
    """fx node name -> op signature (as the builder computes it, unrestricted)."""
    kept_counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Signature -> (strategies kept, strategies offered): what the restriction did."""
    _cache: dict[tuple[str, int], tuple[OpStrategy, ...]] = field(default_factory=dict, repr=False)

    def __call__(self, node: fx.Node, strategies: Sequence[OpStrategy]) -> tuple[OpStrategy, ...]:
        strategies = tuple(strategies)
        signature = self.signature_of.get(node.name)
        if signature is None or not strategies:
            return strategies
        # equal signatures give equal strategy lists (the rules cache by the same key), so the kept list
        # is a function of the signature; the length guards against a caller breaking that
        cache_key = (signature, len(strategies))
        kept = self._cache.get(cache_key)
        if kept is None:
            allowed = self.allowed.get(signature, frozenset())
            ndim = _mesh_ndim(strategies[0])
            kept = tuple(
                s for j, s in enumerate(strategies)
                if j == 0 or all(_is_replicate(c) or c in allowed for c in (dim_choice(s, i) for i in range(ndim)))
            )
            self._cache[cache_key] = kept
            self.kept_counts[signature] = (len(kept), len(strategies))
        return kept


def light_pins(graph: StrategyGraph) -> dict[int, int]:
    """Every parameter node of ``graph`` pinned to its lightest strategy: the least memory,
    then the cheapest update, then the first (module docstring, step 5). Equal strategy lists
    get equal choices, so tied parameters (repeated layers) stay consistent."""
    pins = {}
    for i, node in enumerate(graph.nodes):
        if node.kind in ("param", "input") and len(node.strategies):
            pins[i] = min(range(len(node.strategies)),
                          key=lambda k: (float(node.memory_bytes[k]), float(node.compute_s[k]), k))
    return pins


def lightest_ops(graph: StrategyGraph) -> dict[int, int]:
    """Op node -> its lightest strategy: the least memory of the node and of the memory pieces
    tied to it (its input copies' bounds, its exchange's temporaries: ``autoshard.graph.tied_memory``,
    which give them the op's strategy list), summed over their intervals; then the cheapest, then
    the first (module docstring, step 5)."""
    from autoshard.graph.node_ids import MemoryPieceId, parse

    held = {i: np.array(n.memory_bytes, dtype=np.float64) for i, n in enumerate(graph.nodes) if n.kind == "op"}
    for n in graph.nodes:
        if n.kind != "memory":
            continue
        piece = parse(n.name)
        owner = graph.index.get(piece.owner) if isinstance(piece, MemoryPieceId) else None
        if owner in held and len(n.memory_bytes) == len(held[owner]):
            held[owner] += n.memory_bytes
    return {i: min(range(len(m)), key=lambda k: (float(m[k]), float(graph.nodes[i].compute_s[k]), k))
            for i, m in held.items() if len(m)}


def _allowed_choices(graph: StrategyGraph, seeds: Sequence[Sequence[int]],
                     ngroups: int) -> tuple[dict[str, set[ChoiceKey]], dict[str, str]]:
    """``Sigma`` by signature (module docstring, step 3; replicate left out: always allowed) from the
    coarse ``seeds`` and every op's lightest strategy (step 5), and each op node's signature."""
    allowed: dict[str, set[ChoiceKey]] = {}
    signature_of: dict[str, str] = {}
    picks = [(i, k) for seed in seeds for i, k in enumerate(seed)] + list(lightest_ops(graph).items())
    for i, k in picks:
        node = graph.nodes[i]
        if node.kind != "op":
            continue
        signature_of[node.name] = node.signature
        keys = allowed.setdefault(node.signature, set())
        for d in range(ngroups):
            c = dim_choice(node.strategies[k], d)
            if not _is_replicate(c):
                keys.add(c)
    return allowed, signature_of


def _mesh_ndim(strategy: OpStrategy) -> int:
    for ps in (*strategy.output_placements, *strategy.input_placements):
        if ps is not None:
            return len(ps)
    return 0


def _is_replicate(choice: ChoiceKey) -> bool:
    return all(k is None or k == "R" for k in choice)


@dataclass(frozen=True, slots=True)
class SeedInfo:
    """What seeding took and found."""

    coarse_shape: tuple[int, ...]
    """The first coarse mesh's (:func:`seed_groupings`' first split); so are ``groups``, the step,
    status and strategy count."""
    groups: tuple[tuple[int, ...], ...]
    seconds: Mapping[str, float]
    """``build``, ``solve``: the coarse graphs' (``solve``: every seed's), summed over the coarse meshes."""
    coarse_step_s: float
    """Objective of the coarse solution (seconds; the coarse mesh's cost model)."""
    coarse_status: str
    coarse_strategies_mean: float
    seeds: int
    """Coarse solutions seeded from, on every coarse mesh (the plan, each baseline that solved, the memory-light one)."""
    memory_relaxed: bool
    """True when a coarse problem had no plan under the memory limit and was
    solved without one (the seed is then only a layout hint)."""
    coarse_shapes: tuple[tuple[int, ...], ...] = ()
    """Every coarse mesh seeded from, in order (module docstring, step 1)."""


def seeded_restriction(
    traced: Any,
    mesh: MeshSpec,
    profile: HardwareProfile,
    *,
    optimizer: OptimizerMemory | None = None,
    allow_uneven: bool = False,
    memory_limit: float | None = None,
    time_limit: float = 30.0,
    groups: Sequence[Sequence[int]] | None = None,
    backend: str = DEFAULT_BACKEND,
    seed_pins: Callable[[StrategyGraph], Iterable[Mapping[int, int]]] | None = None,
    memo: dict[Any, Any] | None = None,
    gap: float | None = None,
) -> tuple[SeededRestriction, SeedInfo]:
    """Solve ``traced`` on the coarse meshes and return the restriction for ``mesh``
    (module docstring). ``groups``: seed from that one split only (default: every split of
    :func:`seed_groupings`). ``memory_limit`` defaults to the profile's device memory (``math.inf``: none).
    ``seed_pins``: given a coarse graph, the resolved pins of further coarse
    solves (no memory limit) to seed from; the search passes
    ``autoshard.search.baselines.baseline_seed_pins`` so that each expert baseline
    keeps on the fine mesh the activation layouts it picks on the coarse one
    (measured on LLaMA-3-8B, 2x4x8: the baselines' estimates drop by up to 0.2 %,
    the plan's by 0.001 %, for four more coarse solves). A parameter, not an
    import: which pins to try is the search's concern, and the graph layer
    imports nothing above it. The coarse meshes share ``time_limit``: each is given an equal part of
    what the ones before it left, and at least :data:`LIGHT_SEED_SHARE` of ``time_limit`` (so the whole
    seed may run over it by that much a mesh); on one coarse mesh every
    solve ends within its part of the first one's start, but the memory-light seed (module docstring,
    step 5), which gets at least :data:`LIGHT_SEED_SHARE` of the part after the others.
    ``memo``: a dict kept by the caller across calls on the same ``traced``;
    fine meshes with a coarse mesh in common (``2x4x8`` and ``4x2x8`` both seed
    from ``8x8``) then share its build and solve (the seed is a function
    of the arguments: reused, it is the seed a fresh call would compute,
    unless the coarse solve stopped on its time limit). ``gap``: the relative gap that proves a coarse
    solve (None: the solver's default, 1e-9); the search passes the plan's own (``PLAN_GAP``, 1e-6): a
    seed needs no more precision than the plan it seeds, and toulbar2's integer rounding leaves its
    proofs a few 1e-7 short of 1e-9 (tiny Mixtral, 2x2x2: the coarse solve proven to 6.4e-7 by toulbar2
    after 3.3 s then ran windows for 10 s more, to its limit)."""
    groupings = (tuple(tuple(g) for g in groups),) if groups else seed_groupings(mesh.shape)
    allowed: dict[str, frozenset[ChoiceKey]] = {}
    signature_of: dict[str, str] = {}
    infos: list[SeedInfo] = []
    spent = 0.0
    for i, groups_t in enumerate(groupings):
        part = max((time_limit - spent) / (len(groupings) - i), LIGHT_SEED_SHARE * time_limit)
        found, names, info = _coarse_seed(traced, mesh, profile, groups_t, optimizer=optimizer,
                                          allow_uneven=allow_uneven, memory_limit=memory_limit, time_limit=part,
                                          backend=backend, seed_pins=seed_pins, memo=memo, gap=gap,
                                          memo_time=time_limit)
        spent += info.seconds["solve"]
        for signature, keys in found.items():
            allowed[signature] = allowed.get(signature, frozenset()) | keys
        # the signature is the builder's, a function of the node alone: every coarse mesh names it alike
        signature_of.update(names)
        infos.append(info)
    first = infos[0]
    info = SeedInfo(
        coarse_shape=first.coarse_shape, groups=first.groups,
        seconds={k: round(sum(x.seconds[k] for x in infos), 4) for k in ("build", "solve")},
        coarse_step_s=first.coarse_step_s, coarse_status=first.coarse_status,
        coarse_strategies_mean=first.coarse_strategies_mean, seeds=sum(x.seeds for x in infos),
        memory_relaxed=any(x.memory_relaxed for x in infos), coarse_shapes=tuple(x.coarse_shape for x in infos),
    )
    return SeededRestriction(allowed, signature_of), info


def _coarse_seed(
    traced: Any, mesh: MeshSpec, profile: HardwareProfile, groups_t: tuple[tuple[int, ...], ...], *,
    optimizer: OptimizerMemory | None, allow_uneven: bool, memory_limit: float | None, time_limit: float,
    backend: str, seed_pins: Callable[[StrategyGraph], Iterable[Mapping[int, int]]] | None,
    memo: dict[Any, Any] | None, gap: float | None, memo_time: float,
) -> tuple[dict[str, frozenset[ChoiceKey]], dict[str, str], SeedInfo]:
    """``Sigma`` by signature, each op's signature and what it took, from the solves on the coarse
    mesh of one split (module docstring, steps 2-5; :func:`seeded_restriction`'s arguments).
    ``memo_time``: the caller's whole time limit, which keys the memo (``time_limit``, this mesh's
    part of it, depends on what the meshes before it took)."""
    # imported here: builder imports nothing from this module, but keep the graph package's import order flat
    from solver import solve as solve_problem
    from solver.solution import Status

    from autoshard.graph.builder import build_graph
    from autoshard.graph.problem import to_problem

    coarse = coarse_mesh(mesh, groups_t)
    key = (id(traced), coarse.shape, coarse.strides, profile, optimizer, allow_uneven, memory_limit, memo_time,
           backend, seed_pins, gap)
    if memo is not None and key in memo:
        allowed, signature_of, info = memo[key]
        info = SeedInfo(info.coarse_shape, groups_t, {"build": 0.0, "solve": 0.0}, info.coarse_step_s,
                        info.coarse_status, info.coarse_strategies_mean, info.seeds, info.memory_relaxed)
        return allowed, signature_of, info
    t0 = time.perf_counter()
    graph = build_graph(traced, coarse, profile, optimizer=optimizer, ties=True, allow_uneven=allow_uneven)
    t1 = time.perf_counter()
    limit = float(profile.device.usable_memory_bytes if memory_limit is None else memory_limit)
    proof = {} if gap is None else {"gap": gap}
    # every coarse solve below ends by t1 + time_limit: the seed's share of the one time limit is all it gets
    # (an infinite limit, the caller's "no limit", is a problem without one)
    solution = solve_problem(to_problem(graph, memory_limit=limit if math.isfinite(limit) else None),
                             backend=backend, time_limit=time_limit, start_time=t1, **proof)
    relaxed = False
    if solution.status is Status.INFEASIBLE or not solution.choice:
        # no coarse plan fits: seed from the unconstrained optimum; the fine mesh may still fit
        # (all-replicate and every leaf layout stay available there)
        log.warning("seeded search: no coarse plan fits %s; seeding without the limit", format_bytes(limit))
        solution = solve_problem(to_problem(graph, memory_limit=None), backend=backend, time_limit=time_limit,
                                 start_time=t1, **proof)
        relaxed = True
    seeds = [solution.choice]
    for pins in (seed_pins(graph) if seed_pins is not None else ()):
        found = solve_problem(to_problem(graph, memory_limit=None, pins=pins), backend=backend,
                              time_limit=time_limit, start_time=t1, **proof)
        if found.choice:
            seeds.append(found.choice)
    # the first solve may have taken the whole share (a time-limited coarse solve runs to its end):
    # the light seed gets at least its own part of it, else it would rarely run where it is needed
    t_light = time.perf_counter()
    light = solve_problem(to_problem(graph, memory_limit=None, pins=light_pins(graph)), backend=backend,
                          time_limit=max(time_limit - (t_light - t1), LIGHT_SEED_SHARE * time_limit),
                          start_time=t_light, **proof)
    if light.choice:
        seeds.append(light.choice)
    else:
        log.info("seeded search: no memory-light coarse seed (%s)", light.status.value)
    t2 = time.perf_counter()
    allowed, signature_of = _allowed_choices(graph, seeds, len(groups_t))
    counts = [len(n.strategies) for n in graph.nodes if n.kind == "op"]
    info = SeedInfo(
        coarse_shape=coarse.shape, groups=groups_t,
        seconds={"build": round(t1 - t0, 4), "solve": round(t2 - t1, 4)},
        coarse_step_s=float(solution.cost), coarse_status=solution.status.value,
        coarse_strategies_mean=sum(counts) / max(len(counts), 1), seeds=len(seeds), memory_relaxed=relaxed,
    )
    frozen = {k: frozenset(v) for k, v in allowed.items()}
    if memo is not None:
        memo[key] = (frozen, signature_of, info)
    return frozen, signature_of, info
