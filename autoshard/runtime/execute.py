"""Run a traced joint graph on this rank's local shards, as a plan says: the interpreter of its step program.

:class:`JointRunner` is built once per rank from the :class:`~autoshard.trace.TracedGraph`,
the :class:`~autoshard.plan.format.Plan` and the rank's mesh coordinate. At
build ("load") time it checks the plan's fingerprint (graph hash and mesh
shape) against the graph and mesh in hand, binds the plan to the graph
(``autoshard.runtime.binding``: every op, edge, constant, random op, bucket
and schedule item checked, refused with the node named), and builds the
rank's step program from the graph's dataflow and the plan's schedule and
recomputation (``autoshard.program.actions.build_step_program``: the same
torch-free builder the planner's pricing reads).

:meth:`JointRunner.run` interprets that program: ``Compute`` runs an op on
local tensors (``autoshard.runtime.op_calls``: its inputs redistributed,
waited or reused, its non-tensor arguments localized, its local output shapes
checked), ``Issue`` runs a schedule item's collectives but the last and leaves
that one in flight (``autoshard.runtime.steps``), ``Wait`` finishes it (and
its local steps after it) into the values its reader reads, ``Pack`` copies a
bucket's members into its flat buffer (``steps.pack_bucket``, ``pack_gather``)
before the bucket's ``Issue`` sends that buffer in one collective, ``Unpack``
splits the waited buffer into the members' values (``steps.unpack_bucket``,
``unpack_gather``), ``Recompute`` runs
a recomputed op again with its redistributed inputs redistributed again and
waited at once (a recomputed random op replays the random state of its first
draw: ``autoshard.runtime.random_ops``), ``Free`` drops values after their
last read. The compute goes on while a collective is in flight. The sinks get
their redistributions after the last action: the loss ends replicated, each
gradient in its parameter's placement (a bucket's members from its
``Unpack``), each buffer update in
its buffer's placement. Evaluation (``forward_only``) runs the first pass of
what the loss and buffer updates need, every redistribution at its reader,
waited at once. The runner counts the tensor bytes it holds
(``autoshard.runtime.live_bytes``): ``last_step_peak_bytes``, which
``autoshard.program.live_bytes.live_bytes_timeline`` predicts from the program.

From the second training step on, the runner does not interpret: the first
step checked every shape and fixed every op's localized arguments, and the
second traces this very loop on fake tensors into one fx graph of ATen ops
and collectives (``autoshard.runtime.traced_step``), which then runs as
straight-line code (or compiled by inductor with ``compile=True``). A plan
that recomputes a random op is interpreted every step, with one warning (a
traced graph cannot restore a random state).

>>> # runner = JointRunner(traced, plan, mesh_shape, coord, comm=MeshComm(mesh))
>>> # result = runner.run(local_params, local_buffers, local_inputs)
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx

from costmodel.shard_shapes import local_shape

from autoshard.graph.node_ids import tensor_node
from autoshard.plan.format import Plan, PlanError
from autoshard.plan.program_section import first_difference, recorded_actions
from autoshard.program.actions import (Compute, Free, Issue, Pack, RecomputeError, Recompute, StepProgram, Unpack,
                                       Wait, build_step_program)
from autoshard.rules import RuleRegistry, load_rules
from autoshard.runtime.binding import (Edge, OpBinding, PlanBinding, RuntimeLoadError, Scheduled, fmt_placements,
                                       placements_of)
from autoshard.runtime.live_bytes import LiveBytes, TrackedDict
from autoshard.runtime.op_calls import OpCaller, Reuse
from autoshard.runtime.traced_step import StepGraph, compile_step, trace_step
from autoshard.runtime.random_ops import get_rng_state, set_rng_state
from autoshard.runtime.shards import local_slice
from autoshard.runtime.steps import (Comm, PackedBucket, PendingStep, issue_bucket, pack_bucket, pack_gather,
                                     step_phases, unpack_bucket, unpack_gather, wait_collective)
from autoshard.trace import JointResult, TracedGraph

__all__ = ["RuntimeLoadError", "JointRunner", "local_slice", "placements_of"]

log = logging.getLogger(__name__)


class JointRunner:
    """The joint graph of ``traced`` run on local shards per ``plan`` (module docstring).

    ``mesh_shape`` is the plan's mesh; ``coord`` this rank's coordinate on it;
    ``comm`` issues the collectives (``autoshard.runtime.collectives.MeshComm``;
    None is allowed for a plan without collectives). ``device``: where this
    rank's tensors live (``cuda:LOCAL_RANK`` on a GPU mesh): every tensor the
    step makes (the loss tangent, factory ops, the tensor constants) is made
    there. ``check_fingerprint``
    compares the plan's graph hash with ``traced``. ``graph``: run the traced
    step graph from the second step on (module docstring; False interprets
    every step); ``compile``: compile that graph with inductor.
    """

    def __init__(self, traced: TracedGraph, plan: Plan, mesh_shape: Sequence[int], coord: Sequence[int],
                 *, comm: Comm | None = None, rules: RuleRegistry | None = None,
                 check_fingerprint: bool = True, graph: bool = True, compile: bool = False,
                 device: torch.device | str = "cpu") -> None:
        self.traced = traced
        self.device = torch.device(device)
        self.use_graph = graph or compile
        self.compile = compile
        self.step_graph: StepGraph | None = None
        """The traced step (from the second step on), or None."""
        self._steps_run = 0
        self.last_step_peak_bytes: int | None = None
        """Peak bytes of tensors this rank held during its last interpreted training step
        (``autoshard.runtime.live_bytes``; the traced graph runs the same program); None before one."""
        self._rng_states: dict[fx.Node, tuple[torch.device, torch.Tensor]] = {}
        self.plan = plan
        self.mesh_shape = tuple(int(m) for m in mesh_shape)
        self.coord = tuple(int(c) for c in coord)
        self.comm = comm
        if tuple(plan.fingerprint.mesh_shape) != self.mesh_shape:
            raise RuntimeLoadError(f"mesh: the plan is for mesh {plan.fingerprint.mesh_shape}, here {self.mesh_shape}")
        if len(self.coord) != len(self.mesh_shape) or any(not 0 <= c < m for c, m in zip(self.coord, self.mesh_shape)):
            raise RuntimeLoadError(f"coordinate {self.coord} is not on mesh {self.mesh_shape}")
        if check_fingerprint:
            from autoshard.plan.fingerprint import graph_hash

            here = graph_hash(traced)
            if here != plan.fingerprint.graph:
                raise PlanError(f"plan does not match: graph (plan: {plan.fingerprint.graph[:19]}; here: {here[:19]}: "
                                "another model, input shape or dtype, or kernels of another device type)")
        self.rules = rules or load_rules()
        self.binding = b = PlanBinding(traced, plan, self.mesh_shape, self.coord, comm=comm, rules=self.rules,
                                       device=self.device)
        self.leaf_placements = b.leaf_placements
        self.has_random = b.has_random
        """Whether a step draws random numbers (then every rank must hold one generator state)."""
        self.collective_steps = b.collective_steps
        self.loss_edge, self.grad_edges, self.buffer_edges, self.buckets = (b.loss_edge, b.grad_edges,
                                                                            b.buffer_edges, b.buckets)
        self.calls = OpCaller(b)
        self._ops: dict[str, OpBinding] = {}
        self._nodes: dict[str, list[fx.Node]] = {}
        """The program's value name -> the fx nodes holding it (a tuple access the graph repeats: several)."""
        for op in b.ops:
            self._ops.setdefault(b.value_name(op.node), op)
        for node in (*(op.node for op in b.ops), *(n for n in traced.graph_module.graph.nodes
                                                   if n.op == "placeholder"), *b.constants):
            self._nodes.setdefault(b.value_name(node), []).append(node)
        self.program = self._build_program()
        """This rank's step program (``autoshard.program.actions``)."""
        self._forward: list[OpBinding] | None = None

    def _build_program(self) -> StepProgram:
        """The step program of the bound plan; recomputed random ops replay their first draw's state."""
        b, plan = self.binding, self.plan
        keep = {b.value_name(e.source) for e in (self.loss_edge, *self.grad_edges.values(),
                                                 *self.buffer_edges.values())}
        recompute: dict[str, Any] = {}
        if plan.recompute:
            from autoshard.graph.regions import backward_nodes, check_recompute

            try:
                check_recompute(self.traced, plan.recompute)
            except ValueError as exc:
                raise RuntimeLoadError(f"plan: {exc}") from None
            backward = backward_nodes(self.traced.graph_module.graph, self.traced.tangent)
            recompute = {"recompute": plan.recompute, "backward": {b.value_name(n) for n in backward},
                         "regions": {n.name: n.region for n in plan.nodes if n.region is not None}}
        try:
            program = build_step_program(b.program_nodes(), b.schedule, keep=keep, item_reads=b.item_reads(),
                                         **recompute)
        except RecomputeError as exc:
            raise RuntimeLoadError(f"plan: {exc}") from None
        if plan.program is not None:  # the recorded program is what runs: the derived one must be it
            try:
                differs = first_difference(recorded_actions(plan.program, b.schedule), program.actions)
            except ValueError as exc:
                raise RuntimeLoadError(f"plan: {exc}") from None
            if differs is not None:
                raise RuntimeLoadError(f"plan: program: the recorded step program is not this plan's on this model "
                                       f"({differs}); was the plan edited by hand?")
        for action in program.actions:
            if isinstance(action, Recompute):
                op = self._ops[action.node]
                op.replay_rng = op.draws
        return program

    def mesh_dim_sets(self) -> list[tuple[int, ...]]:
        """Every set of mesh dims a collective of the plan runs on (for ``MeshComm.prepare``)."""
        return self.binding.mesh_dim_sets()

    @property
    def local_constants(self) -> dict[str, torch.Tensor]:
        """This rank's slice of every tensor constant of the graph, by name (``plan.constants``)."""
        return {str(node.target): value for node, value in self.binding.constants.items()}

    # ------------------------------------------------------------------ run time
    def run(self, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
            inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor], *, forward_only: bool = False) -> JointResult:
        """Run one training step's joint graph on local shards.

        ``params`` / ``buffers``: FQN -> this rank's local shard (in the plan's
        placement); ``inputs``: this rank's input shards, in order or by name.
        Returns the loss (replicated: the whole value on every rank), every
        gradient as this rank's shard in its parameter's placement, and every
        buffer update as this rank's shard in its buffer's placement.
        ``forward_only``: run only what the loss and the buffer updates need
        (evaluation); every gradient is then None.
        """
        traced = self.traced
        env: dict[fx.Node, Any] = {}
        for fqn, node in traced.params.items():
            env[node] = self._local_leaf(params, fqn, traced.param_aliases, tensor_node("param", fqn), node)
        for fqn, node in traced.buffers.items():
            env[node] = self._local_leaf(buffers, fqn, traced.buffer_aliases, tensor_node("buffer", fqn), node)
        if isinstance(inputs, Mapping):
            inputs = [inputs[name] for name in traced.inputs]
        if len(inputs) != len(traced.inputs):
            raise ValueError(f"inputs: expected {len(traced.inputs)} tensors ({', '.join(traced.inputs)}), got {len(inputs)}")
        for (name, node), value in zip(traced.inputs.items(), inputs):
            env[node] = self._check_local(value, tensor_node("input", name), node)
        env[traced.tangent] = self._tangent()
        env.update(self.binding.constants)
        if forward_only:
            return self._run_sync(env)
        if self.step_graph is None and self.use_graph and self._steps_run >= 1:
            self.step_graph = self._trace(env)
        if self.step_graph is not None:
            return self._run_graph(env)
        live = LiveBytes()
        live.hold(list(env.values()))  # the leaves: held by the module and the caller all step
        result = self._run_actions(TrackedDict(live, env), live)
        self.last_step_peak_bytes = live.peak
        self._steps_run += 1
        return result

    def _run_actions(self, env: dict[fx.Node, Any], live: LiveBytes | None = None) -> JointResult:
        """One step by the program (module docstring); ``live`` (with ``env`` a ``TrackedDict``
        on it) counts the bytes held."""
        pending: dict[tuple, PendingStep] = {}
        packed: dict[tuple, PackedBucket] = {}  # a bucket's flat buffer, from its Pack to its Unpack
        flat: dict[tuple, torch.Tensor] = {}  # its collective's result, pending from the Issue, waited at the Wait
        ready: dict[Any, Any] = TrackedDict(live) if live is not None else {}
        shared: dict[Any, Any] = TrackedDict(live) if live is not None else {}  # copies later readers reuse
        reuse: Reuse = (shared, {})
        with torch.no_grad():
            for action in self.program.actions:
                match action:
                    case Compute(node=name):
                        self._compute(self._ops[name], env, ready, live, reuse)
                    case Recompute(node=name, position=at):
                        self._recompute(self._ops[name], env, live, at)
                    case Pack(item=item):
                        packed[item.key] = self._pack(self.binding.scheduled[item.key], env)
                    case Issue(item=item) if item.edge is None:
                        self.calls.set_comm(self._bucket_label(self.binding.scheduled[item.key]),
                                            (item.issue, item.wait))
                        flat[item.key] = issue_bucket(packed[item.key], self.comm)
                    case Issue(item=item):
                        pending[item.key] = self._issue(self.binding.scheduled[item.key], env)
                    case Wait(item=item) if item.edge is None:
                        flat[item.key] = wait_collective(flat[item.key], self.comm)
                    case Wait(item=item):
                        self._wait(self.binding.scheduled[item.key], pending.pop(item.key).finish(), ready)
                    case Unpack(item=item):
                        self._unpack(self.binding.scheduled[item.key], packed.pop(item.key), flat.pop(item.key),
                                     ready)
                    case Free(values=values):
                        for value in values:
                            for node in self._nodes[value]:
                                env.pop(node, None)
            result = self._sinks(env, ready)
        self.calls.set_comm(None, None)
        return result

    def _compute(self, b: OpBinding, env: dict[fx.Node, Any], ready: dict[Any, Any], live: LiveBytes | None,
                 reuse: Reuse) -> None:
        node = b.node
        if b.op is operator.getitem:
            self._access(b, env)
            return
        if b.replay_rng:  # its recomputation replays this draw
            device = self.calls.device_of(b, env)
            self._rng_states[node] = (device, get_rng_state(device))
        env[node] = self.calls.run(b, env, ready, live, reuse)

    def _recompute(self, b: OpBinding, env: dict[fx.Node, Any], live: LiveBytes | None, at: int) -> None:
        """A recomputed op again, its redistributed inputs again (waited at once, recorded at ``at``)."""
        node = b.node
        if b.op is operator.getitem:
            self._access(b, env)
            return
        ready: dict[Any, Any] = TrackedDict(live) if live is not None else {}
        for e in b.edges:
            if e.steps:
                self.calls.set_comm(e.key, (at, at))
                ready[e.key] = self.calls.run_steps(self.calls.value(env, e.source), e, e.steps)
        if b.replay_rng:  # the first draw's state, then the stream goes on where it was
            device, state = self._rng_states.pop(node)
            now = get_rng_state(device)
            set_rng_state(device, state)
            try:
                env[node] = self.calls.run(b, env, ready, live)
            finally:
                set_rng_state(device, now)
        else:
            env[node] = self.calls.run(b, env, ready, live)
        self.calls.set_comm(None, None)

    def _access(self, b: OpBinding, env: dict[fx.Node, Any]) -> None:
        """A tuple access: its element, for every fx node that takes it (the program's one value)."""
        value = env[b.node.args[0]][int(b.node.args[1])]
        for node in self._nodes[self.binding.value_name(b.node)]:
            env[node] = value

    def _bucket_edges(self, what: Scheduled) -> list[Edge]:
        """A gather bucket's member edges, or a gradient bucket's gradients' edges."""
        return list(what.members) if what.members else [self.grad_edges[f] for f in self.buckets[what.bucket][1]]

    def _bucket_label(self, what: Scheduled) -> tuple[str, str, int]:
        """How a tracing comm records a bucket's collective (``OpCaller.set_comm``)."""
        if what.members:
            members = self.plan.gather_buckets[what.gather].members
            return ("gather", ",".join(f"{m[0]}>{m[1]}>{m[2]}" for m in members), 0)
        return ("bucket", ",".join(self.buckets[what.bucket][0].members), 0)

    def _pack(self, what: Scheduled, env: Mapping[fx.Node, Any]) -> PackedBucket:
        """A bucket's flat buffer from its members' values (``Pack``)."""
        edges = self._bucket_edges(what)
        values, steps = [self.calls.value(env, e.source) for e in edges], [e.steps[0] for e in edges]
        if what.members:
            return pack_gather(values, steps, [e.global_shape for e in edges], self.mesh_shape, self.coord)
        return pack_bucket(values, steps, self.mesh_shape, self.coord)

    def _unpack(self, what: Scheduled, packed: PackedBucket, done: torch.Tensor, ready: dict[Any, Any]) -> None:
        """A bucket's members' values from its waited flat buffer (``Unpack``), ready for their readers."""
        if what.members:
            values = unpack_gather(packed, done, [e.steps[0] for e in what.members])
            for member, value in zip(what.members, values):
                ready[member.key] = value
        else:
            ready[("bucket", what.bucket)] = unpack_bucket(packed, done, self.mesh_shape, self.coord)

    def _issue(self, what: Scheduled, env: Mapping[fx.Node, Any]) -> PendingStep:
        """Run an edge's steps up to its last collective and leave that one in flight."""
        item, calls = what.item, self.calls
        e = what.edge
        value = calls.value(env, e.source)
        if what.head:
            calls.set_comm(e.key, (item.issue, item.issue))
            value = calls.run_steps(value, e, what.head)
        calls.set_comm(e.key, (item.issue, item.wait))
        return PendingStep(step_phases(value, what.last, e.global_shape, self.mesh_shape, self.coord, self.comm),
                           self.comm)

    def _wait(self, what: Scheduled, done: Any, ready: dict[Any, Any]) -> None:
        """A finished edge's value, ready for its reader (its local steps after its collective run now)."""
        ready[what.edge.key] = self.calls.run_steps(done, what.edge, what.tail)

    def _sinks(self, env: Mapping[fx.Node, Any], ready: dict[Any, Any]) -> JointResult:
        """The loss, the gradients (a bucket's from its collective) and the buffer updates."""
        loss = self._sink(env, self.loss_edge, ready)
        grads = {fqn: None for fqn in self.traced.grads}
        for b, (bucket, fqns) in enumerate(self.buckets):
            for fqn, value in zip(fqns, ready.pop(("bucket", b))):
                e = self.grad_edges[fqn]  # its local slices after the bucket's all_reduce, if any
                grads[fqn] = self.calls.run_steps(value, e, e.steps[1:]) if len(e.steps) > 1 else value
        in_bucket = {fqn for _, fqns in self.buckets for fqn in fqns}
        for fqn, e in self.grad_edges.items():
            if fqn not in in_bucket:
                grads[fqn] = self._sink(env, e, ready)
        updates = {fqn: self._sink(env, e, ready) for fqn, e in self.buffer_edges.items()}
        return JointResult(loss=loss, grads=grads, buffer_updates=updates)

    def _sink(self, env: Mapping[fx.Node, Any], edge: Edge, ready: dict[Any, Any]) -> torch.Tensor:
        """The loss, a gradient or a buffer update, contiguous (a gather may leave it
        strided: ``autoshard.runtime.steps``; optimizers' fused kernels want dense gradients)."""
        value = ready.pop(edge.key) if edge.key in ready else self.calls.redistribute(
            self.calls.value(env, edge.source), edge)
        return value.contiguous() if isinstance(value, torch.Tensor) else value

    def _run_sync(self, env: dict[fx.Node, Any]) -> JointResult:
        """Evaluation: the forward part, every redistribution at its reader (waited at once)."""
        if self._forward is None:
            need: set[fx.Node] = set()
            stack = [self.loss_edge.source, *(e.source for e in self.buffer_edges.values())]
            while stack:
                node = stack.pop()
                if node not in need:
                    need.add(node)
                    stack.extend(node.all_input_nodes)
            self._forward = [b for b in self.binding.ops if b.node in need]
            self._forward_frees = self.program.frees_after()
        reuse: Reuse = ({}, {})
        with torch.no_grad():
            for b in self._forward:
                node = b.node
                if b.op is operator.getitem:
                    if node not in env:  # a repeated tuple access was set with its first
                        self._access(b, env)
                else:
                    env[node] = self.calls.run(b, env, {}, None, reuse)
                for dead in self._forward_frees.get(self.binding.value_name(node), ()):
                    for alias in self._nodes[dead]:
                        env.pop(alias, None)
            loss = self.calls.redistribute(env[self.loss_edge.source], self.loss_edge)
            updates = {fqn: self.calls.redistribute(env[e.source], e) for fqn, e in self.buffer_edges.items()}
        self.calls.set_comm(None, None)
        return JointResult(loss=loss, grads={fqn: None for fqn in self.traced.grads}, buffer_updates=updates)

    def _flat_inputs(self) -> list[fx.Node]:
        t = self.traced
        return [*t.params.values(), *t.buffers.values(), *t.inputs.values(), *t.constants.values()]

    def _outputs(self, result: JointResult) -> list[torch.Tensor]:
        return [result.loss, *(result.grads[f] for f in self.grad_edges), *result.buffer_updates.values()]

    def _trace(self, env: Mapping[fx.Node, Any]) -> StepGraph | None:
        """The step as a graph (``autoshard.runtime.traced_step``), compiled if asked;
        None (with a warning) when it cannot be traced: the runner then interprets."""
        replayed = [a.node for a in self.program.actions if isinstance(a, Recompute) and self._ops[a.node].replay_rng]
        if replayed:  # every rank has the same plan: all of them take this branch (no collective to agree)
            log.warning("autoshard: the step recomputes random ops (%s), whose replay restores the random state "
                        "of the first draw, which a traced graph cannot do; interpreting it", ", ".join(replayed))
            self.use_graph = False
            return None
        nodes = self._flat_inputs()
        tangent = self.traced.tangent

        def step(*flat: torch.Tensor) -> list[torch.Tensor]:
            local = dict(zip(nodes, flat))
            local[tangent] = self._tangent()
            return self._outputs(self._run_actions(local))

        example = [env[n] for n in nodes]
        try:
            graph, reason = trace_step(step, example, self.comm), ""
        except Exception as exc:  # noqa: BLE001 - any failure: keep interpreting (same collectives, same order)
            graph, reason = None, " ".join(str(exc).split())[:300] or type(exc).__name__
        if self.compile:
            graph = compile_step(graph, example)  # every rank takes part: it agrees with the others
        if graph is None:
            log.warning("autoshard: the per-rank step could not be traced into a graph (%s); interpreting it",
                        reason or "another rank failed")
            self.use_graph = False
        return graph

    def _run_graph(self, env: Mapping[fx.Node, Any]) -> JointResult:
        try:
            out = self.step_graph(*(env[n] for n in self._flat_inputs()))
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if any(word in first.lower() for word in ("gloo", "connection", "timed out", "nccl", "c10d")):
                from autoshard.runtime.collectives import CollectiveFailure

                raise CollectiveFailure(f"a collective of the traced step failed at coordinate {self.coord}: another "
                                        f"rank probably stopped or is stuck (look for its error); it said: {first}"
                                        ) from exc
            raise
        grads = {fqn: None for fqn in self.traced.grads}
        k = 1
        for fqn in self.grad_edges:
            grads[fqn] = out[k]
            k += 1
        updates = dict(zip(self.buffer_edges, out[k:]))
        return JointResult(loss=out[0], grads=grads, buffer_updates=updates)

    def _tangent(self) -> torch.Tensor:
        """d(loss)/d(loss) = 1, on this rank's device (the backward's first op reads it)."""
        return torch.ones((), dtype=self.traced.loss.meta["val"].dtype, device=self.device)

    def _local_leaf(self, values: Mapping[str, torch.Tensor], fqn: str, aliases: Mapping[str, tuple[str, ...]],
                    name: str, node: fx.Node) -> torch.Tensor:
        for key in (fqn, *aliases.get(fqn, ())):
            if key in values:
                return self._check_local(values[key].detach(), name, node)
        raise ValueError(f"missing local tensor for {name}")

    def _check_local(self, value: torch.Tensor, name: str, node: fx.Node) -> torch.Tensor:
        want = local_shape(tuple(node.meta["val"].shape), self.leaf_placements[name], self.mesh_shape, self.coord)
        if tuple(value.shape) != want:
            raise ValueError(f"{name}: local shard of shape {tuple(value.shape)}, the plan's "
                             f"{fmt_placements(self.leaf_placements[name])} gives {want} at coordinate {self.coord}")
        return value
