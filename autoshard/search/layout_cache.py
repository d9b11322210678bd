"""The mesh search's cache: one record per layout and key, on disk, atomic, bounded.

A record is JSON (``autoshard.layout_result/1``): for a ``result`` key, the
layout's :class:`~autoshard.plan.layout_report.LayoutResult`, its plan (or
None), the solver time it had and the per-layout budget of the search that
made it; for a ``bound`` key, the layout's lower bound. Records live in
:class:`autoshard.service.cache.ResultCache` (temporary file, fsync, rename;
least recently used out first past the size bound), so a search killed at
any moment leaves whole records only.

Keys (:func:`layout_cache_key`): sha256 of the record kind, the layout's plan
fingerprint (traced graph, mesh shape and dim names, profile with its node
size, versions), the options that decide the record and :func:`code_version`,
a hash of the sources that build, price and solve a layout: a record made by
other code is a miss.

>>> from autoshard.plan.format import Fingerprint
>>> fp = Fingerprint("sha256:ab", (2, 2), ("dp", "tp"), "cpu-gloo@sha256:cd", "2.13.0", "0.1.0")
>>> layout_cache_key("result", fp, {"pins": None}, "v1") == layout_cache_key("result", fp, {"pins": None}, "v1")
True
>>> layout_cache_key("result", fp, {"pins": None}, "v1") == layout_cache_key("bound", fp, {"pins": None}, "v1")
False
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Mapping

from hw_profiles import HardwareProfile

__all__ = ["CACHE_FORMAT", "LayoutCache", "code_version", "layout_cache_key"]

log = logging.getLogger(__name__)

CACHE_FORMAT = "autoshard.layout_result/1"
MAX_BYTES = 4 << 30
"""Bound on the records kept (a LLaMA-3-8B plan is a few MB)."""
_SOURCES = ("solver", "costmodel", "hw_profiles", "autoshard/graph", "autoshard/rules", "autoshard/plan")


def code_version() -> str:
    """sha256 (20 hex digits) of the sources that build, price and solve a layout."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for folder in _SOURCES:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".json") and path.is_file():
                h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def _jsonable(value: Any) -> Any:
    if isinstance(value, HardwareProfile):
        return value.fingerprint
    return repr(value)


def layout_cache_key(kind: str, fingerprint: Any, options: Mapping[str, Any], code: str) -> str:
    """sha256 hex of a layout's ``kind`` of record (``result`` or ``bound``),
    its plan fingerprint, the options that decide it and the code version."""
    what = {"kind": kind, "fingerprint": fingerprint.to_dict(), "options": dict(options), "code": code}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=_jsonable).encode()).hexdigest()


class LayoutCache:
    """Records of finished layouts under ``folder/layouts`` (or nowhere: ``None``).

    Only the search's own process reads and writes it (workers hand their
    results back), so its in-memory index stays true for the run."""

    def __init__(self, folder: str | Path | None) -> None:
        self.store = None
        if folder is not None:
            from autoshard.service.cache import ResultCache

            self.store = ResultCache(Path(folder) / "layouts", max_bytes=MAX_BYTES)

    def get(self, key: str) -> dict[str, Any] | None:
        """The record, or None (missing, unreadable or of another format)."""
        text = self.store.get(key) if self.store is not None else None
        if text is None:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else None

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """Store atomically; a full or read-only cache is a warning, not the end of the search."""
        if self.store is None:
            return
        try:
            self.store.put(key, json.dumps({"format": CACHE_FORMAT, **record}, allow_nan=False))
        except (OSError, ValueError) as exc:
            log.warning("mesh search: cannot write the layout cache (%s)", exc)
