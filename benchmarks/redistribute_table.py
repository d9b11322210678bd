"""Redistribution table: the planner's step sequence and cost for every pair of
common placements, next to the per-dim (unfused) plan.

For each profile (default H100, A100), mesh (default 8x8 and 2x4x8) and tensor
size (default 1 MiB, 64 MiB, 1 GiB of bf16), every pair of placements built
from ``R``, ``S(0)``, ``S(1)``, ``P(sum)`` per mesh dim (16 on a 2-D mesh, 64 on
a 3-D one) is planned twice: with fusion on flattened groups and without.
Prints a summary per configuration, the planner time, and an excerpt of the
pairs where fusion helps most; ``-o FILE`` writes every row (markdown or CSV).

    python benchmarks/redistribute_table.py                   # summary + excerpt
    python benchmarks/redistribute_table.py -o table.md       # full table too
    python benchmarks/redistribute_table.py --profiles cpu-gloo --meshes 2x2 --sizes 1MiB

Step notation: ``AG`` all_gather, ``AR`` all_reduce, ``RS`` reduce_scatter,
``A2A`` all_to_all, ``PERM`` permute, ``slice`` / ``zero`` / ``copy`` / ``pad``
local ops; ``[0,1]`` the mesh dims (several = one collective on the flattened
group), ``d0`` the tensor dim, ``d0>d1`` all_to_all from S(0) to S(1).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/redistribute_table.py`: re-executed as the module

import argparse
import csv
import io
import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, Replicate, Shard, format_placements
from costmodel.redistribute import clear_cache, plan_redistribute
from costmodel.redistribute_steps import RedistributePlan, RedistributeStep
from hw_profiles import load

_ABBR = {
    "all_gather": "AG", "all_reduce": "AR", "reduce_scatter": "RS", "all_to_all": "A2A", "permute": "PERM",
    "local_slice": "slice", "local_zero_fill": "zero", "local_copy": "copy", "local_zero_pad": "pad",
}
_SIZES = {"1MiB": 2**20, "64MiB": 2**26, "1GiB": 2**30}
_ITEMSIZE = 2  # bf16


@dataclass(frozen=True, slots=True)
class Row:
    profile: str
    mesh: str
    size: str
    src: str
    dst: str
    fused: RedistributePlan
    unfused: RedistributePlan

    @property
    def speedup(self) -> float:
        return self.unfused.cost_s / self.fused.cost_s if self.fused.cost_s else 1.0


def step_text(step: RedistributeStep) -> str:
    """``AG[0,1]d0``-style short form of one step."""
    dims = ",".join(str(d) for d in step.mesh_dims)
    detail = ""
    if step.tensor_dim is not None:
        detail = f"d{step.tensor_dim}"
        if step.split_tensor_dim is not None:
            detail += f">d{step.split_tensor_dim}"
    return f"{_ABBR[step.collective]}[{dims}]{detail}"


def plan_text(plan: RedistributePlan) -> str:
    return " ; ".join(step_text(s) for s in plan.steps) or "-"


def tensor_shape(nbytes: int) -> tuple[int, int]:
    """A 2-D bf16 tensor of ``nbytes``, columns a power of two up to 8192."""
    numel = nbytes // _ITEMSIZE
    cols = min(8192, 2 ** (int(numel**0.5).bit_length() - 1))
    return numel // cols, cols


def common_placements(mesh_ndim: int) -> list[tuple]:
    per_dim = [Replicate(), Shard(0), Shard(1), Partial("sum")]
    return list(itertools.product(per_dim, repeat=mesh_ndim))


def run(profiles: list[str], meshes: list[str], sizes: list[str]) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    timings: list[str] = []
    for name in profiles:
        profile = load(name)
        for mesh_text in meshes:
            mesh = MeshSpec.from_text(mesh_text)
            pls = common_placements(mesh.ndim)
            for size in sizes:
                shape = tensor_shape(_SIZES[size])
                clear_cache()
                start = time.perf_counter()
                fused = {(s, d): plan_redistribute(s, d, mesh, shape, _ITEMSIZE, profile) for s in pls for d in pls}
                elapsed = time.perf_counter() - start
                unfused = {
                    (s, d): plan_redistribute(s, d, mesh, shape, _ITEMSIZE, profile, fuse=False) for s in pls for d in pls
                }
                timings.append(
                    f"{name} {mesh_text} {size}: {len(pls) ** 2} pairs planned in {elapsed * 1e3:.0f} ms (uncached)"
                )
                for (s, d), plan in fused.items():
                    rows.append(
                        Row(name, mesh_text, size, format_placements(s), format_placements(d), plan, unfused[(s, d)])
                    )
    return rows, timings


def summary(rows: list[Row]) -> str:
    out = io.StringIO()
    out.write("| profile | mesh | size | pairs | fused cheaper | fused steps used | mean speedup | max speedup |\n")
    out.write("|---|---|---|---:|---:|---:|---:|---:|\n")
    for key, group in itertools.groupby(rows, key=lambda r: (r.profile, r.mesh, r.size)):
        group = list(group)
        cheaper = sum(r.fused.cost_s < r.unfused.cost_s * (1 - 1e-9) for r in group)
        fused_used = sum(any(len(s.mesh_dims) > 1 and s.collective != "permute" for s in r.fused.steps) for r in group)
        speedups = [r.speedup for r in group]
        out.write(
            f"| {key[0]} | {key[1]} | {key[2]} | {len(group)} | {cheaper} | {fused_used} | "
            f"{sum(speedups) / len(speedups):.2f}x | {max(speedups):.2f}x |\n"
        )
    return out.getvalue()


def markdown(rows: list[Row]) -> str:
    out = io.StringIO()
    out.write("| profile | mesh | size | src | dst | plan | cost (us) | unfused plan | unfused (us) |\n")
    out.write("|---|---|---|---|---|---|---:|---|---:|\n")
    for r in rows:
        out.write(
            f"| {r.profile} | {r.mesh} | {r.size} | `{r.src}` | `{r.dst}` | {plan_text(r.fused)} | "
            f"{r.fused.cost_s * 1e6:.1f} | {plan_text(r.unfused)} | {r.unfused.cost_s * 1e6:.1f} |\n"
        )
    return out.getvalue()


def csv_text(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["profile", "mesh", "size", "src", "dst", "plan", "cost_s", "unfused_plan", "unfused_cost_s"])
    for r in rows:
        writer.writerow([r.profile, r.mesh, r.size, r.src, r.dst, plan_text(r.fused), r.fused.cost_s,
                         plan_text(r.unfused), r.unfused.cost_s])
    return out.getvalue()


HEADLINE = {
    2: [("S(0)S(0)", "RR"), ("P(sum)P(sum)", "RR"), ("P(sum)P(sum)", "S(0)S(0)"), ("S(0)S(0)", "S(1)S(1)"),
        ("P(sum)R", "RR"), ("S(0)R", "RS(0)"), ("RR", "P(sum)P(sum)")],
    3: [("S(0)S(0)S(0)", "RRR"), ("P(sum)P(sum)P(sum)", "RRR"), ("S(0)RS(0)", "RRR"), ("P(sum)RP(sum)", "RRR"),
        ("S(0)S(0)R", "RRS(0)"), ("P(sum)P(sum)R", "S(0)S(0)R"), ("S(0)S(1)R", "RRR")],
}


def _collective_fused(row: Row) -> bool:
    return any(len(s.mesh_dims) > 1 and s.collective in _ABBR and not s.collective.startswith("local") and s.collective != "permute" for s in row.fused.steps)


def excerpt(rows: list[Row], per_config: int) -> list[Row]:
    """Headline pairs, then the pairs where a fused collective gains most, per configuration."""
    picked: list[Row] = []
    for _, group in itertools.groupby(rows, key=lambda r: (r.profile, r.mesh, r.size)):
        group = list(group)
        ndim = group[0].mesh.count("x") + 1
        wanted = HEADLINE.get(ndim, [])
        heads = [r for pair in wanted for r in group if (r.src, r.dst) == pair]
        gains = sorted((r for r in group if _collective_fused(r) and r not in heads), key=lambda r: (-r.speedup, r.src, r.dst))
        picked.extend(heads + gains[:per_config])
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="h100-sxm-80gb,a100-sxm-80gb")
    parser.add_argument("--meshes", default="8x8,2x4x8")
    parser.add_argument("--sizes", default="1MiB,64MiB,1GiB", help=f"any of {', '.join(_SIZES)}")
    parser.add_argument("--excerpt", type=int, default=3, help="rows per configuration in the printed excerpt")
    parser.add_argument("-o", "--output", help="write every row to this file (.csv for CSV, else markdown)")
    args = parser.parse_args(argv)
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in _SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {unknown} (expected {', '.join(_SIZES)})")
    rows, timings = run(args.profiles.split(","), args.meshes.split(","), sizes)
    print("## Planner time\n")
    print("\n".join(f"- {t}" for t in timings))
    print("\n## Summary (fused search vs per-mesh-dim search)\n")
    print(summary(rows))
    print(f"## Excerpt: headline pairs, then {args.excerpt} per configuration where a fused collective gains most\n")
    print(markdown(excerpt(rows, args.excerpt)))
    if args.output:
        text = csv_text(rows) if args.output.endswith(".csv") else markdown(rows)
        Path(args.output).write_text(text)
        print(f"{len(rows)} rows written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
