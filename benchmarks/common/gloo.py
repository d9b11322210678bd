"""Gloo ranks on loopback: the one launcher every benchmark (and the runtime's tests) starts them with.

:func:`spawn` starts ``world`` processes, joins them
into one gloo process group through a FileStore in a folder of the caller's,
runs ``fn(rank, world, *args)`` in each and returns every rank's result in rank
order. The processes come from a fork server (``forkserver`` start method): a fresh
interpreter started once, which imports torch, transformers and autoshard's runtime
(:data:`RANK_PRELOAD`) and then forks every rank of every later job, so nothing of the
caller's torch state leaks in (as with ``spawn``) and no rank imports torch again: a
4-rank job started in 1 s instead of 17 s (2026-12-05, 2-core machine, load 2.5), most of
what the runtime's multi-rank tests took. Each rank takes the caller's environment and
working directory of the moment it was started (a forked rank would otherwise have the
server's, those of the first job); the ranks share the server's hash seed (the trace's
independence of it is tested in subprocesses: tests/autoshard/trace/test_hash_seed.py).
``start_method="spawn"`` starts fresh interpreters instead. A FileStore rather than a TCP port: a free port found now can be taken
by another job before rank 0 binds it, a file in a fresh folder cannot.

Failures are the caller's, not a hang: a rank that raises fails the call with
that rank's traceback (``torch.multiprocessing.ProcessRaisedException``); a
job still running after ``timeout`` seconds is killed and raises
:class:`TimeoutError`; a rank stuck in a collective gives up after
``collective_timeout_s`` (gloo's own timeout) and so fails the same way.

:func:`rank_group` is the same group set-up for a process started some other
way (one rank in the calling process, NCCL on one GPU: ``gpu_check.py`` part a).

>>> import tempfile
>>> from pathlib import Path
>>> from benchmarks.common.gloo import spawn
>>> def world_size(rank, world):  # a function of an importable module in real use
...     return world
>>> # spawn(2, world_size, (), Path(tempfile.mkdtemp()))  -> [2, 2]
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from autoshard.runtime.process_group import destroy_process_groups, init_process_group

__all__ = ["spawn", "rank_group", "start_ranks", "as_caller", "RANK_PRELOAD"]

RANK_PRELOAD = ("torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp",
                "torch.distributed.pipelining", "transformers", "transformers.models.llama.modeling_llama",
                "autoshard.runtime.execute", "autoshard.search.solve", "examples.models.llama3",
                "benchmarks.common.equivalence")
"""What the fork server imports once for every rank (a module that is not installed is skipped)."""


@contextlib.contextmanager
def rank_group(rank: int, world: int, init_file: str | os.PathLike, *, device: str = "cpu",
               collective_timeout_s: float = 900.0, backend: str = "gloo",
               threads: int | None = 1) -> Iterator[None]:
    """This process as ``rank`` of a group of ``world`` (gloo unless ``backend`` says otherwise),
    ended on exit. ``threads``: torch's compute threads (one by default, as the 2-core machines
    need: more would make the ranks fight over the cores; None leaves torch's choice).

    ``device="cuda"``: every rank works on GPU 0 (gloo moves CUDA tensors; NCCL refuses ranks
    that share a GPU).

    >>> # with rank_group(0, 1, "/tmp/x/store", backend="nccl", device="cuda", threads=None): ...
    """
    if threads is not None:
        torch.set_num_threads(threads)
    if device == "cuda":
        torch.cuda.set_device(0)
    init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                       timeout=timedelta(seconds=collective_timeout_s))
    try:
        yield
    finally:
        destroy_process_groups()  # joins the gloo threads before the interpreter exits


def _entry(rank: int, world: int, fn: Callable[..., Any], init_file: str, out_dir: str, args: tuple,
           device: str, collective_timeout_s: float, env: dict[str, str], cwd: str) -> None:
    as_caller(env, cwd)
    with rank_group(rank, world, init_file, device=device, collective_timeout_s=collective_timeout_s):
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def as_caller(env: dict[str, str], cwd: str) -> None:
    """This rank in the caller's environment and working directory (module docstring)."""
    faulthandler.enable()  # a rank that crashes (a signal, not an exception) says where, on stderr
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)


def start_ranks(entry: Callable[..., Any], args: tuple, world: int, *, start_method: str = "forkserver") -> Any:
    """``torch.multiprocessing.start_processes(entry, args + (environ, cwd), world)`` from the fork
    server (module docstring), not joined; ``entry(rank, *args, env, cwd)`` must call
    :func:`as_caller` first (``spawn``'s entry does).

    >>> # ctx = start_ranks(my_entry, (world, fn), 4); ctx.join()
    """
    if start_method == "forkserver":
        # the first job starts the server with this list; later calls find it running
        mp.get_context("forkserver").set_forkserver_preload(list(RANK_PRELOAD))
    return mp.start_processes(entry, args=(*args, dict(os.environ), os.getcwd()), nprocs=world, join=False,
                              start_method=start_method)


def spawn(world: int, fn: Callable[..., Any], args: tuple, tmp: Path, *, timeout: float | None = 150.0,
          device: str = "cpu", collective_timeout_s: float = 60.0, start_method: str = "forkserver") -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks; their results (``torch.save``-able) in rank order.

    ``fn`` must be importable by name (a module-level function: the ranks do not share the caller's memory);
    ``tmp`` is a folder of the caller's for the store and the results (created if missing);
    ``timeout=None`` waits as long as the job runs (a long benchmark).

    >>> # spawn(4, measure, (plans,), Path(tmp) / "ranks", timeout=None)
    """
    if world < 1:
        raise ValueError(f"spawn: world must be at least 1, got {world}")
    tmp.mkdir(parents=True, exist_ok=True)
    ctx = start_ranks(_entry, (world, fn, str(tmp / "store"), str(tmp), args, device, collective_timeout_s), world,
                      start_method=start_method)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):  # raises with the failed rank's traceback
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{world} ranks did not finish within {timeout:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False, map_location="cpu") for r in range(world)]
