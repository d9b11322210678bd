"""What the DDP layout's gradient buckets and loss all-reduces cost on this machine, measured beside torch DDP.

Issue 54 item 4: autoshard's DDP layout of an unseen transformer ran 1.09x torch DDP
on 4 gloo ranks. Two differences were found in its step: (b) autoshard's price
(``autoshard.assembly.buckets.choose_gradient_buckets``) sends all gradients in one
bucket after the backward, where DDP sends a 1 MiB-capped first bucket (the head's
2 MiB gradient alone) under the rest of the backward; (a) autoshard's loss is the
exact global mean, two scalar all-reduces issued and waited mid-step, where DDP keeps
each rank's local mean. This script measures each, on 4 gloo ranks, stepped in turn
(``benchmarks/runtime_step.py``'s rounds: a barrier before each step, max over ranks):

* ``as-ddp``: the DDP layout as the assembler prices and chooses it;
* ``as-ddp[F/C]``: the same layout with its gradients grouped with first cap ``F`` and
  cap ``C`` only (``autoshard.assembly.buckets.candidate_caps`` restricted while the plan
  is assembled, so the plan's schedule and estimate are those of that grouping);
  ``as-ddp[1M/25M]``: DDP's grouping; ``as-ddp[-/64M]`` (``--one-bucket``): one bucket, the
  same plan as ``as-ddp`` where the price keeps one (a measure of the rounds' noise);
* ``torch-ddp``: ``DistributedDataParallel``; ``torch-ddp+loss-sync``: the same, its loss
  all-reduced twice (sum and count, detached: the two mid-step syncs of autoshard's
  global mean, not its numbers).

    python benchmarks/ddp_buckets.py --models unseen --steps 12 --warmup 4
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/ddp_buckets.py`: re-executed as the module

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from benchmarks import runtime_step as rs
from benchmarks.common.gloo import spawn
from benchmarks.common.timing import load_average, time_rounds

GROUPINGS = {"as-ddp[1M/25M]": (2**20, 25 * 2**20)}
"""Forced groupings: name -> (first cap, cap) in bytes (``--one-bucket`` adds ``as-ddp[-/64M]``)."""


@contextlib.contextmanager
def only_grouping(first_cap: int | None, cap: int) -> Iterator[None]:
    """While assembling, the gradient bucket choice sees this one candidate (module docstring)."""
    from autoshard.assembly import buckets

    saved = buckets.candidate_caps
    buckets.candidate_caps = lambda _cap: [buckets.BucketCaps(cap, first_cap)]
    try:
        yield
    finally:
        buckets.candidate_caps = saved


def make_plans(model_key: str, mesh_key: str, out: Path, optimizer_impl: str,
               groupings: dict[str, tuple[int | None, int]]) -> dict[str, dict]:
    """name -> {path, predicted_s, buckets}: the chosen DDP plan and each forced grouping's."""
    from autoshard.search.solve import prepare, solve_prepared

    shape, names = rs.MESHES[mesh_key]
    model, inputs = rs._example(model_key, "meta")
    prep = prepare(model, inputs, shape, names, profile=rs.PROFILE, optimizer_impl=optimizer_impl)
    plans = {}
    for name, grouping in [("as-ddp", None), *groupings.items()]:
        with only_grouping(*grouping) if grouping else contextlib.nullcontext():
            plan = solve_prepared(prep, baseline="ddp", time_limit=8.0)
        path = out / f"{model_key}-{mesh_key}-{len(plans)}.json"
        plan.save(path)
        plans[name] = {"path": str(path), "predicted_s": plan.estimate.step_s,
                       "buckets": [(len(b.members), b.bytes) for b in plan.buckets]}
    return plans


def _torch_ddp_loss_sync(model_key: str, opt_kind: str):
    """torch DDP whose step also all-reduces the loss and the token count, detached (module docstring)."""
    from torch.nn.parallel import DistributedDataParallel

    model, inputs = rs._example(model_key)
    ddp = DistributedDataParallel(model)

    def forward(*batch):
        loss = ddp(*batch)
        total, count = loss.detach().clone(), torch.tensor(float(batch[-1].numel()))
        dist.all_reduce(total)  # two calls, as autoshard's plan issues them
        dist.all_reduce(count)
        return loss

    batch = rs._batch_slice(inputs, dist.get_rank(), dist.get_world_size())
    return rs._train_step(forward, rs._optimizer(ddp.parameters(), opt_kind), batch)


def _worker(rank: int, world: int, plans: dict, model_key: str, mesh_key: str, steps: int, warmup: int,
            opt_kind: str) -> dict:
    from autoshard.trace import trace_joint

    model, inputs = rs._example(model_key)
    traced = trace_joint(model, inputs, target_device=rs.DEVICE)
    variants = {name: rs._autoshard(model_key, mesh_key, info["path"], traced, opt_kind)
                for name, info in plans.items()}
    variants["torch-ddp"] = rs._torch_ddp(model_key, mesh_key, opt_kind)
    variants["torch-ddp+loss-sync"] = _torch_ddp_loss_sync(model_key, opt_kind)
    times = time_rounds(variants, rounds=steps, warmup=warmup)
    return {name: (t.step_s, t.part_s) for name, t in times.items()} if rank == 0 else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="unseen")
    parser.add_argument("--mesh", default="4", choices=sorted(rs.MESHES))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--optimizer", choices=sorted(rs.OPTIMIZERS), default="default")
    parser.add_argument("--one-bucket", action="store_true", help="also the one-bucket grouping, forced")
    args = parser.parse_args(argv)
    groupings = {**GROUPINGS, **({"as-ddp[-/64M]": (None, 64 * 2**20)} if args.one_bucket else {})}
    impl = "fused" if args.optimizer == "fused" else "auto"
    print(f"load average before: {load_average()}", flush=True)
    for model_key in args.models.split(","):
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            plans = make_plans(model_key, args.mesh, Path(tmp), impl, groupings)
            measured = spawn(4, _worker, (plans, model_key, args.mesh, args.steps, args.warmup, args.optimizer),
                             Path(tmp) / "ranks", timeout=None, collective_timeout_s=900)[0]
        ddp = measured["torch-ddp"][0]
        print(f"\n{model_key} on mesh {args.mesh}, {args.steps} rounds after {args.warmup}, optimizer "
              f"{args.optimizer}, {time.perf_counter() - start:.0f} s, load after {load_average()}\n")
        print("| variant | predicted ms | measured step ms | / torch-ddp | fwd+bwd ms | buckets (members, bytes) |")
        print("|---|---:|---:|---:|---:|---|")
        for name, (step_s, part_s) in measured.items():
            info = plans.get(name)
            pred = f"{info['predicted_s'] * 1e3:.2f}" if info else "-"
            print(f"| {name} | {pred} | {step_s * 1e3:.2f} | {step_s / ddp:.3f} | {part_s * 1e3:.2f} | "
                  f"{info['buckets'] if info else '-'} |")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
