"""The import graph of the four packages, built from every ``import`` and
``from ... import`` in their sources (at the top, inside functions, under
``if TYPE_CHECKING:``), has no cycle, no library module imports a
command-line module, and no rule family imports the rule validation.

Why every import: a cycle hidden inside a function is still a cycle. It works
only as long as nobody moves the import to the top, and it means the two
modules are one concern split in two files; so lazy imports (of torch, rich,
numba, a backend) are fine, but only where they add no cycle.
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


def test_import_graph_sees_function_level_imports():
    graph = import_graph()
    # autoshard/__init__.py imports its public names inside __getattr__ only
    assert graph.has_edge("autoshard", "autoshard.plan.solve") or graph.has_edge("autoshard", "autoshard.plan.api")
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
    """The rules are what the solver uses; their validation runs them, never the other way. The
    DTensor fallback is the exception the validation package's docstring names: it validates a
    rule it derives before adopting it."""
    graph = import_graph()
    bad = sorted(f"{a} (line {d['line']}) -> {b}" for a, b, d in graph.edges(data=True)
                 if (a == "autoshard.rules" or a.startswith("autoshard.rules.")) and a != "autoshard.rules.dtensor_fallback"
                 and (b == "autoshard.validation" or b.startswith("autoshard.validation.")))
    assert not bad, "rule modules importing the validation:\n" + "\n".join(bad)
