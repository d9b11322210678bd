"""The solver's answer (``autoshard.solution/1``).

>>> s = Solution(choice=(0, 1), cost=3.0, lower_bound=3.0, status=Status.OPTIMAL,
...              seconds=0.1, backend="cbc")
>>> s.gap
0.0
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["FORMAT", "Status", "Solution"]

FORMAT = "autoshard.solution/1"


class Status(str, enum.Enum):
    """How a solve ended.

    OPTIMAL: proven optimal. FEASIBLE: a solution within the memory limit, not
    proven optimal, the method stopped on its own. TIMEOUT: the time limit hit
    first; ``choice`` is the best feasible solution found (empty if none).
    INFEASIBLE: proven that no choice avoids forbidden costs within the memory
    limit.
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    TIMEOUT = "timeout"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, slots=True)
class Solution:
    """One strategy index per node, with its cost, the best bound and how it ended.

    ``stats`` holds diagnostics (problem sizes before/after reduction, methods
    run, time to first feasible); it is written to JSON as is.
    """

    choice: tuple[int, ...]
    cost: float | None
    lower_bound: float | None
    status: Status
    seconds: float
    backend: str
    message: str = ""
    peak_memory_bytes: float | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative gap ``(cost - bound) / max(|cost|, tiny)``, None without both."""
        if self.cost is None or self.lower_bound is None or not math.isfinite(self.cost):
            return None
        if self.cost == self.lower_bound:
            return 0.0
        return max(0.0, (self.cost - self.lower_bound) / max(abs(self.cost), 1e-12))

    @property
    def has_solution(self) -> bool:
        # the empty choice is the solution of a problem without nodes (its cost is then set)
        return (len(self.choice) > 0 or self.cost is not None) and self.status is not Status.INFEASIBLE

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "status": self.status.value,
            "cost": _json_number(self.cost),
            "lower_bound": _json_number(self.lower_bound),
            "gap": self.gap,
            "seconds": round(self.seconds, 4),
            "backend": self.backend,
            "peak_memory_bytes": _json_number(self.peak_memory_bytes),
            "message": self.message,
            "choice": list(self.choice),
            "stats": dict(self.stats),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Solution":
        """Read the JSON object; ``ValueError`` naming the field when it is not a
        solution (another format, such as a problem or plan given by mistake)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"(root): expected an {FORMAT} object, got {type(data).__name__}")
        fmt = data.get("format", FORMAT)
        if fmt != FORMAT:
            raise ValueError(f"format: expected {FORMAT!r}, got {fmt!r}")
        for key in ("choice", "status"):
            if key not in data:
                raise ValueError(f"{key}: missing (not an {FORMAT} object)")
        # "peak_memory" is the name files written before the unit was in it used
        peak = data["peak_memory_bytes"] if "peak_memory_bytes" in data else data.get("peak_memory")
        try:
            return cls(
                choice=tuple(int(c) for c in data["choice"]),
                cost=data.get("cost"),
                lower_bound=data.get("lower_bound"),
                status=Status(data["status"]),
                seconds=float(data.get("seconds", 0.0)),
                backend=str(data.get("backend", "")),
                message=str(data.get("message", "")),
                peak_memory_bytes=peak,
                stats=dict(data.get("stats", {})),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"not an {FORMAT} object: {exc}") from None


def _json_number(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    if float(value).is_integer() and abs(value) < 2**53:
        return int(value)
    return float(value)
