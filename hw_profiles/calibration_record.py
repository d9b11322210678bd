"""How a measured profile was measured: the calibration record and the machine's load
around it (``hw_profiles.profile`` reads and writes them; ``autoshard calibrate-hardware``
fills them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["LoadRecord", "Calibration"]


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """The host's load around a calibration or check.

    Why: a CPU profile measured while other jobs ran is slower than the host
    (the shipped ``cpu-gloo`` was calibrated at a load average of 5-8, and a
    quiet host re-measured its fit set at 0.87x). ``foreign`` says the figures
    were measured under load from outside the job: more runnable threads
    than the job's own (``own_threads`` = ranks on the host x torch threads)
    by at least ``threshold``.

    >>> LoadRecord(cores=2, own_threads=4, before=(1.0, 1.0, 1.0), after=(4.0, 3.0, 2.0)).foreign
    False
    """

    cores: int
    own_threads: int
    """Threads the job itself keeps busy on this host (ranks x threads)."""
    before: tuple[float, float, float]
    """``os.getloadavg()`` (1, 5, 15 min) just before the first measurement."""
    after: tuple[float, float, float]
    """... and just after the last."""
    during_load1: tuple[float, ...] = ()
    """1-minute load average sampled during the run."""
    foreign_runnable: tuple[float, ...] = ()
    """Runnable threads of other processes, sampled during the run."""
    foreign_load: float = 0.0
    """Estimated average number of other processes' runnable threads."""
    threshold: float = 0.5
    foreign: bool = False
    """True when ``foreign_load >= threshold``: the figures are flagged."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LoadRecord":
        return cls(
            cores=int(data["cores"]),
            own_threads=int(data["own_threads"]),
            before=tuple(float(v) for v in data["before"]),
            after=tuple(float(v) for v in data["after"]),
            during_load1=tuple(float(v) for v in data.get("during_load1", ())),
            foreign_runnable=tuple(float(v) for v in data.get("foreign_runnable", ())),
            foreign_load=float(data.get("foreign_load", 0.0)),
            threshold=float(data.get("threshold", 0.5)),
            foreign=bool(data.get("foreign", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "own_threads": self.own_threads, "before": list(self.before),
                "during_load1": list(self.during_load1), "foreign_runnable": list(self.foreign_runnable),
                "after": list(self.after), "foreign_load": self.foreign_load, "threshold": self.threshold,
                "foreign": self.foreign}

    def text(self) -> str:
        """One line for reports and the command's output."""
        def three(v: Sequence[float]) -> str:
            return " ".join(f"{x:.2f}" for x in v)

        during = (f", during max {max(self.during_load1):.2f}" if self.during_load1 else "")
        return (f"load average (1/5/15 min) {three(self.before)} before{during}, {three(self.after)} after; "
                f"{self.cores} cores, job threads {self.own_threads}; other processes' runnable threads "
                f"~{self.foreign_load:.2f}" + (" -> FOREIGN LOAD: figures flagged" if self.foreign else ""))


@dataclass(frozen=True, slots=True)
class Calibration:
    """How and where a profile's figures were obtained."""

    date: str | None = None
    host: str | None = None
    torch: str | None = None
    method: str | None = None
    fit_error: tuple[tuple[str, float], ...] = ()
    """Relative error of each fit over the points it was fitted on (e.g.
    ``loopback.all_reduce``: 0.08; measured profiles store the largest)."""
    ranks: int | None = None
    """Ranks of the job the figures were measured in (a measured device is
    one rank of such a job: ranks sharing a host share its cores)."""
    load: LoadRecord | None = None
    """The host's load during the calibration (None: not recorded)."""
    warnings: tuple[str, ...] = ()
    """Why the figures may not hold elsewhere (foreign load, ...)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Calibration":
        return cls(
            date=data.get("date"),
            host=data.get("host"),
            torch=data.get("torch"),
            method=data.get("method"),
            fit_error=tuple((k, float(v)) for k, v in data.get("fit_error", {}).items()),
            ranks=None if data.get("ranks") is None else int(data["ranks"]),
            load=None if data.get("load") is None else LoadRecord.from_dict(data["load"]),
            warnings=tuple(str(w) for w in data.get("warnings", ())),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"date": self.date, "host": self.host, "torch": self.torch}
        if self.method is not None:
            out["method"] = self.method
        if self.ranks is not None:
            out["ranks"] = self.ranks
        out["fit_error"] = dict(self.fit_error)
        if self.load is not None:
            out["load"] = self.load.to_dict()
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out
