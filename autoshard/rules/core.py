"""Vocabulary of sharding rules: tensor metadata, single-dim strategies, N-D
strategies and compute descriptions.

A *single-dim strategy* says, for ONE mesh dim, which placement every tensor
output gets for given placements of the tensor inputs. In a rule, ``S(d)`` is a
shard *placeholder* (``S(*)``, docs/design.md, "Notation"): the expansion fills it with ``S(d)``
and with every strided shard ``_S(d,sf=k)`` asked for, the same kind in every
position of one strategy. Literal :class:`~costmodel.placements.Shard` /
:class:`~costmodel.placements.StridedShard` entries (view rules) are kept as
written.

>>> import torch
>>> mm_row = SingleDimStrategy((S(0),), (S(0), R))      # rows of A -> rows of C
>>> str(mm_row)
'S*(0) <- S*(0), R'
>>> TensorMeta((4, 8), torch.float32).nbytes
128
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

import torch

from costmodel.placements import Partial, Placement, Replicate, Shard, StridedShard

__all__ = [
    "TensorMeta",
    "to_meta",
    "ShardPlaceholder",
    "RulePlacement",
    "S",
    "R",
    "P",
    "P_AVG",
    "P_MAX",
    "P_MIN",
    "SingleDimStrategy",
    "OpStrategy",
    "OpCompute",
    "COMPUTE_KINDS",
    "OpCall",
]


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape and dtype of one tensor argument (global or local).

    >>> TensorMeta((2, 3), torch.bfloat16).numel
    6
    """

    shape: tuple[int, ...]
    """Size of every tensor dim."""
    dtype: torch.dtype
    """Element type."""

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple):
            object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorMeta":
        """Metadata of a real, fake or meta tensor."""
        return cls(tuple(int(s) for s in tensor.shape), tensor.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def __str__(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


def to_meta(obj: Any) -> Any:
    """Replace every tensor in a nested args structure by its :class:`TensorMeta`
    (lists and tuples are walked, other values kept).

    >>> to_meta((torch.zeros(2, 3), 1, [torch.ones(4)]))
    (TensorMeta(shape=(2, 3), dtype=torch.float32), 1, [TensorMeta(shape=(4,), dtype=torch.float32)])
    """
    if isinstance(obj, torch.Tensor):
        return TensorMeta.of(obj)
    if isinstance(obj, tuple):
        return tuple(to_meta(o) for o in obj)
    if isinstance(obj, list):
        return [to_meta(o) for o in obj]
    if isinstance(obj, dict):
        return {k: to_meta(v) for k, v in obj.items()}
    return obj


@dataclass(frozen=True, slots=True)
class ShardPlaceholder:
    """``S(*)`` on tensor dim ``dim``: filled with ``S(dim)`` or ``_S(dim,sf=k)``."""

    dim: int

    def __str__(self) -> str:
        return f"S*({self.dim})"


RulePlacement = Union[Replicate, Partial, Shard, StridedShard, ShardPlaceholder]
"""What a single-dim strategy may hold per tensor (None: no tensor there)."""


def S(dim: int) -> ShardPlaceholder:
    """Shard placeholder on tensor dim ``dim`` (the notation of rules)."""
    return ShardPlaceholder(dim)


R = Replicate()
P = Partial("sum")
P_AVG = Partial("avg")
P_MAX = Partial("max")
P_MIN = Partial("min")


def _fmt(p: RulePlacement | Placement | None) -> str:
    return "-" if p is None else str(p)


@dataclass(frozen=True, slots=True)
class SingleDimStrategy:
    """One way to run an op on ONE mesh dim: output and input placements.

    Positions follow the op's tensors, flattened in argument order (a list of
    tensors counts one position per element; absent optional tensors count
    none). ``None`` marks an output that the op does not produce (masked
    backward outputs) or an input whose data the op never reads.
    """

    outputs: tuple[RulePlacement | None, ...]
    inputs: tuple[RulePlacement | None, ...]

    def __post_init__(self) -> None:
        # Accept one placement where one tensor is meant: rules stay short.
        if not isinstance(self.outputs, tuple):
            object.__setattr__(self, "outputs", (self.outputs,))
        if not isinstance(self.inputs, tuple):
            object.__setattr__(self, "inputs", (self.inputs,))

    def __str__(self) -> str:
        outs = ", ".join(_fmt(p) for p in self.outputs)
        ins = ", ".join(_fmt(p) for p in self.inputs)
        return f"{outs} <- {ins}"


@dataclass(frozen=True, slots=True)
class OpStrategy:
    """One N-D strategy of a node: a placement tuple (one entry per mesh dim)
    for every tensor output and every tensor input.

    ``None`` for an output: the op returns no tensor there. ``None`` for an
    input: the op does not read that input's data (any placement will do).

    >>> str(OpStrategy(((Shard(0), Replicate()),), ((Shard(0), Replicate()), (Replicate(), Replicate()))))
    'S(0)R <- S(0)R, RR'
    """

    output_placements: tuple[tuple[Placement, ...] | None, ...]
    input_placements: tuple[tuple[Placement, ...] | None, ...]
    exchange: tuple[str, int] | None = None
    """None: a local op on each rank's shards (every rule's strategies). Otherwise
    ``(kind, mesh_dim)``: not a local op, the runtime runs it with the exchange
    ``kind`` over the process group of ``mesh_dim`` (``"expert_dispatch"``:
    :mod:`autoshard.runtime.expert_ops`); validation does not run it on shards."""

    def __str__(self) -> str:
        def one(ps: tuple[Placement, ...] | None) -> str:
            return "-" if ps is None else "".join(str(p) for p in ps)

        outs = ", ".join(one(p) for p in self.output_placements)
        ins = ", ".join(one(p) for p in self.input_placements)
        text = f"{outs} <- {ins}"
        return text if self.exchange is None else f"{text} [{self.exchange[0]}@{self.exchange[1]}]"


COMPUTE_KINDS = ("matmul", "elementwise", "reduction", "attention", "attention_backward", "copy", "view")


@dataclass(frozen=True, slots=True)
class OpCompute:
    """What one op costs to run on one rank, for ``costmodel.compute.op_time_s``.

    >>> OpCompute("matmul", flops=2.0 * 64 * 32 * 16, bytes_accessed=4.0 * (64 * 32 + 32 * 16 + 64 * 16)).kind
    'matmul'
    """

    kind: str
    """One of :data:`COMPUTE_KINDS`."""
    flops: float
    """Floating point operations (a multiply-add counts 2)."""
    bytes_accessed: float
    """Bytes read plus bytes written, counting every operand once."""

    def __post_init__(self) -> None:
        if self.kind not in COMPUTE_KINDS:
            raise ValueError(f"OpCompute.kind: {self.kind!r} is not one of {', '.join(COMPUTE_KINDS)}")
        if self.flops < 0 or self.bytes_accessed < 0:
            raise ValueError(f"OpCompute: flops and bytes_accessed must be >= 0, got {self.flops}, {self.bytes_accessed}")


@dataclass(frozen=True, slots=True)
class OpCall:
    """One call of an op, as the rules see it: the arguments with
    :class:`TensorMeta` in place of tensors, and the flattened tensor inputs and
    outputs. For shape-dependent rules (views) the expansion passes local
    shapes in ``inputs``/``outputs`` while ``args`` stay global: such rules read
    shapes from ``inputs``/``outputs`` only.
    """

    op: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta | None, ...]
    bound: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Every schema argument by name (defaults filled in); see :meth:`arg`."""

    def arg(self, name: str, default: Any = None) -> Any:
        """The value of schema argument ``name``, wherever it was passed.

        >>> # for aten._softmax.default(x, dim, half_to_float): call.arg("dim")
        """
        value = self.bound.get(name, default)
        return default if value is None else value

    def tensor_names(self) -> tuple[str, ...]:
        """Schema name of every tensor input, in input order (a ``Tensor[]``
        argument repeats its name once per tensor).

        >>> # native_layer_norm(x, [8], w, None, 1e-5): ("input", "weight")
        """
        names: list[str] = []
        for arg in self.op._schema.arguments:
            value = self.bound.get(arg.name)
            if isinstance(value, TensorMeta):
                names.append(arg.name)
            elif isinstance(value, (list, tuple)):
                names.extend(arg.name for v in value if isinstance(v, TensorMeta))
        return tuple(names)

    def place(self, default: "RulePlacement | None", /, **by_name: "RulePlacement | None") -> tuple["RulePlacement | None", ...]:
        """Input placements by schema name, ``default`` for the others.

        >>> # call.place(R, input=S(0)) -> (S*(0), R, R) for (input, weight, bias)
        """
        return tuple(by_name.get(name, default) for name in self.tensor_names())

    def with_shapes(
        self, inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta | None, ...]
    ) -> "OpCall":
        """The same call with other (local) tensor shapes."""
        return OpCall(self.op, self.args, self.kwargs, inputs, outputs, self.bound)
