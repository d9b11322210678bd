"""The import graph of the four packages, built from every ``import`` and
``from ... import`` in their sources (at the top, inside functions, under
``if TYPE_CHECKING:``), has no cycle, no library module imports a
command-line module, and no rule family imports the rule validation.

Why every import: a cycle hidden inside a function is still a cycle. It works
only as long as nobody moves the import to the top, and it means the two
modules are one concern split in two files; so lazy imports (of torch, rich,
numba, a backend) are fine, but only where they add no cycle.

No cycle is not enough: two packages may each import the other through
different modules without a module cycle, and then neither can be read, tested
or moved without the other. So every module sits on a layer (:data:`LAYERS`,
low to high, the pipeline's order) and imports only from its own layer or
below. Why each layer sits where it does (from the imports as they are):

1. ``hw_profiles``: hardware numbers; imports nothing of ours.
2. ``costmodel``: placements, shard shapes, redistribution steps and their prices,
   collectives, overlap; reads profiles. Torch-free.
3. ``solver``: the integer program and its backends; reads profiles (the problem
   file's embedded profile), never the cost model. Torch-free.
4. base: ``autoshard.version``, ``autoshard.sizes``, ``autoshard.figures``: units and
   number formatting every layer above prints with (figures reads ``solver.io``).
5. comm: ``autoshard.runtime.process_group`` and ``autoshard.runtime.collectives``,
   the process groups and the collective calls a plan issues. They import nothing of
   autoshard, and the calibration measures exactly these calls, so they sit below
   it although their folder is the runtime's.
6. ``autoshard.rules``: sharding rules per op family over tensor metadata; need only
   the cost model's placements.
7. ``autoshard.trace``: the joint graph; stamps each node with the rules'
   ``TensorMeta``, so above the rules.
8. ``autoshard.validation``: runs rules on simulated shards, on a traced model's calls
   (``real_calls``, ``coverage``): above both.
9. ``autoshard.graph``: the strategy graph built from a trace and the rules.
10. ``autoshard.program``: one rank's step (schedule, step memory, shared copies,
    reservation), computed over the strategy graph's nodes.
11. ``autoshard.plan``: the plan file, which embeds the program's schedule; its
    format, schema, fingerprint, options and explain.
12. ``autoshard.assembly``: solution -> plan: reads the graph and the program,
    writes the plan.
13. ``autoshard.service``: the plan server (solve a dumped problem, assemble it) and
    its client and result cache: assembly and plan only, so the search may use the
    client and the cache.
14. ``autoshard.calibrate``: measures the machine (through the comm layer's calls)
    and corrects profiles; the solve applies first-use corrections, so below the search.
15. ``autoshard.search``: orchestration: solve, mesh search, expert baselines, pins,
    objective terms; uses everything below.
16. ``autoshard.runtime``: runs a plan, and its ``api`` solves one when there is none.
17. entry points: the ``autoshard`` package face (public names, imported lazily),
    ``autoshard.cli``, every ``__main__`` and ``solver.cli``.

No import runs up, and none is excused: where a lower layer needs something
of a higher one, the higher layer hands it down (the DTensor fallback in the
rules takes the check a derived rule must pass from its caller; the library's
check is ``autoshard.validation.validator.check_derived_rule``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autoshard", "solver", "costmodel", "hw_profiles")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` (a module, or a module's attribute) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> nx.DiGraph:
    """Module -> module it imports (the most specific module named: ``from a.b import c``
    points to ``a.b.c`` when that is a module, else to ``a.b``); edge attribute ``line``."""
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                module = _target(target, modules)
                if module is not None and module != name:
                    graph.add_edge(name, module, line=node.lineno)
    return graph


def _is_cli(module: str) -> bool:
    """Command-line modules: the ``autoshard.cli`` package (the entry point, its value
    parsers, one module per subcommand), the torch-free solver's own ``solver.cli``, and
    every ``__main__``."""
    return (module == "autoshard.cli" or module.startswith("autoshard.cli.") or module == "solver.cli"
            or module.rpartition(".")[2] == "__main__")


LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hw_profiles", ("hw_profiles",)),
    ("costmodel", ("costmodel",)),
    ("solver", ("solver",)),
    ("base", ("autoshard.version", "autoshard.sizes", "autoshard.figures")),
    ("comm", ("autoshard.runtime.process_group", "autoshard.runtime.collectives")),
    ("rules", ("autoshard.rules",)),
    ("trace", ("autoshard.trace",)),
    ("validation", ("autoshard.validation",)),
    ("graph", ("autoshard.graph",)),
    ("program", ("autoshard.program",)),
    ("plan", ("autoshard.plan",)),
    ("assembly", ("autoshard.assembly",)),
    ("service", ("autoshard.service",)),
    ("calibrate", ("autoshard.calibrate",)),
    ("search", ("autoshard.search",)),
    ("runtime", ("autoshard.runtime",)),
    ("entry", ("autoshard", "autoshard.cli")),
)
"""Layers, low to high (module docstring); a module's layer is its longest matching prefix,
except that command-line modules are entry points wherever they live (:func:`_is_cli`)."""


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of ``module`` (ValueError when no layer claims it)."""
    if _is_cli(module):
        return len(LAYERS) - 1
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    if best is None:
        raise ValueError(f"{module}: on no layer of LAYERS")
    return best[0]


def test_import_graph_sees_function_level_imports():
    graph = import_graph()
    # autoshard/__init__.py imports its public names inside __getattr__ only
    assert graph.has_edge("autoshard", "autoshard.search.solve") or graph.has_edge("autoshard", "autoshard.search.api")
    assert graph.has_edge("autoshard", "autoshard.runtime.api")


def test_import_graph_has_no_cycle():
    graph = import_graph()
    cycles = sorted(sorted(nx.simple_cycles(graph), key=len)[:20], key=lambda c: (len(c), c))
    lines = [" -> ".join(f"{a} (line {graph.edges[a, b]['line']})" for a, b in zip(c, c[1:] + c[:1])) + f" -> {c[0]}"
             for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(lines)


def test_library_modules_import_no_cli_module():
    graph = import_graph()
    bad = sorted(f"{a} (line {d['line']}) -> {b}" for a, b, d in graph.edges(data=True)
                 if _is_cli(b) and not _is_cli(a))
    assert not bad, "library modules importing command-line modules:\n" + "\n".join(bad)


def test_every_subcommand_lives_in_the_cli_package():
    from autoshard.cli import _COMMANDS

    modules = _modules()
    assert all(module.startswith("autoshard.cli.") and module in modules for _, module, _ in _COMMANDS)
    # a command-line module outside the package (the old ``plan/solve_cli.py`` layout) is not one
    assert not [m for m in modules if m.startswith("autoshard.") and m.rpartition(".")[2].endswith("cli")
                and not _is_cli(m)]


def test_rule_families_import_no_validation_module():
    """The rules are what the solver uses; their validation runs them, never the other way (the
    DTensor fallback is given its check by its caller)."""
    graph = import_graph()
    bad = sorted(f"{a} (line {d['line']}) -> {b}" for a, b, d in graph.edges(data=True)
                 if (a == "autoshard.rules" or a.startswith("autoshard.rules."))
                 and (b == "autoshard.validation" or b.startswith("autoshard.validation.")))
    assert not bad, "rule modules importing the validation:\n" + "\n".join(bad)


def test_every_module_sits_on_a_layer():
    unplaced = []
    for module in _modules():
        try:
            layer_of(module)
        except ValueError as exc:
            unplaced.append(str(exc))
    assert not unplaced, "modules on no layer (add their package to LAYERS):\n" + "\n".join(unplaced)


def test_layer_of_takes_the_longest_prefix_and_puts_entry_points_on_top():
    names = [name for name, _ in LAYERS]
    assert names[layer_of("autoshard.runtime.collectives")] == "comm"
    assert names[layer_of("autoshard.runtime.execute")] == "runtime"
    assert names[layer_of("autoshard.service.__main__")] == "entry"
    assert names[layer_of("solver.cli")] == "entry" and names[layer_of("solver.io")] == "solver"
    assert names[layer_of("autoshard")] == "entry" and names[layer_of("autoshard.sizes")] == "base"


def test_no_module_imports_a_layer_above_its_own():
    graph = import_graph()
    names = [name for name, _ in LAYERS]
    bad = sorted(f"{a} ({names[layer_of(a)]}, line {d['line']}) -> {b} ({names[layer_of(b)]})"
                 for a, b, d in graph.edges(data=True)
                 if layer_of(b) > layer_of(a))
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)

