"""The tutorial's training run: the model of ``my_model.py`` on 4 CPU ranks, a 2x2 mesh.

    torchrun --standalone --nproc-per-node 4 train.py --plan plan.json

Why a script of its own: it is what a user's training script becomes with
autoshard, an ordinary loop in which ``autoshard.autoshard(...)`` replaces
DDP / FSDP / TP wrapping. Every rank builds the same model (fixed seed);
with ``--plan`` rank 0 reads the plan that ``autoshard solve`` wrote (every
rank checks its fingerprint against its own trace), without it rank 0 solves
under ``--memory-limit-mib`` (or takes the plan from the plan cache). Rank 0
also trains an unsharded copy and prints both losses.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from autoshard import autoshard
from autoshard.plan.explain import explain_text
from autoshard.runtime.process_group import destroy_process_groups
from my_model import batch, build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", help="plan file from autoshard solve (default: solve here, on rank 0)")
    parser.add_argument("--memory-limit-mib", type=float, default=1.5, help="per-device limit when solving here (default 1.5)")
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)  # 4 ranks share the host's cores
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model, example = build()
    reference = copy.deepcopy(model) if rank == 0 else None  # autoshard shards `model` in place

    start = time.perf_counter()
    sharded = autoshard(model, mesh, example, plan=args.plan, memory_limit=args.memory_limit_mib * 2**20,
                        time_limit=20)
    if rank == 0:
        print(explain_text(sharded.plan, top=3, params_limit=6))
        print(f"\nplan {sharded.plan_source}, ready in {time.perf_counter() - start:.1f} s\n", flush=True)

    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2) if reference is not None else None
    for step in range(args.steps):
        inputs = batch(step)  # the whole batch on every rank: each takes its shard
        loss = sharded(**inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if ref_opt is not None:
            ref_loss = reference(**inputs).loss
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            print(f"step {step}  loss {loss.item():.5f}  single device {ref_loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
    destroy_process_groups()  # after main: its mesh and model are gone, so every group and its threads go
