"""Profile corrections kept per machine (``autoshard.calibrate.first_use``
measures them): JSON files, one per key, written atomically, never pickled.

The key is what makes a correction hold: the CPU model, the cores this
process may use, the torch version, the ranks sharing the host, and the
profile's fingerprint (a recalibrated profile gets its own correction). The
folder is ``$AUTOSHARD_CACHE_DIR/profile-corrections`` when that is set, else
``$XDG_CACHE_HOME/autoshard/profile-corrections`` (``~/.cache`` by default).

A file that does not parse, or holds another key (a hash collision, a hand
edit), is reported in one warning line and measured again; never an error.

>>> key = machine_key("cpu-gloo@sha256:ab", ranks=4)
>>> sorted(key)
['cores', 'cpu', 'profile', 'ranks', 'reference', 'timing', 'torch']
>>> len(key_name(key))
16
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from hw_profiles.correction import ProfileCorrection

if TYPE_CHECKING:
    from hw_profiles import HardwareProfile

REFERENCE_SET = 4
"""Version of the reference set a correction times (``first_use``); a cached correction of another is
measured again. 2: two reference steps, cache-resident and cold (``step_byte_s``), 2026-12-05.
3: a thin GEMM (``matmul_byte_s``), 4: two thin GEMMs, 2026-12-06."""

__all__ = ["REFERENCE_SET", "cache_dir", "machine_key", "key_name", "load_cached", "save_cached", "load_cached_profile",
           "save_cached_profile"]


def cache_dir() -> Path:
    """The folder of the cached corrections (module docstring)."""
    from autoshard.plan.cache_folder import CACHE_ENV

    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "profile-corrections"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autoshard" / "profile-corrections"


def machine_key(profile_fingerprint: str, *, ranks: int) -> dict[str, Any]:
    """What a correction holds for: this machine's CPU, cores and torch, the
    ranks that share it, the profile, and how it was timed (``timing.PROTOCOL``)."""
    import torch

    from autoshard.calibrate.output import cpu_model, host_cores
    from autoshard.calibrate.timing import PROTOCOL

    return {"cpu": cpu_model(), "cores": host_cores(), "torch": torch.__version__, "ranks": int(ranks),
            "profile": profile_fingerprint, "timing": PROTOCOL, "reference": REFERENCE_SET}


def key_name(key: Mapping[str, Any]) -> str:
    """The file stem of ``key``: 16 hex digits of its canonical JSON's SHA-256."""
    return hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:16]


def _path(key: Mapping[str, Any], folder: Path | None) -> Path:
    return (folder or cache_dir()) / f"{key_name(key)}.json"


def load_cached(key: Mapping[str, Any], folder: Path | None = None) -> ProfileCorrection | None:
    """The correction cached for ``key``, or None (none cached, or an unreadable
    file: one warning, and the caller measures again)."""
    path = _path(key, folder)
    if not path.exists():
        return None
    try:
        correction = ProfileCorrection.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        warnings.warn(f"autoshard: profile correction cache {path} is unreadable ({exc}); measuring again",
                      RuntimeWarning, stacklevel=2)
        return None
    if dict(correction.machine) != dict(key):
        warnings.warn(f"autoshard: profile correction cache {path} holds another machine's key; measuring again",
                      RuntimeWarning, stacklevel=2)
        return None
    return correction


def save_cached(correction: ProfileCorrection, folder: Path | None = None) -> Path:
    """Write ``correction`` under its key, atomically (a reader never sees half a file)."""
    from solver.io import write_text_atomic

    path = _path(correction.machine, folder)
    write_text_atomic(path, json.dumps(correction.to_dict(), indent=1) + "\n", parents=True)
    return path


def _profile_path(key: Mapping[str, Any], folder: Path | None) -> Path:
    return (folder or cache_dir()) / f"calibrated-{key_name(key)}.json"


def load_cached_profile(key: Mapping[str, Any], folder: Path | None = None) -> "HardwareProfile | None":
    """The profile a first-use calibration measured for ``key`` (``{"key": ..., "profile": ...}``),
    or None (none cached; an unreadable or invalid file, or another key: one warning)."""
    from hw_profiles import HardwareProfile, ProfileError, validate

    path = _profile_path(key, folder)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if dict(data.get("key", {})) != dict(key):
            raise ValueError("it holds another machine's key")
        validate(data["profile"], where=str(path))
        return HardwareProfile.from_dict(data["profile"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ProfileError) as exc:
        warnings.warn(f"autoshard: calibrated profile cache {path} is unusable ({exc}); calibrating again",
                      RuntimeWarning, stacklevel=2)
        return None


def save_cached_profile(key: Mapping[str, Any], profile: "HardwareProfile", folder: Path | None = None) -> Path:
    """Write the profile calibrated for ``key``, atomically."""
    from solver.io import write_text_atomic

    path = _profile_path(key, folder)
    write_text_atomic(path, json.dumps({"key": dict(key), "profile": profile.to_dict()}, indent=1) + "\n",
                      parents=True)
    return path
