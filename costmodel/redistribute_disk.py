"""Redistribution cost tables kept on disk between processes.

Why: ``autoshard solve`` on a tiny model spends ~2.5 s of a ~10 s run pricing the
strategy graph's redistribution tables (``costmodel.redistribute.redistribute_costs``,
a few hundred calls), from scratch in every process. A table is a pure function of
(the cost model's code, the hardware profile, the mesh, ``fuse``, the tensor's shape
and itemsize, the source and target placements), so a second solve of the same model,
or of another model with the same tensor shapes, reads it back instead.

One ``.npz`` file (numpy arrays, never a pickle) per (code version, profile content,
mesh, fuse) under the cache folder (:func:`autoshard.plan.cache_folder.tables_folder`),
named by the sha256 of that key; it maps one call's arguments to its table. The
numbers are float64 as computed, read back bit for bit, so a plan solved on cached
tables is the plan solved without them. The code version (:func:`code_version`) hashes
the sources of ``costmodel`` a table depends on and all of ``hw_profiles``: an edit of
them starts new files (and a write deletes those of other versions). Files are
replaced atomically (written to a temporary name, then ``os.replace``), merged
with what another process wrote meanwhile; an unreadable file is ignored and
rewritten. Nothing is written until :meth:`TableStore.flush` (the command calls it
once the plan is written).

>>> import tempfile
>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> store = TableStore(tempfile.mkdtemp())
>>> args = (MeshSpec((2, 2)), load("cpu-gloo"), True, (8, 8), 4, ["S(0)R"], ["RR", None])
>>> store.get(*args) is None
True
>>> store.put(*args, [[1.5e-05, 0.0]]); store.flush()
1
>>> TableStore(store.folder).get(*args)
[[1.5e-05, 0.0]]
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from costmodel.mesh import MeshSpec
from costmodel.placements import Placement, format_placements
from hw_profiles import HardwareProfile

__all__ = ["DEPENDS", "FORMAT", "TableStore", "active_store", "code_version", "dependencies", "use_folder"]

log = logging.getLogger(__name__)

FORMAT = "autoshard.redistribute_tables/1"
MAX_FILE_BYTES = 64 << 20
"""A file whose codes would pass this size starts over with this process's tables (many models
on one mesh)."""
_ROOTS = ("costmodel", "hw_profiles")
_CODE: list[str] = []


def _imports(path: Path) -> set[str]:
    """The ``costmodel`` / ``hw_profiles`` modules (or packages) that ``path`` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # ``from pkg import module``
    return {name for name in found if name.split(".")[0] in _ROOTS}


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def dependencies(root: Path | None = None) -> set[str]:
    """``costmodel.redistribute`` and every ``costmodel`` / ``hw_profiles`` module it imports,
    transitively, with their packages: what a table depends on (read from the sources' imports)."""
    root = root or Path(__file__).resolve().parents[1]
    files: set[str] = set()
    todo = ["costmodel.redistribute"]
    while todo:
        name = todo.pop()
        path = _module_file(root, name)
        if path is None or name in files:
            continue
        files.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:k]) for k in range(1, len(parts)))  # the packages it is in
        todo.extend(_imports(path))
    return files


DEPENDS = ("costmodel", "costmodel.collectives", "costmodel.compute", "costmodel.mesh", "costmodel.placements",
           "costmodel.redistribute", "costmodel.redistribute_classes", "costmodel.redistribute_disk",
           "costmodel.redistribute_prices", "costmodel.redistribute_search", "costmodel.redistribute_steps",
           "costmodel.shard_shapes")
"""The ``costmodel`` modules hashed into :func:`code_version`, with all of ``hw_profiles``: a copy
of :func:`dependencies` (parsing them costs 0.1 s a process), which a test keeps a superset of it."""


def code_version() -> str:
    """sha256 (20 hex digits) of the sources a table depends on (:data:`DEPENDS` and ``hw_profiles``):
    an edit elsewhere in the tree (the buckets' grouping, say) keeps the tables."""
    if not _CODE:
        root = Path(__file__).resolve().parents[1]
        files = {name: _module_file(root, name) for name in DEPENDS}
        files.update({f"hw_profiles/{p.relative_to(root / 'hw_profiles').as_posix()}": p
                      for p in (root / "hw_profiles").rglob("*.py")})
        digest = hashlib.sha256()
        for name in sorted(files):
            path = files[name]
            digest.update(name.encode() + b"\0" + (path.read_bytes() if path is not None else b""))
        _CODE.append(digest.hexdigest()[:20])
    return _CODE[0]


def _side(items: Sequence[Sequence[Placement] | str | None]) -> str:
    return ",".join("-" if p is None else (p if isinstance(p, str) else format_placements(p)) for p in items)


@dataclass(slots=True)
class _File:
    """The tables of one (code, profile, mesh, fuse): those read from disk and those added since."""

    path: Path
    header: dict
    tables: dict
    """Entry key -> 2-D float64 array."""
    added: dict = field(default_factory=dict)


class TableStore:
    """Redistribution tables under ``folder`` (module docstring); one per process is
    :func:`active_store`."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._files: dict[tuple, _File] = {}
        self._fingerprints: dict[int, tuple[HardwareProfile, str]] = {}

    def _file(self, mesh: MeshSpec, profile: HardwareProfile, fuse: bool) -> _File:
        known = self._fingerprints.get(id(profile))
        if known is None or known[0] is not profile:  # the canonical JSON's sha256: a few ms, once per profile
            known = self._fingerprints[id(profile)] = (profile, profile.fingerprint)  # held: its id stays its own
        fingerprint = known[1]
        key = (fingerprint, mesh.shape, mesh.strides, fuse)
        found = self._files.get(key)
        if found is None:
            header = {"format": FORMAT, "code": code_version(), "profile": fingerprint,
                      "mesh": list(mesh.shape), "strides": list(mesh.strides), "fuse": fuse}
            name = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:32]
            path = self.folder / f"{header['code']}-{name}.npz"
            found = self._files[key] = _File(path, header, _read(path, header))
        return found

    def get(self, mesh: MeshSpec, profile: HardwareProfile, fuse: bool, shape: Sequence[int], itemsize: int,
            srcs: Sequence, dsts: Sequence) -> list[list[float]] | None:
        """The table of this call (a fresh list) if one was stored, else None."""
        file = self._file(mesh, profile, fuse)
        key = _entry_key(shape, itemsize, srcs, dsts)
        table = file.tables.get(key)
        if table is None:
            table = file.added.get(key)
        return None if table is None else table.tolist()

    def put(self, mesh: MeshSpec, profile: HardwareProfile, fuse: bool, shape: Sequence[int], itemsize: int,
            srcs: Sequence, dsts: Sequence, table: "np.ndarray | list[list[float]]") -> None:
        """Remember this call's table, to be written by :meth:`flush`."""
        file = self._file(mesh, profile, fuse)
        file.added[_entry_key(shape, itemsize, srcs, dsts)] = np.asarray(table, dtype=np.float64).reshape(
            len(srcs), len(dsts))

    def flush(self) -> int:
        """Write every file that gained tables (merged with the file as it is on disk now);
        the number of files written. A folder that cannot be written is logged, not raised:
        the plan does not depend on it."""
        written = 0
        for file in self._files.values():
            if not file.added:
                continue
            merged = {**_read(file.path, file.header), **file.added}
            if sum(t.size for t in merged.values()) * 4 > MAX_FILE_BYTES:
                merged = dict(file.added)
            try:
                _write(file.path, file.header, merged)
            except OSError as exc:
                log.warning("redistribution tables not cached in %s (%s)", self.folder, exc)
                return written
            file.tables, file.added = merged, {}
            written += 1
        if written:
            _forget_other_code(self.folder)
        return written


def _forget_other_code(folder: Path) -> None:
    """Delete the files of other code versions (an edited or upgraded cost model): nothing reads them."""
    for path in folder.glob("*.npz"):
        if not path.name.startswith(f"{code_version()}-"):
            path.unlink(missing_ok=True)


def _entry_key(shape: Sequence[int], itemsize: int, srcs: Sequence, dsts: Sequence) -> str:
    return f"{'x'.join(str(int(s)) for s in shape)}|{int(itemsize)}|{_side(srcs)}|{_side(dsts)}"


def _write(path: Path, header: dict, tables: dict) -> None:
    """One ``.npz`` (no pickle): the JSON index (header, key -> [offset, rows, cols]) as bytes, the
    distinct values (float64, ``inf`` included) and each entry's value codes (uint16 or uint32), row-major.
    A model's tables hold ~10^6 numbers but a few thousand distinct ones."""
    keys = list(tables)
    flat = np.concatenate([tables[k].ravel() for k in keys]) if keys else np.zeros(0)
    values, codes = np.unique(flat, return_inverse=True)
    index, offset = {}, 0
    for k in keys:
        rows, cols = tables[k].shape
        index[k] = [offset, rows, cols]
        offset += rows * cols
    meta = np.frombuffer(json.dumps({**header, "tables": index}).encode(), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as out:
            width = np.uint16 if len(values) <= 1 << 16 else np.uint32
            np.savez(out, index=meta, values=values, codes=codes.astype(width).ravel())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path, header: dict) -> dict:
    """The tables of ``path`` if it is a file of ``header`` (else none: absent, unreadable, another key)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(data["index"].tobytes())
            values, codes = data["values"], data["codes"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # truncated, not an npz, ...
        log.debug("redistribution tables %s unreadable (%s): ignored", path, exc)
        return {}
    if not isinstance(meta, dict) or any(meta.get(k) != v for k, v in header.items()):
        return {}
    try:
        table = values[codes]
        return {k: table[o: o + r * c].reshape(r, c) for k, (o, r, c) in meta["tables"].items()}
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        log.debug("redistribution tables %s inconsistent (%s): ignored", path, exc)
        return {}


_ACTIVE: list[TableStore] = []


def use_folder(folder: str | os.PathLike[str] | None) -> TableStore | None:
    """Make ``folder`` this process's table store (None: no store), and return it.

    >>> use_folder(None) is None, active_store() is None
    (True, True)
    """
    _ACTIVE.clear()
    if folder is None:
        return None
    _ACTIVE.append(TableStore(folder))
    return _ACTIVE[0]


def active_store() -> TableStore | None:
    """The store ``costmodel.redistribute.redistribute_costs`` reads and fills, if one is in use."""
    return _ACTIVE[0] if _ACTIVE else None
