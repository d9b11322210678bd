"""How many sharding strategies each example model's nodes have, and how long enumerating them takes.

For each model (traced once, on fake tensors) and each mesh, every ATen op node
is enumerated with ``RuleRegistry.strategies`` (after pruning); the table gives
the node count, the average and largest number of strategies per node, the
number of distinct call signatures (the registry's cache misses), and the
enumeration time with a cold cache. Repeated layers share signatures, so the
time grows with the number of distinct layers, not of nodes. Not a test.

    python -m benchmarks.strategy_counts                       # default models, meshes 8, 8x8, 2x4x8
    python -m benchmarks.strategy_counts --models llama3:llama3_8b --meshes 8x8
    python -m benchmarks.strategy_counts --tiny                # tiny configs, seconds
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/strategy_counts.py`: re-executed as the module

import argparse
import logging
import sys
import time
from dataclasses import dataclass

from torch._ops import OpOverload

from autoshard.rules import load_rules
from autoshard.trace import TracedGraph, trace_joint
from benchmarks.common.models import load

DEFAULT_MODELS = (
    "mlp:small", "gpt2:gpt2_small", "llama3:llama3_8b", "moe:small", "convnet:small", "vit:vit_base",
)
DEFAULT_MESHES = ("8", "8x8", "2x4x8")


@dataclass(frozen=True, slots=True)
class StrategyStats:
    """Strategy counts of one traced model on one mesh."""

    model: str
    """``module:factory``."""
    mesh: tuple[int, ...]
    """Mesh shape."""
    nodes: int
    """ATen op nodes enumerated."""
    mean_strategies: float
    """Average strategies per node."""
    max_strategies: int
    """Most strategies of one node."""
    max_op: str
    """The op of the node with the most strategies."""
    signatures: int
    """Distinct (op, shapes, args) calls, i.e. cache misses."""
    errors: int
    """Nodes whose enumeration raised."""
    enumerate_s: float
    """Wall time to enumerate every node, cold cache."""


def count_strategies(traced: TracedGraph, mesh: tuple[int, ...], *, model: str) -> StrategyStats:
    """Enumerate every op node of ``traced`` on ``mesh`` with a fresh registry."""
    registry = load_rules()
    counts: list[tuple[int, str]] = []
    signatures: set[tuple] = set()
    errors = 0
    start = time.perf_counter()
    for info in traced.nodes.values():
        if not isinstance(info.op, OpOverload):
            continue  # tuple access: takes its producer's placement
        try:
            strategies = registry.strategies(info.op, info.args, info.kwargs, mesh, out_meta=info.outputs)
        except Exception as exc:  # a rule bug must not hide the other numbers
            errors += 1
            logging.getLogger(__name__).warning("%s (%s): %s", info.name, info.op, exc)
            continue
        counts.append((len(strategies), str(info.op)))
        signatures.add((info.op, repr(info.args), repr(info.kwargs)))
    elapsed = time.perf_counter() - start
    most = max(counts, default=(0, "-"))
    return StrategyStats(
        model=model, mesh=mesh, nodes=len(counts) + errors,
        mean_strategies=sum(c for c, _ in counts) / max(len(counts), 1), max_strategies=most[0],
        max_op=most[1], signatures=len(signatures), errors=errors, enumerate_s=elapsed,
    )


def trace_spec(spec: str, *, tiny: bool) -> tuple[TracedGraph, float]:
    """Trace ``module:factory`` of ``examples.models`` on meta tensors; returns the graph and seconds."""
    module_name, _, factory = spec.partition(":")
    model, inputs = load(f"{module_name}.{'tiny' if tiny else factory}", device="meta")
    start = time.perf_counter()
    traced = trace_joint(model, inputs)
    return traced, time.perf_counter() - start


def format_table(rows: list[StrategyStats], trace_s: dict[str, float]) -> str:
    """The markdown table."""
    lines = [
        "| model | trace s | mesh | nodes | signatures | mean strategies | max strategies (op) | errors | enumerate s |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        mesh = "x".join(map(str, r.mesh))
        lines.append(
            f"| {r.model} | {trace_s[r.model]:.1f} | {mesh} | {r.nodes} | {r.signatures} | {r.mean_strategies:.1f} "
            f"| {r.max_strategies} ({r.max_op}) | {r.errors} | {r.enumerate_s:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="MODULE:FACTORY")
    parser.add_argument("--meshes", nargs="+", default=list(DEFAULT_MESHES), metavar="AxB")
    parser.add_argument("--tiny", action="store_true", help="use each module's tiny factory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    meshes = [tuple(int(m) for m in text.split("x")) for text in args.meshes]
    rows: list[StrategyStats] = []
    trace_s: dict[str, float] = {}
    for spec in args.models:
        traced, seconds = trace_spec(spec, tiny=args.tiny)
        spec = f"{spec.partition(':')[0]}:tiny" if args.tiny else spec
        trace_s[spec] = seconds
        for mesh in meshes:
            rows.append(count_strategies(traced, mesh, model=spec))
            print(f"done {spec} on {'x'.join(map(str, mesh))}", file=sys.stderr)
    print(format_table(rows, trace_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
