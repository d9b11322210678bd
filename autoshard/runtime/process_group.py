"""Starting and ending a job's process groups so that none outlives the job.

Why this module: a gloo process group runs worker threads that execute its
collectives. A worker drops its reference to a finished collective a moment
after the caller's ``wait()`` has returned, and that drop releases the
collective's tensors, which takes the GIL when they have Python objects. A
group still alive when the interpreter shuts down can therefore see that
drop land after finalization has begun: the worker cannot take the GIL any
more, is made to exit inside a C++ destructor, and ``std::terminate`` aborts
the whole rank (SIGABRT, "terminate called without an active exception"),
after its work was done (4 runs in 10 of a 4-rank ``--tiny`` calibration
on a loaded 2-core machine).

``dist.destroy_process_group`` joins those workers, but only when it drops
the last reference to the group, and two things hold on to groups past it:

* reference cycles: a DeviceMesh and the mesh flattened from it refer to
  each other and hold their groups, so those go only when the cyclic
  garbage collector runs, which may be at teardown;
* ``torch.distributed.nn.functional`` (imported by ``torch._dynamo``, hence
  by autoshard's trace and runtime) binds ``group.WORLD`` as the default of
  ten functions when it is first imported: imported after
  ``init_process_group``, it keeps the default group alive for good.

So :func:`init_process_group` imports ``torch.distributed.nn`` first (its
defaults then hold ``None``, which means "the default group" when called),
and :func:`destroy_process_groups` destroys every group and runs the cyclic
collector, so that each group's workers are joined (the group's destructor
releases the GIL while it waits) while the interpreter is fully alive.

A script that starts its own groups and shards with autoshard ends them
with :func:`destroy_process_groups` instead of ``dist.destroy_process_group``
(``examples/train.py``), and is safe from the second cause when it imports
autoshard's runtime (``from autoshard import autoshard``) or
``torch.distributed.nn`` before ``dist.init_process_group``.

>>> sorted(gloo_worker_threads()) == []  # no process group in this process
True
"""

from __future__ import annotations

import gc
import os
from typing import Any

import torch.distributed as dist

__all__ = ["init_process_group", "destroy_process_groups", "gloo_worker_threads"]

GLOO_WORKER_THREAD = "pt_gloo_runloop"
"""Name torch gives a gloo process group's worker threads (Linux ``comm``)."""


def init_process_group(backend: str, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group(backend, **kwargs)``, after
    importing ``torch.distributed.nn`` so that it cannot hold on to the
    default group (module docstring).

    >>> # init_process_group("gloo", timeout=timedelta(seconds=60))
    """
    import torch.distributed.nn  # noqa: F401 - before the group exists: see the module docstring

    dist.init_process_group(backend, **kwargs)


def destroy_process_groups() -> None:
    """Destroy every process group of this process (nothing when there is
    none) and free them now, joining their worker threads while the
    interpreter is alive (module docstring). Every object that holds a group
    (a DeviceMesh, a :class:`~autoshard.runtime.collectives.MeshComm`) must be
    out of reach by then, or that group lives on.

    >>> destroy_process_groups()  # no process group: nothing to do
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()  # a group held only by a reference cycle (a mesh and its comm) goes now, not at teardown


def gloo_worker_threads() -> list[int]:
    """Thread ids of this process's gloo worker threads (Linux; empty
    elsewhere): none should be left after :func:`destroy_process_groups`."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    found = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as handle:
                name = handle.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name == GLOO_WORKER_THREAD:
            found.append(int(tid))
    return found
