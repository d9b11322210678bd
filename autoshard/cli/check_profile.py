"""``autoshard check-profile FILE [FILE...]``: validate hardware profiles
without measuring anything.

Why: a profile steers every plan solved with it, and people edit them by
hand (a datasheet figure, a copied tier) or get them from a colleague's
calibration. This runs the loader's own checks (``hw_profiles.validate``:
the schema, finite and plausible figures, tiers in order; every message
names the field) on each file, or on a shipped profile given by name, and
prints one line per profile:

    ok: h100-sxm-80gb (h100-sxm-80gb, published: NVIDIA H100 80GB HBM3, 80.00 GiB, tiers nvlink(8) > network)
    autoshard check-profile: error: broken.json: device.launch_s: nan is not a finite number

``ok`` lines go to stdout, errors to stderr. Exit code 0 when every profile
is valid, 1 when one is not, 2 for usage errors. Torch-free.

>>> import argparse
>>> p = argparse.ArgumentParser(); add_arguments(p)
>>> p.parse_args(["cpu-gloo", "a.json"]).profiles
['cpu-gloo', 'a.json']
>>> summary(_load("cpu-gloo")).startswith("cpu-gloo, measured: ")
True
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hw_profiles import HardwareProfile, ProfileError, available, load, load_dict
from hw_profiles.json_input import parse_json

from autoshard.sizes import format_bytes

__all__ = ["add_arguments", "run", "check", "summary"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard check-profile``."""
    parser.add_argument("profiles", nargs="+", metavar="PROFILE",
                        help="a profile file (autoshard.hw_profile/1 JSON) or a shipped profile's name")


def _load(arg: str) -> HardwareProfile:
    """The profile ``arg`` names: a file, else a shipped name; ``ProfileError``
    naming the file and the field otherwise."""
    path = Path(arg)
    if path.is_dir():
        raise ProfileError(f"{arg}: is a folder, expected a profile file")
    if not path.exists():
        if arg in available():
            return load(arg)
        if arg.endswith(".json") or os.sep in arg:
            raise ProfileError(f"{arg}: no such file")
        raise ProfileError(f"{arg}: no such file, nor a shipped profile (shipped: {', '.join(available())})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{arg}: cannot read ({getattr(exc, 'strerror', None) or type(exc).__name__})") from None
    try:
        data = parse_json(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{arg}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return load_dict(data, where=arg)


def summary(profile: HardwareProfile) -> str:
    """``name, source: device, memory, tiers`` of a valid profile."""
    tiers = " > ".join(t.tier + (f"({t.ranks})" if t.ranks else "") for t in profile.interconnect)
    return (f"{profile.name}, {profile.source}: {profile.device.name}, "
            f"{format_bytes(profile.device.memory_bytes)}, tiers {tiers}")


def check(arg: str) -> str:
    """The ``ok:`` line of a valid profile; ``ProfileError`` otherwise."""
    return f"ok: {arg} ({summary(_load(arg))})"


def run(args: argparse.Namespace) -> int:
    """One line per profile; 0 when all are valid, 1 otherwise."""
    failed = 0
    for arg in args.profiles:
        try:
            line = check(arg)
        except ProfileError as exc:
            failed += 1
            print(f"autoshard check-profile: error: {exc}", file=sys.stderr, flush=True)
            continue
        print(line, flush=True)
    return 1 if failed else 0
