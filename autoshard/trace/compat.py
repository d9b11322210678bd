"""What real model libraries need from a trace: the "being traced" signal and readable errors.

Libraries such as Hugging Face ``transformers`` read tensor values in Python
(``if (mask == 1).all(): mask = None``) unless they detect a tracer, and they
detect one through ``torch.compiler.is_compiling()``. ``torch.export`` in
non-strict mode, which traces Python on fake tensors as :mod:`autoshard.trace`
does, sets that flag for the duration of the trace; :func:`library_tracing`
does the same, and only that (not ``is_exporting()``: the joint graph has
static shapes, so shape-derived shortcuts such as SDPA's ``is_causal`` stay
valid). The flag is restored on exit, also on error.

A tensor the forward reads that is neither a parameter, a buffer nor an
input (a plain attribute, a global) becomes a constant of the graph when it
has values; one on the meta device cannot, and :func:`meta_attribute_error`
names the model's line that reads it.

A model that still reads tensor values fails on fake tensors with an
exception naming only the ATen op; :func:`data_dependent_error` turns it into
one line naming the op, the model's source line that called it, and the way
out.

Every private torch API used here (``torch.compiler._is_compiling_flag``, the
fake-tensor exceptions, ``torch.fx.traceback.annotate``) is read in this module only.

:func:`module_annotations` labels every node of the trace with the module
that made it (``layers.3.attention.wq``): the joint export keeps no module
path on forward nodes, and the recomputation regions
(``autoshard.graph.regions``) are the model's repeated blocks.

>>> import torch
>>> with library_tracing():
...     torch.compiler.is_compiling()
True
>>> torch.compiler.is_compiling()
False
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import torch.compiler
from torch._subclasses import fake_tensor as _fake_tensor
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

__all__ = ["TraceError", "DataDependentError", "library_tracing", "data_dependent_error", "meta_attribute_error",
           "module_annotations", "MODULE_KEY", "node_module", "has_no_values"]

MODULE_KEY = "autoshard_module"
"""Key of the module path in a node's ``meta["custom"]`` (:func:`module_annotations`)."""

# torch 2.11 and older raise a plain RuntimeError for a fake-tensor device mismatch;
# newer ones a subclass of it: matching RuntimeError's message works on both
FakeTensorDeviceMismatchError: type[BaseException] = getattr(_fake_tensor, "FakeTensorDeviceMismatchError", RuntimeError)

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_AUTOSHARD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the autoshard package


class TraceError(ValueError):
    """A model that cannot be traced as given; the message is one line saying why and what to do."""


class DataDependentError(TraceError):
    """The model reads tensor values (``.item()``, ``if tensor:``) or makes value-dependent shapes."""


@contextlib.contextmanager
def library_tracing() -> Iterator[None]:
    """Make ``torch.compiler.is_compiling()`` true while the block runs, as ``torch.export`` does.

    >>> with library_tracing():
    ...     pass
    """
    previous = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = previous


@contextlib.contextmanager
def module_annotations(model: torch.nn.Module) -> Iterator[None]:
    """While the block runs, every traced node made inside a submodule's
    ``forward`` carries that module's path (the innermost one) in
    ``meta["custom"]`` (:func:`node_module`); autograd copies it onto the
    node's backward ops. The hooks are removed on exit, also on error. Without
    ``torch.fx.traceback.annotate`` (older or newer torch) nothing is labelled.

    >>> with module_annotations(torch.nn.Linear(2, 2)):
    ...     pass
    """
    annotate = getattr(getattr(torch.fx, "traceback", None), "annotate", None)
    if annotate is None:
        yield
        return
    opened: list[tuple[int, Any]] = []  # (module id, context), innermost last: forwards nest
    handles = []

    def enter(name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            context = annotate({MODULE_KEY: name})
            context.__enter__()
            opened.append((id(module), context))
        return hook

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        if opened and opened[-1][0] == id(module):
            opened.pop()[1].__exit__(None, None, None)

    try:
        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_pre_hook(enter(name)))
                handles.append(module.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        while opened:  # a forward that raised: close what it opened, innermost first
            opened.pop()[1].__exit__(None, None, None)


def node_module(node: Any) -> str | None:
    """The module path :func:`module_annotations` put on an fx node (None: none)."""
    custom = node.meta.get("custom")
    return custom.get(MODULE_KEY) if isinstance(custom, dict) else None


def has_no_values(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds shapes only: a meta or fake tensor (a trace's constant made from one).

    >>> has_no_values(torch.ones(2)), has_no_values(torch.ones(2, device="meta"))
    (False, True)
    """
    return tensor.is_meta or isinstance(tensor, _fake_tensor.FakeTensor)


def data_dependent_error(exc: BaseException) -> DataDependentError | None:
    """A one-line :class:`DataDependentError` for a data-dependent failure in ``exc``'s chain, else ``None``.

    >>> data_dependent_error(RuntimeError("unrelated")) is None
    True
    """
    for cause in _chain(exc):
        if isinstance(cause, DataDependentOutputException):
            what = f"{cause.func} reads a tensor's value in Python (.item(), bool(), int(), `if tensor`)"
        elif isinstance(cause, DynamicOutputShapeException):
            what = f"{cause.func} has an output shape that depends on tensor values"
        elif isinstance(cause, GuardOnDataDependentSymNode):
            what = "a branch depends on a tensor's value"
        else:
            continue
        where = _user_line(cause)
        if where.startswith("transformers" + os.sep):
            way_out = ("pass an explicit attention_mask or position_ids, or pick another "
                       "attn_implementation / experts_implementation")
        else:
            way_out = ("compute it from shapes only (torch.where instead of `if`, "
                       "a fixed-capacity dispatch instead of nonzero)")
        return DataDependentError(
            f"{what}, at {where}; a traced graph has fixed shapes and no branch on tensor values: {way_out}"
        )
    return None


def meta_attribute_error(exc: BaseException) -> TraceError | None:
    """A one-line :class:`TraceError` when ``exc`` comes from a ``meta`` tensor that the
    forward reads but that is neither a parameter nor a buffer (a plain attribute,
    ``self.scale = torch.ones(8)`` on a model built on meta: its values are unknown,
    so it cannot become a constant of the graph), else ``None``.

    >>> meta_attribute_error(RuntimeError("unrelated")) is None
    True
    """
    for cause in _chain(exc):
        if isinstance(cause, FakeTensorDeviceMismatchError) and "meta" in str(cause) and "device" in str(cause):
            return TraceError(
                f"a tensor on the meta device that is neither a parameter nor a buffer is read at "
                f"{_user_line(cause)}: register it as a buffer (module.register_buffer) or build the model on "
                "a real device, so that its values can become a constant of the graph"
            )
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, innermost last."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _user_line(exc: BaseException) -> str:
    """``file:line (function): source`` of the innermost frame outside torch and autoshard."""
    frames = [
        frame for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith((_TORCH_DIR, _AUTOSHARD_DIR))
    ]
    if not frames:
        return "an unknown line (no model frame in the traceback)"
    frame = frames[-1]
    source = f": {frame.line.strip()}" if frame.line else ""
    return f"{_short_path(frame.filename)}:{frame.lineno} ({frame.name}){source}"


def _short_path(path: str) -> str:
    """``transformers/masking_utils.py`` for an installed package, else the path relative to the cwd."""
    marker = os.sep + "site-packages" + os.sep
    if marker in path:
        return path.rsplit(marker, 1)[1]
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if relative.startswith("..") else relative
