"""What a mesh search found, per layout: the rows of ``plan.options["mesh_search"]``, their table and plot.

Torch-free (``autoshard explain`` reads it). One :class:`LayoutResult` per
layout the search considered (``autoshard.search.mesh_layouts``), with its outcome:

- ``solved``: solved; ``step_s`` and ``peak_memory_bytes`` are the plan's estimate;
- ``cut``: not solved, because its lower bound ``bound_s`` was at or above the
  best step already found (``autoshard.search.mesh_search``: it cannot win);
- ``no_fit``: solved, no plan fits the memory limit;
- ``skipped``: not reached within the search's time limit;
- ``error``: the layout does not apply (a pin for another number of mesh
  dims, a baseline that needs two dims, ...); ``reason`` says why.

The plot shows step time against peak memory for every solved layout, with
the Pareto front (no other layout is both faster and smaller) drawn as a line
and the chosen layout marked.

>>> rows = [LayoutResult((8,), ("dp",), "solved", step_s=2.0, peak_memory_bytes=1.0),
...         LayoutResult((2, 4), ("dp", "tp"), "solved", step_s=1.0, peak_memory_bytes=2.0),
...         LayoutResult((4, 2), ("dp", "tp"), "solved", step_s=1.5, peak_memory_bytes=3.0)]
>>> [r.text for r in pareto_front(rows)]
['2x4', '8']
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from autoshard.figures import save_figure
from autoshard.sizes import byte_unit, format_bytes

__all__ = ["OUTCOMES", "LayoutResult", "pareto_front", "search_rows", "layouts_table", "plot_layouts"]

OUTCOMES = ("solved", "cut", "no_fit", "skipped", "error")


@dataclass(frozen=True, slots=True)
class LayoutResult:
    """One layout of a mesh search and what became of it (module docstring)."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    outcome: str
    """One of :data:`OUTCOMES`."""
    step_s: float | None = None
    """The plan's estimated step (``solved`` only)."""
    peak_memory_bytes: float | None = None
    """The plan's peak memory per device (``solved`` only)."""
    bound_s: float | None = None
    """Lower bound on any plan's step on this layout (None: not built)."""
    solver_status: str | None = None
    """``optimal``, ``timeout``, ... (``solved`` only)."""
    portfolio: str | None = None
    """The expert baseline that won the unproven search on this mesh, if one did."""
    seconds: float = 0.0
    """Wall time spent on it in this run: build, bound, solve (0 when cached)."""
    cached: bool = False
    """Taken from the cache instead of built and solved."""
    reason: str = ""
    """Why it was cut, skipped, did not fit or failed."""
    chosen: bool = False

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome: expected one of {OUTCOMES}, got {self.outcome!r}")
        object.__setattr__(self, "shape", tuple(int(m) for m in self.shape))
        object.__setattr__(self, "dim_names", tuple(str(n) for n in self.dim_names))

    @property
    def text(self) -> str:
        """``8x8``."""
        return "x".join(map(str, self.shape))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"], out["dim_names"] = list(self.shape), list(self.dim_names)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LayoutResult":
        def number(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        return cls(tuple(data["shape"]), tuple(data["dim_names"]), str(data["outcome"]), number("step_s"),
                   number("peak_memory_bytes"), number("bound_s"), data.get("solver_status"), data.get("portfolio"),
                   float(data.get("seconds", 0.0)), bool(data.get("cached", False)), str(data.get("reason", "")),
                   bool(data.get("chosen", False)))


def search_rows(options: Mapping[str, Any]) -> list[LayoutResult]:
    """The rows of a plan's ``options["mesh_search"]`` (empty without a search)."""
    search = options.get("mesh_search")
    if not isinstance(search, Mapping):
        return []
    return [LayoutResult.from_dict(row) for row in search.get("layouts", [])]


def pareto_front(rows: Sequence[LayoutResult]) -> list[LayoutResult]:
    """Solved layouts that no other solved layout beats in both step time and
    peak memory (equal in both counts once), fastest first."""
    solved = sorted((r for r in rows if r.outcome == "solved"), key=lambda r: (r.step_s, r.peak_memory_bytes))
    front: list[LayoutResult] = []
    for r in solved:  # by step: on the front iff smaller than every faster one
        if not front or r.peak_memory_bytes < front[-1].peak_memory_bytes:
            front.append(r)
    return front


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def layouts_table(options: Mapping[str, Any]) -> list[str]:
    """The search's rows as markdown table lines (none without a search)."""
    rows = search_rows(options)
    if not rows:
        return []
    search = options["mesh_search"]
    front = {(r.shape, r.dim_names) for r in pareto_front(rows)}  # by names too: 4x4x4 is a dp,tp and a cp layout
    counts = {o: sum(r.outcome == o for r in rows) for o in OUTCOMES}
    head = (f"mesh search: {search.get('devices')} devices, {search.get('devices_per_node')} per node: "
            f"{len(rows)} layouts, " + ", ".join(f"{n} {o.replace('_', ' ')}" for o, n in counts.items() if n)
            + f" ({sum(r.cached for r in rows)} from cache) in {float(search.get('seconds', 0.0)):.1f} s")
    lines = ["", head, "",
             "| layout | dims | outcome | step ms | bound ms | peak memory | solver | s | note |",
             "|---|---|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        mark = " **chosen**" if r.chosen else ""
        note = "; ".join(x for x in (("Pareto" if (r.shape, r.dim_names) in front else ""), (f"portfolio {r.portfolio}"
                                     if r.portfolio else ""), ("cached" if r.cached else ""), r.reason) if x)
        peak = "-" if r.peak_memory_bytes is None else format_bytes(r.peak_memory_bytes)
        lines.append(f"| {r.text}{mark} | {','.join(r.dim_names)} | {r.outcome.replace('_', ' ')} | {_ms(r.step_s)} "
                     f"| {_ms(r.bound_s)} | {peak} | {r.solver_status or '-'} | {r.seconds:.1f} | {note} |")
    return lines


def plot_layouts(options: Mapping[str, Any], path: str) -> None:
    """Step time against peak memory of every solved layout, the Pareto front
    as a line, the chosen layout circled, as a PNG written atomically.
    ``ValueError`` when the plan has no search or no solved layout."""
    rows = [r for r in search_rows(options) if r.outcome == "solved"]
    if not rows:
        raise ValueError("--plot-layouts: the plan has no solved layouts (it was not solved with --devices)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit, scale = byte_unit(max(r.peak_memory_bytes for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r.peak_memory_bytes / scale for r in rows], [r.step_s * 1e3 for r in rows], color="tab:blue",
               label="solved layout")
    for r in rows:
        ax.annotate(r.text, (r.peak_memory_bytes / scale, r.step_s * 1e3), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    front = sorted(pareto_front(rows), key=lambda r: r.peak_memory_bytes)
    ax.plot([r.peak_memory_bytes / scale for r in front], [r.step_s * 1e3 for r in front], color="tab:orange",
            drawstyle="steps-post", label="Pareto front")
    for r in rows:
        if r.chosen:
            ax.scatter([r.peak_memory_bytes / scale], [r.step_s * 1e3], s=160, facecolors="none",
                       edgecolors="red", linewidths=1.5, label=f"chosen ({r.text})")
    search = options["mesh_search"]
    ax.set_xlabel(f"peak memory per device ({unit})")
    ax.set_ylabel("estimated step (ms)")
    ax.set_title(f"mesh layouts for {search.get('devices')} devices, {search.get('devices_per_node')} per node")
    low = min(r.step_s for r in rows) * 1e3
    high = max(r.step_s for r in rows) * 1e3
    pad = max((high - low) * 0.1, high * 1e-3) if math.isfinite(high) else 1.0
    ax.set_ylim(low - pad, high + pad)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
