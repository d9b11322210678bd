"""Byte sizes and device counts as people read them: ``9.38 KiB``, not
``0.00 GiB``; and the largest sizes and meshes that make sense.

Library code (plan reports, the solver's log lines, layout tables) writes
sizes with these; the command line (:mod:`autoshard.cli.values`) parses them.

>>> format_bytes(9604), format_bytes(6319125504)
('9.38 KiB', '5.89 GiB')
>>> byte_unit(9604)
('KiB', 1024)
"""

from __future__ import annotations

__all__ = ["MAX_BYTES", "MAX_DEVICES", "byte_unit", "format_bytes"]

MAX_DEVICES = 2**20
"""Devices in a mesh: far above any cluster, and low enough that the mesh's
rank tables fit in memory (``99999999x99999999`` would exhaust it)."""

MAX_BYTES = 2**60
"""An exbibyte: the largest size a flag accepts (memory limits, caches)."""


def byte_unit(n: float) -> tuple[str, int]:
    """The binary unit that shows ``n`` bytes with 1 to 4 digits before the
    point, and its size: ``("KiB", 1024)`` for 9604."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return unit, scale
    return "B", 1


def format_bytes(n: float) -> str:
    """A size for people, in the unit that keeps it readable: a small model's
    peak reads ``9.38 KiB``, not ``0.00 GiB``."""
    unit, scale = byte_unit(n)
    return f"{n:.0f} B" if scale == 1 else f"{n / scale:.2f} {unit}"
