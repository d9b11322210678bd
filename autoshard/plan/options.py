"""Solve options: every choice a solve takes besides the model and the mesh,
each declared once, with its default, in :class:`SolveOptions`.

Why one object: the command line (``autoshard solve``), the Python API
(:func:`autoshard.solve`, :func:`~autoshard.search.solve.prepare`,
:func:`~autoshard.search.solve.solve_prepared`), the mesh search and the
runtime (:func:`autoshard.autoshard`) each took the same dozen keywords with
their own copies of the defaults; a default changed in one place then
silently differed in another. Each entry point now builds one
``SolveOptions`` and hands it down; the keyword forms of the public functions
build it from their keywords.

"No memory limit" has one spelling, :data:`NO_MEMORY_LIMIT` (``math.inf``);
``memory_limit=None`` means the device memory of the hardware profile.

>>> options = SolveOptions(memory_limit=2**30, pins={"*.w1.weight": "S(0)"})
>>> options.backend == DEFAULT_BACKEND, options.time_limit
(True, 60.0)
>>> options.with_changes(time_limit=5).time_limit
5
>>> SolveOptions(time_limit=0)
Traceback (most recent call last):
...
ValueError: time_limit: must be a positive number of seconds, got 0
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from costmodel.buckets.grouping import DEFAULT_BUCKET_BYTES, dtype_itemsize
from costmodel.expert_parallel import DEFAULT_IMBALANCE
from hw_profiles import HardwareProfile
from solver.backends import DEFAULT_BACKEND

__all__ = ["SolveOptions", "solve_options", "DEFAULT_PROFILE", "DEFAULT_CPU_PROFILE", "DEFAULT_TIME_LIMIT_S",
           "DEFAULT_SEARCH_TIME_LIMIT_S", "DEFAULT_BACKEND", "NO_MEMORY_LIMIT", "BUILD_FIELDS", "PLAN_GAP", "OVERLAP_ROUNDS", "profile_for_device",
           "PROFILE_CORRECTIONS", "EngineOptions", "refuse_engine_options"]

DEFAULT_PROFILE = "h100-sxm-80gb"
"""The hardware profile priced when none is given (off a CPU mesh)."""

DEFAULT_CPU_PROFILE = "cpu-gloo"
"""The profile priced for a CPU mesh when none is given (:func:`autoshard.autoshard`)."""

DEFAULT_TIME_LIMIT_S = 60.0
"""The whole solve's time limit when none is given (seconds)."""

DEFAULT_SEARCH_TIME_LIMIT_S = 600.0
"""``autoshard solve --devices N``'s default: a search solves every mesh layout."""

NO_MEMORY_LIMIT = math.inf
"""``memory_limit`` that means: no limit (the expert baselines' comparison rows)."""

PLAN_GAP = 1e-6
"""Relative gap at which a plan counts as optimal: a millionth of the step
time is below the cost model's own accuracy by orders of magnitude."""

BUILD_FIELDS = ("profile", "optimizer", "optimizer_impl", "mixed_precision", "allow_uneven", "search", "bucket_bytes",
                "recompute", "gather", "reduce_dtype", "device_type", "profile_correction", "expert_imbalance")
"""The options that decide the strategy graph (:func:`~autoshard.search.solve.prepare` reads
these; the solve reads the others, and ``recompute`` too)."""

PROFILE_CORRECTIONS = ("auto", "here", "remeasure", "calibrate", "off")
"""``profile_correction`` values (:attr:`SolveOptions.profile_correction`)."""

OVERLAP_ROUNDS = 2
"""Solves after the first one with gradient and parameter-gather edges priced at
their exposed time (``autoshard.search.overlap_objective``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveOptions:
    """What a solve is asked for, besides the model and the mesh (module docstring).

    >>> SolveOptions(recompute="none").recompute
    'none'
    """

    profile: str | HardwareProfile = DEFAULT_PROFILE
    """Hardware profile: a shipped name, a file, or a loaded profile."""
    memory_limit: float | None = None
    """Bytes per device; None: the profile's usable memory (``DeviceSpec.usable_memory_bytes``: its memory
    less the allocator's headroom); :data:`NO_MEMORY_LIMIT`: none."""
    pins: Mapping[str, str] = field(default_factory=dict)
    """Placements fixed by name pattern (``{"*.tok_embeddings.weight": "S(0)R"}``)."""
    time_limit: float = DEFAULT_TIME_LIMIT_S
    """Seconds for the whole solve: the seed of a seeded search, the solve, the overlap rounds
    and the expert baselines all take their share of it (through ``autoshard.solve`` and
    ``autoshard solve``, the trace and the build too: ``solve_prepared(started=)``)."""
    backend: str = DEFAULT_BACKEND
    """Integer-program backend (``solver.backends``)."""
    ties: bool = True
    """Repeated layers take the same strategies (False: each chooses its own)."""
    optimizer: str = "adamw"
    """Optimizer whose state is counted: ``adamw``, ``sgd``, ``sgd-momentum`` or ``none``."""
    optimizer_impl: str = "auto"
    """How the optimizer runs (``autoshard.graph.memory``): ``foreach``, ``fused``, ``for-loop``, or
    ``auto``, torch.optim's default for the profile's device (foreach on GPUs, for-loop on CPU); each
    has its own kernels (time) and temporaries (memory)."""
    mixed_precision: bool = False
    """Parameters kept in fp32 beside bf16 compute copies (memory only)."""
    baseline: str | None = None
    """An expert baseline to impose (``ddp``, ``fsdp``, ``tp``, ``fsdp+tp``; ``autoshard.search.baselines``)."""
    tp_table: Mapping[str, str | int] | None = None
    """The tensor-parallel table of the ``tp`` layouts (``autoshard.search.baselines``)."""
    search: str = "auto"
    """``full``, ``seeded`` (restricted near a coarse mesh's plan) or ``auto`` (seeded from 3 mesh dims)."""
    recompute: str = "auto"
    """Recomputation: ``auto`` (the solver chooses), ``none``, ``full``, ``selective``, ``every:K``."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """The runtime's gradient bucket cap (0: one collective per gradient)."""
    allow_uneven: bool = False
    """Strategies that split a tensor dim unevenly."""
    gather: str = "reader"
    """When gathered parameter copies are held: ``reader`` (autoshard's runtime) or ``fsdp2``
    (priced as FSDP2 runs: a unit's parameters gathered at once a unit ahead, its gradients
    reduced together after its backward; a comparison with FSDP2, not a plan for the runtime)."""
    reduce_dtype: str | None = None
    """With ``gather="fsdp2"``: the dtype FSDP2 reduces gradients in (its
    ``MixedPrecisionPolicy.reduce_dtype``; torchtitan's ``float32``): a unit's gradients are
    cast into one buffer of that dtype, which the memory and the collective carry. None:
    the gradients' own dtype."""
    expert_imbalance: float = DEFAULT_IMBALANCE
    """The busiest expert-parallel rank's routed tokens over the mean (>= 1; 1.25: a load-balanced
    router, ``costmodel.expert_parallel``): prices the expert-parallel strategies of MoE layers
    (compute at that load, exchanges that size). Recorded in ``plan.options`` only for a graph
    that has such strategies."""
    expandable_segments: bool = False
    """The plan runs with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (torchtitan's
    launcher sets it): ``estimate.reserved_bytes`` replays that allocator
    (``autoshard.program.reservation``) instead of the default one. Pricing only: the runtime does not
    set the variable."""
    allow_over_reservation: bool = False
    """Accept a plan whose live peak fits the memory limit but whose replayed caching-allocator
    reservation (``estimate.reserved_bytes``) exceeds the device's memory (a warning says so). By
    default such a plan is solved again under a lower limit until its reservation fits, or the solve
    raises ``InfeasibleMemoryError`` (``autoshard.search.solve.solve_prepared``)."""
    server: str | None = None
    """An ``autoshard serve`` URL that solves instead of this process (the same plan)."""
    overlap_rounds: int = OVERLAP_ROUNDS
    """Solves with overlap-priced edges after the first (0: none)."""
    device_type: str | None = None
    """The device type the plan runs on (``cpu``, ``cuda``): picks the per-device kernels
    its graph holds (``autoshard.trace.device``). None: the profile's
    (:attr:`hw_profiles.HardwareProfile.device_type`); set it to price a GPU profile
    for a plan that runs on CPU processes (tests, experiments)."""

    profile_correction: str = "auto"
    """Correct the profile for the machine at hand before pricing (``autoshard.calibrate.first_use``:
    a few seconds of reference ops on the job's ranks, cached per machine): ``here`` (cached
    correction, measured on a miss), ``remeasure`` (measure again), ``calibrate`` (a quick
    ``calibrate-hardware`` of this machine on the job's ranks first, cached per machine, then the
    ``here`` correction of that profile: ops priced as this machine runs them, ~2 minutes once),
    ``off``; ``auto`` is ``here``
    where the plan runs on the machine that solves it with a CPU profile (:func:`autoshard.autoshard`)
    and ``off`` elsewhere (``autoshard solve``, :func:`autoshard.solve`: a plan solved offline may run
    on another machine). ``plan.options["profile_correction"]`` records what was applied."""

    def __post_init__(self) -> None:
        if self.profile_correction not in PROFILE_CORRECTIONS:
            raise ValueError(f"profile_correction: must be one of {', '.join(PROFILE_CORRECTIONS)}, "
                             f"got {self.profile_correction!r}")
        if not 0 < self.time_limit < math.inf:
            raise ValueError(f"time_limit: must be a positive number of seconds, got {self.time_limit}")
        if self.memory_limit is not None and not self.memory_limit > 0:
            raise ValueError(f"memory_limit: must be a positive number of bytes, got {self.memory_limit}")
        if self.device_type not in (None, "cpu", "cuda"):
            raise ValueError(f"device_type: must be cpu or cuda (or None: the profile's), got {self.device_type!r}")
        if self.reduce_dtype is not None:
            if self.gather != "fsdp2":
                raise ValueError("reduce_dtype: priced only as FSDP2 reduces (gather='fsdp2'); autoshard's "
                                 "runtime reduces gradients in their own dtype")
            dtype_itemsize(self.reduce_dtype)  # ValueError naming the dtypes it knows
        if not (isinstance(self.expert_imbalance, (int, float)) and 1.0 <= self.expert_imbalance < math.inf):
            raise ValueError(f"expert_imbalance: must be a number >= 1 (busiest rank's tokens over the mean), "
                             f"got {self.expert_imbalance!r}")
        if self.overlap_rounds < 0:
            raise ValueError(f"overlap_rounds: must be 0 or more, got {self.overlap_rounds}")
        object.__setattr__(self, "pins", dict(self.pins or {}))

    def memory_limit_bytes(self, profile: HardwareProfile) -> float:
        """The memory limit in bytes: :attr:`memory_limit`, or ``profile``'s usable memory when None.

        >>> from hw_profiles import load
        >>> SolveOptions(memory_limit=2**30).memory_limit_bytes(load("cpu-gloo"))
        1073741824.0
        """
        return float(profile.device.usable_memory_bytes if self.memory_limit is None else self.memory_limit)

    def with_changes(self, **changes: Any) -> SolveOptions:
        """A copy with ``changes`` (``TypeError`` naming an unknown option)."""
        return dataclasses.replace(self, **changes) if changes else self

    def fields(self) -> dict[str, Any]:
        """Every option with its value (an empty mapping as None), as a cache key reads it."""
        return {f.name: _key_value(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _key_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(sorted(value.items())) or None
    return value


def solve_options(options: SolveOptions | None, changes: Mapping[str, Any]) -> SolveOptions:
    """``options`` (default: every default) with the keyword ``changes`` of a
    public function's keyword form; ``TypeError`` naming an unknown one.

    >>> solve_options(None, {"backend": "cpsat"}).backend
    'cpsat'
    >>> solve_options(None, {"colour": "red"})
    Traceback (most recent call last):
    ...
    TypeError: unknown solve option 'colour' (SolveOptions has no such field)
    """
    names = {f.name for f in dataclasses.fields(SolveOptions)}
    for name in changes:
        if name not in names:
            raise TypeError(f"unknown solve option {name!r} (SolveOptions has no such field)")
    if options is None:
        return SolveOptions(**changes)
    return options.with_changes(**changes)


def profile_for_device(device_type: str) -> str:
    """The profile priced when none is given: :data:`DEFAULT_CPU_PROFILE` on a CPU
    mesh, :data:`DEFAULT_PROFILE` otherwise.

    >>> profile_for_device("cpu"), profile_for_device("cuda")
    ('cpu-gloo', 'h100-sxm-80gb')
    """
    return DEFAULT_CPU_PROFILE if device_type == "cpu" else DEFAULT_PROFILE


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """Engine features a plan's step is priced with besides autoshard's runtime: what torchtitan's
    large runs turn on (``autoshard.assembly.engine_pricing`` prices them; docs/api.md).

    **Priced only.** autoshard's runtime runs neither (no float8 casts, no symmetric-memory
    collective matmuls, on gloo or CUDA): a plan repriced with any of them records it in
    ``plan.options["engine"]`` and the runtime refuses it (:func:`refuse_engine_options`), as it
    refuses a plan priced with FSDP2's ``reduce_dtype``. All default off.

    >>> EngineOptions(float8_linears=True, float8_all_gather=True).to_dict()
    {'float8_linears': True, 'float8_all_gather': True, 'async_tp': False}
    >>> EngineOptions(float8_all_gather=True)
    Traceback (most recent call last):
    ...
    ValueError: float8_all_gather: needs float8_linears (torchao gathers Float8Linear weights in float8)
    """

    float8_linears: bool = False
    """The repeated blocks' linear layers as torchao's ``Float8Linear`` (tensorwise dynamic
    scaling): their three matmuls in fp8 at the profile's fp8 peak and efficiency, the
    ``amax`` and casts as memory-bound ops (``costmodel.float8``)."""
    float8_all_gather: bool = False
    """FSDP gathers those weights in float8 (torchao's ``enable_fsdp_float8_all_gather``):
    half the bytes of a bf16 gather, the cast made on the shard before it."""
    async_tp: bool = False
    """torch's micro-pipelined async TP: a ``tp`` all-gather feeding a matmul, or a ``tp``
    reduce-scatter of a matmul's output, run as one collective matmul of ``tp`` chunks
    (``costmodel.async_tp``)."""

    def __post_init__(self) -> None:
        for name in ("float8_linears", "float8_all_gather", "async_tp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be true or false, got {getattr(self, name)!r}")
        if self.float8_all_gather and not self.float8_linears:
            raise ValueError("float8_all_gather: needs float8_linears (torchao gathers Float8Linear weights in float8)")

    @property
    def any(self) -> bool:
        """Whether any feature is on (a plan priced so cannot run on autoshard's runtime)."""
        return self.float8_linears or self.async_tp

    def to_dict(self) -> dict[str, bool]:
        return {"float8_linears": self.float8_linears, "float8_all_gather": self.float8_all_gather,
                "async_tp": self.async_tp}

    @classmethod
    def from_dict(cls, data: Any) -> "EngineOptions":
        """From ``plan.options["engine"]`` (``ValueError`` naming an unknown key).

        >>> EngineOptions.from_dict({"async_tp": True}).async_tp
        True
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"engine: expected an object of options, got {data!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"engine.{key}: unknown engine option (known: {', '.join(sorted(known))})")
        return cls(**dict(data))


def refuse_engine_options(options: Mapping[str, Any]) -> None:
    """Raise a one-line ``ValueError`` when ``plan.options`` records engine features autoshard's
    runtime does not run (:class:`EngineOptions`: priced only).

    >>> refuse_engine_options({"engine": {"float8_linears": False}})
    >>> refuse_engine_options({"engine": {"async_tp": True}})
    Traceback (most recent call last):
    ...
    ValueError: plan: priced with async_tp (torchtitan's engine features); autoshard's runtime runs bf16 linears and waits for each TP collective: price the plan without them to run it
    """
    engine = options.get("engine")
    if engine is None:
        return
    on = [k for k, v in EngineOptions.from_dict(engine).to_dict().items() if v]
    if on:
        raise ValueError(f"plan: priced with {', '.join(on)} (torchtitan's engine features); autoshard's runtime "
                         "runs bf16 linears and waits for each TP collective: price the plan without them to run it")
