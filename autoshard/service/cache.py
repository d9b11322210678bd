"""A content-addressed result cache on disk, bounded, least recently used out first.

Why on disk: a plan service restarts (deploys, crashes) and its users keep
asking the same questions; a result stays valid as long as its key's inputs
(the request's content, the solver's code, the options) are the same, so it
is kept across restarts. Writes are atomic (temporary file, fsync, rename):
a reader never sees half a result, a crash leaves no torn file. The total
size is bounded; when a write goes over, the least recently read or written
entries go first. Recency is the file's mtime (touched on every hit), so
it survives a restart too.

Layout: ``DIR/results/ab/abcdef....json``, one JSON text per key (sha256 hex).

>>> import tempfile
>>> cache = ResultCache(tempfile.mkdtemp(), max_bytes=1 << 20)
>>> k = content_key("problem", b'{"nodes": []}', {"time_limit": 5}, "v1")
>>> cache.put(k, '{"cost": 1}'); cache.get(k)
'{"cost": 1}'
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

__all__ = ["ResultCache", "content_key", "code_version"]


def content_key(kind: str, body: bytes, options: Mapping[str, Any], version: str) -> str:
    """sha256 hex of what determines a result: the kind of job, the request's
    content (for plans it holds the fingerprint: graph, mesh, profile,
    versions), the options and the solver's code version."""
    h = hashlib.sha256()
    h.update(f"{kind}\n{version}\n".encode())
    h.update(json.dumps(dict(options), sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\n")
    h.update(hashlib.sha256(body).digest())
    return h.hexdigest()


def code_version() -> str:
    """``<autoshard version>+<sha256 of the solver, cost model, profiles and plan
    assembly sources>``: a result made by other code is a miss."""
    from autoshard.version import __version__

    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    files: list[Path] = []
    for package in ("solver", "costmodel", "hw_profiles"):
        files.extend(sorted((root / package).rglob("*.py")))
        files.extend(sorted((root / package).rglob("*.json")))
    files += [root / "autoshard" / "plan" / "assemble.py", root / "autoshard" / "plan" / "format.py",
              root / "autoshard" / "service" / "worker.py"]
    for path in files:
        try:
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
        except OSError:
            continue
    return f"{__version__}+{h.hexdigest()[:16]}"


class ResultCache:
    """Result texts by key on disk under ``root``; thread-safe.

    ``max_bytes``: the bound on the summed size of all entries (0: nothing is kept).
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int = 1 << 30) -> None:
        self.root = Path(root) / "results"
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recent first
        self.total_bytes = 0
        self.evictions = 0
        self.root.mkdir(parents=True, exist_ok=True)
        self._load_index()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def _load_index(self) -> None:
        """Rebuild the recency order from the files (mtime), dropping stray temporaries."""
        found = []
        for path in self.root.glob("*/*"):
            if path.name.startswith("."):  # an interrupted write
                path.unlink(missing_ok=True)
                continue
            if path.suffix == ".json":
                try:
                    st = path.stat()
                except OSError:
                    continue
                found.append((st.st_mtime_ns, path.stem, st.st_size))
        for _, key, size in sorted(found):
            self._entries[key] = size
            self.total_bytes += size
        with self._lock:
            self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> str | None:
        """The stored text, or None; a hit becomes the most recently used."""
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
        path = self._path(key)
        try:
            text = path.read_text(encoding="utf-8")
            os.utime(path)
        except OSError:  # removed behind our back
            with self._lock:
                self.total_bytes -= self._entries.pop(key, 0)
            return None
        return text

    def put(self, key: str, text: str) -> None:
        """Store ``text`` atomically, then evict least recently used entries down to ``max_bytes``."""
        data = text.encode("utf-8")
        if len(data) > self.max_bytes:
            return  # would evict everything and still not fit
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self._lock:
            self.total_bytes += len(data) - self._entries.pop(key, 0)
            self._entries[key] = len(data)
            self._evict()

    def _evict(self) -> None:
        """Drop the least recently used entries until the total fits (caller holds the lock)."""
        while self.total_bytes > self.max_bytes and self._entries:
            key, size = self._entries.popitem(last=False)
            self.total_bytes -= size
            self.evictions += 1
            self._path(key).unlink(missing_ok=True)

    def stats(self) -> dict[str, float]:
        """Entries, bytes, bound and evictions so far."""
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.total_bytes, "max_bytes": self.max_bytes,
                    "evictions": self.evictions}
