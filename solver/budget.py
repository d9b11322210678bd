"""The solver's time: one deadline, and every share of it named here with its reason.

A solve gets a time limit ``T`` counted from a start ``t0`` (the process
start for the command line, so that loading counts). The budget keeps a
finish margin ``m`` for rebuilding, checking and writing the answer, so the
search deadline is

    D = t0 + max(T - m, T / 2),   m = 1 s + 1e-5 s x (nodes + edges)

(about 5 us per node and edge were measured for the finish on the IOPDDL
instances; the extra second covers a killed backend). A stage, or a loop
inside one, never gets a deadline of its own from a bare fraction: it asks
for a named share, ``Budget.share(name)`` or ``share_deadline(name, D)``,

    D' = min(D, now + clamp(f x base, at_least, at_most))

where ``base`` is the time left (``D - now``) or, for shares ``of="stage"``,
the whole length of the stage that asks. ``SHARES`` is the one table of
``f``, the clamps and why each value is what it is.

>>> b = Budget(deadline=100.0, start=0.0)
>>> round(share_deadline("exact", 100.0, now=40.0), 6)     # half of the 60 s left
70.0
>>> round(share_deadline("lns_window", 100.0, now=40.0, stage_start=0.0), 6)  # a tenth of the stage
50.0
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

__all__ = ["Budget", "Share", "SHARES", "share_deadline", "MIN_STAGE_SECONDS", "MIN_LNS_SECONDS"]

MIN_STAGE_SECONDS = 1.0
"""A stage that needs a backend or builds a model (column generation, toulbar2)
is not started with less than this left: its set-up alone takes that long."""

MIN_LNS_SECONDS = 0.1
"""The windows of the anytime search start with more than this left; each window
checks the clock itself."""


@dataclass(frozen=True)
class Share:
    """A fraction of the time left (or of the asking stage's length), clamped."""

    fraction: float
    why: str
    at_least: float = 0.0
    at_most: float = math.inf
    of: str = "left"  # "left": of D - now; "stage": of the asking stage's whole length
    may_pass_deadline: bool = False  # the floor wins over the deadline


SHARES: dict[str, Share] = {
    "reduce": Share(0.25, "reductions shrink every later stage (35K-65K IOPDDL nodes to 200-16K variables); "
                    "they finish in seconds and are given a quarter, and at least a second, so that a short "
                    "limit still reduces", at_least=1.0, may_pass_deadline=True),
    "elimination_order": Share(0.05, "the min-fill order search recognises large treewidth only by trying; "
                               "the 60,000-node transformer graph needs about 8 s", at_most=15.0),
    "colgen": Share(0.4, "column generation reaches the Dantzig-Wolfe bound in about 20 rounds; the rest goes "
                    "to the restricted program and the exact stage that use its prices"),
    "restricted": Share(0.5, "the integer program over the columns' values is small (1-2 values per variable); "
                        "half of what is left, the other half for the exact stage"),
    "exact": Share(0.5, "a small program gets half the time to finish or prove alone; what it leaves goes to "
                   "the search stages from its best solution"),
    "exact_before_wcsp": Share(1 / 3, "when toulbar2 follows, a third: memory-bound problems with a weak LP bound "
                               "(IOPDDL V) are closed by toulbar2, not by the program"),
    "wcsp_first": Share(0.15, "a large program whose knapsacks toulbar2 can post: toulbar2 first, briefly (tiny LLaMA "
                        "2x2 under DDP's pins: 3,347 values, 109K program columns; CBC 4.1 s unproven at a third of "
                        "14 s, toulbar2 proved it in 0.05 s); at most 3 s, what a program that needs the time "
                        "loses", at_most=3.0),
    "wcsp": Share(0.6, "toulbar2 with every memory knapsack posted; the rest for Lagrangian pricing and windows"),
    "wcsp_lazy": Share(0.8, "toulbar2 with knapsacks added lazily needs several restarted rounds "
                       "(IOPDDL D: 1.0736 -> 0.9994 of the best known)"),
    "wcsp_lazy_round": Share(1 / 3, "each lazy round re-solves from the best solution with the knapsacks found "
                             "so far; three rounds at least", at_least=2.0),
    "lagrangian_first": Share(0.1, "before the program, Lagrangian rounds prove most memory-bound strategy graphs "
                              "at once (8B expert layouts: 0.1 s where CBC takes 3.5 s); a tenth, at most 2 s, is "
                              "what a program that needs the time loses", at_most=2.0),
    "lagrangian": Share(0.7, "pricing memory gives bounds and candidates fast; the windows that follow need "
                        "the remaining 30 % to polish the incumbent"),
    "lagrangian_patience": Share(0.2, "rounds stop when neither the incumbent nor the bound moved for a fifth of "
                                 "the stage: on IOPDDL S the last candidate that improved came at 28 s of a 166 s "
                                 "stage while the windows after it improved the cost every few seconds",
                                 at_least=10.0, of="stage"),
    "lagrangian_round": Share(0.25, "one pairwise solve (TRW-S or toulbar2) per multiplier update; a quarter "
                              "keeps at least four updates", at_least=1.0),
    "lns_window": Share(0.1, "a window's program is small; a tenth of the stage (at least a second) stops one "
                        "hard window from eating the search", at_least=1.0, of="stage"),
    "lp_relaxation": Share(0.3, "the LP relaxation that guides the first incumbent is nearly integral on these "
                           "problems; it must leave most of the time to branch and bound"),
    "lp_rounding": Share(0.3, "the rounded LP's fractional part is re-solved exactly as one window"),
    "colgen_candidate": Share(0.1, "repairing a round's priced labels into a candidate; large graphs far from "
                              "the limit took minutes, so each repair is capped", at_least=0.5),
}


def share_deadline(name: str, deadline: float, *, now: float | None = None,
                   stage_start: float | None = None) -> float:
    """The deadline of share ``name`` of the time up to ``deadline`` (see ``SHARES``)."""
    share = SHARES[name]
    now = time.perf_counter() if now is None else now
    if share.of == "stage":
        if stage_start is None:
            raise ValueError(f"share {name!r} is a fraction of a stage: pass stage_start")
        base = deadline - stage_start
    else:
        base = deadline - now
    seconds = min(max(share.fraction * base, share.at_least), share.at_most)
    end = now + seconds
    return end if share.may_pass_deadline else min(deadline, end)


class Budget:
    """A deadline on the ``time.perf_counter()`` clock and the start it counts from.

    >>> b = Budget.for_problem(60.0, start=0.0, size=1000)
    >>> round(b.deadline, 6)     # 60 s less the finish margin 1 s + 1e-5 s x 1000
    58.99
    """

    __slots__ = ("deadline", "start")

    def __init__(self, deadline: float, start: float | None = None) -> None:
        self.deadline = float(deadline)
        self.start = time.perf_counter() if start is None else float(start)

    @classmethod
    def for_problem(cls, time_limit: float, *, start: float, size: int) -> "Budget":
        """The search budget of a solve of ``size`` nodes + edges (finish margin kept back)."""
        margin = 1.0 + 1e-5 * size
        return cls(start + max(time_limit - margin, 0.5 * time_limit), start=start)

    def left(self) -> float:
        """Seconds until the deadline (0 when passed)."""
        return max(self.deadline - time.perf_counter(), 0.0)

    def has(self, seconds: float) -> bool:
        """Whether more than ``seconds`` are left."""
        return time.perf_counter() < self.deadline - seconds

    def expired(self, margin: float = 0.0) -> bool:
        """Whether the deadline (less ``margin``) has passed."""
        return not self.has(margin)

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.start

    def share(self, name: str) -> "Budget":
        """A budget for share ``name`` of what is left (see ``SHARES``), starting now."""
        now = time.perf_counter()
        return Budget(share_deadline(name, self.deadline, now=now, stage_start=self.start), start=now)

    def __repr__(self) -> str:
        return f"Budget(left={self.left():.3f}s)"
