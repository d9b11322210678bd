"""Run a traced joint graph on this rank's local shards, as a plan says.

:class:`JointRunner` is built once per rank from the :class:`~autoshard.trace.TracedGraph`,
the :class:`~autoshard.plan.format.Plan` and the rank's mesh coordinate. At
build ("load") time it checks everything that does not depend on values and
refuses, naming the node, what it cannot run:

* the plan's fingerprint (graph hash and mesh shape) must match the graph and mesh in hand;
* every op node needs a plan entry with the same op; every edge whose producer
  and reader placements differ needs a redistribution from exactly that
  placement to exactly that placement, and every step must be runnable
  (``autoshard.runtime.steps.check_step_runnable``);
* every tensor constant of the graph (``TracedGraph.constants``) needs a
  placement (``plan.constants``); each rank holds its slice of the traced
  value, made once at load;
* random ops (``nondeterministic_seeded``): dropout and rand/randn run sharded,
  each rank computing its slice of the single-device draw
  (``autoshard.runtime.random_ops``); any other random op must be replicated;
* an op with no sharding rule must be replicated on all its inputs and outputs;
* a buffer that the step mutates (BatchNorm statistics) must be replicated
  (checked by ``ShardedModule``).

Not checked at load: whether a rule's ``localize`` really makes an op run on
its shards (the rule validator checks that per rule, on small meshes); an op
that still fails raises at run time naming the node, the op and the rank's
coordinate, and every local output's shape is compared with the plan's.

:meth:`JointRunner.run` then walks the graph in order: every tensor input of a
node gets its edge's redistribution steps (collectives on the mesh-dim
process group or on the flattened group of fused dims, ``MeshComm``), the
non-tensor args are made local by the rule's ``localize`` (view sizes,
factory shapes: the same call the rule validator makes), and the op runs on
local tensors; every local output's shape is checked against the plan's
placement. The sinks get their redistributions too: the loss ends replicated,
each gradient in its parameter's placement (already reduced), each buffer
update in its buffer's placement. Gradients in one of the plan's buckets
(``costmodel.bucketing``) are reduced together: one collective on their
concatenated payload (``autoshard.runtime.steps.bucket_phases``) instead of
one each, as DDP and FSDP do; a bucket is checked at load against its
members' redistributions (same kind, mesh dims, reduce op and dtype).

Collectives run asynchronously, where the plan's schedule says
(``autoshard.plan.schedule``; plans without one get the default schedule):
at each position the runner issues the items issued there (a
redistribution's collectives but the last run and are waited at once, the
last is left in flight), waits for the items waited there (finishing their
steps), then runs the op; the op reads its redistributed inputs from what
was waited. The compute goes on while a collective is in flight. An edge whose
redistribution reuses an earlier reader's (``Redistribution.reuses``,
``autoshard.plan.shared_copies``) reads that reader's copy, held until its last
reader; nothing is issued for it. Evaluation (``forward_only``) runs every
redistribution at its reader, waited at once.

Recomputation (the plan's ``recompute``; ``autoshard.runtime.recomputation``):
each checkpoint region's recomputed ops run again in its recomputation phase,
an action of the per-rank program just before the region's first backward op
(and that position's issues and waits), their input redistributions run again
and waited at once, recorded at that position; a recomputed value's first
pass is freed after its last forward reader and the backward reads the
recomputed one; a recomputed dropout replays the random state saved at its
first draw. The runner counts the tensor bytes it holds
(``autoshard.runtime.live_bytes``): ``last_step_peak_bytes``.

From the second training step on, the runner does not interpret: the first
step checked every shape and fixed every op's localized arguments, and the
second traces this very loop on fake tensors into one fx graph of ATen ops
and collectives (``autoshard.runtime.program``), which then runs as
straight-line code (or compiled by inductor with ``compile=True``). A plan
that recomputes a random op is interpreted every step, with one warning (a
traced graph cannot restore a random state).

>>> # runner = JointRunner(traced, plan, mesh_shape, coord, comm=MeshComm(mesh))
>>> # result = runner.run(local_params, local_buffers, local_inputs)
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx

from costmodel.bucketing import bucketable_step
from costmodel.layout import local_shape
from costmodel.placements import Partial, Placement, Replicate, parse_placements
from costmodel.steps import COLLECTIVE_STEPS, RedistributeStep

from autoshard.graph.node_ids import LOSS, TANGENT, tensor_node
from autoshard.plan.format import Plan, PlanError, Redistribution
from autoshard.plan.schedule import ScheduleItem, build_schedule
from autoshard.rules import RuleRegistry, load_rules, op_name
from autoshard.rules.calls import bind_args, replace_tensors
from autoshard.rules.core import OpCall, TensorMeta, to_meta
from autoshard.runtime.devices import on_device
from autoshard.runtime.live_bytes import LiveBytes, TrackedDict
from autoshard.runtime.program import StepGraph, compile_step, trace_step
from autoshard.runtime.recomputation import RecomputePhase, free_points, recompute_phases
from autoshard.runtime.shards import local_slice
from autoshard.runtime.templates import CallTemplate
from autoshard.runtime.random_ops import SLICEABLE, get_rng_state, random_kind, run_random, set_rng_state
from autoshard.runtime.steps import (Comm, PendingStep, StepRuntimeError, bucket_phases, check_step_runnable,
                                     gather_phases, run_step, step_phases)
from autoshard.trace import JointResult, TraceError, TracedGraph, constant_value, tensor_arg_nodes

__all__ = ["RuntimeLoadError", "JointRunner", "local_slice", "placements_of"]

aten = torch.ops.aten
log = logging.getLogger(__name__)


class RuntimeLoadError(ValueError):
    """A plan the runtime cannot run on this graph and mesh (names the node and why)."""


def placements_of(text: str | None, ndim_mesh: int) -> tuple[Placement, ...]:
    """Parsed placements; None (no placement given) is replicated."""
    if text is None:
        return (Replicate(),) * ndim_mesh
    return parse_placements(text)


@dataclass(slots=True)
class _Edge:
    """One tensor input of a reader: where it comes from and the steps it needs."""

    source: fx.Node
    steps: tuple[RedistributeStep, ...]
    global_shape: tuple[int, ...]
    key: tuple[str, str, int]
    """(producer, reader, input) as in the plan."""
    reuses: tuple[str, str, int] | None = None
    """The key of the edge whose redistributed value this one reads (``Redistribution.reuses``);
    ``steps`` are then that edge's, run only where that value is not at hand (evaluation)."""


@dataclass(slots=True)
class _Scheduled:
    """One schedule item, resolved to what the runner issues."""

    item: ScheduleItem
    edge: "_Edge | None"
    """The redistribution (None for a bucket)."""
    head: tuple[RedistributeStep, ...] = ()
    """Steps run (and waited) at issue, before the last collective."""
    last: RedistributeStep | None = None
    """The collective left in flight until the wait."""
    tail: tuple[RedistributeStep, ...] = ()
    """Local steps after it, run at the wait."""
    bucket: int | None = None
    gather: int | None = None
    """A gather bucket: its members' edges, in buffer order."""
    members: tuple["_Edge", ...] = ()


@dataclass(slots=True)
class _OpProgram:
    node: fx.Node
    op: Any
    localize: Any
    edges: list[_Edge]
    out_placements: tuple[tuple[Placement, ...] | None, ...]
    out_global: tuple[TensorMeta | None, ...]
    free_after: list[fx.Node] = field(default_factory=list)
    out_local: tuple[TensorMeta | None, ...] | None = None
    """This rank's output shapes (computed at the first run: they never change)."""
    call: CallTemplate | None = None
    """The op's localized arguments with slots for its tensors, from the first run."""
    slow: bool = False
    """The arguments cannot be templated (localize made tensors): rebuild every run."""
    random: str | None = None
    """A sharded random draw (``autoshard.runtime.random_ops``): this rank's slice of the global draw."""
    draws: bool = False
    """The op draws random numbers (sharded or not)."""
    replay_rng: bool = False
    """A recomputed random op: its first draw saves the random state, its recomputation replays it."""


@dataclass(slots=True)
class _Phase:
    """A region's recomputation in the per-rank program (``autoshard.runtime.recomputation``)."""

    info: RecomputePhase
    steps: list[_OpProgram]
    """The recomputed ops and their tuple accesses, in forward order (the first pass's programs)."""
    free_after: list[list[fx.Node]]
    """Per step: the values freed after it."""


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
            from autoshard.plan.build import graph_hash

            here = graph_hash(traced)
            if here != plan.fingerprint.graph:
                raise PlanError(f"plan does not match: graph (plan: {plan.fingerprint.graph[:19]}; here: {here[:19]}: "
                                "another model, input shape or dtype, or kernels of another device type)")
        self.rules = rules or load_rules()
        self._build()

    # ------------------------------------------------------------------ load time
    def _placement(self, text: str | None) -> tuple[Placement, ...]:
        return placements_of(text, len(self.mesh_shape))

    def _build(self) -> None:
        """Check the plan against the graph and make the per-rank program (module docstring)."""
        traced, plan, ndim = self.traced, self.plan, len(self.mesh_shape)
        self._redist: dict[tuple[str, int], Redistribution] = {}
        for r in plan.redistributions:
            key = (r.to, r.input_index)
            if key in self._redist:
                raise RuntimeLoadError(f"plan: two redistributions into input {r.input_index} of {r.to}")
            self._redist[key] = r
        self._used: set[tuple[str, int]] = set()
        """The plan's redistributions that an edge of the graph takes."""
        self._produced = self._leaves()
        """What every fx node produces: (plan name, placements per output)."""
        self._edges: dict[tuple[str, str, int], _Edge] = {}
        self._reuse_count: dict[tuple[str, str, int], int] = {}
        """Edge key -> how many later edges read its redistributed value (``_Edge.reuses``)."""
        self._forward: list[_OpProgram] | None = None
        self.has_random = False
        """Whether a step draws random numbers (then every rank must hold one generator state)."""
        self.program = self._op_programs()

        # sinks
        self.loss_edge = self._edge(traced.loss, str(LOSS), 0, (Replicate(),) * ndim)
        self.grad_edges: dict[str, _Edge] = {}
        for fqn, gnode in traced.grads.items():
            if gnode is not None:
                self.grad_edges[fqn] = self._edge(gnode, tensor_node("grad", fqn), 0,
                                                   self.leaf_placements[tensor_node("param", fqn)])
        self.buffer_edges: dict[str, _Edge] = {}
        for fqn, unode in traced.buffer_updates.items():
            self.buffer_edges[fqn] = self._edge(unode, tensor_node("buffer_update", fqn), 0,
                                              self.leaf_placements[tensor_node("buffer", fqn)])
        self.buckets = self._bucket_programs()
        unused = set(self._redist) - self._used
        if unused:
            to, i = sorted(unused)[0]
            raise RuntimeLoadError(f"plan: a redistribution into {to} (input {i}) matches no edge of the graph")

        bucketed = {m for b in plan.buckets for m in b.members}
        self.collective_steps = tuple(
            (r.tensor, r.to, r.input_index, s) for r in plan.redistributions for s in r.steps
            if s.collective in COLLECTIVE_STEPS and r.to not in bucketed
        )
        """Every collective step of the plan outside gradient buckets, with its edge, in plan order."""
        self._phases = self._recompute_phases()
        self._actions = self._schedule_actions()
        self._set_lifetimes()

    def _leaves(self) -> dict[fx.Node, tuple[str, tuple[tuple[Placement, ...] | None, ...]]]:
        """What every graph input and tensor constant produces: (plan name, placements per
        output); fills ``leaf_placements`` and this rank's slices of the constants."""
        traced, plan, ndim = self.traced, self.plan, len(self.mesh_shape)
        gm = traced.graph_module
        produced: dict[fx.Node, tuple[str, tuple[tuple[Placement, ...] | None, ...]]] = {}
        names = {node: tensor_node("param", fqn) for fqn, node in traced.params.items()}
        names.update({node: tensor_node("buffer", fqn) for fqn, node in traced.buffers.items()})
        names.update({node: tensor_node("input", name) for name, node in traced.inputs.items()})
        names[traced.tangent] = str(TANGENT)
        leaf_text = {tensor_node("param", k): v for k, v in plan.params.items()}
        leaf_text.update({tensor_node("buffer", k): v for k, v in plan.buffers.items()})
        leaf_text.update({tensor_node("input", k): v for k, v in plan.inputs.items()})
        self.leaf_placements: dict[str, tuple[Placement, ...]] = {}
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            name = names.get(node)
            if name is None:
                raise RuntimeLoadError(f"graph input {node.name}: not a parameter, buffer, input or the tangent")
            if name == str(TANGENT):
                pl = (Replicate(),) * ndim
            elif name not in leaf_text:
                raise RuntimeLoadError(f"plan: no placement for {name}")
            else:
                pl = self._placement(leaf_text[name])
            if any(isinstance(p, Partial) for p in pl):
                raise RuntimeLoadError(f"plan: {name} is {leaf_text[name]}: a leaf cannot be partial")
            self.leaf_placements[name] = pl
            produced[node] = (name, (pl,))
        # tensor constants: leaves like buffers, their values on the traced graph (sliced once: they never change)
        self._constants: dict[fx.Node, torch.Tensor] = {}
        for cname, node in getattr(traced, "constants", {}).items():
            name = tensor_node("constant", cname)
            if cname not in plan.constants:
                raise RuntimeLoadError(f"plan: no placement for {name} (a tensor constant of the graph)")
            pl = self._placement(plan.constants[cname])
            if any(isinstance(p, Partial) for p in pl):
                raise RuntimeLoadError(f"plan: {name} is {plan.constants[cname]}: a leaf cannot be partial")
            try:
                value = constant_value(traced, cname)
            except TraceError as exc:
                raise RuntimeLoadError(f"{name}: {exc}") from None
            self.leaf_placements[name] = pl
            produced[node] = (name, (pl,))
            self._constants[node] = local_slice(value, pl, self.mesh_shape, self.coord).to(self.device)

        return produced

    def _source(self, arg: fx.Node) -> tuple[str, int, tuple[Placement, ...]]:
        """(producer name in the plan, its output index, placements) of the value ``arg``."""
        if arg.op == "call_function" and arg.target is operator.getitem:
            name, outs = self._produced[arg.args[0]]
            k = int(arg.args[1])
            return name, k, outs[k] if outs[k] is not None else self._placement(None)
        name, outs = self._produced[arg]
        return name, 0, outs[0] if outs[0] is not None else self._placement(None)

    def _edge(self, arg: fx.Node, reader: str, position: int, want: tuple[Placement, ...] | None) -> _Edge:
        producer, _, have = self._source(arg)
        r = self._redist.get((reader, position))
        shape = tuple(int(s) for s in arg.meta["val"].shape)
        where = f"{producer} -> {reader} (input {position})"
        if want is None:  # an input whose values the op does not read
            if r is not None:
                raise RuntimeLoadError(f"plan: {where} is not read by the op, yet the plan redistributes it")
            return _Edge(arg, (), shape, (producer, reader, position))
        if r is None:
            if have != want:
                raise RuntimeLoadError(f"plan: {where} needs {_fmt(have)} -> {_fmt(want)} but has no redistribution")
            return _Edge(arg, (), shape, (producer, reader, position))
        self._used.add((reader, position))
        reused = None
        if r.reuses is not None:  # reads an earlier reader's copy of the same tensor in the same placement
            first = self._redist.get(r.reuses)
            if first is None or (first.tensor, first.output_index, first.src, first.dst) != (
                    r.tensor, r.output_index, r.src, r.dst) or first.reuses is not None:
                raise RuntimeLoadError(f"plan: {where} reuses the redistribution into {r.reuses[0]} (input "
                                       f"{r.reuses[1]}), which is not one of the same tensor to the same placement")
            reused, r = (first.tensor, first.to, first.input_index), first
            self._reuse_count[reused] = self._reuse_count.get(reused, 0) + 1
        if r.tensor != producer or self._placement(r.src) != have or self._placement(r.dst) != want:
            raise RuntimeLoadError(f"plan: the redistribution into {reader} (input {position}) is "
                                   f"{r.tensor} {r.src} -> {r.dst}, the graph has {producer} {_fmt(have)} -> {_fmt(want)}")
        for step in r.steps:
            try:
                check_step_runnable(step, self.mesh_shape)
            except StepRuntimeError as exc:
                raise RuntimeLoadError(f"{where}: {exc}") from None
        if self.comm is None and any(s.collective in COLLECTIVE_STEPS for s in r.steps):
            raise RuntimeLoadError(f"{where}: the plan issues collectives but no process group was given")
        made = _Edge(arg, tuple(r.steps), shape, (producer, reader, position), reused)
        self._edges[made.key] = made
        return made


    def _op_programs(self) -> list[_OpProgram]:
        """One program step per op and tuple access of the graph, in graph order, checked against the plan."""
        gm, plan = self.traced.graph_module, self.plan
        plan_nodes = {n.name: n for n in plan.nodes}
        produced = self._produced
        program: list[_OpProgram] = []
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output") or node in self._constants:
                continue
            if node.op != "call_function":
                raise RuntimeLoadError(f"{node.name}: graph node kind {node.op!r} is not supported")
            if node.target is operator.getitem:
                if node.args[0] not in produced:
                    raise RuntimeLoadError(f"{node.name}: reads {node.args[0].name}, which makes no tensor")
                program.append(_OpProgram(node, operator.getitem, None, [], (), ()))
                continue
            val = node.meta.get("val")
            if not isinstance(val, (torch.Tensor, tuple, list)):
                raise RuntimeLoadError(f"{node.name} ({op_name(node.target)}): makes no tensor (symbolic sizes are not supported)")
            pn = plan_nodes.get(node.name)
            oname = op_name(node.target)
            if pn is None:
                raise RuntimeLoadError(f"plan: no strategy for node {node.name} ({oname})")
            if pn.op != oname:
                raise RuntimeLoadError(f"plan: node {node.name} is {pn.op} in the plan, {oname} in the graph")
            rule = self.rules.rule_for(node.target)
            outs = tuple(None if t is None else self._placement(t) for t in pn.out)
            # None: the op does not read this input's values (new_zeros(x, size)
            # reads x's dtype only), so any placement does and nothing moves
            ins = tuple(None if t is None else self._placement(t) for t in pn.inputs)
            replicated = all(p is None or all(isinstance(x, Replicate) for x in p) for p in outs + ins)
            random = random_kind(node, rule)
            if random == "other" and not replicated:
                raise RuntimeLoadError(f"{node.name} ({oname}): a random op that only runs replicated (every rank "
                                       f"draws the whole tensor; slices of one stream are made for dropout and "
                                       f"rand/randn only); the plan has {pn.out} <- {pn.inputs}")
            drawn = outs[1:] if random == "dropout" else outs  # dropout's output may be partial, like its input
            if random in SLICEABLE and any(p is not None and any(isinstance(x, Partial) for x in p) for p in drawn):
                raise RuntimeLoadError(f"{node.name} ({oname}): a random draw cannot be partial ({pn.out})")
            if rule is None and not replicated:
                raise RuntimeLoadError(f"{node.name} ({oname}): no sharding rule, so it can only run replicated; "
                                       f"the plan has {pn.out} <- {pn.inputs}")
            args = tensor_arg_nodes(node)
            if len(args) != len(ins):
                raise RuntimeLoadError(f"plan: node {node.name} has {len(ins)} input placements, the op {len(args)} tensor inputs")
            edges = [self._edge(arg, node.name, i, ins[i]) for i, arg in enumerate(args)]
            vals = val if isinstance(val, (tuple, list)) else (val,)
            flat_vals = list(vals)
            out_global = tuple(TensorMeta.of(v) if isinstance(v, torch.Tensor) else None for v in flat_vals)
            if len(out_global) != len(outs):
                raise RuntimeLoadError(f"plan: node {node.name} has {len(outs)} output placements, the op {len(out_global)} outputs")
            produced[node] = (node.name, outs)
            program.append(_OpProgram(node, node.target, rule.localize if rule is not None else None, edges,
                                      outs, out_global, random=random if random in SLICEABLE and not replicated
                                      else None, draws=random is not None))
            self.has_random = self.has_random or random is not None
        return program

    def _schedule_actions(self) -> list[tuple[str, Any]]:
        """The per-rank program: ``("op", _OpProgram)``, ``("issue", _Scheduled)`` and
        ``("wait", _Scheduled)`` in run order (module docstring)."""
        plan = self.plan
        names = [n.name for n in plan.nodes]
        self.schedule = plan.schedule or build_schedule(names, plan.redistributions, plan.buckets,
                                                        gathers=plan.gather_buckets)
        pos = {name: i for i, name in enumerate(names)}
        ops = [p.node.name for p in self.program if p.op is not operator.getitem]
        if ops != names:
            raise RuntimeLoadError("plan: its nodes are not the graph's ops in the graph's order (the schedule's "
                                   "positions would not match)")
        issues: dict[int, list[_Scheduled]] = {}
        waits: dict[int, list[_Scheduled]] = {}
        for item in self.schedule.items:
            if item.bucket is not None:
                if not 0 <= item.bucket < len(self.buckets):
                    raise RuntimeLoadError(f"plan: the schedule names bucket {item.bucket}, the plan has "
                                           f"{len(self.buckets)}")
                entry = _Scheduled(item, None, bucket=item.bucket)
            elif item.gather is not None:
                entry = _Scheduled(item, None, gather=item.gather, members=self._gather_members(item.gather))
            else:
                e = self._edges.get(item.edge)
                last = max((k for k, st in enumerate(e.steps) if st.collective in COLLECTIVE_STEPS), default=None) \
                    if e is not None else None
                if last is None:
                    raise RuntimeLoadError(f"plan: the schedule names {item.edge[0]} -> {item.edge[1]} "
                                           f"(input {item.edge[2]}), which has no collective step")
                entry = _Scheduled(item, e, e.steps[:last], e.steps[last], e.steps[last + 1:])
            issues.setdefault(item.issue, []).append(entry)
            waits.setdefault(item.wait, []).append(entry)
        self._hoisted = self._leaf_views()
        actions: list[tuple[str, Any]] = [("op", step) for step in self.program if step.node.name in self._hoisted]
        phases = {ph.info.at: ph for ph in self._phases}
        op_index: dict[int, int] = {}  # schedule position -> program index of its op
        for i, step in enumerate(self.program):
            if i in phases:  # the region's recomputation, before the collectives of t_rc's position
                actions.append(("recompute", phases[i]))
            if step.op is not operator.getitem:
                p = pos[step.node.name]
                op_index[p] = i
                actions += [("issue", x) for x in issues.get(p, ())] + [("wait", x) for x in waits.get(p, ())]
            if step.node.name not in self._hoisted:
                actions.append(("op", step))
        n = len(names)
        # what each issue reads, and where (the lifetimes: autoshard.runtime.recomputation.free_points)
        self._issue_reads = [(m.source, op_index[p]) for p, group in issues.items() if p < n for x in group
                             for m in ((x.edge,) if x.edge is not None else x.members)]
        actions += [("issue", x) for x in issues.get(n, ())] + [("wait", x) for x in waits.get(n, ())]
        scheduled = {x.edge.key for group in issues.values() for x in group if x.edge is not None}
        scheduled |= {m.key for group in issues.values() for x in group for m in x.members}
        bucketed = {m for b in plan.buckets for m in b.members}
        for key, e in self._edges.items():
            if key not in scheduled and key[1] not in bucketed and e.reuses is None and any(
                    st.collective in COLLECTIVE_STEPS for st in e.steps):
                raise RuntimeLoadError(f"plan: the schedule does not schedule {key[0]} -> {key[1]} (input {key[2]}), "
                                       "which issues collectives")
        return actions

    def _leaf_views(self) -> frozenset[str]:
        """The schedule's leaf views (``autoshard.plan.schedule``), checked: each a view op
        of one leaf or earlier leaf view, its input not redistributed. The program makes
        them before position 0 (views: no kernel, no memory), so that their gathers can be
        issued ahead of their readers."""
        views = self.schedule.leaf_views
        if not views:
            return frozenset()
        from autoshard.plan.schedule import VIEW_OPS

        by_name = {step.node.name: step for step in self.program}
        leaves = set(self.traced.params.values()) | set(self.traced.buffers.values()) | set(
            self.traced.inputs.values()) | set(self._constants)
        done: set[str] = set()
        for name in views:
            step = by_name.get(name)
            ok = (step is not None and op_name(step.op) in VIEW_OPS and len(step.edges) == 1
                  and not step.edges[0].steps and step.random is None)
            if ok:
                source = step.edges[0].source
                ok = source in leaves or source.name in done
            if not ok:
                raise RuntimeLoadError(f"plan: schedule.leaf_views names {name}, which is not a view of a leaf "
                                       "(or of another leaf view) read without redistribution")
            done.add(name)
        return frozenset(done)

    def _recompute_phases(self) -> list[_Phase]:
        """The plan's ``recompute`` as phases of the per-rank program, checked
        against the graph (``autoshard.runtime.recomputation``); the recomputed
        random ops replay their first draw's random state."""
        if not self.plan.recompute:
            return []
        from autoshard.graph.regions import backward_nodes, check_recompute

        positions, k = [], 0
        for step in self.program:  # the schedule position of each program step: the plan index of the next op
            positions.append(k)
            k += step.op is not operator.getitem
        regions = {n.name: n.region for n in self.plan.nodes if n.region is not None}
        try:
            check_recompute(self.traced, self.plan.recompute)
            found = recompute_phases([p.node for p in self.program], positions, self.plan.recompute, regions,
                                     backward_nodes(self.traced.graph_module.graph, self.traced.tangent))
        except ValueError as exc:
            raise RuntimeLoadError(f"plan: {exc}") from None
        phases = []
        for info in found:
            steps = [self.program[i] for i in info.steps]
            for step in steps:
                step.replay_rng = step.draws
            phases.append(_Phase(info, steps, [[] for _ in steps]))
        return phases

    def _set_lifetimes(self) -> None:
        """Free every value after its last read (sink values are kept); a recomputed
        value's first pass and its recomputation each after their own last read."""
        keep = {self.loss_edge.source} | {e.source for e in self.grad_edges.values()} | {
            e.source for e in self.buffer_edges.values()}
        phases = {ph.info.at: ph for ph in self._phases}
        frees = free_points([p.node for p in self.program], [ph.info for ph in self._phases], keep, self._issue_reads)
        for point, dead in frees.items():
            if len(point) == 2:
                self.program[point[0]].free_after.extend(dead)
            else:
                phases[point[0]].free_after[point[2]].extend(dead)
        for step in self.program:  # a leaf view runs first: what it reads is read later too (and holds no memory)
            if step.node.name in self._hoisted:
                step.free_after.clear()

    def _gather_members(self, index: int) -> tuple[_Edge, ...]:
        """The edges of gather bucket ``index``, checked: each a single all_gather on the bucket's mesh dims."""
        if not 0 <= index < len(self.plan.gather_buckets):
            raise RuntimeLoadError(f"plan: the schedule names gather bucket {index}, the plan has "
                                   f"{len(self.plan.gather_buckets)}")
        bucket = self.plan.gather_buckets[index]
        out = []
        for member in bucket.members:
            e = self._edges.get(member)
            if e is None or len(e.steps) != 1 or e.steps[0].collective != "all_gather" or tuple(
                    e.steps[0].mesh_dims) != bucket.mesh_dims:
                raise RuntimeLoadError(f"plan: gather bucket {index} lists {member[0]} -> {member[1]} (input "
                                       f"{member[2]}), which is not one all_gather over {list(bucket.mesh_dims)}")
            if str(e.source.meta["val"].dtype) != bucket.dtype:
                raise RuntimeLoadError(f"plan: gather bucket {index} is {bucket.dtype}, {member[0]} is "
                                       f"{e.source.meta['val'].dtype}")
            out.append(e)
        return tuple(out)

    def _bucket_programs(self) -> list[tuple[Any, list[str]]]:
        """(bucket, parameter FQNs) of the plan's gradient buckets, checked: every
        member is a gradient whose edge starts with the collective the bucket issues (then local slices only)."""
        out = []
        seen: set[str] = set()
        by_sink = {tensor_node("grad", fqn): fqn for fqn in self.grad_edges}
        for i, bucket in enumerate(self.plan.buckets):
            fqns = []
            for member in bucket.members:
                fqn = by_sink.get(member)
                if fqn is None or member in seen:
                    raise RuntimeLoadError(f"plan: bucket {i} lists {member}, which is not a gradient of this graph "
                                           "(or is in two buckets)")
                seen.add(member)
                steps = self.grad_edges[fqn].steps
                if bucketable_step(steps) is None or (steps[0].collective, tuple(steps[0].mesh_dims),
                                                      steps[0].reduce_op) != (
                        bucket.collective, tuple(bucket.mesh_dims), bucket.reduce_op):
                    raise RuntimeLoadError(f"plan: bucket {i} issues {bucket.collective}{list(bucket.mesh_dims)} for "
                                           f"{member}, whose redistribution is "
                                           f"{[st.describe() for st in steps] or 'nothing'}")
                dtype = str(self.grad_edges[fqn].source.meta["val"].dtype)
                if dtype != bucket.dtype:
                    raise RuntimeLoadError(f"plan: bucket {i} is {bucket.dtype}, {member} is {dtype}")
                fqns.append(fqn)
            out.append((bucket, fqns))
        return out

    def mesh_dim_sets(self) -> list[tuple[int, ...]]:
        """Every set of mesh dims a collective of the plan runs on (for ``MeshComm.prepare``)."""
        return sorted({tuple(s.mesh_dims) for *_, s in self.collective_steps}
                      | {tuple(b.mesh_dims) for b, _ in self.buckets})

    # ------------------------------------------------------------------ run time
    def _redistribute(self, value: torch.Tensor, edge: _Edge) -> torch.Tensor:
        """All of an edge's steps at once (local steps, and evaluation's collectives)."""
        if not edge.steps:
            return value
        self._set_comm(edge.key, None)
        return self._run_steps(value, edge, edge.steps)

    def _forward_program(self) -> list[_OpProgram]:
        """The steps the loss and the buffer updates depend on (no backward)."""
        need: set[fx.Node] = set()
        stack = [self.loss_edge.source, *(e.source for e in self.buffer_edges.values())]
        while stack:
            node = stack.pop()
            if node not in need:
                need.add(node)
                stack.extend(node.all_input_nodes)
        return [p for p in self.program if p.node in need]

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
        env.update(self._constants)
        if forward_only:
            if self._forward is None:
                self._forward = self._forward_program()
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

    def _flat_inputs(self) -> list[fx.Node]:
        t = self.traced
        return [*t.params.values(), *t.buffers.values(), *t.inputs.values(), *t.constants.values()]

    def _outputs(self, result: JointResult) -> list[torch.Tensor]:
        return [result.loss, *(result.grads[f] for f in self.grad_edges), *result.buffer_updates.values()]

    def _trace(self, env: Mapping[fx.Node, Any]) -> StepGraph | None:
        """The step as a graph (``autoshard.runtime.program``), compiled if asked;
        None (with a warning) when it cannot be traced: the runner then interprets."""
        replayed = [st.node.name for ph in self._phases for st in ph.steps if st.replay_rng]
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

    def _run_actions(self, env: dict[fx.Node, Any], live: LiveBytes | None = None) -> JointResult:
        """One step by the per-rank program (module docstring): ops, recomputations, issues and
        waits in order; ``live`` (with ``env`` a ``TrackedDict`` on it) counts the bytes held."""
        traced = self.traced
        pending: dict[int, PendingStep] = {}
        ready: dict[Any, Any] = TrackedDict(live) if live is not None else {}
        shared: dict[Any, Any] = TrackedDict(live) if live is not None else {}  # copies later readers reuse
        uses: dict[Any, int] = {}
        with torch.no_grad():
            for kind, what in self._actions:
                if kind == "op":
                    node = what.node
                    if what.op is operator.getitem:
                        env[node] = env[node.args[0]][int(node.args[1])]
                    else:
                        if what.replay_rng:
                            device = self._device(what, env)
                            self._rng_states[node] = (device, get_rng_state(device))
                        env[node] = self._run_op(what, env, ready, live, (shared, uses))
                    for dead in what.free_after:
                        env.pop(dead, None)
                elif kind == "recompute":
                    self._recompute(what, env, live)
                elif kind == "issue":
                    pending[id(what)] = self._issue(what, env)
                else:
                    done = pending.pop(id(what)).finish()
                    if what.members:
                        for member, value in zip(what.members, done):
                            ready[member.key] = value
                    elif what.edge is None:
                        ready[("bucket", what.bucket)] = done
                    else:
                        ready[what.edge.key] = self._run_steps(done, what.edge, what.tail)
            loss = self._sink(env, self.loss_edge, ready)
            grads = {fqn: None for fqn in traced.grads}
            for b, (bucket, fqns) in enumerate(self.buckets):
                for fqn, value in zip(fqns, ready.pop(("bucket", b))):
                    e = self.grad_edges[fqn]  # its local slices after the bucket's all_reduce, if any
                    grads[fqn] = self._run_steps(value, e, e.steps[1:]) if len(e.steps) > 1 else value
            in_bucket = {fqn for _, fqns in self.buckets for fqn in fqns}
            for fqn, e in self.grad_edges.items():
                if fqn not in in_bucket:
                    grads[fqn] = self._sink(env, e, ready)
            updates = {fqn: self._sink(env, e, ready) for fqn, e in self.buffer_edges.items()}
        self._set_comm(None, None)
        return JointResult(loss=loss, grads=grads, buffer_updates=updates)

    def _recompute(self, phase: _Phase, env: dict[fx.Node, Any], live: LiveBytes | None) -> None:
        """A region's recomputation (``autoshard.runtime.recomputation``): its recomputed ops
        again, in forward order, their redistributed inputs again (waited at once)."""
        at = phase.info.position
        for step, dead in zip(phase.steps, phase.free_after):
            node = step.node
            if step.op is operator.getitem:
                env[node] = env[node.args[0]][int(node.args[1])]
            else:
                ready: dict[Any, Any] = TrackedDict(live) if live is not None else {}
                for e in step.edges:
                    if e.steps:
                        self._set_comm(e.key, (at, at))
                        ready[e.key] = self._run_steps(self._value(env, e.source), e, e.steps)
                if step.replay_rng:  # the first draw's state, then the stream goes on where it was
                    device, state = self._rng_states.pop(node)
                    now = get_rng_state(device)
                    set_rng_state(device, state)
                    try:
                        env[node] = self._run_op(step, env, ready, live)
                    finally:
                        set_rng_state(device, now)
                else:
                    env[node] = self._run_op(step, env, ready, live)
            for value in dead:
                env.pop(value, None)
        self._set_comm(None, None)

    def _device(self, step: _OpProgram, env: Mapping[fx.Node, Any]) -> torch.device:
        """Where the op's tensors are (whose generator a random op draws from)."""
        for e in step.edges:
            value = self._value(env, e.source)
            if isinstance(value, torch.Tensor):
                return value.device
        return self.device

    def _set_comm(self, edge: tuple[str, str, int] | None, positions: tuple[int, int] | None) -> None:
        comm = self.comm
        if comm is not None and hasattr(comm, "edge"):
            comm.edge = edge
            if hasattr(comm, "positions"):
                comm.positions = positions

    @staticmethod
    def _value(env: Mapping[fx.Node, Any], node: fx.Node) -> Any:
        """``env[node]``; a tuple element not yet taken (its getitem comes later in the graph) is taken here."""
        if node in env:
            return env[node]
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in env:
            return env[node.args[0]][int(node.args[1])]
        raise RuntimeError(f"runtime: {node.name} is read before it is made (schedule out of order)")

    def _issue(self, what: _Scheduled, env: Mapping[fx.Node, Any]) -> PendingStep:
        """Run the item's steps up to its last collective and leave that one in flight."""
        item = what.item
        if what.members:
            bucket = self.plan.gather_buckets[what.gather]
            self._set_comm(("gather", ",".join(f"{m[0]}>{m[1]}>{m[2]}" for m in bucket.members), 0),
                           (item.issue, item.wait))
            return PendingStep(gather_phases([self._value(env, e.source) for e in what.members],
                                             [e.steps[0] for e in what.members], [e.global_shape for e in what.members],
                                             self.mesh_shape, self.coord, self.comm), self.comm)
        if what.edge is None:
            bucket, fqns = self.buckets[what.bucket]
            edges = [self.grad_edges[f] for f in fqns]
            self._set_comm(("bucket", ",".join(bucket.members), 0), (item.issue, item.wait))
            return PendingStep(bucket_phases([self._value(env, e.source) for e in edges], [e.steps[0] for e in edges],
                                             self.mesh_shape, self.coord, self.comm), self.comm)
        e = what.edge
        value = self._value(env, e.source)
        if what.head:
            self._set_comm(e.key, (item.issue, item.issue))
            value = self._run_steps(value, e, what.head)
        self._set_comm(e.key, (item.issue, item.wait))
        return PendingStep(step_phases(value, what.last, e.global_shape, self.mesh_shape, self.coord, self.comm),
                           self.comm)

    def _run_steps(self, value: torch.Tensor, edge: _Edge, steps: Sequence[RedistributeStep]) -> torch.Tensor:
        for step in steps:
            value = run_step(value, step, edge.global_shape, self.mesh_shape, self.coord, self.comm)
        return value

    def _sink(self, env: Mapping[fx.Node, Any], edge: _Edge, ready: dict[Any, Any]) -> torch.Tensor:
        """The loss, a gradient or a buffer update, contiguous (a gather may leave it
        strided: ``autoshard.runtime.steps``; optimizers' fused kernels want dense gradients)."""
        value = ready.pop(edge.key) if edge.key in ready else self._redistribute(self._value(env, edge.source), edge)
        return value.contiguous() if isinstance(value, torch.Tensor) else value

    def _run_sync(self, env: dict[fx.Node, Any]) -> JointResult:
        """Evaluation: the forward part, every redistribution at its reader (waited at once)."""
        traced = self.traced
        reuse: tuple[dict[Any, Any], dict[Any, int]] = ({}, {})
        with torch.no_grad():
            for step in self._forward:
                node = step.node
                if step.op is operator.getitem:
                    env[node] = env[node.args[0]][int(node.args[1])]
                else:
                    env[node] = self._run_op(step, env, {}, None, reuse)
                for dead in step.free_after:
                    env.pop(dead, None)
            loss = self._redistribute(env[self.loss_edge.source], self.loss_edge)
            updates = {fqn: self._redistribute(env[e.source], e) for fqn, e in self.buffer_edges.items()}
        self._set_comm(None, None)
        return JointResult(loss=loss, grads={fqn: None for fqn in traced.grads}, buffer_updates=updates)

    @property
    def local_constants(self) -> dict[str, torch.Tensor]:
        """This rank's slice of every tensor constant of the graph, by name (``plan.constants``)."""
        return {str(node.target): value for node, value in self._constants.items()}

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
                             f"{_fmt(self.leaf_placements[name])} gives {want} at coordinate {self.coord}")
        return value

    def _input(self, e: _Edge, env: Mapping[fx.Node, Any], ready: dict[Any, Any],
               reuse: tuple[dict[Any, Any], dict[Any, int]] | None) -> Any:
        """An op's local input: its redistributed value (waited, made now, or an earlier
        reader's copy it reuses), or the producer's value as it is."""
        if reuse is not None and e.reuses is not None and e.reuses in reuse[0]:
            shared, uses = reuse
            value = shared[e.reuses]
            uses[e.reuses] -= 1
            if not uses[e.reuses]:  # its last reader: the copy can go
                del shared[e.reuses]
                del uses[e.reuses]
            return value
        if e.key in ready:
            value = ready.pop(e.key)
        elif e.steps:
            value = self._redistribute(env[e.source], e)
        else:
            value = env[e.source]
        count = self._reuse_count.get(e.key)
        if reuse is not None and count:
            reuse[0][e.key], reuse[1][e.key] = value, count
        return value

    def _run_op(self, step: _OpProgram, env: Mapping[fx.Node, Any], ready: dict[Any, Any],
                live: LiveBytes | None = None,
                reuse: tuple[dict[Any, Any], dict[Any, int]] | None = None) -> Any:
        node, op = step.node, step.op
        locals_ = [self._input(e, env, ready, reuse) for e in step.edges]
        if step.random is not None:
            result = run_random(step.random, node, locals_, step.out_global, step.out_placements, self.mesh_shape,
                                self.coord, self.device)
            if live is not None:
                live.touch([*locals_, result])
            return result
        if step.call is not None:
            args, kwargs = step.call.fill(locals_)
        else:
            args, kwargs = self._first_args(step, env, locals_)
        try:
            result = op(*args, **kwargs)
        except (RuntimeError, ValueError) as exc:  # fake tensors (tracing the step) raise ValueError
            if op in (aten.view.default, aten._unsafe_view.default) and "view" in str(exc):
                # a collective or a slice left the local tensor non-contiguous
                result = aten.reshape.default(*args, **kwargs)
            else:
                raise RuntimeError(f"{node.name} ({op_name(op)}) failed on local shards at coordinate "
                                   f"{self.coord}: {exc}") from exc
        flat = list(result) if isinstance(result, (tuple, list)) else [result]
        for k, (got, want) in enumerate(zip(flat, step.out_local)):
            if want is not None and isinstance(got, torch.Tensor) and tuple(got.shape) != want.shape:
                raise RuntimeError(f"{node.name} ({op_name(op)}) output {k}: local shape {tuple(got.shape)}, "
                                   f"the plan's {_fmt(step.out_placements[k])} gives {want.shape}")
        if live is not None:  # inputs (copies included) and outputs exist together here
            live.touch([*locals_, result])
        return result

    def _first_args(self, step: _OpProgram, env: Mapping[fx.Node, Any], locals_: list[torch.Tensor]) -> tuple[tuple, dict]:
        """The op's local arguments built from the graph node (the rule's ``localize``
        makes shape arguments local); kept as a template for the next runs."""
        node, op = step.node, step.op
        args, kwargs = fx.node.map_arg((tuple(node.args), dict(node.kwargs)), lambda n: env[n])
        args, kwargs = on_device((args, kwargs), self.device)  # the graph says "cuda", this rank has cuda:k
        args, kwargs = replace_tensors(op, args, kwargs, locals_)
        if step.out_local is None:
            step.out_local = tuple(
                None if (meta is None or pl is None) else TensorMeta(local_shape(meta.shape, pl, self.mesh_shape, self.coord),
                                                                     meta.dtype)
                for meta, pl in zip(step.out_global, step.out_placements)
            )
        if step.localize is not None:
            call = OpCall(op, to_meta(args), to_meta(kwargs), tuple(TensorMeta.of(t) for t in locals_), step.out_local,
                          bind_args(op, args, kwargs))
            args, kwargs = step.localize(args, kwargs, call)
        if not step.slow:
            step.call = CallTemplate.make(args, kwargs, locals_)
            step.slow = step.call is None
        return args, kwargs


def _fmt(placements: Sequence[Placement] | None) -> str:
    return "None" if placements is None else "".join(str(p) for p in placements)
