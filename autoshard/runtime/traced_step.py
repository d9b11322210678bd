"""The per-rank step as one fx graph: traced once, then run as straight-line code or compiled.

Why: :meth:`JointRunner.run <autoshard.runtime.execute.JointRunner.run>`
interprets the joint graph op by op, and each op costs Python work on top of
its kernel (look up its inputs, fill its argument template, check its output
shapes, the redistribution bookkeeping). After the first step nothing of that
changes: shapes, localized arguments, the schedule and its collectives are the
same every step. So the runner is traced once, from the second step on, with
``make_fx`` on fake tensors (no kernel runs and no collective is issued while
tracing): the result is an fx graph of ATen ops on local shards with the
``_c10d_functional`` collectives and their ``wait_tensor`` at the schedule's
positions, whose generated Python calls each kernel directly, as eager
PyTorch does. That graph is the **eager runtime** from the second step on.
Its views become reshapes: fake kernels do not always give real strides
(CPU flash attention's output), and a reshape is a view wherever a view is
possible.

``compile=True`` hands the same graph to inductor (``compile_fx``; CPU needs
a C++ compiler). If inductor cannot compile it (no compiler, an unsupported
op), a warning of one line says why and the uncompiled graph runs; every
rank decides together (one ``all_reduce``), so all ranks run the same
program. Inductor keeps the collectives in the traced order (its
compute/communication reordering is off by default); where it places the
waits within that is its choice.

The collective trace: each collective of the graph is followed by a call that
appends its record (kind, mesh dims, bytes, group, plan edge, schedule
positions: those of the traced step) to ``MeshComm.records`` when it runs, so
the trace of a graph step is the trace of what that graph issues. A compiled
graph has no Python between kernels and records nothing.

Plans with an exchange (expert parallelism: ``PlanNode.exchange``) are not
traced: the exchange's split sizes are known only at run time, so the op
caller (``autoshard.runtime.op_calls``) stops the trace at the first such op,
on fake tensors, before any exchange is issued; the runner then interprets
every step (the fallback it takes for any step that cannot be traced).

>>> # graph = trace_step(step_fn, example_flat, comm)    # step_fn(*flat) -> list of tensors
>>> # outputs = graph(*flat)
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx

__all__ = ["COLLECTIVE_OPS", "StepGraph", "trace_step", "compile_step"]

log = logging.getLogger(__name__)

COLLECTIVE_OPS = frozenset({
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.all_reduce_.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_to_all_single.default,
})
"""The ops ``MeshComm`` issues (``autoshard.runtime.collectives``)."""


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _note(records: list, record: Any) -> Callable[[], None]:
    """A graph hook (an argument-free function: fx code takes only literal arguments)
    that appends ``record``: a collective of the step was issued."""
    def note() -> None:
        records.append(record)

    note.__name__ = note.__qualname__ = "autoshard_note"
    note.autoshard_note = (records, record)  # found again by compile_step
    return note


def _is_note(node: fx.Node) -> bool:
    return node.op == "call_function" and hasattr(node.target, "autoshard_note")


class StepGraph:
    """The traced step (module docstring): ``graph(*flat_inputs) -> list of outputs``."""

    def __init__(self, module: fx.GraphModule, run: Callable[..., Any], compiled: bool) -> None:
        self.module = module
        """The traced graph (what ``compile=True`` compiled, when it did)."""
        self._run = run
        self.compiled = compiled

    def __call__(self, *flat: torch.Tensor) -> list[torch.Tensor]:
        out = self._run(*flat)
        return list(out) if isinstance(out, (list, tuple)) else [out]


def trace_step(step: Callable[..., list[torch.Tensor]], example: Sequence[torch.Tensor], comm: Any) -> StepGraph:
    """Trace ``step(*flat) -> [tensors]`` on fake copies of ``example`` (no kernel,
    no collective runs). With a tracing ``comm`` (``MeshComm(trace=True)``), the
    records made while tracing are moved into the graph as hooks after their
    collectives (module docstring)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    records = getattr(comm, "records", None)
    before = len(records) if records is not None else 0
    try:
        module = make_fx(step, tracing_mode="fake")(*example)
    finally:
        made = list(records[before:]) if records is not None else []
        if records is not None:
            del records[before:]
    # Fake kernels do not always give the strides the real ones give (CPU flash
    # attention's output, for one): a view that was fine on fake tensors may not
    # be on real ones. A reshape is a view wherever a view works, a copy elsewhere.
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target in _VIEWS:
            node.target = torch.ops.aten.reshape.default
    module.recompile()
    if made:
        issued = [n for n in module.graph.nodes if n.op == "call_function" and n.target in COLLECTIVE_OPS]
        if len(issued) != len(made):
            raise RuntimeError(f"the traced step issues {len(issued)} collectives, the runner recorded {len(made)}")
        for node, record in zip(issued, made):
            with module.graph.inserting_after(node):
                module.graph.call_function(_note(records, record), ())
        module.recompile()
    return StepGraph(module, module, compiled=False)


def _agree(ok: bool) -> bool:
    """True on every rank only if ``ok`` on every rank (one all_reduce on the default group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    from autoshard.runtime.rank_agreement import comm_device

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=comm_device())  # NCCL moves CUDA tensors only
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def compile_step(graph: StepGraph | None, example: Sequence[torch.Tensor]) -> StepGraph | None:
    """``graph`` compiled by inductor, or ``graph`` itself with a one-line warning
    when inductor cannot compile it on some rank (module docstring). Every rank
    calls it, also one whose trace failed (``graph`` None): the ranks agree."""
    from torch._inductor.compile_fx import compile_fx

    if graph is None:
        _agree(False)
        return None
    module = graph.module
    hooks = [n for n in module.graph.nodes if _is_note(n)]
    hook_args = [n.target.autoshard_note for n in hooks]
    for node in hooks:  # inductor cannot run Python between kernels
        module.graph.erase_node(node)
    inplace = [n for n in module.graph.nodes if n.op == "call_function"
               and n.target is torch.ops._c10d_functional.all_reduce_.default]
    for node in inplace:  # inductor functionalizes the graph and refuses mutating custom ops; it reuses buffers itself
        node.target = torch.ops._c10d_functional.all_reduce.default
    if hooks or inplace:
        module.recompile()
    compiled, reason = None, ""
    try:
        compiled = compile_fx(module, list(example))
    except Exception as exc:  # noqa: BLE001 - any failure: run the uncompiled graph
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    if not _agree(compiled is not None):
        log.warning("autoshard: compile=True: inductor could not compile the per-rank program (%s); running it "
                    "uncompiled", reason or "another rank failed")
        return _hooks_back(module, hook_args, inplace)
    return StepGraph(module, compiled, compiled=True)


def _hooks_back(module: fx.GraphModule, hook_args: list[tuple], inplace: list[fx.Node] = ()) -> StepGraph:
    """The uncompiled graph with its trace hooks and in-place bucket reductions put back (after a failed compile)."""
    for node in inplace:
        node.target = torch.ops._c10d_functional.all_reduce_.default
    if inplace and not hook_args:
        module.recompile()
    if hook_args:
        issued = [n for n in module.graph.nodes if n.op == "call_function" and n.target in COLLECTIVE_OPS]
        for node, args in zip(issued, hook_args):
            with module.graph.inserting_after(node):
                module.graph.call_function(_note(*args), ())
        module.recompile()
    return StepGraph(module, module, compiled=False)
