"""``MODULE:FACTORY`` model specs: where they are looked up, and how they fail.

A spec names a function ``FACTORY(**overrides) -> (model, example_inputs)``.
The module is imported as ``python -m`` would: from ``--path DIR`` folders
(in the order given), then the current directory, then the installed
packages. Why: ``pip install`` installs ``autoshard`` but not the
repository's ``examples`` package, so ``examples.models.mlp:tiny`` only
resolves from the repository root (the current directory) or with
``--path /path/to/the/checkout``; the error says so in one line.

Every failure is a ``ValueError`` with a one-line message; nothing here
imports torch (the factory's module may).

>>> split_spec("examples.models.mlp:tiny")
('examples.models.mlp', 'tiny')
>>> split_spec("foo")
Traceback (most recent call last):
...
ValueError: expected MODULE:FACTORY (e.g. examples.models.llama3:tiny), got 'foo'
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["split_spec", "add_path_argument", "use_paths", "check_importable", "import_factory", "load_model",
           "parse_kwargs"]

_HINT = "run from the repository root or pass --path DIR"


def split_spec(spec: str) -> tuple[str, str]:
    """``MODULE:FACTORY`` -> (module, factory), checked without importing anything."""
    module_name, sep, factory_name = spec.partition(":")
    if (not sep or not module_name or not factory_name or ":" in factory_name
            or not all(part.isidentifier() for part in module_name.split("."))
            or not factory_name.isidentifier()):
        raise ValueError(f"expected MODULE:FACTORY (e.g. examples.models.llama3:tiny), got {spec!r}")
    return module_name, factory_name


def add_path_argument(parser: argparse.ArgumentParser) -> None:
    """``--path DIR`` (repeatable) on a command that takes a model spec."""
    parser.add_argument("--path", action="append", default=[], metavar="DIR",
                        help="also import MODULE from this folder (repeatable; the current folder is searched too)")


def use_paths(paths: Sequence[str] = ()) -> None:
    """Put ``paths`` (each an existing folder) at the front of ``sys.path``,
    the first path first, and the current directory after them."""
    for path in paths:
        if not os.path.isdir(path):
            raise ValueError(f"--path {path}: no such folder")
    if os.getcwd() not in sys.path:  # as `python -m` does: examples/ in the cwd is importable
        sys.path.insert(0, os.getcwd())
    for entry in reversed([os.path.abspath(p) for p in paths]):
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)


def check_importable(spec: str, paths: Sequence[str] = ()) -> None:
    """Fail as :func:`import_factory` would if ``spec``'s module cannot be
    found, without running it (its packages' ``__init__`` do run): a command
    that imports the model much later, in other processes, checks it first."""
    import importlib.util

    module_name, _ = split_spec(spec)
    use_paths(paths)
    importlib.invalidate_caches()
    try:
        found = importlib.util.find_spec(module_name)
    except ImportError as exc:  # a parent package is missing
        found, reason = None, str(exc)
    except Exception as exc:  # a parent package failing at import is input, not our crash
        raise ValueError(f"importing {module_name!r} (from spec {spec!r}) failed: {type(exc).__name__}: "
                         f"{_first_line(exc)}") from None
    else:
        reason = f"No module named {module_name!r}"
    if found is None:
        raise ValueError(f"cannot import module {module_name!r} (from spec {spec!r}): {reason}; {_HINT}")


def import_factory(spec: str, paths: Sequence[str] = ()) -> Callable[..., Any]:
    """The function ``spec`` names (its module imported, not called)."""
    module_name, factory_name = split_spec(spec)
    use_paths(paths)
    importlib.invalidate_caches()  # a folder listed before the module was written there
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            # the spec's own module (or a package of it) is not on the path: say where to look
            raise ValueError(f"cannot import module {module_name!r} (from spec {spec!r}): {exc}; {_HINT}") from None
        raise ValueError(f"importing {module_name!r} (from spec {spec!r}) failed: {exc}") from None
    except Exception as exc:  # user code failing at import (a SyntaxError, a RuntimeError) is input, not our crash
        raise ValueError(f"importing {module_name!r} (from spec {spec!r}) failed: {type(exc).__name__}: "
                         f"{_first_line(exc)}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ValueError(f"module {module_name!r} has no factory {factory_name!r}")
    return factory


def load_model(spec: str, overrides: Mapping[str, Any] | None = None, *,
               paths: Sequence[str] = ()) -> tuple[Any, tuple | dict]:
    """Import ``spec`` and call it: (model, example inputs as a tuple of
    positional tensors or a dict of keyword tensors)."""
    factory = import_factory(spec, paths)
    kwargs = dict(overrides or {})
    try:
        result = factory(**kwargs)
    except Exception as exc:  # any failure of user code is reported, not raised
        raise ValueError(f"{spec}(**{kwargs}) failed: {type(exc).__name__}: {_first_line(exc)}") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], (tuple, list, Mapping))):
        raise ValueError(f"{spec} must return (model, example_inputs), got {type(result).__name__}")
    inputs = result[1]
    return result[0], dict(inputs) if isinstance(inputs, Mapping) else tuple(inputs)


def parse_kwargs(text: str) -> dict[str, Any]:
    """The ``--kwargs`` JSON object.

    >>> parse_kwargs('{"n_layers": 1}')
    {'n_layers': 1}
    """
    from hw_profiles.json_input import parse_json  # torch-free, but not needed before a --kwargs

    try:
        value = parse_json(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kwargs is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--kwargs must be a JSON object, got {type(value).__name__}")
    return value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
