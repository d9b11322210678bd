"""One training step of zoo models on 4 gloo ranks with the solver's 2x2 plan, against one device.

For each model (a tiny config, so that a step runs on CPU): the solver's plan
on mesh 2x2 (``cpu-gloo`` profile) under a memory limit of half the
replicated layout's peak, so that the plan shards; then 4 gloo processes on
loopback, each building the same model (same seed), sharding it with
``autoshard.runtime.shard`` and running one step (``loss.backward()``), next
to the eager single-device step of a copy of the model. A row is *equal*
when the loss and every rank's gradient shard match the single-device ones
within the runtime tests' tolerance (``rtol=1e-4, atol=1e-6``, fp32).

    python -m benchmarks.zoo_runtime                 # Whisper, Falcon and Mistral (tiny), a few minutes on 2 cores
    python -m benchmarks.zoo_runtime --only falcon
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/zoo_runtime.py`: re-executed as the module

import argparse
import copy
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.gloo import spawn
from benchmarks.common.models import load, loss_of

MESH = ((2, 2), ("dp", "tp"))
PROFILE = "cpu-gloo"
MEMORY_FRACTION = 0.5
RTOL, ATOL = 1e-4, 1e-6

# (label, "module:factory", overrides): tiny configs, batch 4 (divisible by the 4 ranks)
RUNTIME_MODELS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("HF Whisper (tiny), 2x2", "examples.models.hf:hf_whisper", {"batch_size": 4}),
    ("HF Falcon (tiny), 2x2", "examples.models.hf:hf_falcon", {"batch_size": 4}),
    ("HF Mistral (tiny), 2x2", "examples.models.hf:hf_mistral", {"batch_size": 4}),
)


@dataclass(frozen=True, slots=True)
class RuntimeRow:
    """One model's step on 4 ranks against one device."""

    label: str
    error: str = ""
    """Why it did not run (empty when it did)."""
    sharded_params: int = 0
    """Parameters the plan splits (not replicated on every mesh dim)."""
    params: int = 0
    constants: int = 0
    """Tensor constants of the graph (plan.constants)."""
    collectives: int = 0
    """Collectives one rank issued in the step."""
    loss_err: float = 0.0
    """Largest |loss - single-device loss| over ranks."""
    grad_err: float = 0.0
    """Largest |gradient shard - single-device shard| over ranks and parameters."""
    equal: bool = False
    """Loss and every gradient within rtol 1e-4, atol 1e-6 on every rank."""
    seconds: float = 0.0
    """Wall time: solve, spawn, shard and step."""


def solve_plan(spec: str, overrides: dict[str, Any], path: Path) -> Any:
    """The solver's 2x2 plan under half the replicated peak, written to ``path``."""
    from autoshard.search.solve import prepare, solve_prepared

    model, inputs = load(spec, overrides, device="meta")
    prep = prepare(model, inputs, *MESH, profile=PROFILE)
    full = solve_prepared(prep, time_limit=10).estimate.peak_memory_bytes
    plan = solve_prepared(prep, time_limit=10, memory_limit=full * MEMORY_FRACTION)
    plan.save(path)
    return plan


def _rank(rank: int, world: int, spec: str, overrides: dict[str, Any], plan_path: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import local_slice, shard
    from autoshard.runtime.execute import placements_of

    mesh = init_device_mesh("cpu", MESH[0], mesh_dim_names=MESH[1])
    coord = tuple(mesh.get_coordinate())
    model, inputs = load(spec, overrides)
    reference = copy.deepcopy(model)
    ref_loss = loss_of(reference, inputs)
    ref_loss.backward()
    ref_grads = {name: p.grad for name, p in reference.named_parameters()}
    sharded = shard(model, mesh, plan_path, inputs, trace_collectives=True)
    loss = loss_of(sharded, inputs)
    loss.backward()
    ok = bool(torch.allclose(loss.detach(), ref_loss.detach(), rtol=RTOL, atol=ATOL))
    grad_err = 0.0
    for name, p in sharded.named_parameters():
        want = ref_grads[name]
        if want is None or p.grad is None:
            ok = ok and want is None and p.grad is None
            continue
        want = local_slice(want, placements_of(sharded.plan.params[name], len(MESH[0])), MESH[0], coord)
        got = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        ok = ok and got.shape == want.shape and bool(torch.allclose(got, want, rtol=RTOL, atol=ATOL))
        if got.shape == want.shape:
            grad_err = max(grad_err, float((got - want).abs().max()))
    return {"ok": ok, "loss_err": float((loss.detach() - ref_loss.detach()).abs()), "grad_err": grad_err,
            "collectives": len(sharded.collective_trace)}


def run_model(label: str, spec: str, overrides: dict[str, Any], work: Path, timeout: float = 600.0) -> RuntimeRow:
    """Solve, then one step on 4 gloo ranks against one device; a failure becomes the row's error."""
    start = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    try:
        plan = solve_plan(spec, overrides, work / "plan.json")
        results = spawn(4, _rank, (spec, overrides, str(work / "plan.json")), work / "ranks", timeout=timeout,
                        collective_timeout_s=120)
    except Exception as exc:  # the table reports it
        first = str(exc).strip().splitlines()
        return RuntimeRow(label, error=f"{type(exc).__name__}: {first[-1] if first else ''}",
                          seconds=time.perf_counter() - start)
    replicated = {"R" * len(MESH[0])}
    return RuntimeRow(
        label, sharded_params=sum(1 for text in plan.params.values() if text not in replicated),
        params=len(plan.params), constants=len(plan.constants),
        collectives=max(r["collectives"] for r in results), loss_err=max(r["loss_err"] for r in results),
        grad_err=max(r["grad_err"] for r in results), equal=all(r["ok"] for r in results),
        seconds=time.perf_counter() - start,
    )


def format_rows(rows: list[RuntimeRow]) -> str:
    """The markdown table."""
    lines = ["| model (one step, 4 gloo ranks) | parameters split / all | tensor constants | collectives per rank "
             "| max loss error | max gradient error | equals one device | s |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.label} | | | | | | error: {r.error} | {r.seconds:.0f} |")
            continue
        lines.append(f"| {r.label} | {r.sharded_params} / {r.params} | {r.constants} | {r.collectives} | "
                     f"{r.loss_err:.1e} | {r.grad_err:.1e} | {'yes' if r.equal else 'NO'} | {r.seconds:.0f} |")
    return "\n".join(lines)


def run_all(only: list[str] | None = None) -> list[RuntimeRow]:
    """Every model of :data:`RUNTIME_MODELS` whose label contains one of ``only`` (all when None)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoshard-zoo-runtime-") as tmp:
        for i, (label, spec, overrides) in enumerate(RUNTIME_MODELS):
            if only and not any(o.lower() in label.lower() for o in only):
                continue
            rows.append(run_model(label, spec, overrides, Path(tmp) / str(i)))
            print(f"done {label}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=None, metavar="TEXT",
                        help="only models whose label contains TEXT (repeatable)")
    args = parser.parse_args(argv)
    rows = run_all(args.only)
    print(format_rows(rows))
    return 0 if rows and all(r.equal for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
