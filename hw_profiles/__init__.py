"""Hardware profiles (``autoshard.hw_profile/1``): one JSON per GPU and
interconnect, shipped as package data in ``hw_profiles/data``. Torch-free.

``load(name_or_path)`` returns a frozen :class:`HardwareProfile`;
``available()`` lists the shipped names; ``validate(dict)`` checks a dict and
raises :class:`ProfileError` naming the bad field.

>>> "h100-sxm-80gb" in available()
True
>>> load("h100-sxm-80gb").interconnect[0].tier
'nvlink'
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from hw_profiles.json_input import parse_json
from hw_profiles.profile import (
    COLLECTIVE_KINDS,
    FORMAT,
    SOURCE_KINDS,
    BusBandwidthCurve,
    Calibration,
    Citation,
    CollectiveFit,
    DeviceSpec,
    Efficiency,
    HardwareProfile,
    LoadRecord,
    Overlap,
    Tier,
)
from hw_profiles.schema import SCHEMA, ProfileError, validate

__all__ = [
    "FORMAT",
    "COLLECTIVE_KINDS",
    "SCHEMA",
    "ProfileError",
    "HardwareProfile",
    "DeviceSpec",
    "Efficiency",
    "Tier",
    "CollectiveFit",
    "BusBandwidthCurve",
    "Citation",
    "SOURCE_KINDS",
    "LoadRecord",
    "Calibration",
    "Overlap",
    "available",
    "load",
    "load_dict",
    "validate",
]


def _data_dir():
    return resources.files("hw_profiles") / "data"


def available() -> tuple[str, ...]:
    """Names of the shipped profiles, sorted.

    >>> available()[:2]
    ('a100-sxm-80gb', 'b200')
    """
    return tuple(
        sorted(p.name[: -len(".json")] for p in _data_dir().iterdir() if p.name.endswith(".json"))
    )


def load_dict(data: dict, *, where: str = "") -> HardwareProfile:
    """Validate a profile dict and build the dataclass tree."""
    validate(data, where=where)
    return HardwareProfile.from_dict(data)


@lru_cache(maxsize=64)
def _load_cached(key: str, is_path: bool, mtime_ns: int) -> HardwareProfile:
    # mtime_ns is part of the cache key so that an edited file is read again.
    if is_path:
        path = Path(key)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
        where = str(path)
    else:
        text = (_data_dir() / f"{key}.json").read_text()
        where = f"{key}.json"
    try:
        data = parse_json(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return load_dict(data, where=where)


def load(name_or_path: str | os.PathLike) -> HardwareProfile:
    """A shipped profile by name (``"h100-sxm-80gb"``) or a profile file by path.

    Unknown names raise :class:`ProfileError` listing the available ones.

    >>> load("cpu-gloo").source
    'measured'
    """
    text = os.fspath(name_or_path)
    is_path = text.endswith(".json") or os.sep in text or Path(text).is_file()
    if not is_path and text not in available():
        raise ProfileError(f"profile: unknown name {text!r} (available: {', '.join(available())})")
    if not is_path:
        return _load_cached(text, False, 0)
    path = Path(text).resolve()
    try:
        mtime_ns = path.stat().st_mtime_ns
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    return _load_cached(str(path), True, mtime_ns)
