"""Trace a deep model from three of its blocks: the joint graph of a stack of
identical blocks (transformer layers) stamped out from one traced block.

Tracing dominates a large model's time to a plan (LLaMA-3 8B, 32 layers: 10.6 s
of a 29 s solve on 2 cores) and grows with depth, while every layer of a stack
traces to the same ops. For a stack of ``n`` blocks with keys ``k_0 .. k_{n-1}``
(``layers.0`` ... of an ``nn.ModuleList``, ``nn.ModuleDict`` or ``nn.Sequential``
that is not the root), the model is traced with the stack cut to its first
three blocks: block 0 (whose inputs come from before the stack), block 1 (the
template: inputs from a block before it, outputs to a block after it) and
block 2 (whose outputs leave the stack). Write ``F_b`` / ``B_b`` for block
``b``'s forward and backward runs (maximal runs of consecutive graph nodes
labelled with the block's module path) and ``P_b`` for its parameter inputs.
The graph of the whole stack is

    ... F_0  F_1  F_2' ... F_{n-2}'  F_{n-1}  ...  B_{n-1}  B_{n-2}' ... B_2'  B_1  B_0 ...

where ``F_{n-1}``, ``B_{n-1}`` are the traced block 2's runs relabelled, and a
copy ``X_j'`` of a template node ``x`` of block 1 reads

- ``y_j'`` for an argument ``y`` of block 1 (its own block; ``P_1`` -> ``P_j``),
- the counterpart of ``y`` in block ``j - 1`` for an argument ``y`` of block 0
  (the copy of the node at ``y``'s position in block 1's run; block 0 itself for
  ``j = 1``) and in block ``j + 1`` for one of block 2 (the backward reads the
  next block's input gradient; block ``n - 1`` for ``j = n - 2``),
- ``y`` itself otherwise (the stack's shared inputs: rotary tables, masks).

Block 2's nodes read copy ``n - 2`` where the trace read block 1. Nodes are
created in the order above, so ``fx`` names them as a trace of the whole model
would (``mm_41``: each op's counter advances in graph order); placeholders,
descriptors (``ParamAOTInput("p17")``), outputs and the pytree specs are
renumbered to the whole model's parameters.

Why this is safe: stamping is refused (and the model traced whole) unless the
blocks are interchangeable (same classes, parameter and buffer shapes, and
attributes, a block's own index aside), the stack holds no buffers, tensor
constants or parameters shared outside its block, the runs line up op for op,
and -- the check -- the graph stamped from three blocks to four equals, node for
node (names, ops, arguments, tensor metadata, module paths, descriptors,
generated code), a trace of the model cut to four blocks. The one case the
check cannot see is a forward that branches on its block's index without
storing the branch in an attribute. Only planning uses stamped graphs
(``autoshard.search.solve.prepare`` when it traces); the runtime traces the whole
model and checks the plan's graph hash, so a stamped graph that differed from
the real one would be refused as "a plan for another model", never run.

Which stack is stamped, :mod:`autoshard.trace.blocks` says (the one rule of a
model's repeated blocks: :func:`~autoshard.trace.blocks.find_stack`, the largest
of at least :data:`STAMP_MIN_BLOCKS` interchangeable ones); this module cuts,
copies and checks.

>>> from examples.models import llama3
>>> model, inputs = llama3.tiny(device="meta", n_layers=8)
>>> stack = find_stack(model, STAMP_MIN_BLOCKS)
>>> with truncated(model, stack, TEMPLATE_BLOCKS):
...     len(model.layers)
3
>>> len(model.layers)
8
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn
from torch._functorch._aot_autograd import descriptors as aot_desc

from autoshard.trace.blocks import Stack, find_stack
from autoshard.trace.compat import MODULE_KEY, node_module

log = logging.getLogger(__name__)

__all__ = ["StampError", "STAMP_MIN_BLOCKS", "truncated", "stamp", "graph_difference", "stamped_joint", "NodeNames"]

STAMP_MIN_BLOCKS = 8
"""Fewest blocks a stack is stamped from: tracing 3 and 4 blocks (the template and
its check) costs about as much as tracing 7 (LLaMA-3 8B: 0.9 + 1.1 s against 2.5 s for 8)."""

TEMPLATE_BLOCKS = 3
CHECK_BLOCKS = 4

_SUFFIX = re.compile(r"^(.*?)_(\d+)$")


class StampError(ValueError):
    """The graph cannot be stamped from the template (the model is then traced whole)."""


@contextlib.contextmanager
def truncated(model: nn.Module, stack: Stack, count: int) -> Iterator[None]:
    """While the block runs, ``model``'s stack holds only its first ``count`` blocks
    (the same module objects; restored on exit, also on error)."""
    parent_path, _, name = stack.path.rpartition(".")
    parent = model.get_submodule(parent_path)
    container = getattr(parent, name)
    keep = [(key, container.get_submodule(key)) for key in stack.keys[:count]]
    if isinstance(container, nn.ModuleDict):
        short: nn.Module = nn.ModuleDict(keep)
    elif isinstance(container, nn.Sequential):
        short = nn.Sequential(dict(keep))
    else:
        short = nn.ModuleList([m for _, m in keep])
    setattr(parent, name, short)
    try:
        yield
    finally:
        setattr(parent, name, container)


@dataclass(slots=True)
class _Template:
    """The traced three-block graph, cut into blocks."""

    stack: Stack
    block: dict[fx.Node, int]           # node -> traced block (0, 1, 2); absent: outside the stack
    forward_end: fx.Node                # last node of block 1's forward run
    backward_start: fx.Node             # first node of block 1's backward run
    runs: dict[int, tuple[list[fx.Node], list[fx.Node]]]
    counterpart: dict[fx.Node, fx.Node]  # node of block 0 or 2 -> node at its position in block 1
    params: dict[fx.Node, tuple[int, str]]  # param placeholder -> (block or -1, path inside the block or FQN)


def stamp(graph_module: fx.GraphModule, stack: Stack, slots: dict[str, str], n_slots: dict[str, str],
          n_blocks: int, names: NodeNames | None = None) -> fx.Graph:
    """The joint graph of the model with ``n_blocks`` blocks in ``stack``, from
    ``graph_module`` traced with the first three (module docstring). ``slots`` /
    ``n_slots``: descriptor targets (``p0``) -> FQNs, of the traced and of the whole
    model. ``names``: the nodes' names (:class:`NodeNames`; default: each op's next
    free name, which differs from a trace's where the trace erased nodes). Raises
    :class:`StampError` when the graph does not cut into blocks."""
    return _stamper(graph_module, _cut(graph_module, stack, slots), n_slots, n_blocks, names).graph


def _stamper(graph_module: fx.GraphModule, tpl: _Template, n_slots: dict[str, str], n_blocks: int,
             names: NodeNames | None) -> _Stamper:
    if n_blocks < TEMPLATE_BLOCKS:
        raise StampError(f"{n_blocks} blocks: stamping needs at least {TEMPLATE_BLOCKS}")
    stamper = _Stamper(graph_module, tpl, n_slots, n_blocks, names)
    stamper.run()
    return stamper


def _pass(node: fx.Node) -> Any:
    """Forward or backward (the partitioner's tag on the node)."""
    return node.meta.get("partitioner_tag")


def _runs(calls: list[fx.Node], labels: list[int | None], b: int, prefix: str) -> tuple[list[fx.Node], list[fx.Node]]:
    """Block ``b``'s forward and backward runs (maximal runs of consecutive nodes labelled ``b``)."""
    found: list[list[fx.Node]] = []
    for i, n in enumerate(calls):
        if labels[i] == b:
            if not found or labels[i - 1] != b:
                found.append([])
            found[-1].append(n)
    if len(found) != 2:
        raise StampError(f"block {prefix} is {len(found)} runs of nodes, not a forward and a backward")
    return found[0], found[1]


def _cut(graph_module: fx.GraphModule, stack: Stack, slots: dict[str, str]) -> _Template:
    """Label each node with its block and check that the blocks line up."""
    prefixes = [stack.prefix(b) for b in range(TEMPLATE_BLOCKS)]

    def block_of_path(path: str | None) -> int | None:
        for b, prefix in enumerate(prefixes):
            if path is not None and (path == prefix or path.startswith(prefix + ".")):
                return b
        return None

    params: dict[fx.Node, tuple[int, str]] = {}
    calls: list[fx.Node] = []
    for node in graph_module.graph.nodes:
        if node.op == "placeholder":
            desc = node.meta.get("desc")
            if isinstance(desc, aot_desc.BufferAOTInput) and block_of_path(slots[desc.target]) is not None:
                raise StampError("a block holds a buffer")
            if isinstance(desc, aot_desc.ParamAOTInput):
                fqn = slots[desc.target]
                b = block_of_path(fqn)
                params[node] = (-1, fqn) if b is None else (b, fqn[len(prefixes[b]):])
        elif node.op == "get_attr":
            calls.append(node)
        elif node.op == "call_function":
            calls.append(node)
    labels = [block_of_path(node_module(n)) for n in calls]
    if any(n.op == "get_attr" and labels[i] is not None for i, n in enumerate(calls)):
        raise StampError("a block reads a tensor constant")
    # unlabelled nodes between two blocks' nodes of the same pass (autograd's gradient sums
    # between two layers' backwards) belong to the block before
    tagged = [i for i, n in enumerate(calls) if node_module(n) is not None]
    for i, n in enumerate(calls):
        if node_module(n) is None:
            at = bisect.bisect_left(tagged, i)
            if 0 < at < len(tagged):
                before, after = tagged[at - 1], tagged[at]
                if labels[before] is not None and labels[after] is not None \
                        and _pass(calls[before]) == _pass(n) == _pass(calls[after]):
                    labels[i] = labels[before]
    runs = {b: _runs(calls, labels, b, prefixes[b]) for b in range(TEMPLATE_BLOCKS)}
    for b in (0, 2):  # an end block's unlabelled tail (block 0's last gradient sum precedes the embedding's)
        for mine, template in zip(runs[b], runs[1]):
            i = calls.index(mine[-1]) + 1
            while len(mine) < len(template) and i < len(calls) and labels[i] is None \
                    and calls[i].target == template[len(mine)].target and _pass(calls[i]) == _pass(mine[-1]):
                labels[i] = b
                mine.append(calls[i])
                i += 1
    block = {n: b for n, b in zip(calls, labels) if b is not None}
    # a copy reads the block before it in the forward (its input) and the block after it in the
    # backward (its output's gradient): those runs must line up with the template's; block 0's
    # backward need not (it makes no gradient for the stack's input when that needs none)
    counterpart: dict[fx.Node, fx.Node] = {}
    for b, which in ((0, 0), (2, 0), (2, 1), (0, 1)):
        mine, template = runs[b][which], runs[1][which]
        if [n.target for n in mine] == [n.target for n in template]:
            counterpart.update(zip(mine, template))
        elif (b, which) != (0, 1):
            raise StampError(f"block {prefixes[b]}'s ops differ from block {prefixes[1]}'s")
    return _Template(stack, block, runs[1][0][-1], runs[1][1][0], runs, counterpart, params)


def _split(name: str) -> tuple[str, int]:
    """``("mm", 41)`` for ``mm_41``; ``("mm", 0)`` for ``mm``."""
    match = _SUFFIX.match(name)
    return (match.group(1), int(match.group(2))) if match else (name, 0)


class NodeNames:
    """The names a whole trace gives the stamped nodes, fitted on traces of three and four blocks.

    ``fx`` names a node ``<op>_<k>`` where ``k`` counts the names of that op
    allocated before it in trace order, erased nodes' included (an unused
    ``arange`` of a mask builder). Each block allocates the same names, so for
    a node outside the copies ``k = k_3 + (n - 3) d`` (``d = k_4 - k_3``: what one
    more block allocates before it) and for copy ``j`` of a template node
    ``k = k_3 + (n - 3) b + (j - 1) c`` (``b``: one more block's allocations before
    the template's node, 0 in the forward; ``c``: one block's step), both read
    off the two traces. The same for each op's next free name, so that nodes
    added later (:func:`~autoshard.trace.device.for_device`) are named as in a
    whole trace.
    """

    def __init__(self, three: fx.Graph, four: fx.Graph, origins: list[tuple[fx.Node, int | None]]) -> None:
        nodes = [n for n in four.nodes if n.op != "output"]
        if len(nodes) != len(origins):
            raise StampError(f"stamped 4 blocks have {len(origins)} nodes, 4 traced {len(nodes)}")
        self.four: dict[tuple[fx.Node, int | None], int] = {}
        for (node, copy), traced in zip(origins, nodes):
            base, k = _split(traced.name)
            if base != _split(node.name)[0] or node.op != traced.op or \
                    (node.op != "placeholder" and node.target != traced.target):
                raise StampError(f"stamped {node.name} against traced {traced.name}")
            self.four[(node, copy)] = k
        self.counts3 = dict(three._graph_namespace._base_count)
        self.counts4 = dict(four._graph_namespace._base_count)

    def name(self, node: fx.Node, copy: int | None, n: int) -> str:
        """The name of ``node`` (traced with three blocks) in the graph of ``n`` blocks (``copy``: which
        copy of the template it is; None outside the copies)."""
        base, k3 = _split(node.name)
        if copy is None:
            k = k3 + (n - 3) * (self.four[(node, None)] - k3)
        else:
            first = self.four[(node, 1)]
            k = k3 + (n - 3) * (first - k3) + (copy - 1) * (self.four[(node, 2)] - first)
        if k < 0 or (k == 0) != (k3 == 0):
            raise StampError(f"{node.name}: no name for {n} blocks")
        return f"{base}_{k}" if k else base

    def base_counts(self, n: int) -> dict[str, int]:
        """Each op's name count after a whole trace of ``n`` blocks."""
        return {base: c + (n - 3) * (self.counts4.get(base, c) - c) for base, c in self.counts3.items()}


class _Stamper:
    """Builds the stamped graph (one use)."""

    def __init__(self, graph_module: fx.GraphModule, tpl: _Template, n_slots: dict[str, str], n: int,
                 names: NodeNames | None) -> None:
        self.gm, self.tpl, self.n, self.names = graph_module, tpl, n, names
        self.slot_of = {fqn: slot for slot, fqn in n_slots.items()}
        self.graph = fx.Graph()
        self.new: dict[tuple[fx.Node, int | None], fx.Node] = {}  # (traced node, copy or None) -> new node
        self.origins: list[tuple[fx.Node, int | None]] = []  # per new node, in graph order
        self.primals = 0
        self.block_params = [p for p, (b, _) in tpl.params.items() if b == 1]
        self.by_target = {p.meta["desc"].target: info for p, info in tpl.params.items()}

    def run(self) -> fx.Graph:
        tpl = self.tpl
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "output":
                self._output(node)
            elif tpl.block.get(node) == 1:
                if node is tpl.backward_start:
                    for j in range(self.n - 2, 1, -1):
                        for t in tpl.runs[1][1]:
                            self._emit(t, j)
                self._emit(node, 1)
                if node is tpl.forward_end:
                    for j in range(2, self.n - 1):
                        for t in tpl.runs[1][0]:
                            self._emit(t, j)
            else:
                self._emit(node, None)
        self.graph._codegen = fx.graph._PyTreeCodeGen(self._pytree_info())
        if self.names is not None:  # the names fx gives the device's kernels next, as after a whole trace
            counts = self.graph._graph_namespace._base_count
            for base, count in self.names.base_counts(self.n).items():
                counts[base] = max(counts.get(base, 0), count)
        return self.graph

    def _name(self, node: fx.Node, copy: int | None) -> str:
        self.origins.append((node, copy))
        if self.names is not None:
            return self.names.name(node, copy, self.n)
        match = _SUFFIX.match(node.name)
        if node.op == "placeholder" and match and match.group(1) == "primals":
            self.primals += 1
            return f"primals_{self.primals}"
        return match.group(1) if match else node.name

    # -- placeholders and outputs ------------------------------------------------------------
    def _placeholder(self, node: fx.Node) -> None:
        info = self.tpl.params.get(node)
        block_params = self.block_params
        if info is None or info[0] != 1:
            self._new_placeholder(node, None, info)
            return
        self._new_placeholder(node, 1, info)
        if node is block_params[-1]:
            for j in range(2, self.n - 1):
                for p in block_params:
                    self._new_placeholder(p, j, self.tpl.params[p])

    def _new_placeholder(self, node: fx.Node, copy: int | None, info: tuple[int, str] | None) -> None:
        meta = dict(node.meta)
        if info is not None:
            fqn = info[1] if info[0] < 0 else self._block_prefix(info[0], copy) + info[1]
            if fqn not in self.slot_of:
                raise StampError(f"parameter {fqn} is not the whole model's")
            meta["desc"] = dataclasses.replace(node.meta["desc"], target=self.slot_of[fqn])
        name = self._name(node, copy)
        new = self.graph.placeholder(name, type_expr=node.type)
        if new.name != name:
            raise StampError(f"placeholder {name} named {new.name}")
        new.meta = meta
        self.new[(node, copy)] = new

    def _output(self, node: fx.Node) -> None:
        values, descs = node.args[0], node.meta["desc"]
        out_values: list[Any] = []
        out_descs: list[Any] = []
        block_grads = [i for i, d in enumerate(descs) if isinstance(d, aot_desc.GradAOTOutput)
                       and isinstance(d.grad_of, aot_desc.ParamAOTInput) and self._param(d.grad_of)[0] == 1]
        for i, (value, desc) in enumerate(zip(values, descs)):
            if i not in block_grads:
                out_values.append(None if value is None else self._arg(value, None, None))
                is_grad = isinstance(desc, aot_desc.GradAOTOutput) and isinstance(desc.grad_of, aot_desc.ParamAOTInput)
                out_descs.append(self._grad_desc(desc, None) if is_grad else desc)  # renumbered
                continue
            copies = [1] + (list(range(2, self.n - 1)) if i == block_grads[-1] else [])
            for j in copies:
                for k in ([i] if j == 1 else block_grads):
                    out_values.append(None if values[k] is None else self._arg(values[k], j, j))
                    out_descs.append(self._grad_desc(descs[k], j))
        self._added_grads = len(out_values) - len(values)
        new = self.graph.output(type(values)(out_values))
        new.meta = {**node.meta, "desc": out_descs}

    def _param(self, desc: Any) -> tuple[int, str]:
        """(block, path) of the traced parameter a ``ParamAOTInput`` names."""
        info = self.by_target.get(desc.target)
        if info is None:
            raise StampError(f"no parameter {desc.target}")
        return info

    def _grad_desc(self, desc: Any, copy: int | None) -> Any:
        b, inner = self._param(desc.grad_of)
        fqn = self._block_prefix(b, copy) + inner
        return dataclasses.replace(desc, grad_of=dataclasses.replace(desc.grad_of, target=self.slot_of[fqn]))

    def _pytree_info(self) -> Any:
        """The traced graph's input and output specs, with the stamped counts."""
        info = self.gm.graph._codegen.pytree_info
        old = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        old_tangents = sum(1 for n in old if isinstance(n.meta.get("desc"), aot_desc.TangentAOTInput))
        children = info.out_spec.children()
        fwd_outputs, grads = (c.num_leaves for c in children) if len(children) == 2 else (-1, -1)
        if info.in_spec != _in_spec(len(old) - old_tangents, old_tangents) or \
                info.out_spec != _out_spec(fwd_outputs, grads):
            raise StampError("the traced graph's input or output spec is not (primals, tangents) -> (outputs, grads)")
        new = [n for n in self.graph.nodes if n.op == "placeholder"]
        return fx.graph._PyTreeInfo(list(info.orig_args), _in_spec(len(new) - old_tangents, old_tangents),
                                    _out_spec(fwd_outputs, grads + self._added_grads))

    # -- call nodes --------------------------------------------------------------------------
    def _block_prefix(self, traced_block: int, copy: int | None) -> str:
        """The whole model's path of a traced block (``copy`` for the template)."""
        index = {0: 0, 2: self.n - 1}.get(traced_block, copy)
        return self.tpl.stack.prefix(index) if index is not None else ""

    def _emit(self, node: fx.Node, copy: int | None) -> None:
        b = self.tpl.block.get(node)
        context = copy if b == 1 else {0: 0, 2: self.n - 1}.get(b) if b is not None else None
        args = fx.node.map_arg(node.args, lambda y: self._arg(y, copy, context))
        kwargs = fx.node.map_arg(node.kwargs, lambda y: self._arg(y, copy, context))
        name = self._name(node, copy if b == 1 else None)
        new = self.graph.create_node(node.op, node.target, args, kwargs, name=name, type_expr=node.type)
        if self.names is not None and new.name != name:
            raise StampError(f"{name} is taken (named {new.name})")
        meta = dict(node.meta)
        if b is not None:
            path = node_module(node)
            if path is not None:
                old = self.tpl.stack.prefix(b)
                meta["custom"] = {**meta["custom"], MODULE_KEY: self._block_prefix(b, copy) + path[len(old):]}
        new.meta = meta
        self.new[(node, copy if b == 1 else None)] = new

    def _arg(self, y: fx.Node, copy: int | None, context: int | None) -> fx.Node:
        """The new node an argument ``y`` of a node in whole-model block ``context`` reads
        (``copy``: which copy of block 1 the reading node is, when it is one)."""
        tpl, n = self.tpl, self.n
        if y.op == "placeholder":
            info = tpl.params.get(y)
            if info is not None and info[0] == 1:
                if copy is None:
                    raise StampError(f"{y.name} (a block's parameter) is read outside its block")
                return self.new[(y, copy)]
            return self.new[(y, None)]
        b = tpl.block.get(y)
        if b is None:
            return self.new[(y, None)]
        if context is None:
            if b == 1:
                raise StampError(f"{y.name} (inside the stack) is read outside it")
            return self.new[(y, None)]
        target = {0: 0, 2: n - 1}.get(b)
        if b == 1:  # the reading block's own node, or read across one block
            target = context if 1 <= context <= n - 2 else (1 if context == 0 else n - 2)
        elif 1 <= context <= n - 2:  # a copy reads its neighbours
            target = context - 1 if b == 0 else context + 1
        if abs(target - context) > 1:
            raise StampError(f"{y.name} is read {abs(target - context)} blocks away")
        if target == 0 or target == n - 1:
            if b == 1:
                raise StampError(f"{y.name}: block 1 read as an end block")
            return self.new[(y, None)]
        template = y if b == 1 else tpl.counterpart.get(y)
        if template is None:
            raise StampError(f"{y.name} has no counterpart in the template block")
        key = (template, target)
        if key not in self.new:
            raise StampError(f"{y.name} is read before its copy exists")
        return self.new[key]


def _in_spec(primals: int, tangents: int) -> Any:
    return pytree.tree_structure(([0] * primals, [0] * tangents))


def _out_spec(outputs: int, grads: int) -> Any:
    return pytree.tree_structure(((0,) * outputs, (0,) * grads))


def graph_difference(a: fx.Graph, b: fx.Graph) -> str | None:
    """The first difference between two joint graphs (None: equal node for node)."""
    na, nb = list(a.nodes), list(b.nodes)
    if len(na) != len(nb):
        return f"{len(na)} nodes against {len(nb)}"
    for x, y in zip(na, nb):
        if (x.op, x.name, x.target) != (y.op, y.name, y.target):
            return f"{x.op} {x.name} {x.target} against {y.op} {y.name} {y.target}"
        if _arg_names(x) != _arg_names(y):
            return f"{x.name}'s arguments differ"
        for key in ("custom", "partitioner_tag"):
            if x.meta.get(key) != y.meta.get(key):
                return f"{x.name}'s {key} differs: {x.meta.get(key)} against {y.meta.get(key)}"
        if repr(x.meta.get("desc")) != repr(y.meta.get("desc")):
            return f"{x.name}'s descriptor differs"
        if _value_key(x.meta.get("val")) != _value_key(y.meta.get("val")):
            return f"{x.name}'s value differs"
    ia, ib = a._codegen.pytree_info, b._codegen.pytree_info
    if (ia.in_spec, ia.out_spec, ia.orig_args) != (ib.in_spec, ib.out_spec, ib.orig_args):
        return "pytree specs differ"
    if a.python_code("self").src != b.python_code("self").src:
        return "generated code differs"
    return None


def _arg_names(node: fx.Node) -> Any:
    return repr(fx.node.map_arg((node.args, node.kwargs), lambda n: n.name))


def _value_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), tuple(value.stride()), value.dtype, value.device.type, value.requires_grad)
    if isinstance(value, (tuple, list)):
        return tuple(_value_key(v) for v in value)
    return repr(value)


def stamped_joint(model: nn.Module, trace: Callable[[], Any], slots_of: Callable[[nn.Module], dict[str, str]],
                  ) -> tuple[Any, fx.Graph] | None:
    """``(trace of the model cut to three blocks, the whole joint graph stamped from it)``
    (the graph's module: ``fx.GraphModule(trace.graph_module, graph)``),
    or None where stamping does not apply or its check fails (the reason is logged).
    ``trace()`` traces ``model`` as it is at the call (a record with ``graph_module`` and
    ``slot_names``, the descriptor targets' FQNs); ``slots_of(model)``: those FQNs without tracing."""
    stack = find_stack(model, STAMP_MIN_BLOCKS)
    if stack is None:
        return None
    try:
        with truncated(model, stack, TEMPLATE_BLOCKS):
            three = trace()
        with truncated(model, stack, CHECK_BLOCKS):
            four = trace()
        tpl = _cut(three.graph_module, stack, three.slot_names)  # one template for the three stampings
        first = _stamper(three.graph_module, tpl, four.slot_names, CHECK_BLOCKS, None)
        names = NodeNames(three.graph_module.graph, four.graph_module.graph, first.origins)
        check = _stamper(three.graph_module, tpl, four.slot_names, CHECK_BLOCKS, names).graph
        difference = graph_difference(check, four.graph_module.graph)
        if difference is not None:
            raise StampError(f"stamped 4 blocks differ from 4 traced: {difference}")
        whole = _stamper(three.graph_module, tpl, slots_of(model), len(stack.keys), names).graph
    except Exception as exc:  # noqa: BLE001 - whatever fails, the model is traced whole
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.info("%s traced whole, not stamped: %s", stack.path, reason)
        return None
    log.debug("%s: %d blocks stamped from 3", stack.path, len(stack.keys))
    return three, whole
