"""Put a traced graph's independent twin runs in an order that does not depend on the hash seed.

Why: a trace records ops in the order the model's Python code runs them, and
some code iterates an unordered collection. Hugging Face's Gemma 3 computes
one rotary table per attention type with ``for layer_type in
set(config.layer_types)``: the iteration order of a ``set`` of strings follows
the process's hash seed (``PYTHONHASHSEED``, a different one per ``torchrun``
rank), so the two tables' ops come out in either order, fx names them in that
order (``mul_1`` is whichever came first), and the graph hash and the plan's
node names differ between ranks. The graph is the same; only the order of
two runs of ops that do not read each other differs.

What: a *twin group* is ``k >= 2`` consecutive runs ``R_0 .. R_{k-1}`` of
``L`` ``call_function`` nodes each, starting at position ``s``, such that node
``i`` of every run has the same op, the same non-tensor arguments and the
same output metadata as node ``i`` of ``R_0``, and every node argument is
either inside its own run at the same offset (the runs are copies of one
computation) or *external*: before ``s`` (so no run reads another and any
order of the runs is a valid topological order). A loop over an unordered
collection traces to exactly such a group; so does an ordinary loop, whose
order must stay as it is. Which groups are sorted, and by what:

[R] Ranks, free of the seed. A placeholder or constant ranks by its position
    (parameters and buffers in registration order, then the inputs); a node of
    a group that this pass has sorted ranks by ``(the group's position, its
    run's place in the sorted group)``. Other nodes have no rank.
[F] A forward group (no node reads the loss tangent) is sorted when its runs
    differ only in ranked arguments, by those ranks ascending: a loop over
    ``set(names)`` of modules or buffers comes out in their registration order.
[B] A backward group is sorted when its runs differ in ranked forward
    arguments, by those ranks *descending* (autograd runs the backward of a
    later forward op first), so the backward of an [F] group follows it.
    Otherwise the group keeps its trace order (its runs differ in values the
    trace made, and the order came from the code, not from a hash).

Sorting is stable; the nodes are then renamed by position: node ``j`` of the
group takes the name node ``j`` had (twin runs have the same ops, so names
keep their op prefixes and fx's counters are untouched). Groups are handled
front to back, so ranks read by a key are already canonical.

Why the hash of an already deterministic model stays as it was: a trace's
own order of such groups is their rank order (q/k projections read ``wq``
before ``wk``, a ``ModuleList`` of experts runs in order, autograd reverses
both), so nothing moves; ``tests/autoshard/trace/test_hash_seed.py`` traces
models under four hash seeds. Left order-dependent: a set loop whose
iterations differ only in values the trace made (no rank), or whose
backward runs autograd interleaves with other ops.

>>> import torch.fx as fx
>>> graph = fx.Graph()
>>> a, b, x = graph.placeholder("a"), graph.placeholder("b"), graph.placeholder("x")
>>> second = graph.call_function(torch.add, (x, b))
>>> first = graph.call_function(torch.add, (x, a))
>>> graph.output((first, second))
output
>>> canonical_order(graph)
1
>>> [n.args[1].name for n in graph.nodes if n.op == "call_function"]
['a', 'b']
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._functorch._aot_autograd import descriptors as aot_desc

__all__ = ["canonical_order", "MAX_RUN_NODES"]

MAX_RUN_NODES = 256
"""Longest run looked for; a loop body longer than this is left in trace order."""

_EXTERNAL = "external"


def canonical_order(graph: fx.Graph) -> int:
    """Sort every twin group of ``graph`` whose runs differ in ranked arguments, in place
    (module docstring); returns how many groups moved. The graph stays a valid
    topological order, with the same set of node names."""
    nodes = list(graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    backward = _tangent_dependent(nodes)
    # [R] placeholders and constants rank by position: their order has no seed in it
    rank: dict[fx.Node, tuple[int, int]] = {n: (i, 0) for i, n in enumerate(nodes) if n.op != "call_function"}
    signatures = [_signature(node) for node in nodes]
    at_signature: dict[Hashable, list[int]] = defaultdict(list)
    for i, signature in enumerate(signatures):
        if signature is not None:
            at_signature[signature].append(i)
    moved = 0
    for start in range(len(nodes)):
        if start == 0 or signatures[start] is None:
            continue
        # shortest runs first: a loop body's own twin runs are sorted before the loop's runs
        for length, count in _twin_groups(nodes, position, signatures, at_signature[signatures[start]], start):
            runs = [nodes[start + r * length: start + (r + 1) * length] for r in range(count)]
            keys = _run_keys(runs, start, position, backward, rank)
            if keys is None:
                continue
            order = sorted(range(count), key=lambda r: keys[r])
            if order != list(range(count)):
                _reorder(nodes, position, start, [node for r in order for node in runs[r]])
                moved += 1
            for canonical, r in enumerate(order):  # [R] a run's nodes rank by the group and the run's place in it
                for node in runs[r]:
                    rank.setdefault(node, (start, canonical))
    return moved


def _signature(node: fx.Node) -> Hashable | None:
    """What two corresponding nodes of twin runs share: op, target and output metadata
    (None for nodes that are no op: placeholders, constants, the output)."""
    if node.op != "call_function":
        return None
    return (node.target, _meta(node.meta.get("val")))


def _meta(value: Any) -> Hashable:
    """Shape, dtype and device of a traced value (tuples of them for multi-output ops)."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, (tuple, list)):
        return tuple(_meta(v) for v in value)
    return repr(value)


def _twin_groups(nodes: list[fx.Node], position: dict[fx.Node, int], signatures: list[Hashable | None],
                 same: list[int], start: int) -> Iterator[tuple[int, int]]:
    """``(run length, run count)`` of every twin group starting at ``start``, shortest runs first
    (``same``: the positions with the signature of ``start``, ascending)."""
    for candidate in same[_bisect_after(same, start):]:
        length = candidate - start
        if length > MAX_RUN_NODES or candidate + length > len(nodes):
            break
        if not _twins(nodes, position, signatures, start, length, 1):
            continue
        count = 2
        while start + (count + 1) * length <= len(nodes) and _twins(nodes, position, signatures, start, length, count):
            count += 1
        yield length, count


def _bisect_after(sorted_positions: list[int], start: int) -> int:
    """Index of the first entry of ``sorted_positions`` greater than ``start``."""
    low, high = 0, len(sorted_positions)
    while low < high:
        middle = (low + high) // 2
        if sorted_positions[middle] <= start:
            low = middle + 1
        else:
            high = middle
    return low


def _twins(nodes: list[fx.Node], position: dict[fx.Node, int], signatures: list[Hashable | None],
           start: int, length: int, run: int) -> bool:
    """Whether run ``run`` (of ``length`` nodes from ``start``) is a twin of run 0."""
    offset = run * length
    if signatures[start + offset: start + offset + length] != signatures[start: start + length]:
        return False  # the cheap test first: most candidates differ in an op
    for i in range(start, start + length):
        if signatures[i] is None:
            return False
        shape = _arguments(nodes[i], position, start, start)
        if shape is None or _arguments(nodes[i + offset], position, start, start + offset) != shape:
            return False
    return True


def _arguments(node: fx.Node, position: dict[fx.Node, int], group_start: int, run_start: int) -> Any:
    """The node's arguments with each node replaced by its offset in its run or :data:`_EXTERNAL`
    (before the group); None when it reads another run of the group."""
    inside = True

    def ref(arg: fx.Node) -> Any:
        nonlocal inside
        at = position[arg]
        if at < group_start:
            return _EXTERNAL
        if at >= run_start:
            return at - run_start
        inside = False
        return None

    # compared with ==, never hashed: lists, dicts, slices and dtypes compare by value
    shape = fx.node.map_aggregate((node.args, node.kwargs), lambda a: ("node", ref(a)) if isinstance(a, fx.Node) else a)
    return shape if inside else None


def _run_keys(runs: list[list[fx.Node]], start: int, position: dict[fx.Node, int], backward: set[fx.Node],
              rank: dict[fx.Node, tuple[int, int]]) -> list[tuple[int, ...]] | None:
    """Each run's sort key (module docstring), or None where the group keeps its trace order:
    its runs read the same nodes, or differ in an argument without a rank, or mix forward
    and backward."""
    external = [_external_arguments(run, start, position) for run in runs]
    slots = [i for i in range(len(external[0])) if len({id(args[i]) for args in external}) > 1]
    in_backward = {node in backward for run in runs for node in run}
    if not slots or len(in_backward) != 1:
        return None
    if not in_backward.pop():  # [F] every differing argument ranked; ascending
        if any(args[i] not in rank for args in external for i in slots):
            return None
        return [tuple(c for i in slots for c in rank[args[i]]) for args in external]
    # [B] autograd runs the backward of later forward ops first: the forward ranks descending
    forward_slots = [i for i in slots if all(args[i] not in backward for args in external)]
    if not forward_slots or any(args[i] not in rank for args in external for i in forward_slots):
        return None
    return [tuple(-c for i in forward_slots for c in rank[args[i]]) for args in external]


def _external_arguments(run: list[fx.Node], start: int, position: dict[fx.Node, int]) -> list[fx.Node]:
    """Every read of a node before the group, in argument order, repeats kept (so twins line up)."""
    found: list[fx.Node] = []
    for node in run:
        fx.node.map_arg((node.args, node.kwargs), lambda arg: found.append(arg) if position[arg] < start else None)
    return found


def _tangent_dependent(nodes: list[fx.Node]) -> set[fx.Node]:
    """Nodes that read the loss tangent, directly or through other nodes: the backward."""
    dependent: set[fx.Node] = set()
    for node in nodes:
        if node.op == "placeholder" and isinstance(node.meta.get("desc"), aot_desc.TangentAOTInput):
            dependent.add(node)
        elif any(arg in dependent for arg in node.all_input_nodes):
            dependent.add(node)
    return dependent


def _reorder(nodes: list[fx.Node], position: dict[fx.Node, int], start: int, new_order: list[fx.Node]) -> None:
    """Move the group at ``start`` into ``new_order`` and give position ``j`` the name it had."""
    names = [node.name for node in nodes[start: start + len(new_order)]]
    anchor = nodes[start - 1]  # a run reads something before it, so a group never starts the graph
    for node in new_order:
        anchor.append(node)
        anchor = node
    namespace = anchor.graph._graph_namespace  # names are swapped, not made: fx's counters must not move
    for j, (node, name) in enumerate(zip(new_order, names)):
        node.name = name
        namespace._rename_object(node, name)
        nodes[start + j] = node
        position[node] = start + j
