r"""Activation recomputation in the per-rank program: where each region re-runs its forward, and when values die.

A plan's ``recompute`` lists forward ops of checkpoint regions (repeated
blocks, ``PlanNode.region``) whose values the backward reads again. The
runtime runs them as a non-reentrant ``torch.utils.checkpoint`` does, with the
semantics the planner prices (``autoshard.graph.recompute``,
``autoshard.graph.regions``):

* **Where.** Region R's *recomputation phase* runs once, just before
  ``t_rc(R)``: the first backward op (program order) that reads a value made
  by R's forward. In the per-rank program it comes before the collectives
  issued and waited at that op's schedule position, then the op runs.
* **What.** The phase re-runs R's recomputed ops in forward order, with the
  tuple accesses of multi-output ones. Each recomputed op reads its inputs
  as they are then: a value recomputed earlier in the phase, or one that was
  kept (a saved value, a held forward-only one, a leaf). Every input whose
  edge has a redistribution is redistributed again, waited at once (the plan
  prices them in ``recompute_s``, outside the simulated schedule).
* **Lifetimes.** Every read of a value is a point of the program, ordered
  ``(i, 0, j)`` (phase step j before op i), ``(i, 1)`` (a collective issued
  at op i's schedule position), ``(i, 2)`` (op i itself). A value is freed
  after its last read. A recomputed value has two lives: the first pass,
  freed after its last read before its region's phase (its forward readers,
  and a collective the schedule issues from it earlier), and the recomputed
  one, made in the phase and freed after its last read from there on (the
  backward readers and later steps of the phase read it). So a recomputed
  value is not held from the forward to the backward, and a value a
  recomputed op reads (``hold``) lives until the phase has read it.
* **Random ops.** A recomputed dropout draws its mask again from the random
  state saved just before its first draw (``autoshard.runtime.random_ops``),
  then the stream goes on where it was: the same mask, and every later draw
  is the single-device run's.

One limit: a redistribution whose producer is recomputed and whose reader is
in the backward is issued where the plan's schedule says, which may be in the
forward (``autoshard.plan.schedule`` issues an activation's redistribution
right after its producer). It then reads the first-pass value (equal to the
recomputed one), which lives until that issue.

>>> # phases = recompute_phases(nodes, positions, plan.recompute, regions, backward)
>>> # frees = free_points(nodes, phases, keep, issues)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch.fx as fx

__all__ = ["RecomputePhase", "RecomputeError", "recompute_phases", "free_points"]


class RecomputeError(ValueError):
    """The plan's recomputation cannot run on this graph (names the op and why)."""


@dataclass(frozen=True, slots=True)
class RecomputePhase:
    """One region's recomputation in the per-rank program."""

    region: str
    """The block's module path (``layers.3``)."""
    at: int
    """Program index of ``t_rc``: the phase runs just before that program step."""
    position: int
    """The schedule position there (its collectives are recorded as issued and waited at it)."""
    steps: tuple[int, ...]
    """Program indices of the recomputed ops and their tuple accesses, in forward order."""


def _region(node: fx.Node, regions: Mapping[str, str]) -> str | None:
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return regions.get(node.args[0].name)
    return regions.get(node.name)


def recompute_phases(nodes: Sequence[fx.Node], positions: Sequence[int], recompute: Sequence[str],
                     regions: Mapping[str, str], backward: set[fx.Node]) -> list[RecomputePhase]:
    """The phases of a plan's ``recompute`` (module docstring), in program order.

    ``nodes``: the per-rank program's nodes (ops and tuple accesses, graph
    order); ``positions[i]``: the schedule position of program step i (the
    plan index of the next op); ``regions``: op name -> its checkpoint region
    (``PlanNode.region``); ``backward``: the backward's nodes
    (``autoshard.graph.regions.backward_nodes``).
    """
    index = {n: i for i, n in enumerate(nodes)}
    by_name = {n.name: n for n in nodes}
    wanted = set(recompute)
    per_region: dict[str, list[int]] = {}
    for name in recompute:
        node = by_name.get(name)
        if node is None:
            raise RecomputeError(f"recompute: {name} is not an op of the graph")
        region = regions.get(name)
        if region is None:
            raise RecomputeError(f"recompute: {name} has no checkpoint region in the plan")
        if node in backward:
            raise RecomputeError(f"recompute: {name} is a backward op")
        per_region.setdefault(region, []).append(index[node])
        for user in node.users:  # the tuple accesses of a multi-output op run again with it
            if user.target is operator.getitem and user in index:
                per_region[region].append(index[user])
    recomputed = {by_name[n] for n in wanted}
    for name in recompute:  # an input recomputed elsewhere would not exist yet (autoshard.graph.recompute, C3)
        for u in by_name[name].all_input_nodes:
            src = u.args[0] if u.target is operator.getitem else u
            if src in recomputed and regions.get(src.name) != regions.get(name):
                raise RecomputeError(f"recompute: {name} ({regions.get(name)}) reads {src.name}, recomputed in "
                                     f"another region ({regions.get(src.name)})")
    first: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node not in backward:
            continue
        for u in node.all_input_nodes:
            region = _region(u, regions) if u not in backward else None
            if region in per_region and region not in first:
                first[region] = i
    at_once: dict[int, tuple[list[str], set[int]]] = {}  # regions whose backward starts at one op share a phase
    for region, steps in per_region.items():
        if region not in first:
            raise RecomputeError(f"recompute: no backward op reads a value of {region}, so nothing recomputes it")
        at = first[region]
        if max(steps) >= at:
            raise RecomputeError(f"recompute: {nodes[max(steps)].name} runs after the backward of {region} starts")
        names, merged = at_once.setdefault(at, ([], set()))
        names.append(region)
        merged.update(steps)
    return [RecomputePhase(",".join(names), at, positions[at], tuple(sorted(steps)))
            for at, (names, steps) in sorted(at_once.items())]


def free_points(nodes: Sequence[fx.Node], phases: Sequence[RecomputePhase], keep: set[fx.Node],
                issues: Sequence[tuple[fx.Node, int]]) -> dict[tuple[int, ...], list[fx.Node]]:
    """Where each value dies: point -> the nodes freed after it (module
    docstring). A point is ``(i, 2)`` (after op i) or ``(i, 0, j)`` (after
    step j of the phase before op i). ``keep``: never freed (the step's
    results); ``issues``: (source node, program index of the op before which
    the schedule issues a collective reading it)."""
    index = {n: i for i, n in enumerate(nodes)}
    second_from: dict[fx.Node, int] = {}  # recomputed value -> program index of its phase
    made_again: dict[fx.Node, tuple[int, ...]] = {}
    for phase in phases:
        for j, k in enumerate(phase.steps):
            second_from[nodes[k]] = phase.at
            made_again[nodes[k]] = (phase.at, 0, j)
    last: dict[tuple[fx.Node, int], tuple[int, ...]] = {}  # (value, life: 0 first pass, 1 recomputed) -> last read

    def read(value: fx.Node, point: tuple[int, ...]) -> None:
        if value in keep:
            return
        life = 1 if value in second_from and point[0] >= second_from[value] else 0
        key = (value, life)
        if key not in last or point > last[key]:
            last[key] = point

    for i, node in enumerate(nodes):
        for u in node.all_input_nodes:
            read(u, (i, 2))
    for phase in phases:
        for j, k in enumerate(phase.steps):
            for u in nodes[k].all_input_nodes:
                read(u, (phase.at, 0, j))
    for source, i in issues:
        read(source, (i, 1))
    for value, made in made_again.items():  # a life without reads ends where it starts
        if value not in keep:
            last.setdefault((value, 0), (index[value], 2))
            last.setdefault((value, 1), made)
    out: dict[tuple[int, ...], list[fx.Node]] = {}
    for (value, _), point in sorted(last.items(), key=lambda kv: (kv[1], index.get(kv[0][0], -1))):
        where = (point[0], 2) if point[1] == 1 else point  # a collective's input: freed after that op
        out.setdefault(where, []).append(value)
    return out
