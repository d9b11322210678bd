"""``autoshard correct-profile [PROFILE] -o CORRECTED.json``: correct a profile for
this machine (``autoshard.calibrate.first_use``) and write the corrected profile.

Why a command: ``autoshard solve --profile-correction here`` and
:func:`autoshard.autoshard` apply the correction inside a solve; this shows it (the
ratios, measured over what the profile predicts, per family) and writes the
corrected profile, e.g. to check it on held-out ops
(``autoshard calibrate-hardware --check CORRECTED.json``) or to solve with it on a
machine that cannot measure. The correction is cached per machine
(``~/.cache/autoshard/profile-corrections``); ``--remeasure`` measures again;
``--calibrate`` first calibrates this machine (``calibrate-hardware --quick`` on
``--ranks`` local processes, ~2 minutes once, cached beside the corrections) and
applies only the correction's step figures to that profile, as
``profile_correction="calibrate"`` does.

    autoshard correct-profile cpu-gloo --ranks 4 -o cpu-gloo-here.json
    autoshard correct-profile cpu-gloo --ranks 4 --calibrate -o this-machine.json

Prints one line per family and exits 0; a bad profile or argument is one error
line and exit 1 (2 for usage errors).

>>> import argparse
>>> p = argparse.ArgumentParser(); add_arguments(p)
>>> p.parse_args(["--ranks", "4"]).profile
'cpu-gloo'
"""

from __future__ import annotations

import argparse
import json
import sys

from hw_profiles import ProfileError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard correct-profile``."""
    parser.add_argument("profile", nargs="?", default="cpu-gloo", help="a profile file or shipped name (default cpu-gloo)")
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the job on this host (default 4)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--remeasure", action="store_true", help="measure again instead of reading the cache")
    how.add_argument("--calibrate", action="store_true",
                     help="calibrate this machine first (calibrate-hardware --quick, cached), "
                          "then add the step figures")
    parser.add_argument("-o", "--output", metavar="CORRECTED.json", help="write the corrected profile here")


def run(args: argparse.Namespace) -> int:
    """Correct, print the ratios, write the profile."""
    from autoshard.calibrate.first_use import corrected_profile
    from autoshard.cli.check_profile import _load
    from solver.io import write_text_atomic

    if args.ranks < 1:
        print(f"autoshard correct-profile: error: --ranks: must be 1 or more, got {args.ranks}", file=sys.stderr)
        return 1
    try:
        base = _load(args.profile)
        mode = "calibrate" if args.calibrate else "remeasure" if args.remeasure else "here"
        profile, record = corrected_profile(base, ranks=args.ranks, mode=mode)
        if args.output:
            write_text_atomic(args.output, json.dumps(profile.to_dict(), indent=1) + "\n")
    except (ProfileError, OSError, RuntimeError) as exc:
        print(f"autoshard correct-profile: error: {exc}", file=sys.stderr)
        return 1
    if "calibration" in record:
        c = record["calibration"]
        print(f"{base.name}: this machine calibrated ({c['mode']}, {c['source']}, {c['date']}), then its step figures:")
    print(f"{base.name} on {record['machine']['cpu']} ({record['machine']['cores']} cores, {args.ranks} ranks), "
          f"{record['source']} {record['date']}, load {record['load']}:")
    for family, ratio in record["ratios"].items():
        if family == "step_op_s":  # seconds, not a ratio
            print(f"  step: {ratio * 1e6:.1f} us per op beyond the op alone")
        elif family == "step_byte_s":  # seconds per byte
            print(f"  step: {ratio * 2**20 * 1e6:.1f} us per MiB an op touches beyond the op alone (cold operands)")
        elif family == "matmul_byte_s":  # seconds per byte
            print(f"  matmul: {ratio * 2**20 * 1e6:.1f} us per MiB a GEMM packs beyond its FLOPs")
        elif family == "skew_s":  # seconds too
            print(f"  skew: a collective starts up to {ratio * 1e3:.2f} ms late after compute since the last one")
        else:
            print(f"  {family}: measured / profile {ratio:.3f}")
    if args.output:
        print(f"corrected profile written to {args.output}")
    return 0
