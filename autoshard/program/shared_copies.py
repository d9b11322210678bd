r"""One redistribution for the readers of a tensor that want it in the same placement, while its copy lives.

The integer program prices every edge on its own: a tensor read by two ops
that both want it replicated pays two all_reduces (the cross entropy's total
weight, read by the loss's division and by ``nll_loss_backward``, is the
common case: two scalar all_reduces, each a latency-bound collective). Once
the placements are chosen, the assembler lets a later reader read an earlier
reader's redistributed copy instead, when

- both redistribute the same output of the same producer (an op, not a leaf:
  parameter gathers have their own buckets and prefetch) from the same
  placement to the same placement (so the copy is the same tensor, whatever
  route each was planned with);
- both readers are ops, neither recomputed (a recomputation redistributes its
  inputs again, at its own time) nor in place (it could write the copy the
  other reads);
- the later reader runs after the earlier one, and its copy's interval starts
  before the earlier copy's ends:

      reuse(r2 -> r1)  iff  t(reader 1) <= t(reader 2)  and  start(copy 2) <= end(copy 1)

  so the one copy lives over the union of the two intervals, never longer
  than the two copies held together (the program's memory bound still
  holds; the plan's timeline keeps counting both, an over-count of at most
  the shared copy). A chain of such readers shares the first one's copy.

The reusing redistribution keeps its placements, drops its steps and cost, and
names the one it reuses (``Redistribution.reuses``); the runtime reads that
result (``autoshard.runtime.execute``), so the step runs exactly the
collectives the plan prices.

>>> from types import SimpleNamespace as NS
>>> nodes = [NS(name=n, kind="op", target="aten.mul.Tensor") for n in ("p", "a", "b")]
>>> edges = [NS(src=0, dst=1, dst_input=0, copy_live=((4, 6),)), NS(src=0, dst=2, dst_input=0, copy_live=((5, 7),))]
>>> times = {1: 5, 2: 6}
>>> from costmodel.placements import parse_placements as pp
>>> from costmodel.redistribute_steps import RedistributeStep
>>> from autoshard.plan.format import Redistribution
>>> ar = (RedistributeStep("all_reduce", (0,), 4, 1e-3, pp("P(sum)"), pp("R"), reduce_op="sum"),)
>>> rs = [Redistribution("p", "a", 0, 0, "P(sum)", "R", ar, 1e-3), Redistribution("p", "b", 0, 0, "P(sum)", "R", ar, 1e-3)]
>>> out, saved, _ = share_copies(NS(nodes=nodes, edges=edges), rs, times, set())
>>> out[1].reuses, round(saved, 4)
(('a', 0), 0.001)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from costmodel.redistribute_steps import COLLECTIVE_STEPS

__all__ = ["share_copies"]


def _mutates(target: str) -> bool:
    """An in-place op (``aten.add_.Tensor``, ``aten.copy_.default``): it may write the copy it reads."""
    parts = target.split(".")
    return len(parts) >= 2 and parts[1].endswith("_") and not parts[1].endswith("__")


def share_copies(graph: Any, redistributions: Sequence[Any], reader_time: Mapping[int, int],
                 recomputed: set[int]) -> tuple[list[Any], float, float]:
    """``redistributions`` with each later reader of a shareable copy reusing the earlier
    one's (module docstring), and the seconds saved of collectives and of local steps.
    ``graph``: an ``AssemblyGraph``; ``reader_time``: node index -> its time in the step."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    edge_of = {(graph.nodes[e.dst].name, e.dst_input): e for e in graph.edges if e.dst in reader_time}
    groups: dict[tuple, list[tuple[int, int, int, int]]] = {}  # key -> (reader time, start, end, position)
    for k, r in enumerate(redistributions):
        if r.reuses is not None or not any(s.collective in COLLECTIVE_STEPS for s in r.steps):
            continue
        e = edge_of.get((r.to, r.input_index))
        if e is None or not e.copy_live or e.dst in recomputed or index.get(r.tensor) != e.src:
            continue
        if graph.nodes[e.src].kind != "op" or graph.nodes[e.dst].kind != "op" or _mutates(graph.nodes[e.dst].target):
            continue
        start, end = min(s for s, _ in e.copy_live), max(t for _, t in e.copy_live)
        groups.setdefault((r.tensor, r.output_index, r.src, r.dst), []).append((reader_time[e.dst], start, end, k))
    out, saved, local = list(redistributions), 0.0, 0.0
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort()
        first, cover = None, -1
        for _, start, end, k in members:
            if first is not None and start <= cover:
                r = out[k]
                saved += sum(s.cost_s for s in r.steps if s.collective in COLLECTIVE_STEPS)
                local += sum(s.cost_s for s in r.steps if s.collective not in COLLECTIVE_STEPS)
                out[k] = replace(r, steps=(), cost_s=0.0, reuses=(out[first].to, out[first].input_index))
                cover = max(cover, end)
            else:
                first, cover = k, end
    return out, saved, local
