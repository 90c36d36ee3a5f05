"""The package layout is the architecture: product layers import downward only, and the product
never imports the lab.

``LAYERS`` is the declared order of ``src/ppc_extproc``, lowest first; a module may import its own
layer and the layers before it. Every ``import`` counts wherever it stands: at module level,
inside a function, under ``TYPE_CHECKING`` (a type-only import still says which layer knows which),
and so does a string literal that names a module (what ``importlib.import_module`` loads).
Cycles are checked over runtime imports (module level and inside functions, not ``TYPE_CHECKING``:
those never execute), in the product and in the lab (``src/ppc_extproc_lab``). README's "How it
works" map lists the product's layers in this order.
"""

from __future__ import annotations

import ast
import graphlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import ppc_extproc
import ppc_extproc_lab

PRODUCT = Path(ppc_extproc.__file__).parent
LAB = Path(ppc_extproc_lab.__file__).parent
README = PRODUCT.parent.parent / "README.md"

#: The product's layers, lowest first: ``ppc_extproc.<name>`` (a package or a module); the root
#: package's ``__init__`` re-exports the errors, ``__main__`` runs the command line.
LAYERS: tuple[str, ...] = (
    "ids",            # NewType keys
    "errors",         # the error tree
    "histogram",      # bucket counts for the hand-built Prometheus collectors
    "__init__",       # the root package: version, the errors
    "native",         # per-prompt loops: the optional C extension or its pure-Python twins
    "tokens",         # request body → token ids
    "blockkeys",      # token ids → llm-d block keys
    "index",          # block keys → endpoints
    "events",         # KV events → index
    "matchinfo",      # index → longest-prefix match
    "framework",      # plugin roles, Endpoint, the request and its context
    "tokenizer",      # text → token ids
    "enginemetrics",  # engine load as polled
    "scheduling",     # endpoint pool, health, in-flight, the router running the roles
    "flowcontrol",    # admission queue: bands, flows, policies' roles, the controller
    "sessions",       # session bindings: the bounded local table, shared through Valkey/Redis
    "plugins",        # producers, scorers, filters, pickers, … and their registry
    "discovery",      # static, file and Kubernetes endpoint sources (plugins themselves)
    "config",         # EndpointPickerConfig → plugins and profiles
    "observability",  # metrics, logging
    "server",         # ext_proc, gRPC, admin HTTP, the app
    "cli",            # the command line (hands `demo` and `mock-vllm` to the lab)
    "__main__",
)

#: String-named imports that go upward on purpose, with the reason. The registry loads every
#: built-in plugin module by name so ``registered_types()`` lists them all, ``file-discovery``
#: (in ``discovery``, above ``plugins``) included.
UPWARD_BY_NAME: frozenset[tuple[str, str]] = frozenset({("ppc_extproc.plugins.registry", "ppc_extproc.discovery")})

#: The one product module that may import the lab, and only inside functions.
LAB_GATE = "ppc_extproc.cli.main"


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    target: str
    line: int
    #: "module" (runs at import time), "function" (runs when called), "types" (TYPE_CHECKING
    #: only) or "name" (a string literal naming a module).
    kind: str


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str, known: set[str]) -> list[Import]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def add(target: str, line: int, kind: str) -> None:
        # `from a.b import c` imports a.b, and a.b.c when c is a module.
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != module:
            found.append(Import(module, target, line, kind))

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            for child in node.body:
                visit(child, "types")
            for child in node.orelse:
                visit(child, kind)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, kind)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                add(f"{base}.{alias.name}", node.lineno, kind)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            add(node.value, node.lineno, "name")
        inner = "function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else kind
        for child in ast.iter_child_nodes(node):
            visit(child, inner if kind != "types" else kind)

    visit(ast.parse(path.read_text()), "module")
    return found


def _all_imports() -> list[Import]:
    paths = {_module_name(p, root): p for root in (PRODUCT, LAB) for p in root.rglob("*.py")}
    known = set(paths)
    return [imp for module, path in sorted(paths.items()) for imp in _imports(path, module, known)]


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _product(module: str) -> bool:
    return module == "ppc_extproc" or module.startswith("ppc_extproc.")


def _lab(module: str) -> bool:
    return module == "ppc_extproc_lab" or module.startswith("ppc_extproc_lab.")


def test_every_product_package_has_a_layer() -> None:
    present = {_layer(_module_name(p, PRODUCT)) for p in PRODUCT.rglob("*.py")}
    assert present - set(LAYERS) == set(), "add these to LAYERS (and to README's map) where they belong"
    assert set(LAYERS) - present == set(), "LAYERS names packages that no longer exist"


def test_layers_import_downward_only() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [
        f"{imp.importer}:{imp.line} imports {imp.target} ({imp.kind}): "
        f"{_layer(imp.target)} is above {_layer(imp.importer)}"
        for imp in _all_imports()
        if _product(imp.importer) and _product(imp.target)
        and rank[_layer(imp.target)] > rank[_layer(imp.importer)]
        and (imp.importer, imp.target) not in UPWARD_BY_NAME
    ]
    assert upward == []


def test_the_product_never_imports_the_lab() -> None:
    offending = [
        f"{imp.importer}:{imp.line} imports {imp.target} ({imp.kind})"
        for imp in _all_imports()
        if _product(imp.importer) and _lab(imp.target)
        and not (imp.importer == LAB_GATE and imp.kind == "function")
    ]
    assert offending == [], f"only {LAB_GATE} may import ppc_extproc_lab, inside the function that needs it"


@pytest.mark.parametrize("root", ["ppc_extproc", "ppc_extproc_lab"])
def test_runtime_imports_have_no_cycles(root: str) -> None:
    graph: dict[str, set[str]] = {}
    for imp in _all_imports():
        if imp.kind in ("module", "function") and imp.importer.split(".")[0] == root:
            graph.setdefault(imp.importer, set()).add(imp.target)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_the_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "ppc_extproc"
    pkg.mkdir()
    (pkg / "probe.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from ppc_extproc.tokens import le32\n"
        "if TYPE_CHECKING:\n"
        "    from ppc_extproc.server import app\n"
        "def f():\n"
        "    from ppc_extproc_lab.demo import cli\n"
        "    return 'ppc_extproc.config'\n"
    )
    known = {"ppc_extproc.probe", "ppc_extproc.tokens", "ppc_extproc.tokens.le32", "ppc_extproc.server",
             "ppc_extproc.server.app", "ppc_extproc_lab.demo", "ppc_extproc_lab.demo.cli", "ppc_extproc.config"}
    seen = {(i.target, i.kind) for i in _imports(pkg / "probe.py", "ppc_extproc.probe", known)}
    assert seen == {("ppc_extproc.tokens.le32", "module"), ("ppc_extproc.server.app", "types"),
                    ("ppc_extproc_lab.demo.cli", "function"), ("ppc_extproc.config", "name")}
    real = {(i.importer, i.target) for i in _all_imports()}
    assert ("ppc_extproc.blockkeys.hashing", "ppc_extproc.tokens.le32") in real


def test_readme_maps_the_layers_in_order() -> None:
    text = README.read_text()
    section = text.split("\n## How it works\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    product = block.split("src/ppc_extproc/", 1)[1].split("src/ppc_extproc_lab/", 1)[0]
    listed = re.findall(r"^  ([a-z_]+)(?:/|\.py)", product, flags=re.M)
    assert listed == [name for name in LAYERS if not name.startswith("__")]
    lab = block.split("src/ppc_extproc_lab/", 1)[1]
    listed_lab = set(re.findall(r"^  ([a-z_]+)(?:/|\.py)", lab, flags=re.M))
    assert listed_lab == {p.stem for p in LAB.iterdir() if (p.is_dir() and not p.name.startswith("_"))
                          or (p.suffix == ".py" and p.stem != "__init__")}
