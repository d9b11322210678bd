"""The solver is torch-free (docs/architecture.md): importing every module pulls in no torch."""

from __future__ import annotations

import subprocess
import sys


def test_solver_modules_import_without_torch():
    code = (
        "import importlib, pkgutil, sys, solver\n"
        "for info in pkgutil.walk_packages(solver.__path__, 'solver.'):\n"
        "    if not info.name.endswith('__main__'):\n"
        "        importlib.import_module(info.name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'autoshard'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
