"""Put this folder's helpers (``threadcomm``, ``gloo_ranks``) on ``sys.path``:
spawned rank processes inherit it and import the worker functions by name."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
