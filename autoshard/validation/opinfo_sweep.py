"""Every registered rule checked on the ATen calls of PyTorch's OpInfo samples.

:mod:`autoshard.validation.validator` checks a rule on the samples the rule itself
draws; :mod:`autoshard.validation.real_calls` on the calls of example models. Both
see the calls their authors thought of. The OpInfo samples
(:mod:`autoshard.validation.opinfo`) are PyTorch's own: every supported dtype
(integers, bool, complex, half), 0-D and empty tensors, broadcasting, odd
sizes, and the backward calls of each. For each distinct call whose op has a
rule:

1. the unsharded op runs on the captured arguments (the reference);
2. on each mesh (:data:`OPINFO_MESHES`) the registry enumerates the call's
   strategies with uneven splits allowed and strided shards of split factor 2
   (:data:`STRIDED_FACTORS`), a superset of the even-only enumeration, and
   every strategy runs on simulated shards
   (:func:`autoshard.validation.validator.check_strategy`);
3. a strategy whose outputs differ is *wrong*; an enumeration that raises, or
   a check that raises instead of reporting, is a *crash*. Where an input or
   the reference holds extreme values (``-inf``, ``finfo.min``), strategies
   fed by a sum or average partial are not exact and are counted as
   *unchecked* (the validator does the same).

Ops met with no rule are counted (calls per op): the replicate-only strategy
they get is correct by construction.

>>> report = sweep(["addmm"], dtypes=[torch.float32], max_samples=1, meshes=((2,),))  # doctest: +SKIP
>>> report.wrong, report.crashes                                                       # doctest: +SKIP
(0, 0)
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from autoshard.rules.calls import flatten_results, ordered_tensor_args
from autoshard.rules.core import to_meta
from autoshard.validation.opinfo import TraceNotes, TracedCall, load_op_db, select_infos, traced_calls
from autoshard.rules.registry import Rule, RuleRegistry, op_name
from autoshard.validation.validator import _extreme, _feeds_sum, _first_line, check_strategy

__all__ = [
    "OPINFO_MESHES",
    "STRIDED_FACTORS",
    "OpTally",
    "SweepFinding",
    "SweepReport",
    "check_calls",
    "sweep",
    "format_sweep",
    "sweep_markdown",
]

OPINFO_MESHES: tuple[tuple[int, ...], ...] = ((2,), (3,), (4,), (2, 2))
"""Meshes every call is checked on."""
STRIDED_FACTORS: tuple[int, ...] = (2,)
"""Split factors of the strided shards enumerated beside plain ones."""


@dataclass(slots=True)
class OpTally:
    """What the sweep found for one op."""

    calls: int = 0
    """Distinct calls checked."""
    strategies: int = 0
    """Strategies enumerated, over all calls and meshes."""
    checked: int = 0
    """Strategies run on simulated shards."""
    wrong: int = 0
    crashes: int = 0
    unchecked: int = 0
    """Sum/avg partials into extreme values: not exact, not run."""


@dataclass(frozen=True, slots=True)
class SweepFinding:
    """A wrong strategy or a crash."""

    kind: str
    """``wrong`` or ``crash``."""
    op: str
    call: str
    mesh_shape: tuple[int, ...]
    strategy: str
    sources: str
    """The OpInfo samples that made the call."""
    message: str

    def __str__(self) -> str:
        return f"{self.kind.upper()} {self.call} mesh {self.mesh_shape} {self.strategy} [{self.sources}]: {self.message}"


@dataclass(slots=True)
class SweepReport:
    """Totals, per-op tallies and findings of one sweep."""

    opinfos: int = 0
    meshes: tuple[tuple[int, ...], ...] = OPINFO_MESHES
    notes: TraceNotes = field(default_factory=TraceNotes)
    calls: int = 0
    """Distinct ATen calls traced (with and without a rule)."""
    per_op: dict[str, OpTally] = field(default_factory=dict)
    no_rule: Counter = field(default_factory=Counter)
    """Op -> distinct calls met that have no rule."""
    findings: list[SweepFinding] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(call, why): calls whose reference could not be computed again."""
    seconds: float = 0.0

    def _sum(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.per_op.values())

    @property
    def ruled_calls(self) -> int:
        return self._sum("calls")

    @property
    def strategies_checked(self) -> int:
        return self._sum("checked")

    @property
    def wrong(self) -> int:
        return self._sum("wrong")

    @property
    def crashes(self) -> int:
        return self._sum("crashes")

    @property
    def unchecked(self) -> int:
        return self._sum("unchecked")

    @property
    def ok(self) -> bool:
        return not self.findings


def _sources(call: TracedCall) -> str:
    shown = ", ".join(call.sources[:2])
    return shown + (f" +{len(call.sources) - 2}" if len(call.sources) > 2 else "")


def _check_call(rule: Rule, registry: RuleRegistry, call: TracedCall, meshes: Sequence[tuple[int, ...]],
                report: SweepReport, gen: torch.Generator) -> None:
    name, desc = op_name(call.op), str(call)
    tally = report.per_op.setdefault(name, OpTally())
    sample = call.sample
    try:
        with torch.no_grad():
            reference = flatten_results((rule.reference or rule.op)(*sample.args, **sample.kwargs))
    except Exception as exc:  # noqa: BLE001 - ran while tracing; a random op may refuse this time
        report.skipped.append((desc, f"the op rejects the captured arguments: {_first_line(exc)}"))
        return
    tally.calls += 1
    extreme = _extreme(list(ordered_tensor_args(call.op, sample.args, sample.kwargs)) + list(reference))
    args_meta, kwargs_meta = to_meta(tuple(sample.args)), to_meta(dict(sample.kwargs))

    def finding(kind: str, mesh: tuple[int, ...], strategy: str, message: str) -> None:
        report.findings.append(SweepFinding(kind, name, desc, mesh, strategy, _sources(call), message))

    for mesh in meshes:
        try:
            strategies = registry.strategies(call.op, args_meta, kwargs_meta, mesh, allow_uneven=True,
                                             strided_factors=STRIDED_FACTORS, out_meta=call.outputs)
        except Exception as exc:  # noqa: BLE001 - a crash of the rule, reported
            tally.crashes += 1
            finding("crash", mesh, "-", f"enumeration raised {type(exc).__name__}: {_first_line(exc)}")
            continue
        tally.strategies += len(strategies)
        shards: dict = {}  # local inputs without partials, reused across the strategies of this mesh
        for strategy in strategies:
            if extreme and _feeds_sum(strategy):
                tally.unchecked += 1
                continue
            tally.checked += 1
            try:
                msg = check_strategy(rule, sample, strategy, mesh, reference, gen, shards)
            except Exception as exc:  # noqa: BLE001 - the checker itself failed: a crash, reported
                tally.crashes += 1
                finding("crash", mesh, str(strategy), f"check raised {type(exc).__name__}: {_first_line(exc)}")
                continue
            if msg:
                tally.wrong += 1
                finding("wrong", mesh, str(strategy), msg)


def _check_range(calls: Sequence[TracedCall], start: int, stop: int, registry: RuleRegistry,
                 meshes: Sequence[tuple[int, ...]], selected: set | None, seed: int, report: SweepReport,
                 progress: Callable[[TracedCall], None] | None) -> None:
    """Calls ``start..stop``; call ``i`` draws from seed ``seed * 100003 + i``
    however the calls are cut into parts, so parts give the serial result."""
    for index in range(start, stop):
        call = calls[index]
        rule = registry.rule_for(call.op)
        if rule is None:
            report.no_rule[op_name(call.op)] += 1
        elif selected is None or call.op in selected:
            _check_call(rule, registry, call, meshes, report, torch.Generator().manual_seed(seed * 100_003 + index))
        if progress is not None:
            progress(call)


_FORKED: tuple = ()
"""What a forked worker reads: (calls, registry, meshes, selected, seed)."""


def _check_part(bounds: tuple[int, int]) -> tuple[int, int, SweepReport]:
    calls, registry, meshes, selected, seed = _FORKED
    part = SweepReport(meshes=tuple(meshes))
    torch.set_num_threads(1)
    _check_range(calls, bounds[0], bounds[1], registry, meshes, selected, seed, part, None)
    return bounds[0], bounds[1], part


def _merge(into: SweepReport, part: SweepReport) -> None:
    for name, tally in part.per_op.items():
        mine = into.per_op.setdefault(name, OpTally())
        for attr in ("calls", "strategies", "checked", "wrong", "crashes", "unchecked"):
            setattr(mine, attr, getattr(mine, attr) + getattr(tally, attr))
    into.no_rule.update(part.no_rule)
    into.findings.extend(part.findings)
    into.skipped.extend(part.skipped)


def check_calls(
    calls: Sequence[TracedCall],
    registry: RuleRegistry,
    *,
    meshes: Sequence[tuple[int, ...]] = OPINFO_MESHES,
    ops: Iterable[object] | None = None,
    seed: int = 0,
    report: SweepReport | None = None,
    progress: Callable[[TracedCall], None] | None = None,
    jobs: int = 1,
) -> SweepReport:
    """Check every strategy of every call whose op has a rule (only the rules
    of ``ops`` when given); calls of ops without a rule are counted.
    ``jobs > 1``: forked worker processes check parts of the calls (same
    result as one process; POSIX only)."""
    global _FORKED
    report = report if report is not None else SweepReport(meshes=tuple(meshes))
    selected = None if ops is None else set(ops)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add overhead
    try:
        if jobs <= 1:
            _check_range(calls, 0, len(calls), registry, meshes, selected, seed, report, progress)
        else:
            import multiprocessing

            step = 25
            parts = [(i, min(i + step, len(calls))) for i in range(0, len(calls), step)]
            _FORKED = (calls, registry, meshes, selected, seed)
            results = []
            try:
                with multiprocessing.get_context("fork").Pool(jobs) as pool:
                    for start, stop, part in pool.imap_unordered(_check_part, parts):
                        results.append((start, part))
                        if progress is not None:
                            for index in range(start, stop):
                                progress(calls[index])
            finally:
                _FORKED = ()
            for _, part in sorted(results, key=lambda r: r[0]):
                _merge(report, part)
    finally:
        torch.set_num_threads(threads)
    report.calls += len(calls)
    return report


def sweep(
    opinfo_names: Sequence[str] = (),
    *,
    registry: RuleRegistry | None = None,
    ops: Iterable[object] | None = None,
    dtypes: Iterable[torch.dtype] | None = None,
    max_samples: int = 3,
    meshes: Sequence[tuple[int, ...]] = OPINFO_MESHES,
    seed: int = 0,
    jobs: int = 1,
    on_traced: Callable[[int], None] | None = None,
    on_opinfo: Callable[[str], None] | None = None,
    on_call: Callable[[TracedCall], None] | None = None,
) -> SweepReport:
    """Trace the OpInfos named (all when none) and check their calls
    (:func:`check_calls`). ``on_opinfo`` is called per OpInfo traced,
    ``on_traced`` once with the number of calls, ``on_call`` per call checked;
    ``jobs``: worker processes for the checks (:func:`check_calls`)."""
    from autoshard.rules import load_rules

    start = time.perf_counter()
    registry = registry or load_rules()
    infos = select_infos(load_op_db(), opinfo_names)
    report = SweepReport(opinfos=len(infos), meshes=tuple(meshes))
    calls = traced_calls(infos, dtypes=dtypes, max_samples=max_samples, seed=seed, notes=report.notes, progress=on_opinfo)
    if on_traced is not None:
        on_traced(len(calls))
    check_calls(calls, registry, meshes=meshes, ops=ops, seed=seed, report=report, progress=on_call, jobs=jobs)
    report.seconds = time.perf_counter() - start
    return report


def _missing(report: SweepReport, top: int) -> str:
    return ", ".join(f"`{op.removeprefix('aten.')}` ({n})" for op, n in report.no_rule.most_common(top))


def format_sweep(report: SweepReport, *, show_findings: int = 20, top_missing: int = 15) -> str:
    """Plain-text summary: totals, ops with findings, the first findings, the most-used ops without a rule."""
    lines = [
        f"{report.opinfos} OpInfos, {report.notes.samples} samples, {report.calls} distinct calls "
        f"({report.ruled_calls} of {len(report.per_op)} ruled ops checked), "
        f"{report.strategies_checked} strategies checked on meshes {', '.join('x'.join(map(str, m)) for m in report.meshes)}",
        f"wrong {report.wrong}, crashes {report.crashes}, unchecked {report.unchecked}, "
        f"ops without a rule {len(report.no_rule)} ({sum(report.no_rule.values())} calls), {report.seconds:.0f} s",
    ]
    bad = sorted((name, t) for name, t in report.per_op.items() if t.wrong or t.crashes)
    for name, t in bad:
        lines.append(f"  {name}: {t.wrong} wrong, {t.crashes} crashes of {t.checked} checked")
    for f in report.findings[:show_findings]:
        lines.append(str(f))
    if len(report.findings) > show_findings:
        lines.append(f"... {len(report.findings) - show_findings} more findings")
    if report.no_rule:
        lines.append(f"most used ops without a rule: {_missing(report, top_missing)}")
    return "\n".join(lines)


def sweep_markdown(report: SweepReport, *, command: str, machine: str, date: str, top_missing: int = 30) -> str:
    """The results page of ``benchmarks/opinfo_rules.py`` (markdown)."""
    meshes = ", ".join("x".join(map(str, m)) for m in report.meshes)
    rows = [
        ("OpInfos traced", report.opinfos),
        ("samples run (forward + backward)", report.notes.samples),
        ("samples that raised on CPU", len(report.notes.failed)),
        ("calls dropped: in place with no functional form / sparse operand",
         f"{report.notes.dropped_out_calls} / {report.notes.dropped_sparse_calls}"),
        ("distinct ATen calls", report.calls),
        ("ruled ops met", len(report.per_op)),
        ("calls of ruled ops checked", report.ruled_calls),
        ("strategies enumerated", sum(t.strategies for t in report.per_op.values())),
        ("strategies checked", report.strategies_checked),
        ("unchecked (sum/avg partial into -inf/finfo.min)", report.unchecked),
        ("**wrong**", report.wrong),
        ("**crashes**", report.crashes),
        ("ops without a rule", len(report.no_rule)),
        ("calls of ops without a rule", sum(report.no_rule.values())),
        ("wall time (s)", f"{report.seconds:.0f}"),
    ]
    out = [
        "# Sharding rules on PyTorch's OpInfo samples",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine}  ",
        f"Date: {date}",
        "",
        f"Every strategy the registry enumerates (uneven splits allowed, strided shards of split factor "
        f"{', '.join(map(str, STRIDED_FACTORS))}) for every distinct ATen call of the OpInfo samples "
        f"(all CPU dtypes, forward and backward), on meshes {meshes}, run on simulated shards and compared "
        "with the unsharded op (`autoshard/validation/opinfo_sweep.py`).",
        "",
        "| | |",
        "|---|---:|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
    ]
    bad = sorted((name, t) for name, t in report.per_op.items() if t.wrong or t.crashes)
    if bad:
        out += ["## Ops with findings", "", "| op | calls | checked | wrong | crashes |", "|---|---:|---:|---:|---:|"]
        out += [f"| `{n}` | {t.calls} | {t.checked} | {t.wrong} | {t.crashes} |" for n, t in bad]
        out += ["", "First findings:", ""] + [f"- {f}" for f in report.findings[:20]] + [""]
    top = sorted(report.per_op.items(), key=lambda kv: -kv[1].checked)[:15]
    out += ["## Most checked ops", "", "| op | calls | strategies checked |", "|---|---:|---:|"]
    out += [f"| `{n}` | {t.calls} | {t.checked} |" for n, t in top]
    out += ["", f"## Most used ops without a rule (distinct calls)", "", _missing(report, top_missing) or "none", ""]
    return "\n".join(out)
