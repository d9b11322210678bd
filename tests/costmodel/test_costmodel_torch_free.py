"""hw_profiles and costmodel never import torch (docs/architecture.md: a plan can be
priced on a machine without torch). Every module of both packages is imported, so a
new module is checked without being listed here."""

from __future__ import annotations

import subprocess
import sys


def test_importing_costmodel_and_hw_profiles_does_not_import_torch():
    code = (
        "import sys\n"
        "import hw_profiles, costmodel\n"
        "import importlib, pkgutil\n"
        "for package in (hw_profiles, costmodel):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "from costmodel import redistribute, simulate\n"
        "import numpy as np\n"
        "p = hw_profiles.load('h100-sxm-80gb')\n"
        "redistribute.plan_redistribute('S(0)S(0)', 'RR', (2, 2), (8, 8), 4, p)\n"
        "simulate.unshard(simulate.shard(np.ones((4, 4)), 'S(0)R', (2, 2)), 'S(0)R', (2, 2))\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"torch modules imported: {out.stdout.strip()}"
