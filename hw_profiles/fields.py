"""Fields shared by the profile's parts (``hw_profiles.profile``): efficiency curves as
JSON points, and where a figure comes from (a :class:`Citation`, or the free text of older
profiles)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Citation", "curve_points", "source_of", "put_source"]


def curve_points(points: Any) -> tuple[tuple[float, float], ...]:
    """``[[x, y], ...]`` as float pairs (an efficiency or bandwidth curve)."""
    return tuple((float(x), float(y)) for x, y in points)


@dataclass(frozen=True, slots=True)
class Citation:
    """Where a figure comes from.

    >>> Citation.from_dict({"source": "published", "reference": "https://x, Table 2"}).reference
    'https://x, Table 2'
    """

    source: str
    """``published``, ``datasheet``, ``measured`` or ``estimate``."""
    reference: str | None = None
    """URL and which table or figure (required for ``published``)."""
    note: str | None = None
    """Assumptions and conversions between the reference and the figure."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Citation":
        return cls(source=str(data["source"]), reference=data.get("reference"), note=data.get("note"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source}
        if self.reference is not None:
            out["reference"] = self.reference
        if self.note is not None:
            out["note"] = self.note
        return out

    def text(self) -> str:
        """One line for reports: ``source: reference (note)``."""
        return self.source + (f": {self.reference}" if self.reference else "") + (f" ({self.note})" if self.note else "")


def source_of(data: Mapping[str, Any]) -> str | Citation | None:
    """A ``source`` field with its siblings ``reference`` / ``note`` as a
    :class:`Citation`, or the plain text of older profiles."""
    source = data.get("source")
    if source is None:
        return None
    if "reference" in data or "note" in data:
        return Citation(str(source), data.get("reference"), data.get("note"))
    return str(source)


def put_source(out: dict[str, Any], source: "str | Citation | None") -> None:
    if isinstance(source, Citation):
        out.update(source.to_dict())
    elif source is not None:
        out["source"] = source
