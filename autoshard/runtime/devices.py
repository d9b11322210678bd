"""Where a rank's tensors live: the mesh's device, and graph arguments put there.

A plan names no device (docs/design.md, "Devices"): its graph is traced for a device
*type* (``autoshard.trace.device``), so a CUDA graph's factory ops say
``device=cuda``. Each rank runs on its own device, ``cuda:LOCAL_RANK`` under
``torchrun`` (``init_device_mesh("cuda", ...)`` makes it the current device;
several ranks sharing one GPU all say ``cuda:0``), so the runtime puts every
device argument on that device (:func:`on_device`) and makes every tensor of
its own there (the loss tangent, the tensor constants, the random state).

>>> on_device(((2, 3), {"device": torch.device("cuda"), "dtype": torch.float32}), torch.device("cpu"))
((2, 3), {'device': device(type='cpu'), 'dtype': torch.float32})
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.trace.device import replace_devices

__all__ = ["mesh_device", "on_device"]


def mesh_device(mesh: Any) -> torch.device:
    """This rank's device on ``mesh``: the current CUDA device on a CUDA mesh
    (what ``init_device_mesh`` set from ``LOCAL_RANK``), else the mesh's device type.

    >>> class CpuMesh: device_type = "cpu"
    >>> mesh_device(CpuMesh())
    device(type='cpu')
    """
    kind = getattr(mesh, "device_type", "cpu")
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)


def on_device(obj: Any, device: torch.device) -> Any:
    """``obj`` (nested tuples, lists and dicts of arguments) with every
    ``torch.device`` replaced by ``device``; everything else as it is."""
    return replace_devices(obj, device)
