"""ATen calls traced from PyTorch's OpInfo samples, for the rule validator.

PyTorch's OpInfo database (``torch.testing._internal.common_methods_invocations.op_db``)
lists some 700 public operators with their supported dtypes and generators
of valid inputs, edge cases included (0-D tensors, empty dims, broadcasting,
integer and bool dtypes). A public operator reaches the rules as the ATen
calls it dispatches to, so each OpInfo sample is run once under a recording
``TorchDispatchMode`` (below autograd, after composite decompositions, as the
joint trace sees them), forward and, where the dtype has a backward, the
backward of its tensor outputs with seeded random gradients:

1. every ATen call is recorded with its real arguments, cloned *before* it
   runs (in-place calls mutate them) and its output metadata;
2. an in-place call (``masked_fill_``, ``copy_``) is recorded as its
   functional form (``masked_fill``, ``copy``) with the same arguments, which
   is what a functionalized graph holds; ``out=`` calls and calls with a
   sparse operand are dropped (the rules are for dense strided tensors);
3. calls are kept once per distinct (op, argument metadata, output metadata),
   the first sample's values standing for the others, with the OpInfo names
   that made them.

Sample generation is seeded per (OpInfo, dtype), so the calls are the same
on every run; the default dtype and thread count are restored afterwards.

The OpInfo database imports ``expecttest`` (a test-only package):
:func:`load_op_db` raises :class:`OpInfoUnavailable` with the fix when it is
missing.

>>> infos = [i for i in load_op_db() if i.name == "addmm" and not i.variant_test_name]  # doctest: +SKIP
>>> calls = traced_calls(infos, dtypes=[torch.float32], max_samples=1)                   # doctest: +SKIP
>>> [str(c.op) for c in calls]                                                            # doctest: +SKIP
['aten.addmm.default', 'aten.t.default', 'aten.mm.default', 'aten.mul.Scalar']
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.rules.calls import flatten_results
from autoshard.rules.core import TensorMeta, to_meta
from autoshard.rules.registry import SampleInput, _freeze, op_name

__all__ = [
    "OpInfoUnavailable",
    "TracedCall",
    "TraceNotes",
    "load_op_db",
    "select_infos",
    "info_name",
    "info_dtypes",
    "traced_calls",
]

aten = torch.ops.aten


class OpInfoUnavailable(RuntimeError):
    """PyTorch's OpInfo database cannot be imported here."""


@dataclass(slots=True)
class TracedCall:
    """One distinct ATen call met while running OpInfo samples."""

    op: OpOverload
    sample: SampleInput
    """The real arguments the call received (cloned before it ran)."""
    outputs: tuple[TensorMeta | None, ...]
    sources: list[str] = field(default_factory=list)
    """``opinfo-name dtype`` of every sample that made this call (``+bw``: in its backward)."""

    def __str__(self) -> str:
        def one(o: Any) -> str:
            if isinstance(o, (list, tuple)):
                return "[" + ", ".join(one(x) for x in o) + "]"
            return str(o) if isinstance(o, TensorMeta) else repr(o)

        meta_args, meta_kwargs = to_meta(self.sample.args), to_meta(self.sample.kwargs)
        parts = [one(a) for a in meta_args] + [f"{k}={one(v)}" for k, v in meta_kwargs.items()]
        return f"{op_name(self.op)}({', '.join(parts)})"


@dataclass(slots=True)
class TraceNotes:
    """What tracing the OpInfo samples met besides calls."""

    samples: int = 0
    """OpInfo samples run (forward, with their backward where there is one)."""
    failed: list[str] = field(default_factory=list)
    """Samples whose run raised (``name dtype: error``); their calls up to the error are kept."""
    dropped_out_calls: int = 0
    """``out=`` and other mutating calls with no functional form."""
    dropped_sparse_calls: int = 0
    """Calls with a sparse (non-strided) operand."""


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo list; :class:`OpInfoUnavailable` when it cannot be imported."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:  # expecttest is what is usually missing
        raise OpInfoUnavailable(
            f"PyTorch's OpInfo database cannot be imported ({exc}); it needs the test-only package "
            "expecttest: pip install expecttest"
        ) from exc
    return list(op_db)


def info_name(info: Any) -> str:
    """``name`` or ``name.variant`` of an OpInfo."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def select_infos(infos: Sequence[Any], patterns: Sequence[str] = ()) -> list[Any]:
    """OpInfos whose name (or ``name.variant``) equals or glob-matches a
    pattern; all when none given. ``ValueError`` naming a pattern that matches nothing."""
    import fnmatch

    if not patterns:
        return list(infos)
    chosen: list[Any] = []
    for pattern in patterns:
        hits = [i for i in infos if pattern in (i.name, info_name(i)) or fnmatch.fnmatch(info_name(i), pattern)]
        if not hits:
            raise ValueError(f"--ops: no OpInfo is named {pattern!r}")
        chosen.extend(i for i in hits if all(i is not c for c in chosen))
    return chosen


_DTYPE_ORDER = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
)


def info_dtypes(info: Any, only: Iterable[torch.dtype] | None = None) -> list[torch.dtype]:
    """The dtypes the OpInfo supports on CPU (those of ``only`` when given), in a fixed order."""
    supported = set(info.supported_dtypes("cpu"))
    wanted = set(only) if only is not None else supported
    return [d for d in _DTYPE_ORDER if d in supported and d in wanted]


def _functional(op: OpOverload) -> OpOverload | None:
    """The functional form of an in-place op with the same arguments, or None."""
    name = op._schema.name.split("::")[-1]
    if op._overloadname == "out" or not name.endswith("_") or name.startswith("_foreach"):
        return None
    packet = getattr(aten, name[:-1], None)
    overload = getattr(packet, op._overloadname, None) if packet is not None else None
    if overload is None or overload._schema.is_mutable:
        return None
    # overload names are reused with other signatures (pow_.Scalar vs pow.Scalar)
    same = [(a.name, str(a.type)) for a in overload._schema.arguments] == [(a.name, str(a.type)) for a in op._schema.arguments]
    return overload if same else None


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, tuple):
        return tuple(_clone(o) for o in obj)
    if isinstance(obj, list):
        return [_clone(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _outputs_meta(result: Any) -> tuple[TensorMeta | None, ...]:
    return tuple(None if r is None else TensorMeta.of(r) for r in flatten_results(result))


class _Recorder(TorchDispatchMode):
    """Records every ATen call below autograd (module docstring)."""

    def __init__(self, sink: Callable[[OpOverload, SampleInput, tuple[TensorMeta | None, ...]], None], notes: TraceNotes) -> None:
        super().__init__()
        self.sink = sink
        self.notes = notes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        record = isinstance(func, OpOverload) and func.namespace == "aten"
        if record and any(t.layout != torch.strided for t in _tensors((args, kwargs))):
            # sparse / nested operands (sparse.sampled_addmm's backward calls mm on a
            # CSR tensor): the rules are for dense strided tensors, whose metadata
            # the same call would have
            self.notes.dropped_sparse_calls += 1
            record = False
        functional = func
        if record and func._schema.is_mutable:
            functional = _functional(func)
            if functional is None:
                self.notes.dropped_out_calls += 1
                record = False
        snapshot = SampleInput(_clone(tuple(args)), _clone(dict(kwargs))) if record else None
        result = func(*args, **kwargs)
        if record:
            if functional is func:
                outputs = _outputs_meta(result)
            else:  # the functional form returns a new tensor shaped like self
                try:
                    with torch.no_grad():
                        outputs = _outputs_meta(functional(*_clone(snapshot.args), **_clone(snapshot.kwargs)))
                except Exception:  # noqa: BLE001 - not this call's functional form after all
                    self.notes.dropped_out_calls += 1
                    return result
            self.sink(functional, snapshot, outputs)
        return result


def _seed(name: str, dtype: torch.dtype, seed: int) -> int:
    return zlib.crc32(f"{name}:{dtype}:{seed}".encode()) & 0x7FFF_FFFF


def _tensors(obj: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            out.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)

    walk(obj)
    return out


def _run_sample(info: Any, sample: Any, backward: bool, gen: torch.Generator, recorder: _Recorder,
                on_backward: Callable[[], None]) -> None:
    """The OpInfo's op on one sample, then (``backward``) the backward of its
    differentiable outputs; ``on_backward`` is called between the two."""
    with torch.set_grad_enabled(backward), recorder:
        result = info.op(sample.input, *sample.args, **sample.kwargs)
    if not backward:
        return
    on_backward()
    result = sample.output_process_fn_grad(result)
    outs = [t for t in _tensors(result) if t.requires_grad and t.grad_fn is not None]
    ins = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    if not outs or not ins:
        return
    grads = [torch.randn(tuple(o.shape), generator=gen, dtype=torch.float64).to(o.dtype) if not o.is_complex()
             else torch.complex(torch.randn(tuple(o.shape), generator=gen, dtype=torch.float64),
                                torch.randn(tuple(o.shape), generator=gen, dtype=torch.float64)).to(o.dtype)
             for o in outs]
    with recorder:
        torch.autograd.grad(outs, ins, grads, allow_unused=True)


def traced_calls(
    infos: Sequence[Any],
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    max_samples: int = 3,
    backward: bool = True,
    seed: int = 0,
    notes: TraceNotes | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TracedCall]:
    """Distinct ATen calls of the first ``max_samples`` samples of each
    OpInfo in each of its CPU dtypes (only ``dtypes`` when given), forward
    and (``backward``) backward; see the module docstring. ``progress`` is
    called with each OpInfo's name after it is traced."""
    notes = notes if notes is not None else TraceNotes()
    wanted = None if dtypes is None else list(dtypes)
    calls: dict[tuple, TracedCall] = {}
    source = [""]

    def sink(op: OpOverload, sample: SampleInput, outputs: tuple[TensorMeta | None, ...]) -> None:
        key = (op, _freeze(to_meta(sample.args)), _freeze(to_meta(sample.kwargs)), outputs)
        call = calls.get(key)
        if call is None:
            calls[key] = call = TracedCall(op, sample, outputs)
        if source[0] not in call.sources:
            call.sources.append(source[0])

    default_dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead
    try:
        for info in infos:
            name = info_name(info)
            for dtype in info_dtypes(info, wanted):
                grad = backward and info.supports_autograd and dtype in info.supported_backward_dtypes("cpu")
                s = _seed(name, dtype, seed)
                torch.manual_seed(s)
                random.seed(s)
                gen = torch.Generator().manual_seed(s)
                try:
                    samples = info.sample_inputs("cpu", dtype, requires_grad=grad)
                    for index, sample in enumerate(samples):
                        if index >= max_samples:
                            break
                        notes.samples += 1
                        label = f"{name} {str(dtype).removeprefix('torch.')}"
                        source[0] = label
                        _run_sample(info, sample, grad, gen, _Recorder(sink, notes),
                                    lambda label=label: source.__setitem__(0, label + " +bw"))
                except Exception as exc:  # noqa: BLE001 - an OpInfo that fails on CPU is noted, not fatal
                    text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
                    notes.failed.append(f"{name} {dtype}: {type(exc).__name__}: {text}")
                finally:
                    torch.set_default_dtype(default_dtype)
            if progress is not None:
                progress(name)
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(default_dtype)
    return list(calls.values())
