"""The package layout is the architecture: imports between packages must run one way.

tokens → blockkeys → index ← events; index → matchinfo → plugins → scheduling; server,
transport and discovery at the edges. A cycle between two packages (or two modules) means a
layer reaches back up, so this test fails on the first one and names it. Imports inside
functions and under ``TYPE_CHECKING`` are not load-time edges and are ignored.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import ppc_extproc

ROOT = Path(ppc_extproc.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_imports(path: Path, module: str, known: set[str]) -> set[str]:
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.ClassDef, ast.If, ast.Try, ast.With)):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return found & known


def _graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = {m: _load_time_imports(p, m, set(paths)) - {m} for m, p in paths.items()}
    packages: dict[str, set[str]] = {}
    for module, deps in modules.items():
        top = ".".join(module.split(".")[:2])
        packages.setdefault(top, set()).update(
            dep_top for dep in deps if (dep_top := ".".join(dep.split(".")[:2])) != top
        )
    return modules, packages


@pytest.mark.parametrize("level", ["module", "package"])
def test_imports_have_no_cycles(level: str) -> None:
    modules, packages = _graphs()
    graph = modules if level == "module" else packages
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"{level} import cycle: {' -> '.join(exc.args[1])}")


def test_the_check_sees_real_edges() -> None:
    modules, packages = _graphs()
    assert "ppc_extproc.tokens.le32" in modules["ppc_extproc.blockkeys.hashing"]
    assert "ppc_extproc.tokens" in packages["ppc_extproc.blockkeys"]
