"""Numerical validator of sharding rules on a simulated mesh (no process group).

For a rule and a random valid call (the rule's ``samples``), every N-D
strategy that the registry enumerates on small meshes is checked:

1. every input is split into the local tensor of each rank per its input
   placements: ``S``/``_S``/``R`` by ``costmodel.simulate.shard``, one mesh dim
   at a time; on a ``P(op)`` mesh dim the value is cut into *random* pieces
   that reduce to it (``sum``: random addends with mixed signs; ``avg``:
   addends of ``m*x``; ``max``/``min``: one random owner per element holds
   the value, the others something smaller/larger);
2. the op runs on each rank's local tensors (non-tensor args localised by
   the rule, e.g. the target shape of a view);
3. each output is compared with the unsharded op: with no partial, every
   rank's local tensor must equal the matching shard of the reference (shape
   and values); with partials, replicas must agree and
   ``costmodel.simulate.unshard`` (which reduces ``P(...)``) must give the
   reference.

Tolerances are per dtype (:data:`TOLERANCE`, relative to the largest value),
because split reductions add in another order. Where the kernel's rounding
depends on the shapes it is given (BLAS: summation order, blocking, scaling
by ``alpha`` before or after), a fixed tolerance is unsound near the dtype's
range, and the rule carries an ``error_bound``: every output is then
compared with the op run in float64 within a forward error bound that holds
for any evaluation order (:mod:`autoshard.rules.error_bounds`). A
low-precision sample that misses the tolerance only is checked again in
float64, where rounding that the op itself amplifies (``1/sqrt(eps)`` in a
layer-norm backward over one element) vanishes and a wrong rule does not. Random ops are checked by their
contract (shapes, value range, mask consistency) with a per-rank seed, since
their values cannot match an unsharded run.

Meshes (cycled over cases): ``(2,)``, ``(3,)``, ``(2, 2)``, ``(2,)`` with strided
shards of split factor 2, and ``(3,)`` with uneven sizes for rules that allow
uneven splits.

Command line::

    python -m autoshard.cli.validate_rules --op aten.mm.default
    autoshard validate-rules [--op NAME] [--family NAME] [--cases N]

>>> from autoshard.rules import load_rules
>>> import torch
>>> registry = load_rules()
>>> report = validate_rule(registry.rule_for(torch.ops.aten.mm.default), registry, cases=2)
>>> report.ok, report.strategies_checked > 0
(True, True)
"""

from __future__ import annotations

import fnmatch
import random
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from costmodel import simulate
from costmodel.shard_shapes import local_shape
from costmodel.placements import Partial, Placement, Replicate

from autoshard.rules.calls import flatten_results, ordered_tensor_args, replace_tensors
from autoshard.validation.compare import TOLERANCE, big_magnitude as _big, compare_bounded, compare_output as _compare_output, distribute, widen
from autoshard.rules.core import OpCall, OpStrategy, TensorMeta, to_meta
from autoshard.rules.expand import expand_rule
from autoshard.rules.registry import Rule, RuleRegistry, SampleInput, op_name
from autoshard.rules.samples import VARIANTS, Sampler, variant

__all__ = [
    "TOLERANCE",
    "MeshCase",
    "MESH_CASES",
    "Failure",
    "RuleReport",
    "distribute",
    "check_strategy",
    "validate_rule",
    "DERIVED_RULE_MESH_CASES",
    "check_derived_rule",
    "validate_registry",
    "format_reports",
    "select_ops",
    "unavailable_named",
]



@dataclass(frozen=True, slots=True)
class MeshCase:
    """A mesh and the sizes, options that go with it."""

    mesh_shape: tuple[int, ...]
    sizes: tuple[int, ...]
    allow_uneven: bool = False
    strided_factors: tuple[int, ...] = ()


MESH_CASES: tuple[MeshCase, ...] = (
    MeshCase((2,), (4, 8, 12)),
    MeshCase((2, 2), (4, 8)),
    MeshCase((3,), (6, 12)),
    MeshCase((2,), (4, 8), strided_factors=(2,)),
    MeshCase((3,), (4, 5, 7), allow_uneven=True),
)
"""Cycled over a rule's cases (the uneven one only for rules that allow it)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """One strategy that did not reproduce the unsharded op."""

    mesh_shape: tuple[int, ...]
    strategy: str
    sample: str
    message: str

    def __str__(self) -> str:
        return f"mesh {self.mesh_shape} {self.strategy} on {self.sample}: {self.message}"


@dataclass(slots=True)
class RuleReport:
    """What validating one rule found."""

    op: str
    family: str
    cases: int = 0
    strategies_checked: int = 0
    failures: list[Failure] = field(default_factory=list)
    skipped: str = ""
    seconds: float = 0.0
    variants_checked: int = 0
    """Dtype and extreme-value variants of the samples that the op took."""
    variants_rejected: int = 0
    """Variants the unsharded op rejected (a dtype it does not take)."""

    @property
    def ok(self) -> bool:
        return not self.failures


# --------------------------------------------------------------------------- one strategy


def _coord_seed(base: int, coord: tuple[int, ...], placements: tuple[Placement, ...] | None) -> int:
    """Same seed along replicated mesh dims (replicas draw the same numbers),
    different seeds along split ones."""
    seed = base
    for mesh_dim, c in enumerate(coord):
        if placements is None or not isinstance(placements[mesh_dim], Replicate):
            seed = seed * 31 + c + 1
    return seed


_LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex32)


def check_strategy(
    rule: Rule,
    sample: SampleInput,
    strategy: OpStrategy,
    mesh_shape: tuple[int, ...],
    reference: list[Any],
    gen: torch.Generator,
    shards: dict[Any, dict[tuple[int, ...], torch.Tensor]] | None = None,
) -> str | None:
    """Run one strategy on simulated shards; None if it matches ``reference``
    (the flattened outputs of the unsharded op), else what differs.

    ``shards``: a dict kept by the caller across the strategies of one
    sample on one mesh, to reuse the local inputs of placements without
    partials (they are not random); ignored for ops that mutate an input.

    A sample in a low-precision float type that misses only the tolerance
    is checked again in float64 (every float tensor widened, dtype arguments
    kept): an op that amplifies rounding (a layer norm backward over one
    element multiplies by ``1/sqrt(eps)``) misses a fixed tolerance on the
    random pieces of a partial, which no rule causes. It fails only if it
    fails in float64 too, where a wrong rule still misses by its error."""
    msg = _check_once(rule, sample, strategy, mesh_shape, reference, gen, shards)
    if msg is None or "max |difference|" not in msg:
        return msg
    tensors = _flat_tensors(rule.op, sample) + [r for r in reference if isinstance(r, torch.Tensor)]
    if not any(t.dtype in _LOW_PRECISION for t in tensors):
        return msg
    wide = SampleInput(widen(tuple(sample.args)), widen(dict(sample.kwargs)))
    try:
        with torch.no_grad():
            wide_reference = flatten_results((rule.reference or rule.op)(*wide.args, **wide.kwargs))
    except Exception:  # noqa: BLE001 - the op takes no float64: the first answer stands
        return msg
    if _check_once(rule, wide, strategy, mesh_shape, wide_reference, gen) is None:
        return None
    return msg


def _check_once(
    rule: Rule,
    sample: SampleInput,
    strategy: OpStrategy,
    mesh_shape: tuple[int, ...],
    reference: list[Any],
    gen: torch.Generator,
    shards: dict[Any, dict[tuple[int, ...], torch.Tensor]] | None = None,
) -> str | None:
    """:func:`check_strategy` without the float64 retry."""
    op = rule.op
    flat_inputs = _flat_tensors(op, sample)
    if shards is not None and op._schema.is_mutable:
        shards = None
    local_inputs: list[dict[tuple[int, ...], torch.Tensor]] = []
    for j, t in enumerate(flat_inputs):
        placements = strategy.input_placements[j] or (Replicate(),) * len(mesh_shape)
        key = (j, placements) if shards is not None and not any(isinstance(p, Partial) for p in placements) else None
        if key is not None and key in shards:
            local_inputs.append(shards[key])
            continue
        try:
            local_inputs.append(distribute(t, placements, mesh_shape, gen))
        except ValueError as exc:
            return f"input {j}: {exc}"
        if key is not None:
            shards[key] = local_inputs[-1]
    coords = simulate.mesh_coords(mesh_shape)
    outputs: dict[tuple[int, ...], list[Any]] = {}
    bounds: dict[tuple[int, ...], Any] = {}
    first_out = next((p for p in strategy.output_placements if p is not None), None)
    for coord in coords:
        tensors = [local[coord] for local in local_inputs]
        args, kwargs = replace_tensors(op, sample.args, sample.kwargs, tensors)
        if rule.localize is not None:
            out_metas = tuple(
                None if (ref is None or pl is None) else TensorMeta(local_shape(tuple(ref.shape), pl, mesh_shape, coord), ref.dtype)
                for ref, pl in zip(reference, strategy.output_placements)
            )
            in_metas = tuple(TensorMeta.of(t) for t in tensors)
            lcall = OpCall(op, to_meta(args), to_meta(kwargs), in_metas, out_metas)
            try:
                args, kwargs = rule.localize(args, kwargs, lcall)
            except Exception as exc:  # noqa: BLE001 - a rule bug, reported as a failure
                return f"rank {coord}: localize failed: {type(exc).__name__}: {_first_line(exc)}"
        if rule.contract is not None:
            torch.manual_seed(_coord_seed(1234, coord, first_out))
        try:
            result = (rule.reference or op)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the local op rejected its shards
            return f"rank {coord}: local op failed: {type(exc).__name__}: {_first_line(exc)}"
        outputs[coord] = flatten_results(result)
        if rule.error_bound is not None:
            bounds[coord] = rule.error_bound(op, args, kwargs)
    for coord, outs in outputs.items():
        if len(outs) != len(reference):
            return f"rank {coord}: {len(outs)} outputs, expected {len(reference)}"
    if rule.contract is not None:
        gathered = []
        for k, pl in enumerate(strategy.output_placements):
            if pl is None or reference[k] is None:
                gathered.append(None)
                continue
            locals_k = {c: outputs[c][k] for c in coords}
            try:
                # replicas of a random op agree by seeding, not by the rule
                gathered.append(simulate.unshard(locals_k, pl, mesh_shape, check_replicas=False))
            except simulate.SimulationError as exc:
                return f"output {k}: {exc}"
        return rule.contract(sample.args, sample.kwargs, tuple(gathered))
    exact = _exact_reference(rule, sample) if bounds and all(b is not None for b in bounds.values()) else None
    for k, ref in enumerate(reference):
        pl = strategy.output_placements[k]
        if ref is None or pl is None:
            continue
        locals_k = {c: outputs[c][k] for c in coords}
        if exact is not None and exact[0][k] is not None:
            msg = compare_bounded(k, locals_k, exact[0][k], pl, mesh_shape, {c: bounds[c][k] for c in coords},
                                  exact[1][k], ref.dtype)
        else:
            msg = _compare_output(k, locals_k, ref, pl, mesh_shape, _loosest(flat_inputs, ref))
        if msg:
            return msg
    return None


def _exact_reference(rule: Rule, sample: SampleInput) -> tuple[list[Any], list[Any]] | None:
    """The op in float64 (complex128) on the sample, and the error bound of
    that run; None where the rule gives no bound for it (integers)."""
    args, kwargs = widen(tuple(sample.args)), widen(dict(sample.kwargs))
    bound = rule.error_bound(rule.op, args, kwargs)
    if bound is None:
        return None
    with torch.no_grad():
        exact = flatten_results((rule.reference or rule.op)(*args, **kwargs))
    return exact, bound


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _loosest(inputs: Sequence[torch.Tensor], output: torch.Tensor) -> torch.dtype:
    """The dtype whose tolerance applies: the least precise float among the
    inputs and the output (a cast cannot be more exact than its source)."""
    dtypes = [t.dtype for t in list(inputs) + [output] if t.dtype in TOLERANCE]
    return max(dtypes, key=lambda d: TOLERANCE[d], default=output.dtype)


def _flat_tensors(op: Any, sample: SampleInput) -> list[torch.Tensor]:
    return ordered_tensor_args(op, sample.args, sample.kwargs)


def _describe(sample: SampleInput) -> str:
    def one(o: Any) -> str:
        if isinstance(o, torch.Tensor):
            return str(TensorMeta.of(o))
        if isinstance(o, (list, tuple)):
            return "[" + ", ".join(one(x) for x in o) + "]"
        return repr(o)

    parts = [one(a) for a in sample.args] + [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return "(" + ", ".join(parts) + ")"


# --------------------------------------------------------------------------- rules


def validate_rule(
    rule: Rule,
    registry: RuleRegistry | None = None,
    *,
    cases: int = 5,
    seed: int = 0,
    max_strategies: int = 40,
    mesh_cases: Sequence[MeshCase] = MESH_CASES,
    threads: int | None = 1,
) -> RuleReport:
    """Check ``rule`` on ``cases`` mesh cases (each with the samples the rule
    draws for it); every enumerated strategy, or a random ``max_strategies`` of
    them, is run (:func:`check_strategy`). ``threads``: intra-op threads
    while checking (None: the caller's setting)."""
    registry = registry or RuleRegistry()
    report = RuleReport(op_name(rule.op), rule.family)
    start = time.perf_counter()
    if rule.samples is None:
        report.skipped = rule.note or "no samples"
        return report
    # The tensors are tiny: intra-op threads only add overhead (100x for a
    # small CPU convolution backward).
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        _validate_cases(rule, registry, report, cases, seed, max_strategies, mesh_cases)
    finally:
        torch.set_num_threads(previous)
    report.seconds = time.perf_counter() - start
    return report


def _validate_cases(
    rule: Rule,
    registry: RuleRegistry,
    report: RuleReport,
    cases: int,
    seed: int,
    max_strategies: int,
    mesh_cases: Sequence[MeshCase],
) -> None:
    usable = [mc for mc in mesh_cases if rule.uneven or not mc.allow_uneven]
    for case in range(cases):
        mc = usable[case % len(usable)]
        case_seed = seed * 100_003 + case
        sampler = Sampler(case_seed, sizes=mc.sizes)
        rng = random.Random(case_seed)
        gen = torch.Generator().manual_seed(case_seed)
        report.cases += 1
        try:
            samples = list(rule.samples(sampler))
        except Exception as exc:  # noqa: BLE001 - a broken sampler is the rule's bug
            report.failures.append(Failure(mc.mesh_shape, "-", "-", f"samples failed: {type(exc).__name__}: {_first_line(exc)}"))
            continue
        kind = VARIANTS[case % len(VARIANTS)]
        for sample in samples:
            _check_sample(rule, registry, report, mc, sample, rng, gen, max_strategies)
            derived = variant(sample.args, sample.kwargs, kind, gen) if rule.extremes or kind != "extreme" else None
            if derived is not None:
                _check_sample(rule, registry, report, mc, SampleInput(*derived), rng, gen,
                              max(8, max_strategies // 2), variant_kind=kind)


def _extreme(tensors: Iterable[Any]) -> bool:
    """Whether any float tensor holds a non-finite value or one near its dtype's range."""
    return any(
        isinstance(t, torch.Tensor)
        and (t.is_floating_point() or t.is_complex())
        and t.numel() > 0
        and not bool((torch.isfinite(t) & (t.abs() <= _big(t.dtype))).all())
        for t in tensors
    )


def _feeds_sum(strategy: OpStrategy) -> bool:
    """Whether a sum or average partial goes into the op."""
    return any(
        isinstance(p, Partial) and p.reduce_op in ("sum", "avg")
        for ps in strategy.input_placements if ps is not None for p in ps
    )


def _check_sample(
    rule: Rule,
    registry: RuleRegistry,
    report: RuleReport,
    mc: MeshCase,
    sample: SampleInput,
    rng: random.Random,
    gen: torch.Generator,
    max_strategies: int,
    *,
    variant_kind: str = "",
) -> None:
    """Check every (or a random ``max_strategies`` of the) strategies of one sample."""
    desc = _describe(sample) + (f" [{variant_kind} variant]" if variant_kind else "")
    try:
        with torch.no_grad():
            reference = flatten_results((rule.reference or rule.op)(*sample.args, **sample.kwargs))
    except Exception as exc:  # noqa: BLE001 - a bad sample is the rule's bug
        if variant_kind:  # the op does not take this dtype: nothing to check
            report.variants_rejected += 1
            return
        report.failures.append(Failure(mc.mesh_shape, "-", desc, f"sample rejected by the op: {_first_line(exc)}"))
        return
    if variant_kind:
        report.variants_checked += 1
    try:
        # the reference outputs give the output shapes, also data-dependent ones
        call = registry.op_call(rule.op, to_meta(sample.args), to_meta(sample.kwargs), out_meta=to_meta(reference))
        strategies = expand_rule(rule, call, mc.mesh_shape, allow_uneven=mc.allow_uneven, strided_factors=mc.strided_factors)
    except Exception as exc:  # noqa: BLE001 - rule errors are reported, not raised
        report.failures.append(Failure(mc.mesh_shape, "-", desc, f"enumeration failed: {type(exc).__name__}: {_first_line(exc)}"))
        return
    # a strategy with an exchange (expert parallelism) is not a local op: the runtime's equivalence test checks it
    chosen = [s for s in strategies if s.exchange is None]
    # inf - inf is NaN: a sum of pieces meets an infinite (or overflowing)
    # factor once per piece, which the unsharded op meets once, and an
    # average of finfo.min overflows in its sum. Sum and avg partials are
    # exact within the dtype's range only, and are checked there.
    if _extreme(list(_flat_tensors(rule.op, sample)) + list(reference)):
        chosen = [s for s in chosen if not _feeds_sum(s)]
    if len(chosen) > max_strategies:
        chosen = [chosen[0]] + rng.sample(chosen[1:], max_strategies - 1)
    for strategy in chosen:
        report.strategies_checked += 1
        try:
            msg = check_strategy(rule, sample, strategy, mc.mesh_shape, reference, gen)
        except Exception as exc:  # noqa: BLE001 - e.g. a shard dim the simulator rejects
            msg = f"could not run the strategy: {type(exc).__name__}: {_first_line(exc)}"
        if msg:
            report.failures.append(Failure(mc.mesh_shape, str(strategy), desc, msg))


def _matches(name: str, pattern: str) -> bool:
    """An op name against an ``--op`` pattern (exact, glob, prefix, bare op name)."""
    return (fnmatch.fnmatch(name, pattern) or name.startswith(pattern.rstrip(".") + ".")
            or name.split(".")[1] == pattern)


def unavailable_named(registry: RuleRegistry, patterns: Sequence[str], families: Sequence[str]) -> list[str]:
    """Names of the rules registered by name (library ops) that the selection asks for."""
    return [named.name for named in registry.named_rules()
            if (not families or named.family in families)
            and (not patterns or any(_matches(named.name, p) or p in named.name for p in patterns))]


def select_ops(registry: RuleRegistry, patterns: Sequence[str] = (), families: Sequence[str] = ()) -> list[Any]:
    """Registered ops matching any name pattern (``aten.mm.default``, ``mm``,
    ``aten.mm``, globs, else any op whose name contains it) and family; all
    when none given. Library ops registered by name are defined first when
    the selection asks for them and their library is installed
    (``RuleRegistry.define_named``: imports it)."""
    if unavailable_named(registry, patterns, families):
        registry.define_named()
    ops = registry.ops()
    if families:
        unknown = set(families) - set(registry.families())
        if unknown:
            raise ValueError(f"--family: unknown {', '.join(sorted(unknown))} (known: {', '.join(registry.families())})")
        ops = [op for op in ops if registry.rule_for(op).family in families]
    if not patterns:
        return ops
    chosen = []
    for pattern in patterns:
        hits = [op for op in ops if _matches(op_name(op), pattern)]
        if not hits:  # a bare name: every op whose name contains it
            hits = [op for op in ops if pattern in op_name(op)]
        if not hits:
            raise ValueError(f"--op: no registered rule matches {pattern!r}")
        chosen.extend(op for op in hits if op not in chosen)
    return chosen


DERIVED_RULE_MESH_CASES: tuple[MeshCase, ...] = (MeshCase((2,), (4,)), MeshCase((2, 2), (4,)))
"""The meshes a rule derived at solve time is checked on: the smallest 1-D and 2-D ones, since
the check runs in the middle of a solve, on the shapes of the call that asked for the rule."""


def check_derived_rule(rule: Rule, registry: RuleRegistry, *, cases: int = 2) -> RuleReport:
    """The check a rule derived at solve time passes before it is used
    (:data:`autoshard.rules.dtensor_fallback.RuleCheck`): :func:`validate_rule` on
    ``cases`` of :data:`DERIVED_RULE_MESH_CASES`.

    >>> import torch
    >>> from autoshard.rules import TensorMeta, load_rules
    >>> rules = load_rules(dtensor_fallback=check_derived_rule)
    >>> x = TensorMeta((4, 8), torch.float32)   # hypot: no rule of ours, DTensor's passes the check
    >>> len(rules.strategies(torch.ops.aten.hypot.default, (x, x), {}, (2,))) > 1
    True
    """
    return validate_rule(rule, registry, cases=cases, mesh_cases=DERIVED_RULE_MESH_CASES)


def validate_registry(
    registry: RuleRegistry, ops: Iterable[Any] | None = None, *, cases: int = 5, seed: int = 0, max_strategies: int = 40
) -> list[RuleReport]:
    """:func:`validate_rule` for every (or each given) registered op."""
    reports = []
    for op in ops if ops is not None else registry.ops():
        rule = registry.rule_for(op)
        if rule is None:
            raise ValueError(f"{op_name(op)}: no registered rule to validate")
        reports.append(validate_rule(rule, registry, cases=cases, seed=seed, max_strategies=max_strategies))
    return reports


def format_reports(reports: Sequence[RuleReport], *, show_failures: int = 3) -> str:
    """A pass/fail table, then the first failures of each failing rule."""
    width = max([len(r.op) for r in reports] + [10])
    lines = [f"{'op':<{width}}  {'family':<13} {'cases':>5} {'checked':>8} {'failed':>6}  result"]
    for r in reports:
        result = "skip: " + r.skipped if r.skipped else ("PASS" if r.ok else "FAIL")
        lines.append(f"{r.op:<{width}}  {r.family:<13} {r.cases:>5} {r.strategies_checked:>8} {len(r.failures):>6}  {result}")
    failing = [r for r in reports if not r.ok]
    passed = sum(1 for r in reports if r.ok and not r.skipped)
    skipped = sum(1 for r in reports if r.skipped)
    lines.append(f"{passed} passed, {len(failing)} failed, {skipped} skipped, "
                 f"{sum(r.strategies_checked for r in reports)} strategies checked")
    for r in failing:
        for f in r.failures[:show_failures]:
            lines.append(f"FAIL {r.op}: {f}")
    return "\n".join(lines)
