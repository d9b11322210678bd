"""Plans before and after a refactor, compared byte for byte.

``python benchmarks/plan_identity.py write DIR`` solves a fixed handful of
small example cases (each proven optimal in seconds) with ``autoshard solve``
and writes each case's plan and dumped problem into DIR;
``python benchmarks/plan_identity.py compare OLD NEW`` compares two such
folders file by file and exits 1 on the first difference that is not a wall
time.

What is ignored, and why (``docs/formats.md``): the plan's ``solver.seconds``
and ``solver.timings``, a mesh search's ``options.mesh_search.seconds``,
``.trace_s`` and ``.layouts[].seconds``, and the dumped problem's
``autoshard.timings`` are wall times; so is a mesh search plan's
``options.time_limit_s`` (the time its layout's solve had left of the
search's); the plan's ``fingerprint.torch`` /
``fingerprint.autoshard`` are versions. Everything else (placements,
collectives, estimate, schedule, the problem's costs and node names) must be
equal: files whose bytes differ are parsed, those fields blanked, and compared
value by value (numbers with ``==``: the same float, bit for bit, but for the
sign of a zero) and as re-serialised text (the same keys in the same order).

Run it from the repository root (``benchmarks/__init__.py`` says why):

>>> # python benchmarks/plan_identity.py write /tmp/before   (on the old code)
>>> # python benchmarks/plan_identity.py write /tmp/after    (on the new code)
>>> # python benchmarks/plan_identity.py compare /tmp/before /tmp/after
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/plan_identity.py`: re-executed as the module

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CPU_PROFILE = os.environ.get("PLAN_IDENTITY_CPU_PROFILE", "/tmp/cpu-gloo.old.json")

# name -> arguments of `autoshard solve` after the factory; all small enough to prove optimal in seconds.
CASES: dict[str, list[str]] = {
    "mlp_4_h100": ["examples.models.mlp:tiny", "--mesh", "4", "--profile", "h100-sxm-80gb"],
    "mlp_2x2_cpu": ["examples.models.mlp:tiny", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "gpt2_4_h100": ["examples.models.gpt2:tiny", "--mesh", "4", "--profile", "h100-sxm-80gb"],
    "gpt2_2x2_cpu": ["examples.models.gpt2:tiny", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "llama_2x2_h100": ["examples.models.llama3:tiny", "--mesh", "2x2", "--profile", "h100-sxm-80gb"],
    "llama_4_cpu": ["examples.models.llama3:tiny", "--mesh", "4", "--profile", CPU_PROFILE],
    "llama_2x2_h100_recompute_full": ["examples.models.llama3:tiny", "--mesh", "2x2", "--profile",
                                      "h100-sxm-80gb", "--recompute", "full"],
    "gpt2_4_h100_recompute_selective": ["examples.models.gpt2:tiny", "--mesh", "4", "--profile", "h100-sxm-80gb",
                                        "--recompute", "selective"],
    "mlp_devices4_h100": ["examples.models.mlp:tiny", "--devices", "4", "--profile", "h100-sxm-80gb",
                          "--no-cache", "--jobs", "1"],
    # the rest of the example zoo, on the CPU mesh a test runs them on
    "moe_2x2_cpu": ["examples.models.moe:tiny", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "vit_2x2_cpu": ["examples.models.vit:tiny", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "convnet_4_cpu": ["examples.models.convnet:tiny", "--mesh", "4", "--profile", CPU_PROFILE],
    # tiny Hugging Face models as given
    "hf_llama_2x2_cpu": ["examples.models.hf:hf_llama", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "hf_mistral_2x2_cpu": ["examples.models.hf:hf_mistral", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "hf_gpt2_2x2_cpu": ["examples.models.hf:hf_gpt2", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "hf_bert_2x2_cpu": ["examples.models.hf:hf_bert", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "hf_whisper_2x2_cpu": ["examples.models.hf:hf_whisper", "--mesh", "2x2", "--profile", CPU_PROFILE],
    "hf_mixtral_2x2_cpu": ["examples.models.hf:hf_mixtral", "--mesh", "2x2", "--profile", CPU_PROFILE],
    # LLaMA-3 8B (32 layers) on 64 H100s, as README's rows
    "llama8b_8x8_h100": ["examples.models.llama3:llama3_8b", "--mesh", "8x8", "--dims", "dp,tp",
                         "--profile", "h100-sxm-80gb"],
    "llama8b_2x4x8_h100": ["examples.models.llama3:llama3_8b", "--mesh", "2x4x8", "--dims", "dp_replicate,dp_shard,tp",
                           "--profile", "h100-sxm-80gb"],
}

# key paths (tuples) whose values are wall times or versions, per file kind
_PLAN_IGNORED = [("solver", "seconds"), ("solver", "timings"), ("fingerprint", "torch"), ("fingerprint", "autoshard")]
IGNORED = {
    "plan": _PLAN_IGNORED,
    "searched plan": [*_PLAN_IGNORED, ("options", "time_limit_s"), ("options", "mesh_search", "seconds"),
                      ("options", "mesh_search", "trace_s"), ("options", "mesh_search", "layouts", "*", "seconds")],
    "problem": [("autoshard", "timings")],
}


def write(folder: Path, only: list[str] | None, time_limit: float = 60.0) -> int:
    """Solve every case (or the ``only`` ones) into ``folder``; 1 when one failed."""
    folder.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, args in CASES.items():
        if only and name not in only:
            continue
        plan, problem = folder / f"{name}.plan.json", folder / f"{name}.problem.json"
        cmd = [sys.executable, "-m", "autoshard.cli", "solve", *args, "--time-limit", f"{time_limit:g}", "-o", str(plan)]
        if "--devices" not in args:
            cmd += ["--dump-problem", str(problem)]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        (folder / f"{name}.log").write_text(done.stdout + done.stderr)
        status = json.loads(plan.read_text())["solver"]["status"] if plan.exists() else "no plan"
        print(f"{name:36s} rc={done.returncode} {status:10s} {seconds:6.1f} s", flush=True)
        # a case that is not proven optimal within the limit still compares (the same anytime path
        # on the same problem), but is reported
        failed |= done.returncode != 0 or status not in ("optimal", "feasible", "timeout")
    return int(failed)


def _drop(data: object, paths: list[tuple[str, ...]]) -> object:
    """``data`` with the value at each path (``*``: every item of a list) replaced by a marker."""
    def blank(node: object, path: tuple[str, ...]) -> None:
        key, rest = path[0], path[1:]
        if key == "*" and isinstance(node, list):
            for item in node:
                blank(item, rest)
        elif isinstance(node, dict) and key in node:
            if rest:
                blank(node[key], rest)
            else:
                node[key] = "<ignored>"

    for path in paths:
        blank(data, path)
    return data


def _first_difference(a: object, b: object, where: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{where or '.'}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{where or '.'}: keys {sorted(set(a) ^ set(b)) or 'in another order'}"
        for key in a:
            found = _first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where or '.'}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} vs {b!r}"


def compare(old: Path, new: Path, new_sections: tuple[str, ...] = ()) -> int:
    """Compare the ``*.json`` files of two folders; 1 when any differs (or is missing).
    ``new_sections``: top-level plan sections the new code adds (``program``): absent in an old
    plan, they are dropped from the new one before comparing; everything else must still be equal."""
    names = sorted(p.name for p in old.glob("*.json"))
    if not names:
        print(f"{old}: no plans", file=sys.stderr)
        return 1
    bad = 0
    for name in names:
        other = new / name
        if not other.exists():
            print(f"{name}: missing in {new}")
            bad = 1
            continue
        kind = "problem" if name.endswith(".problem.json") else "plan"
        a, b = json.loads((old / name).read_text()), json.loads(other.read_text())
        if kind == "plan" and "mesh_search" in a.get("options", {}):
            kind = "searched plan"
        a, b = _drop(a, IGNORED[kind]), _drop(b, IGNORED[kind])
        if kind != "problem":
            b = {k: v for k, v in b.items() if not (k in new_sections and k not in a)}
        found = _first_difference(a, b)
        # bytes too: the same content serialised the same way (key order, number spelling)
        same_bytes = json.dumps(a, sort_keys=False) == json.dumps(b, sort_keys=False)
        raw_equal = (old / name).read_bytes() == other.read_bytes()
        verdict = "identical bytes" if raw_equal else ("equal except wall times" if not found and same_bytes
                                                       else f"DIFFERS at {found}")
        print(f"{name:48s} {verdict}")
        bad |= bool(found) or not same_bytes
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="solve the cases into a folder")
    w.add_argument("folder", type=Path)
    w.add_argument("--only", nargs="*", help="case names (default: all)")
    w.add_argument("--time-limit", type=float, default=60.0,
                   help="each solve's limit, s (default 60; a solve that stops at it may choose otherwise)")
    c = sub.add_parser("compare", help="compare two folders")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--new-section", action="append", default=[], metavar="KEY",
                   help="a top-level plan section the new code adds (e.g. program): ignored where the old plan "
                        "lacks it (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "write":
        return write(args.folder, args.only, args.time_limit)
    return compare(args.old, args.new, tuple(args.new_section))


if __name__ == "__main__":
    sys.exit(main())
