"""How close the estimated peak memory of a training step is to what PyTorch measures.

Two comparisons, each a markdown table (sizes in MiB, ratio = estimate / measured):

1. **All-replicated, one rank.** The plan on mesh ``(1,)`` (profile
   ``cpu-gloo``) against ``torch.distributed._tools.mem_tracker.MemTracker``
   tracking one real AdamW step on CPU (forward, backward, ``step``,
   ``zero_grad``). The tracked step is the *second* one: the first step
   allocates the optimizer state inside ``opt.step()``, so during its backward
   there is no state yet, while our model (like every later step) holds it all
   step. The first step's peak is in the ``cold`` column for reference.
2. **FSDP on N ranks.** The ``fsdp`` baseline of ``autoshard.search.solve`` on
   mesh ``(N,)`` (parameters and batch ``S(0)``, ops data parallel as FSDP
   runs them) against ``fsdp2_mem_tracker.FSDPMemTracker`` tracking rank 0 of
   the same model wrapped with FSDP2 ``fully_shard`` (each block of every
   ``nn.ModuleList``, then the root) on a fake process group, running its
   share of the batch (global batch / N). Two estimates:

   - ``reader``: parameters gathered as autoshard's runtime gathers them,
     per reader (``autoshard.graph.copies``);
   - ``fsdp2``: gathered as FSDP2 does, a block at a time with the next block
     prefetched and the root's all step.

   The measured breakdown separates what FSDP2 holds beyond sharded state:
   ``gathered`` (unsharded parameters plus the all-gather output buffer of
   the prefetched unit) and ``rs`` (reduce-scatter input and unsharded
   gradients); the estimated one has ``copies`` (redistributed copies live at
   the peak) and ``buckets`` (gradients waiting for their bucket).
3. **Recomputation, one rank.** The plan with ``--recompute full`` on mesh
   ``(1,)`` against MemTracker on the model with ``torch.utils.checkpoint``
   around every block (non-reentrant, the second step).

    python -m benchmarks.memory_fidelity                 # both tables, N = 4 and 8 (about 2 minutes on 2 cores)
    python -m benchmarks.memory_fidelity --fsdp-sizes 4  # FSDP on 4 ranks only
    python -m benchmarks.memory_fidelity --no-fsdp       # the all-replicated table only

Not a test; ``tests/autoshard/plan/test_memory_fidelity.py`` checks a few rows.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/memory_fidelity.py`: re-executed as the module

import argparse
import contextlib
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
from autoshard.graph.liveness import is_view_op
from autoshard.graph.memory import OptimizerMemory, local_bytes
from autoshard.assembly.request import placement_text
from autoshard.plan.fingerprint import make_fingerprint
from autoshard.plan.format import Plan
from autoshard.trace import tensor_arg_nodes
from autoshard.search.solve import Prepared, prepare, solve_prepared
from autoshard.graph.states import KEEP, RECOMPUTE, strategy_states
from autoshard.graph.tied_memory import BOUND
from autoshard.rules import OpStrategy
from autoshard.trace import trace_joint
from benchmarks.common.models import load
from benchmarks.common.timing import train_step
from costmodel.mesh import MeshSpec
from hw_profiles import load as load_profile

__all__ = [
    "Config", "REPLICATED_CONFIGS", "FSDP_CONFIGS", "train_step", "measure_replicated", "measure_fsdp",
    "fake_process_group", "plan_choice", "estimate_breakdown", "estimate", "measure_checkpointed",
    "replicated_row", "fsdp_row", "checkpoint_row", "main",
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
        model, inputs = load(f"{self.module}.{self.factory}", self.overrides, **more)
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

CHECKPOINT_CONFIGS = (
    Config("gpt2", overrides={"batch_size": 16, "seq_len": 64}),
    Config("llama3", overrides={"batch_size": 32, "seq_len": 64}),
)
"""Activation-heavy configs: what recomputation changes shows."""


# -- measuring ---------------------------------------------------------------

def step_once(model: nn.Module, opt: torch.optim.Optimizer, inputs: Sequence[torch.Tensor]) -> None:
    """One training step as our estimate models it (the model returns the loss): the benchmarks' step."""
    train_step(model, tuple(inputs), opt)()


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
        step_once(model, opt, inputs)
    # a fresh tracker per step: MemTracker refuses a module called twice
    tracker = MemTracker()
    tracker.track_external(model, opt, *inputs)
    with tracker:
        step_once(model, opt, inputs)
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
            step_once(model, opt, inputs)  # also FSDP2's lazy init
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs(inputs)
        with tracker:
            step_once(model, opt, inputs)
        return _by_name(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])


# -- estimating --------------------------------------------------------------

def plan_choice(graph: StrategyGraph, plan: Plan) -> list[int]:
    """The strategy index of every graph node in ``plan``, recovered from the
    plan's placement texts and its ``recompute`` list (the plan does not carry
    the solver's choice; strategies with equal texts and state have equal
    memory, so any match serves). Memory-only nodes take their owner's index."""
    ops = {n.name: (tuple(n.out), tuple(n.inputs)) for n in plan.nodes}
    recomputed = set(plan.recompute)
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

    choice: list[int] = []
    for node in graph.nodes:
        if node.kind == "op":
            want = RECOMPUTE if node.name in recomputed else KEEP
            states = strategy_states(node.states, len(node.strategies))
            choice.append(next(k for k, s in enumerate(node.strategies)
                               if states[k] == want and texts(s) == ops[node.name]))
        elif node.name in leaves:
            choice.append(next(k for k, s in enumerate(node.strategies)
                               if placement_text(s.output_placements[0]) == leaves[node.name]))
        else:  # tangent, loss, memory-only nodes: set below
            choice.append(0)
    copies = {}
    for e in graph.edges:  # a copy node's two edges: from its reader (input 0), from the producer
        if graph.nodes[e.dst].kind == "memory" and graph.nodes[e.dst].name.startswith("memory:copy:"):
            copies.setdefault(e.dst, []).append(e)
    for i, node in enumerate(graph.nodes):
        owner = node.name.split(":")[2] if node.kind == "memory" and node.name.count(":") >= 2 else None
        if owner is None:
            continue
        if i not in copies:
            choice[i] = choice[graph.index[owner]]
            continue
        # (placement, no copy) then (placement, copy): the reader's placement, a copy where the producer's differs
        reader = graph.index[owner]
        position = int(node.name.rsplit(":", 1)[1])
        wanted = graph.nodes[reader].strategies[choice[reader]].input_placements[position]
        producer = next(e for e in copies[i] if e.src != reader)
        given = graph.nodes[producer.src].strategies[choice[producer.src]].output_placements[producer.src_output]
        half = len(node.strategies) // 2
        j = next(k for k in range(half) if node.strategies[k].output_placements[0] == wanted)
        choice[i] = j if given == wanted else half + j
    return choice


def activation_peak_time(graph: StrategyGraph, plan: Plan) -> int:
    """The time at which the plan's activations (op outputs, the tangent) are highest."""
    choice = plan_choice(graph, plan)
    events: dict[int, float] = {}
    for node, k in zip(graph.nodes, choice):
        if node.kind in ("param", "grad", "input", "buffer", "constant") or node.live is None \
                or (node.kind == "memory" and node.target == BOUND) or not node.memory_bytes[k]:
            continue
        events[node.live[0]] = events.get(node.live[0], 0.0) + float(node.memory_bytes[k])
        events[node.live[1]] = events.get(node.live[1], 0.0) - float(node.memory_bytes[k])
    level, best = 0.0, (float("-inf"), 0)
    for t in sorted(events):
        level += events[t]
        best = max(best, (level, -t))
    return -best[1]


def estimate_breakdown(graph: StrategyGraph, plan: Plan, at: int | None = None) -> dict[str, float]:
    """The estimate's bytes live at its peak (or at time ``at``), by category: params, grads,
    optimizer, inputs (batch, buffers and tensor constants), activations (every op output and the
    tangent), copies (redistributed copies: gathered parameters and
    activations, re-laid-out shards; a parameter's copies over one interval counted once in a plan
    priced as FSDP2 runs, ``autoshard.program.memory``), buckets (gradients waiting for their
    bucket and its payload: the rest of the timeline's level), and ``Total`` (the timeline's level
    then: ``plan.estimate.peak_memory_bytes`` at the peak)."""
    from autoshard.assembly.from_graph import assembly_graph
    from autoshard.program.memory import param_view_roots
    from autoshard.program.schedule import VIEW_OPS

    choice = plan_choice(graph, plan)
    peak_time = max(plan.memory_timeline, key=lambda point: point[1])[0] if at is None else at
    level = plan.estimate.peak_memory_bytes if at is None else \
        next((b for t, b in reversed(plan.memory_timeline) if t <= at), plan.memory_timeline[0][1])
    roots = param_view_roots(assembly_graph(graph), VIEW_OPS) if plan.options.get("gather") == "fsdp2" else {}
    shared: dict[tuple, float] = {}
    out = dict.fromkeys(("params", "grads", "optimizer", "inputs", "activations", "copies", "buckets"), 0.0)

    def live(interval: tuple[int, int] | None) -> bool:
        return interval is None or interval[0] <= peak_time < interval[1]

    for node, k in zip(graph.nodes, choice):
        m = float(node.memory_bytes[k])
        if not m or not live(node.live) or (node.kind == "memory" and node.target == BOUND):
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
    edge_of = {(graph.nodes[e.src].name, graph.nodes[e.dst].name, e.src_output, e.dst_input): j
               for j, e in enumerate(graph.edges)}
    recomputed = set(plan.recompute)
    for r in plan.redistributions:
        j = edge_of[(r.tensor, r.to, r.output_index, r.input_index)]
        lives = graph.copy_live_recomputed[j] if r.to in recomputed and graph.copy_live_recomputed[j] \
            else graph.copy_live[j]
        live = next(((a, b) for a, b in lives if a <= peak_time < b), None)
        if r.src != r.dst and r.steps and live is not None:
            nbytes = local_bytes(graph.edges[j].tensor, r.dst, graph.mesh.shape)
            root = roots.get(graph.edges[j].src)
            if root is None:
                out["copies"] += nbytes
            else:
                shared[(root, live)] = max(shared.get((root, live), 0.0), nbytes)
    out["copies"] += sum(shared.values())
    total_without_buckets = sum(out.values())
    out["buckets"] = level - total_without_buckets  # the rest: bucket buffers
    out["Total"] = sum(out.values())
    return out


def estimate(config: Config, mesh_size: int, baseline: str, *, time_limit: float = 30.0, gather: str = "reader",
             recompute: str = "none", bucket_bytes: int | None = None,
             breakdown_at: str = "peak") -> tuple[Plan, dict[str, float]]:
    """The plan of ``baseline`` for ``config`` on mesh ``(mesh_size,)`` (profile
    ``cpu-gloo``, no memory limit) and its breakdown at the peak. ``gather``:
    when parameter copies are held (``reader``: autoshard's runtime; ``fsdp2``:
    FSDP2's per-block gathers with prefetch, ``autoshard.graph.copies``, and its
    per-block gradient reductions, ``costmodel.buckets.grouping``, whatever the cap);
    ``bucket_bytes``: the gradient bucket cap of ``reader``;
    ``recompute``: the recomputation policy; ``breakdown_at``: ``peak`` or ``activations``
    (where the activations are highest, :func:`activation_peak_time`)."""
    model, inputs = config.build(device="meta")
    buckets = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
    prep = prepare(model, inputs, (mesh_size,), profile=PROFILE, gather=gather, recompute=recompute, **buckets)
    plan = solve_prepared(prep, baseline=baseline, memory_limit=1e30, time_limit=time_limit, recompute=recompute)
    at = activation_peak_time(prep.graph, plan) if breakdown_at == "activations" else None
    return plan, estimate_breakdown(prep.graph, plan, at=at)


def measure_checkpointed(config: Config) -> dict[str, int]:
    """MemTracker's peak (second step) of ``config`` with every repeated block
    wrapped in a non-reentrant ``torch.utils.checkpoint``."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.checkpoint import checkpoint

    from autoshard.trace.blocks import repeated_blocks

    class Checkpointed(nn.Module):
        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, *args: Any) -> Any:
            return checkpoint(self.block, *args, use_reentrant=False)

    model, inputs = config.build()
    for path in repeated_blocks(model):
        parent, _, child = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        owner.register_module(child, Checkpointed(owner.get_submodule(child)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_once(model, opt, inputs)
    tracker = MemTracker()
    tracker.track_external(model, opt, *inputs)
    with tracker:
        step_once(model, opt, inputs)
    return _by_name(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])


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
    """Measured FSDP2 peak on rank 0 and the ``fsdp`` estimates (per-reader and FSDP2 gathers)."""
    plan, est = estimate(config, world_size, "fsdp")
    plan2, est2 = estimate(config, world_size, "fsdp", gather="fsdp2")
    m = measure_fsdp(config, world_size)
    total = m["Total"]
    return {"config": config.name, "n": world_size, "measured": m, "estimate": est, "estimate_fsdp2": est2,
            "ratio": plan.estimate.peak_memory_bytes / total, "ratio_fsdp2": plan2.estimate.peak_memory_bytes / total}


def checkpoint_row(config: Config) -> dict[str, Any]:
    """Measured peak with every block checkpointed and the ``full`` recomputation estimate, one rank."""
    plan, est = estimate(config, 1, "ddp", recompute="full")
    m = measure_checkpointed(config)
    return {"config": config.name, "measured": m, "estimate": est, "recomputed": len(plan.recompute),
            "ratio": plan.estimate.peak_memory_bytes / m["Total"]}


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
        "| config | N | measured | reader est | ratio | fsdp2 est | ratio "
        "| measured p/g/opt/gathered/rs/act+tmp/in | fsdp2 est p/g/opt/copies/buckets/act/in |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        m, e, d = r["measured"], r["estimate"], r["estimate_fsdp2"]
        mb = [m.get("Sharded Param", 0) + m.get("Buffer", 0), m.get("Sharded Grad", 0), m.get("OptState", 0),
              m.get("Unsharded Param", 0) + m.get("All Gather", 0),
              m.get("Reduce Scatter", 0) + m.get("Unsharded Grad", 0),
              m.get("Activation", 0) + m.get("Temp", 0), m.get("Inputs", 0)]
        db = [d["params"], d["grads"], d["optimizer"], d["copies"], d["buckets"], d["activations"], d["inputs"]]
        lines.append(f"| {r['config']} | {r['n']} | {_mib(m['Total'])} | {_mib(e['Total'])} | {r['ratio']:.3f} "
                     f"| {_mib(d['Total'])} | {r['ratio_fsdp2']:.3f} "
                     f"| {' / '.join(_mib(b) for b in mb)} | {' / '.join(_mib(b) for b in db)} |")
    return "\n".join(lines)


def checkpoint_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per config."""
    lines = ["| config | measured | estimate | ratio | recomputed nodes | measured act+tmp | estimated act |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        m, e = r["measured"], r["estimate"]
        lines.append(f"| {r['config']} | {_mib(m['Total'])} | {_mib(e['Total'])} | {r['ratio']:.3f} "
                     f"| {r['recomputed']} | {_mib(m.get('Activation', 0) + m.get('Temp', 0))} "
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
    crows = [checkpoint_row(c) for c in CHECKPOINT_CONFIGS]
    print("\n## Full recomputation vs torch.utils.checkpoint on every block, one rank (MemTracker; MiB)\n")
    print(checkpoint_table(crows))
    print(f"\n{torch.get_num_threads()} threads, torch {torch.__version__}, CPU; "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
