r"""Redistributed copies: how long they hold memory, and what the integer program charges for them.

The runtime redistributes a tensor per reader (``autoshard.runtime``): the
collective's output - an all-gathered parameter, an all-gathered activation,
a re-laid-out shard - is a new tensor at the reader's required placement. It
lives from the redistribution to the end of its reader:

- a reader that owns its output (``mm``) consumes the copy and drops it:
  ``[t_v, t_v + 1)``;
- a view reader (``t``, ``view``) returns an alias of the copy, which then
  lives as long as the view's aliases are read: ``[t_v, A_v)``, with ``A_v``
  one past the last reader of the view or of any view of it;
- a reader recomputed at ``t_rc`` (``autoshard.graph.recompute``) makes the
  copy again: ``[t_rc, t_rc + 1)`` for an owner, ``[t_rc, A_v)`` for a
  saved view, and its forward copy ends after its last forward reader.

:func:`copy_intervals` is the one place that says so: the builder calls it
for every edge and hands the intervals to the plan assembler, which counts a
copy exactly where a redistribution really happens (the chosen placements
differ). When collectives are issued earlier than their reader (parameter
prefetch), this function is what moves the start.

**The integer program.** A copy exists only for some (producer, reader)
placement pairs, and the problem format has node memory only: a pair's
memory is not expressible. So the program charges an *upper bound* on the
reader side, in a memory node tied to the reader (same strategy list,
``ties``) and live over the copy's interval: for reader strategy ``k``,

    bound(k) = sum over inputs i of  bytes(input i at k's placement)  if  exists a: 0 < M_i[a, k] < inf

(``M_i`` the input's edge matrix: some producer strategy would need a
redistribution). A plan the program deems within the memory limit is then
within it. The bound exceeds the truth only at the reader's own time, by at
most the reader's inputs (one op's inputs, for an owner reader).

**Views.** For a view the bound would be loose over a long interval (a
parameter's ``t`` lives from the forward to the backward, and its bound
would charge the whole parameter even in DDP, where no copy is made). So a
view takes its input as it comes wherever it can: on an edge into a view,
a producer strategy ``a`` for which some view strategy reads exactly
``a``'s placement may pair only with such strategies
(:func:`view_copy_rule`; the others get ``inf``); the redistribution then
happens at the view's readers, where the copy is short-lived (FSDP's
"reshard after forward": a parameter is gathered for the forward and again
for the backward). Only producer strategies with no exact match keep their
redistribution into the view, and only those count in its bound.

A *growing* view (:func:`growing_view`: its output has more elements than
its input; ``expand``, an overlapping ``unfold`` or ``as_strided``) is the
exception: it reads each input element several times, so a redistribution
after it moves the repeated elements (GQA's ``repeat_kv`` expands K/V to
the query heads: ``heads / kv_heads`` times the bytes of one all-gather
before it) and its edge has no such rule: the copy may be made on the
input. It is still an alias - of the copy when one is made - so the copy
lives as a view reader's does (``[t_v, A_v)``) and the view itself owns
no memory (``autoshard.graph.liveness``): the expanded bytes are never
counted, as they are never materialised (the reader that needs them
contiguous, the ``clone`` of a ``reshape``, owns them). Its bound counts
the input's bytes wherever some producer strategy needs a copy; those are
the small side of the view.

**Gather schedules.** :data:`GATHER_SCHEDULES` names when a copy of a
*parameter* (a redistribution whose source storage is a parameter) exists:

- ``reader`` (the default; what autoshard's runtime does today): as above,
  per reader;
- ``fsdp2`` (what FSDP2 ``fully_shard`` does, one unit per repeated block
  and the root): a unit's parameters are gathered for the unit's forward
  and again for its backward, and the next unit's gather is prefetched
  while the current one runs; the root unit's stay gathered all step
  (:func:`fsdp2_interval`). It serves to compare the memory model with
  FSDP2's measured memory; when autoshard's runtime prefetches, its
  schedule will be priced here.

**Gradient buckets.** A bucketed gradient reduction (``costmodel.buckets.grouping``)
waits for its bucket: the members' partial gradients live until the bucket's
last member is made, then their concatenated payload is one more copy. The
program charges, tied to each gradient's producer, its output where that
output is partial (the payload, at its own time) and twice that (waiting,
and its share of the payload) until the last gradient that can share its
bucket is made: buckets are runs of consecutive gradients of at most the
cap (``B``) bytes, so that is the latest producer within ``B`` bytes on
either side. (A bucket of one reduction kind skips gradients of another
kind, so a plan that mixes kinds can hold a bucket longer than this; the
plan's timeline counts the real buckets, and ``fits`` says so.) The
assembler counts the real buckets.

>>> copy_intervals(ReaderSpan(time=5, keep_end=6, forward_end=6, recompute_time=20, recompute_end=21), False)
((5, 6),)
>>> copy_intervals(ReaderSpan(time=5, keep_end=6, forward_end=6, recompute_time=20, recompute_end=21), True)
((5, 6), (20, 21))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["ReaderSpan", "copy_intervals", "BUCKET_BOUND_FACTOR", "view_copy_rule", "growing_view", "copy_possible",
           "GATHER_SCHEDULES", "UnitSpans", "unit_spans", "fsdp2_interval", "ParamGathers", "param_gather_schedule",
           "fsdp2_reduction", "fsdp2_payload_ends"]

GATHER_SCHEDULES = ("reader", "fsdp2")

BUCKET_BOUND_FACTOR = 2
"""A waiting gradient, and its part of the bucket's payload."""


@dataclass(frozen=True, slots=True)
class ReaderSpan:
    """When a reader's input copies are alive (module docstring)."""

    time: int
    """``t_v``: the reader's position on the time axis."""
    keep_end: int
    """End of the copy when the reader runs once: ``t_v + 1`` for an owner, ``A_v`` for a view."""
    forward_end: int
    """End of the forward copy of a recomputed reader (one past its last forward alias reader)."""
    recompute_time: int | None = None
    """``t_rc`` of the reader's region (None: never recomputed)."""
    recompute_end: int | None = None
    """End of the copy made again at ``t_rc``."""


def copy_intervals(reader: ReaderSpan, recomputed: bool) -> tuple[tuple[int, int], ...]:
    """``[start, end)`` intervals of a redistributed copy read by ``reader``
    (recomputed or not): the one definition of a copy's lifetime."""
    if not recomputed or reader.recompute_time is None:
        return ((reader.time, reader.keep_end),)
    end = reader.recompute_end if reader.recompute_end is not None else reader.recompute_time + 1
    return ((reader.time, reader.forward_end), (reader.recompute_time, end))


@dataclass(frozen=True, slots=True)
class UnitSpans:
    """Where each FSDP unit's ops run: ``[first, last + 1)`` per unit and phase."""

    order: tuple[str, ...]
    """The block units in model order (the root unit is ``""``)."""
    forward: Mapping[str, tuple[int, int]]
    backward: Mapping[str, tuple[int, int]]
    end: int
    """The optimizer step."""


def unit_spans(nodes: Iterable[tuple[int, str, bool]], order: Sequence[str], end: int) -> UnitSpans:
    """Spans of the units from (time, unit, in backward) of every op."""
    spans: dict[bool, dict[str, list[int]]] = {False: {}, True: {}}
    for t, unit, backward in nodes:
        span = spans[backward].setdefault(unit, [t, t + 1])
        span[0], span[1] = min(span[0], t), max(span[1], t + 1)
    return UnitSpans(tuple(order), {u: (a, b) for u, (a, b) in spans[False].items()},
                     {u: (a, b) for u, (a, b) in spans[True].items()}, end)


def fsdp2_interval(spans: UnitSpans, unit: str, backward: bool) -> tuple[int, int]:
    """When FSDP2 holds a gathered parameter of ``unit`` read in the forward or
    the backward: the unit's span in that phase, from the start of the unit
    that runs before it (the prefetch); the root's: all step."""
    if unit not in spans.order:
        return (0, spans.end)
    table = spans.backward if backward else spans.forward
    start, stop = table.get(unit, (0, spans.end))
    k = spans.order.index(unit)
    neighbour = k + 1 if backward else k - 1  # the backward runs the units in reverse
    previous = spans.order[neighbour] if 0 <= neighbour < len(spans.order) else None
    if previous is not None and previous in table:
        start = min(start, table[previous][0])
    return (start, stop)


def fsdp2_reduction(last_gradient: int, backward_end: int = 0) -> int:
    """``R_u``: when FSDP2 starts a unit's reduction, a step after its last gradient is made
    (``last_gradient``) and no earlier than the end of the unit's backward (``backward_end``:
    its post-backward reshards the gathered parameters first). The one rule both the
    integer program's bounds (``autoshard.graph.tied_memory``) and the plan's timeline
    (``autoshard.program.memory``) use.

    >>> fsdp2_reduction(7), fsdp2_reduction(7, backward_end=12)
    (8, 12)
    """
    return max(last_gradient + 1, backward_end)


def fsdp2_payload_ends(reductions: Iterable[int]) -> dict[int, int]:
    """Each reduction time ``R`` -> when its reduce-scatter input is freed: FSDP2 keeps it
    until the next unit's reduction starts (the first later ``R``); the last one's, a step.

    >>> fsdp2_payload_ends([12, 8, 8, 20])
    {8: 12, 12: 20, 20: 21}
    """
    ordered = sorted(set(reductions))
    return {r: (ordered[k + 1] if k + 1 < len(ordered) else r + 1) for k, r in enumerate(ordered)}


class ParamGathers:
    """The ``fsdp2`` gather schedule (``autoshard.graph.copies``): reader -> its parameter copies' interval."""

    def __init__(self, params: frozenset[str], unit: Mapping[str, str], backward: frozenset[str],
                 spans: UnitSpans) -> None:
        self.params, self.unit, self.backward, self.spans = params, unit, backward, spans

    def __call__(self, reader: str) -> tuple[int, int]:
        return fsdp2_interval(self.spans, self.unit.get(reader, ""), reader in self.backward)


def param_gather_schedule(traced: Any, liveness: Any, gather: str) -> "ParamGathers | None":
    """The reader -> parameter-copy interval function of schedule ``gather`` for
    the traced graph (a :class:`autoshard.trace.TracedGraph`; None for ``reader``,
    which :func:`copy_intervals` covers)."""
    from autoshard.graph.regions import backward_nodes  # torch: imported when a traced graph is in hand

    if gather not in GATHER_SCHEDULES:
        raise ValueError(f"gather: expected one of {', '.join(GATHER_SCHEDULES)}, got {gather!r}")
    if gather == "reader":
        return None
    blocks = tuple(traced.blocks)
    paths = traced.module_paths
    backward = frozenset(n.name for n in backward_nodes(traced.graph_module.graph, traced.tangent))
    unit = {}
    for name, path in paths.items():
        unit[name] = next((b for b in blocks if path == b or path.startswith(b + ".")), "")
    ops = [(liveness.time[n.name], unit.get(n.name, ""), n.name in backward)
           for n in traced.graph_module.graph.nodes if n.op == "call_function"]
    params = frozenset(n.name for n in traced.params.values())
    return ParamGathers(params, unit, backward, unit_spans(ops, blocks, liveness.end))


def view_copy_rule(matrix: np.ndarray, src: Sequence[object], dst: Sequence[object]) -> tuple[np.ndarray, np.ndarray]:
    """The edge matrix into a view with redistributions forbidden where the
    view can read the producer's placement as it is, and which view
    strategies may still receive a copy (module docstring).

    >>> m, copies = view_copy_rule(np.array([[0.0, 2.0], [3.0, 0.0], [1.0, 4.0]]), ["R", "S", "P"], ["R", "S"])
    >>> m.tolist(), copies.tolist()
    ([[0.0, inf], [inf, 0.0], [1.0, 4.0]], [True, True])
    """
    exact = _equal(src, dst)
    matched = exact.any(axis=1)
    out = matrix.copy()
    out[matched[:, None] & ~exact] = np.inf
    copies = ((~matched[:, None]) & np.isfinite(matrix) & (matrix > 0)).any(axis=0)
    return out, copies


def growing_view(input_numel: int, output_numel: int) -> bool:
    """Whether a view op with an input of ``input_numel`` elements and an output of
    ``output_numel`` reads its input repeatedly (``expand``): then its edge takes a copy
    on the input, not after the view (module docstring, "Views").

    >>> growing_view(2 * 4 * 8, 2 * 16 * 8), growing_view(64, 64), growing_view(64, 8)
    (True, False, False)
    """
    return output_numel > input_numel


def copy_possible(matrix: np.ndarray) -> np.ndarray:
    """Per reader strategy: whether some producer strategy needs a redistribution (``0 < M < inf``)."""
    return (np.isfinite(matrix) & (matrix > 0)).any(axis=0)


def _index(items: Sequence[object]) -> tuple[list[object], np.ndarray]:
    seen: dict[object, int] = {}
    index = np.fromiter((seen.setdefault(x, len(seen)) for x in items), dtype=np.int64, count=len(items))
    return list(seen), index


def _equal(src: Sequence[object], dst: Sequence[object]) -> np.ndarray:
    """``E[a, k] = src[a] == dst[k]``, compared once per distinct pair."""
    us, ua = _index(src)
    vs, vb = _index(dst)
    distinct = np.array([[u == v for v in vs] for u in us], dtype=bool).reshape(len(us), len(vs))
    return distinct[np.ix_(ua, vb)]
