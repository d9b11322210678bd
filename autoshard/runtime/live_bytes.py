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
optimizer state (``autoshard.plan.exact_memory``).

>>> import torch
>>> live = LiveBytes()
>>> x = torch.zeros(4)
>>> live.hold(x); live.hold(x[:2]); live.now   # a view: the same storage
16
>>> live.touch([torch.zeros(2)]); live.peak
24
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

__all__ = ["LiveBytes", "TrackedDict"]


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
