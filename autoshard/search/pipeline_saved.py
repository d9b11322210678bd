r"""The saved-tensor and transient figures of one solved stage plan, for ``autoshard.search.pipeline_blocks``.

Split out of :mod:`autoshard.search.pipeline_blocks`, whose module docstring states the rules these
compute: (h') the blocks' outputs ``O, O_sp``; (h'') and (h''') the residual stream's saved tensors
``Q, Q_sp`` and the gathering modules' saved inputs ``N, N_sp, E, N_max``; Transients (t1), (t2)
``T_blk, T_head``; ``K`` the live bytes at the loss. Each function reads one solved plan of the
strategy graph at its chosen strategies; none solves anything.

>>> # _transients(prep.traced, prep.graph, plan, chosen_strategies(prep.graph, plan), end)
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from autoshard.assembly.engine_pricing import edge_links

__all__ = ["_transients", "_activation_spans", "_last_read", "_block_outputs", "_stream_saved", "_live_at"]


def _transients(traced: Any, graph: Any, plan: Any, chosen: Sequence[tuple[Any, int]],
                end: int) -> tuple[float, float]:
    """(t2), (t1): ``(T_head, T_blk)`` of ``plan`` (module docstring, Transients); ``(0, 0)`` where
    the trace has no module paths or blocks."""
    paths, blocks = getattr(traced, "module_paths", None) or {}, getattr(traced, "blocks", ())
    t_loss = graph.times.get(plan.nodes[end].name)
    if not paths or not blocks or t_loss is None:
        return 0.0, 0.0
    in_block = lambda p: p is not None and any(p == b or p.startswith(b + ".") for b in blocks)  # noqa: E731
    block_times = [t for name, t in graph.times.items() if in_block(paths.get(name))]
    forward, backward = [t for t in block_times if t <= t_loss], [t for t in block_times if t > t_loss]
    if not forward or not backward:
        return 0.0, 0.0
    head_from, head_to = max(forward) + 1, min(backward)  # H = [head_from, head_to)
    spans = _activation_spans(graph, chosen, set(getattr(plan, "recompute", ())), head_from, t_loss)
    head = other = 0.0
    for t in sorted({s for s, _, _ in spans}):
        tau = sum(b for s, e, b in spans if s <= t < e)
        if head_from <= t < head_to:
            head = max(head, tau)
        else:
            other = max(other, tau)
    return head, other


def _activation_spans(graph: Any, chosen: Sequence[tuple[Any, int]], recomputed: set[str], head_from: int,
                      t_loss: int) -> list[tuple[int, int, float]]:
    """``(start, end, bytes)`` of what ``tau`` sums: every op storage at its chosen placement over
    its live interval (the solver's, at least the program's), a recomputed one again from its
    region's recomputation phase to its last reader, and every activation's redistributed copy
    (a parameter's and a gradient's are held through the step: ``S``), less the saved ones
    (``kept``: live at the loss, made before the head). ``recomputed``: the plan's recomputed ops
    (``Plan.recompute``; a chosen strategy names placements, not the state)."""
    from autoshard.program.memory import param_view_roots
    from autoshard.program.schedule import VIEW_OPS
    from costmodel.shard_shapes import max_local_numel

    choice = {graph.index[node.name]: k for node, k in chosen}
    _, readers = edge_links(graph)  # edges by producer
    phase = {r.index: r.phase_start for r in getattr(graph, "regions", ())}
    out = []
    for i, k in choice.items():
        node, nbytes = graph.nodes[i], float(graph.nodes[i].memory_bytes[k])
        if not nbytes or node.live is None:
            continue
        again = node.name in recomputed
        if again or not (node.live[0] < head_from and node.live[0] <= t_loss < node.live[1]):
            out.append((node.live[0], node.live[1], nbytes))
        if again and node.region in phase:
            out.append((phase[node.region], _last_read(graph, i, readers) + 1, nbytes))
    roots = param_view_roots(graph, VIEW_OPS)
    for j, e in enumerate(graph.edges):
        if e.src not in choice or e.dst not in choice or e.src in roots:
            continue
        made = graph.nodes[e.src].strategies[choice[e.src]].output_placements[e.src_output]
        read = graph.nodes[e.dst].strategies[choice[e.dst]].input_placements[e.dst_input]
        if made is None or read is None or made == read:  # a non-tensor argument, or no copy
            continue
        again = graph.nodes[e.dst].name in recomputed and graph.copy_live_recomputed
        lives = (graph.copy_live_recomputed[j] if again else graph.copy_live[j]) if graph.copy_live else ()
        nbytes = float(max_local_numel(e.tensor.shape, read, graph.mesh.shape) * e.tensor.dtype.itemsize)
        out.extend((s, t, nbytes) for s, t in lives)
    return out


def _last_read(graph: Any, i: int, readers: Mapping[int, list[Any]]) -> int:
    """The time of the last op reading node ``i``'s storage, through its views."""
    from autoshard.graph.liveness import is_view_name

    last, todo, seen = graph.nodes[i].live[0], [i], {i}
    while todo:
        for e in readers.get(todo.pop(), ()):
            j = e.dst
            node = graph.nodes[j]
            last = max(last, graph.times.get(node.name, last))
            if node.kind == "op" and is_view_name(node.target) and j not in seen:
                seen.add(j)
                todo.append(j)
    return last


def _block_outputs(graph: Any, chosen: Sequence[tuple[Any, int]]) -> tuple[float, float]:
    """(h'): ``(O, O_sp)``, the bytes per rank of every block's output (its region's last forward
    op) at the chosen placement, and split along the sequence over the mesh dim ``tp`` where the
    plan replicates it there (torch's sequence parallelism between blocks, as torchtitan runs).
    ``(0, 0)`` without regions (a graph built without recomputation)."""
    from costmodel.placements import Replicate

    regions = getattr(graph, "regions", ())
    names = list(getattr(graph.mesh, "dim_names", ()))
    tp = graph.mesh.shape[names.index("tp")] if "tp" in names else 1
    last_ops = {r.members[-1] for r in regions if r.members}
    outputs = split = 0.0
    for node, k in chosen:
        if node.name not in last_ops:
            continue
        nbytes = float(node.memory_bytes[k])
        on_tp = node.strategies[k].output_placements[0][names.index("tp")] if tp > 1 else None
        outputs += nbytes
        split += nbytes / tp if isinstance(on_tp, Replicate) else nbytes
    return outputs, split


def _stream_saved(traced: Any, graph: Any, plan: Any, chosen: Sequence[tuple[Any, int]],
                  end: int) -> tuple[float, float, float, float, float, float]:
    """(h''), (h'''): ``(Q, Q_sp, N, N_sp, E, N_max)``, the bytes per rank of what the blocks keep for
    their backward on their residual stream and of the gathering modules' saved inputs (module
    docstring), at the chosen placement and split along the sequence over ``tp`` where the plan
    replicates them there, the all-gathers on ``tp`` that rebuild the latter and the largest of
    them. Zeros without module paths, blocks or ``tp``."""
    from autoshard.graph.liveness import is_view_name
    from costmodel.collectives import collective_time_s
    from costmodel.placements import Replicate
    from costmodel.shard_shapes import max_local_numel

    paths, blocks = getattr(traced, "module_paths", None) or {}, getattr(traced, "blocks", ())
    names = list(getattr(graph.mesh, "dim_names", ()))
    t_loss = graph.times.get(plan.nodes[end].name)
    if not paths or not blocks or "tp" not in names or t_loss is None:
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    at, tp = names.index("tp"), graph.mesh.shape[names.index("tp")]
    inside = lambda p, roots: p is not None and any(p == r or p.startswith(r + ".") for r in roots)  # noqa: E731
    # the modules the stage runtime runs on the gathered sequence (autoshard.runtime.pipeline_sp): the
    # parents of the blocks' linear layers (an attention, a feed-forward), split over tp or not
    gathered = {fqn.rsplit(".", 2)[0] for fqn, i in graph.params.items()
                if fqn.endswith(".weight") and inside(fqn, blocks) and graph.nodes[i].outputs
                and graph.nodes[i].outputs[0] is not None and len(graph.nodes[i].outputs[0].shape) == 2}
    recomputed = set(getattr(plan, "recompute", ()))
    _, readers = edge_links(graph)

    def read_gathered(i: int) -> bool:
        todo, seen = [i], {i}
        while todo:
            for e in readers.get(todo.pop(), ()):
                node = graph.nodes[e.dst]
                if inside(paths.get(node.name), gathered):
                    return True
                if node.kind == "op" and is_view_name(node.target) and e.dst not in seen:
                    seen.add(e.dst)
                    todo.append(e.dst)
        return False

    whole = split = g_whole = g_split = regather = largest = 0.0
    shapes: list[tuple[int, ...]] = []  # of the stream's tensors
    inputs: list[tuple[Any, int, float, bool]] = []  # the gathering modules' saved inputs: node, strategy, bytes
    for node, k in chosen:
        nbytes, path = float(node.memory_bytes[k]), paths.get(node.name)
        if not nbytes or node.live is None or node.name in recomputed or not node.live[0] <= t_loss < node.live[1]:
            continue
        if not inside(path, blocks) or inside(path, gathered):
            continue
        made = node.strategies[k].output_placements
        on_tp = isinstance(made[0][at] if made and made[0] is not None else None, Replicate)
        if read_gathered(graph.index[node.name]):
            inputs.append((node, k, nbytes, on_tp))
            continue
        whole += nbytes
        split += nbytes / tp if on_tp else nbytes
        if node.outputs and node.outputs[0] is not None:
            shapes.append(tuple(node.outputs[0].shape))
    # (h''') what the runtime gathers is a module's hidden state, the residual stream's shape (the
    # stream's largest tensor); a smaller input made in the block (a slice of the rotary table) is kept whole
    stream_shape = max(shapes, key=math.prod, default=())
    for node, k, nbytes, on_tp in inputs:
        if not node.outputs or node.outputs[0] is None or tuple(node.outputs[0].shape) != stream_shape:
            continue
        g_whole += nbytes
        g_split += nbytes / tp if on_tp else nbytes
        if on_tp:  # the gather moves the hidden state alone (a fused norm's storage holds its statistics too)
            made = node.strategies[k].output_placements[0]
            hidden = float(max_local_numel(stream_shape, made, graph.mesh.shape) * node.outputs[0].dtype.itemsize)
            regather += collective_time_s("all_gather", hidden, (at,), graph.mesh, graph.profile)
            largest = max(largest, hidden)
    return whole, split, g_whole, g_split, regather, largest


def _live_at(timeline: Sequence[tuple[int, float]], time: int | None) -> float:
    """The live bytes of ``timeline`` (changes, in time order) at ``time`` (0 when unknown)."""
    if time is None or not timeline:
        return 0.0
    level = 0.0
    for t, nbytes in timeline:
        if t > time:
            break
        level = nbytes
    return float(level)
