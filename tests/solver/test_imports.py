"""The solver's modules import each other at the top and without a cycle, so that reading
one module's imports tells what it builds on."""

from __future__ import annotations

import ast
from pathlib import Path

SOLVER = Path(__file__).resolve().parents[2] / "solver"
# lazy on purpose: the command line answers --help and bad flags before loading the solver,
# and the reductions' warm-up builds a Problem only when asked to compile
LAZY = {"solver.cli", "solver.reduction_kernels"}


def _imports() -> dict[str, tuple[set[str], set[str]]]:
    """Per module, the solver modules it imports at the top and inside functions
    (``if TYPE_CHECKING:`` blocks left out)."""
    found = {}
    for path in SOLVER.rglob("*.py"):
        name = ".".join(path.relative_to(SOLVER.parent).with_suffix("").parts).removesuffix(".__init__")
        top: set[str] = set()
        inner: set[str] = set()

        def visit(node, nested):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                    (inner if nested else top).update(n for n in names if n.startswith("solver."))
                else:
                    visit(child, nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(ast.parse(path.read_text()), False)
        found[name] = (top, inner)
    return found


def test_solver_modules_import_at_the_top():
    late = {m: sorted(inner) for m, (_, inner) in _imports().items() if inner and m not in LAZY}
    assert not late, f"imports inside functions: {late}"


def test_solver_imports_have_no_cycle():
    graph = {m: {d for d in top if d != m} for m, (top, _) in _imports().items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done or module not in graph:
            return
        for dep in sorted(graph[module]):
            visit(dep, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
