"""``autoshard explain``'s pipeline lines: stages, schedule, microbatches and the bubble.

For a plan with a ``pipeline`` section (``autoshard.plan.pipeline_section``):
one row per stage (its rank on the pipeline dim, its blocks, its modules, and where the
search priced them, the forward and backward of one microbatch and its rank's peak
memory), then the schedule, the microbatches and the bubble: the idle share of the
busiest rank's step, simulated by ``costmodel.pipeline_simulate`` over the schedule's
per-rank orders with the stage times the section records (without them, one time unit
per block forward and two backward: the bubble of the cut's balance alone, said so).
:func:`plot_schedule` draws that simulation's per-rank timeline (``autoshard explain
--plot-schedule``): every forward, backward and weight-gradient action of every
microbatch at its simulated start and end, the gaps between them the bubble. The
search priced each stage with its input and weight backward halves of the backward
(``autoshard.search.pipeline``), the point-to-point sends and the reductions and
optimizer after the last microbatch; the section records the stage times, not the
sends, so the timeline here is the compute part (the summary line gives the
search's bubble with the sends beside it). A line says what the stages recompute
(the section's ``recompute``: nothing, or each block's forward before its backward).

>>> from autoshard.plan.pipeline_section import build_pipeline_section
>>> s = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=4, batch_size=8,
...                            block_paths=("layers.0", "layers.1"), cuts=(1,))
>>> round(simulated_bubble(s)[0], 3)
0.2
"""

from __future__ import annotations

from costmodel.pipeline_schedules import build_schedule
from costmodel.pipeline_simulate import PipelineSimulation, StageCost, simulate_pipeline

from autoshard.plan.format import Plan
from autoshard.sizes import format_bytes
from autoshard.plan.pipeline_section import PipelineSection

__all__ = ["pipeline_lines", "simulated_bubble", "section_simulation", "plot_schedule"]

_RECOMPUTE_SAYS = {"none": "each block keeps what its backward reads",
                   "full": "each block's forward again before its backward, keeping only its input"}
"""What each of ``pipeline_section.RECOMPUTE_POLICIES`` does, for the recompute line."""
_PARTIAL_SAYS = "each stage's first blocks checkpointed, the rest keep what their backward reads"
"""The same for a ``partial`` section (the stages' counts follow it)."""
_MODULES_SHOWN = 4
"""Module paths listed per stage before ``...``: a 126-block stage stays one row."""


def _priced(section: PipelineSection) -> bool:
    return all(st.forward_s is not None and st.backward_s is not None for st in section.stages)


def simulated_bubble(section: PipelineSection) -> tuple[float, bool]:
    """(bubble fraction of the section's schedule simulated with its stage times, whether those
    times were priced) (module docstring)."""
    sim, priced = section_simulation(section)
    return sim.bubble_fraction, priced


def section_simulation(section: PipelineSection) -> tuple[PipelineSimulation, bool]:
    """The section's schedule simulated with its stage times (the search's split of each backward
    into input and weight halves), and whether those times were priced (module docstring)."""
    priced = _priced(section)
    costs = []
    for st in section.stages:
        if priced:
            fwd, bwd = float(st.forward_s), float(st.backward_s)  # type: ignore[arg-type]
        else:
            fwd, bwd = float(st.end_block - st.first_block), 2.0 * (st.end_block - st.first_block)
        costs.append(StageCost(forward_s=fwd, backward_input_s=bwd / 2, backward_weight_s=bwd / 2,
                               full_backward_s=bwd))
    schedule = build_schedule(section.schedule, n_ranks=section.n_ranks, n_microbatches=section.n_microbatches,
                              stages_per_rank=section.stages_per_rank)
    return simulate_pipeline(schedule, costs), priced


def _modules(paths: tuple[str, ...]) -> str:
    if len(paths) <= _MODULES_SHOWN:
        return ", ".join(paths)
    return f"{', '.join(paths[:2])}, ... ({len(paths) - 3} more), {paths[-1]}"


def pipeline_lines(plan: Plan) -> list[str]:
    """The plan's pipeline as a table and a summary line; none for a plan of one stage.

    >>> # | stage | rank (pp) | blocks | modules | forward / µbatch | backward / µbatch | rank peak |
    """
    s = plan.pipeline
    if s is None:
        return []
    lines = ["", f"pipeline: {s.n_stages} stages on {s.n_ranks} ranks of {s.mesh_dim} ({s.stages_per_rank} per rank), "
             f"each stage {s.data_parallel} over the other mesh dims (the runtime runs that layout, not the per-op "
             "placements below)",
             "", f"| stage | rank ({s.mesh_dim}) | blocks | modules | forward / microbatch | backward / microbatch "
             "| rank peak |", "|---:|---:|---|---|---:|---:|---:|"]
    for st in s.stages:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1e3:.3f} ms"
        peak = "-" if st.peak_bytes is None else format_bytes(st.peak_bytes)
        lines.append(f"| {st.index} | {st.rank} | {st.first_block}-{st.end_block - 1} | {_modules(st.modules)} "
                     f"| {ms(st.forward_s)} | {ms(st.backward_s)} | {peak} |")
    bubble, priced = simulated_bubble(s)
    summary = (f"schedule {s.schedule}, {s.n_microbatches} microbatches of {s.batch_size // s.n_microbatches} "
               f"sequences (batch {s.batch_size}), bubble {bubble:.1%} "
               + ("(simulated with the priced stage times" if priced else "(simulated from the block counts: "
                  "not priced"))
    if s.bubble_fraction is not None:
        summary += f"; the search's, sends included: {s.bubble_fraction:.1%}"
    summary += ")"
    if s.step_s is not None:
        summary += f"; priced step {s.step_s * 1e3:.3f} ms"
    if s.send_bytes:
        summary += f"; {format_bytes(s.send_bytes)} sent per boundary per microbatch"
    tail = ["", summary, f"recompute: {s.recompute} ({_RECOMPUTE_SAYS.get(s.recompute, _PARTIAL_SAYS)})"]
    if s.recompute == "partial":
        tail[-1] += "; checkpointed blocks per stage " + ", ".join(
            f"{s.checkpointed_blocks(st.index)}/{st.n_blocks}" for st in s.stages)
        if any(s.selective_blocks(st.index) for st in s.stages):  # op-level blocks after the checkpointed ones
            tail[-1] += "; selective (op-level) blocks per stage " + ", ".join(
                f"{s.selective_blocks(st.index)}/{st.n_blocks}" for st in s.stages)
        if any(s.all_mm_blocks(st.index) for st in s.stages):  # after the selective ones
            tail[-1] += "; all-mm (op-level, every matmul saved) blocks per stage " + ", ".join(
                f"{s.all_mm_blocks(st.index)}/{st.n_blocks}" for st in s.stages)
    if s.tensor_parallel:
        styles = [style for _, style in s.tensor_parallel]
        tail.append(f"tensor parallel inside the stages (torch's parallelize_module on tp): "
                    f"{styles.count('colwise')} linears split by column, {styles.count('rowwise')} by row")
    return [*lines, *tail]


_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#dd8452", "W": "#55a868"}
_LABELS = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)"}


def plot_schedule(plan: Plan, path: str) -> None:
    """Draw the pipeline's per-rank timeline (:func:`section_simulation`) into the PNG ``path``:
    one row per rank of the pipeline dim, one box per action labelled ``stage:microbatch``, the
    white gaps the bubble. ``ValueError`` for a plan without a pipeline section; needs matplotlib.

    >>> # plot_schedule(Plan.load("plan.json"), "schedule.png")
    """
    if plan.pipeline is None:
        raise ValueError("--plot-schedule: the plan has no pipeline section (solve it on a mesh with a 'pp' dim)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    section = plan.pipeline
    sim, priced = section_simulation(section)
    scale, unit = (1e3, "ms") if priced else (1.0, "block units")
    per_rank = len(sim.actions) / max(1, section.n_ranks)
    fig, ax = plt.subplots(figsize=(min(40.0, max(8.0, 0.25 * per_rank)), 1.0 + 0.6 * section.n_ranks))
    for timed in sim.actions:
        kind = timed.action.kind.value
        start, width = timed.start_s * scale, (timed.end_s - timed.start_s) * scale
        ax.broken_barh([(start, width)], (timed.rank - 0.4, 0.8), facecolors=_COLOURS[kind], edgecolor="white")
        if width > 0:
            ax.text(start + width / 2, timed.rank, f"{timed.action.stage}:{timed.action.microbatch}", ha="center",
                    va="center", fontsize=6, color="white", clip_on=True)
    ax.set_yticks(range(section.n_ranks), [f"rank {r}" for r in range(section.n_ranks)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit}); box = stage:microbatch")
    ax.set_title(f"{section.schedule}: {section.n_stages} stages on {section.n_ranks} ranks, {section.n_microbatches} "
                 f"microbatches, bubble {sim.bubble_fraction:.1%}" + ("" if priced else " (block counts, not priced)"))
    kinds = sorted({t.action.kind.value for t in sim.actions}, key="FBIW".index)
    ax.legend(handles=[Patch(color=_COLOURS[k], label=_LABELS[k]) for k in kinds], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
