"""Command-line values, read from and written for people: sizes (``70GiB`` in,
``1.50 MiB`` out, :mod:`autoshard.sizes`), meshes, seconds, counts and output paths.

Why one module: every ``autoshard`` command checks its flags before it
imports torch, traces a model or starts a measurement, so that a typo costs
a tenth of a second and one line naming the flag, never a traceback, a
half-done run or a stray file. The checks are torch-free and raise
``ValueError`` with the flag in the message; ``autoshard.cli`` prints it.

>>> parse_bytes("70GiB"), parse_bytes("1.5e9")
(75161927680, 1500000000)
>>> format_bytes(9604), format_bytes(6319125504)
('9.38 KiB', '5.89 GiB')
>>> parse_mesh("2x4", "dp,tp").shape
(2, 4)
>>> plural(1, "worker"), plural(2, "worker")
('1 worker', '2 workers')
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from autoshard.figures import save_figure
from autoshard.sizes import MAX_BYTES, MAX_DEVICES, byte_unit, format_bytes

if TYPE_CHECKING:
    from costmodel.mesh import MeshSpec

__all__ = ["MAX_BYTES", "MAX_DEVICES", "MAX_SECONDS", "parse_bytes", "byte_unit", "format_bytes", "parse_mesh",
           "check_seconds", "check_count", "check_output_path", "save_figure",
           "plural"]

MAX_SECONDS = 7 * 24 * 3600.0
"""A week: the largest time limit (as ``python -m solver``); beyond it a
value is a typo (``1e9``), not a plan."""

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, flag: str = "--memory-limit") -> int:
    """``70GiB``, ``80GB``, ``1.5e9`` -> bytes; ``ValueError`` naming ``flag``
    for anything else (``nan``, ``-5GiB``, ``0``, ``1e400``, above an EiB)."""
    match = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{flag}: expected a size such as 70GiB, 80GB or 1.5e9, got {text!r}")
    try:
        value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    except ValueError:  # "1.2.3"
        raise ValueError(f"{flag}: expected a size such as 70GiB, 80GB or 1.5e9, got {text!r}") from None
    if not 1 <= value <= MAX_BYTES:
        raise ValueError(f"{flag}: must be a size from 1 byte to 1 EiB, got {text!r}")
    return int(value)


def plural(count: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def parse_mesh(shape: str, dims: str | None = None, *, flag: str = "--mesh") -> MeshSpec:
    """``8x8`` (and ``dp,tp``) -> ``MeshSpec``, refusing a zero, negative or
    absurd size before the mesh enumerates its ranks."""
    from costmodel.mesh import MeshSpec

    try:
        sizes = [int(s) for s in shape.lower().split("x")]
    except ValueError:
        raise ValueError(f"{flag}: expected sizes like 8x8 or 2x4x8, got {shape!r}") from None
    if any(s <= 0 for s in sizes):
        raise ValueError(f"{flag}: mesh dim sizes must be positive, got {shape!r}")
    if math.prod(sizes) > MAX_DEVICES:
        raise ValueError(f"{flag}: at most {MAX_DEVICES} devices, got {shape!r} ({math.prod(sizes)})")
    try:
        return MeshSpec.from_text(shape, dims)
    except ValueError as exc:
        raise ValueError(f"{flag}/--dims: {exc}") from None


def check_seconds(value: float, flag: str, *, maximum: float = MAX_SECONDS) -> float:
    """``value`` if it is a number of seconds in (0, maximum]; NaN and
    infinity fail (every comparison with NaN is false)."""
    if not 0 < value <= maximum:
        raise ValueError(f"{flag}: must be a number of seconds in (0, {maximum:.0f}], got {value}")
    return value


def check_count(value: int | None, flag: str, low: int, high: int) -> int | None:
    """``value`` (or None: the flag was not given) if ``low <= value <= high``."""
    if value is not None and not low <= value <= high:
        raise ValueError(f"{flag}: must be between {low} and {high}, got {value}")
    return value


def check_output_path(path: str | os.PathLike[str] | None, flag: str) -> None:
    """Refuse, before any work, an output whose folder does not exist (a typo
    must not create folders, nor fail after an hour's solve) or that names
    a folder."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{flag} {path}: is a folder, expected a file name")
    parent = target.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: folder {parent} is not writable")
