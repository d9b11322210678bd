"""Train a small LLaMA-style model with autoshard: 4 CPU ranks (gloo), the mesh chosen by autoshard.

    torchrun --standalone --nproc-per-node 4 examples/train.py

Every rank builds the same model (fixed seed); ``autoshard`` traces it, rank 0
solves the plan on every mesh layout of the 4 ranks (``4`` and ``2x2``)
under a per-device memory limit small enough that the model must be sharded
(or takes them from the cache), keeps the fastest, broadcasts it, and every
rank builds that mesh and shards the parameters. Then a few AdamW steps of an
ordinary training loop; rank 0 also trains an unsharded copy of the model in
the same process and prints its loss next to the sharded one: they agree to
float precision.

Options: ``--steps``, ``--memory-limit-mib``, ``--time-limit`` (the solve),
``--mesh 2x2`` (give the mesh instead of searching it), ``--no-cache`` (solve
even when a cached plan exists), ``--device`` (``cuda`` on a machine with GPUs:
NCCL, one GPU per rank from ``LOCAL_RANK``, the plan priced for H100s and
holding their kernels; ``auto``, the default, takes the GPUs when there are).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `examples` and `autoshard` from a checkout

from autoshard import autoshard  # noqa: E402
from autoshard.plan.explain import explain_text  # noqa: E402
from autoshard.runtime.process_group import destroy_process_groups  # noqa: E402
from examples.models import llama3  # noqa: E402

MODEL = {"n_layers": 2, "n_kv_heads": 4, "batch_size": 8, "seq_len": 16}
"""``llama3.tiny`` (dim 64, 4 heads, vocab 256) with 8 sequences of 16 tokens; one
K/V head per query head keeps the solve short on a busy 2-core machine."""


def batch(step: int, vocab: int, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank (seeded by step): learn ``next = token + 1``."""
    gen = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, vocab, shape, generator=gen)
    return tokens, (tokens + 1) % vocab


def _unproven_note(plan, time_limit: float) -> str:
    """One line saying why the plan is not proven optimal (measured on this
    example: the exact stage's LP bound is 24 % below the plan under a 2 MiB
    limit; CP-SAT needs more than a minute to close it)."""
    e = plan.estimate
    gap = plan.solver.gap
    why = (f"the {e.memory_limit_bytes / 2**20:.2f} MiB limit binds (peak {e.peak_memory_bytes / 2**20:.2f} MiB), "
           "which makes the choice a knapsack with a loose LP bound"
           if e.peak_memory_bytes > 0.8 * e.memory_limit_bytes else "the search ran out of time")
    gap_text = "" if gap is None else f" (gap {gap:.0%})"
    return (f"\nnot proven optimal within --time-limit {time_limit:g} s{gap_text}: {why}; "
            "best plan found, never worse than the expert layouts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--memory-limit-mib", type=float, default=2.0,
                        help="per-device memory limit of the solve (the replicated model needs ~4 MiB)")
    parser.add_argument("--time-limit", type=float, default=40.0,
                        help="seconds for the solve of all layouts (20 s left a layout unsolved on a busy 2-core box)")
    parser.add_argument("--mesh", metavar="AxB", help="the mesh (e.g. 2x2, dims dp,tp); default: chosen by autoshard")
    parser.add_argument("--no-cache", action="store_true", help="solve even if a cached plan exists")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the ranks run (auto: one GPU per rank when there are GPUs, else CPU)")
    args = parser.parse_args()

    start = time.perf_counter()
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    device = torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")
    rank = dist.get_rank()
    torch.set_num_threads(1)  # 4 ranks share a few cores
    mesh = None  # autoshard chooses it (and builds it) for the job's ranks
    if args.mesh:
        shape = tuple(int(m) for m in args.mesh.split("x"))
        mesh = init_device_mesh(kind, shape, mesh_dim_names=("dp", "tp", "cp")[:len(shape)])
    model, example = llama3.tiny(**MODEL)
    model, example = model.to(device), tuple(x.to(device) for x in example)
    reference = copy.deepcopy(model) if rank == 0 else None  # autoshard shards `model` in place

    sharded = autoshard(model, mesh, example, memory_limit=args.memory_limit_mib * 2**20,
                        time_limit=args.time_limit, cache_dir=False if args.no_cache else None)
    if rank == 0:
        fp = sharded.plan.fingerprint
        print(explain_text(sharded.plan, top=5, params_limit=8))
        if sharded.plan.solver.status != "optimal":
            print(_unproven_note(sharded.plan, args.time_limit))
        print(f"\nplan {sharded.plan_source}; set-up {time.perf_counter() - start:.1f} s; "
              f"{dist.get_world_size()} ranks on mesh {'x'.join(map(str, fp.mesh_shape))} ({', '.join(fp.dim_names)})"
              f"{'' if args.mesh else ', chosen by autoshard'}\n", flush=True)

    opt = torch.optim.AdamW(sharded.parameters(), lr=args.lr)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=args.lr) if reference is not None else None
    vocab, shape = model.config.vocab_size, tuple(example[0].shape)
    for step in range(args.steps):
        tokens, labels = (x.to(device) for x in batch(step, vocab, shape))
        t0 = time.perf_counter()
        loss = sharded(tokens, labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ms = (time.perf_counter() - t0) * 1e3
        if ref_opt is not None:
            ref_loss = reference(tokens, labels)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            print(f"step {step}  loss {loss.item():.6f}  single-device {ref_loss.item():.6f}  "
                  f"|diff| {abs(loss.item() - ref_loss.item()):.1e}  sharded step {ms:.0f} ms", flush=True)
    if rank == 0:
        print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
    destroy_process_groups()  # after main: its mesh and model are gone, so every group and its threads go
