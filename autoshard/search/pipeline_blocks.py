r"""Per-block costs of a repeated-block model on one pipeline stage's sub-mesh, from two solves.

A pipeline stage runs a contiguous run of the model's repeated blocks (the
transformer layers) on its sub-mesh (the ``dp x tp`` dims of the mesh, ``pp``
taken out). Rather than solve every stage, the model is solved twice on that
sub-mesh at the microbatch's batch (``B / m`` sequences, over the whole stage),
with ``L_1`` and ``L_2 > L_1`` blocks (:func:`price_blocks`), and every figure is
split into a per-block part and the rest, the embedding and the loss head. The saved-tensor and
transient figures, (h') to (h''') and Transients, are read off a plan by
:mod:`autoshard.search.pipeline_saved`.

**Figures of one plan** (:func:`plan_figures`; ``x_k`` the chosen strategy of op ``k``,
``c_k(x_k)`` its compute from the strategy graph, ``K_F`` the ops up to the loss in
graph order, which are the forward):

    (a) F = sum_{k in K_F} c_k(x_k)               forward compute
    (b) B = sum_{k not in K_F} c_k(x_k) + R - R_w  backward compute and the recomputation R (estimate.recompute_s)
            less R_w, the recomputed ops' weight re-gathers on the data dims (the steps on mesh dims
            other than ``tp`` of the redistributions from a parameter into a recomputed op): a stage
            keeps its weights gathered through the step (e'), so its recomputation reads them as
            they are, as FSDP2 without resharding after the forward runs it
    (c) O = estimate.compute_s - sum_k c_k(x_k)    optimizer step (compute_s = ops + the update)
    (d) X = the exposed communication and local re-layouts that a microbatch repeats: the plan's
            schedule simulated without the parameters' collectives, less its compute
            (``autoshard.assembly.param_comm`` (a'))
    (e) G = the gradient reductions' exposure, once a step (they overlap the last microbatch's
            backward as they overlap this one's: param_comm (c))
    (e') A = the weight gathers' exposure, once a step (a stage keeps its weights gathered from its
            first forward to its last backward, as the pipeline runtime's FSDP2 does: param_comm (b))
    (f) S = sum over parameters of the bytes of the parameter, its gradient and optimizer
            state at the chosen placement (the graph's param / grad / opt_temp nodes), plus the
            gathered weights and their unsharded gradient accumulators held through the step
            (param_comm (d))
    (g) P = estimate.peak_memory_bytes
    (h) K = the memory timeline's level at the loss op's time (graph.times)
    (h') O = sum over blocks of the bytes per rank of the block's output (its last forward op) at the
            chosen placement; O_sp = the same with each output replicated over the mesh dim ``tp``
            counted split along the sequence (``/ tp``)
    (h'') Q = sum over the storages kept for the backward (live at the loss, not recomputed) of the ops
            on the blocks' residual stream, in bytes per rank at the chosen placement; Q_sp = the same
            with each one replicated over ``tp`` counted ``/ tp``. On the stream: made inside a block
            (module paths from the trace) but outside the modules holding its linear layers (the
            attention, the feed-forward: the stage runtime gathers the sequence for them), and read by
            none of those modules (through views): the block's residual adds (its input and
            mid-residual, which its norms' backward reads) and the norms' statistics where the
            trace keeps them apart from the norm's output (an unfused RMSNorm), not a norm's output
            that a column-split linear reads (that one is (h'''))
    (h''') N = sum over the same saved storages, made inside a block outside its gathering modules (the
            modules holding its linear layers) and read by one of them (a norm's output, the
            attention's and the feed-forward's input), of their bytes per rank; N_sp = the same with
            each one replicated over ``tp`` counted ``/ tp``; E = sum over those replicated over ``tp``
            of one all-gather on ``tp`` of their bytes (``costmodel.collectives``); N_max the largest
            of those, whole

**Per block** (``Delta y = (y(L_2) - y(L_1)) / (L_2 - L_1)``): forward ``f = Delta F + Delta X
Delta F / (Delta F + Delta B)``, backward ``b = Delta B + Delta X Delta B / (Delta F + Delta B)``
(the exposed communication split as the compute is: TP's collectives are per op, in
both passes), state ``s = Delta S``, saved activations per microbatch ``a = Delta K - s`` with
``K`` the live bytes when the loss is computed (one more block adds its state and
what its forward keeps for the backward; ``Delta P - s`` where ``K`` is not known:
equal when the peak is at the forward's end, but a peak in the backward, a
recomputation's or an exchange's transient, is not what a microbatch in flight
holds), reduction ``g = Delta G``, weight gathers ``w = Delta A`` (paid before a stage's first
forward), optimizer ``o = Delta O``.

**Full recomputation** (``recompute="full"``, activation checkpointing per block as torchtitan's
full AC and the pipeline runtime run it): a block keeps only its input, the previous block's
output, and runs its forward again before its backward; (C5) of ``autoshard.graph.recompute``
prices exactly that, the region output kept and every other member recomputed. A solve
without a memory limit has no reason to keep that input split, so it keeps it as its residual
adds leave it, replicated over ``tp`` (405B at ``tp`` 8, 4 sequences a rank: 1.07 GB a block
instead of 134 MB). A stage is priced running its residual stream sequence-split between blocks
(torch's sequence parallelism, torchtitan's plan, and the stage runtime's with a ``tp`` layout:
``autoshard.runtime.pipeline_sp``; the send between stages is priced so already), so

    a_full = a - (O - O_sp) / L_2        (of the deeper plan: the blocks are alike)

the same tensor at ``1 / tp`` of the bytes (so too under the op-level policy, ``recompute="selective"``:
its block keeps the same input, beside the matmul and attention outputs it saves, which stand as
solved; ``autoshard.search.pipeline_selective``); the time stands (the solve's all-reduce on ``tp``
moves the bytes of the reduce-scatter and all-gather that sequence parallelism runs instead),
and the transient ``T`` below keeps the solve's ``a`` (the peak it is taken from held the
replicated copies).

**No recomputation, sequence parallel** (``recompute="none"``, the stage runtime's sequence
parallelism under a ``tp`` layout): the same holds for every tensor a block keeps on its residual
stream (h''), its input and mid-residual, which its norms read, and the norms' statistics:

    a_sp = a - (Delta Q - Delta Q_sp)

(a Delta of the two depths, as ``a`` is). The gathering modules' inputs (h''') are kept as
their sequence shards too and all-gathered again in the backward, as Megatron-LM's sequence
parallelism does and the stage runtime runs it (``autoshard.runtime.pipeline_sp``, Re-gathering in
the backward: the copy is rebuilt once for all the linears reading it and dropped after them):

    a_sp = a - (Delta Q - Delta Q_sp) - (Delta N - Delta N_sp)
    b_sp = b + Delta E                 (one more all-gather per gathering module, exposed)
    T_sp = T + N_max                   (the re-gathered copy, held while its module's backward runs)

and a zero-bubble schedule's split backward runs ``Delta E`` in both passes, as the recomputation
(``autoshard.search.pipeline._stage_costs``). What stands: everything inside the attention and the
feed-forward. (405B at ``tp`` 8, one sequence a rank: the input, the mid-residual and the two
norms' outputs, 4 x 268 MB whole, 4 x 34 MB split; ``E`` two all-gathers of 268 MB, 1.4 ms.)

**Extras**: the rest of ``L_1``'s figures, ``y(L_1) - L_1 Delta y``. The embedding's and
the head's compute and communication go to the last stage (the head, the loss and the
final norm dominate them: the embedding is a gather), their state by parameter:
``tok_embeddings`` to the first stage, the rest to the last.

**Transients** (:func:`_transients`): what a plan's activations hold at time ``t`` beyond the
forward's saved ones,

    tau(t) = sum of the op storages live at t (the solver's intervals, at the chosen placements;
             a recomputed op's again from its region's recomputation phase to its last reader)
           + the activations' redistributed copies live at t (the graph's copy intervals)
           - the saved ones: storages live at the loss and made before the head,

split by where ``t`` lies: the head's times ``H`` (after the blocks' last forward op, before their
first backward op; module paths from the trace) and the rest, the blocks' (their forward,
backward and recomputation temporaries, the gradients of one op before they are accumulated):

    (t1) T_blk  = max_{t not in H} tau(t)     (both depths; the larger)   added to every stage
    (t2) T_head = max_{t in H} tau(t)   of L_1; T_head - T_blk (when positive) added to the
         stage that holds the head only, as the last stage's state (counted once, not per
         microbatch in flight)

Not in ``tau``: the parameters' gathered copies, the gradients' unreduced partials and reduction
payloads. A stage holds its weights gathered and its gradients accumulated through the step
(``S``: param_comm (d)) and reduces once, after its last microbatch's backward, so the
one-microbatch plan's per-block gathers, partials and payloads are counted there, not again
beside the activations. The solver's intervals hold a storage at least as long as the step
program does (``autoshard.program.memory``), so ``tau`` bounds the program's level from above:
on the 405B stage (``tp`` 8, one sequence a rank) it equals the exact timeline's op and
activation-copy terms, ``T_blk`` 1.29 GB without recomputation, 2.23 GB with full, ``T_head``
5.27 GB (the head's unreduced weight gradient, 4.2 GB, and the logits).
Without module paths (figures built by hand), ``T = P(L_1) - S_0(L_1) - L_1 a`` (``S_0 = S -
held`` the sharded state, ``a`` as solved: the one-microbatch plan's peak above them, the head's
logits included) is added to every stage.

Why it keeps the per-block costs exact under the cost model: the blocks are
identical (stamped in the trace, tied in the solve), so a pinned layout prices every
block the same and ``y(L)`` is affine in ``L``; a free solve may differ per depth, and
the difference is then the marginal block of the solved plans.

>>> # from examples.models import llama3
>>> # costs = price_blocks(llama3.tiny, {}, (2,), ("dp",), micro_batch=4, profile="cpu-gloo")
>>> # costs.block.forward_s, costs.block.activation_bytes   # per block, per microbatch
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from autoshard.assembly.engine_pricing import chosen_strategies, edge_links
from autoshard.assembly.param_comm import param_comm
from autoshard.search.pipeline_saved import _block_outputs, _live_at, _stream_saved, _transients
from costmodel.stage_cuts import BlockCost

__all__ = ["PlanFigures", "BlockPricing", "plan_figures", "price_blocks", "pricing_from_figures", "hide_exposed",
           "FIRST_STAGE_PARAMS"]

FIRST_STAGE_PARAMS = ("tok_embeddings", "embed_tokens")
"""Modules of the non-block parameters held by the first stage (the rest: the last): ours and
Hugging Face's embedding, at any depth (``model.embed_tokens``)."""


@dataclass(frozen=True, slots=True)
class PlanFigures:
    """(a)-(g) of one solved plan (module docstring)."""

    n_blocks: int
    forward_s: float
    backward_s: float
    optimizer_s: float
    exposed_s: float
    reduction_s: float
    state_bytes: float
    """Of the repeated blocks' parameters."""
    extra_state_first_bytes: float
    """Of the non-block parameters the first stage holds (the embedding)."""
    extra_state_last_bytes: float
    """Of the other non-block parameters (final norm, output layer)."""
    peak_bytes: float
    step_s: float
    exchanges: tuple[str, ...] = ()
    """The plan's exchanges, ``kind@mesh dim``, each once (what a stage runs: expert or context parallel)."""
    forward_end_bytes: float = 0.0
    """``K``: the live bytes when the loss is computed, what the forward keeps for the backward
    with the state (0: not known)."""
    gather_s: float = 0.0
    """``A``: the weight gathers' exposure, paid once a step (module docstring (e'))."""
    held_bytes: float = 0.0
    """The gathered weights and gradient accumulators held through the step, in ``state_bytes``."""
    block_output_bytes: float = 0.0
    """``O``: the blocks' outputs (each block's last forward op) per rank, at the solved placements (h')."""
    block_output_split_bytes: float = 0.0
    """``O_sp``: the same outputs split along the sequence over ``tp`` where the solve left them
    replicated there (h')."""
    recompute_s: float = 0.0
    """``R``: the recomputation inside (b) (``estimate.recompute_s``)."""
    head_transient_bytes: float = 0.0
    """(t2) ``T_head``: the most the activations hold beyond the saved ones at the head's times (0
    with :attr:`block_transient_bytes`: not known)."""
    block_transient_bytes: float = 0.0
    """(t1) ``T_blk``: the same at every other time (a block's forward, backward, recomputation)."""
    stream_saved_bytes: float = 0.0
    """(h'') ``Q``: the saved tensors of the blocks' residual stream per rank, at the solved placements."""
    stream_saved_split_bytes: float = 0.0
    """(h'') ``Q_sp``: the same, split along the sequence over ``tp`` where the solve left them replicated there."""
    gathered_saved_bytes: float = 0.0
    """(h''') ``N``: the saved inputs of the blocks' gathering modules (the norms' outputs the column-split
    linears read) per rank, at the solved placements."""
    gathered_saved_split_bytes: float = 0.0
    """(h''') ``N_sp``: the same, split along the sequence over ``tp`` where the solve left them replicated there."""
    regather_s: float = 0.0
    """(h''') ``E``: one all-gather on ``tp`` of each of the ``N`` storages replicated there."""
    regather_max_bytes: float = 0.0
    """(h''') the largest of the ``N`` storages replicated over ``tp``, whole: the re-gathered copy a
    block's backward holds."""


@dataclass(frozen=True, slots=True)
class BlockPricing:
    """Per-block and extra costs of one microbatch on one stage sub-mesh (module docstring)."""

    micro_batch: int
    """Sequences of one microbatch, over the whole stage sub-mesh."""
    block: BlockCost
    """One repeated block: forward, backward (with recomputation), state, saved activations."""
    block_reduction_s: float
    block_optimizer_s: float
    first_extra: BlockCost
    """The embedding: its state; its compute counts on the last stage (module docstring)."""
    last_extra: BlockCost
    """Final norm, output layer and loss."""
    extra_reduction_s: float
    extra_optimizer_s: float
    transient_bytes: float
    """``T`` (``T_blk`` where the figures know it): added to every stage's memory."""
    figures: tuple[PlanFigures, ...]
    """The solved depths' figures, shallowest first."""
    solve_s: float
    """Wall seconds of the solves (trace and build included)."""
    block_exposed_s: float = 0.0
    """``Delta X``: the exposed communication inside :attr:`block`'s forward and backward."""
    block_gather_s: float = 0.0
    """``w = Delta A``: one block's weight gathers, once a step."""
    extra_gather_s: float = 0.0
    """The non-block weights' gathers (embedding, head), once a step."""
    block_recompute_s: float = 0.0
    """``Delta R``: one block's recomputation, inside :attr:`block`'s backward (the zero-bubble
    schedules' split backward runs it twice: ``autoshard.search.pipeline._stage_costs``)."""
    params: tuple[tuple[str, str], ...] = ()
    """The deeper solve's parameter placements (``Plan.params``: FQN of the cut-down model,
    placement text on the stage sub-mesh): where the stages' tensor-parallel layout is read."""
    head_transient_bytes: float = 0.0
    """(t2) ``T_head - T_blk`` when positive: added to the memory of the stage holding the head only."""
    block_regather_s: float = 0.0
    """``Delta E`` (h'''): one block's re-gathers inside :attr:`block`'s backward, without recomputation
    (a zero-bubble schedule's split backward runs them in both passes, as the recomputation)."""

    def step_of_model(self, n_blocks: int) -> float:
        """The single-stage, single-microbatch step of ``n_blocks`` blocks these costs give:
        what the whole model's plan should price (``p = m = 1``)."""
        blocks = n_blocks * (self.block.forward_s + self.block.backward_s + self.block_optimizer_s)
        extras = sum(e.forward_s + e.backward_s for e in (self.first_extra, self.last_extra))
        return blocks + extras + self.extra_optimizer_s


def _forward_end(graph: Any, plan: Any) -> int:
    """Index in ``plan.nodes`` of the op the loss reads (the forward's last op)."""
    loss = next(i for i, n in enumerate(graph.nodes) if n.kind == "loss")
    sources = {graph.nodes[e.src].name for e in graph.edges if e.dst == loss}
    return max(i for i, n in enumerate(plan.nodes) if n.name in sources)


def _state_bytes(graph: Any, plan: Any) -> dict[str, float]:
    """Parameter FQN -> bytes per rank of the parameter, its gradient and optimizer state (f)."""
    from autoshard.assembly.assemble import placement_text

    out: dict[str, float] = {}
    for fqn, text in plan.params.items():
        total = 0.0
        for prefix in ("param:", "grad:", "opt_temp:"):
            i = graph.index.get(prefix + fqn)
            if i is None or graph.nodes[i].live is not None:
                continue
            g = graph.nodes[i]
            # leaves and sinks have one output each; grad and optimizer state are tied to the parameter
            k = next((k for k, s in enumerate(g.strategies) if placement_text(s.output_placements[0]) == text), 0)
            total += float(g.memory_bytes[k])
        out[fqn] = total
    return out


def plan_figures(prep: Any, plan: Any, n_blocks: int, block_prefix: str = "layers.") -> PlanFigures:
    """(a)-(g) of ``plan``, solved from ``prep`` (:func:`autoshard.search.solve.prepare`)."""
    graph, e = prep.graph, plan.estimate
    chosen = chosen_strategies(graph, plan)
    compute = [float(node.compute_s[k]) for node, k in chosen]
    end = _forward_end(graph, plan)
    fwd = sum(compute[: end + 1])
    held_again = _held_regathers_s(graph, plan)  # (b) R_w
    bwd = sum(compute[end + 1:]) + e.recompute_s - held_again
    opt = max(0.0, e.compute_s - sum(compute))
    params = param_comm(graph, plan, compute)
    exposed = params.activation_exposed_s
    state = _state_bytes(graph, plan)
    aliases = {a for names in plan.param_aliases.values() for a in names}
    # the block container at any depth: ours ``layers.3.``, Hugging Face's ``model.layers.3.``
    in_block = lambda k: k.startswith(block_prefix) or f".{block_prefix}" in k  # noqa: E731
    for fqn, held in params.held_by_param.items():
        state[fqn] = state.get(fqn, 0.0) + held
    blocks = sum(v for k, v in state.items() if in_block(k) and k not in aliases)
    first = sum(v for k, v in state.items() if not in_block(k) and k not in aliases
                and any(part in FIRST_STAGE_PARAMS for part in k.split(".")[:-1]))
    last = sum(state.values()) - blocks - first - sum(state[a] for a in aliases if a in state)
    exchanges = tuple(sorted({f"{n.exchange[0]}@{n.exchange[1]}" for n in plan.nodes if n.exchange}))
    outputs, split = _block_outputs(graph, chosen)
    traced = getattr(prep, "traced", None)
    head, other = _transients(traced, graph, plan, chosen, end)
    stream, stream_split, gathered, gathered_split, regather, largest = _stream_saved(traced, graph, plan, chosen,
                                                                                     end)
    return PlanFigures(n_blocks, fwd, bwd, opt, exposed, params.reduction_s, blocks, first, last, e.peak_memory_bytes,
                       e.step_s, exchanges, _live_at(plan.memory_timeline, graph.times.get(plan.nodes[end].name)),
                       params.gather_exposed_s, params.held_bytes, outputs, split, e.recompute_s - held_again, head,
                       other, stream, stream_split, gathered, gathered_split, regather, largest)


def _held_regathers_s(graph: Any, plan: Any) -> float:
    """(b) ``R_w``: the seconds of the recomputation's weight re-gathers on the data dims, which a
    stage holding its weights gathered does not run (its recomputed forward reads them as they are).
    A redistribution that reuses an earlier copy (``Redistribution.reuses``) is counted at that
    copy's steps, as the recomputation prices it again (``autoshard.assembly.assemble``)."""
    from autoshard.assembly.engine_pricing import param_of

    recomputed = set(getattr(plan, "recompute", ()))
    if not recomputed:
        return 0.0
    tp = {i for i, n in enumerate(getattr(graph.mesh, "dim_names", ())) if n == "tp"}
    reads, _ = edge_links(graph)
    by_edge = {(r.tensor, r.to, r.input_index): r for r in plan.redistributions}
    total = 0.0
    for r in plan.redistributions:
        src = graph.index.get(r.tensor)
        if r.to not in recomputed or src is None or param_of(graph, src, reads) is None:
            continue
        steps = r.steps if r.reuses is None else getattr(by_edge.get((r.tensor, *r.reuses)), "steps", ())
        total += sum(st.cost_s for st in steps if not tp & set(st.mesh_dims))
    return total


def hide_exposed(pricing: BlockPricing) -> BlockPricing:
    """``pricing`` with each block's exposed communication hidden under its own compute where
    that compute is long enough, ``x' = max(0, x - (f_0 + b_0))`` (``f_0, b_0`` the compute
    alone): the best case of collectives overlapped with the matmuls they feed (torch's async
    TP, fused all-gather + matmul and matmul + reduce-scatter). A what-if beside the schedule
    the plan runs, whose collectives wait for their producers.

    >>> p = BlockPricing(1, BlockCost(2.0, 4.0, 0, 0), 0, 0, BlockCost(0, 0, 0, 0), BlockCost(0, 0, 0, 0),
    ...                  0, 0, 0, (), 0.0, block_exposed_s=3.0)
    >>> hide_exposed(p).block.forward_s, hide_exposed(p).block.backward_s
    (1.0, 2.0)
    """
    blk, x = pricing.block, pricing.block_exposed_s
    compute = blk.forward_s + blk.backward_s - x
    share = blk.forward_s / (blk.forward_s + blk.backward_s) if blk.forward_s + blk.backward_s > 0 else 0.5
    left = max(0.0, x - compute)
    block = BlockCost(blk.forward_s - (x - left) * share, blk.backward_s - (x - left) * (1 - share),
                      blk.state_bytes, blk.activation_bytes)
    return replace(pricing, block=block, block_exposed_s=left)


def _block_of(lo: PlanFigures, hi: PlanFigures, checkpointed: bool = False,
              sequence_split: bool = False) -> tuple[BlockCost, float, float, float, float, float]:
    """(block, reduction, optimizer, weight gathers, saved activations as solved, re-gathers) per block
    from two depths (module docstring, Per block); ``checkpointed``: the block's kept input
    sequence-split (h'); ``sequence_split`` (without recomputation): its kept residual stream
    sequence-split (h'') and its gathering modules' inputs kept as shards, gathered again (h''')."""
    n = hi.n_blocks - lo.n_blocks
    d = lambda name: (getattr(hi, name) - getattr(lo, name)) / n  # noqa: E731
    f, b, x = max(0.0, d("forward_s")), max(0.0, d("backward_s")), max(0.0, d("exposed_s"))
    share = f / (f + b) if f + b > 0 else 0.5
    state = max(0.0, d("state_bytes"))
    # what one more block keeps for its backward: the level when the loss is computed, where both
    # depths know it (the peak's difference is that only when the peak is at the forward's end: a
    # backward transient, or recomputation's, would stand for it); the one-microbatch plan's
    # levels hold the sharded state, not what a stage holds gathered through the step
    kept = d("forward_end_bytes") if lo.forward_end_bytes and hi.forward_end_bytes else d("peak_bytes")
    acts = max(0.0, kept - (state - d("held_bytes")))
    # (h') a block's share of the deeper plan's outputs: a one-block plan has no checkpoint region (O = 0)
    excess = (hi.block_output_bytes - hi.block_output_split_bytes) / hi.n_blocks
    regather = 0.0
    if checkpointed:
        saved = max(0.0, acts - excess)
    elif sequence_split:  # (h'') and (h'''): one more block's tensors, as the saved activations are (a Delta)
        kept_whole = max(0.0, d("stream_saved_bytes") - d("stream_saved_split_bytes")) + max(
            0.0, d("gathered_saved_bytes") - d("gathered_saved_split_bytes"))
        saved, regather = max(0.0, acts - kept_whole), max(0.0, d("regather_s"))
    else:
        saved = acts
    return (BlockCost(f + x * share, b + x * (1 - share) + regather, int(state), int(saved)),
            max(0.0, d("reduction_s")), max(0.0, d("optimizer_s")), max(0.0, d("gather_s")), acts, regather)


def _extras(lo: PlanFigures, block: BlockCost, reduction: float, optimizer: float,
            solved_acts: float) -> tuple[BlockCost, BlockCost, float, float, float]:
    """(first, last, extra reduction, extra optimizer, transient) from the shallow depth's rest; the
    transient is the plan's peak above its sharded state and the blocks' activations as solved
    (``solved_acts`` a block)."""
    n = lo.n_blocks
    x_blocks = block.forward_s + block.backward_s
    rest_f = lo.forward_s + lo.exposed_s * _share(lo) - n * block.forward_s
    rest_b = lo.backward_s + lo.exposed_s * (1 - _share(lo)) - n * block.backward_s
    if rest_f + rest_b < 0:  # the shallow plan is cheaper than its blocks: no room for extras
        rest_f, rest_b = 0.0, max(0.0, lo.forward_s + lo.backward_s + lo.exposed_s - n * x_blocks)
    first = BlockCost(0.0, 0.0, int(lo.extra_state_first_bytes), 0)
    last = BlockCost(max(0.0, rest_f), max(0.0, rest_b), int(lo.extra_state_last_bytes), 0)
    transient = max(0.0, lo.peak_bytes - lo.state_bytes - lo.extra_state_first_bytes - lo.extra_state_last_bytes
                    + lo.held_bytes - n * solved_acts)
    return (first, last, max(0.0, lo.reduction_s - n * reduction), max(0.0, lo.optimizer_s - n * optimizer),
            transient)


def _split_transient(lo: PlanFigures, hi: PlanFigures, peak_rule: float) -> tuple[float, float]:
    """``(T, head)``: (t1) for every stage and (t2)'s excess for the head's, where both depths know
    their transients; else ``peak_rule`` (the peak's) for every stage and nothing more."""
    if not any(f.head_transient_bytes or f.block_transient_bytes for f in (lo, hi)):
        return peak_rule, 0.0
    blocks = max(0.0, lo.block_transient_bytes, hi.block_transient_bytes)
    return blocks, max(0.0, lo.head_transient_bytes - blocks)


def _share(fig: PlanFigures) -> float:
    total = fig.forward_s + fig.backward_s
    return fig.forward_s / total if total > 0 else 0.5


Factory = Callable[..., Any]


def price_blocks(
    factory: Factory,
    overrides: Mapping[str, Any],
    mesh_shape: Sequence[int],
    dim_names: Sequence[str],
    *,
    micro_batch: int,
    depths: tuple[int, int] = (2, 4),
    baseline: str | None = None,
    recompute: str = "auto",
    profile: Any = "h100-sxm-80gb",
    time_limit: float = 60.0,
    prepare_options: Mapping[str, Any] | None = None,
    model_hook: Callable[[Any], None] | None = None,
    traces: dict[tuple[int, int], Any] | None = None,
    tp_table: Mapping[str, str | int] | None = None,
) -> BlockPricing:
    """:class:`BlockPricing` of ``factory(**overrides, n_layers=L, batch_size=micro_batch)`` on
    ``mesh_shape`` from solves at the two ``depths`` (module docstring). ``baseline`` pins a
    layout (``fsdp``, ``fsdp+tp``; ``autoshard.search.baselines``) and ``recompute`` a policy, as
    the published runs ran; ``None`` / ``auto``: autoshard's own choice, solved without a memory
    limit (the pipeline search checks each stage's memory). ``prepare_options``: more
    :func:`~autoshard.search.solve.prepare` options (``gather``, ``reduce_dtype``, ...);
    ``model_hook`` changes each built model before the trace (a loss, a norm). ``profile``: a name
    or a ``HardwareProfile`` (the mesh search's, sized to its nodes). ``traces``: traced depths
    ``(depth, micro_batch) -> TracedGraph`` shared between calls of one factory and profile (the
    trace does not depend on the recomputation policy: the two policies' solves trace once).
    ``tp_table``: the tensor-parallel table of a ``tp`` / ``fsdp+tp`` ``baseline`` (default: the shipped
    table that matches; ``autoshard.search.pipeline_model`` passes the split its stage runtime runs).

    >>> # price_blocks(llama3.llama3_405b, {"seq_len": 8192, "dtype": "bfloat16"}, (8, 8), ("dp", "tp"),
    >>> #              micro_batch=8, baseline="fsdp+tp", recompute="full", profile="h100-sxm-96gb-500w")
    """
    from autoshard.search.solve import prepare, solve_prepared

    lo_depth, hi_depth = depths
    if not 1 <= lo_depth < hi_depth:
        raise ValueError(f"depths: need 1 <= L_1 < L_2, got {depths}")
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 sequence, got {micro_batch}")
    started = time.perf_counter()
    figures, plan = [], None
    for depth in depths:
        traced = None if traces is None else traces.get((depth, micro_batch))
        model, inputs = None, None
        if traced is None:
            model, inputs = factory(**{**overrides, "n_layers": depth, "batch_size": micro_batch})
            if model_hook is not None:
                model_hook(model)
        prep = prepare(model, inputs, tuple(mesh_shape), tuple(dim_names), profile=profile, traced=traced,
                       recompute="auto" if recompute != "none" else "none", **dict(prepare_options or {}))
        if traces is not None:
            traces[depth, micro_batch] = prep.traced
        plan = solve_prepared(prep, baseline=baseline, recompute=recompute, memory_limit=math.inf,
                              time_limit=time_limit, tp_table=tp_table)
        figures.append(plan_figures(prep, plan, depth))
    pricing = pricing_from_figures(micro_batch, figures[0], figures[1], time.perf_counter() - started,
                                   checkpointed=recompute in ("full", "selective", "selective_all_mm"),
                                   sequence_split=recompute == "none")
    return replace(pricing, params=tuple(sorted(plan.params.items())))


def pricing_from_figures(micro_batch: int, lo: PlanFigures, hi: PlanFigures, solve_s: float, *,
                         checkpointed: bool = False, sequence_split: bool = False) -> BlockPricing:
    """:class:`BlockPricing` from the figures of two solved depths, ``lo.n_blocks < hi.n_blocks``
    (module docstring, Per block and Extras); ``checkpointed``: the depths were solved with full
    recomputation, whose kept block input is priced sequence-split (h'); ``sequence_split``: solved
    without, the blocks' kept residual stream priced sequence-split (h''), as the stage runtime
    runs a ``tp`` layout (``autoshard.plan.pipeline_section.priced_sequence_parallel``).

    >>> # pricing_from_figures(4, plan_figures(prep2, plan2, 2), plan_figures(prep4, plan4, 4), 12.0)
    """
    block, reduction, optimizer, gather, solved_acts, regather = _block_of(lo, hi, checkpointed, sequence_split)
    # the extras are the shallow plan's rest after its blocks as solved, without the re-gathers priced in
    solved_block = replace(block, backward_s=block.backward_s - regather)
    first, last, extra_reduction, extra_optimizer, peak_rule = _extras(lo, solved_block, reduction, optimizer,
                                                                       solved_acts)
    transient, head = _split_transient(lo, hi, peak_rule)
    if regather:  # (h''') a block's backward holds its largest input gathered again, which the solve kept saved
        transient += max(lo.regather_max_bytes, hi.regather_max_bytes)
    exposed = max(0.0, (hi.exposed_s - lo.exposed_s) / (hi.n_blocks - lo.n_blocks))
    return BlockPricing(micro_batch, block, reduction, optimizer, first, last, extra_reduction, extra_optimizer,
                        transient, (lo, hi), solve_s, exposed, gather, max(0.0, lo.gather_s - lo.n_blocks * gather),
                        max(0.0, (hi.recompute_s - lo.recompute_s) / (hi.n_blocks - lo.n_blocks)),
                        head_transient_bytes=head, block_regather_s=regather)
