r"""Pipeline (``pp``) and context-parallel (``cp``) layouts of the mesh search: which, pinned how, bounded how.

:mod:`autoshard.search.mesh_search` solves the dp / tp layouts of
:mod:`autoshard.search.mesh_layouts`; this module adds two kinds next to them
and says how each is priced and cut.

**pp layouts** (:func:`pipeline_layouts_for`): ``(pp, dp, tp)`` with ``pp``
outermost, ``pp`` dividing the node count (every stage a set of whole nodes: the
stage boundary's sends are what cross the slow links, as torchtitan and Megatron
place it) and at most the model's repeated blocks (one block per stage at
least), ``tp`` dividing the node size; dims of size 1 dropped but ``pp``; by
``pp``, then ``tp`` descending: the fewest stages first (the least bubble), and
of those the ones whose stages hold the least (p3 below), which a deadline then
reaches for a model too large for the rest. On one node there are none: stages
pay where a model's weights or a slow link need them, and inside a node dp / tp
have the fast links (so the search on 8 GPUs in one node is today's). Priced by
the pipeline search (:func:`autoshard.search.pipeline_model.choose_pipeline`:
the stage sub-mesh solves of two and three blocks, stage cuts, microbatches, the
schedules simulated, the stages' recomputation ``none`` or ``full``, both searched unless
the options pin one (:func:`autoshard.search.pipeline_model.stage_recompute`), and with them
stages checkpointing only their first blocks, a count per stage, where ``full`` is priced
(``autoshard.search.pipeline`` (R4)), not by a
solve of the whole mesh: the row's step is the pipeline's simulated step. The plan the
search returns for a winning pp layout is the one ``autoshard solve --mesh ... --dims pp,...`` writes: the whole mesh's
per-op placements and the ``pipeline`` section that the runtime runs.

**cp layouts** (:func:`context_layouts_for`): ``(dp, cp, tp)`` consistent
with the nodes, ``dp`` dividing the batch (whole sequences per dp rank: the
sequence is the cp dim's to split), ``tp`` inside a node, at most two of the
three of size > 1 (a 3-D mesh's solve is restricted by a coarse 2-D solve
that knows nothing of the pin: measured on 8B at 131,072 tokens, ``2x16x2``
``dp,cp,tp`` lost the sequence split and fit nowhere), only for a model with
causal self-attention whose sequence ``S`` the balanced chunks divide
(``2 cp | S``, as ``autoshard.rules.context_parallel`` offers it), and only
where the batch has fewer sequences than devices (``B < N``: else every
device can take whole sequences, the dp layouts reach that, and a second
solve of each shape would halve every layout's time). A cp layout is the
ordinary solve of its shape with the sequence inputs pinned
(:func:`context_pins`): batch on ``dp`` where it divides, sequence on ``cp``,
replicated on ``tp``. The solver may put context-parallel exchanges on any
mesh dim of any layout; the pin starts it there (a time-limited solve, or the
seeded restriction of a 3-D mesh, need not reach that region from the dp / tp
layouts). Whichever layout wins, the mesh dim that carries the plan's
context-parallel exchanges is named ``cp`` in the plan, a ``cp`` dim that
carries none ``sp`` (:func:`name_context_dim`): names are labels, the solve
decides what each dim carries.

**Order.** The kinds take turns in the search's order (:func:`take_turns`):
a search its deadline ends has tried some of each.

**Bounds** (cut a layout before it is priced). A cp layout is an ordinary
layout with pins, so it has the compute bound of
:func:`autoshard.search.mesh_search.layout_bound` (pins honoured). A pp
layout has no strategy graph of its own before its pricing, so it is cut by
the matmul work, which no placement, stage cut or schedule removes:

    (p1) F   = sum over the joint graph's matmuls (``mm``, ``addmm``, ``bmm``,
               ``baddbmm``, forward and backward) of 2 m n k
    (p2) LB  = F / (N * P),   P = the profile's largest peak but fp64's, and
               fp8's only where the trace has fp8 matmuls (mixed precision may
               run an fp32 model's matmuls in bf16: P covers every dtype a
               matmul can be priced in)

Every matmul is priced at ``F_i / (P_t e(F_i))`` with ``e <= 1``
(``costmodel.compute``), sharding only adds work (replicated compute) or keeps
it, recomputation only adds; so the sum of all ranks' busy time is at least
``F / P`` and the busiest rank's, hence any stage's timeline and the step, at
least ``F / (N P)``. It is weak (attention, vector ops and communication are
left out) and cuts only layouts far from the incumbent.

A pp layout is also cut by the memory its stages must hold (:func:`pipeline_memory_bound_bytes`):
a stage keeps its weights gathered across ``dp`` through the step and accumulates their
gradients unsharded (FSDP2 in a pipeline; ``replicate`` holds more: the whole state), and
the stages split the blocks' parameters at best evenly, so some rank holds at least

    (p3) M_held = W (w + g) / (pp tp)

with ``W`` the repeated blocks' parameter elements, ``w`` the itemsize they compute in
(bf16 under mixed precision) and ``g`` their gradients' (fp32 under mixed precision).
Sharded state, activations and the embedding only add; a layout whose (p3) exceeds the
memory limit fits nowhere (405B on 512 GPUs: ``2 x 128 x 2`` needs 607 GB a rank).

**Plain layouts before their build** (:func:`state_memory_bound_bytes`). Every parameter with a
gradient keeps, through the step, its value, its optimizer state (the fp32 master copy and
moments under mixed precision, ``s`` bytes an element) and, from its backward to the optimizer
step, its gradient (``g`` bytes an element); at the optimizer step all of them are live, and
every input is held the whole step. The graph prices a tensor at its largest local shard, at
least ``1/N`` of it on ``N`` devices, whatever the placement. So any plan's peak is at least

    (m1) M_state = ( sum_params n_p (min(w_p + s, f) + g_p) + sum_inputs bytes ) / N

with ``w_p`` the parameter's itemsize and ``f`` the bytes FSDP2 holds an element under mixed
precision (its fp32 shard and state, ``OptimizerMemory.fsdp2_shard_bytes``: the graph charges that
where gathers are priced as FSDP2 holds them). Activations, transients and the optimizer step's
temporary only add. A layout whose (m1) exceeds the memory limit fits nowhere and is refused
before its build. It is weak by design (405B on 512 GPUs: 11 GB a rank, no plain layout
refused); it refuses the hopeless device counts in a second instead of a build each.

**Plain and cp layouts before their build: the work bound** (:func:`work_bound_s`). Every op of
the trace runs, under any strategy, on local shards: its busiest rank does at least ``1/N`` of
the op's FLOPs ``F_o`` and touches at least ``1/N`` of its bytes ``B_o`` (a shard is at least the
average; replication, uneven splits and recomputation only add). The graph prices it
(``costmodel.compute.op_time_s`` plus ``device.in_step_s``) at no less than

    (c1) t_o = max( F_o / (N P_k e_k),  B_o / (N W e_W) ) + c_m B_o / N + l + s_op + s_B B_o / N

with ``P_k e_k`` the largest FLOP rate any dtype and efficiency point of the op's kind reaches
(matmul and attention kinds: the (p2) peak times the largest point of any matmul / attention
curve; vector kinds: the fp32 peak times the op's vector fraction or the best memory
efficiency; copies: no FLOP term), ``W e_W`` the best memory rate, ``c_m`` the GEMM's byte cost
(matmuls only), ``l`` the smaller launch floor, ``s_op``, ``s_B`` the profile's in-step costs;
views are free. Every factor is the best case of the one the graph uses (efficiencies at most
their largest point, ``run`` efficiency at most 1, fresh pages at least 0), so each op node's
cheapest strategy costs at least ``t_o``, and with the module bound of
:mod:`autoshard.search.mesh_search` (``step >= sum_v min_k c_v(k)``)

    (c2) LB_work = sum_o t_o  <=  sum_v min_k c_v(k)  <=  step

of every plan on every layout of ``N`` devices, from the trace alone: it depends on ``N`` only,
so a search computes it once. Parameters' optimizer updates and communication are left out
(valid, weaker). It cuts a plain or cp layout before its build when ``LB_work >= best (1 + tol)``
(405B on 512: the plain layouts' builds took 11-150 s each before their built bound cut them).

**Order when stages pay** (:func:`pipeline_first`). When the repeated blocks' weights and
gradients do not fit one node's memory, spread over its ``K`` devices (the (p3) figure at ``pp``
1, ``tp`` K: ``W (w + g) / K`` over the limit), a plain layout must shard the weights across
nodes and move them over the slow links every step, the traffic stages cut by ``pp``. There the
pp layouts (priced from two- and three-block solves, seconds to a minute each) go before the
plain ones (a build of the whole model each: minutes on 405B); elsewhere the kinds take turns.
An order, not a cut: every layout is still tried while time is left.

>>> [(l.text, ",".join(l.dim_names)) for l in pipeline_layouts_for(16, 8, n_blocks=4)]
[('2x8', 'pp,tp'), ('2x2x4', 'pp,dp,tp'), ('2x4x2', 'pp,dp,tp'), ('2x8', 'pp,dp')]
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from autoshard.search.mesh_layouts import MeshLayout, _fits_nodes
from autoshard.sizes import format_bytes
from autoshard.trace.blocks import modules_around

__all__ = ["ModelShape", "model_shape", "pipeline_layouts_for", "context_layouts_for", "context_pins",
           "matmul_flops", "pipeline_bound_s", "layout_kind", "merged_pins", "name_context_dim", "pipeline_parts",
           "PipelineOutcome", "solve_pipeline_layout", "take_turns", "pipeline_memory_bound_bytes",
           "block_param_elems", "held_memory_refusal", "state_memory_bound_bytes", "plain_memory_refusal",
           "pipeline_first", "work_bound_s"]

_MATMULS = {"aten.mm.default": "mm", "aten.addmm.default": "addmm", "aten.bmm.default": "bmm",
            "aten.baddbmm.default": "baddbmm"}
_FP8 = ("torch.float8_e4m3fn", "torch.float8_e5m2")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the pp / cp gates read from one trace."""

    n_blocks: int
    """Repeated blocks (``traced.blocks``): the most stages a cut can make."""
    batch: int
    """Sequences of the batch (dim 0 of the inputs)."""
    causal_seq: int | None
    """The sequence of causal self-attention (``L == S``); None when the model has none."""
    seq_inputs: tuple[tuple[str, int], ...]
    """(input name, rank) of the inputs shaped ``[batch, causal_seq, ...]``: pinned on a cp layout."""
    matmul_flops: float
    """(p1)."""
    matmul_flops_by_dtype: tuple[tuple[str, float], ...] = ()
    """(torch dtype, FLOPs) of the matmuls: (p1) split by the peak (p2) divides it by."""


def _shape(node: Any) -> tuple[int, ...] | None:
    val = getattr(node, "meta", {}).get("val") if hasattr(node, "meta") else None
    return tuple(int(s) for s in val.shape) if val is not None and hasattr(val, "shape") else None


def _causal(node: Any) -> bool:
    """``is_causal`` of a forward attention node (positional in the aten schemas)."""
    if "is_causal" in node.kwargs:
        return bool(node.kwargs["is_causal"])
    at = 6 if "efficient" in str(node.target) else 4
    return len(node.args) > at and node.args[at] is True


def matmul_flops(traced: Any) -> tuple[tuple[str, float], ...]:
    """(p1) by the matmuls' dtype: ``((dtype, FLOPs), ...)`` over the joint graph."""
    by_dtype: dict[str, float] = {}
    for node in traced.graph_module.graph.nodes:
        kind = _MATMULS.get(str(node.target)) if node.op == "call_function" else None
        if kind is None:
            continue
        out = node.meta.get("val")
        a, b = (node.args[1], node.args[2]) if kind in ("addmm", "baddbmm") else (node.args[0], node.args[1])
        sa, sb = _shape(a), _shape(b)
        if out is None or sa is None or sb is None:
            continue
        flops = 2.0 * math.prod(sa) * sb[-1]  # (batch) m k times n
        key = str(out.dtype)
        by_dtype[key] = by_dtype.get(key, 0.0) + flops
    return tuple(sorted(by_dtype.items()))


def model_shape(traced: Any) -> ModelShape:
    """The gates' view of a trace (:class:`ModelShape`)."""
    seq = None
    graph = traced.graph_module.graph
    for node in graph.nodes:
        name = str(node.target)
        if node.op == "call_function" and "scaled_dot_product" in name and "backward" not in name:
            q, k = _shape(node.args[0]), _shape(node.args[1])
            if q and k and len(q) == 4 and q[2] == k[2] and _causal(node):
                seq = q[2] if seq in (None, q[2]) else -1  # two sequence lengths: no one cp split
    seq = None if seq == -1 else seq
    by_name = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    batch, seq_inputs = 0, []
    for name, node in traced.inputs.items():
        shape = _shape(by_name.get(getattr(node, "name", str(node))))
        if shape:
            batch = max(batch, shape[0])
            if seq is not None and len(shape) >= 2 and shape[1] == seq:
                seq_inputs.append((name, len(shape)))
    flops = matmul_flops(traced)
    return ModelShape(len(traced.blocks), batch, seq, tuple(seq_inputs), sum(f for _, f in flops), flops)


def layout_kind(layout: MeshLayout) -> str:
    """``pp``, ``cp`` or ``plain`` (dp / tp)."""
    return "pp" if "pp" in layout.dim_names else "cp" if "cp" in layout.dim_names else "plain"


def pipeline_layouts_for(devices: int, devices_per_node: int, *, n_blocks: int) -> list[MeshLayout]:
    """The pp layouts (module docstring): ``(pp, dp, tp)`` by ``pp``, then ``tp`` descending; size-1
    dims but pp dropped."""
    node = min(devices_per_node, devices)
    nodes = devices // node
    out = []
    for pp in range(2, min(nodes, n_blocks) + 1):
        if nodes % pp:
            continue
        stage = devices // pp
        for tp in range(1, node + 1):
            if node % tp or stage % tp:
                continue
            dims = [("pp", pp), ("dp", stage // tp), ("tp", tp)]
            kept = [(n, s) for n, s in dims if s > 1 or n == "pp"]
            out.append(((pp, -tp), MeshLayout(tuple(s for _, s in kept), tuple(n for n, _ in kept))))
    return [layout for _, layout in sorted(out, key=lambda pair: pair[0])]


def context_layouts_for(devices: int, devices_per_node: int, shape: ModelShape, *,
                        always: bool = False) -> list[MeshLayout]:
    """The cp layouts (module docstring): ``(dp, cp, tp)`` with ``dp`` dividing the batch, ``2 cp``
    the sequence, ``tp`` the node size, consistent with the nodes, at most two dims of size > 1;
    size-1 dims but cp dropped.
    ``always`` drops the ``B < N`` gate (not the attention one).

    >>> s = ModelShape(n_blocks=2, batch=1, causal_seq=256, seq_inputs=(), matmul_flops=0.0)
    >>> [(l.text, l.dim_names) for l in context_layouts_for(4, 8, s)]
    [('4', ('cp',)), ('2x2', ('cp', 'tp'))]
    """
    seq = shape.causal_seq
    if seq is None or devices < 2 or not (always or shape.batch < devices):
        return []
    node = min(devices_per_node, devices)
    out = []
    for dp in range(1, devices + 1):
        for tp in range(1, node + 1):
            cp, rest = divmod(devices, dp * tp)
            if rest or cp < 2 or shape.batch % dp or node % tp or seq % (2 * cp):
                continue
            kept = [(n, s) for n, s in (("dp", dp), ("cp", cp), ("tp", tp)) if s > 1 or n == "cp"]
            dims = tuple(s for _, s in kept)
            if len(dims) < 3 and (devices <= node or _fits_nodes(dims, node)):
                out.append(MeshLayout(dims, tuple(n for n, _ in kept)))
    return out


def context_pins(layout: MeshLayout, shape: ModelShape) -> dict[str, str]:
    """The sequence inputs' pins of a cp layout: ``S(0)`` on dp where the batch divides, ``S(1)`` on cp, ``R`` else.

    >>> s = ModelShape(2, 1, 256, (("tokens", 2),), 0.0)
    >>> context_pins(MeshLayout((2, 2), ("dp", "cp")), s)
    {'tokens': 'RS(1)'}
    """
    text = ""
    for name, size in zip(layout.dim_names, layout.shape):
        text += "S(1)" if name == "cp" else "S(0)" if name == "dp" and shape.batch % size == 0 else "R"
    return {name: text for name, _ in shape.seq_inputs}


def pipeline_bound_s(shape: ModelShape, devices: int, profile: Any) -> float:
    """(p2): no pipeline of ``devices`` devices runs the step in less (module docstring).

    >>> from hw_profiles import load
    >>> s = ModelShape(2, 1, None, (), 2e15, (("torch.bfloat16", 2e15),))
    >>> round(pipeline_bound_s(s, 2, load("h100-sxm-80gb")), 3)  # 1e15 FLOPs a device at 1049 TFLOP/s
    0.953
    """
    fp8 = any(dtype in _FP8 for dtype, _ in shape.matmul_flops_by_dtype)
    return shape.matmul_flops / (devices * _matmul_peak(profile, fp8))


def _matmul_peak(profile: Any, fp8: bool) -> float:
    """The (p2) peak: the largest but fp64's, and fp8's only where the trace has fp8 matmuls."""
    return max(flops for name, flops in profile.device.peak_flops if name != "fp64" and (fp8 or name != "fp8"))


def work_bound_s(traced: Any, devices: int, profile: Any, *, rules: Any = None) -> float:
    """(c2): no plan of ``traced`` on ``devices`` devices computes for less on its busiest rank,
    from the trace alone (module docstring); ``rules``: the registry the graph is built with
    (default ``autoshard.rules.load_rules()``).

    >>> from examples.models import mlp
    >>> from autoshard.trace import trace_joint
    >>> from hw_profiles import load
    >>> t, h100 = trace_joint(*mlp.tiny(device="meta")), load("h100-sxm-80gb")
    >>> work_bound_s(t, 2, h100) > work_bound_s(t, 4, h100) > 0
    True
    """
    from autoshard.rules import load_rules

    rules = rules or load_rules()
    device = profile.device
    eff = device.efficiency
    n = max(int(devices), 1)
    fp8 = any(str(getattr(m, "dtype", "")) in _FP8 for info in traced.nodes.values() for m in info.inputs if m)
    peak = _matmul_peak(profile, fp8)
    matmul_best = max(f for curve in (eff.matmul, *(c for _, c in eff.matmul_by_dtype)) for _, f in curve)
    # each kind's curve as costmodel.compute._curve picks it (matmul's where the profile has none)
    tensor_rate = {kind: peak * min(1.0, max((f for _, f in curve), default=matmul_best))
                   for kind, curve in (("matmul", ()), ("attention", eff.attention),
                                       ("attention_backward", eff.attention_backward or eff.attention))}
    memory_rate = device.memory_bandwidth_Bps * min(1.0, max(f for _, f in eff.memory_curve))
    try:
        vector_peak = device.peak_flops_for("fp32")
    except KeyError:
        vector_peak = max(v for _, v in device.peak_flops)
    launch = min(device.launch_s, device.launch_s if device.launch_scalar_s is None else device.launch_scalar_s)
    total = 0.0
    for node in traced.graph_module.graph.nodes:
        # the op nodes the graph builder makes (a getitem is an alias of its tuple's output)
        info = traced.nodes.get(node.name) if node.op == "call_function" and node.target is not operator.getitem else None
        if info is None:
            continue
        try:
            work = rules.compute_kind(info.op, info.args, info.kwargs, out_meta=info.outputs)
        except Exception:  # noqa: BLE001 - an op the rules cannot describe bounds nothing (0 is valid)
            continue
        if work.kind == "view":
            continue
        flops, nbytes = work.flops / n, work.bytes_accessed / n
        if work.kind in tensor_rate:
            flop_s = flops / tensor_rate[work.kind]
        elif work.kind == "copy":
            flop_s = 0.0
        else:  # vector units: the op's own fraction, else the best memory efficiency (op_time_s)
            fraction = eff.vector_fraction(str(info.op)) or min(1.0, max(f for _, f in eff.memory_curve))
            flop_s = flops / (vector_peak * fraction)
        packing = device.matmul_byte_s * nbytes if work.kind == "matmul" else 0.0
        total += max(flop_s + packing, nbytes / memory_rate) + launch + device.in_step_s(nbytes)
    return total


def pipeline_memory_bound_bytes(block_elems: int, layout: MeshLayout, *, mixed_precision: bool,
                                param_itemsize: int = 4) -> float:
    """(p3): the least a rank of pp layout ``layout`` holds for ``block_elems`` repeated-block
    parameter elements (module docstring).

    >>> round(pipeline_memory_bound_bytes(405 * 10**9, MeshLayout((2, 128, 2), ("pp", "dp", "tp")),
    ...                                   mixed_precision=True) / 1e9)
    608
    """
    dims = dict(zip(layout.dim_names, layout.shape))
    held = 2 + 4 if mixed_precision else 2 * param_itemsize
    return float(block_elems) * held / (dims.get("pp", 1) * dims.get("tp", 1))


def block_param_elems(model: Any, blocks: Sequence[str]) -> tuple[int, int]:
    """(parameter elements of the repeated blocks ``blocks``, their largest itemsize) of ``model``.

    >>> import torch
    >>> block_param_elems(torch.nn.Sequential(torch.nn.Linear(2, 2)), ("0",))
    (6, 4)
    """
    prefixes = tuple(b + "." for b in blocks)
    elems, itemsize = 0, 1
    for name, p in model.named_parameters():
        if name.startswith(prefixes):
            elems += p.numel()
            itemsize = max(itemsize, p.element_size())
    return elems, itemsize


def held_memory_refusal(model: Any, blocks: Sequence[str], layout: MeshLayout, options: Any,
                        profile: Any) -> str | None:
    """Why pp layout ``layout`` fits nowhere by (p3), or None when the bound leaves room.

    >>> # held_memory_refusal(model, traced.blocks, MeshLayout((2, 128, 2), ("pp", "dp", "tp")), opts, profile)
    """
    elems, itemsize = block_param_elems(model, blocks)
    held = pipeline_memory_bound_bytes(elems, layout, mixed_precision=options.mixed_precision,
                                       param_itemsize=itemsize)
    limit = options.memory_limit_bytes(profile)
    if held <= limit:
        return None
    return f"held weights and gradients bound {format_bytes(held)} a rank > memory limit {format_bytes(limit)}"


def state_memory_bound_bytes(traced: Any, devices: int, options: Any, profile: Any) -> float:
    """(m1): the least any plan of ``traced`` on ``devices`` devices holds on its busiest rank, from
    the trace alone (module docstring); ``options`` gives the optimizer and mixed precision.

    >>> from examples.models import mlp
    >>> from autoshard.trace import trace_joint
    >>> from autoshard.plan.options import SolveOptions
    >>> from hw_profiles import load
    >>> t, opts, gloo = trace_joint(*mlp.tiny(device="meta")), SolveOptions(), load("cpu-gloo")
    >>> state_memory_bound_bytes(t, 2, opts, gloo) == 2 * state_memory_bound_bytes(t, 4, opts, gloo)
    True
    """
    from autoshard.graph.memory import OptimizerMemory, optimizer_implementation

    optimizer = OptimizerMemory(options.optimizer, options.mixed_precision,
                                optimizer_implementation(options.optimizer_impl, profile))
    total = 0.0
    for fqn, node in traced.params.items():
        val = node.meta.get("val")
        if val is None:
            continue
        grad = traced.grads.get(fqn)
        held = val.element_size() + optimizer.state_bytes(val.dtype)
        if optimizer.mixed_precision:  # the graph may price it as FSDP2 holds it: never more than that
            held = min(held, optimizer.fsdp2_shard_bytes())
        gval = grad.meta.get("val") if grad is not None else None
        total += val.numel() * (held + (gval.element_size() if gval is not None else 0))
    for node in traced.inputs.values():
        val = getattr(node, "meta", {}).get("val")
        if val is not None and hasattr(val, "numel"):
            total += val.numel() * val.element_size()
    return total / max(int(devices), 1)


def plain_memory_refusal(traced: Any, layout: MeshLayout, options: Any, profile: Any) -> str | None:
    """Why layout ``layout`` fits nowhere by (m1), before its build, or None when the bound leaves room.

    >>> # plain_memory_refusal(traced, MeshLayout((2, 4), ("dp", "tp")), opts, profile)
    """
    held = state_memory_bound_bytes(traced, layout.devices, options, profile)
    limit = options.memory_limit_bytes(profile)
    if held <= limit:
        return None
    return (f"parameters, gradients and optimizer state bound {format_bytes(held)} a rank > memory limit "
            f"{format_bytes(limit)} (refused before its build)")


def pipeline_first(model: Any, blocks: Sequence[str], devices_per_node: int, options: Any, profile: Any) -> bool:
    """True when the pp layouts go before the plain ones (module docstring, Order when stages pay):
    the repeated blocks' weights and gradients over one node's devices exceed the memory limit.

    >>> import torch
    >>> from autoshard.plan.options import SolveOptions
    >>> from hw_profiles import load
    >>> pipeline_first(torch.nn.Sequential(torch.nn.Linear(4, 4)), ("0",), 8, SolveOptions(), load("cpu-gloo"))
    False
    """
    if model is None or not blocks:
        return False
    elems, itemsize = block_param_elems(model, blocks)
    node = MeshLayout((1, max(int(devices_per_node), 1)), ("pp", "tp"))
    held = pipeline_memory_bound_bytes(elems, node, mixed_precision=options.mixed_precision, param_itemsize=itemsize)
    return held > options.memory_limit_bytes(profile)


def take_turns(groups: Sequence[Any], kinds: Sequence[str]) -> list[Any]:
    """``groups`` reordered so that the kinds take turns (each kind's own order kept): a deadline
    that ends the search then leaves no kind untried behind the others.

    >>> take_turns(["a", "b", "c", "x", "p"], ["plain", "plain", "plain", "cp", "pp"])
    ['a', 'x', 'p', 'b', 'c']
    """
    seen: dict[str, int] = {}
    turns = []
    for kind in kinds:
        turns.append(seen.get(kind, 0))
        seen[kind] = turns[-1] + 1
    return [g for _, g in sorted(zip(turns, groups), key=lambda pair: pair[0])]


def name_context_dim(plan: Any) -> Any:
    """``plan`` with the mesh dim of its context-parallel exchanges named ``cp`` (when they all run
    on one dim), and a ``cp`` dim that carries none (a cp layout whose solve kept attention local)
    named ``sp``: its inputs are split along the sequence, its attention is not."""
    from dataclasses import replace

    dims = {n.exchange[1] for n in plan.nodes if n.exchange and n.exchange[0].startswith("context")}
    names = list(plan.fingerprint.dim_names)
    if "cp" in names and names.index("cp") not in dims:
        names[names.index("cp")] = "sp"
    if len(dims) == 1 and "cp" not in names:
        names[next(iter(dims))] = "cp"
    if tuple(names) == plan.fingerprint.dim_names:
        return plan
    return replace(plan, fingerprint=replace(plan.fingerprint, dim_names=tuple(names)))


def merged_pins(user: Mapping[str, str], layout: MeshLayout, shape: ModelShape) -> dict[str, str]:
    """A cp layout's pins under the user's: a pattern the user gave wins over the layout's."""
    return {**context_pins(layout, shape), **dict(user)}


def pipeline_parts(model: Any, blocks: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(leading, trailing): the top-level modules holding parameters before and after the block
    container (``autoshard.trace.blocks.modules_around``, as the runtime's ``model_parts`` finds them)."""
    return modules_around(model, tuple(blocks))


@dataclass(frozen=True, slots=True)
class PipelineOutcome:
    """A pp layout priced: its simulated step and busiest rank's memory, and the plan when it beat
    the incumbent (None otherwise: a plan that cannot be chosen is not built)."""

    step_s: float
    peak_memory_bytes: float
    schedule: str
    plan: Any = None


def solve_pipeline_layout(model: Any, inputs: Any, traced: Any, layout: MeshLayout, options: Any, *,
                          time_limit: float, incumbent_s: float | Callable[[], float],
                          seed_memo: dict[Any, Any] | None = None,
                          seed_time_limit: float | None = None) -> PipelineOutcome:
    """Price pp layout ``layout`` by the pipeline search; when it beats ``incumbent_s``, the plan
    ``autoshard solve --mesh`` writes for it (the whole mesh's solve with the ``pipeline``
    section). Raises ``PipelineError`` / ``InfeasibleMemoryError`` (one line) when nothing fits.
    ``incumbent_s`` may be a function, read once the layout is priced: a search's best may have
    improved during the pricing (405B: a record solve, 3 minutes, saved where it had).

    ``seed_memo`` / ``seed_time_limit``: the mesh search's seeds of 3-D meshes and the one time
    limit it builds them with, so that a record solve and the plain layouts with the same coarse
    mesh build that seed once a worker (405B on 512 GPUs: ``4x16x8`` and the plain ``2x32x8``,
    ``4x16x8`` seed from ``64x8``; the seed's build and solve took 154 s of the record's 165 s build;
    ``8x8x8`` seeds from ``8x64``, ``16x4x8`` from ``16x32``: pp layouts rarely share one).

    >>> # solve_pipeline_layout(model, inputs, traced, MeshLayout((2, 2), ("pp", "dp")), opts,
    >>> #                       time_limit=30, incumbent_s=math.inf).step_s
    """
    from dataclasses import replace

    from autoshard.plan.options import NO_MEMORY_LIMIT
    from autoshard.search.pipeline_model import choose_pipeline, stage_recompute
    from autoshard.search.solve import prepare, solve_prepared

    leading, trailing = pipeline_parts(model, traced.blocks)
    policy = stage_recompute(options.recompute)
    # six block-pricing solves a policy at most (two depths, three microbatch counts) share the
    # layout's time with the record solve (two shares)
    solves = 6 * (2 if policy == "auto" else 1)
    section, chosen = choose_pipeline(model, inputs, layout.shape, layout.dim_names, block_paths=traced.blocks,
                                      leading=leading, trailing=trailing, profile=options.profile,
                                      time_limit=max(1.0, time_limit / (solves + 2)), memory_limit=options.memory_limit,
                                      recompute=policy)
    peak = max(chosen.rank_memory_bytes, default=0.0)
    if chosen.step_s >= (incumbent_s() if callable(incumbent_s) else incumbent_s):
        return PipelineOutcome(chosen.step_s, peak, chosen.schedule)
    # the stages run from the pipeline section (FSDP2 / torch TP over each stage's sub-mesh), whose
    # memory per rank the pipeline search checked; the whole mesh's per-op placements are the plan's
    # record, not what runs (runtime/pipeline_stages), so their memory must not refuse the layout
    # (405B on 4x16x8: no flat placement fits, its stages do)
    flat = options.with_changes(time_limit=max(1.0, time_limit / 4), memory_limit=NO_MEMORY_LIMIT)
    built = flat if seed_time_limit is None else flat.with_changes(time_limit=seed_time_limit)
    prep = prepare(None, None, layout.shape, layout.dim_names, built, traced=traced, seed_memo=seed_memo)
    plan = solve_prepared(prep, flat)
    return PipelineOutcome(chosen.step_s, peak, chosen.schedule, replace(plan, pipeline=section))
