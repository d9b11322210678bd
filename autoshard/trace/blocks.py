"""A model's repeated blocks: the one place that says which submodules are its
layers (transformer blocks), read from the module tree, not from the graph.

The rule: a model's blocks are the children of its block containers
(``nn.ModuleList``, ``nn.Sequential``, ``nn.ModuleDict``) that hold
parameters; :func:`containers` walks the tree once and lists every such
container with its children. Two views read that walk:

- :func:`repeated_blocks`, every block of the model, for recomputation regions
  (``TracedGraph.blocks``) and pipeline stage cuts: the parameter-holding
  children of each ``ModuleList`` / ``Sequential`` (the root included) that has
  at least two, outermost containers only (a block's own lists are inside the
  block), in model order. The blocks need not be alike.
- :func:`find_stack`, the one stack a trace may stamp
  (:mod:`autoshard.trace.stamp`): the largest (by parameters) non-root
  container, ``ModuleDict`` included, of at least ``min_blocks`` children that
  all hold parameters and are interchangeable (:func:`block_signature`: the
  same classes, shapes and attributes, a block's own index aside).

The difference between the two, said once: ``repeated_blocks`` takes any two or
more parameter-holding children of the outermost lists (``ModuleDict`` not
counted, the root counted); ``find_stack`` asks for a non-root stack of
interchangeable blocks, nested or not, and keeps the largest.

Tensor parallelism inside the blocks reads the same tree: :func:`column_then_row` says whether
a column / row split of the blocks' linears is Megatron's pairing (the one torch's styles run),
and :func:`megatron_split` finds that pairing from the linears' shapes, whatever they are named;
:func:`vocab_split` says which embedding and output head are split over the vocabulary beside them.

>>> from examples.models import llama3
>>> model = llama3.tiny(device="meta", n_layers=8)[0]
>>> repeated_blocks(model)[:2], find_stack(model, min_blocks=8).path
(('layers.0', 'layers.1'), 'layers')
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Container", "Stack", "containers", "repeated_blocks", "find_stack", "block_signature", "modules_around",
           "block_linears", "column_then_row", "megatron_split", "megatron_table", "vocab_split",
           "HEAD_DIM_ATTR"]

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


@dataclass(frozen=True, slots=True)
class Container:
    """One block container of a model: its path (``""``: the root) and its children, in order."""

    path: str
    module: nn.Module
    children: tuple[tuple[str, nn.Module], ...]

    def holders(self) -> tuple[tuple[str, nn.Module], ...]:
        """The children that hold parameters (the blocks)."""
        return tuple((key, m) for key, m in self.children if _holds_parameters(m))

    def block_path(self, key: str) -> str:
        """Module path of child ``key``."""
        return f"{self.path}.{key}" if self.path else key


@dataclass(frozen=True, slots=True)
class Stack:
    """A container of interchangeable blocks at ``path`` (its children ``keys``, in order)."""

    path: str
    keys: tuple[str, ...]

    def prefix(self, index: int) -> str:
        """Module path of block ``index``."""
        return f"{self.path}.{self.keys[index]}"


def containers(model: nn.Module) -> Iterator[Container]:
    """Every ``ModuleList`` / ``Sequential`` / ``ModuleDict`` of ``model`` (the root
    included), in ``named_modules`` order.

    >>> from examples.models import mlp
    >>> [c.path for c in containers(mlp.tiny(device="meta")[0])]
    ['layers']
    """
    for path, module in model.named_modules():
        if isinstance(module, _CONTAINERS):
            yield Container(path, module, tuple(module.named_children()))


def repeated_blocks(model: nn.Module) -> tuple[str, ...]:
    """Paths of the model's repeated blocks (the module docstring's first view):
    transformer layers (``layers.0``, ``model.layers.0``) are blocks; a model
    without such a list has none.

    >>> from examples.models import llama3
    >>> repeated_blocks(llama3.tiny(device="meta")[0])
    ('layers.0', 'layers.1')
    """
    blocks: list[str] = []
    for container in containers(model):
        if isinstance(container.module, nn.ModuleDict):
            continue
        if any(container.path == b or container.path.startswith(b + ".") for b in blocks):
            continue
        holders = container.holders()
        if len(holders) >= 2:
            blocks.extend(container.block_path(key) for key, _ in holders)
    return tuple(blocks)


def find_stack(model: nn.Module, min_blocks: int) -> Stack | None:
    """The largest non-root container of at least ``min_blocks`` interchangeable
    children (the module docstring's second view), or None.

    >>> from examples.models import llama3
    >>> find_stack(llama3.tiny(device="meta", n_layers=4)[0], min_blocks=4).keys
    ('0', '1', '2', '3')
    """
    best: tuple[int, Stack] | None = None
    for container in containers(model):
        children = container.children
        if not container.path or len(children) < min_blocks or len(container.holders()) != len(children):
            continue
        first = block_signature(children[0][1])
        if first is None or not all(_same_but_index(first, block_signature(m), i)
                                    for i, (_, m) in enumerate(children[1:], start=1)):
            continue
        size = sum(p.numel() for p in container.module.parameters())
        if best is None or size > best[0]:
            best = (size, Stack(container.path, tuple(key for key, _ in children)))
    return None if best is None else best[1]


def modules_around(model: nn.Module, blocks: tuple[str, ...] | list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(leading, trailing): the modules holding parameters before and after the container of
    ``blocks`` (paths of its children), in registration order, each the outermost such module
    beside the container's path (what a pipeline puts on the first and last stage).

    >>> model = nn.Sequential(nn.Embedding(4, 2), nn.ModuleList([nn.Linear(2, 2)] * 2), nn.Linear(2, 4))
    >>> modules_around(model, ("1.0", "1.1"))
    (('0',), ('2',))
    """
    container = blocks[0].rpartition(".")[0]
    leading: list[str] = []
    trailing: list[str] = []
    seen = [False]

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if path == container:
                seen[0] = True
            elif container.startswith(path + "."):
                walk(child, path + ".")
            elif _holds_parameters(child):
                (trailing if seen[0] else leading).append(path)

    walk(model, "")
    return tuple(leading), tuple(trailing)


def _holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


_TORCH_STATE = frozenset({"_parameters", "_buffers", "_modules", "training", "_non_persistent_buffers_set"})


def _same_but_index(first: tuple[Any, ...], other: tuple[Any, ...] | None, index: int) -> bool:
    """Whether block ``index``'s signature is block 0's but for ints equal to the block's index."""
    if other is None or len(other) != len(first):
        return False
    return all(a == b or (len(a) == 2 and a[0] == b[0] and type(a[1]) is int and type(b[1]) is int
                          and a[1] == 0 and b[1] == index)
               for a, b in zip(first, other))


def block_signature(block: nn.Module) -> tuple[Any, ...] | None:
    """What a block's trace depends on: module classes, parameter shapes, and plain
    attributes (one config object shared by the blocks compares by identity). None
    when the block cannot be stamped (hooks, buffers, tensor attributes).

    >>> block_signature(nn.Linear(2, 3))[:2]
    (('', <class 'torch.nn.modules.linear.Linear'>), ('weight', (3, 2), torch.float32, True))
    """
    out: list[Any] = []
    for path, module in block.named_modules():
        if module._buffers or _has_hooks(module):
            return None
        out.append((path, type(module)))
        for name, p in module.named_parameters(recurse=False):
            out.append((name, tuple(p.shape), p.dtype, p.requires_grad))
        for key, value in sorted(vars(module).items()):
            if key in _TORCH_STATE or key.startswith("_forward") or key.startswith("_backward") \
                    or key.startswith("_state_dict") or key.startswith("_load_state_dict"):
                continue
            plain = _plain(value)
            if plain is _UNCOMPARABLE:
                return None
            out.append((key, plain))
    return tuple(out)


_UNCOMPARABLE = object()


def _plain(value: Any) -> Any:
    """``value`` as a comparable key (objects by identity: one config shared by all blocks)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        items = tuple(_plain(v) for v in value)
        return _UNCOMPARABLE if any(v is _UNCOMPARABLE for v in items) else (type(value), items)
    if isinstance(value, torch.Tensor):
        return _UNCOMPARABLE  # a tensor attribute becomes a constant of the graph
    if isinstance(value, nn.Module) and not any(True for _ in value.parameters()) \
            and not any(True for _ in value.buffers()) and not _has_hooks(value):
        # a stateless module held outside ``_modules`` (the ``kernels`` package's per-block ``Func``
        # wrappers of one function): what it computes is its class
        return ("module", type(value))
    if type(value) is dict:  # a per-block dict of shared objects (transformers' ``_kernel_funcs``) by content
        items = tuple((_plain(k), _plain(v)) for k, v in value.items())
        return _UNCOMPARABLE if any(_UNCOMPARABLE in item for item in items) else (dict, items)
    return ("id", id(value))


def _has_hooks(module: nn.Module) -> bool:
    return any(getattr(module, name, None) for name in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def block_linears(model: nn.Module, block_paths: Sequence[str]) -> tuple[str, ...]:
    """Paths of the ``nn.Linear`` modules inside the repeated blocks, in registration order."""
    out = []
    for block in block_paths:
        for name, module in model.get_submodule(block).named_modules():
            if isinstance(module, nn.Linear):
                out.append(f"{block}.{name}")
    return tuple(out)


def column_then_row(model: nn.Module, linears: Sequence[str], styles: Mapping[str, str]) -> bool:
    """Whether each module holding split linears (an attention, a feed-forward) splits by columns
    the projections that read the block's stream and by rows the one projection that writes back
    to it (Megatron's pairing: each column one's input features the row one's output features):
    the only split whose activations torch's column and row styles leave right for the next
    linear (a column-split output projection would take the heads' shard as its whole input). A
    module none of whose linears is split is left out."""
    for paths in _by_parent(linears).values():
        rows = [p for p in paths if styles.get(p) == "rowwise"]
        cols = [p for p in paths if styles.get(p) == "colwise"]
        if not rows and not cols:
            continue
        if len(rows) != 1 or len(cols) != len(paths) - 1:
            return False
        stream = model.get_submodule(rows[0]).out_features
        if any(model.get_submodule(p).in_features != stream for p in cols):
            return False
    return True


def _by_parent(linears: Sequence[str]) -> dict[str, list[str]]:
    """Linear paths grouped by the module holding them (the attention, the feed-forward), in order."""
    parents: dict[str, list[str]] = {}
    for path in linears:
        parents.setdefault(path.rpartition(".")[0], []).append(path)
    return parents


HEAD_DIM_ATTR = "head_dim"
"""Integer attribute of an attention module: the features of one head (Hugging Face's attentions,
the example LLaMA's, torchtitan's): a column split must give each rank whole heads."""


def megatron_split(model: nn.Module, linears: Sequence[str], tp: int = 1) -> tuple[tuple[str, str], ...]:
    """Megatron's column / row split of ``linears`` over ``tp`` ranks, from the module tree alone:
    in each module holding two or more of them, the one that writes back to the block's stream
    (``rowwise``) is the linear whose output features are every other one's input features (the
    last registered such where several are: a square ``q`` beside a square ``o``; modules register
    their output projection last, as torch's ``MultiheadAttention``, Hugging Face's ``o_proj`` /
    ``down_proj`` and torchtitan's ``wo``), and the others read the stream (``colwise``). So Hugging
    Face's grouped-query ``q/k/v`` (their output features differ) pair as the example LLaMA's do.

    A module is left out (its linears replicated; :func:`column_then_row` allows that) where no
    linear pairs so, or where a column split over ``tp`` would not give each rank whole heads (its
    :data:`HEAD_DIM_ATTR` times ``tp`` not dividing a column linear's output features: a
    grouped-query K/V of fewer heads than ``tp``), or ``tp`` would not divide every split dim.

    >>> block = nn.Module()
    >>> block.mlp = nn.Module()
    >>> block.mlp.up, block.mlp.gate, block.mlp.down = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 4)
    >>> megatron_split(block, ["mlp.up", "mlp.gate", "mlp.down"], tp=2)
    (('mlp.up', 'colwise'), ('mlp.gate', 'colwise'), ('mlp.down', 'rowwise'))
    """
    out: list[tuple[str, str]] = []
    for parent, paths in _by_parent(linears).items():
        if len(paths) < 2:
            continue
        mods = {p: model.get_submodule(p) for p in paths}
        writers = [p for p in paths if all(mods[q].in_features == mods[p].out_features for q in paths if q != p)]
        if not writers:
            continue
        row = writers[-1]
        columns = [p for p in paths if p != row]
        head_dim = getattr(model.get_submodule(parent), HEAD_DIM_ATTR, None)
        unit = tp * (head_dim if type(head_dim) is int and head_dim > 0 else 1)
        if any(mods[p].out_features % unit for p in columns) or mods[row].in_features % tp:
            continue
        out.extend((p, "rowwise" if p == row else "colwise") for p in paths)
    return tuple(out)


def vocab_split(model: nn.Module, block_paths: Sequence[str], tp: int) -> tuple[tuple[str, str], ...]:
    """The modules around the blocks split over the vocabulary on ``tp`` beside Megatron's split of
    the blocks, as torchtitan splits them: ``(path, "embedding")`` for an ``nn.Embedding`` before
    the blocks, ``(path, "head")`` for an ``nn.Linear`` after them (the output head), each where
    ``tp`` divides its vocabulary (``num_embeddings``, ``out_features``); both weights ``S(0)`` on
    ``tp``. A head tied to the embedding (one weight) is left out with it: splitting one module
    would untie them. One rule for the stage solve's pins (:func:`megatron_table`) and the stage
    runtime (``autoshard.runtime.pipeline_tp``), so that the head is priced as it runs.

    >>> model = nn.Sequential(nn.Embedding(8, 4), nn.ModuleList([nn.Linear(4, 4)] * 2), nn.Linear(4, 8))
    >>> vocab_split(model, ("1.0", "1.1"), tp=2), vocab_split(model, ("1.0", "1.1"), tp=3)
    ((('0', 'embedding'), ('2', 'head')), ())
    """
    if tp < 2 or not block_paths:
        return ()
    leading, trailing = modules_around(model, tuple(block_paths))
    out = [(p, "embedding") for p in leading
           if isinstance(m := model.get_submodule(p), nn.Embedding) and m.num_embeddings % tp == 0]
    out += [(p, "head") for p in trailing
            if isinstance(m := model.get_submodule(p), nn.Linear) and m.out_features % tp == 0]
    params = lambda paths: {id(p) for path in paths for p in model.get_submodule(path).parameters()}  # noqa: E731
    shared = params(leading) & params(trailing)
    return tuple((path, kind) for path, kind in out if not shared & params((path,)))


def megatron_table(model: nn.Module, block_paths: Sequence[str], tp: int) -> dict[str, str]:
    """:func:`megatron_split` of the first block's linears as name patterns over every block, in the
    form of ``autoshard.search.baselines``' tensor-parallel tables (``col``: weight and bias split on
    their output features; ``row``: the weight on its input features, its bias replicated): what a
    stage solve pins on ``tp`` so that it prices the split the stage runtime runs. The embedding
    and the head of :func:`vocab_split` are ``col`` (their weights ``S(0)``: the vocabulary split);
    every other parameter (norms, an embedding or head ``tp`` does not divide) is in no row:
    replicated on ``tp``, as the runtime leaves it. Empty where the blocks' linears have no such split.

    >>> block = nn.Module()
    >>> block.mlp = nn.Module()
    >>> block.mlp.up, block.mlp.down = nn.Linear(4, 8), nn.Linear(8, 4)
    >>> model = nn.Module()
    >>> model.layers = nn.ModuleList([block])
    >>> megatron_table(model, ["layers.0"], tp=2)
    {'layers.*.mlp.up.weight': 'col', 'layers.*.mlp.up.bias': 'col', 'layers.*.mlp.down.weight': 'row'}
    """
    first = block_paths[0]
    container = first.rpartition(".")[0]
    stem = f"{container}.*." if container else "*."
    table: dict[str, str] = {}
    for path, style in megatron_split(model, block_linears(model, [first]), tp):
        rel = path[len(first) + 1:]
        linear = model.get_submodule(path)
        table[f"{stem}{rel}.weight"] = "col" if style == "colwise" else "row"
        if style == "colwise" and linear.bias is not None:
            table[f"{stem}{rel}.bias"] = "col"
    if table:
        for path, kind in vocab_split(model, block_paths, tp):
            table[f"{path}.weight"] = "col"
            if kind == "head" and model.get_submodule(path).bias is not None:
                table[f"{path}.bias"] = "col"
    return table
