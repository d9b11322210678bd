"""The plan's ``pipeline`` section: which stages run which modules, and how torch schedules them.

A plan for a mesh with a pipeline dim (``pp``) records, besides the placements, the
pipeline the search chose (``autoshard.search.pipeline``): ``p`` ranks along the
``mesh_dim``, ``v`` stages per rank (``K = p v`` stages), the schedule as
``torch.distributed.pipelining.schedules.get_schedule_class`` spells it, ``m``
microbatches of the global batch, and per stage the repeated blocks it runs
(``[first_block, end_block)`` of the model's ``repeated_blocks``) and its module paths
in forward order: the embedding (the modules before the blocks) on stage 0, the
final norm, head and loss (the modules after them) on stage ``K - 1``, where the cut
put them. ``send_bytes`` is what one rank sends across one stage boundary for one
microbatch (the activation forward, its gradient backward), as the search priced it;
``data_parallel`` is how each stage runs over its data-parallel sub-mesh
(``"fsdp"``: ``fully_shard``; ``"replicate"``: torch's ``replicate``). The runtime runs
each stage with that data-parallel layout, not with the plan's per-op placements (the
stage sub-mesh's solve, which priced it): autoshard's interpreter runs whole-graph step
programs, not the per-microbatch stage calls of torch's schedules.

Optional, as the search priced them (absent in hand-written sections): per stage
``forward_s`` / ``backward_s`` (one microbatch) and ``peak_bytes`` (its rank's peak
memory, the microbatches in flight counted); the section's ``step_s`` and
``bubble_fraction`` (``costmodel.pipeline_simulate``).

Optional ``recompute``: ``"none"`` (each block keeps what its backward reads),
``"full"`` (activation checkpointing per block: a block keeps its input and runs its forward
again just before its backward, as torchtitan's full AC) or ``"partial"``: each stage checkpoints
the first ``recompute_blocks`` of its blocks (a count per stage entry, ``0`` to the stage's block
count; Megatron-LM's ``--recompute-method block --recompute-num-layers``, per stage chunk) and
keeps what the backward reads of the rest. Absent: ``"none"``. ``recompute_blocks`` is written on
every stage of a ``"partial"`` section and on no stage of the others (one line names a bad one).
A ``"partial"`` stage may also say ``recompute_selective_blocks``: how many of its blocks after the
checkpointed ones run torchtitan's op-level policy (every other matmul's output and the
attention's saved, the rest recomputed; ``autoshard.graph.recompute_policy``, ``selective``), at
most the stage's blocks less ``recompute_blocks``; absent: 0. It may say ``recompute_all_mm_blocks``
too: how many after the selective ones run the op-level policy that saves every matmul's output
(``selective_all_mm``: recomputes less, keeps more), at most the blocks left; absent: 0. Order
within a stage: checkpointed, selective, all-mm, kept (the backward runs a stage's first blocks
last, so the recomputations with the largest transients run when the later blocks' saved tensors
are freed).

Optional ``tensor_parallel``: inside each stage, the plan's column / row layout of the
blocks' linear layers on the ``tp`` mesh dim (module path -> ``"colwise"`` or
``"rowwise"``: weight ``S(0)`` or ``S(1)`` on ``tp``), run with torch's
``parallelize_module`` (``autoshard.runtime.pipeline_tp``); beside it the embedding and the
head are split over the vocabulary where ``tp`` divides it (``autoshard.trace.blocks.vocab_split``,
not listed here: the rule decides), every other tensor is replicated over ``tp``. Empty: no tensor
parallelism inside a stage.

Optional ``sequence_parallel`` (with ``tensor_parallel`` only): the residual stream between
the blocks is split along the sequence over ``tp`` (torch's sequence parallelism, as
torchtitan runs its TP: column-split linears all-gather their input from ``Shard(1)``,
row-split ones reduce-scatter their output to ``Shard(1)``, the blocks' norms run
``SequenceParallel``), so each ``tp`` rank sends ``1/tp`` of the boundary activation, as
``send_bytes`` prices it. Absent: false (the residual stream replicated over ``tp``).

Versioned (``version``) and optional: plans without the section load as before and
describe one stage. :data:`PIPELINE_SCHEMA` is its JSON Schema (draft 2020-12), part of
``autoshard.plan.schema.PLAN_SCHEMA``. Torch-free, as the plan format is.

>>> s = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=4, batch_size=8,
...                            block_paths=("layers.0", "layers.1"), cuts=(1,),
...                            leading=("tok_embeddings",), trailing=("norm", "output"))
>>> [st.modules for st in s.stages]
[('tok_embeddings', 'layers.0'), ('layers.1', 'norm', 'output')]
>>> PipelineSection.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from costmodel.pipeline_schedules import SCHEDULE_NAMES, build_schedule, stage_to_rank

__all__ = ["PIPELINE_VERSION", "DATA_PARALLEL", "TENSOR_PARALLEL_STYLES", "PipelineError", "PipelineStagePlan",
           "PipelineSection", "build_pipeline_section", "check_section", "V_SHAPED", "PIPELINE_SCHEMA",
           "RECOMPUTE_POLICIES", "SECTION_RECOMPUTE", "tensor_parallel_from_params", "priced_sequence_parallel"]

PIPELINE_VERSION = 1
DATA_PARALLEL = ("fsdp", "replicate")
"""How a stage runs over its data-parallel sub-mesh: ``fully_shard`` or ``replicate`` (torch's, FSDP2-based)."""
TENSOR_PARALLEL_STYLES = ("colwise", "rowwise")
"""How a linear layer is split over ``tp``: its output features (weight ``S(0)``) or its input features (``S(1)``)."""
RECOMPUTE_POLICIES = ("none", "full")
"""What a stage recomputes: nothing, or every block's forward (activation checkpointing per block)."""
SECTION_RECOMPUTE = (*RECOMPUTE_POLICIES, "partial")
"""What a section's ``recompute`` may say: a policy of every block, or ``partial`` (the first
``recompute_blocks`` of each stage checkpointed)."""
V_SHAPED = frozenset({"ZBVZeroBubble", "DualPipeV"})
"""Schedules whose stages sit on the ranks in a V (rank ``r`` holds stages ``r`` and ``2p - 1 - r``)."""


class PipelineError(ValueError):
    """A pipeline section that cannot be built or read (one line naming the field)."""


@dataclass(frozen=True, slots=True)
class PipelineStagePlan:
    """One stage: its rank on the pipeline dim, its blocks and its module paths."""

    index: int
    rank: int
    """Coordinate along the pipeline mesh dim."""
    first_block: int
    end_block: int
    """One past its last block."""
    modules: tuple[str, ...]
    """Module paths the stage runs, in forward order (blocks and, on the ends, the embedding / head)."""
    forward_s: float | None = None
    """Priced forward of one microbatch (None: not priced)."""
    backward_s: float | None = None
    """Priced backward of one microbatch, recomputation included (None: not priced)."""
    peak_bytes: float | None = None
    """Priced peak memory of the stage's rank (None: not priced)."""
    recompute_blocks: int | None = None
    """Under a ``partial`` section: how many of its blocks, from its first, are checkpointed (None otherwise)."""
    recompute_selective_blocks: int | None = None
    """Under a ``partial`` section: how many blocks after the checkpointed ones run the op-level policy
    (None: none)."""
    recompute_all_mm_blocks: int | None = None
    """Under a ``partial`` section: how many blocks after the selective ones run the op-level policy
    saving every matmul (``selective_all_mm``; None: none)."""

    @property
    def n_blocks(self) -> int:
        return self.end_block - self.first_block

    def to_dict(self) -> dict[str, Any]:
        priced = {k: v for k, v in (("forward_s", self.forward_s), ("backward_s", self.backward_s),
                                    ("peak_bytes", self.peak_bytes)) if v is not None}
        partial = {} if self.recompute_blocks is None else {"recompute_blocks": self.recompute_blocks}
        if self.recompute_selective_blocks is not None:
            partial["recompute_selective_blocks"] = self.recompute_selective_blocks
        if self.recompute_all_mm_blocks is not None:
            partial["recompute_all_mm_blocks"] = self.recompute_all_mm_blocks
        return {"index": self.index, "rank": self.rank, "blocks": [self.first_block, self.end_block],
                "modules": list(self.modules), **partial, **priced}


@dataclass(frozen=True, slots=True)
class PipelineSection:
    """The pipeline of a plan (module docstring)."""

    mesh_dim: str
    schedule: str
    """A name of ``torch.distributed.pipelining.schedules.get_schedule_class``."""
    n_ranks: int
    """``p``: the size of the pipeline mesh dim."""
    stages_per_rank: int
    n_microbatches: int
    batch_size: int
    """Global batch (sequences) the plan is for; ``n_microbatches`` divides it."""
    stages: tuple[PipelineStagePlan, ...]
    send_bytes: int = 0
    """Bytes one rank sends across a boundary for one microbatch (0: not priced)."""
    data_parallel: str = "fsdp"
    step_s: float | None = None
    """Priced step (None: not priced)."""
    bubble_fraction: float | None = None
    """Priced bubble: idle share of the busiest rank's step (None: not priced)."""
    tensor_parallel: tuple[tuple[str, str], ...] = ()
    """(linear module path, ``colwise`` / ``rowwise``) inside the stages, on mesh dim ``tp`` (module docstring)."""
    recompute: str = "none"
    """One of :data:`SECTION_RECOMPUTE` (module docstring)."""
    sequence_parallel: bool = False
    """The residual stream between blocks split along the sequence over ``tp`` (module docstring)."""

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def checkpointed_blocks(self, stage: int) -> int:
        """How many of stage ``stage``'s blocks, from its first, run under activation checkpointing."""
        st = self.stages[stage]
        if self.recompute == "partial":
            return int(st.recompute_blocks or 0)
        return st.n_blocks if self.recompute == "full" else 0

    def selective_blocks(self, stage: int) -> int:
        """How many of stage ``stage``'s blocks, after its checkpointed ones, run the op-level policy."""
        st = self.stages[stage]
        return int(st.recompute_selective_blocks or 0) if self.recompute == "partial" else 0

    def all_mm_blocks(self, stage: int) -> int:
        """How many of stage ``stage``'s blocks, after its selective ones, run the op-level policy that
        saves every matmul's output (``selective_all_mm``)."""
        st = self.stages[stage]
        return int(st.recompute_all_mm_blocks or 0) if self.recompute == "partial" else 0

    def stages_of_rank(self, rank: int) -> tuple[PipelineStagePlan, ...]:
        """The stages on coordinate ``rank`` of the pipeline dim, lowest index first."""
        return tuple(s for s in self.stages if s.rank == rank)

    def planned_sends(self, stage: int) -> tuple[int, int]:
        """(activation sends, gradient sends) stage ``stage`` issues per step: ``m`` across each
        boundary it has with a stage on another rank (V-shaped turns stay on one rank)."""
        m, k = self.n_microbatches, self.n_stages
        rank = self.stages[stage].rank
        fwd = m if stage < k - 1 and self.stages[stage + 1].rank != rank else 0
        bwd = m if stage > 0 and self.stages[stage - 1].rank != rank else 0
        return fwd, bwd

    def to_dict(self) -> dict[str, Any]:
        return {"version": PIPELINE_VERSION, "mesh_dim": self.mesh_dim, "schedule": self.schedule,
                "n_ranks": self.n_ranks, "stages_per_rank": self.stages_per_rank,
                "n_microbatches": self.n_microbatches, "batch_size": self.batch_size,
                "send_bytes": self.send_bytes, "data_parallel": self.data_parallel,
                **({"recompute": self.recompute} if self.recompute != "none" else {}),
                **{k: v for k, v in (("step_s", self.step_s), ("bubble_fraction", self.bubble_fraction))
                   if v is not None},
                **({"tensor_parallel": dict(self.tensor_parallel)} if self.tensor_parallel else {}),
                **({"sequence_parallel": True} if self.sequence_parallel else {}),
                "stages": [s.to_dict() for s in self.stages]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PipelineSection":
        if not isinstance(data, Mapping):
            raise PipelineError("pipeline: expected an object")
        version = data.get("version", PIPELINE_VERSION)
        if version != PIPELINE_VERSION:
            raise PipelineError(f"pipeline.version: this autoshard reads version {PIPELINE_VERSION}, got {version!r}")
        sequence_parallel = _flag(data, "sequence_parallel")
        try:
            stages = tuple(PipelineStagePlan(int(s["index"]), int(s["rank"]), int(s["blocks"][0]), int(s["blocks"][1]),
                                             tuple(str(p) for p in s["modules"]), _number(s, "forward_s"),
                                             _number(s, "backward_s"), _number(s, "peak_bytes"),
                                             _count(s, i), _count(s, i, "recompute_selective_blocks"),
                                             _count(s, i, "recompute_all_mm_blocks"))
                           for i, s in enumerate(data["stages"]))
            section = cls(str(data["mesh_dim"]), str(data["schedule"]), int(data["n_ranks"]),
                          int(data["stages_per_rank"]), int(data["n_microbatches"]), int(data["batch_size"]), stages,
                          int(data.get("send_bytes", 0)), str(data.get("data_parallel", "fsdp")),
                          _number(data, "step_s"), _number(data, "bubble_fraction"),
                          tuple((str(k), str(v)) for k, v in dict(data.get("tensor_parallel", {})).items()),
                          str(data.get("recompute", "none")), sequence_parallel)
        except PipelineError:
            raise
        except KeyError as exc:
            raise PipelineError(f"pipeline: missing {exc.args[0]!r}") from None
        except (TypeError, ValueError, IndexError) as exc:
            raise PipelineError(f"pipeline: malformed ({exc})") from None
        check_section(section)
        return section


def _number(data: Mapping[str, Any], key: str) -> float | None:
    """An optional priced figure: a number, or None when absent."""
    value = data.get(key)
    return None if value is None else float(value)


def _count(stage: Mapping[str, Any], i: int, key: str = "recompute_blocks") -> int | None:
    """A stage's optional count ``key``: a JSON integer (not a boolean, not 2.0), or None when absent."""
    value = stage.get(key)
    if value is not None and type(value) is not int:
        raise PipelineError(f"pipeline.stages[{i}].{key}: expected a count of blocks, got {value!r}")
    return value


def _check_recompute(s: "PipelineSection") -> None:
    """``recompute`` one of :data:`SECTION_RECOMPUTE`; ``recompute_blocks`` on every stage of a
    ``partial`` section, each within the stage's blocks, and on no stage of the others."""
    if s.recompute not in SECTION_RECOMPUTE:
        raise PipelineError(f"pipeline.recompute: {s.recompute!r}; valid: {', '.join(SECTION_RECOMPUTE)}")
    for i, st in enumerate(s.stages):
        k = st.recompute_blocks
        if s.recompute != "partial" and k is not None:
            raise PipelineError(f"pipeline.stages[{i}].recompute_blocks: given with recompute {s.recompute!r}; "
                                "a count of checkpointed blocks goes with recompute 'partial'")
        if s.recompute == "partial" and (k is None or not 0 <= k <= st.n_blocks):
            raise PipelineError(f"pipeline.stages[{i}].recompute_blocks: recompute 'partial' needs a count from 0 "
                                f"to the stage's {st.n_blocks} blocks, got {k!r}")
        sel = st.recompute_selective_blocks
        if sel is not None and s.recompute != "partial":
            raise PipelineError(f"pipeline.stages[{i}].recompute_selective_blocks: given with recompute "
                                f"{s.recompute!r}; a count of selective blocks goes with recompute 'partial'")
        if sel is not None and not 0 <= sel <= st.n_blocks - (k or 0):
            raise PipelineError(f"pipeline.stages[{i}].recompute_selective_blocks: needs a count from 0 to the "
                                f"stage's {st.n_blocks} blocks less its {k} checkpointed, got {sel!r}")
        mm = st.recompute_all_mm_blocks
        if mm is not None and s.recompute != "partial":
            raise PipelineError(f"pipeline.stages[{i}].recompute_all_mm_blocks: given with recompute "
                                f"{s.recompute!r}; a count of all-mm blocks goes with recompute 'partial'")
        if mm is not None and not 0 <= mm <= st.n_blocks - (k or 0) - (sel or 0):
            raise PipelineError(f"pipeline.stages[{i}].recompute_all_mm_blocks: needs a count from 0 to the "
                                f"stage's {st.n_blocks} blocks less its {k} checkpointed and {sel or 0} selective, "
                                f"got {mm!r}")


def _flag(data: Mapping[str, Any], key: str) -> bool:
    """An optional boolean: absent is false; anything but a JSON boolean raises, one line."""
    value = data.get(key, False)
    if type(value) is not bool:
        raise PipelineError(f"pipeline.{key}: expected true or false, got {value!r}")
    return value


def _check_schedule_shape(schedule: str, n_ranks: int, v: int, m: int, batch: int) -> None:
    if schedule not in SCHEDULE_NAMES:
        raise PipelineError(f"pipeline.schedule: {schedule!r} is not a schedule torch offers; valid names: "
                            f"{', '.join(SCHEDULE_NAMES)}")
    if n_ranks < 1 or v < 1 or m < 1:
        raise PipelineError(f"pipeline: n_ranks ({n_ranks}), stages_per_rank ({v}) and n_microbatches ({m}) "
                            "must be >= 1")
    if schedule in ("GPipe", "1F1B") and v != 1:
        raise PipelineError(f"pipeline.stages_per_rank: {schedule} runs one stage per rank, got {v}")
    if schedule in V_SHAPED and v != 2:
        raise PipelineError(f"pipeline.stages_per_rank: {schedule} runs two stages per rank, got {v}")
    if batch < 1 or batch % m:
        raise PipelineError(f"pipeline.n_microbatches: {m} microbatches do not divide the batch of {batch} sequences")


def _check_torch_accepts(schedule: str, n_ranks: int, v: int, m: int) -> None:
    """What torch's schedule class refuses at construction (1F1B: m >= p, DualPipeV: m >= 2p, the
    interleaved ones: m a multiple of max(1, m // p)), as costmodel's schedule builder mirrors it."""
    try:
        build_schedule(schedule, n_ranks=n_ranks, n_microbatches=m, stages_per_rank=v)
    except ValueError as exc:
        raise PipelineError(f"pipeline.n_microbatches: {exc}") from None


def check_section(section: PipelineSection) -> None:
    """Raise :class:`PipelineError` unless the section is one torch can run: a schedule it offers,
    ``m`` dividing the batch, ``K = p v`` stages in index order on the schedule's ranks, each with
    at least one block, the blocks contiguous and every module in one stage."""
    s = section
    _check_schedule_shape(s.schedule, s.n_ranks, s.stages_per_rank, s.n_microbatches, s.batch_size)
    _check_torch_accepts(s.schedule, s.n_ranks, s.stages_per_rank, s.n_microbatches)
    if s.data_parallel not in DATA_PARALLEL:
        raise PipelineError(f"pipeline.data_parallel: {s.data_parallel!r}; valid: {', '.join(DATA_PARALLEL)}")
    k = s.n_ranks * s.stages_per_rank
    if len(s.stages) != k:
        raise PipelineError(f"pipeline.stages: {len(s.stages)} stages, expected n_ranks x stages_per_rank = {k}")
    ranks = stage_to_rank(s.n_ranks, k, v_shape=s.schedule in V_SHAPED)
    seen: set[str] = set()
    for i, st in enumerate(s.stages):
        if st.index != i or st.rank != ranks[i]:
            raise PipelineError(f"pipeline.stages[{i}]: index {st.index} on rank {st.rank}, expected stage {i} on "
                                f"rank {ranks[i]} ({s.schedule})")
        if st.end_block <= st.first_block or (i and st.first_block != s.stages[i - 1].end_block) \
                or (i == 0 and st.first_block != 0):
            raise PipelineError(f"pipeline.stages[{i}]: blocks [{st.first_block}, {st.end_block}) are empty or not "
                                "contiguous with the previous stage's")
        twice = seen.intersection(st.modules)
        if twice:
            raise PipelineError(f"pipeline.stages[{i}]: module {sorted(twice)[0]!r} is in two stages")
        seen.update(st.modules)
    _check_recompute(s)
    for path, style in s.tensor_parallel:
        if style not in TENSOR_PARALLEL_STYLES:
            raise PipelineError(f"pipeline.tensor_parallel[{path!r}]: {style!r}; valid: "
                                f"{', '.join(TENSOR_PARALLEL_STYLES)}")
        if not any(path.startswith(m + ".") for st in s.stages for m in st.modules):
            raise PipelineError(f"pipeline.tensor_parallel: {path!r} is in no stage's modules")
    if s.sequence_parallel and not s.tensor_parallel:
        raise PipelineError("pipeline.sequence_parallel: true needs a tensor_parallel layout to split the "
                            "sequence over tp")


def tensor_parallel_from_params(params: Mapping[str, str], dim_names: Sequence[str], linears: Sequence[str], *,
                                mesh_dim: str = "tp") -> tuple[tuple[str, str], ...]:
    """The column / row layout of ``linears`` in a plan's parameter placements (``Plan.params``:
    name -> one placement per mesh dim of ``dim_names``): ``colwise`` where the weight is
    ``S(0)`` on ``mesh_dim``, ``rowwise`` where ``S(1)``; replicated linears are left out.
    A weight split otherwise on ``mesh_dim`` raises :class:`PipelineError`, one line."""
    from costmodel.placements import PlacementParseError, Replicate, Shard, parse_placements

    names = tuple(dim_names)
    if mesh_dim not in names:
        raise PipelineError(f"pipeline.tensor_parallel: the plan's mesh dims {list(names)} have no {mesh_dim!r}")
    at = names.index(mesh_dim)
    layout = []
    for path in linears:
        text = params.get(f"{path}.weight")
        if text is None:
            raise PipelineError(f"pipeline.tensor_parallel: the plan places no parameter {path}.weight")
        try:
            placements = parse_placements(text)
        except PlacementParseError as exc:
            raise PipelineError(f"pipeline.tensor_parallel: {path}.weight: {exc}") from None
        if len(placements) != len(names):
            raise PipelineError(f"pipeline.tensor_parallel: {path}.weight is placed {text!r}, not one placement per "
                                f"mesh dim of {list(names)}")
        p = placements[at]
        if type(p) is Shard and p.dim in (0, 1):
            layout.append((path, "colwise" if p.dim == 0 else "rowwise"))
        elif not isinstance(p, Replicate):
            raise PipelineError(f"pipeline.tensor_parallel: {path}.weight is {text!r}; a stage runs a linear split "
                                f"S(0) or S(1) on {mesh_dim!r}, or replicated")
    return tuple(layout)


def priced_sequence_parallel(recompute: str, tensor_parallel: Sequence[tuple[str, str]]) -> bool:
    """Whether stages with this recomputation policy and tp layout run sequence parallel: wherever
    there is a layout to run, as torchtitan's TP does. The pipeline search prices the blocks' kept
    residual stream sequence-split over ``tp`` under either policy (``autoshard.search.pipeline_blocks``
    (h'): a checkpointed block's kept input; (h''): without recomputation, the block's input and
    mid-residual and the norms' saved statistics), so the stages run so; ``recompute`` no longer
    changes the answer and stays for the callers that pass it.

    >>> priced_sequence_parallel("none", (("l.0.wq", "colwise"),)), priced_sequence_parallel("full", ())
    (True, False)
    """
    if recompute not in SECTION_RECOMPUTE:
        raise PipelineError(f"pipeline.recompute: {recompute!r}; valid: {', '.join(SECTION_RECOMPUTE)}")
    return bool(tensor_parallel)


def build_pipeline_section(
    *,
    schedule: str,
    n_ranks: int,
    n_microbatches: int,
    batch_size: int,
    block_paths: Sequence[str],
    cuts: Sequence[int],
    leading: Sequence[str] = (),
    trailing: Sequence[str] = (),
    stages_per_rank: int = 1,
    mesh_dim: str = "pp",
    send_bytes: int = 0,
    data_parallel: str = "fsdp",
    stage_seconds: Sequence[tuple[float, float]] = (),
    rank_peak_bytes: Sequence[float] = (),
    step_s: float | None = None,
    bubble_fraction: float | None = None,
    tensor_parallel: Sequence[tuple[str, str]] = (),
    recompute: str = "none",
    sequence_parallel: bool = False,
    recompute_blocks: Sequence[int] = (),
    selective_blocks: Sequence[int] = (),
    all_mm_blocks: Sequence[int] = (),
) -> PipelineSection:
    """The section of ``K = n_ranks * stages_per_rank`` stages cut at ``cuts`` (the first block of
    every stage but the first, ``K - 1`` of them, as ``costmodel.stage_cuts.StageCuts.cuts``):
    ``leading`` (the modules before the blocks: the embedding) go to stage 0, ``trailing`` (after
    them: final norm, head) to stage ``K - 1``. The priced figures, when given: ``stage_seconds``
    (forward, backward) per stage, ``rank_peak_bytes`` per rank of the pipeline dim, ``step_s`` and
    ``bubble_fraction``; ``recompute_blocks``, with ``recompute="partial"``, the checkpointed blocks of
    each stage, ``selective_blocks`` those after them under the op-level policy and ``all_mm_blocks``
    those after these saving every matmul (each empty, or all zero: its key is not written). Bad
    input raises :class:`PipelineError`, one line.

    >>> build_pipeline_section(schedule="1F1B", n_ranks=4, n_microbatches=4, batch_size=8,
    ...                        block_paths=("l.0", "l.1"), cuts=(1, 1, 1))
    Traceback (most recent call last):
    ...
    autoshard.plan.pipeline_section.PipelineError: pipeline: 4 stages need at least 4 blocks; the model has 2 (3 block boundaries at most: 1 inner)
    """
    _check_schedule_shape(schedule, n_ranks, stages_per_rank, n_microbatches, batch_size)
    k, n = n_ranks * stages_per_rank, len(block_paths)
    if k > n:
        raise PipelineError(f"pipeline: {k} stages need at least {k} blocks; the model has {n} "
                            f"({n + 1} block boundaries at most: {max(0, n - 1)} inner)")
    bounds = (0, *cuts, n)
    if len(cuts) != k - 1 or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise PipelineError(f"pipeline.cuts: {list(cuts)} is not {k - 1} increasing block indices inside 1..{n - 1}")
    _check_torch_accepts(schedule, n_ranks, stages_per_rank, n_microbatches)
    ranks = stage_to_rank(n_ranks, k, v_shape=schedule in V_SHAPED)
    if stage_seconds and len(stage_seconds) != k or rank_peak_bytes and len(rank_peak_bytes) != n_ranks \
            or recompute_blocks and len(recompute_blocks) != k or selective_blocks and len(selective_blocks) != k \
            or all_mm_blocks and len(all_mm_blocks) != k:
        raise PipelineError(f"pipeline: {len(stage_seconds)} stage times / {len(rank_peak_bytes)} rank peaks / "
                            f"{len(recompute_blocks)} checkpointed-block counts / {len(selective_blocks)} selective / "
                            f"{len(all_mm_blocks)} all-mm for {k} stages on {n_ranks} ranks")
    stages = tuple(PipelineStagePlan(
        i, ranks[i], bounds[i], bounds[i + 1],
        (*(leading if i == 0 else ()), *block_paths[bounds[i]:bounds[i + 1]], *(trailing if i == k - 1 else ())),
        *(stage_seconds[i] if stage_seconds else (None, None)),
        float(rank_peak_bytes[ranks[i]]) if rank_peak_bytes else None,
        int(recompute_blocks[i]) if recompute_blocks else None,
        int(selective_blocks[i]) if any(selective_blocks) else None,
        int(all_mm_blocks[i]) if any(all_mm_blocks) else None)
        for i in range(k))
    section = PipelineSection(mesh_dim, schedule, n_ranks, stages_per_rank, n_microbatches, batch_size, stages,
                              int(send_bytes), data_parallel, step_s, bubble_fraction,
                              tuple((str(p), str(v)) for p, v in tensor_parallel), recompute,
                              bool(sequence_parallel))
    check_section(section)
    return section


# -- JSON Schema of the section -------------------------------------------------------------

_COUNT = {"type": "integer", "minimum": 1}
_INDEX = {"type": "integer", "minimum": 0}

_STAGE = {
    "type": "object",
    "required": ["index", "rank", "blocks", "modules"],
    "properties": {
        "index": _INDEX,
        "rank": {**_INDEX, "description": "Coordinate along the pipeline mesh dim."},
        "blocks": {"type": "array", "prefixItems": [_INDEX, _INDEX], "minItems": 2, "maxItems": 2,
                   "description": "[first, end) of the model's repeated blocks this stage runs."},
        "modules": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                    "description": "Module paths in forward order (embedding on stage 0, head on the last)."},
        "forward_s": {"type": "number", "minimum": 0, "description": "Priced forward of one microbatch."},
        "backward_s": {"type": "number", "minimum": 0, "description": "Priced backward of one microbatch."},
        "peak_bytes": {"type": "number", "minimum": 0, "description": "Priced peak memory of the stage's rank."},
        "recompute_blocks": {**_INDEX, "description": "With recompute partial (and only then): how many of the "
                                                      "stage's blocks, from its first, are checkpointed."},
        "recompute_selective_blocks": {**_INDEX, "description": "With recompute partial (and only then): how many "
                                       "of the stage's blocks after its checkpointed ones run the op-level "
                                       "(selective) policy; absent: 0."},
        "recompute_all_mm_blocks": {**_INDEX, "description": "With recompute partial (and only then): how many of "
                                    "the stage's blocks after its selective ones run the op-level policy saving "
                                    "every matmul's output (selective_all_mm); absent: 0."},
    },
    "additionalProperties": False,
}

PIPELINE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["mesh_dim", "schedule", "n_ranks", "stages_per_rank", "n_microbatches", "batch_size", "stages"],
    "properties": {
        "version": {"const": PIPELINE_VERSION},
        "mesh_dim": {"type": "string", "description": "The pipeline dim of the plan's mesh (pp)."},
        "schedule": {"enum": list(SCHEDULE_NAMES),
                     "description": "torch.distributed.pipelining.schedules.get_schedule_class name."},
        "n_ranks": _COUNT,
        "stages_per_rank": _COUNT,
        "n_microbatches": _COUNT,
        "batch_size": {**_COUNT, "description": "Global batch (sequences); n_microbatches divides it."},
        "send_bytes": {"type": "integer", "minimum": 0,
                       "description": "Bytes one rank sends across a boundary per microbatch (0: not priced)."},
        "data_parallel": {"enum": list(DATA_PARALLEL),
                          "description": "How each stage runs over its data-parallel sub-mesh."},
        "step_s": {"type": "number", "minimum": 0, "description": "Priced step."},
        "bubble_fraction": {"type": "number", "minimum": 0, "maximum": 1,
                            "description": "Priced idle share of the busiest rank's step."},
        "recompute": {"enum": list(SECTION_RECOMPUTE),
                      "description": "none; full: every block's forward recomputed before its backward; partial: "
                                     "the first recompute_blocks blocks of each stage, the next "
                                     "recompute_selective_blocks under the op-level policy, the next "
                                     "recompute_all_mm_blocks under the one saving every matmul."},
        "tensor_parallel": {"type": "object", "additionalProperties": {"enum": list(TENSOR_PARALLEL_STYLES)},
                            "description": "Linear module path -> colwise / rowwise on mesh dim tp, "
                                           "inside the stages."},
        "sequence_parallel": {"type": "boolean",
                              "description": "Residual stream between blocks split along the sequence over tp "
                                             "(written only when true)."},
        "stages": {"type": "array", "items": _STAGE, "minItems": 1},
    },
    "additionalProperties": False,
}
"""Schema of the ``pipeline`` section."""
