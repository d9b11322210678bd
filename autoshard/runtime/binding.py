"""Load time: the plan bound to the traced graph on this rank, checked, before any step runs.

:class:`PlanBinding` is made once per rank from the
:class:`~autoshard.trace.TracedGraph`, the :class:`~autoshard.plan.format.Plan`
and the rank's mesh coordinate. It checks everything that does not depend on
values and refuses, naming the node, what it cannot run:

* every op node needs a plan entry with the same op; every edge whose producer
  and reader placements differ needs a redistribution from exactly that
  placement to exactly that placement, and every step must be runnable
  (``autoshard.runtime.steps.check_step_runnable``);
* every tensor constant of the graph (``TracedGraph.constants``) needs a
  placement (``plan.constants``); each rank holds its slice of the traced
  value, made once here;
* random ops (``nondeterministic_seeded``): dropout and rand/randn run sharded,
  each rank computing its slice of the single-device draw
  (``autoshard.runtime.random_ops``); any other random op must be replicated;
* an op with no sharding rule must be replicated on all its inputs and outputs;
* a gradient bucket's members must start with the collective it issues, a
  gather bucket's be one all_gather each; the schedule must name only
  collectives of the plan, and schedule all of them;
* the schedule's leaf views must be views of leaves.

What it gives the runner: one :class:`OpBinding` per op and tuple access
(the op, its rule's ``localize``, its input :class:`Edge` s), the sinks' edges,
the buckets, each schedule item resolved to what is issued
(:class:`Scheduled`), and the graph's dataflow as
``autoshard.program.actions.ProgramNode`` s, from which the step program is built.

>>> # binding = PlanBinding(traced, plan, mesh_shape, coord, comm=comm, rules=load_rules(), device="cpu")
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx

from costmodel.buckets.grouping import bucketable_step
from costmodel.placements import Partial, Placement, Replicate, parse_placements
from costmodel.redistribute_steps import COLLECTIVE_STEPS, RedistributeStep

from autoshard.graph.node_ids import LOSS, TANGENT, tensor_node
from autoshard.plan.format import Plan, Redistribution
from autoshard.program.actions import ProgramNode, tuple_value
from autoshard.program.schedule import VIEW_OPS, Schedule, ScheduleItem, build_schedule
from autoshard.rules import RuleRegistry, op_name
from autoshard.rules.core import TensorMeta
from autoshard.runtime.random_ops import SLICEABLE, random_kind
from autoshard.runtime.shards import local_slice
from autoshard.runtime.steps import Comm, StepRuntimeError, check_step_runnable
from autoshard.runtime.templates import CallTemplate
from autoshard.trace import TraceError, TracedGraph, constant_value, tensor_arg_nodes

__all__ = ["RuntimeLoadError", "placements_of", "fmt_placements", "Edge", "OpBinding", "Scheduled", "PlanBinding"]


class RuntimeLoadError(ValueError):
    """A plan the runtime cannot run on this graph and mesh (names the node and why)."""


def placements_of(text: str | None, ndim_mesh: int) -> tuple[Placement, ...]:
    """Parsed placements; None (no placement given) is replicated.

    >>> placements_of(None, 2)
    (Replicate(), Replicate())
    """
    if text is None:
        return (Replicate(),) * ndim_mesh
    return parse_placements(text)


def fmt_placements(placements: Sequence[Placement] | None) -> str:
    """``S(0)R`` (``None`` for none)."""
    return "None" if placements is None else "".join(str(p) for p in placements)


_fmt = fmt_placements


@dataclass(slots=True)
class Edge:
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
class Scheduled:
    """One schedule item, resolved to what the runner issues."""

    item: ScheduleItem
    edge: "Edge | None"
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
    members: tuple["Edge", ...] = ()


@dataclass(slots=True)
class OpBinding:
    """One op (or tuple access) of the graph as this rank runs it."""

    node: fx.Node
    op: Any
    localize: Any
    edges: list[Edge]
    out_placements: tuple[tuple[Placement, ...] | None, ...]
    out_global: tuple[TensorMeta | None, ...]
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


class PlanBinding:
    """``plan`` bound to the graph of ``traced`` on the rank at ``coord`` of ``mesh_shape``, checked
    (module docstring); ``comm`` None is allowed for a plan without collectives; ``device``:
    where this rank's slices of the tensor constants go."""

    def __init__(self, traced: TracedGraph, plan: Plan, mesh_shape: Sequence[int], coord: Sequence[int], *,
                 comm: Comm | None, rules: RuleRegistry, device: torch.device) -> None:
        self.traced, self.plan, self.rules, self.comm, self.device = traced, plan, rules, comm, device
        self.mesh_shape, self.coord = tuple(mesh_shape), tuple(coord)
        ndim = len(self.mesh_shape)
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
        self.edges: dict[tuple[str, str, int], Edge] = {}
        self.reuse_count: dict[tuple[str, str, int], int] = {}
        """Edge key -> how many later edges read its redistributed value (``Edge.reuses``)."""
        self.has_random = False
        """Whether a step draws random numbers (then every rank must hold one generator state)."""
        self.ops = self._bind_ops()
        """One binding per op and tuple access, in graph order."""
        self.loss_edge = self._edge(traced.loss, str(LOSS), 0, (Replicate(),) * ndim)
        self.grad_edges: dict[str, Edge] = {}
        for fqn, gnode in traced.grads.items():
            if gnode is not None:
                self.grad_edges[fqn] = self._edge(gnode, tensor_node("grad", fqn), 0,
                                                  self.leaf_placements[tensor_node("param", fqn)])
        self.buffer_edges: dict[str, Edge] = {}
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
        names = [n.name for n in plan.nodes]
        if [b.node.name for b in self.ops if b.op is not operator.getitem] != names:
            raise RuntimeLoadError("plan: its nodes are not the graph's ops in the graph's order (the schedule's "
                                   "positions would not match)")
        self.schedule: Schedule = plan.schedule or build_schedule(names, plan.redistributions, plan.buckets,
                                                                  gathers=plan.gather_buckets)
        self.scheduled = self._resolve_schedule()
        """``ScheduleItem.key`` -> what its issue runs."""
        self._check_leaf_views()

    def value_name(self, node: fx.Node) -> str:
        """The plan's name of the value ``node`` makes: an op's node name, a leaf's plan node
        (``param:<fqn>``, ``tangent``, ...), a tuple access ``op[k]`` (``autoshard.program.actions.tuple_value``)."""
        if node.op == "call_function" and node.target is operator.getitem:
            return tuple_value(self.value_name(node.args[0]), int(node.args[1]))
        produced = self._produced.get(node)
        return produced[0] if produced is not None and node.op != "call_function" else node.name

    def program_nodes(self) -> list[ProgramNode]:
        """The graph's dataflow by plan name, for ``autoshard.program.actions.build_step_program``:
        the ops in graph order, each followed by its tuple accesses by output (one per output that
        is read), as the planner builds it (``autoshard.assembly.step_program``)."""
        accesses: dict[str, set[int]] = {}
        for b in self.ops:
            if b.op is operator.getitem and b.node.users:
                accesses.setdefault(self.value_name(b.node.args[0]), set()).add(int(b.node.args[1]))
        out: list[ProgramNode] = []

        def with_accesses(name: str) -> None:  # an element that is a tuple again: its accesses after it
            for k in sorted(accesses.get(name, ())):
                out.append(ProgramNode(tuple_value(name, k), (name,), name))
                with_accesses(tuple_value(name, k))

        for b in self.ops:
            if b.op is not operator.getitem:
                name = b.node.name
                out.append(ProgramNode(name, tuple(dict.fromkeys(self.value_name(u) for u in b.node.all_input_nodes))))
                with_accesses(name)
        return out

    def item_reads(self) -> dict[tuple, tuple[str, ...]]:
        """``ScheduleItem.key`` -> the values its issue reads (a redistribution's producer, a gather's members')."""
        return {key: tuple(self.value_name(m.source) for m in ((x.edge,) if x.edge is not None else x.members))
                for key, x in self.scheduled.items()}

    def mesh_dim_sets(self) -> list[tuple[int, ...]]:
        """Every set of mesh dims a collective of the plan runs on (for ``MeshComm.prepare``)."""
        return sorted({tuple(s.mesh_dims) for *_, s in self.collective_steps}
                      | {tuple(b.mesh_dims) for b, _ in self.buckets})

    def _resolve_schedule(self) -> dict[tuple, Scheduled]:
        """Each schedule item resolved to its edge (head steps, the collective left in flight, the
        local tail) or bucket, checked; every redistribution issuing collectives must be scheduled."""
        out: dict[tuple, Scheduled] = {}
        for item in self.schedule.items:
            if item.bucket is not None:
                if not 0 <= item.bucket < len(self.buckets):
                    raise RuntimeLoadError(f"plan: the schedule names bucket {item.bucket}, the plan has "
                                           f"{len(self.buckets)}")
                entry = Scheduled(item, None, bucket=item.bucket)
            elif item.gather is not None:
                entry = Scheduled(item, None, gather=item.gather, members=self._gather_members(item.gather))
            else:
                e = self.edges.get(item.edge)
                last = max((k for k, st in enumerate(e.steps) if st.collective in COLLECTIVE_STEPS), default=None) \
                    if e is not None else None
                if last is None:
                    raise RuntimeLoadError(f"plan: the schedule names {item.edge[0]} -> {item.edge[1]} "
                                           f"(input {item.edge[2]}), which has no collective step")
                entry = Scheduled(item, e, e.steps[:last], e.steps[last], e.steps[last + 1:])
            out[item.key] = entry
        scheduled = {x.edge.key for x in out.values() if x.edge is not None}
        scheduled |= {m.key for x in out.values() for m in x.members}
        bucketed = {m for b in self.plan.buckets for m in b.members}
        for key, e in self.edges.items():
            if key not in scheduled and key[1] not in bucketed and e.reuses is None and any(
                    st.collective in COLLECTIVE_STEPS for st in e.steps):
                raise RuntimeLoadError(f"plan: the schedule does not schedule {key[0]} -> {key[1]} (input {key[2]}), "
                                       "which issues collectives")
        return out

    def _check_leaf_views(self) -> None:
        """The schedule's leaf views (``autoshard.program.schedule``), checked: each a view op
        of one leaf or earlier leaf view, its input not redistributed. The program makes
        them before position 0 (views: no kernel, no memory), so that their gathers can be
        issued ahead of their readers."""
        by_name = {b.node.name: b for b in self.ops}
        leaves = set(self.traced.params.values()) | set(self.traced.buffers.values()) | set(
            self.traced.inputs.values()) | set(self.constants)
        done: set[str] = set()
        for name in self.schedule.leaf_views:
            b = by_name.get(name)
            ok = (b is not None and op_name(b.op) in VIEW_OPS and len(b.edges) == 1
                  and not b.edges[0].steps and b.random is None)
            if ok:
                source = b.edges[0].source
                ok = source in leaves or source.name in done
            if not ok:
                raise RuntimeLoadError(f"plan: schedule.leaf_views names {name}, which is not a view of a leaf "
                                       "(or of another leaf view) read without redistribution")
            done.add(name)

    def _placement(self, text: str | None) -> tuple[Placement, ...]:
        return placements_of(text, len(self.mesh_shape))

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
        self.constants: dict[fx.Node, torch.Tensor] = {}
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
            self.constants[node] = local_slice(value, pl, self.mesh_shape, self.coord).to(self.device)

        return produced

    def _source(self, arg: fx.Node) -> tuple[str, int, tuple[Placement, ...]]:
        """(producer name in the plan, its output index, placements) of the value ``arg``."""
        if arg.op == "call_function" and arg.target is operator.getitem:
            name, outs = self._produced[arg.args[0]]
            k = int(arg.args[1])
            return name, k, outs[k] if outs[k] is not None else self._placement(None)
        name, outs = self._produced[arg]
        return name, 0, outs[0] if outs[0] is not None else self._placement(None)

    def _edge(self, arg: fx.Node, reader: str, position: int, want: tuple[Placement, ...] | None) -> Edge:
        producer, _, have = self._source(arg)
        r = self._redist.get((reader, position))
        shape = tuple(int(s) for s in arg.meta["val"].shape)
        where = f"{producer} -> {reader} (input {position})"
        if want is None:  # an input whose values the op does not read
            if r is not None:
                raise RuntimeLoadError(f"plan: {where} is not read by the op, yet the plan redistributes it")
            return Edge(arg, (), shape, (producer, reader, position))
        if r is None:
            if have != want:
                raise RuntimeLoadError(f"plan: {where} needs {_fmt(have)} -> {_fmt(want)} but has no redistribution")
            return Edge(arg, (), shape, (producer, reader, position))
        self._used.add((reader, position))
        reused = None
        if r.reuses is not None:  # reads an earlier reader's copy of the same tensor in the same placement
            first = self._redist.get(r.reuses)
            if first is None or (first.tensor, first.output_index, first.src, first.dst) != (
                    r.tensor, r.output_index, r.src, r.dst) or first.reuses is not None:
                raise RuntimeLoadError(f"plan: {where} reuses the redistribution into {r.reuses[0]} (input "
                                       f"{r.reuses[1]}), which is not one of the same tensor to the same placement")
            reused, r = (first.tensor, first.to, first.input_index), first
            self.reuse_count[reused] = self.reuse_count.get(reused, 0) + 1
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
        made = Edge(arg, tuple(r.steps), shape, (producer, reader, position), reused)
        self.edges[made.key] = made
        return made


    def _bind_ops(self) -> list[OpBinding]:
        """One program step per op and tuple access of the graph, in graph order, checked against the plan."""
        gm, plan = self.traced.graph_module, self.plan
        plan_nodes = {n.name: n for n in plan.nodes}
        produced = self._produced
        program: list[OpBinding] = []
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output") or node in self.constants:
                continue
            if node.op != "call_function":
                raise RuntimeLoadError(f"{node.name}: graph node kind {node.op!r} is not supported")
            if node.target is operator.getitem:
                if node.args[0] not in produced:
                    raise RuntimeLoadError(f"{node.name}: reads {node.args[0].name}, which makes no tensor")
                program.append(OpBinding(node, operator.getitem, None, [], (), ()))
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
            program.append(OpBinding(node, node.target, rule.localize if rule is not None else None, edges,
                                      outs, out_global, random=random if random in SLICEABLE and not replicated
                                      else None, draws=random is not None))
            self.has_random = self.has_random or random is not None
        return program

    def _gather_members(self, index: int) -> tuple[Edge, ...]:
        """The edges of gather bucket ``index``, checked: each a single all_gather on the bucket's mesh dims."""
        if not 0 <= index < len(self.plan.gather_buckets):
            raise RuntimeLoadError(f"plan: the schedule names gather bucket {index}, the plan has "
                                   f"{len(self.plan.gather_buckets)}")
        bucket = self.plan.gather_buckets[index]
        out = []
        for member in bucket.members:
            e = self.edges.get(member)
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
