"""The accuracy report of ``autoshard calibrate-hardware --check``: predicted
against measured for every held-out item, median and 90th-percentile
relative error per kind and per category (compute, collectives), the
targets, the drift of the machine since the calibration (fit-set items
measured again), and a log-log plot.

Why a text report and a plot: the report is what a reviewer diffs between two
calibrations (``benchmarks/calibration_report.md``); the plot shows at a
glance which op kinds sit off the diagonal, and in which direction.

>>> from autoshard.calibrate.heldout import CheckItem
>>> items = [CheckItem("compute", "matmul", "mm", "synthetic", 1.1e-3, 1e-3),
...          CheckItem("compute", "elementwise", "mul", "synthetic", 0.8e-5, 1e-5)]
>>> s = summarize(items, "compute")
>>> s.items, round(s.median, 2)
(2, 0.15)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from autoshard.calibrate.fit import _quantile
from autoshard.calibrate.heldout import CheckItem
from autoshard.figures import save_figure

__all__ = ["TARGETS", "Summary", "summarize", "markdown_report", "plot_report"]

TARGETS = {"compute": (0.10, 0.30), "collectives": (0.10, 0.30)}
"""Targets per category: (median, p90) of the relative error, held-out set."""

_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute")


@dataclass(frozen=True, slots=True)
class Summary:
    """Relative errors of a set of items."""

    name: str
    items: int
    median: float
    """Median of |error|."""
    p90: float
    """90th percentile of |error|."""
    bias: float
    """Median of the signed error (> 0: the model predicts too slow)."""


def summarize(items: Sequence[CheckItem], name: str) -> Summary:
    """Median, p90 and bias of the relative errors of ``items``."""
    errors = sorted(abs(i.error) for i in items)
    signed = sorted(i.error for i in items)
    if not errors:
        return Summary(name, 0, math.nan, math.nan, math.nan)
    return Summary(name, len(errors), _quantile(errors, 0.5), _quantile(errors, 0.9), _quantile(signed, 0.5))


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e9:.3g} ns"


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0%}"


def markdown_report(items: Sequence[CheckItem], *, header: Sequence[str] = (), scope: Sequence[str] = ()) -> str:
    """The report as markdown: header lines, summary against the targets, which
    check applies (``scope``: ``check_scope.scope_lines``), per kind, the
    machine's drift, then every item.

    >>> from autoshard.calibrate.heldout import CheckItem
    >>> text = markdown_report([CheckItem("compute", "matmul", "mm", "synthetic", 1.1e-3, 1e-3)])
    >>> "| compute | 1 | 10% | 10% | +10% |" in text
    True
    """
    lines = ["# Calibration accuracy report", "", *header, ""]
    lines += ["## Summary (held-out items)", "",
              "| category | items | median error | p90 error | bias | target median / p90 | met |",
              "|---|---:|---:|---:|---:|---|---|"]
    for category, (t_med, t_p90) in TARGETS.items():
        s = summarize([i for i in items if i.category == category], category)
        met = "-" if not s.items else ("yes" if s.median < t_med and s.p90 < t_p90 else "no")
        lines.append(f"| {category} | {s.items} | {_pct(s.median)} | {_pct(s.p90)} | {s.bias:+.0%} | "
                     f"< {t_med:.0%} / < {t_p90:.0%} | {met} |" if s.items else
                     f"| {category} | 0 | - | - | - | < {t_med:.0%} / < {t_p90:.0%} | - |")
    if scope:
        lines += ["", "## Which check applies", "", *scope]
    lines += ["", "## Per kind", "", "| category | kind | items | median error | p90 error | bias |",
              "|---|---|---:|---:|---:|---:|"]
    for category in TARGETS:
        for kind in sorted({i.kind for i in items if i.category == category}):
            s = summarize([i for i in items if i.category == category and i.kind == kind], kind)
            lines.append(f"| {category} | {kind} | {s.items} | {_pct(s.median)} | {_pct(s.p90)} | {s.bias:+.0%} |")
    lines += ["", "Error = (predicted - measured) / measured; bias > 0: the cost model is too slow.", ""]
    reference = [i for i in items if i.category == "reference"]
    if reference:
        lines += ["## Drift of the machine since the calibration", "",
                  "Fit-set items measured again now: measured / predicted should be 1. A median far from 1 means "
                  "the machine itself runs faster or slower than during the calibration (e.g. other users' load on "
                  "a shared host), which shifts every error above by the same factor.", "",
                  "| reference | items | median measured / predicted | min | max |", "|---|---:|---:|---:|---:|"]
        for name, chosen in (("compute", [i for i in reference if i.kind not in _COLLECTIVES]),
                             ("collectives", [i for i in reference if i.kind in _COLLECTIVES])):
            ratios = sorted(i.measured_s / i.predicted_s for i in chosen)
            if ratios:
                lines.append(f"| {name} | {len(ratios)} | {_quantile(ratios, 0.5):.2f} | {ratios[0]:.2f} | "
                             f"{ratios[-1]:.2f} |")
        lines.append("")
    lines += ["## Items", "", "| category | kind | item | source | x | predicted | measured | error |",
              "|---|---|---|---|---:|---:|---:|---:|"]
    order = {name: n for n, name in enumerate((*TARGETS, "reference"))}
    for i in sorted(items, key=lambda i: (order.get(i.category, 9), i.kind, i.measured_s)):
        lines.append(f"| {i.category} | {i.kind} | {i.label} | {i.source} | {i.count} | {_seconds(i.predicted_s)} | "
                     f"{_seconds(i.measured_s)} | {i.error:+.0%} |")
    return "\n".join(lines) + "\n"


def plot_report(items: Sequence[CheckItem], path: str, *, title: str = "") -> None:
    """Log-log scatter of predicted against measured seconds, one colour per
    kind (circles: compute, triangles: collectives), with the diagonal and
    the +-35 % band. Needs matplotlib (``pip install matplotlib``)."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot: matplotlib is not installed (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [i for i in items if i.category in TARGETS]  # held-out only
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    kinds = sorted({(i.category, i.kind) for i in items})
    cmap = plt.get_cmap("tab10")
    for n, (category, kind) in enumerate(kinds):
        chosen = [i for i in items if i.category == category and i.kind == kind]
        ax.scatter([i.measured_s for i in chosen], [i.predicted_s for i in chosen], s=22, alpha=0.8,
                   color=cmap(n % 10), marker="o" if category == "compute" else "^", label=f"{kind} ({len(chosen)})")
    values = [v for i in items for v in (i.measured_s, i.predicted_s) if v > 0]
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=1)
        for factor in (1.35, 1 / 1.35):
            ax.plot([lo, hi], [lo * factor, hi * factor], color="grey", linewidth=0.8, linestyle="--")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured seconds")
    ax.set_ylabel("predicted seconds (cost model)")
    comp, coll = summarize([i for i in items if i.category == "compute"], ""), summarize(
        [i for i in items if i.category == "collectives"], "")
    subtitle = f"compute median {_pct(comp.median)} p90 {_pct(comp.p90)}; collectives median {_pct(coll.median)} p90 {_pct(coll.p90)}"
    ax.set_title(f"{title}\n{subtitle}" if title else subtitle, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    save_figure(fig, path)
