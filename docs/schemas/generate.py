"""Write the JSON Schemas of autoshard's file formats into this folder, from the code.

Why generated: a schema copied by hand drifts from the code that reads and
writes the files. Every schema here comes from a dict in the package that
owns the format, and ``tests/test_docs.py`` fails when a file here differs
from what this script would write:

==========================  ================================================
file                        from
==========================  ================================================
problem.schema.json         ``solver.schemas.PROBLEM_SCHEMA``
solution.schema.json        ``solver.schemas.SOLUTION_SCHEMA``
plan.schema.json            ``autoshard.plan.schema.PLAN_SCHEMA``
plan_request.schema.json    ``autoshard.plan.schema.PLAN_REQUEST_SCHEMA``
hw_profile.schema.json      ``hw_profiles.SCHEMA`` (the loader's own schema),
                            with a title and description added
==========================  ================================================

Usage, from the repository root (imports no torch)::

    python docs/schemas/generate.py            # (re)write the files
    python docs/schemas/generate.py --check    # exit 1 and name the stale files

>>> sorted(schemas())[0]
'hw_profile.schema.json'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> schema dict, for every format."""
    from hw_profiles import FORMAT as PROFILE_FORMAT
    from hw_profiles import SCHEMA as PROFILE_SCHEMA
    from solver.schemas import PROBLEM_SCHEMA, SOLUTION_SCHEMA

    from autoshard.plan.schema import PLAN_REQUEST_SCHEMA, PLAN_SCHEMA

    profile = {
        "$schema": PROFILE_SCHEMA["$schema"],
        "title": PROFILE_FORMAT,
        "description": "A hardware profile: one device kind and the interconnect tiers between devices "
                       "(docs/formats.md). hw_profiles.validate also checks what a schema cannot: tiers from "
                       "inner to outer with growing ranks, only the last one unbounded; strictly ascending curves; "
                       "finite numbers.",
        **{key: value for key, value in PROFILE_SCHEMA.items() if key != "$schema"},
    }
    return {
        "problem.schema.json": PROBLEM_SCHEMA,
        "solution.schema.json": SOLUTION_SCHEMA,
        "plan.schema.json": PLAN_SCHEMA,
        "plan_request.schema.json": PLAN_REQUEST_SCHEMA,
        "hw_profile.schema.json": profile,
    }


def render(schema: dict[str, Any]) -> str:
    """The file's text: indented JSON, keys in the code's order, a final newline."""
    return json.dumps(schema, indent=2, allow_nan=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/schemas/*.schema.json from the code.")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a file is missing or stale")
    parser.add_argument("--out", default=str(HERE), metavar="DIR", help="folder to write (default: this one)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    stale = []
    for name, schema in schemas().items():
        path = out / name
        text = render(schema)
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)} (run python docs/schemas/generate.py)", file=sys.stderr)
        return 1
    print(f"{'stale' if args.check else 'written'}: {', '.join(stale) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
