"""Exact backends for the integer program, by name.

>>> sorted(BACKENDS)
['cbc', 'cpsat']
>>> get_backend("cbc").name
'cbc'
"""

from __future__ import annotations

import importlib

from solver.backends.base import BackendUnavailable, ProgramBackend, ProgramResult

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "get_backend", "ProgramBackend", "ProgramResult", "BackendUnavailable"]

# name -> (module, class); imported only when asked for.
BACKENDS: dict[str, tuple[str, str]] = {
    "cbc": ("solver.backends.cbc", "CbcBackend"),
    "cpsat": ("solver.backends.cpsat", "CpSatBackend"),
}
DEFAULT_BACKEND = "cbc"


def get_backend(name: str) -> ProgramBackend:
    """The backend called ``name``; a clear error lists the valid names."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (expected one of {', '.join(sorted(BACKENDS))})")
    module_name, class_name = BACKENDS[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    if not cls.available():
        raise BackendUnavailable(f"backend {name!r} is not available here")
    return cls()
