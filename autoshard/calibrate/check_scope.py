"""Which check applies to which part of a profile: isolated ops for its op figures,
whole steps for its step figures.

A profile holds two kinds of figure. Its op figures (peaks, memory curve, launch,
collective alpha/beta) price one op or one collective alone: that is what
``calibrate-hardware`` fits, and what ``calibrate-hardware --check`` measures on
held-out ops, timed alone (kernel-level error). A profile correction
(``hw_profiles.correction``, ``profile_correction="here"`` or ``"calibrate"``) also
adds step figures: ``device.step_op_s`` (what an op costs inside a training step
beyond its time alone: cold tensors, the allocator, dispatch between different
ops) and ``overlap.skew_s`` (how late a collective starts when the ranks computed
unsynchronised). Those are costs of a whole step, not of any op alone: added to
an op timed alone they price it too slow by exactly that much (a
``here``-corrected ``cpu-gloo`` on the 2-core VM, 2026-12-04: 91 % / 644 %
median / p90 on isolated ops, nearly all of it ``step_op_s`` on ops of a few
microseconds). So the check prices held-out ops with the step figures removed
(:func:`kernel_profile`), reports the step figures' effect apart (not an error),
and names the whole-step comparison that does judge them: a plan's predicted
step against the measured step (``benchmarks/runtime_step.py``).

>>> from hw_profiles import load
>>> step_figures(load("cpu-gloo"))
{}
>>> kernel_profile(load("cpu-gloo")) == load("cpu-gloo")
True
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hw_profiles import HardwareProfile

from autoshard.calibrate.heldout import CheckItem

__all__ = ["STEP_CHECK", "step_figures", "kernel_profile", "with_step_overhead", "scope_lines"]

STEP_CHECK = ("python benchmarks/runtime_step.py --profile-correction here --no-compile "
              "(plan.estimate.step_s against the measured step on 4 gloo ranks)")
"""The whole-step comparison that judges step figures (and a profile as the solver uses it)."""


def step_figures(profile: HardwareProfile) -> dict[str, float]:
    """The profile's step figures that are set (``step_op_s``, ``skew_s``; none: ``{}``)."""
    figures = {"step_op_s": profile.device.step_op_s, "step_byte_s": profile.device.step_byte_s,
               "skew_s": profile.skew_s}
    return {k: v for k, v in figures.items() if v}


def kernel_profile(profile: HardwareProfile) -> HardwareProfile:
    """``profile`` as it prices an op alone: its step figures set to 0 (the profile itself
    when it has none). Its fingerprint changes; the check reports the given profile's.

    >>> from hw_profiles import load
    >>> p = load("cpu-gloo")
    >>> d = dataclasses.replace(p.device, step_op_s=5e-5)
    >>> kernel_profile(dataclasses.replace(p, device=d)).device.step_op_s
    0.0
    """
    if not step_figures(profile):
        return profile
    overlap = profile.overlap
    if overlap is not None and overlap.skew_s:
        overlap = dataclasses.replace(overlap, skew_s=0.0)
    return dataclasses.replace(profile, device=dataclasses.replace(profile.device, step_op_s=0.0, step_byte_s=0.0),
                               overlap=overlap)


def with_step_overhead(items: Sequence[CheckItem], step_op_s: float) -> list[CheckItem]:
    """Compute items priced as inside a step (``step_op_s`` added to each prediction), the
    way a held-out check priced them before step figures were removed: what they say is
    the step figure's size next to isolated ops, not an error of the profile."""
    return [dataclasses.replace(i, predicted_s=i.predicted_s + step_op_s) if i.category == "compute" else i
            for i in items]


def scope_lines(profile: HardwareProfile, items: Sequence[CheckItem]) -> list[str]:
    """The report's section on which check applies (markdown lines): what the held-out
    errors above measure for this profile, and, where it carries step figures, their
    effect on isolated ops and the whole-step check that judges them.

    >>> from hw_profiles import load
    >>> scope_lines(load("cpu-gloo"), [])[0].startswith("Held-out ops timed alone")
    True
    """
    from autoshard.calibrate.report import summarize

    figures = step_figures(profile)
    lines = ["Held-out ops timed alone measure the profile's **op figures** (kernel-level error): the check that "
             "applies to an uncorrected profile, to a profile calibrated on this machine (`calibrate-hardware`, "
             "`profile_correction=\"calibrate\"`), and to the op ratios of a `here` correction."]
    if not figures:
        return lines + ["", "This profile has no step figures (`step_op_s`, `skew_s`): the held-out errors above are "
                        "its whole check at op level; how well it prices a whole step is measured by "
                        f"`{STEP_CHECK}`."]
    shown = ", ".join(f"`{k}` {v * 2**20 * 1e6:.1f} us per MiB" if k == "step_byte_s" else f"`{k}` {v * 1e6:.1f} us"
                      for k, v in figures.items())
    lines += ["", f"This profile also carries **step figures** ({shown}): costs of a whole training step beyond "
              "its ops timed alone (a profile correction measures them on a reference step and on collective "
              "pairs). They are **not** in the prices above (the check prices ops with them removed), and "
              "isolated ops cannot judge them: the check that applies is whole-step prediction, "
              f"`{STEP_CHECK}`."]
    step_op = figures.get("step_op_s", 0.0)
    if step_op:
        s = summarize([i for i in with_step_overhead(items, step_op) if i.category == "compute"], "compute")
        if s.items:
            lines += ["", f"For comparison with reports from before this split: with `step_op_s` added to every "
                      f"isolated op, compute would read median {s.median:.0%} / p90 {s.p90:.0%} "
                      f"(bias {s.bias:+.0%}). That is the size of the step figure next to ops of a few "
                      "microseconds, not an error of this profile."]
    return lines
