"""Tiny Hugging Face models through ``autoshard solve`` on 2x2, timed as the user sees it.

Why: issue 54's target is "< 10 s each, start-up included" for ``autoshard solve
examples.models.hf:hf_mamba2 --mesh 2x2 --profile cpu-gloo -o plan.json``. The
in-process zoo (``benchmarks.solve_time --tiny``) leaves out what a user waits for:
the interpreter, the imports (``transformers`` ~2 s of it, the user's own import),
the redistribution tables rebuilt by a process that starts with nothing in memory.

Each model runs as a fresh process (``python -m autoshard.cli solve ...``), timed
wall clock around the child as the shell does, twice: *cold*, with an empty
autoshard cache folder (``$AUTOSHARD_CACHE_DIR``: the first run on a machine),
then *warm*, the same folder again (the second run of that model). The phases are
the plan's own ``solver.timings`` (trace, build, solve, plan, overlap); "other" is
the rest of the wall time: interpreter start, imports, the model's construction,
writing the plan. Each timed child holds ``/tmp/autoshard-bench.lock`` (``flock``)
so that timings on a shared machine do not overlap; the wait for the lock is not
counted.

Python's bytecode: a user's installed package has its ``.pyc`` files; a
checkout run under ``PYTHONDONTWRITEBYTECODE=1`` compiles ~160 modules on every
start (about 1 s). The children therefore run with a bytecode cache of their own
(``PYTHONPYCACHEPREFIX``, :data:`PYCACHE`, kept between runs), filled before any
timing by ``compileall`` and one unmeasured solve (the prefix holds torch's and
transformers' bytecode too); ``--no-bytecode`` times them without one.

    python -m benchmarks.cli_solve                       # all 14 models, cold and warm
    python -m benchmarks.cli_solve --only hf_mamba hf_mamba2
    python -m benchmarks.cli_solve -o /tmp/cli_solve.md  # the table also written to a file
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/cli_solve.py`: re-executed as the module

import argparse
import fcntl
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.timing import load_average

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("hf_llama", "hf_mistral", "hf_gpt2", "hf_bert", "hf_t5", "hf_whisper", "hf_falcon", "hf_qwen3",
          "hf_mamba", "hf_mamba2", "hf_gemma3", "hf_mixtral", "hf_qwen3_moe", "hf_deepseek_v3")
TARGET_S = 10.0
LOCK = "/tmp/autoshard-bench.lock"
PHASES = ("trace_s", "build_s", "solve_s", "plan_s", "overlap_s")
SOURCES = ("autoshard", "costmodel", "solver", "hw_profiles", "examples")
PYCACHE = Path(tempfile.gettempdir()) / "autoshard-bench-pycache"
"""The children's bytecode (``PYTHONPYCACHEPREFIX``), kept between runs of the benchmark."""


@dataclass(frozen=True, slots=True)
class CliRun:
    """One ``autoshard solve`` process."""

    wall_s: float
    """Wall clock around the child, as the shell's ``time`` reports it."""
    cpu_s: float
    """The child's user + system CPU seconds (its own children included): on a loaded machine
    the wall time grows, this much less."""
    status: str
    """The plan's ``solver.status``, or why there is no plan."""
    phases: dict
    """The plan's ``solver.timings`` (seconds per phase; empty without a plan)."""


def solve_command(model: str, mesh: str, profile: str, plan: Path) -> list[str]:
    """The user's command line, as a fresh interpreter runs it.

    >>> solve_command("hf_gpt2", "2x2", "cpu-gloo", Path("/tmp/p.json"))[4:7]
    ['examples.models.hf:hf_gpt2', '--mesh', '2x2']
    """
    return [sys.executable, "-m", "autoshard.cli", "solve", f"examples.models.hf:{model}", "--mesh", mesh,
            "--profile", profile, "-o", str(plan)]


def run_once(cmd: list[str], env: dict[str, str], plan: Path, log: Path, lock: str | None) -> CliRun:
    """Run ``cmd`` holding ``lock`` (if given) and time it; the plan file's status and phases."""
    plan.unlink(missing_ok=True)
    with open(lock, "a") if lock else open(os.devnull) as held:
        if lock:
            fcntl.flock(held, fcntl.LOCK_EX)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not plan.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return CliRun(wall, cpu, f"rc={done.returncode}: {last[:80]}", {})
    solver = json.loads(plan.read_text())["solver"]
    return CliRun(wall, cpu, str(solver.get("status")), dict(solver.get("timings") or {}))


def child_env(cache_dir: Path, pycache: Path | None) -> dict[str, str]:
    """The children's environment: their own autoshard cache folder, and a bytecode cache when given."""
    env = {**os.environ, "AUTOSHARD_CACHE_DIR": str(cache_dir)}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _row(model: str, cold: CliRun, warm: CliRun) -> str:
    def ok(run: CliRun) -> bool:
        return run.wall_s < TARGET_S and run.status in ("optimal", "feasible")

    phases = " / ".join(f"{cold.phases.get(p, float('nan')):.1f}" for p in PHASES)
    other = cold.wall_s - sum(cold.phases.get(p, 0.0) for p in PHASES)
    verdict = "met" if ok(cold) and ok(warm) else ("warm only" if ok(warm) else "missed")
    status = cold.status if cold.status == warm.status else f"{cold.status} / {warm.status}"
    return (f"| {model} | {cold.wall_s:.1f} | {warm.wall_s:.1f} | {cold.cpu_s:.1f} / {warm.cpu_s:.1f} | {phases} | "
            f"{other:.1f} | {status} | {verdict} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=MODELS, metavar="MODEL", help="factories (default: all 14)")
    parser.add_argument("--mesh", default="2x2", help="mesh (default %(default)s)")
    parser.add_argument("--profile", default="cpu-gloo", help="hardware profile (default %(default)s)")
    parser.add_argument("--no-bytecode", action="store_true", help="children compile every module at start")
    parser.add_argument("--no-lock", action="store_true", help=f"do not hold {LOCK} while timing")
    parser.add_argument("-o", "--output", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    lock = None if args.no_lock else LOCK
    lines = [f"`python -m benchmarks.cli_solve{' ' + ' '.join(argv if argv is not None else sys.argv[1:])}`: "
             f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"load average {load_average()} at start, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"mesh {args.mesh}, profile {args.profile}, bytecode {'off' if args.no_bytecode else 'cached'}",
             "",
             "| model | wall s cold | wall s warm | CPU s cold / warm | cold trace / build / solve / plan / overlap s "
             "| cold other s | status | < 10 s |",
             "|---|---:|---:|---|---|---:|---|---|"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="cli_solve.") as tmp:
        work = Path(tmp)
        pycache = None if args.no_bytecode else PYCACHE
        if pycache is not None:  # as an installed package has them: compiled before any timing
            subprocess.run([sys.executable, "-m", "compileall", "-q", *SOURCES], cwd=ROOT, check=True,
                           env=child_env(work, pycache), stdout=subprocess.DEVNULL)
            # the prefix holds every module's bytecode, torch's and transformers' too: one unmeasured
            # solve compiles what a solve imports
            first = (args.only or MODELS)[0]
            run_once(solve_command(first, args.mesh, args.profile, work / "warmup.json"),
                     child_env(work / "cache-warmup", pycache), work / "warmup.json", work / "warmup.log", None)
        for model in args.only or MODELS:
            cache = work / f"cache-{model}"  # empty: the first run on a machine
            plan = work / f"{model}.plan.json"
            cmd = solve_command(model, args.mesh, args.profile, plan)
            env = child_env(cache, pycache)
            cold = run_once(cmd, env, plan, work / f"{model}.cold.log", lock)
            warm = run_once(cmd, env, plan, work / f"{model}.warm.log", lock)
            lines.append(_row(model, cold, warm))
            print(lines[-1], flush=True)
            if args.output:  # row by row: a run cut short keeps what it measured
                args.output.write_text("\n".join(lines) + "\n")
    lines.append(f"\nload average {load_average()} at the end")
    print(lines[-1])
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
