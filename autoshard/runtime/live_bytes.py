"""The runtime's own account of the tensor bytes a rank holds during a step, and its peak.

What counts: every distinct storage the per-rank program holds (a view
shares its base's storage and is counted once): the leaves (parameters,
buffers, the batch, tensor constants) all step, since the module and the
caller hold them; every value in the program's environment from the op that
makes it to the point where the program frees it (activations, recomputed
values, gradients); every redistributed copy from the wait of its collective
(or its reader, for one run there) to the end of its reader; and, at each
op, the op's inputs and outputs together. The peak is taken after each op,
when its inputs and its outputs both exist.

Not counted: buffers inside collectives in flight, the optimizer's state
(the optimizer is not the runtime's), allocator slack and kernel workspace.
This is what the plan's memory timeline counts for the step, less the
optimizer state (``autoshard.program.memory``).

>>> import torch
>>> live = LiveBytes()
>>> x = torch.zeros(4)
>>> live.hold(x); live.hold(x[:2]); live.now   # a view: the same storage
16
>>> live.touch([torch.zeros(2)]); live.peak
24

:func:`program_storages` gives the same count's inputs for the step program's
own replay (``autoshard.program.live_bytes.live_bytes_timeline``): the storages each
value of the bound plan holds, from the plan's placements and the ops' alias
annotations (a view op's output is its input's storage), without running anything.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterable, Iterator, Mapping

import torch
import torch.fx as fx

from costmodel.shard_shapes import local_shape

from autoshard.program.live_bytes import HeldCopy

__all__ = ["LiveBytes", "TrackedDict", "program_storages", "program_copies"]


def _storages(value: Any) -> Iterator[tuple[int, int]]:
    """(storage key, bytes) of every tensor in ``value`` (tuples and lists walked)."""
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes:
            yield storage.data_ptr(), nbytes
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _storages(v)


class LiveBytes:
    """Distinct storages held (with a count of holders each), the bytes now and the peak."""

    __slots__ = ("_refs", "now", "peak")

    def __init__(self) -> None:
        self._refs: dict[int, list[int]] = {}
        self.now = 0
        self.peak = 0

    def hold(self, value: Any) -> None:
        for key, nbytes in _storages(value):
            ref = self._refs.get(key)
            if ref is None:
                self._refs[key] = [1, nbytes]
                self.now += nbytes
            else:
                ref[0] += 1
        self.peak = max(self.peak, self.now)

    def release(self, value: Any) -> None:
        for key, _ in _storages(value):
            ref = self._refs.get(key)
            if ref is None:
                continue
            ref[0] -= 1
            if ref[0] == 0:
                del self._refs[key]
                self.now -= ref[1]

    def touch(self, values: Iterable[Any]) -> None:
        """Count ``values`` (an op's inputs and outputs) with what is held, for the peak only."""
        extra: dict[int, int] = {}
        for value in values:
            for key, nbytes in _storages(value):
                if key not in self._refs:
                    extra[key] = nbytes
        self.peak = max(self.peak, self.now + sum(extra.values()))


class TrackedDict(dict):
    """A dict whose values are held in a :class:`LiveBytes` while they are in it
    (``d[k] = v``, ``pop`` and ``del``; other mutators are not used by the runtime)."""

    def __init__(self, live: LiveBytes, items: Any = ()) -> None:
        super().__init__()
        self.live = live
        for key, value in dict(items).items():
            self[key] = value

    def __setitem__(self, key: Any, value: Any) -> None:
        if key in self:
            self.live.release(dict.__getitem__(self, key))
        self.live.hold(value)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self.live.release(dict.__getitem__(self, key))
        dict.__delitem__(self, key)

    _MISSING = object()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if key in self:
            value = dict.pop(self, key)
            self.live.release(value)
            return value
        if default is TrackedDict._MISSING:
            raise KeyError(key)
        return default


def _aliases(op: Any) -> list[bool]:
    """Per output: whether the op returns a view of an input (its schema's alias annotation)."""
    if op is torch.ops.aten._unsafe_view.default:  # no alias annotation, yet a view of its input (as run here)
        return [True]
    schema = getattr(op, "_schema", None)
    if schema is None:
        return []
    return [r.alias_info is not None for r in schema.returns]


def program_storages(binding: Any, leaves: Mapping[fx.Node, torch.Tensor]) -> dict[str, list[tuple[str, int]]]:
    """Value name (the plan's: ``PlanBinding.value_name``) -> (storage key, bytes) of each storage
    it holds on this rank, for ``autoshard.program.live_bytes.live_bytes_timeline``: a leaf its
    tensor's storage; an op output its local bytes (the plan's placement), or its first tensor input's storage
    when the op's schema says it returns a view; a tuple access its element's.
    ``binding``: an ``autoshard.runtime.binding.PlanBinding``; ``leaves``: the step's leaf
    tensors (parameters, buffers, inputs, tangent, constants).

    >>> # storages = program_storages(runner.binding, leaves)
    """
    outputs: dict[str, list[list[tuple[str, int]]]] = {}
    name_of = binding.value_name
    for node, value in leaves.items():
        storage = value.untyped_storage()
        outputs[name_of(node)] = [[(f"leaf@{storage.data_ptr()}", storage.nbytes())]]
    for b in binding.ops:
        name = name_of(b.node)
        if b.op is operator.getitem:
            outputs[name] = [outputs[b.node.args[0].name][int(b.node.args[1])]]
            continue
        alias = _aliases(b.op)
        first = outputs.get(name_of(b.edges[0].source), [[]]) if b.edges else [[]]
        per_output = []
        for k, (meta, placements) in enumerate(zip(b.out_global, b.out_placements)):
            if meta is None:
                per_output.append([])
            elif k < len(alias) and alias[k]:
                per_output.append([key for out in first for key in out])
            else:
                shape = meta.shape if placements is None else local_shape(meta.shape, placements, binding.mesh_shape,
                                                                          binding.coord)
                itemsize = torch.empty((), dtype=meta.dtype).element_size()
                per_output.append([(f"{name}#{k}", math.prod(shape) * itemsize)])
        outputs[name] = per_output
    return {name: [key for out in outs for key in out] for name, outs in outputs.items()}


def _copy_bytes(binding: Any, edge: Any) -> int:
    """Bytes of the storage an edge's redistributed copy holds: its last step's output, this
    rank's shard of the tensor in the edge's target placement (0: a local slice along the
    first dim, a view of its input)."""
    last = edge.steps[-1]
    if last.collective == "local_slice" and not last.split_factor and last.tensor_dim == 0:
        return 0
    meta = edge.source.meta["val"]
    shape = local_shape(tuple(edge.global_shape), tuple(last.dst), binding.mesh_shape, binding.coord)
    return math.prod(shape) * meta.dtype.itemsize


def program_copies(binding: Any) -> tuple[list[HeldCopy], dict[str, list[tuple[str, int]]]]:
    """The redistributed copies the runner holds (``copies``, ``remade`` of
    ``autoshard.program.live_bytes.live_bytes_timeline``): a scheduled edge's from its wait (a gather
    bucket member's from the bucket's unpack), any other edge's at its reader, each to its last reader
    (an earlier reader's copy that later readers reuse, to the last of them; a sink's to the end); a
    gradient bucket's flat buffer from its unpack to the end; a recomputed op's redistributed inputs again
    at its recomputation. Each copy holds its last step's output (``_copy_bytes``), as the
    runtime's steps make it for shards that divide evenly.
    ``binding``: an ``autoshard.runtime.binding.PlanBinding``.

    >>> # copies, remade = program_copies(runner.binding)
    """
    made_by = {x.edge.key: key for key, x in binding.scheduled.items() if x.edge is not None}
    made_by.update((m.key, key) for key, x in binding.scheduled.items() for m in x.members)
    readers: dict[tuple, list[str]] = {}
    for b in binding.ops:
        for e in b.edges:
            if e.steps:
                readers.setdefault(e.reuses or e.key, []).append(e.key[1])
    copies, remade = [], {}
    for b in binding.ops:
        for e in b.edges:
            if e.steps:
                remade.setdefault(b.node.name, []).append((f"again:{e.key}", _copy_bytes(binding, e)))
            if e.steps and e.reuses is None:
                copies.append(HeldCopy(f"copy:{e.key}", _copy_bytes(binding, e), tuple(readers[e.key]),
                                       made_by.get(e.key)))
    sinks = [binding.loss_edge, *binding.grad_edges.values(), *binding.buffer_edges.values()]
    copies += [HeldCopy(f"copy:{e.key}", _copy_bytes(binding, e), (), made_by[e.key])
               for e in sinks if e.key in made_by]  # the others are redistributed after the step's last action
    for key, x in binding.scheduled.items():
        if x.bucket is not None:
            bucket, fqns = binding.buckets[x.bucket]
            edges = [binding.grad_edges[f] for f in fqns]
            if bucket.collective == "all_reduce":  # one flat buffer, reduced in place: the members view it
                nbytes = sum(math.prod(local_shape(tuple(e.global_shape), tuple(e.steps[0].src),
                                                   binding.mesh_shape, binding.coord))
                             * e.source.meta["val"].dtype.itemsize for e in edges)
                copies.append(HeldCopy(f"bucket:{x.bucket}", nbytes, (), key))
            else:
                copies += [HeldCopy(f"bucket:{x.bucket}:{e.key}", _copy_bytes(binding, e), (), key) for e in edges]
    return copies, remade

