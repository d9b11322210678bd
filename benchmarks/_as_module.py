"""Run ``python benchmarks/NAME.py ARGS`` as ``python -m benchmarks.NAME ARGS``.

A script run as a file has its own folder, not the repository root, as
``sys.path[0]``: ``benchmarks.*`` and ``examples.*`` would not import. Rather
than edit ``sys.path``, a script imports this module first when it runs as a
file (``__package__`` empty)::

    if __name__ == "__main__" and not __package__:
        import _as_module  # noqa: F401 - `python benchmarks/x.py`: re-executed as `python -m benchmarks.x`

and this process is replaced by the module run (``os.execv``: same
interpreter, arguments, environment and exit status). The repository root
must be the current folder, as for ``examples.*`` model specs
(:mod:`autoshard.trace.model_spec`); elsewhere the run stops with one line
saying so.

>>> module_name("/repo/benchmarks/runtime_step.py")
'benchmarks.runtime_step'
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def module_name(script: str) -> str:
    """``benchmarks.NAME`` of the script file ``.../benchmarks/NAME.py``."""
    return f"benchmarks.{Path(script).stem}"


def _rerun() -> None:
    script = Path(sys.argv[0]).resolve()
    here = Path(__file__).resolve().parent
    if Path.cwd().resolve() != here.parent:
        raise SystemExit(f"{sys.argv[0]}: run it from the repository root ({here.parent}): "
                         f"cd {here.parent} && python -m {module_name(str(script))}")
    flags = sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]  # the interpreter's own (-X importtime)
    os.execv(sys.executable, [sys.executable, *flags, "-m", module_name(str(script)), *sys.argv[1:]])


if __name__ != "__main__" and Path(sys.argv[0]).resolve().parent == Path(__file__).resolve().parent:
    _rerun()  # imported by a script of this folder run as a file
