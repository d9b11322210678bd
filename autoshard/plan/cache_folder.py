"""Where autoshard keeps plans and layouts between runs: one folder per user
(``$AUTOSHARD_CACHE_DIR``, else the XDG cache folder), shared by the runtime's
plan cache (:func:`autoshard.autoshard`) and the mesh search's layout cache
(:mod:`autoshard.search.layout_cache`), and the redistribution cost tables that
``autoshard solve`` keeps between processes (:func:`tables_folder`).

>>> import os; os.environ["AUTOSHARD_CACHE_DIR"] = "/tmp/plans"
>>> str(default_cache_dir())
'/tmp/plans'
>>> del os.environ["AUTOSHARD_CACHE_DIR"]
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "default_cache_dir", "cache_folder", "tables_folder"]

CACHE_ENV = "AUTOSHARD_CACHE_DIR"
"""Overrides the default plan cache folder (``~/.cache/autoshard/plans``)."""


def default_cache_dir() -> Path:
    """``$AUTOSHARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoshard/plans`` (``~/.cache`` by default)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autoshard" / "plans"


def cache_folder(cache_dir: str | os.PathLike[str] | bool | None) -> Path | None:
    """The folder a ``cache_dir=`` argument names: None or True the default, False none.

    >>> cache_folder(False) is None, cache_folder("/tmp/x")
    (True, PosixPath('/tmp/x'))
    """
    if cache_dir is False:
        return None
    if cache_dir in (None, True):
        return default_cache_dir()
    return Path(cache_dir)


def tables_folder(root: str | os.PathLike[str] | None = None) -> Path:
    """Where :mod:`costmodel.redistribute_disk` keeps redistribution tables: ``redistribute``
    under ``root`` (default :func:`default_cache_dir`), beside the plans and ``layouts``.

    >>> tables_folder("/tmp/x")
    PosixPath('/tmp/x/redistribute')
    """
    return Path(root if root is not None else default_cache_dir()) / "redistribute"
