"""How the ranks of one job agree on a plan: rank 0 broadcasts it (or its
error) as bytes with a header, and every rank reports whether it can go on
before anything else is collective, so that one failing rank makes every rank
raise instead of leaving the others in a collective forever.

Used by :func:`autoshard.autoshard` on a given mesh (:mod:`autoshard.runtime.api`)
and on a chosen one (:mod:`autoshard.runtime.mesh_choice`).

>>> one_line(ValueError("two\\nlines"))
'ValueError: two lines'
"""

from __future__ import annotations

import json
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["PLAN_SOURCES", "ERROR_CODE", "MeshSizeError", "RankSetupError", "comm_device", "broadcast_bytes",
           "one_line", "agree", "broadcast_plan"]

# Header codes of the plan broadcast: where rank 0's plan came from, or an error.
PLAN_SOURCES = ("given", "cache", "solved")
ERROR_CODE = len(PLAN_SOURCES)


class MeshSizeError(ValueError):
    """The mesh does not cover exactly the ranks of the job."""


class RankSetupError(RuntimeError):
    """Another rank failed while setting up; names that rank and its error."""


def comm_device() -> torch.device:
    """The device the plan broadcast moves tensors on."""
    # NCCL only moves CUDA tensors; gloo (and a cpu:gloo,cuda:nccl mix) takes CPU tensors
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_bytes(code: int, payload: bytes | None, src: int, device: torch.device) -> tuple[int, bytes]:
    """``(code, payload)`` of rank ``src`` on every rank: a length header, then the bytes."""
    is_src = dist.get_rank() == src
    header = torch.tensor([code, len(payload or b"")] if is_src else [0, 0], dtype=torch.int64, device=device)
    dist.broadcast(header, src=src)
    code, n = (int(v) for v in header.tolist())
    if is_src:
        if n:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device), src=src)
        return code, payload or b""
    buf = torch.empty(n, dtype=torch.uint8, device=device)
    if n:
        dist.broadcast(buf, src=src)
    # a fresh tensor's storage holds exactly its n bytes
    return code, bytes(buf.cpu().untyped_storage())


def one_line(exc: BaseException) -> str:
    """``ValueError: the message`` on one line, as every rank reports it."""
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text}"


def agree(error: BaseException | None, device: torch.device) -> None:
    """Raise on every rank if any rank has an ``error``: that rank raises its own, the
    others :class:`RankSetupError` with the first failing rank's message. One
    ``all_reduce`` when all is well (so no rank goes on into collectives alone)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    message = one_line(error).encode() if error is not None else b""
    lengths = torch.zeros(world, dtype=torch.int64, device=device)
    lengths[rank] = len(message)
    dist.all_reduce(lengths)
    failed = [r for r, n in enumerate(lengths.tolist()) if n]
    if not failed:
        return
    _, text = broadcast_bytes(0, message, failed[0], device)
    if error is not None:
        raise error
    others = f" (and rank(s) {', '.join(map(str, failed[1:]))})" if len(failed) > 1 else ""
    raise RankSetupError(f"rank {failed[0]} failed{others}: {text.decode(errors='replace')}")


def broadcast_plan(error: BaseException | None, rank0_plan: Callable[[], tuple[str, Any]],
                   device: torch.device) -> tuple[str, bytes]:
    """(where the plan came from, the plan as UTF-8 JSON) on every rank: rank 0 runs
    ``rank0_plan()`` -> (source, plan) unless it has an ``error`` of its own. When rank 0
    fails, every rank raises: rank 0 its error, the others :class:`RankSetupError`."""
    payload, code = None, ERROR_CODE
    if dist.get_rank() == 0:
        if error is not None:
            payload = one_line(error).encode()
        else:
            try:
                source, chosen = rank0_plan()
                code, payload = PLAN_SOURCES.index(source), json.dumps(chosen.to_dict()).encode("utf-8")
            except Exception as exc:  # noqa: BLE001 - broadcast, then raised on rank 0 too
                error, payload = exc, one_line(exc).encode()
    code, payload = broadcast_bytes(code, payload, 0, device)
    if code == ERROR_CODE:
        if error is not None:
            raise error
        raise RankSetupError(f"rank 0 failed: {payload.decode(errors='replace')}")
    return PLAN_SOURCES[code], payload
