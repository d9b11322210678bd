r"""The per-rank schedule of a plan: where each collective is issued and where it is waited.

The runtime does not wait for a collective where it issues it. It issues a
redistribution as soon as its input exists and waits for it just before its
reader, and a gradient bucket as soon as its last member gradient is made,
waiting for it before the optimizer step; parameter all-gathers are issued
ahead of their reader (FSDP2's prefetch). Where each one is issued and waited
is part of the plan (this schedule), so that the order the runtime executes
is the order the estimate prices (``costmodel.overlap``), and the collective
trace can be checked against it. Torch-free, like the plan format.

**Positions.** The plan's op nodes (``plan.nodes``, the joint graph's order:
forward, loss, backward) are numbered ``0 .. N-1``; position ``p`` is the
point just before op ``p`` runs, and ``N`` the point after the last op (the
loss, gradients and buffer updates are handed over there, then the optimizer
steps). Every rank runs the same schedule (SPMD), so collectives meet in the
same order on every process group.

**Items.** One per redistribution with at least one collective step (named by
its edge: producer, reader, reader input) that is not in a gradient or gather
bucket, one per gradient bucket (by its index in ``plan.buckets``) and one per
gather bucket (``plan.gather_buckets``: leaf all-gathers issued as one). Each has ``issue`` and
``wait`` positions, ``issue <= wait``. At a position the runtime issues that
position's items in list order, then waits for that position's items, then
runs the op. A redistribution of several collective steps runs its steps in
order at ``issue``, waiting each but the last at once (a step needs the
previous one's result), and the last one at ``wait``; local steps after it
run at ``wait``.

**Rules** (:func:`build_schedule`):

* a redistribution of an op's output: issued at ``producer + 1``, waited at its
  reader (``N`` for the sinks: loss, gradients, buffer updates);
* a gradient bucket: issued at ``max(member producer) + 1`` (its last member
  gradient exists), waited at ``N`` (DDP's overlap of the reduction with the
  rest of the backward);
* a redistribution of a leaf (parameter, input, buffer): the leaf exists from
  the start, and issuing every gather at position 0 would hold every gathered
  parameter at once. Such items are ordered by reader and chained: item ``k``
  is issued where item ``k - d`` is waited (position 0 for ``k < d``), with
  ``d`` the **prefetch depth** (FSDP2 prefetches one layer: ``d`` counts
  collectives here); ``d = 0`` issues each at its reader (no prefetch). A
  gather bucket is one item of that chain, waited at its first member's reader;
* a **leaf view** (``Schedule.leaf_views``: an op node that only views a leaf,
  ``t(weight)`` above all, read by a linear layer's ``mm``) is a leaf here: a
  linear layer's sharded weight is gathered as its transposed view, and
  without this rule that gather could only be issued at the ``t`` just before
  its reader, one collective per weight and no prefetch. The runtime makes
  every leaf view before position 0 (a view holds no memory of its own), so
  its gathers join the prefetch chain and gather buckets (FSDP2's one gather
  per block, issued a block ahead);

* the list is ordered by (issue, wait, plan order).

**Memory.** A prefetched gather holds its output from ``issue`` to its reader
earlier than an unprefetched one (a gather bucket holds each member's output
until that member's reader): :func:`prefetch_intervals` gives those extra
intervals (bytes of the gathered tensor), which the plan's peak memory
counts, and the assembler picks the prefetch depth and gather bucket cap whose
simulated step is best among those that fit the memory limit
(``autoshard.assembly.assemble``). One of the caps is "one bucket per module
block" (:func:`gather_blocks`: FSDP2's unit, issued a block ahead with prefetch
1); a plan priced with FSDP2's held copies (``gather="fsdp2"``,
``autoshard.graph.copies``) takes exactly that, so that it runs as it was priced.

**Extension: recompute regions.** The item kinds are open: a later
``{"recompute": [op names], "at": p, ...}`` item can re-run forward ops at
position ``p`` of the backward, with its own input redistributions as edge
items whose reader is the recomputed op (their ``issue``/``wait`` positions
then lie in the backward, before ``p``). The rules above apply unchanged to
those edges; validation needs the recomputed ops' positions.

>>> from costmodel.redistribute_steps import RedistributeStep
>>> from costmodel.placements import parse_placements as pp
>>> ag = RedistributeStep("all_gather", (0,), 64, 1e-3, pp("S(0)"), pp("R"), tensor_dim=0)
>>> class R:  # a redistribution: producer, reader, input, steps
...     def __init__(self, tensor, to): self.tensor, self.to, self.input_index, self.steps = tensor, to, 0, (ag,)
>>> s = build_schedule(["mm", "relu", "mm_1"], [R("param:w1", "mm"), R("param:w2", "mm_1")], (), prefetch=1)
>>> [(i.edge[1], i.issue, i.wait) for i in s.items]
[('mm', 0, 0), ('mm_1', 0, 2)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from costmodel.overlap import StepSimulation, Transfer, simulate
from costmodel.redistribute_steps import COLLECTIVE_STEPS

from autoshard.graph.node_ids import is_leaf_tensor

__all__ = ["DEFAULT_PREFETCH", "ScheduleError", "ScheduleItem", "Schedule", "build_schedule", "check_schedule",
           "schedule_transfers", "simulate_schedule", "prefetch_intervals", "collective_redistributions", "leaf_gathers",
           "VIEW_OPS", "leaf_views", "gather_blocks", "module_block", "gathered_bytes"]

DEFAULT_PREFETCH = 1
"""Prefetch depth of plans that carry no schedule (written before schedules existed)."""


class ScheduleError(ValueError):
    """A schedule that does not fit its plan (names the item and why)."""


@dataclass(frozen=True, slots=True)
class ScheduleItem:
    """One collective (or chain of collectives) of the plan, with its positions."""

    issue: int
    wait: int
    edge: tuple[str, str, int] | None = None
    """(producer, reader, reader input) of a redistribution."""
    bucket: int | None = None
    """Index of a gradient bucket in ``plan.buckets``."""
    gather: int | None = None
    """Index of a gather bucket in ``plan.gather_buckets``."""

    @property
    def key(self) -> tuple[Any, ...]:
        """``("edge", producer, reader, input)``, ``("bucket", index)`` or ``("gather", index)``."""
        if self.edge is not None:
            return ("edge", *self.edge)
        return ("bucket", self.bucket) if self.bucket is not None else ("gather", self.gather)

    def to_dict(self) -> dict[str, Any]:
        what: dict[str, Any] = ({"edge": list(self.edge)} if self.edge is not None else
                                {"bucket": self.bucket} if self.bucket is not None else {"gather": self.gather})
        return {**what, "issue": self.issue, "wait": self.wait}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "ScheduleItem":
        if not isinstance(data, Mapping):
            raise ScheduleError(f"{where}: expected an object")
        unknown = set(data) - {"edge", "bucket", "gather", "issue", "wait"}
        if unknown:
            raise ScheduleError(f"{where}.{sorted(unknown)[0]}: unknown key (allowed: bucket, edge, gather, issue, "
                                "wait)")
        for key in ("issue", "wait"):
            if not isinstance(data.get(key), int) or isinstance(data.get(key), bool):
                raise ScheduleError(f"{where}.{key}: expected an integer position, got {data.get(key)!r}")
        if sum(k in data for k in ("edge", "bucket", "gather")) != 1:
            raise ScheduleError(f"{where}: give exactly one of edge, bucket or gather")
        if "edge" in data:
            edge = data["edge"]
            if not (isinstance(edge, list) and len(edge) == 3 and isinstance(edge[0], str) and isinstance(edge[1], str)
                    and isinstance(edge[2], int) and not isinstance(edge[2], bool)):
                raise ScheduleError(f"{where}.edge: expected [producer, reader, reader input], got {edge!r}")
            return cls(data["issue"], data["wait"], edge=(edge[0], edge[1], edge[2]))
        kind = "bucket" if "bucket" in data else "gather"
        index = data[kind]
        if not isinstance(index, int) or isinstance(index, bool):
            raise ScheduleError(f"{where}.{kind}: expected a bucket index, got {index!r}")
        return cls(data["issue"], data["wait"], **{kind: index})


@dataclass(frozen=True, slots=True)
class Schedule:
    """Issue and wait positions of every collective of a plan, in issue order (module docstring)."""

    positions: int
    """``N``: the plan's op nodes; positions run over ``0 .. N``."""
    prefetch: int
    """Prefetch depth of leaf gathers (module docstring)."""
    items: tuple[ScheduleItem, ...]
    leaf_views: tuple[str, ...] = ()
    """Op nodes that view a leaf (or another leaf view) and nothing else: ready at
    position 0, like the leaf (module docstring). Empty in plans written before them."""

    def to_dict(self) -> dict[str, Any]:
        out = {"positions": self.positions, "prefetch": self.prefetch, "collectives": [i.to_dict() for i in self.items]}
        if self.leaf_views:
            out["leaf_views"] = list(self.leaf_views)
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "schedule") -> "Schedule":
        if not isinstance(data, Mapping):
            raise ScheduleError(f"{where}: expected an object")
        unknown = set(data) - {"positions", "prefetch", "collectives", "leaf_views"}
        if unknown:
            raise ScheduleError(f"{where}.{sorted(unknown)[0]}: unknown key (allowed: collectives, leaf_views, "
                                "positions, prefetch)")
        for key in ("positions", "prefetch"):
            value = data.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ScheduleError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
        items = data.get("collectives")
        if not isinstance(items, list):
            raise ScheduleError(f"{where}.collectives: expected a list")
        views = data.get("leaf_views", [])
        if not isinstance(views, list) or not all(isinstance(v, str) for v in views):
            raise ScheduleError(f"{where}.leaf_views: expected a list of op node names, got {views!r}")
        return cls(data["positions"], data["prefetch"],
                   tuple(ScheduleItem.from_dict(x, f"{where}.collectives[{i}]") for i, x in enumerate(items)),
                   tuple(views))


def _has_collective(steps: Iterable[Any]) -> bool:
    return any(s.collective in COLLECTIVE_STEPS for s in steps)


def collective_redistributions(redistributions: Sequence[Any], buckets: Sequence[Any],
                               gathers: Sequence[Any] = ()) -> list[Any]:
    """The redistributions that issue collectives themselves (outside gradient and
    gather buckets), in plan order."""
    bucketed = {m for b in buckets for m in b.members}
    gathered = {tuple(m) for g in gathers for m in g.members}
    return [r for r in redistributions if _has_collective(r.steps) and r.to not in bucketed
            and (r.tensor, r.to, r.input_index) not in gathered]


def _positions(node_names: Sequence[str]) -> dict[str, int]:
    return {name: i for i, name in enumerate(node_names)}


def _producer_ready(tensor: str, pos: Mapping[str, int], leaf_views: Iterable[str] = ()) -> int:
    """The first position where a value exists: after its op, or 0 for a leaf or a leaf view."""
    return pos[tensor] + 1 if tensor in pos and tensor not in leaf_views else 0


def _is_leaf(tensor: str, pos: Mapping[str, int], leaf_views: Iterable[str] = ()) -> bool:
    return tensor not in pos or tensor in leaf_views


VIEW_OPS = frozenset({"aten.t.default", "aten.transpose.int", "aten.permute.default", "aten.view.default",
                      "aten._unsafe_view.default", "aten.alias.default", "aten.expand.default"})
"""Ops whose output is a view of their one tensor input (no kernel, no memory): what a leaf view may be."""


def leaf_views(candidates: Sequence[tuple[str, str]], redistributions: Sequence[Any]) -> tuple[str, ...]:
    """The leaf views (module docstring) among ``candidates``: ``(view op node,
    the node it views)`` in graph order, each a :data:`VIEW_OPS` op whose one
    tensor input is a leaf or an earlier candidate. A view whose input is
    redistributed reads a value made at run time, so it is none, nor is a view
    of it. Only those that matter are kept: views whose value a collective
    reads, and the views they are made from.

    >>> class R:
    ...     def __init__(self, tensor, to, steps): self.tensor, self.to, self.input_index, self.steps = tensor, to, 0, steps
    >>> gather = [type("Step", (), {"collective": "all_gather"})()]
    >>> rs = [R("param:w2", "t_1", gather), R("t_2", "mm", gather)]
    >>> leaf_views([("t", "param:w1"), ("t_1", "param:w2"), ("t_2", "t"), ("t_3", "t_1")], rs)
    ('t', 't_2')
    """
    moved = {r.to for r in redistributions}
    views: dict[str, str] = {}
    for name, source in candidates:
        if name not in moved and (is_leaf_tensor(source) or source in views):
            views[name] = source
    keep: set[str] = set()
    for r in redistributions:
        name = r.tensor
        if name in views and _has_collective(r.steps):
            while name in views and name not in keep:
                keep.add(name)
                name = views[name]
    return tuple(v for v in views if v in keep)


def module_block(name: str, regions: Sequence[str] = ()) -> str:
    """The module block (FSDP2 unit) a parameter named ``name`` belongs to: the
    longest of ``regions`` that prefixes it; without regions, the name up to its
    first numeric part; ``""`` (the root) for the rest (:func:`gather_blocks`).

    >>> module_block("layers.3.attention.wq.weight"), module_block("output.weight", ("layers.3",))
    ('layers.3', '')
    """
    if regions:
        return max((r for r in regions if name.startswith(r + ".")), key=len, default="")
    parts = name.split(".")
    numeric = next((k for k, part in enumerate(parts[:-1]) if part.isdigit()), None)
    return ".".join(parts[:numeric + 1]) if numeric is not None else ""


def gather_blocks(edges: Iterable[tuple[str, str, int]], candidates: Sequence[tuple[str, str]],
                  regions: Iterable[str] = ()) -> dict[tuple[str, str, int], str]:
    """The module block of each leaf gather's leaf (``edge[0]``, a leaf view traced
    back to its leaf through ``candidates``): the longest of ``regions`` (the
    plan's repeated blocks, ``layers.3``) that prefixes the parameter's name;
    without regions, the name up to its first numeric part (``layers.3.attention.wq.weight``
    -> ``layers.3``: the blocks FSDP2 is wrapped around in torchtitan); ``""`` for
    the rest (the root module, as FSDP2's root ``fully_shard``).

    ``edges`` come in reader order; a block's leaf read again after it was read
    (the backward pass regathering the forward's weights) starts the block's next
    pass, ``layers.3#1``: adjacent passes of one block (the last block's forward
    and its backward, with nothing read between them) must not share a bucket,
    which would gather the same weights twice in one collective.

    >>> gather_blocks([("param:layers.1.w.weight", "mm", 0), ("t", "mm_1", 0), ("param:out.weight", "mm_2", 0)],
    ...               [("t", "param:layers.0.w.weight")])
    {('param:layers.1.w.weight', 'mm', 0): 'layers.1', ('t', 'mm_1', 0): 'layers.0', ('param:out.weight', 'mm_2', 0): ''}
    """
    source = dict(candidates)
    blocks = tuple(set(regions))
    out = {}
    passes: dict[str, tuple[int, set[str]]] = {}  # block -> (its pass, the leaves read in that pass)
    for edge in edges:
        leaf = edge[0]
        while leaf in source:
            leaf = source[leaf]
        block = module_block(leaf.split(":", 1)[-1], blocks)
        count, seen = passes.get(block, (0, set()))
        if leaf in seen:
            count, seen = count + 1, set()
        seen.add(leaf)
        passes[block] = (count, seen)
        out[edge] = f"{block}#{count}" if count else block
    return out


def leaf_gathers(node_names: Sequence[str], redistributions: Sequence[Any], buckets: Sequence[Any],
                 leaf_views: Iterable[str] = ()) -> list[Any]:
    """The redistributions of leaves (and leaf views) read by ops that issue
    collectives, in reader order (the prefetch chain's order; what gather buckets group)."""
    pos = _positions(node_names)
    views = frozenset(leaf_views)
    rs = [r for r in collective_redistributions(redistributions, buckets)
          if _is_leaf(r.tensor, pos, views) and r.to in pos]
    return sorted(rs, key=lambda r: pos[r.to])


def build_schedule(node_names: Sequence[str], redistributions: Sequence[Any], buckets: Sequence[Any], *,
                   prefetch: int = DEFAULT_PREFETCH, gathers: Sequence[Any] = (),
                   leaf_views: Sequence[str] = ()) -> Schedule:
    """The schedule of a plan's collectives by the rules of the module docstring.

    ``node_names``: the plan's op nodes in order; ``redistributions``: objects
    with ``tensor``, ``to``, ``input_index``, ``steps`` (``plan.redistributions``);
    ``buckets``: ``plan.buckets``; ``gathers``: ``plan.gather_buckets``;
    ``leaf_views``: op nodes that only view a leaf (module docstring).
    """
    if prefetch < 0:
        raise ScheduleError(f"prefetch: {prefetch} is negative")
    pos = _positions(node_names)
    views = frozenset(leaf_views)
    n = len(node_names)
    ordered: list[tuple[int, int, int, ScheduleItem]] = []  # (issue, wait, plan order, item)
    chain: list[tuple[int, int, dict[str, Any]]] = []  # leaf items: (wait, plan order, item fields)
    for order, r in enumerate(collective_redistributions(redistributions, buckets, gathers)):
        wait = pos.get(r.to, n)
        edge = (r.tensor, r.to, r.input_index)
        if _is_leaf(r.tensor, pos, views) and r.to in pos:
            chain.append((wait, order, {"edge": edge}))
            continue
        item = ScheduleItem(_producer_ready(r.tensor, pos, views), wait, edge=edge)
        ordered.append((item.issue, item.wait, order, item))
    base = len(redistributions)
    for g, bucket in enumerate(gathers):
        chain.append((min(pos.get(m[1], n) for m in bucket.members), base + g, {"gather": g}))
    chain.sort(key=lambda t: (t[0], t[1]))
    for k, (wait, order, what) in enumerate(chain):
        issue = wait if prefetch == 0 else (chain[k - prefetch][0] if k >= prefetch else 0)
        ordered.append((issue, wait, order, ScheduleItem(issue, wait, **what)))
    producer = {r.to: r.tensor for r in redistributions}
    base += len(gathers)
    for b, bucket in enumerate(buckets):
        issue = max((_producer_ready(producer.get(m, ""), pos) for m in bucket.members), default=n)
        ordered.append((min(issue, n), n, base + b, ScheduleItem(min(issue, n), n, bucket=b)))
    ordered.sort(key=lambda t: t[:3])
    return Schedule(n, prefetch, tuple(t[3] for t in ordered), tuple(v for v in node_names if v in views))


def check_schedule(schedule: Schedule, node_names: Sequence[str], redistributions: Sequence[Any],
                   buckets: Sequence[Any], where: str = "schedule", gathers: Sequence[Any] = ()) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` schedules every collective
    of the plan exactly once, at positions where its input exists and before
    its reader, in issue order."""
    pos = _positions(node_names)
    n = len(node_names)
    if schedule.positions != n:
        raise ScheduleError(f"{where}.positions: {schedule.positions}, the plan has {n} op nodes")
    wanted = {("edge", r.tensor, r.to, r.input_index): r
              for r in collective_redistributions(redistributions, buckets, gathers)}
    producer = {r.to: r.tensor for r in redistributions}
    seen: set[tuple[Any, ...]] = set()
    last_issue = 0
    views = frozenset(schedule.leaf_views)
    for name in schedule.leaf_views:
        if name not in pos:
            raise ScheduleError(f"{where}.leaf_views: {name!r} is not an op node of the plan")
    for i, item in enumerate(schedule.items):
        path = f"{where}.collectives[{i}]"
        if not 0 <= item.issue <= item.wait <= n:
            raise ScheduleError(f"{path}: positions issue {item.issue}, wait {item.wait} are not "
                                f"0 <= issue <= wait <= {n}")
        if item.issue < last_issue:
            raise ScheduleError(f"{path}: issued at {item.issue}, before the item above it ({last_issue}): "
                                "items are listed in issue order")
        last_issue = item.issue
        key = item.key
        if key in seen:
            raise ScheduleError(f"{path}: {_describe(item)} is scheduled twice")
        seen.add(key)
        if item.edge is not None:
            r = wanted.get(key)
            if r is None:
                raise ScheduleError(f"{path}: {_describe(item)} is not a redistribution of the plan that issues "
                                    "collectives outside a bucket")
            ready, reader = _producer_ready(r.tensor, pos, views), pos.get(r.to, n)
        elif item.gather is not None:
            if not 0 <= item.gather < len(gathers):
                raise ScheduleError(f"{path}: no gather bucket {item.gather} (the plan has {len(gathers)})")
            ready, reader = 0, min(pos.get(m[1], n) for m in gathers[item.gather].members)
        else:
            if not 0 <= item.bucket < len(buckets):
                raise ScheduleError(f"{path}: no bucket {item.bucket} (the plan has {len(buckets)})")
            ready = max((_producer_ready(producer.get(m, ""), pos) for m in buckets[item.bucket].members), default=0)
            reader = n
        if item.issue < ready:
            raise ScheduleError(f"{path}: {_describe(item)} is issued at {item.issue}, before its input exists "
                                f"(position {ready})")
        if item.wait > reader:
            raise ScheduleError(f"{path}: {_describe(item)} is waited at {item.wait}, after its reader "
                                f"(position {reader})")
    missing = ([k for k in wanted if k not in seen] + [("bucket", b) for b in range(len(buckets))
                                                        if ("bucket", b) not in seen]
               + [("gather", g) for g in range(len(gathers)) if ("gather", g) not in seen])
    if missing:
        k = missing[0]
        what = (f"the redistribution {k[1]} -> {k[2]} (input {k[3]})" if k[0] == "edge" else
                f"bucket {k[1]}" if k[0] == "bucket" else f"gather bucket {k[1]}")
        raise ScheduleError(f"{where}: {what} issues collectives but is not scheduled")


def _describe(item: ScheduleItem) -> str:
    if item.edge is not None:
        return f"edge {item.edge[0]} -> {item.edge[1]} (input {item.edge[2]})"
    return f"bucket {item.bucket}" if item.bucket is not None else f"gather bucket {item.gather}"


def schedule_transfers(schedule: Schedule, redistributions: Sequence[Any], buckets: Sequence[Any],
                       gathers: Sequence[Any] = (), *,
                       issued: Sequence[ScheduleItem] | None = None) -> tuple[list[Transfer], list[tuple[int, float]]]:
    """The schedule as ``costmodel.overlap`` transfers (collective steps' ``cost_s``
    in order; a bucket's one collective), and the local steps as compute:
    ``(position, seconds)`` at each redistribution's reader, a bucket's packing
    at its issue and its unpacking at its wait. ``issued``: the items in the order a
    step program issues them (``autoshard.program.actions.simulate_program``); by
    default the schedule's own order, which is the same."""
    by_edge = {("edge", r.tensor, r.to, r.input_index): r for r in redistributions}
    transfers: list[Transfer] = []
    local: list[tuple[int, float]] = []
    items = schedule.items if issued is None else issued
    for item in items:
        if item.edge is not None:
            steps = by_edge[item.key].steps
            transfers.append(Transfer(item.issue, item.wait,
                                      tuple(float(s.cost_s) for s in steps if s.collective in COLLECTIVE_STEPS)))
        else:
            bucket = gathers[item.gather] if item.gather is not None else buckets[item.bucket]
            transfers.append(Transfer(item.issue, item.wait, (float(bucket.cost_s),)))
            # its flat buffer's copies run on the compute stream: packed by the op before the issue,
            # unpacked after the wait (by the op the wait comes before)
            local += [(max(item.issue - 1, 0), float(bucket.pack_s)), (item.wait, float(bucket.unpack_s))]
    pos_of = {}
    for item in items:
        if item.edge is not None:
            pos_of[item.key] = item.wait
    n = schedule.positions
    for r in redistributions:
        seconds = float(sum(s.cost_s for s in r.steps if s.collective not in COLLECTIVE_STEPS))
        if seconds > 0:
            local.append((pos_of.get(("edge", r.tensor, r.to, r.input_index), n), seconds))
    return transfers, local


def simulate_schedule(schedule: Schedule, op_compute_s: Sequence[float], redistributions: Sequence[Any],
                      buckets: Sequence[Any], *, tail_s: float = 0.0, contention: float = 0.0,
                      gathers: Sequence[Any] = (), skew_s: float = 0.0,
                      issued: Sequence[ScheduleItem] | None = None) -> StepSimulation:
    """The simulated step of a plan (``costmodel.overlap.simulate``): op compute
    per position, local re-layouts at their readers, the collectives as scheduled
    (in ``issued`` order when given: :func:`schedule_transfers`), and ``tail_s``
    (the optimizer step) after the last position."""
    transfers, local = schedule_transfers(schedule, redistributions, buckets, gathers, issued=issued)
    compute = [float(c) for c in op_compute_s]
    tail = float(tail_s)
    for p, seconds in local:
        if p < len(compute):
            compute[p] += seconds
        else:
            tail += seconds
    return simulate(compute, transfers, tail_s=tail, contention=contention, skew_s=skew_s)


def gathered_bytes(redistribution: Any) -> int:
    """Bytes a leaf gather's output holds: those of its last collective step."""
    return int([s for s in redistribution.steps if s.collective in COLLECTIVE_STEPS][-1].bytes)


def prefetch_intervals(schedule: Schedule, redistributions: Sequence[Any], gathers: Sequence[Any] = (),
                       node_names: Sequence[str] = ()) -> list[tuple[int, int, int]]:
    """``(issue, until, bytes)`` of every leaf gather whose output is held before
    its reader's position: a prefetched gather from ``issue`` to its reader, a
    gather bucket's member from the bucket's ``issue`` to that member's reader
    (module docstring, Memory)."""
    by_edge = {("edge", r.tensor, r.to, r.input_index): r for r in redistributions}
    pos = _positions(node_names)
    out = []
    for item in schedule.items:
        if item.gather is not None:
            for member in gathers[item.gather].members:
                until = pos.get(member[1], schedule.positions)
                if item.issue < until:
                    out.append((item.issue, until, gathered_bytes(by_edge[("edge", *member)])))
            continue
        if item.edge is None or item.issue >= item.wait or not (
                is_leaf_tensor(item.edge[0]) or item.edge[0] in schedule.leaf_views):
            continue
        out.append((item.issue, item.wait, gathered_bytes(by_edge[item.key])))
    return out
