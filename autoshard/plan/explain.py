"""What a plan does, for a person: the tables and plot of ``autoshard explain PLAN.json``
(the command itself: :mod:`autoshard.cli.explain`).

Tables of the estimate, the recomputation (what the backward recomputes,
per block, the time it costs and the memory it saves), parameter placements
and the ten costliest redistributions and, with ``--plot``, a PNG of live
memory over the step. A plan chosen by a mesh search (``autoshard solve
--devices``) also gets the table of every layout tried, and
``--plot-layouts`` draws their step time against peak memory
(``autoshard.plan.layout_report``).

>>> # autoshard explain plan.json --plot memory.png
"""

from __future__ import annotations

from collections import Counter

from autoshard.figures import save_figure
from autoshard.plan.format import Fingerprint, Plan
from autoshard.plan.layout_report import layouts_table
from autoshard.plan.explain_pipeline import pipeline_lines
from autoshard.sizes import byte_unit, format_bytes

__all__ = ["explain_text", "recompute_lines", "expert_parallel_lines", "context_parallel_lines", "plot_memory"]


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def explain_text(plan: Plan, *, top: int = 10, params_limit: int = 40) -> str:
    """The plan as markdown-style tables (no colours: pipes and logs read it too)."""
    fp = plan.fingerprint
    e = plan.estimate
    lines = [
        f"plan for mesh {'x'.join(map(str, fp.mesh_shape))} ({','.join(fp.dim_names)}), profile {fp.profile.split('@')[0]}, "
        f"solver {plan.solver.backend} {plan.solver.status}"
        + (f" (gap {plan.solver.gap:.2e})" if plan.solver.gap is not None else "")
        + f" in {plan.solver.seconds:.2f} s",
    ]
    if plan.options.get("baseline"):
        lines.append(f"baseline: {plan.options['baseline']}")
    fix = plan.options.get("profile_correction") or {}
    if fix.get("mode") not in (None, "off"):  # the estimate is for the machine that was measured
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in fix.get("ratios", {}).items())
        lines.append(f"profile corrected for {fix.get('machine', {}).get('cpu', '?')} "
                     f"({fix.get('machine', {}).get('ranks', '?')} ranks, {fix.get('date', '?')}): "
                     f"measured / profile {ratios}")
    lines += [
        "",
        "| estimate | value |",
        "|---|---:|",
        f"| step | {_ms(e.step_s)} |",
        f"| compute | {_ms(e.compute_s)} |",
        f"| communication | {_ms(e.comm_s)} |",
        f"| local re-layouts | {_ms(e.relayout_s)} |",
        f"| peak memory | {format_bytes(e.peak_memory_bytes)} |",
    ]
    if e.reserved_bytes is not None:  # GPU profiles: what the caching allocator keeps beside the live tensors
        lines.append(f"| reserved by the CUDA caching allocator | {format_bytes(e.reserved_bytes)} |")
    if e.recompute_s:
        lines.append(f"| recomputation | {_ms(e.recompute_s)} |")
    if e.memory_limit_bytes is not None:
        lines.append(f"| memory limit | {format_bytes(e.memory_limit_bytes)} ({'fits' if e.fits else 'DOES NOT FIT'}) |")
    lines += recompute_lines(plan)
    lines += expert_parallel_lines(plan)
    lines += context_parallel_lines(plan)
    lines += pipeline_lines(plan)
    lines += ["", "| parameter | placement |", "|---|---|"]
    names = sorted(plan.params)
    for name in names[:params_limit]:
        lines.append(f"| {name} | {plan.params[name]} |")
    if len(names) > params_limit:
        counts = Counter(plan.params[n] for n in names[params_limit:])
        rest = ", ".join(f"{p} x{c}" for p, c in counts.most_common())
        lines.append(f"| ... {len(names) - params_limit} more | {rest} |")
    if plan.inputs:
        lines += ["", "| input | placement |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in plan.inputs.items()]
    costly = sorted(plan.redistributions, key=lambda r: -r.cost_s)[:top]
    lines += ["", f"| top {len(costly)} redistributions (of {len(plan.redistributions)}) | from -> to | steps | time |",
              "|---|---|---|---:|"]
    for r in costly:
        steps = " ; ".join(f"{s.collective}[{','.join(map(str, s.mesh_dims))}]" for s in r.steps) or "-"
        lines.append(f"| {r.tensor} -> {r.to} | {r.src} -> {r.dst} | {steps} | {_ms(r.cost_s)} |")
    if plan.buckets:
        lines += ["", f"| gradient bucket ({len(plan.buckets)}, one collective each) | gradients | size | time |",
                  "|---|---:|---:|---:|"]
        for b in plan.buckets:
            lines.append(f"| {b.collective}[{','.join(map(str, b.mesh_dims))}]({b.reduce_op}) {b.dtype.replace('torch.', '')} "
                         f"| {len(b.members)} | {format_bytes(b.bytes)} | {_ms(b.cost_s)} |")
    lines += layouts_table(plan.options)
    return "\n".join(lines)


def expert_parallel_lines(plan: Plan) -> list[str]:
    """The ops run expert-parallel (``PlanNode.exchange``): mesh dim, degree (its ranks) and the
    load imbalance they were priced at; none for a plan without them.

    >>> # | experts (autoshard.experts.default) | model.layers.0 | 0 (ep) | 4 | 1.25 |
    """
    nodes = [n for n in plan.nodes if n.exchange is not None and n.exchange[0] == "expert_dispatch"]
    if not nodes:
        return []
    fp = plan.fingerprint
    imbalance = plan.options.get("expert_imbalance", "?")
    lines = ["", f"expert parallel: {len(nodes)} ops exchange tokens with their experts' ranks "
             f"(all-to-all of run-time sizes), priced at load imbalance {imbalance}",
             "", "| op | block | mesh dim | degree | imbalance |", "|---|---|---|---:|---:|"]
    for n in nodes:
        dim, degree = _exchange_dim(fp, n.exchange[1])
        lines.append(f"| {n.name} ({n.op}) | {n.region or '-'} | {dim} | {degree} | {imbalance} |")
    return lines


def _exchange_dim(fp: Fingerprint, dim: int) -> tuple[str, int | str]:
    """An exchange's mesh dim as a table shows it (``1 (cp)``) and its degree (``?`` past the mesh)."""
    name = fp.dim_names[dim] if dim < len(fp.dim_names) else ""
    degree = fp.mesh_shape[dim] if dim < len(fp.mesh_shape) else "?"
    return f"{dim}{f' ({name})' if name else ''}", degree


_CONTEXT_KINDS = {"context_gather": "K/V all-gathered, contiguous rows",
                  "context_gather_balanced": "K/V all-gathered, causal head-and-tail chunks",
                  "context_ring": "K/V passed around the ring, contiguous rows",
                  "context_whole_kv": "K/V whole (gathered by the plan), contiguous rows",
                  "context_whole_kv_balanced": "K/V whole (gathered by the plan), causal head-and-tail chunks"}


def context_parallel_lines(plan: Plan) -> list[str]:
    """The attention ops split along the sequence (``PlanNode.exchange`` of a context kind):
    exchange kind, mesh dim and degree (the CP group's ranks); none for a plan without them.

    >>> # | _scaled_dot_product_flash_attention_for_cpu (aten...) | layers.0 | context_gather | 1 (cp) | 2 |
    """
    nodes = [n for n in plan.nodes if n.exchange is not None and n.exchange[0] in _CONTEXT_KINDS]
    if not nodes:
        return []
    fp = plan.fingerprint
    kinds = sorted({n.exchange[0] for n in nodes})
    lines = ["", f"context parallel: {len(nodes)} attention ops split along the sequence "
             f"({'; '.join(f'{k}: {_CONTEXT_KINDS[k]}' for k in kinds)})",
             "", "| op | block | kind | mesh dim | degree |", "|---|---|---|---|---:|"]
    for n in nodes:
        dim, degree = _exchange_dim(fp, n.exchange[1])
        lines.append(f"| {n.name} ({n.op}) | {n.region or '-'} | {n.exchange[0]} | {dim} | {degree} |")
    return lines


def recompute_lines(plan: Plan) -> list[str]:
    """What the backward recomputes, one row per group of blocks that recompute
    the same ops (not one per op), with the time paid and the memory saved."""
    e = plan.estimate
    policy = plan.options.get("recompute", "auto")
    if not plan.recompute:
        return ["", f"recomputation: none (policy {policy})"]
    ops = {n.name: n for n in plan.nodes}
    by_region: dict[str, Counter] = {}
    for name in plan.recompute:
        node = ops.get(name)
        region = (node.region if node is not None else None) or "(no block)"
        by_region.setdefault(region, Counter())[node.op.replace("aten.", "").split(".")[0] if node else name] += 1
    groups: dict[tuple, list[str]] = {}
    for region, counts in by_region.items():
        groups.setdefault(tuple(sorted(counts.items())), []).append(region)
    saved = (e.peak_without_recompute_bytes or e.peak_memory_bytes) - e.peak_memory_bytes
    lines = ["", f"recomputation (policy {policy}): {len(plan.recompute)} ops in {len(by_region)} blocks, "
             f"{_ms(e.recompute_s)} per step, peak {format_bytes(e.peak_memory_bytes)} instead of "
             f"{format_bytes(e.peak_without_recompute_bytes or e.peak_memory_bytes)} (saves {format_bytes(saved)})",
             "", "| blocks | ops recomputed in each |", "|---|---|"]
    for key, regions in sorted(groups.items(), key=lambda kv: kv[1][0]):
        span = regions[0] if len(regions) == 1 else f"{regions[0]} ... {regions[-1]} ({len(regions)})"
        what = ", ".join(f"{op} x{c}" if c > 1 else op for op, c in sorted(key, key=lambda oc: (-oc[1], oc[0])))
        lines.append(f"| {span} | {what} |")
    return lines


def plot_memory(plan: Plan, path: str) -> None:
    """Live memory over the step's time axis, with the limit, as a PNG (in
    the unit of the peak: a small model's curve is not flat at 0 GiB)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = list(plan.memory_timeline)
    unit, scale = byte_unit(plan.estimate.peak_memory_bytes)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if points:
        xs = [t for t, _ in points]
        ys = [b / scale for _, b in points]
        ax.step(xs, ys, where="post", label="live memory")
    limit = plan.estimate.memory_limit_bytes
    # a limit far above the curve would flatten it: then it is named in the title only
    if limit is not None and limit <= 3 * plan.estimate.peak_memory_bytes:
        ax.axhline(limit / scale, color="red", linestyle="--", label="limit")
    ax.set_xlabel("op index in the training step (forward, backward, optimizer)")
    ax.set_ylabel(f"{unit} per rank")
    title = f"memory over one step (peak {format_bytes(plan.estimate.peak_memory_bytes)}"
    ax.set_title(title + (f", limit {format_bytes(limit)})" if limit is not None and limit < 1e20 else ")"))
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    fig.tight_layout()
    save_figure(fig, path)
