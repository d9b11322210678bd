"""What a step does off its device: a dispatch mode that audits every ATen call.

On a GPU, a per-rank step must keep its tensors on the rank's device (a CPU
tensor in a CUDA op is an error at run time, or a silent copy) and must not
make the host wait for the device (``.item()``, ``.cpu()``, ``.tolist()``,
``bool(tensor)``): each such read drains the launch queue, so the GPU idles
while Python catches up. :class:`DeviceAudit` records, while it is active:

* ``off_device``: ops whose tensor outputs are not on the expected device;
* ``wrong_kernel``: ops with a kernel for another device type only
  (``autoshard.trace.device``: a CPU flash attention run on CUDA tensors);
* ``host_syncs``: reads of a device tensor's value on the host
  (``aten._local_scalar_dense``, behind ``.item()``, ``float(t)``,
  ``.tolist()``) and copies from the device to the CPU.

A host read a step cannot avoid (an all-to-all's run-time split sizes,
``autoshard.runtime.expert_dispatch``) is declared with
:func:`declared_host_sync`: every active audit records the declaration in
``declared_syncs`` and takes at most one host sync inside it as the declared
one; any further sync inside is a finding. A test counts the declarations
against what the plan says a step reads (on fake tensors the read itself is
replaced: fake tensors hold no values).

It works on real tensors and on fake ones: the tests run a CUDA step on a
CPU-only machine under ``FakeTensorMode`` with CUDA fake tensors, and
``benchmarks/gpu_check.py`` audits a real step on a GPU.

>>> with DeviceAudit(torch.device("cpu")) as audit:
...     _ = torch.ones(2).sum().item()
>>> audit.host_syncs
[]
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autoshard.trace.device import CPU_ONLY_OPS, CUDA_ONLY_OPS

__all__ = ["DeviceAudit", "declared_host_sync"]

aten = torch.ops.aten
_COPIES = (aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default)


class DeviceAudit(TorchDispatchMode):
    """Record the off-device work of the ops run inside it (module docstring)."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.off_device: list[str] = []
        self.wrong_kernel: list[str] = []
        self.host_syncs: list[str] = []
        self.declared_syncs: list[str] = []

    def __enter__(self) -> "DeviceAudit":
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)
        super().__exit__(*exc)

    @property
    def problems(self) -> list[str]:
        """Every finding, one line each."""
        return ([f"off device: {x}" for x in self.off_device] + [f"wrong kernel: {x}" for x in self.wrong_kernel]
                + [f"host sync: {x}" for x in self.host_syncs])

    def _on_device(self, t: torch.Tensor) -> bool:
        if t.device.type != self.device.type:
            return False
        return self.device.index is None or t.device.index in (None, self.device.index)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on_gpu = self.device.type != "cpu"
        if on_gpu and func is aten._local_scalar_dense.default and inputs and self._on_device(inputs[0]):
            self.host_syncs.append(f"{func} (.item(), float(), .tolist() or bool() of a {self.device.type} tensor)")
        only_cpu, only_cuda = func in CPU_ONLY_OPS, func in CUDA_ONLY_OPS
        if (only_cpu and self.device.type != "cpu") or (only_cuda and self.device.type != "cuda"):
            self.wrong_kernel.append(str(func))
        out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if on_gpu and func in _COPIES and any(self._on_device(t) for t in inputs) and any(
                t.device.type == "cpu" for t in outputs):
            self.host_syncs.append(f"{func} to the CPU")
        elif func is not aten._local_scalar_dense.default:
            away = [str(t.device) for t in outputs if not self._on_device(t)]
            if away:
                self.off_device.append(f"{func} made a tensor on {away[0]}")
        return out


_ACTIVE: list[DeviceAudit] = []
"""The audits entered and not yet left (what :func:`declared_host_sync` reports to)."""


@contextmanager
def declared_host_sync(reason: str) -> Iterator[None]:
    """Declare the one host read inside as the caller's (module docstring); a no-op without an audit.

    >>> with DeviceAudit(torch.device("cpu")) as audit, declared_host_sync("split sizes"):
    ...     _ = torch.ones(2).tolist()
    >>> audit.declared_syncs
    ['split sizes']
    """
    marks = [(audit, len(audit.host_syncs)) for audit in _ACTIVE]
    try:
        yield
    finally:
        for audit, mark in marks:
            audit.declared_syncs.append(reason)
            del audit.host_syncs[mark:mark + 1]  # the declared read; any after it stays a finding
