"""An op's localized arguments kept as a template, with slots for its input tensors.

The first step of the runtime builds every op's local arguments (binding the
call, the rule's ``localize`` making shape arguments local); they are the same
at every step, so they are kept with the op's input tensors swapped for
:class:`Slot` s, and later interpreted steps only put the new tensors in.

>>> t = CallTemplate.make((1, [2]), {}, [])
>>> t.fill([])
((1, [2]), {})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

__all__ = ["Slot", "fill_slots", "CallTemplate"]


class Slot:
    """Where tensor input ``i`` of an op goes in its argument template."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def fill_slots(obj: Any, values: Sequence[Any]) -> Any:
    kind = type(obj)
    if kind is Slot:
        return values[obj.i]
    if kind is tuple:
        return tuple(fill_slots(x, values) for x in obj)
    if kind is list:
        return [fill_slots(x, values) for x in obj]
    return obj


@dataclass(slots=True)
class CallTemplate:
    """An op's final (localized) args and kwargs with its tensor inputs as slots.

    Everything but the tensors is the same at every step (shapes are static per
    rank), so the first run's arguments are kept with the input tensors swapped
    for slots, and later runs only put the new tensors in: the per-op Python
    work of binding, localizing and rebuilding arguments is paid once.
    """

    args: list[Any]
    kwargs: dict[str, Any]
    arg_slots: tuple[int, ...]
    """Positions of ``args`` that hold a slot somewhere inside."""
    kwarg_slots: tuple[str, ...]

    @classmethod
    def make(cls, args: tuple, kwargs: Mapping[str, Any], inputs: Sequence[torch.Tensor]) -> "CallTemplate | None":
        ids = {id(t): i for i, t in enumerate(inputs)}
        found = False

        def templ(obj: Any) -> Any:
            nonlocal found
            if isinstance(obj, torch.Tensor):
                i = ids.get(id(obj))
                if i is None:
                    raise LookupError
                found = True
                return Slot(i)
            if isinstance(obj, (tuple, list)):
                return type(obj)(templ(x) for x in obj)
            return obj

        try:
            targs, arg_slots = [], []
            for k, a in enumerate(args):
                found = False
                targs.append(templ(a))
                if found:
                    arg_slots.append(k)
            tkwargs, kw_slots = {}, []
            for name, v in kwargs.items():
                found = False
                tkwargs[name] = templ(v)
                if found:
                    kw_slots.append(name)
        except LookupError:  # a tensor that is not an input (made by localize): no template
            return None
        return cls(targs, tkwargs, tuple(arg_slots), tuple(kw_slots))

    def fill(self, values: Sequence[Any]) -> tuple[tuple, dict]:
        args = list(self.args)
        for k in self.arg_slots:
            args[k] = fill_slots(args[k], values)
        kwargs = dict(self.kwargs)
        for name in self.kwarg_slots:
            kwargs[name] = fill_slots(kwargs[name], values)
        return tuple(args), kwargs
