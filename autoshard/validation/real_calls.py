"""Validate the strategies of the calls a real model makes, on their real shapes.

:mod:`autoshard.validation.validator` checks each rule on random calls that the
rule's own sampler draws at small sizes. A model calls an op with *its*
shapes, dtypes and arguments (a ``view`` to ``[2, 16, 4, 16]``, an
``embedding`` of a 256-row table, a ``_grouped_mm`` with ``offs``), and the
rule enumerates other strategies for that call. This module checks those:

1. every DISTINCT call of a traced joint graph (op, args and kwargs with
   :class:`~autoshard.rules.core.TensorMeta` in place of tensors, output
   metadata) is taken once, however many nodes make it;
2. each gets real tensors of exactly those shapes and dtypes, never shrunk
   (steps 1 and 2 live in :mod:`autoshard.validation.call_inputs`):

   * ``captured``: the values the call really receives when the joint graph
     runs on the model's parameters and example inputs (an fx interpreter
     records the first node of each distinct call), so that token ids,
     gather and scatter indices, ``_grouped_mm`` offsets, loss targets with
     ``ignore_index`` and attention masks are valid by construction;
   * ``synthesized``: random tensors made per op from the metadata alone
     (:func:`synthesize`; floats ``randn``, bools at random, integer
     tensors within the valid range of what they index: embedding rows,
     gather / scatter / index dims, class ids with a few ``ignore_index``,
     sorted group offsets, nonzero divisors). An op whose integer inputs
     have no known valid range, or that rejects the synthesized tensors, is
     not synthesized (and is reported as skipped when nothing else is there);

3. on each mesh, every strategy that ``RuleRegistry.strategies`` enumerates
   for the call is run on simulated shards by
   :func:`autoshard.validation.validator.check_strategy` and compared with the
   unsharded op. Where a sample holds extreme values (``-inf`` or
   ``finfo.min`` in a mask), strategies fed by a sum or average partial are
   not exact (``-inf + inf``) and are checked on the other (finite) sample
   only, as the validator does; a strategy no sample could check is counted
   as unchecked.

Ops with no rule get the replicate-only strategy (correct by construction)
and are counted, not checked; ``operator.getitem`` nodes are tuple access,
not calls.

>>> from examples.models import mlp
>>> model, inputs = mlp.tiny()
>>> report = validate_model(model, inputs, [(2,)])
>>> report.ok, report.calls > 0, report.strategies_checked > 0
(True, True, True)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autoshard.rules.calls import flatten_results, ordered_tensor_args
from autoshard.rules.core import OpStrategy, TensorMeta, to_meta
from autoshard.rules.registry import Rule, RuleRegistry, SampleInput, op_name
from autoshard.validation.call_inputs import CannotSample, RealCall, capture_samples, distinct_calls, synthesize
from autoshard.validation.validator import _extreme, _feeds_sum, _first_line, check_strategy

__all__ = [
    "MESHES",
    "RealFailure",
    "RealCallReport",
    "validate_traced",
    "validate_model",
]

MESHES: tuple[tuple[int, ...], ...] = ((2,), (4,), (2, 2))
"""The meshes real calls are checked on by default."""


@dataclass(frozen=True, slots=True)
class RealFailure:
    """A strategy that did not reproduce the unsharded op on a real call."""

    op: str
    call: str
    mesh_shape: tuple[int, ...]
    strategy: str
    source: str
    """``captured`` or ``synthesized``: which sample showed it."""
    message: str

    def __str__(self) -> str:
        return f"{self.call} mesh {self.mesh_shape} {self.strategy} [{self.source}]: {self.message}"


@dataclass(slots=True)
class RealCallReport:
    """What validating the real calls of one or more traced graphs found."""

    label: str = ""
    meshes: tuple[tuple[int, ...], ...] = MESHES
    nodes: int = 0
    """Op nodes seen (tuple access excluded)."""
    calls: int = 0
    """Distinct calls with a rule."""
    strategies: int = 0
    """Strategies enumerated over all distinct calls and meshes."""
    strategies_checked: int = 0
    """Strategies checked on at least one sample."""
    checks: int = 0
    """(strategy, sample) runs."""
    samples: dict[str, int] = field(default_factory=dict)
    """Samples used, per source."""
    failures: list[RealFailure] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Samples that could not be used for a call that another sample checked."""
    """(call, why): distinct calls with a rule that no sample could be made for."""
    unchecked: list[tuple[str, tuple[int, ...], str, str]] = field(default_factory=list)
    """(call, mesh, strategy, why): strategies of sampled calls that no sample could check."""
    no_rule: dict[str, int] = field(default_factory=dict)
    """Ops without a rule (replicate-only, not checked) -> distinct calls."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def wrong_strategies(self) -> int:
        """Distinct (call, mesh, strategy) that failed on some sample."""
        return len({(f.call, f.mesh_shape, f.strategy) for f in self.failures})

    @property
    def strategies_skipped(self) -> int:
        """Strategies enumerated but never checked (skipped calls and unchecked strategies)."""
        return self.strategies - self.strategies_checked

    def merge(self, other: "RealCallReport") -> None:
        """Add ``other``'s counts and lists to this report."""
        self.nodes += other.nodes
        self.calls += other.calls
        self.strategies += other.strategies
        self.strategies_checked += other.strategies_checked
        self.checks += other.checks
        for k, v in other.samples.items():
            self.samples[k] = self.samples.get(k, 0) + v
        self.failures.extend(other.failures)
        self.skipped.extend(other.skipped)
        self.notes.extend(other.notes)
        self.unchecked.extend(other.unchecked)
        for k, v in other.no_rule.items():
            self.no_rule[k] = self.no_rule.get(k, 0) + v
        self.seconds += other.seconds

    def summary(self) -> str:
        """One line of numbers, then each failure, skip and unchecked strategy."""
        meshes = ", ".join("x".join(map(str, m)) for m in self.meshes)
        sources = ", ".join(f"{v} {k}" for k, v in sorted(self.samples.items())) or "none"
        lines = [
            f"{self.label + ': ' if self.label else ''}{self.calls} distinct calls ({self.nodes} op nodes) on meshes {meshes}: "
            f"{self.strategies_checked}/{self.strategies} strategies checked ({self.checks} runs; samples: {sources}), "
            f"{self.wrong_strategies} wrong, {len(self.skipped)} calls skipped, {len(self.unchecked)} strategies unchecked"
            + (f"; no rule (replicate only): {', '.join(sorted(self.no_rule))}" if self.no_rule else "")
            + f" [{self.seconds:.1f} s]"
        ]
        lines += [f"FAIL {f}" for f in self.failures]
        lines += [f"SKIP {call}: {why}" for call, why in self.skipped]
        lines += [f"NOTE {note}" for note in self.notes]
        lines += [f"UNCHECKED {call} mesh {mesh} {s}: {why}" for call, mesh, s, why in self.unchecked]
        return "\n".join(lines)


# --------------------------------------------------------------------------- checking


def _matches(sample: SampleInput, call: RealCall, reference: list[Any]) -> str | None:
    """Why a sample is not this call (shapes, dtypes or outputs differ), or None."""
    if to_meta(tuple(sample.args)) != to_meta(call.args) or to_meta(dict(sample.kwargs)) != to_meta(call.kwargs):
        return "the sample's metadata differs from the call's"
    got = tuple(None if r is None else TensorMeta.of(r) for r in reference)
    if got != tuple(call.outputs):
        return f"outputs {got}, the traced call has {tuple(call.outputs)}"
    return None


def _samples(
    samples: list[tuple[str, SampleInput]],
    usable: list[tuple[str, SampleInput, list[Any], bool]],
    reasons: list[str],
    synthesize_later: Callable[[], SampleInput] | None,
) -> Iterator[tuple[str, SampleInput]]:
    """The given samples, then a synthesized one when none was usable or every
    usable one holds extreme values (so that sum partials get checked too)."""
    yield from samples
    if synthesize_later is not None and (not usable or all(extreme for *_, extreme in usable)):
        try:
            yield "synthesized", synthesize_later()
        except CannotSample as exc:
            reasons.append(f"cannot synthesize: {exc}")


def _check_call(
    rule: Rule,
    registry: RuleRegistry,
    call: RealCall,
    samples: list[tuple[str, SampleInput]],
    synthesize_later: Callable[[], SampleInput] | None,
    meshes: Sequence[tuple[int, ...]],
    report: RealCallReport,
    gen: torch.Generator,
    allow_uneven: bool,
    max_strategies: int | None,
    rng: random.Random,
) -> None:
    desc = str(call)
    usable: list[tuple[str, SampleInput, list[Any], bool]] = []
    reasons: list[str] = []
    for source, sample in _samples(samples, usable, reasons, synthesize_later):
        try:
            with torch.no_grad():
                reference = flatten_results((rule.reference or rule.op)(*sample.args, **sample.kwargs))
        except Exception as exc:  # noqa: BLE001 - e.g. synthesized values the op rejects
            reasons.append(f"{source} sample rejected by the op: {_first_line(exc)}")
            continue
        why = _matches(sample, call, reference)
        if why:
            reasons.append(f"{source} sample: {why}")
            continue
        extreme = _extreme(list(ordered_tensor_args(call.op, sample.args, sample.kwargs)) + list(reference))
        usable.append((source, sample, reference, extreme))
        report.samples[source] = report.samples.get(source, 0) + 1
    if usable:
        report.notes.extend(f"{desc}: {why}" for why in reasons)
    strategies_by_mesh = {
        mesh: registry.strategies(call.op, call.args, call.kwargs, mesh, allow_uneven=allow_uneven, out_meta=call.outputs)
        for mesh in meshes
    }
    report.calls += 1
    # an exchange strategy (expert parallelism) is no local op: the runtime's equivalence test checks it
    report.strategies += sum(s.exchange is None for ss in strategies_by_mesh.values() for s in ss)
    if not usable:
        report.skipped.append((desc, "; ".join(reasons) or "no sample"))
        return
    for mesh, strategies in strategies_by_mesh.items():
        shards: list[dict] = [{} for _ in usable]  # per sample: local inputs without partials, reused
        chosen: list[OpStrategy] = [s for s in strategies if s.exchange is None]  # exchanges: not local ops
        if max_strategies is not None and len(chosen) > max_strategies:
            chosen = [chosen[0]] + rng.sample(chosen[1:], max_strategies - 1)
        for strategy in chosen:
            checked = False
            for (source, sample, reference, extreme), cache in zip(usable, shards):
                if extreme and _feeds_sum(strategy):
                    continue
                checked = True
                report.checks += 1
                try:
                    msg = check_strategy(rule, sample, strategy, mesh, reference, gen, cache)
                except Exception as exc:  # noqa: BLE001 - reported, not raised
                    msg = f"could not run the strategy: {type(exc).__name__}: {_first_line(exc)}"
                if msg:
                    report.failures.append(RealFailure(op_name(call.op), desc, mesh, str(strategy), source, msg))
            if checked:
                report.strategies_checked += 1
            else:
                report.unchecked.append((desc, mesh, str(strategy),
                                         "a sum/avg partial into extreme values (-inf, finfo.min) is not exact; no finite sample"))


def _skip(report: RealCallReport, registry: RuleRegistry, call: RealCall, meshes: Sequence[tuple[int, ...]],
          allow_uneven: bool, why: str) -> None:
    report.calls += 1
    report.strategies += sum(
        len(registry.strategies(call.op, call.args, call.kwargs, mesh, allow_uneven=allow_uneven, out_meta=call.outputs))
        for mesh in meshes)
    report.skipped.append((str(call), why))


def validate_traced(
    traced: Any,
    mesh_shapes: Sequence[Sequence[int]] = MESHES,
    *,
    values: Mapping[str, torch.Tensor] | None = None,
    inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
    registry: RuleRegistry | None = None,
    synthesized: bool | None = None,
    allow_uneven: bool = False,
    max_strategies: int | None = None,
    seed: int = 0,
    label: str = "",
    seen: set[tuple] | None = None,
) -> RealCallReport:
    """Check every strategy of every distinct call of ``traced`` on each mesh.

    ``values`` and ``inputs`` (real parameters/buffers and example inputs):
    capture each call's real args by running the graph. ``synthesized``:
    True, also check every strategy on random valid tensors made per call
    (:func:`synthesize`); False, never; None (default), only where no value
    was captured or the captured one holds extreme values (masks), so that
    sum-partial strategies are checked on finite values.
    ``max_strategies``: check a random subset per call and mesh (None: all).
    ``seen``: call keys already checked (by another model): skipped without
    counting, and the new ones added (for a suite of models).
    """
    from autoshard.rules import load_rules

    start = time.perf_counter()
    registry = registry or load_rules()
    meshes = tuple(tuple(int(m) for m in mesh) for mesh in mesh_shapes)
    report = RealCallReport(label=label, meshes=meshes)
    calls, report.nodes = distinct_calls(traced)
    todo = []
    for call in calls:
        rule = registry.rule_for(call.op)
        if rule is None:
            report.no_rule[op_name(call.op)] = report.no_rule.get(op_name(call.op), 0) + 1
            continue
        if seen is not None:
            if call.key in seen:
                continue
            seen.add(call.key)
        todo.append((call, rule))
    captured: dict[tuple, SampleInput] = {}
    if values is not None and inputs is not None:
        captured = capture_samples(traced, values, inputs, [c for c, _ in todo])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for index, (call, rule) in enumerate(todo):
            call_seed = seed * 100_003 + index
            samples: list[tuple[str, SampleInput]] = []
            if call.key in captured:
                samples.append(("captured", captured[call.key]))
            later = None
            if synthesized or (synthesized is None and not samples):
                try:
                    samples.append(("synthesized", synthesize(call, call_seed)))
                except CannotSample as exc:
                    if not samples:
                        _skip(report, registry, call, meshes, allow_uneven, f"cannot synthesize: {exc}")
                        continue
                    report.notes.append(f"{call}: cannot synthesize: {exc}")
            elif synthesized is None:
                later = lambda call=call, call_seed=call_seed: synthesize(call, call_seed)  # noqa: E731
            elif not samples:
                _skip(report, registry, call, meshes, allow_uneven, "no captured values and synthesized=False")
                continue
            _check_call(rule, registry, call, samples, later, meshes, report, torch.Generator().manual_seed(call_seed),
                        allow_uneven, max_strategies, random.Random(call_seed))
    finally:
        torch.set_num_threads(threads)
    report.seconds = time.perf_counter() - start
    return report


def validate_model(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    mesh_shapes: Sequence[Sequence[int]] = MESHES,
    **options: Any,
) -> RealCallReport:
    """Trace ``model`` (:func:`autoshard.trace.trace_joint`) and
    :func:`validate_traced` it with its real parameters, buffers and inputs
    captured (models on ``meta`` get synthesized samples only)."""
    from autoshard.trace import trace_joint

    traced = trace_joint(model, inputs)
    on_meta = any(t.is_meta for t in list(model.parameters()) + list(model.buffers())) or any(
        t.is_meta for t in (inputs.values() if isinstance(inputs, Mapping) else inputs)
    )
    values = None
    if not on_meta:
        values = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    return validate_traced(traced, mesh_shapes, values=values, inputs=None if on_meta else inputs, **options)
