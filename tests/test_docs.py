"""The documentation cannot drift from the code: schemas, examples, links, commands.

- ``docs/schemas/*.schema.json`` equal what ``docs/schemas/generate.py`` writes
  from the code's dicts, and each schema accepts the files the code writes
  (a problem from ``Problem.to_dict`` and ``solver.io``, a solution, a plan
  and its dumped problem from a real solve of ``examples.models.mlp:tiny``,
  every shipped hardware profile) and refuses broken ones;
- every JSON example in ``docs/formats.md`` marked ``<!-- schema: NAME -->``
  is valid against that schema, and the loader reads it;
- every relative link of the docs and the README points to a file of the
  repository (and a heading of it, for ``#anchors``);
- every ``autoshard COMMAND`` in ``docs/cli.md`` is a real subcommand, and
  every flag of every command is documented in its section.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCHEMAS = DOCS / "schemas"


def _generator():
    spec = importlib.util.spec_from_file_location("docs_schemas_generate", SCHEMAS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _assert_valid(name: str, data: object) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator(name).iter_errors(data)]
    assert not errors, f"{name}: " + "; ".join(errors[:5])


def _assert_invalid(name: str, data: object) -> None:
    assert not _validator(name).is_valid(data), f"{name} accepted a broken file"


# -- the schema files are the code's ----------------------------------------------------


def test_schema_files_equal_the_generated_ones():
    gen = _generator()
    expected = gen.schemas()
    on_disk = {p.name for p in SCHEMAS.glob("*.schema.json")}
    assert on_disk == set(expected), "docs/schemas holds other files than the generator writes"
    for name, schema in expected.items():
        assert (SCHEMAS / name).read_text() == gen.render(schema), (
            f"docs/schemas/{name} is stale: run python docs/schemas/generate.py")


def test_profile_schema_is_the_loaders_schema():
    from hw_profiles import SCHEMA

    data = json.loads((SCHEMAS / "hw_profile.schema.json").read_text())
    data.pop("title")
    data.pop("description")
    assert data == json.loads(json.dumps(SCHEMA))


# -- problems and solutions -------------------------------------------------------------


@pytest.fixture(scope="module")
def example_problem():
    from solver.io import load_problem

    return load_problem(ROOT / "examples" / "problems" / "transformer_2_layers.json")


def test_problem_schema_accepts_what_the_solver_writes(example_problem, tmp_path):
    import numpy as np

    from solver.io import load_json, write_json_atomic
    from solver.problem import Edge, Node, Problem

    _assert_valid("problem", load_json(ROOT / "examples" / "problems" / "transformer_2_layers.json"))
    _assert_valid("problem", example_problem.to_dict())
    shared = np.array([[0.0, np.inf], [2.0, 0.5]])
    nodes = (Node(np.array([1.0, np.inf]), np.array([4.0, 2.0]), live=(0, 2), name="a", strategies=("R", "S(0)")),
             Node(np.array([0.0, 3.0]), np.array([1.0, 1.0])), Node(np.array([2.0, 2.0]), np.zeros(2)))
    problem = Problem(nodes, (Edge(0, 1, shared), Edge(1, 2, shared), Edge(0, 2, np.ones((2, 2)))),
                      memory_limit=8.0, ties=((1, 2),), pins={0: 1}, name="small")
    data = problem.to_dict()
    assert "matrices" in data and data["nodes"][0]["cost"][1] is None  # shared matrix, forbidden cost
    write_json_atomic(tmp_path / "p.json", data)
    _assert_valid("problem", load_json(tmp_path / "p.json"))


def test_problem_schema_refuses_broken_problems():
    good = {"nodes": [{"cost": [1, 2]}, {"cost": [0]}], "edges": [{"src": 0, "dst": 1, "cost": [[0], [1]]}]}
    _assert_valid("problem", good)
    for path, value in ((("nodes", 0, "cost", 0), -1.0), (("edges", 0, "cost", 1, 0), -5)):
        bad = copy.deepcopy(good)
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        _assert_invalid("problem", bad)
    _assert_invalid("problem", {"edges": []})  # no nodes
    _assert_invalid("problem", {"nodes": [{"memory": [1]}]})  # a node without cost
    _assert_invalid("problem", {**good, "format": "autoshard.problem/2"})
    _assert_invalid("problem", {"nodes": [{"cost": [1], "memroy": [4]}]})  # a typo the loader would ignore
    _assert_invalid("problem", {**good, "edges": [{"src": 0, "dst": 1, "cost": [[0], [1]], "matrix": 0}]})


def test_solution_schema_accepts_a_solve_and_refuses_broken_ones():
    from solver import Problem, solve

    tiny = Problem.from_dict({"nodes": [{"cost": [3, 1], "memory": [1, 2]}, {"cost": [0, 2]}],
                              "edges": [{"src": 0, "dst": 1, "cost": [[0, 1], [4, 0]]}]})
    data = solve(tiny, time_limit=10).to_dict()
    json.dumps(data, allow_nan=False)  # plain JSON: no NaN or infinity in stats
    _assert_valid("solution", data)
    empty = solve(Problem.from_dict({"nodes": []}), time_limit=5).to_dict()
    _assert_valid("solution", empty)
    infeasible = solve(Problem.from_dict({"nodes": [{"cost": [1, 2], "memory": [4, 5]}], "memory_limit": 3}),
                       time_limit=5).to_dict()
    assert infeasible["status"] == "infeasible" and infeasible["cost"] is None
    _assert_valid("solution", infeasible)
    _assert_invalid("solution", {k: v for k, v in data.items() if k != "choice"})
    _assert_invalid("solution", {**data, "cost": -1.0})
    _assert_invalid("solution", {**data, "format": "autoshard.plan/1"})
    _assert_invalid("solution", {**data, "status": "done"})


# -- plans and dumped problems --------------------------------------------------------


@pytest.fixture(scope="module")
def solved_mlp():
    """(plan dict, dumped problem dict) of examples.models.mlp:tiny on mesh (2,), cpu-gloo."""
    pytest.importorskip("torch")
    from autoshard.graph.problem import to_problem
    from autoshard.assembly.from_graph import plan_request
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import mlp

    prep = prepare(*mlp.tiny(), mesh_shape=(2,), dim_names=("dp",), profile="cpu-gloo")
    plan = solve_prepared(prep, time_limit=20)
    problem = to_problem(prep.graph, memory_limit=plan.estimate.memory_limit_bytes, labels=True)
    dumped = plan_request(prep.graph, problem, fingerprint=plan.fingerprint, options=plan.options,
                          timings=prep.timings, solve={"time_limit": 20.0, "backend": "cbc", "gap": 1e-6})
    return json.loads(json.dumps(plan.to_dict(), allow_nan=False)), json.loads(json.dumps(dumped, allow_nan=False))


def test_plan_schema_accepts_a_solved_plan(solved_mlp):
    from autoshard.plan.format import Plan

    plan, _ = solved_mlp
    _assert_valid("plan", plan)
    _assert_valid("plan", Plan.from_dict(plan).to_dict())


def test_plan_schema_accepts_redistributions_and_buckets(solved_mlp):
    from costmodel.buckets.grouping import Bucket
    from costmodel.mesh import MeshSpec
    from costmodel.redistribute import plan_redistribute
    from hw_profiles import load

    plan, _ = solved_mlp
    steps = plan_redistribute("S(0)S(0)", "RR", MeshSpec((2, 2)), (64, 8), 4, load("h100-sxm-80gb"))
    strided = plan_redistribute("_S(0,sf=2)", "P(sum)", MeshSpec((2,)), (64, 8), 4, load("h100-sxm-80gb"))
    extra = copy.deepcopy(plan)
    extra["redistributions"] = [{"tensor": "mm", "output": 0, "to": "add", "input": 1, **steps.to_dict()},
                                {"tensor": "mm", "to": "add", **strided.to_dict()}]
    extra["buckets"] = [Bucket("all_reduce", (0, 1), "sum", "torch.float32", ("grad:a", "grad:b"), 4096,
                               1e-4).to_dict()]
    _assert_valid("plan", extra)


def test_plan_schema_refuses_broken_plans(solved_mlp):
    plan, _ = solved_mlp
    _assert_invalid("plan", {k: v for k, v in plan.items() if k != "fingerprint"})
    _assert_invalid("plan", {**plan, "format": "autoshard.plan/0"})
    _assert_invalid("plan", {**plan, "estimate": {**plan["estimate"], "comm_s": -1.0}})
    _assert_invalid("plan", {**plan, "params": {**plan["params"], "layers.0.w1.weight": "S(0"}})
    step = {"collective": "all_reduce", "mesh_dims": [0], "bytes": 16, "cost_s": -1e-3}
    _assert_invalid("plan", {**plan, "redistributions": [{"tensor": "a", "to": "b", "from": "P(sum)",
                                                          "to_placement": "R", "steps": [step]}]})


def test_dumped_problem_is_valid_and_its_section_too(solved_mlp):
    from autoshard.assembly.request import PlanRequest

    _, dumped = solved_mlp
    _assert_valid("problem", dumped)
    _assert_valid("plan_request", dumped["autoshard"])
    PlanRequest.from_dict(dumped["autoshard"])  # and the loader agrees
    broken = copy.deepcopy(dumped["autoshard"])
    broken["assembly"].pop("strategy_lists")
    _assert_invalid("plan_request", broken)
    _assert_invalid("plan_request", {**dumped["autoshard"], "format": "autoshard.plan_request/2"})


# -- hardware profiles -----------------------------------------------------------------


@pytest.mark.parametrize("path", sorted((ROOT / "hw_profiles" / "data").glob("*.json")), ids=lambda p: p.stem)
def test_profile_schema_accepts_every_shipped_profile(path):
    _assert_valid("hw_profile", json.loads(path.read_text()))


def test_profile_schema_refuses_broken_profiles():
    from hw_profiles import load

    good = load("h100-sxm-80gb").to_dict()
    _assert_valid("hw_profile", good)
    _assert_invalid("hw_profile", {k: v for k, v in good.items() if k != "device"})
    _assert_invalid("hw_profile", {**good, "format": "autoshard.hw_profile/2"})
    tiers = copy.deepcopy(good["interconnect"])
    tiers[0]["collectives"]["all_reduce"]["alpha_s"] = -1e-6
    _assert_invalid("hw_profile", {**good, "interconnect": tiers})


# -- examples in the docs ----------------------------------------------------------------

_MARKED = re.compile(r"<!-- schema: ([a-z_]+) -->\s*```json\n(.*?)```", re.S)


def test_marked_examples_in_formats_md_are_valid():
    from autoshard.plan.format import Plan
    from hw_profiles import load_dict
    from solver.problem import Problem
    from solver.solution import Solution

    loaders = {"problem": Problem.from_dict, "solution": Solution.from_dict, "plan": Plan.from_dict,
               "hw_profile": load_dict}
    found = _MARKED.findall((DOCS / "formats.md").read_text())
    assert {name for name, _ in found} >= set(loaders), "formats.md lacks a marked example of some format"
    for name, text in found:
        data = json.loads(text)
        _assert_valid(name, data)
        if name in loaders:
            loaders[name](data)


# -- links ----------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"```.*?```", re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def _links(path: Path) -> list[str]:
    text = _FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in _LINK.findall(text)]


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))], ids=lambda p: p.name)
def test_relative_links_point_into_the_repository(page):
    for target in _links(page):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        assert dest.is_relative_to(ROOT), f"{page.name}: link {target} leaves the repository"
        assert dest.exists(), f"{page.name}: link {target} points to nothing"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: link {target}: no such heading in {dest.name}"


# -- the command line ---------------------------------------------------------------------------


def _cli_sections() -> dict[str, str]:
    """``## `autoshard solve` `` (or ``python -m solver``) heading -> its section's text."""
    text = (DOCS / "cli.md").read_text()
    parts = re.split(r"^## `([^`]+)`.*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _option_strings(parser) -> set[str]:
    import argparse

    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings
            if s not in ("-h", "--help")}


def test_cli_md_names_real_subcommands_only():
    from autoshard.cli import _COMMANDS

    names = {name for name, _, _ in _COMMANDS}
    text = (DOCS / "cli.md").read_text()
    code = "\n".join(_FENCE.findall(text) + re.findall(r"`[^`\n]+`", text))
    used = set(re.findall(r"(?<![\w.-])autoshard ([a-z][a-z-]*)", code))
    assert used - names == set(), f"docs/cli.md names commands that do not exist: {sorted(used - names)}"
    assert names <= used, f"docs/cli.md does not document: {sorted(names - used)}"


def test_cli_md_documents_every_flag():
    import argparse

    from autoshard.cli import build_parser
    from autoshard.cli.serve import add_arguments as serve_arguments
    from solver.cli import build_parser as solver_parser

    sections = _cli_sections()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {f"autoshard {name}": p for name, p in sub.choices.items()}
    parsers["autoshard"] = parser
    parsers["python -m solver"] = solver_parser()
    service = argparse.ArgumentParser()
    serve_arguments(service)
    parsers["python -m autoshard.service"] = service
    for title, p in parsers.items():
        assert title in sections, f"docs/cli.md has no section ## `{title}`"
        missing = sorted(flag for flag in _option_strings(p) if not re.search(re.escape(flag) + r"(?![\w-])",
                                                                              sections[title]))
        assert not missing, f"docs/cli.md, {title}: flags not documented: {missing}"


# -- the README is a front door; commands in the docs are real ------------------------------------

README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
README_MAX_LINES = 200
# a quoted plan program entry ("issue 3": start collective 3) is not a reference to an issue
_ISSUE = re.compile(r"(?<![\"`])\bissues?\s+#?\d+", re.I)


def _pages_without_history() -> list[Path]:
    return [README, RESULTS, *sorted(DOCS.rglob("*.md"))]


def test_readme_is_at_most_200_lines():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines (at most {README_MAX_LINES}): move "
                                       "measurements to benchmarks/RESULTS.md and internals to docs/")


@pytest.mark.parametrize("page", _pages_without_history(), ids=lambda p: p.name)
def test_no_issue_numbers(page):
    hits = [f"{page.name}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if _ISSUE.search(line)]
    assert not hits, "the docs describe what is, not the issue that asked for it:\n" + "\n".join(hits)


def test_results_page_links_resolve():
    test_relative_links_point_into_the_repository(RESULTS)


def _code_lines(text: str) -> list[str]:
    """The lines of fenced blocks, of indented (4-space) blocks and of inline code spans."""
    lines = [line for block in _FENCE.findall(text) for line in block.splitlines()[1:-1]]
    prose = _FENCE.sub("", text)
    lines += [line[4:] for line in prose.splitlines() if line.startswith("    ") and line.strip()]
    lines += re.findall(r"`([^`\n]+)`", prose)
    return lines


def _commands(text: str) -> list[list[str]]:
    """Each shell command of the code (split at ``&&``, ``||``, ``;``, ``|``), as words; comments dropped."""
    import shlex

    out = []
    for line in _code_lines(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a fragment that is not shell (Python, prose in backticks)
            continue
        command: list[str] = []
        for word in words + [";"]:
            if word in ("&&", "||", ";", "|"):
                if command:
                    out.append(command)
                command = []
            else:
                command.append(word)
    return out


def _subparsers() -> dict:
    import argparse

    from autoshard.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _module_exists(name: str) -> bool:
    """``python -m name`` runs: a module or package of the repository, or an installed top-level one."""
    path = ROOT.joinpath(*name.split("."))
    if path.with_suffix(".py").is_file() or (path / "__main__.py").is_file():
        return True
    top = name.split(".")[0]
    ours = (ROOT / top).is_dir() or (ROOT / f"{top}.py").is_file()
    return not ours and "." not in name and importlib.util.find_spec(top) is not None


def _command_problems(text: str) -> list[str]:
    """What is wrong with the commands in ``text``'s code: unknown ``autoshard`` subcommands and flags,
    ``python FILE`` / ``torchrun FILE`` naming no file, ``python -m MODULE`` naming no module."""
    subparsers = _subparsers()
    problems = []
    for words in _commands(text):
        if words[0] == "autoshard" and len(words) > 1 and not words[1].startswith("-"):
            name = words[1]
            if name not in subparsers:
                problems.append(f"autoshard {name}: no such subcommand")
                continue
            known = _option_strings(subparsers[name]) | {"-h", "--help"}
            problems += [f"autoshard {name} {w}: no such flag" for w in words[2:]
                         if w.startswith("--") and w.split("=")[0] not in known]
        if words[0] in ("python", "python3") and len(words) > 1:
            if words[1] == "-m" and len(words) > 2 and not _module_exists(words[2]):
                problems.append(f"python -m {words[2]}: no such module")
            elif words[1].endswith(".py") and not (ROOT / words[1]).is_file():
                problems.append(f"python {words[1]}: no such file")
        if words[0] == "torchrun":
            problems += [f"torchrun ... {w}: no such file" for w in words if w.endswith(".py")
                         and not (ROOT / w).is_file()]
    return problems


COMMAND_PAGES = [README, RESULTS, *(DOCS / f"{name}.md" for name in ("solver", "contributing", "internals"))]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: p.name)
def test_commands_in_code_name_real_subcommands_flags_files_and_modules(page):
    problems = _command_problems(page.read_text())
    assert not problems, f"{page.name}: " + "; ".join(problems)


def test_command_check_catches_wrong_commands():
    text = ("```bash\nautoshard solv x\nautoshard solve m --mesh 2x2 --bogus 1  # a comment --nope\n```\n"
            "    python benchmarks/nothing.py && python -m benchmarks.nothing\n"
            "and `python -m solver.nothing` and `torchrun --standalone examples/nothing.py`; "
            "fine: `autoshard demo --time-limit 5`, `python -m pytest -q`, `python -m solver x.json`\n")
    assert sorted(_command_problems(text)) == sorted([
        "autoshard solv: no such subcommand", "autoshard solve --bogus: no such flag",
        "python benchmarks/nothing.py: no such file", "python -m benchmarks.nothing: no such module",
        "python -m solver.nothing: no such module", "torchrun ... examples/nothing.py: no such file"])


def test_readme_installs_extras_that_exist():
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = set(re.findall(r"pip install -e '\.\[([a-z0-9_,-]+)\]'", README.read_text()))
    used = {e for group in named for e in group.split(",")}
    assert used, "README.md names no pip install -e '.[extra]' command"
    assert used <= extras, f"README.md installs extras pyproject.toml lacks: {sorted(used - extras)}"


def test_readme_two_commands_are_the_ci_ones():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.search(r"^python3 -m venv .*$", ci, re.M).group(0)
    text = README.read_text()
    assert f"    {test_command}\n" in text, "README.md's test command differs from .ci/run's"
    main = [line for line in text.splitlines() if line.startswith("    python3 -m venv") and "autoshard demo" in line]
    assert len(main) == 1 and "pip install torch==2.13.0 && pip install -e" in main[0]
    assert main[0].endswith("torchrun --standalone --nproc-per-node 4 examples/train.py")


def test_solver_md_stage_table_lists_every_stage_in_order():
    from solver.stages import STAGES

    text = (ROOT / "docs" / "solver.md").read_text()
    table = text[text.index("| stage | module | enters when | gives |"):].split("\n\n")[0]
    rows = [line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]]
    assert rows == [stage.name for stage in STAGES]
