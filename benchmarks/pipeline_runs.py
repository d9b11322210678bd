"""Published pipeline-parallel runs of LLaMA 3.1 405B, predicted; and autoshard's own pipeline.

Each published run is priced with its layout pinned (``autoshard.search.pipeline``): the
stage sub-mesh ``dp x tp`` solved with the published layout (``fsdp+tp``, full activation
checkpointing, bf16 with fp32 master weights, gradient reductions and AdamW state) at
the microbatch's batch, per-block costs from two depths (``pipeline_blocks``), then the
stage cuts and the named schedule simulated at the published ``pp``, ``m`` and ``v``.
Beside it, autoshard's own choice: the pipeline layouts of the same GPUs (``pp`` across
nodes, ``tp`` 8 inside; :data:`AUTO_PP`), layouts whose FLOPs bound cannot beat the best
found cut, each stage priced with the ``fsdp+tp`` layout without recomputation and, where
that is memory-bound, with full recomputation and with each stage checkpointing only its first
blocks, a count per stage (``autoshard.search.pipeline``, Recomputation (R4),
``autoshard.search.pipeline_partial``: what the stage runtime runs), every schedule, ``m`` and
``v`` priced, the fastest that fits.
Under full recomputation a block keeps its input sequence-split over ``tp``
(``autoshard.search.pipeline_blocks``, Full recomputation), as torchtitan's runs keep it; without,
its residual stream (``pipeline_blocks`` (h'')), as the stage runtime runs a ``tp`` layout. The
``fsdp+tp`` table splits the embedding and the head over the vocabulary on ``tp``, as torchtitan and
the stage runtime (``autoshard.runtime.pipeline_tp``) run them. (Free stage placements are not
used here: a stage solved alone, without the pipeline's microbatches in flight, keeps its
optimizer state replicated where it fits, and then no pipeline of it fits.)

A row with ``engine`` options (torchtitan's: Float8 linears, float8 FSDP all-gathers, async TP)
reprices each depth's solved stage plan with them (:func:`engine_figures`,
``autoshard.assembly.engine_pricing``) before the per-block split; the bf16 pricing of the
same plans is shown beside it.

A row with ``cp > 1`` (Llama 3's long-context row, issue 56) has the stage sub-mesh ``dp x cp x tp``,
priced by ``benchmarks.pipeline_context`` (the ``fsdp+tp`` pins with the sequence on ``cp``, Llama 3's
balanced all-gather CP exchange, what-ifs for Meta's variant); the schedule then sees ``dp x cp``
in the data-parallel place (each rank sends ``1 / (dp cp tp)`` of a microbatch's activations).

Predicted tokens/s/GPU = global batch x sequence / (step x GPUs) (torchtitan's ``tps``);
TFLOPs/GPU = ``6 N + 12 L d t`` FLOPs per token (torchtitan's count, no recomputation) x
tokens / (step x GPUs), as the Llama 3 paper's figure is read here (the paper does not say how
it counts; at 131,072 tokens attention's term is 57 % of the count, and counting it causal,
``6 L d t``, gives 29 % less: both are shown for the cp row).

    python -m benchmarks.pipeline_runs                    # every row but the long-context one, table on stdout
    python -m benchmarks.pipeline_runs --only tt-405b-1f1b
    python -m benchmarks.pipeline_runs --only meta-405b-128k   # Llama 3's 131,072-token row (issue 56)
    python -m benchmarks.pipeline_runs -o benchmarks/results/pipeline_runs.md
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/pipeline_runs.py`: re-executed as the module

import argparse
import functools
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MethodType
from typing import Any

from benchmarks.common.models import load
from benchmarks.pipeline_context import backward_rate_what_if, context_what_ifs, price_context_blocks

TT_2412 = ("https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"
           " Table 5 (torchtitan 9dec370, 2024-12)")
LLAMA3_PAPER = "The Llama 3 Herd of Models (arXiv 2407.21783), Table 4"
SEQ = 8192
N_LAYERS = 126
DIM = 16384


TT_ENGINE = ("float8_linears", "float8_all_gather", "async_tp")
"""torchtitan's 405B rows: torch.compile + Float8 linears (torchao tensorwise) with float8 FSDP all-gathers
(``enable_fsdp_float8_all_gather = true`` in torchtitan's ``train_configs/llama3_405b.toml`` at 9dec370,
the benchmark's commit; Table 5 itself does not list it) + async TP."""

TT_DEFAULTS = ("torchtitan at 9dec370: `pipeline_parallel_microbatches` unset means one microbatch per pp rank "
               "(torchtitan/parallelisms/pipelining_utils.py, build_pipeline_schedule), so local batch 32 runs as "
               "m = 8 microbatches of 4 sequences; a multi-stage schedule without split points gets 2 stages a rank "
               "(generate_split_points)")
"""Where the torchtitan rows' microbatches and stages per rank come from (the table gives neither)."""


@dataclass(frozen=True, slots=True)
class PipelineRun:
    """One published run (or autoshard's own search, ``schedule=None``) and how it ran."""

    key: str
    title: str
    profile: str
    gpus: int
    batch: int
    """Global batch, sequences of :attr:`seq` tokens."""
    layout: tuple[int, int, int] | None
    """(pp, dp, tp), ``dp`` the data-parallel degree alone (``cp`` apart); None: autoshard searches the layouts."""
    schedule: str | None
    n_microbatches: int | None
    stages_per_rank: int | None
    published_tps: float | None
    published_tflops: float | None
    source: str
    not_modeled: str
    titan_loss: bool = True
    recompute: str = "full"
    """The stages' activation recomputation policy (``autoshard.graph.recompute_policy``); ``partial``
    (a pinned row): each stage's checkpointed blocks chosen, both policies priced (``pipeline_partial``)."""
    engine: tuple[str, ...] = ()
    """The engine features the run used, priced (:data:`ENGINE_OPTIONS`; empty: bf16, autoshard's runtime)."""
    cp: int = 1
    """Context-parallel degree: the stage sub-mesh is ``dp x cp x tp`` (``benchmarks.pipeline_context``)."""
    seq: int = SEQ
    """Tokens a sequence."""
    selective: bool = True
    """autoshard's own rows and pinned ``partial`` ones: the op-level (``selective``) policy priced as a
    third block kind beside kept and checkpointed blocks, and the one saving every matmul (``selective_all_mm``) as a fourth
    (``autoshard.search.pipeline_selective``); False: the two kinds alone."""

    @property
    def layout_text(self) -> str:
        """``pp x dp x tp``, with ``cp`` between ``dp`` and ``tp`` where the run splits the sequence."""
        pp, dp, tp = self.layout or (0, 0, 0)
        return f"{pp} x {dp} x {tp}" if self.cp == 1 else f"{pp} x {dp} x cp {self.cp} x {tp}"


RUNS = (
    PipelineRun("tt-405b-1f1b", "torchtitan 405B, FSDP 8 x TP 8 x PP 8, 1F1B", "h100-sxm-96gb-500w", 512, 256,
                (8, 8, 8), "1F1B", 8, 1, 100.0, None,
                TT_2412 + "; global batch 256 = local 32 per dp rank, full AC; " + TT_DEFAULTS,
                "torch.compile's fusions outside the float8 casts; torchtitan's generated cut (15 layers on "
                "the first stage, 16 on most) priced as the balanced cut", engine=TT_ENGINE),
    PipelineRun("tt-405b-interleaved", "torchtitan 405B, FSDP 8 x TP 8 x PP 8, Interleaved 1F1B (v = 2)",
                "h100-sxm-96gb-500w", 512, 256, (8, 8, 8), "Interleaved1F1B", 8, 2, 128.0, None,
                TT_2412 + "; " + TT_DEFAULTS, "as the 1F1B row", engine=TT_ENGINE),
    PipelineRun("meta-405b-8k", "Llama 3 405B, 8,192 GPUs, TP 8 x PP 16 x DP 64", "h100-sxm-80gb", 8192, 2048,
                (16, 64, 8), "Interleaved1F1B", 32, 2, None, 430.0,
                LLAMA3_PAPER + " row 1; 16M tokens = 2048 x 8192, batch per DP 32: m = 32 of 1 sequence per dp rank"
                " and v = 2 are ASSUMPTIONS (the paper's tuned interleaving is not published); priced with full AC:"
                " the paper trained at 8K tokens without activation checkpointing (section 3.3.2), which does not fit"
                " under this memory model (row meta-405b-8k-noac)",
                "Meta's own schedule (fewer layers on the first and last stage), FP8 not used; their RoCE fabric"
                " priced as the profile's InfiniBand; full AC's recomputation (about 1/3 more compute)",
                titan_loss=False),
    PipelineRun("meta-405b-8k-noac", "the same, no activation checkpointing (as published)", "h100-sxm-80gb", 8192,
                2048, (16, 64, 8), "Interleaved1F1B", 32, 2, None, 430.0, LLAMA3_PAPER + " row 1, section 3.3.2",
                "Meta's memory optimizations (fewer layers on the end stages, outputs freed after their send)",
                titan_loss=False, recompute="none"),
    PipelineRun("meta-405b-8k-chosen", "the same layout, schedule and m, v and each block's recomputation chosen",
                "h100-sxm-80gb", 8192, 2048, (16, 64, 8), "Interleaved1F1B", 32, None, None, 430.0,
                LLAMA3_PAPER + " row 1; layout, schedule and m as meta-405b-8k; v (stages a rank) CHOSEN among what "
                "the schedule offers and per block kept or under one of three recomputation policies chosen "
                "(pipeline_selective): the paper trained this stage without activation checkpointing, which does "
                "not fit under this memory model (meta-405b-8k-noac), and does not publish v",
                "as meta-405b-8k-noac", titan_loss=False, recompute="partial"),
    PipelineRun("meta-405b-16k", "Llama 3 405B, 16,384 GPUs, TP 8 x PP 16 x DP 128", "h100-sxm-80gb", 16384, 2048,
                (16, 128, 8), "Interleaved1F1B", 16, 2, None, 400.0,
                LLAMA3_PAPER + " row 2; batch per DP 16: m = 16, v = 2 (ASSUMPTION)", "as row 1", titan_loss=False),
    PipelineRun("meta-405b-16k-noac", "the same, no activation checkpointing (as published)", "h100-sxm-80gb", 16384,
                2048, (16, 128, 8), "Interleaved1F1B", 16, 2, None, 400.0, LLAMA3_PAPER + " row 2, section 3.3.2",
                "as meta-405b-8k-noac", titan_loss=False, recompute="none"),
    PipelineRun("meta-405b-16k-chosen", "the same layout, schedule and m, v and each block's recomputation chosen",
                "h100-sxm-80gb", 16384, 2048, (16, 128, 8), "Interleaved1F1B", 16, None, None, 400.0,
                LLAMA3_PAPER + " row 2; as meta-405b-8k-chosen", "as meta-405b-8k-noac", titan_loss=False,
                recompute="partial"),
    PipelineRun("meta-405b-128k", "Llama 3 405B long context, 16,384 GPUs, TP 8 x CP 16 x PP 16 x DP 8",
                "h100-sxm-80gb", 16384, 128, (16, 8, 8), "Interleaved1F1B", 16, 2, None, 380.0,
                LLAMA3_PAPER + " row 3 (issue 56): sequences of 131,072 tokens, 16M tokens = 128 sequences; DP 8 = "
                "16,384 / (TP 8 x CP 16 x PP 16), batch per DP 16: m = 16 of 1 sequence per dp rank; v = 2 "
                "(ASSUMPTION, as row 2); CP as section 3.3.2 ran it: K/V all-gathered over the CP group, each "
                "sequence in 2 CP chunks, rank r holding chunks r and 2 CP - 1 - r; full AC an ASSUMPTION (the "
                "paper names training without activation checkpointing for the 8K stage only); FSDP over dp x cp "
                "(ASSUMPTION, as torchtitan shards)",
                "as row 1; the balanced layout's query-row moves on every "
                "attention (Meta reorders the sequence once); MIS-PRICED: all-to-alls on cp x tp around every "
                "matmul (the view rules cannot map rows split over dp then cp to batch on dp, sequence on cp: "
                "about 65 ms a block exposed); see the issue 56 section of the results",
                titan_loss=False, cp=16, seq=131072),
    PipelineRun("meta-405b-128k-noac", "the same, no activation checkpointing (as the 8K stage ran)", "h100-sxm-80gb",
                16384, 128, (16, 8, 8), "Interleaved1F1B", 16, 2, None, 380.0,
                LLAMA3_PAPER + " row 3; whether the 128K stage checkpointed is not published",
                "as meta-405b-128k and meta-405b-8k-noac", titan_loss=False, recompute="none", cp=16, seq=131072),
    PipelineRun("meta-405b-128k-partial", "the same, each stage checkpointing the fewest of its blocks that fit",
                "h100-sxm-80gb", 16384, 128, (16, 8, 8), "Interleaved1F1B", 16, 2, None, 380.0,
                LLAMA3_PAPER + " row 3; layout, m and v as meta-405b-128k; the recomputation CHOSEN (not published): "
                "per stage the first c_k blocks checkpointed, the fewest that fit (autoshard.search.pipeline_partial)",
                "as meta-405b-128k", titan_loss=False, recompute="partial", cp=16, seq=131072, selective=False),
    PipelineRun("meta-405b-128k-chosen", "the same layout and schedule, v and each block's recomputation chosen",
                "h100-sxm-80gb", 16384, 128, (16, 8, 8), "Interleaved1F1B", 16, None, None, 380.0,
                LLAMA3_PAPER + " row 3; layout, schedule and m as meta-405b-128k; v (stages a rank) CHOSEN among "
                "what the schedule offers (section 3.3.2: Meta tuned its interleaving, v not published), and per "
                "block kept, under op-level (selective) or full checkpointing, chosen (pipeline_selective)",
                "as meta-405b-128k", titan_loss=False, recompute="partial", cp=16, seq=131072),
    PipelineRun("auto-405b-512", "autoshard's choice, 405B on 512 H100 96 GB, 256 x 8192", "h100-sxm-96gb-500w",
                512, 256, None, None, None, None, 128.0, None, "target: >= 128 tokens/s/GPU, found in < 10 min",
                "stage layouts fsdp+tp, no, full or partial recomputation, blocks kept, checkpointed or selective (module "
                "docstring); bf16, TP collectives "
                "exposed"),
    PipelineRun("auto-405b-16k", "autoshard's choice, 405B on 16,384 H100 80 GB, 2048 x 8192", "h100-sxm-80gb",
                16384, 2048, None, None, None, None, None, 400.0, "target: >= 400 TFLOPs/GPU, found in < 15 min",
                "as auto-405b-512", titan_loss=False),
)

AUTO_PP = {512: (4, 8, 16), 16384: (8, 16, 32)}
"""pp degrees autoshard's own rows try, by GPUs (tp 8 within a node, dp the rest)."""


def _factory(titan_loss: bool, seq: int = SEQ):
    def build(**overrides: Any):
        model, inputs = load("llama3.llama3_405b", {**overrides, "seq_len": seq, "max_seq_len": max(seq, SEQ),
                                                    "dtype": "bfloat16", "device": "meta"})
        if titan_loss:
            from benchmarks.published_runs import _titan_forward

            model.forward = MethodType(_titan_forward, model)
        return model, inputs
    return build


@functools.cache
def _block_params() -> int:
    """The 405B model's parameters outside the embedding (``N`` of :func:`_flops_per_token`)."""
    model, _ = load("llama3.llama3_405b", {"n_layers": N_LAYERS, "device": "meta"})
    return sum(p.numel() for n, p in model.named_parameters() if "tok_embeddings" not in n)


def _flops_per_token(seq: int = SEQ) -> float:
    """torchtitan's count at ``seq`` tokens (module docstring): attention's ``12 L d t`` is at its
    whole length, the causal mask not discounted. It is also PaLM's model-FLOPs count (Chowdhery et
    al. 2022, appendix B: ``6 N + 12 L H Q T`` a token), the MFU the Llama 3 paper's Table 4 cites."""
    from autoshard.search.pipeline import model_flops_per_token

    return model_flops_per_token(_block_params(), N_LAYERS, DIM, seq)


NOTES = """\
**What differs, and why.**

- *Data parallelism once a step* (``autoshard.assembly.param_comm``, 2026-12-05 20:00 UTC): a
  stage gathers its weights across dp before its first forward and keeps them to its last
  backward, its gradients accumulate unsharded in fp32 and are reduced after its last
  microbatch (FSDP2 in a pipeline: torchtitan's ``reshard_after_forward=False`` with PP,
  autoshard's pipeline runtime the same). Before, each microbatch paid the one-microbatch
  plan's exposed gathers and reductions again (a 405B block at dp 8: 30 ms of gathers and
  37 ms of reductions a microbatch beside 58 ms of compute), which put every row 25-70 % low;
  the held copies are now in each block's state (2.4 GB a 405B block at tp 8).
- *Microbatches.* torchtitan's rows at its benchmark commit ran its defaults: as many
  microbatches as pp ranks (m = 8 of 4 sequences) and 2 stages a rank for interleaving
  (source column). The bubbles that follow, 47 % and 30 %, are most of the gap between the
  two rows (128 / 100 published, 140 / 105 predicted). The Llama 3 rows' m and v are
  ASSUMPTIONS.
- *Engine options* (``autoshard.plan.options.EngineOptions``, docs/engine_options.md): torchtitan's
  405B rows ran torch.compile, Float8 linears (torchao, tensorwise) with float8 FSDP
  all-gathers (its 405B config) and async TP. Their prediction reprices each stage's solved
  plan with ``float8_linears`` (the block linears' three matmuls at the profile's fp8 peak and
  curve, casts and ``amax`` as memory-bound ops), ``float8_all_gather`` and ``async_tp``
  (single TP all-gathers / reduce-scatters beside a block matmul run as collective matmuls of
  ``tp`` chunks); the "bf16, TP exposed" column is the same plan priced as autoshard's runtime
  runs it. The once-a-step weight gathers and reductions keep their bf16 price (float8 gathers
  would shrink them). The Llama 3 paper's rows ran bf16 (no option; their TP overlap is not
  published).
- *Memory.* Rows marked "does NOT fit" are priced with the memory check off. Under full
  recomputation a block keeps its input sequence-split over ``tp`` (``pipeline_blocks``, Full
  recomputation; 2026-12-05 23:30 UTC): 134 MB a 405B block at 4 sequences a rank, as
  torchtitan's runs keep it, where the stage solve, run without a memory limit, kept it
  replicated (1.07 GB); the torchtitan rows' busiest rank went from 190 GiB to 78 GiB, and to
  69-71 GiB once the head's transient was charged to the last stage only (``pipeline_blocks``,
  Transients; 82.5 GiB measured, the allocator's reserve and NCCL buffers included). Without
  recomputation a block keeps its residual stream (its input and mid-residual) sequence-split
  over ``tp`` too (``pipeline_blocks`` (h''), 2026-12-06: the stage runtime runs sequence
  parallelism with any ``tp`` layout): 67 MB where the solve kept 537 MB whole, a 405B block at
  one sequence a rank. Its attention's and feed-forward's gathered inputs (the norms' outputs) are
  kept as their sequence shards and all-gathered again in the backward, as Megatron-LM's sequence
  parallelism and the stage runtime run them (``pipeline_blocks`` (h'''), 2026-12-06 09:00 UTC):
  2 x 235 MB less a block, 1.4 ms more of exposed tp all-gathers (the no-AC rows 138 / 104 GiB,
  407 / 341 TFLOPs/GPU, from 217 / 159 GiB and 421 / 353); they still do not fit.
- *The ``fsdp+tp`` pins* (``autoshard.search.baselines``): FSDP splits a tensor dim TP leaves
  whole (a column weight ``S(1)S(0)`` on ``dp x tp``, a row weight ``S(0)S(1)``), so its gather
  over ``dp`` yields the TP shard in one ``all_gather``, as FSDP2 over a TP DTensor does.
- *What async TP cannot hide here*: the all-reduces on ``tp``; the what-if column (each
  block's exposed communication hidden under its compute, ``pipeline_blocks.hide_exposed``)
  bounds what hiding them could gain.
- *Full recomputation.* torchtitan ran full AC; the Llama 3 paper trained at 8K tokens without
  activation checkpointing (the ``-noac`` rows, priced with the memory check off: its memory
  balancing is not modelled). The full-AC rows pay the recomputation and its activations'
  collectives again, not the weights' gathers: a stage holds its weights gathered through the
  step, so its recomputed forward reads them as they are (``pipeline_blocks`` (b) ``R_w``,
  2026-12-06 09:00 UTC; the solve priced an FSDP gather per recomputed weight read: a 405B block at
  dp 128 recomputed in 27 ms instead of 9.7 ms: the full-AC rows gain 6-36 %).
- The bound gap is ``1 - LB / step`` with ``LB = m * work / p`` (perfect balance, no bubble):
  what the schedule, the sends and the tail cost above it.
- *Long context* (``meta-405b-128k``, issue 56; run with ``--only``): stages on ``dp x cp x tp`` with
  Llama 3's balanced all-gather CP on ``cp`` (module docstring); its details list where a block's
  time goes and what-ifs (Meta's GQA gather without row moves, ``v = 4``, no recomputation).
"""


ENGINE_OPTIONS = ("float8_linears", "float8_all_gather", "async_tp")
"""``PipelineRun.engine`` names (``autoshard.plan.options.EngineOptions``)."""


def engine_figures(prep: Any, plan: Any, depth: int, engine: Any) -> Any:
    """``pipeline_blocks.plan_figures`` of ``plan`` with its step repriced under ``engine``
    (``autoshard.assembly.engine_pricing``): forward and backward from the repriced op times
    (async TP's collective matmuls inside them), the recomputation scaled (less the held weights'
    re-gathers, as ``plan_figures`` takes them out), the exposed rest
    ``X' = step' - F' - B' - O``; state and memory as solved."""
    from dataclasses import replace

    from autoshard.assembly.engine_pricing import reprice
    from autoshard.search.pipeline_blocks import _forward_end, plan_figures

    fig = plan_figures(prep, plan, depth)
    if not engine.any:
        return fig
    step = reprice(prep.graph, plan, engine)
    end = _forward_end(prep.graph, plan)
    fwd = sum(step.op_compute_s[: end + 1])
    # the recomputation's weight re-gathers a stage does not run (pipeline_blocks (b) R_w), as repriced
    held_again = plan.estimate.recompute_s - fig.recompute_s
    scale = step.recompute_s / plan.estimate.recompute_s if plan.estimate.recompute_s > 0 else 1.0
    bwd = sum(step.op_compute_s[end + 1:]) + step.recompute_s - held_again * scale
    # what the options change in the step beyond the compute changes the per-microbatch exposure;
    # the parameters' collectives stay priced once a step as in the bf16 plan (float8 gathers would shrink them)
    exposed = max(0.0, fig.exposed_s + (step.step_s - fig.step_s) - (fwd - fig.forward_s) - (bwd - fig.backward_s))
    return replace(fig, forward_s=fwd, backward_s=bwd, exposed_s=exposed, step_s=step.step_s)


def price_blocks_engines(factory, mesh_shape, *, micro_batch: int, engines: tuple, recompute: str, profile: str,
                         time_limit: float, prepare_options: dict) -> dict:
    """``pipeline_blocks.price_blocks`` (``fsdp+tp`` pinned, depths 2 and 4) for each of ``engines``
    from the same two solves: engine -> ``BlockPricing``."""
    from autoshard.search.pipeline_blocks import pricing_from_figures
    from autoshard.search.solve import prepare, solve_prepared

    started, depths = time.perf_counter(), (2, 4)
    figures: dict[Any, list] = {e: [] for e in engines}
    for depth in depths:
        model, inputs = factory(n_layers=depth, batch_size=micro_batch)
        prep = prepare(model, inputs, tuple(mesh_shape), ("dp", "tp"), profile=profile,
                       recompute="auto" if recompute != "none" else "none", **prepare_options)
        plan = solve_prepared(prep, baseline="fsdp+tp", recompute=recompute, memory_limit=math.inf,
                              time_limit=time_limit)
        for e in engines:
            figures[e].append(engine_figures(prep, plan, depth, e))
    # a selective block keeps its input as a checkpointed one does, sequence-split (h')
    return {e: pricing_from_figures(micro_batch, lo, hi, time.perf_counter() - started,
                                    checkpointed=recompute in ("full", "selective", "selective_all_mm"),
                                    sequence_split=recompute == "none")
            for e, (lo, hi) in figures.items()}


class _Pricer:
    """Block pricings, one per (profile, sub-mesh, microbatch, layout policy, engine), reused across rows."""

    def __init__(self, time_limit: float) -> None:
        self.cache: dict[tuple, Any] = {}
        self.attention: dict[tuple, dict] = {}
        """The cp stages' attention as priced (``pipeline_context.price_context_blocks``), by pricing key."""
        self.time_limit = time_limit

    @staticmethod
    def key(run: PipelineRun, dp: int, tp: int, micro_batch: int, pinned: bool, policy: str) -> tuple:
        return (run.profile, dp, tp, micro_batch, pinned, run.titan_loss, policy, run.cp, run.seq)

    def attention_at(self, run: PipelineRun, dp: int, tp: int, micro_batch: int) -> dict:
        """A cp row's attention as its pinned stages priced it (after ``at(...)(micro_batch)``)."""
        return self.attention[self.key(run, dp, tp, micro_batch, True, run.recompute)]

    def at(self, run: PipelineRun, dp: int, tp: int, pinned: bool, engine: Any = None, recompute: str | None = None):
        """``price(micro_batch)`` of ``run``'s stages, with the row's recomputation or ``recompute``."""
        from autoshard.plan.options import EngineOptions
        from autoshard.search.pipeline_blocks import price_blocks

        engine = engine if engine is not None else EngineOptions()
        policy = run.recompute if recompute is None else recompute

        def price(micro_batch: int):
            key = self.key(run, dp, tp, micro_batch, pinned, policy)
            if (key, engine) not in self.cache:
                t0 = time.perf_counter()
                opts = {"mixed_precision": True}
                if run.cp > 1:  # bf16 only (the Llama 3 rows): no engine options to reprice
                    self.cache[(key, engine)], self.attention[key] = price_context_blocks(
                        _factory(run.titan_loss, run.seq), (dp, run.cp, tp), micro_batch=micro_batch,
                        recompute=policy, profile=run.profile, time_limit=self.time_limit)
                elif pinned:  # FSDP2 as torchtitan runs it: block-wise gathers, fp32 reductions
                    opts.update(gather="fsdp2", reduce_dtype="float32")
                    engines = tuple(dict.fromkeys((EngineOptions(), run_engine(run), engine)))
                    for e, pricing in price_blocks_engines(
                            _factory(run.titan_loss), (dp, tp), micro_batch=micro_batch, engines=engines,
                            recompute=policy, profile=run.profile, time_limit=self.time_limit,
                            prepare_options=opts).items():
                        self.cache[(key, e)] = pricing
                else:
                    self.cache[(key, engine)] = price_blocks(
                        _factory(run.titan_loss), {}, (dp, tp), ("dp", "tp"), micro_batch=micro_batch,
                        depths=(2, 4), baseline=None, recompute=policy, profile=run.profile,
                        time_limit=self.time_limit, prepare_options=opts)
                print(f"  priced {key}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            return self.cache[(key, engine)]
        return price


def run_engine(run: PipelineRun) -> Any:
    """The row's ``EngineOptions``."""
    from autoshard.plan.options import EngineOptions

    return EngineOptions(**{name: True for name in run.engine})


def run_one(run: PipelineRun, pricer: _Pricer, flops: float) -> dict:
    from hw_profiles import load as load_profile

    from autoshard.search.pipeline import (
        PipelineLayout, best_plan, layout_lower_bound_s, pipeline_layouts, search_pipeline,
    )
    from autoshard.search.pipeline_blocks import hide_exposed

    profile = load_profile(run.profile)
    t0 = time.perf_counter()
    common = dict(n_blocks=N_LAYERS, batch=run.batch, seq_len=run.seq, dim=DIM, profile=profile,
                  flops_per_token=flops)
    if run.layout is not None:
        pp, dp, tp = run.layout
        # the schedule sees dp x cp where it reads dp: a rank's share of a send is 1 / (dp cp tp) of the
        # microbatch's activations (split along the sequence too), and the GPUs are pp dp cp tp
        layout = PipelineLayout(pp, dp * run.cp, tp)
        # "partial": the stages' checkpointed blocks chosen (both policies priced, the fewest that fit)
        policy, full = ("none", pricer.at(run, dp, tp, True, recompute="full")) if run.recompute == "partial" \
            else (run.recompute, None)
        # a third block kind (op-level checkpointing) where the row lets the search choose it
        selective = pricer.at(run, dp, tp, True, recompute="selective") if full and run.selective else None
        all_mm = pricer.at(run, dp, tp, True, recompute="selective_all_mm") if selective else None
        price = pricer.at(run, dp, tp, True, recompute=policy)
        priced = pricer.at(run, dp, tp, True, run_engine(run), recompute=policy)
        # stages_per_rank None: v chosen by the search among what the schedule offers (V_OF)
        pinned = dict(layout=layout, schedules=(run.schedule,), microbatches=(run.n_microbatches,),
                      stages_per_rank=None if run.stages_per_rank is None else (run.stages_per_rank,),
                      recompute=policy, price_full=full, price_selective=selective, price_all_mm=all_mm, **common)
        over: dict[str, Any] = {}
        try:
            plan = search_pipeline(priced, **pinned)
        except ValueError as exc:
            # as published, but over this memory model's limit: its time is still the prediction of
            # the layout that ran (the row says it does not fit here)
            pinned = {**pinned, "memory_limit_bytes": math.inf}
            over = {"over_memory": str(exc).splitlines()[0][:120]}
            plan = search_pipeline(priced, **pinned)
        bf16 = plan if not run.engine else search_pipeline(price, **pinned)
        hidden = search_pipeline(lambda mb: hide_exposed(price(mb)), **{
            **pinned, "price_full": full and (lambda mb: hide_exposed(full(mb))),
            "price_selective": selective and (lambda mb: hide_exposed(selective(mb))),
            "price_all_mm": all_mm and (lambda mb: hide_exposed(all_mm(mb)))})
        if run.cp > 1 and run.recompute != "partial":  # the what-ifs change one policy's pricing
            mb = run.batch // run.n_microbatches
            over["context"] = context_what_ifs(run, price(mb), pricer.attention_at(run, dp, tp, mb), pinned)
        elif run.cp > 1:  # the attention backward's rate alone, every block kind repriced
            over["bwd_eff"] = backward_rate_what_if(run, pinned, price, full, selective, all_mm)
        return {"plan": plan, "bf16": bf16, "hidden": hidden, "wall_s": time.perf_counter() - t0, "layouts": 1,
                "pruned": 0, **over}
    peak = profile.device.peak_flops_for("bf16")
    bound = layout_lower_bound_s(flops * run.batch * SEQ, run.gpus, peak)
    layouts = [l for l in pipeline_layouts(run.gpus, 8) if l.tp == 8 and l.pp in AUTO_PP[run.gpus]]

    def selective_at(layout: Any, policy: str = "selective") -> Any:  # op-level policies: third and fourth kinds
        return pricer.at(run, layout.dp, layout.tp, True, recompute=policy) if run.selective else None
    plans, pruned, errors = [], 0, []
    for layout in layouts:
        if plans and bound >= min(p.step_s for p in plans):  # (g): cannot beat the best
            pruned += 1
            continue
        try:  # both stage policies (autoshard.search.pipeline, Recomputation): full where none is memory-bound
            plans.append(search_pipeline(pricer.at(run, layout.dp, layout.tp, True, recompute="none"), layout=layout,
                                         price_full=pricer.at(run, layout.dp, layout.tp, True, recompute="full"),
                                         price_selective=selective_at(layout),
                                         price_all_mm=selective_at(layout, "selective_all_mm"), **common))
        except ValueError as exc:
            errors.append(f"{layout.mesh_shape}: {str(exc).splitlines()[0][:160]}")
    if not plans:
        return {"error": "; ".join(errors), "wall_s": time.perf_counter() - t0}
    best = best_plan(plans)
    found_s = time.perf_counter() - t0  # the plan in hand: what the target times (the what-if below is extra)
    layout = PipelineLayout(*best.mesh_shape)
    if best.recompute == "partial":  # some blocks of each stage checkpointed: both policies' pricings, mixed
        none, full = (pricer.at(run, layout.dp, layout.tp, True, recompute=r) for r in ("none", "full"))
        sel, mm = selective_at(layout), selective_at(layout, "selective_all_mm")
        hidden = search_pipeline(lambda mb: hide_exposed(none(mb)), layout=layout,
                                 price_full=lambda mb: hide_exposed(full(mb)),
                                 price_selective=None if sel is None else (lambda mb: hide_exposed(sel(mb))),
                                 price_all_mm=None if mm is None else (lambda mb: hide_exposed(mm(mb))), **common)
    else:
        price = pricer.at(run, layout.dp, layout.tp, True, recompute=best.recompute)
        hidden = search_pipeline(lambda mb: hide_exposed(price(mb)), layout=layout, recompute=best.recompute,
                                 **common)
    return {"plan": best, "hidden": hidden, "all": plans, "wall_s": time.perf_counter() - t0, "layouts": len(layouts),
            "pruned": pruned, "errors": errors, "bound_s": bound, "found_s": found_s}


def _pct(predicted: float, published: float) -> str:
    return f"{100 * (predicted - published) / published:+.1f} %"


def _beside(p: Any, run: PipelineRun) -> str:
    """``tokens/s/GPU, TFLOPs/GPU, error`` of another pricing of the row."""
    if p is None:
        return "-"
    err = "" if run.layout is None else ", " + (_pct(p.tokens_per_gpu_s, run.published_tps) if run.published_tps
                                               else _pct(p.tflops_per_gpu, run.published_tflops))
    return f"{p.tokens_per_gpu_s:.1f}, {p.tflops_per_gpu:.0f}{err}"


def table(rows: list[tuple[PipelineRun, dict]]) -> str:
    lines = ["| run | GPUs | layout (pp x dp x tp) | schedule, m, v, recompute | step s | bubble "
             "| tokens/s/GPU (published) "
             "| tokens/s/GPU (predicted) | TFLOPs/GPU (published) | TFLOPs/GPU (predicted) | error | engine options "
             "| bf16, TP exposed: tokens/s/GPU, TFLOPs/GPU, error "
             "| what-if TP hidden (bf16): tokens/s/GPU, TFLOPs/GPU, error | busiest rank GiB | bound gap | wall s |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|"]
    for run, r in rows:
        if "error" in r:
            lines.append(f"| {run.key} | {run.gpus} | error: {r['error']} |")
            continue
        p = r["plan"]
        if run.published_tps is not None:
            err = _pct(p.tokens_per_gpu_s, run.published_tps)
        else:
            err = _pct(p.tflops_per_gpu, run.published_tflops)
        what_if, bf16 = (_beside(r.get(k), run) for k in ("hidden", "bf16"))
        engine = ", ".join(run.engine) or "none (bf16)"
        pub_tps = f"{run.published_tps:.0f}" if run.published_tps else "-"
        pub_tf = f"{run.published_tflops:.0f}" if run.published_tflops else "-"
        if run.layout is None:
            err = f"target {'>= ' + pub_tps + ' tps' if run.published_tps else '>= ' + pub_tf + ' TFLOPs'}: " + (
                "met" if (p.tokens_per_gpu_s >= run.published_tps if run.published_tps
                          else p.tflops_per_gpu >= run.published_tflops) else "missed")
            pub_tps, pub_tf = "-", "-"
        over = " (does NOT fit: memory not checked)" if r.get("over_memory") else ""
        shape = run.layout_text if run.layout is not None else " x ".join(map(str, p.mesh_shape))
        lines.append(
            f"| {run.key}{over} | {run.gpus} | {shape} "
            f"| {p.schedule}, {p.n_microbatches}, "
            f"{p.stages_per_rank}, {p.recompute} | {p.step_s:.2f} | {p.bubble_fraction:.3f} | {pub_tps} "
            f"| {p.tokens_per_gpu_s:.1f} "
            f"| {pub_tf} | {p.tflops_per_gpu:.0f} | {err} | {engine} | {bf16} | {what_if} | {max(p.rank_memory_bytes) / 2**30:.1f} "
            f"| {p.gap:.3f} "
            f"| {r['wall_s']:.0f} |")
    return "\n".join(lines)


def causal_flops_per_token(seq: int) -> float:
    """``6 N + 6 L d t``: attention's FLOPs under the causal mask (half of ``12 L d t``), what the
    kernels compute."""
    return _flops_per_token(seq) - 6.0 * N_LAYERS * DIM * seq


def context_details(run: PipelineRun, r: dict) -> list[str]:
    """Where a cp row's step goes and its what-ifs (``pipeline_context.context_what_ifs``), as text lines."""
    c, p = r["context"], r["plan"]
    blk, att = c["block"], c["attention"]
    ms = lambda x: f"{1e3 * x:.1f} ms"  # noqa: E731
    causal = causal_flops_per_token(run.seq) / _flops_per_token(run.seq)
    lines = [f"{run.key}: one block, one microbatch (1 sequence per dp rank: {run.seq // run.cp} tokens a CP rank), "
             f"the busiest rank; attention exchanges {', '.join(att['exchanges'])}:",
             f"- block forward {ms(blk.forward_s)}, backward {ms(blk.backward_s)} (recomputation "
             f"{ms(c['block_recompute_s'])} and exposed communication {ms(c['block_exposed_s'])} inside them)",
             f"- its attention as the plan prices it: forward {ms(att['forward_s'])}, backward {ms(att['backward_s'])}"
             " (row moves inside; K/V gathers and dK/dV reduce-scatters inside for the context_gather kinds, "
             "the plan's own collectives outside it for the whole-K/V kinds)"]
    for name, what in (("expanded", "the K/V expanded to the query heads, as traced"),
                       ("gqa", "the 8 GQA K/V heads, as Meta gathers them")):
        a = c["costs"][name]
        # the busiest rank's kernels: 4 B H D FLOPs a visible pair forward, 2.5 times that backward
        batch = run.batch // run.n_microbatches // run.layout[1]
        flops = 4 * batch * (128 // run.layout[2]) * 128 * max(a.forward_pairs_by_rank)
        lines.append(f"- costmodel, {what}: kernels at {flops / a.forward_compute_s / 1e12:.0f} / "
                     f"{2.5 * flops / a.backward_compute_s / 1e12:.0f} TFLOP/s forward / backward")
        lines.append(f"- costmodel, {what}: forward {ms(a.forward_s)} (kernels {ms(a.forward_compute_s)}, K/V "
                     f"all-gather {ms(a.forward_comm_s)}), backward {ms(a.backward_s)} (kernels "
                     f"{ms(a.backward_compute_s)}, gather + reduce-scatter {ms(a.backward_comm_s)}), exposed "
                     f"{ms(a.exposed_comm_s)}")
    lines.append(f"- step {p.step_s:.2f} s, bubble {p.bubble_fraction:.3f}, bound gap {p.gap:.3f}; TFLOPs/GPU "
                 f"{p.tflops_per_gpu:.0f} counted as torchtitan counts ({_flops_per_token(run.seq) / 1e12:.2f} "
                 f"TFLOP a token), {p.tflops_per_gpu * causal:.0f} with causal attention's half "
                 f"({causal_flops_per_token(run.seq) / 1e12:.2f})")
    lines.append(f"- what-ifs (memory not checked; meta_cp: attention as Meta's CP, d_f {ms(c['d_f'])}, d_b "
                 f"{ms(c['d_b'])}; v4: 4 stages a rank; noac: no recomputation; bwd_eff: the attention's backward "
                 "kernels at the forward's FLOP rate):")
    for key, q in c["what_if"].items():
        lines.append(f"  - {key}: step {q.step_s:.2f} s, bubble {q.bubble_fraction:.3f}, "
                     f"{q.tflops_per_gpu:.0f} TFLOPs/GPU ({_pct(q.tflops_per_gpu, run.published_tflops)}), "
                     f"{q.tflops_per_gpu * causal:.0f} causal")
    return lines


def _stage_sizes(plan: Any) -> list[int]:
    """Blocks of each stage of ``plan``'s cut."""
    bounds = (0, *plan.cuts, N_LAYERS)
    return [b - a for a, b in zip(bounds, bounds[1:])]


def details(rows: list[tuple[PipelineRun, dict]]) -> str:
    out = ["| run | source | what the prediction does not price |", "|---|---|---|"]
    for run, r in rows:
        out.append(f"| {run.key} | {run.source} | {run.not_modeled} |")
    for run, r in rows:
        if "context" in r:
            out += [""] + context_details(run, r)
    for run, r in rows:  # a pinned layout whose blocks' recomputation the search chose
        if run.layout is not None and "plan" in r and r["plan"].recompute == "partial":
            p = r["plan"]
            out += ["", f"{run.key}: v = {p.stages_per_rank}, blocks per stage {_stage_sizes(p)}, checkpointed "
                        f"{list(p.recompute_blocks)} (sum {sum(p.recompute_blocks)}), selective "
                        f"{list(p.selective_blocks or ())} (sum {sum(p.selective_blocks or ())}), saving every matmul "
                        f"{list(p.all_mm_blocks or ())} (sum {sum(p.all_mm_blocks or ())}), "
                        f"{max(p.rank_memory_bytes) / 2**30:.1f} GiB on the busiest rank"]
            if "bwd_eff" in r:  # backward_rate_what_if
                w = r["bwd_eff"]
                out.append(f"- what-if, the attention's backward kernels at the forward's FLOP rate (the profile holds "
                           f"them at 18 % of peak beyond its 3 measured points): {w.step_s:.2f} s, v = "
                           f"{w.stages_per_rank}, {w.tflops_per_gpu:.0f} TFLOPs/GPU, "
                           f"{max(w.rank_memory_bytes) / 2**30:.1f} GiB")
    for run, r in rows:
        if run.layout is None and "plan" in r:
            out.append("")
            out.append(f"{run.key}: plan in hand after {r['found_s']:.0f} s (the wall column adds the TP-hidden "
                       f"what-if's search, {r['wall_s'] - r['found_s']:.0f} s); {r['layouts']} layouts, "
                       f"{r['pruned']} cut by the FLOPs bound ({r['bound_s']:.2f} s), errors: "
                       f"{r['errors'] or 'none'}; per layout (search seconds with the stage solves it ran):")
            for p in r["all"]:
                full_at = sorted({c.n_microbatches for c in p.candidates if c.recompute == "full"})
                out.append(f"- {' x '.join(map(str, p.mesh_shape))}: {p.schedule} m={p.n_microbatches} "
                           f"v={p.stages_per_rank} recompute={p.recompute}: {p.step_s:.2f} s, "
                           f"{p.tokens_per_gpu_s:.1f} tokens/s/GPU, "
                           f"{p.tflops_per_gpu:.0f} TFLOPs/GPU, {max(p.rank_memory_bytes) / 2**30:.1f} GiB, "
                           f"{p.search_s:.0f} s, "
                           f"{sum(math.isfinite(c.step_s) for c in p.candidates)}/{len(p.candidates)} candidates fit, "
                           f"full priced at m = {full_at}"
                           + (f", checkpointed blocks per stage {list(p.recompute_blocks)} of "
                              f"{_stage_sizes(p)}" if p.recompute == "partial" else "")
                           + (f", selective blocks per stage {list(p.selective_blocks)} (sum "
                              f"{sum(p.selective_blocks)}, checkpointed sum {sum(p.recompute_blocks)})"
                              if p.selective_blocks else "")
                           + (f", saving every matmul {list(p.all_mm_blocks)} (sum {sum(p.all_mm_blocks)})"
                              if p.all_mm_blocks else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="RUN", help="run keys: " + ", ".join(r.key for r in RUNS))
    parser.add_argument("--time-limit", type=float, default=30.0, help="solver seconds per stage solve (default 30)")
    parser.add_argument("-o", "--output", help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)
    by_key = {r.key: r for r in RUNS}
    unknown = [k for k in args.only or () if k not in by_key]
    if unknown:
        print(f"error: --only: unknown run {unknown[0]!r} (known: {', '.join(by_key)})", file=sys.stderr)
        return 2
    # the long-context rows run when named: their stage solves trace 131,072-token sequences on 3-D sub-meshes
    runs = [by_key[k] for k in args.only] if args.only else [r for r in RUNS if r.cp == 1]
    pricer = _Pricer(args.time_limit)
    rows = []
    for run in runs:
        # autoshard's own search prices its stages afresh: its wall time is the whole search's
        rows.append((run, run_one(run, pricer if run.layout is not None else _Pricer(args.time_limit),
                                  _flops_per_token(run.seq))))
        print(f"done {run.key}: {rows[-1][1].get('wall_s', 0):.0f} s", file=sys.stderr, flush=True)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"`python -m benchmarks.pipeline_runs{' --only ' + ' '.join(args.only) if args.only else ''}`, "
            f"{when}, {platform.machine()} with {os.cpu_count()} cores (shared)\n\n"
            + table(rows) + "\n\n" + NOTES + "\n" + details(rows))
    print(text)
    if args.output:
        from solver.io import write_text_atomic

        write_text_atomic(args.output, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
