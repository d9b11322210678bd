"""Figures written as files: a plot is rendered in memory and written
atomically, so a reader never sees half a PNG and an error leaves no file.

Used by the plan explanation, the layout table and the calibration report;
matplotlib is imported by the caller that builds the figure, never here at
import time.
"""

from __future__ import annotations

import io
import os

__all__ = ["save_figure"]


def save_figure(fig, path: str | os.PathLike[str]) -> None:
    """Render a matplotlib figure to PNG in memory, close it, and write it
    atomically with the user's umask (``solver.io.write_bytes_atomic``).

    >>> import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt  # doctest: +SKIP
    >>> save_figure(plt.figure(), "plot.png")  # doctest: +SKIP
    """
    from solver.io import write_bytes_atomic  # numpy: loaded only when a command writes

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=120)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())
