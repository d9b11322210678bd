"""How close the estimated peak memory of a training step is to what PyTorch measures (issue 17).

Two comparisons, each a markdown table (sizes in MiB, ratio = estimate / measured):

1. **All-replicated, one rank.** The plan on mesh ``(1,)`` (profile
   ``cpu-gloo``) against ``torch.distributed._tools.mem_tracker.MemTracker``
   tracking one real AdamW step on CPU (forward, backward, ``step``,
   ``zero_grad``). The tracked step is the *second* one: the first step
   allocates the optimizer state inside ``opt.step()``, so during its backward
   there is no state yet, while our model (like every later step) holds it all
   step. The first step's peak is in the ``cold`` column for reference.
2. **FSDP on N ranks.** The ``fsdp`` baseline of ``autoshard.plan.solve`` on
   mesh ``(N,)`` against ``fsdp2_mem_tracker.FSDPMemTracker`` tracking rank 0
   of the same model wrapped with FSDP2 ``fully_shard`` (each block of every
   ``nn.ModuleList``, then the root) on a fake process group, running its
   share of the batch (global batch / N). Two estimates:

   - ``fsdp``: the baseline as solved (parameters ``S(0)``, batch ``S(0)``,
     activations free: the solver may pick any activation layout).
   - ``fsdp-dp``: the same pins with op strategies restricted to what FSDP2
     runs (data parallel: every batch-carrying op input sharded, every
     parameter-only input replicated, i.e. all-gathered before use), built
     with ``build_graph(restrict=...)``.

   The measured breakdown separates what FSDP2 holds beyond sharded state:
   ``gathered`` (unsharded parameters plus the all-gather output buffer of
   the prefetched unit) and ``rs`` (the reduce-scatter input FSDP2 keeps until
   the next reduce-scatter, plus unsharded gradients). ``dp+buf`` is the
   ``fsdp-dp`` estimate plus those measured buffers: a diagnostic of whether
   they explain the whole gap (they are not in our model; see the report).

    python -m benchmarks.memory_fidelity                 # both tables, N = 4 and 8 (about 2 minutes on 2 cores)
    python -m benchmarks.memory_fidelity --fsdp-sizes 4  # FSDP on 4 ranks only
    python -m benchmarks.memory_fidelity --no-fsdp       # the all-replicated table only

Not a test; ``tests/autoshard/plan/test_memory_fidelity.py`` checks a few rows.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn

from autoshard.graph.builder import StrategyGraph, build_graph
from autoshard.graph.memory import OptimizerMemory, local_bytes
from autoshard.plan.build import make_fingerprint, placement_text
from autoshard.plan.format import Plan
from autoshard.trace import tensor_arg_nodes
from autoshard.plan.solve import Prepared, prepare, solve_prepared
from autoshard.rules import OpStrategy
from autoshard.trace import trace_joint
from costmodel.mesh import MeshSpec
from hw_profiles import load as load_profile

__all__ = [
    "Config", "REPLICATED_CONFIGS", "FSDP_CONFIGS", "train_step", "measure_replicated", "measure_fsdp",
    "fake_process_group", "plan_choice", "estimate_breakdown", "prepare_data_parallel", "estimate",
    "replicated_row", "fsdp_row", "main",
]

log = logging.getLogger(__name__)

PROFILE = "cpu-gloo"
MiB = float(2**20)


@dataclass(frozen=True, slots=True)
class Config:
    """One model configuration: ``examples.models.<module>.<factory>(**overrides)``."""

    module: str
    factory: str = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.overrides.items())
        return f"{self.module}.{self.factory}" + (f" {extra}" if extra else "")

    def build(self, **more: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """The model and its inputs (``more`` overrides the config's overrides)."""
        fn = getattr(importlib.import_module(f"examples.models.{self.module}"), self.factory)
        model, inputs = fn(**{**self.overrides, **more})
        return model, tuple(inputs)

    @property
    def batch_size(self) -> int:
        """The global batch (dim 0 of the first input), from a meta build."""
        return int(self.build(device="meta")[1][0].shape[0])


REPLICATED_CONFIGS = (
    Config("mlp"), Config("mlp", "small"), Config("mlp", overrides={"batch_size": 4096}),
    Config("gpt2"), Config("gpt2", overrides={"batch_size": 16, "seq_len": 64}),
    Config("llama3"), Config("llama3", overrides={"batch_size": 32, "seq_len": 64}),
)
"""Parameter-dominated and activation-heavy configs of each family."""

FSDP_CONFIGS = (
    Config("mlp", "small"), Config("mlp", overrides={"batch_size": 4096}),
    Config("gpt2", overrides={"batch_size": 8}), Config("gpt2", overrides={"batch_size": 16, "seq_len": 64}),
    Config("llama3", overrides={"batch_size": 8}), Config("llama3", overrides={"batch_size": 32, "seq_len": 64}),
)
"""Global batches divisible by 8 (FSDP2 runs batch / N per rank)."""


# -- measuring ---------------------------------------------------------------

def train_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: Sequence[torch.Tensor]) -> None:
    """One training step as our estimate models it (the model returns the loss)."""
    loss = model(*inputs)
    loss.backward()
    opt.step()
    opt.zero_grad()


def _by_name(snapshot: dict[Any, int]) -> dict[str, int]:
    """Tracker snapshot keyed by reference-type enum -> keyed by its display name."""
    return {getattr(k, "value", k): int(v) for k, v in snapshot.items()}


def measure_replicated(config: Config, *, warm: bool = True) -> dict[str, int]:
    """MemTracker's peak of one step of ``config`` on CPU, by category (and ``Total``).

    ``warm``: track the second step (the steady state, optimizer state held
    from the start); otherwise the first.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    model, inputs = config.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if warm:
        train_step(model, opt, inputs)
    # a fresh tracker per step: MemTracker refuses a module called twice
    tracker = MemTracker()
    tracker.track_external(model, opt, *inputs)
    with tracker:
        train_step(model, opt, inputs)
    return _by_name(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A fake process group of ``world_size`` ranks (this process is rank 0) and
    its 1-D CPU device mesh; collectives return at once without moving data."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def measure_fsdp(config: Config, world_size: int, *, warm: bool = True) -> dict[str, int]:
    """FSDPMemTracker's peak on rank 0 of ``config`` under FSDP2 on ``world_size``
    fake ranks, each running ``batch / world_size`` of the global batch."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import fully_shard

    batch = config.batch_size
    if batch % world_size:
        raise ValueError(f"{config.name}: batch {batch} is not divisible by {world_size} ranks")
    with fake_process_group(world_size) as mesh:
        model, inputs = config.build(batch_size=batch // world_size)
        # one FSDP unit per block, as torchtitan wraps transformer blocks; the root takes the rest
        for blocks in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
            for block in blocks:
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if warm:
            train_step(model, opt, inputs)  # also FSDP2's lazy init
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs(inputs)
        with tracker:
            train_step(model, opt, inputs)
        return _by_name(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])


# -- estimating --------------------------------------------------------------

def plan_choice(graph: StrategyGraph, plan: Plan) -> list[int]:
    """The strategy index of every graph node in ``plan``, recovered from the
    plan's placement texts (the plan does not carry the solver's choice; strategies
    with equal texts have equal memory, so any match serves)."""
    ops = {n.name: (tuple(n.out), tuple(n.inputs)) for n in plan.nodes}
    leaves: dict[str, str] = {}
    for fqn, text in plan.params.items():
        leaves[f"param:{fqn}"] = leaves[f"grad:{fqn}"] = text
    for name, text in plan.inputs.items():
        leaves[f"input:{name}"] = text
    for fqn, text in plan.buffers.items():
        leaves[f"buffer:{fqn}"] = leaves[f"buffer_update:{fqn}"] = text
    for name, text in plan.constants.items():
        leaves[f"constant:{name}"] = text

    def texts(s: OpStrategy) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
        return (tuple(placement_text(p) for p in s.output_placements),
                tuple(placement_text(p) for p in s.input_placements))

    choice = []
    for node in graph.nodes:
        if node.kind == "op":
            choice.append(next(k for k, s in enumerate(node.strategies) if texts(s) == ops[node.name]))
        elif node.name in leaves:
            choice.append(next(k for k, s in enumerate(node.strategies)
                               if placement_text(s.output_placements[0]) == leaves[node.name]))
        else:  # tangent, loss: one strategy
            choice.append(0)
    return choice


def estimate_breakdown(graph: StrategyGraph, plan: Plan) -> dict[str, float]:
    """The estimate's bytes live at its peak, by category: params, grads,
    optimizer, inputs (batch, buffers and tensor constants), activations (every op output and the
    tangent), and ``Total`` (equal to ``plan.estimate.peak_memory_bytes``)."""
    choice = plan_choice(graph, plan)
    peak_time = max(plan.memory_timeline, key=lambda point: point[1])[0]
    out = dict.fromkeys(("params", "grads", "optimizer", "inputs", "activations"), 0.0)
    for node, k in zip(graph.nodes, choice):
        m = float(node.memory_bytes[k])
        if not m or not (node.live is None or node.live[0] <= peak_time < node.live[1]):
            continue
        if node.kind == "param":
            shard = local_bytes(node.outputs[0], node.strategies[k].output_placements[0], graph.mesh.shape)
            out["params"] += shard
            out["optimizer"] += m - shard
        elif node.kind == "grad":
            out["grads"] += m
        elif node.kind in ("input", "buffer", "constant"):
            out["inputs"] += m
        else:
            out["activations"] += m
    out["Total"] = sum(out.values())
    return out


def prepare_data_parallel(model: Any, inputs: Sequence[Any], world_size: int, *,
                          profile: str = PROFILE) -> tuple[Prepared, list[str]]:
    """``prepare`` on mesh ``(world_size,)`` with op strategies restricted to data
    parallelism as FSDP2 runs it: every op input that carries the batch (depends
    on a forward input) is not replicated (unless it is a scalar or smaller than
    the mesh), every input made from parameters alone is replicated (the
    all-gathered weight). Returns the prepared graph and the ops where the
    restriction left nothing (kept unrestricted: loss reductions whose rule
    wants a replicated scalar-like input)."""
    traced = trace_joint(model, inputs)
    batch: set[fx.Node] = set(traced.inputs.values())
    for node in traced.graph_module.graph.nodes:
        if node.op == "call_function" and any(a in batch for a in node.all_input_nodes):
            batch.add(node)
    unrestricted: list[str] = []

    def data_parallel(s: OpStrategy, args: list[fx.Node]) -> bool:
        for arg, placement in zip(args, s.input_placements):
            text = placement_text(placement)
            if text is None:
                continue
            replicated = text == "R" * len(placement)
            if arg in batch:
                if replicated and arg.meta["val"].numel() >= world_size:
                    return False
            elif not replicated:
                return False
        return True

    def restrict(node: fx.Node, strategies: tuple[OpStrategy, ...]) -> tuple[OpStrategy, ...]:
        args = tensor_arg_nodes(node)  # in the rules' input order, as the builder wires edges
        kept = tuple(s for s in strategies if data_parallel(s, args))
        if not kept:
            unrestricted.append(node.name)
        return kept or strategies

    mesh = MeshSpec((world_size,))
    prof = load_profile(profile)
    graph = build_graph(traced, mesh, prof, optimizer=OptimizerMemory("adamw"), restrict=restrict)
    return Prepared(traced=traced, graph=graph, fingerprint=make_fingerprint(traced, mesh.shape, (), prof)), unrestricted


def estimate(config: Config, mesh_size: int, baseline: str, *, data_parallel: bool = False,
             time_limit: float = 30.0) -> tuple[Plan, dict[str, float]]:
    """The plan of ``baseline`` for ``config`` on mesh ``(mesh_size,)`` (profile
    ``cpu-gloo``, no memory limit) and its breakdown at the peak."""
    model, inputs = config.build(device="meta")
    if data_parallel:
        prep, _ = prepare_data_parallel(model, inputs, mesh_size)
    else:
        prep = prepare(model, inputs, (mesh_size,), profile=PROFILE)
    plan = solve_prepared(prep, baseline=baseline, memory_limit=1e30, time_limit=time_limit)
    return plan, estimate_breakdown(prep.graph, plan)


# -- tables ------------------------------------------------------------------

def _mib(b: float) -> str:
    return f"{b / MiB:.3f}" if b < 10 * MiB else f"{b / MiB:.1f}"


def replicated_row(config: Config) -> dict[str, Any]:
    """Measured (warm and cold) and estimated peak of the all-replicated plan on one rank."""
    plan, est = estimate(config, 1, "ddp")
    warm = measure_replicated(config)
    cold = measure_replicated(config, warm=False)
    return {"config": config.name, "measured": warm, "cold": cold, "estimate": est,
            "ratio": plan.estimate.peak_memory_bytes / warm["Total"],
            "ratio_cold": plan.estimate.peak_memory_bytes / cold["Total"]}


def fsdp_row(config: Config, world_size: int) -> dict[str, Any]:
    """Measured FSDP2 peak on rank 0 and the ``fsdp`` estimates (as solved, and data parallel)."""
    plan, est = estimate(config, world_size, "fsdp")
    plan_dp, est_dp = estimate(config, world_size, "fsdp", data_parallel=True)
    m = measure_fsdp(config, world_size)
    buffers = (m.get("Unsharded Param", 0) + m.get("All Gather", 0) + m.get("Reduce Scatter", 0)
               + m.get("Unsharded Grad", 0))
    total = m["Total"]
    return {"config": config.name, "n": world_size, "measured": m, "estimate": est, "estimate_dp": est_dp,
            "ratio": plan.estimate.peak_memory_bytes / total, "ratio_dp": plan_dp.estimate.peak_memory_bytes / total,
            "buffers": buffers, "ratio_dp_buffers": (plan_dp.estimate.peak_memory_bytes + buffers) / total}


def replicated_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per config; breakdowns as params/grads/optimizer/activations/inputs (MiB)."""
    lines = [
        "| config | measured | estimate | ratio | cold measured | cold ratio "
        "| measured p/g/opt/act+tmp/in | estimated p/g/opt/act/in |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        m, e = r["measured"], r["estimate"]
        mb = [m.get("Parameter", 0) + m.get("Buffer", 0), m.get("Gradient", 0), m.get("Optstate", 0),
              m.get("Activation", 0) + m.get("Temp", 0), m.get("Other", 0)]
        eb = [e["params"], e["grads"], e["optimizer"], e["activations"], e["inputs"]]
        lines.append(f"| {r['config']} | {_mib(m['Total'])} | {_mib(e['Total'])} | {r['ratio']:.3f} "
                     f"| {_mib(r['cold']['Total'])} | {r['ratio_cold']:.3f} "
                     f"| {' / '.join(_mib(b) for b in mb)} | {' / '.join(_mib(b) for b in eb)} |")
    return "\n".join(lines)


def fsdp_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per (config, N)."""
    lines = [
        "| config | N | measured | fsdp est | ratio | fsdp-dp est | ratio | dp+buf ratio "
        "| measured p/g/opt/gathered/rs/act+tmp/in | fsdp-dp est p/g/opt/act/in | fsdp est act |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        m, e, d = r["measured"], r["estimate"], r["estimate_dp"]
        mb = [m.get("Sharded Param", 0) + m.get("Buffer", 0), m.get("Sharded Grad", 0), m.get("OptState", 0),
              m.get("Unsharded Param", 0) + m.get("All Gather", 0),
              m.get("Reduce Scatter", 0) + m.get("Unsharded Grad", 0),
              m.get("Activation", 0) + m.get("Temp", 0), m.get("Inputs", 0)]
        db = [d["params"], d["grads"], d["optimizer"], d["activations"], d["inputs"]]
        lines.append(f"| {r['config']} | {r['n']} | {_mib(m['Total'])} | {_mib(e['Total'])} | {r['ratio']:.3f} "
                     f"| {_mib(d['Total'])} | {r['ratio_dp']:.3f} | {r['ratio_dp_buffers']:.3f} "
                     f"| {' / '.join(_mib(b) for b in mb)} | {' / '.join(_mib(b) for b in db)} "
                     f"| {_mib(e['activations'])} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--fsdp-sizes", type=int, nargs="*", default=[4, 8], help="FSDP world sizes (default 4 8)")
    parser.add_argument("--no-fsdp", action="store_true", help="only the all-replicated table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    start = time.perf_counter()
    rows = [replicated_row(c) for c in REPLICATED_CONFIGS]
    print("## All-replicated plan, one rank (MemTracker, second step; MiB)\n")
    print(replicated_table(rows))
    if not args.no_fsdp and args.fsdp_sizes:
        frows = [fsdp_row(c, n) for n in args.fsdp_sizes for c in FSDP_CONFIGS]
        print(f"\n## FSDP baseline vs FSDP2 fully_shard, rank 0 of N (FSDPMemTracker, second step; MiB)\n")
        print(fsdp_table(frows))
    print(f"\n{torch.get_num_threads()} threads, torch {torch.__version__}, CPU; "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
