"""What PyTorch's caching allocator reserves for a plan: its tensors replayed, step after step.

The plan's peak (``autoshard.program.memory``) counts live tensors, what
``torch.cuda.max_memory_allocated`` measures. A CUDA device must also hold
what the caching allocator keeps (``max_memory_reserved``). This module
turns the timeline's terms (the same terms, so the op storages' lives are the step
program's: one tensor per life of a storage, allocated at its making, freed after its last
read) into allocations and frees and replays them through
``costmodel.allocator.CachingAllocator``:

- tensors held all step (parameters, buffers) are allocated once, before the
  first step, in graph order. A parameter's optimizer state (``moments``
  tensors of it, AdamW's ``exp_avg`` and ``exp_avg_sq``) is made at the first
  step's optimizer update, parameter by parameter, the way ``torch.optim``
  makes state lazily: in blocks the first step's activations freed.
- every other term is allocated at its start and freed at its end, each step;
  at one time the frees come first (a tensor's end is after its last reader),
  then the allocations in the timeline's order; at the update's time the
  allocations of that time, then the state, then the update's temporaries.
  A gradient is the block of the op that made it (AccumulateGrad keeps that
  tensor as ``.grad``): one allocation from the op to the step's end, where
  the placement is the same. A negative term (a gradient's sink before its
  FSDP2 reduction) delays the start of its tensor.
- known kernel workspaces (:data:`WORKSPACES`: FlashAttention's fp32 dQ
  accumulator) are allocated over their op's time step.
- ``steps`` steps are replayed (default 3): without ``empty_cache`` the
  reservation only grows, and the first step (which makes the state) and the
  second (whose activations meet the state's blocks) set it.
- streams: priced as FSDP2 runs, the sharded gradients a reduction makes are
  on its reduce-scatter stream (blocks of another stream are not reused);
  FSDP2's flat all-gather output (a unit's gathered bytes, allocated at the
  issue on its all-gather stream, freed once the wait copies it out into the
  parameters, which the timeline holds) is replayed on that stream (it is not
  in the timeline's peak: FSDP2 frees it before the unit's compute);
  everything else is on the compute stream.

What the replay cannot see: other kernels' workspaces and autograd's
temporaries inside one op (the timeline's time step is one op),
``record_stream`` delays, allocations outside the step (data loading,
checkpoints). Measured against ``max_memory_reserved``:
``benchmarks/results/h100_one_gpu.md`` (one H100, +16 % / -10 %) and
``benchmarks/results/published_runs.md`` (torchtitan's FSDP runs, -11 % / -0 %).

>>> spans = [(None, None, 64 * 2**20, ("node", 0), "param"),
...          (0, 2, 96 * 2**20, ("node", 1), "op"), (1, 3, 40 * 2**20, ("node", 2), "op")]
>>> peaks = replay_spans(spans, {}, optimizer_time=2)
>>> peaks.allocated_bytes // 2**20, peaks.reserved_bytes // 2**20
(200, 200)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from costmodel.allocator import AllocatorPeaks, CachingAllocator
from costmodel.shard_shapes import max_local_numel

from autoshard.program.actions import StepProgram
from autoshard.program.memory import CopyEvent, Span, exact_spans

__all__ = ["plan_reservation", "replay_spans", "state_splits", "REDUCE_SCATTER_STREAM", "ALL_GATHER_STREAM",
           "DEFAULT_STEPS"]

REDUCE_SCATTER_STREAM = "reduce_scatter"
ALL_GATHER_STREAM = "all_gather"
DEFAULT_STEPS = 3


def state_splits(graph: Any, problem: Any, choice: Sequence[int], *, mixed_precision: bool = False,
                 fsdp2: bool = False) -> dict[tuple, tuple[float, tuple[float, ...]]]:
    """Parameter node key -> (bytes held from the start, the state tensors made at the first update).

    A parameter node's memory is the parameter and its optimizer state
    (``autoshard.graph.builder``, ``OptimizerMemory``): ``k`` moments of the
    parameter's local elements, each in the parameter's dtype, or fp32 with
    ``mixed_precision``, beside the parameter (and its fp32 master copy with
    ``mixed_precision``; only the fp32 shard priced as FSDP2 holds it). ``k`` is
    what the node's bytes leave room for (AdamW 2, SGD with momentum 1, else 0),
    so the split needs no optimizer table (and no torch)."""
    first_edge: dict[int, Any] = {}
    for e in graph.edges:
        first_edge.setdefault(e.src, e)
    mesh = graph.mesh.shape
    out = {}
    for i, node in enumerate(graph.nodes):
        if node.kind != "param" or i not in first_edge:
            continue
        e = first_edge[i]
        numel = max_local_numel(e.shape, node.strategies[choice[i]].output_placements[e.src_output], mesh)
        if not numel:
            continue
        moment = 4 * numel if mixed_precision else e.itemsize * numel
        held = 4 * numel if (mixed_precision and fsdp2) else (e.itemsize + (4 if mixed_precision else 0)) * numel
        rest = float(problem.nodes[i].memory_bytes[choice[i]]) - held
        k = round(rest / moment)
        if k >= 1:
            out[("node", i)] = (float(held), (rest / k,) * k)
    return out


def replay_spans(spans: Sequence[Span], splits: Mapping[tuple, tuple[float, tuple[float, ...]]], *,
                 optimizer_time: int, steps: int = DEFAULT_STEPS, expandable_segments: bool = False,
                 capacity_bytes: float | None = None, streams: Mapping[str, str] | None = None,
                 kept: Mapping[tuple, tuple] | None = None) -> AllocatorPeaks:
    """The allocator's peaks over ``steps`` replays of ``spans`` (:func:`exact_spans`'s terms):
    ``splits`` (:func:`state_splits`) makes a held tensor's state at ``optimizer_time`` of the first
    step; ``streams``: span kind -> stream (default: one stream); ``kept``: a key -> the key of the
    tensor it continues (a gradient AccumulateGrad keeps: the producer's block lives on to the
    gradient's end, no second allocation) where both have the same bytes."""
    streams = streams or {}
    held: list[tuple[float, str]] = []
    lazy: list[tuple[float, str]] = []
    terms: dict[tuple, list[float]] = {}  # key -> [start, end, bytes] of its positive term
    streams_of: dict[tuple, str] = {}
    updates: set[tuple] = set()  # the optimizer update's temporaries
    order: list[tuple] = []
    for start, end, amount, key, kind in spans:
        stream = streams.get(kind, "default")
        if start is None:
            first, states = splits.get(key, (amount, ()))
            held.append((first, stream))
            lazy.extend((s, stream) for s in states)
        elif amount > 0:
            if key in terms:  # a second positive term of one key (a copy re-made): its own tensor
                key = (*key, len(order))
            terms[key] = [start, end, amount]
            streams_of[key] = stream
            if kind == "opt_temp":
                updates.add(key)
            order.append(key)
        elif key in terms and terms[key][0] == start:  # a negative prefix: the tensor is made later
            terms[key][0] = min(end, terms[key][1])
    for key, producer in (kept or {}).items():
        if key in terms and producer in terms and terms[key][2] == terms[producer][2] \
                and terms[producer][0] < terms[key][0] <= terms[producer][1]:
            terms[producer][1] = max(terms[producer][1], terms.pop(key)[1])
    order = [key for key in order if key in terms]
    period = max([t[1] for t in terms.values()] + [optimizer_time + 1])
    allocs: dict[int, list[tuple]] = {}
    frees: dict[int, list[tuple]] = {}
    for key in order:
        start, end, _ = terms[key]
        if start < end:
            allocs.setdefault(int(start), []).append(key)
            frees.setdefault(int(end), []).append(key)
    allocator = CachingAllocator(expandable_segments=expandable_segments,
                                 capacity_bytes=None if capacity_bytes is None else int(capacity_bytes))
    for nbytes, stream in held:
        if nbytes > 0:
            allocator.malloc(int(nbytes), stream)
    for step in range(steps):
        live: dict[tuple, int] = {}
        for t in range(period + 1):
            for key in frees.get(t, ()):
                if key in live:
                    allocator.free(live.pop(key))
            later = []
            for key in allocs.get(t, ()):
                if t == optimizer_time and key in updates:
                    later.append(key)
                else:
                    live[key] = allocator.malloc(int(terms[key][2]), streams_of[key])
            if step == 0 and t == optimizer_time:  # the update's state, then its temporaries
                for nbytes, stream in lazy:
                    allocator.malloc(int(nbytes), stream)
            for key in later:
                live[key] = allocator.malloc(int(terms[key][2]), streams_of[key])
        for handle in live.values():  # nothing outlives the step (zero_grad(set_to_none=True))
            allocator.free(handle)
    return allocator.peaks()


def plan_reservation(graph: Any, problem: Any, choice: Sequence[int], copies: Sequence[CopyEvent],
                     buckets: Sequence[Any], *, program: StepProgram, mixed_precision: bool = False,
                     extra: Sequence[tuple[int, int, float]] = (),
                     flat_gathers: Sequence[tuple[int, int, float]] = (), param_views: Mapping[int, int] | None = None,
                     fsdp2_reductions: bool = False, expandable_segments: bool = False,
                     capacity_bytes: float | None = None, steps: int = DEFAULT_STEPS) -> AllocatorPeaks:
    """The caching allocator's peaks for a plan (module docstring): ``graph`` an
    ``AssemblyGraph``, the rest as ``autoshard.program.memory.exact_timeline`` takes them (``program``:
    the step program whose lives the timeline counts), ``extra``
    (start, end, bytes) terms beside them (prefetched gathers held before their readers),
    ``flat_gathers`` FSDP2's flat all-gather outputs (a unit's gathered bytes, from the issue to
    the copy-out at the wait), on the all-gather stream."""
    spans = exact_spans(graph, problem, choice, copies, buckets, program=program, param_views=param_views,
                        fsdp2_reductions=fsdp2_reductions)
    spans.extend((s, e, float(b), ("prefetch", k), "prefetch") for k, (s, e, b) in enumerate(extra))
    spans.extend((s, max(e, s + 1), float(b), ("flat_gather", k), "flat_gather")
                 for k, (s, e, b) in enumerate(flat_gathers))
    spans.extend(kernel_workspaces(graph, problem, choice))
    # the update is the step's last time: what lives to the end of the step ends one after it
    optimizer_time = max((n.live[1] for n in problem.nodes if n.live is not None), default=1) - 1
    kept = {} if fsdp2_reductions else _kept_gradients(graph, spans)
    streams = {"grad": REDUCE_SCATTER_STREAM} if fsdp2_reductions else {}
    streams["flat_gather"] = ALL_GATHER_STREAM
    splits = state_splits(graph, problem, choice, mixed_precision=mixed_precision, fsdp2=fsdp2_reductions)
    return replay_spans(spans, splits, optimizer_time=optimizer_time,
                        steps=steps, expandable_segments=expandable_segments, capacity_bytes=capacity_bytes,
                        streams=streams, kept=kept)


WORKSPACES = {
    # FlashAttention-2's backward (PyTorch's flash kernel) accumulates dQ in fp32: a query-sized
    # fp32 buffer (``dq_accum``, seqlen rounded up to 128) for the length of the kernel
    "aten._scaled_dot_product_flash_attention_backward.default": (0, 4),
}
"""Op -> (input whose shape the workspace takes, bytes per element): buffers a CUDA kernel
allocates through the caching allocator and frees when it returns (not in the traced graph)."""


def kernel_workspaces(graph: Any, problem: Any, choice: Sequence[int]) -> list[Span]:
    """Spans of the :data:`WORKSPACES` of the plan's ops: over the op's own time step."""
    wanted = {i: WORKSPACES[n.target] for i, n in enumerate(graph.nodes) if n.kind == "op" and n.target in WORKSPACES}
    out: list[Span] = []
    if not wanted:
        return out
    mesh = graph.mesh.shape
    for e in graph.edges:
        spec = wanted.get(e.dst)
        if spec is None or e.dst_input != spec[0] or problem.nodes[e.dst].live is None:
            continue
        placement = graph.nodes[e.dst].strategies[choice[e.dst]].input_placements[e.dst_input]
        t = problem.nodes[e.dst].live[0]
        out.append((t, t + 1, float(max_local_numel(e.shape, placement, mesh) * spec[1]), ("workspace", e.dst),
                    "workspace"))
    return out


def _kept_gradients(graph: Any, spans: Sequence[Span]) -> dict[tuple, tuple]:
    """Gradient sink key -> the key of the op whose output it is (through views, which own no
    memory): AccumulateGrad keeps that tensor as ``.grad`` (same placement: same bytes)."""
    owners = {key for s, _, amount, key, _ in spans if s is not None and amount > 0}
    source: dict[int, list[int]] = {}
    for e in graph.edges:
        source.setdefault(e.dst, []).append(e.src)
    out = {}
    for i, node in enumerate(graph.nodes):
        if node.kind != "grad" or len(source.get(i, ())) != 1:
            continue
        p = source[i][0]
        while ("node", p) not in owners and len(source.get(p, ())) == 1 and graph.nodes[p].kind == "op":
            p = source[p][0]  # a view of the producer's storage
        if ("node", p) in owners and graph.nodes[p].kind == "op":
            out[("node", i)] = ("node", p)
    return out
