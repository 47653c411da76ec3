"""The package's internal import graph and the layer rule it must keep: core <- gpu <- runtime <- forge.

Every `import` and `from ... import` of every module under mamba_forge/ is read with `ast` (at the top level,
under `if TYPE_CHECKING:` and inside functions alike: a lazy import is still a dependency), resolved to the module
it names, and checked against the layer of the importer:

    core     mamba_forge.core.*, mamba_forge/__init__.py     standard library only
    gpu      mamba_forge.gpu.*                               core, itself; cuda-bindings
    runtime  mamba_forge.runtime.*                           core, gpu, itself; torch, cuda-bindings, cryptography;
                                                             huggingface_hub, safetensors (optional: from_pretrained)
    forge    everything else (catalog, build, qualify, ...)  anything

    python scripts/import_graph.py [--edges]     prints the counts, the package graph and every violation
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

LAYERS = ("core", "gpu", "runtime", "forge")
# third-party top-level packages each layer may import (besides the standard library and lower layers)
THIRD_PARTY: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "gpu": frozenset({"cuda"}),
    # huggingface_hub and safetensors: imported only by MambaLMHeadModel.from_pretrained for a Hub name or a
    # model.safetensors, where installed (runtime/torch_model.py); nothing else needs them
    "runtime": frozenset({"cuda", "torch", "cryptography", "huggingface_hub", "safetensors"}),
    "forge": frozenset({"*"}),
}
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module (a mamba_forge module) or a top-level third-party name
    in_function: bool
    line: int
    internal: bool


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts == ["mamba_forge"] or parts[1:2] == ["core"]:
        return "core"
    if parts[1:2] in (["gpu"], ["runtime"]):
        return parts[1]
    return "forge"


def module_files(root: Path, package: str = "mamba_forge") -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__) for every .py under root/package."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def _resolve(name: str, modules: dict) -> str:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def edges_of(module: str, source: str, is_init: bool, modules: dict) -> list[Edge]:
    """Every import in one module's source, resolved; relative imports made absolute."""
    tree = ast.parse(source)
    found: list[Edge] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.split(".") if is_init else module.split(".")[:-1]
                    base = ".".join(package[: len(package) - child.level + 1] + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in child.names]
            for name in names:
                top = name.partition(".")[0]
                if top == "mamba_forge":
                    target = _resolve(name, modules)
                    if target != module:
                        found.append(Edge(module, target, in_function, child.lineno, True))
                else:
                    found.append(Edge(module, top, in_function, child.lineno, False))
            visit(child, inner)

    visit(tree, False)
    return found


def graph(root: Path) -> list[Edge]:
    modules = module_files(root)
    edges: set[Edge] = set()
    for name, (path, is_init) in modules.items():
        edges.update(edges_of(name, path.read_text(encoding="utf-8"), is_init, modules))
    return sorted(edges, key=lambda e: (e.source, e.target, e.line))


def violations(edges: list[Edge]) -> list[str]:
    """One line per import that points up a layer or at a third-party package its layer may not use."""
    found = []
    for e in edges:
        src = layer_of(e.source)
        if e.internal:
            if LAYERS.index(layer_of(e.target)) > LAYERS.index(src):
                found.append(f"{e.source}:{e.line}: {src} imports {e.target} ({layer_of(e.target)})")
        elif e.target not in STDLIB and "*" not in THIRD_PARTY[src] and e.target not in THIRD_PARTY[src]:
            found.append(f"{e.source}:{e.line}: {src} imports third-party {e.target}")
    return found


def package_cycles(edges: list[Edge]) -> list[tuple[str, str]]:
    """Pairs of top-level subpackages (or root modules) that import each other, directly or not."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    succ: dict[str, set[str]] = {}
    for e in edges:
        if e.internal and unit(e.source) != unit(e.target) and unit(e.target) != "mamba_forge":
            succ.setdefault(unit(e.source), set()).add(unit(e.target))

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in succ.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return sorted({tuple(sorted((a, b))) for a in succ for b in reach(a) if b != a and a in reach(b)})


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    edges = graph(root)
    internal = [e for e in edges if e.internal]
    pairs = {(e.source, e.target) for e in internal}
    lazy = {(e.source, e.target) for e in internal if e.in_function} - {
        (e.source, e.target) for e in internal if not e.in_function}
    if "--edges" in argv:
        for e in internal:
            print(f"{e.source} -> {e.target}{' (in function)' if e.in_function else ''}")
    print(f"internal import statements: {len(internal)} ({sum(e.in_function for e in internal)} inside functions)")
    print(f"module edges: {len(pairs)} ({len(lazy)} only inside functions)")
    cycles = package_cycles(edges)
    print(f"package cycles: {len(cycles)}")
    for a, b in cycles:
        print(f"  {a} <-> {b}")
    bad = violations(edges)
    print(f"layer violations: {len(bad)}")
    for line in bad:
        print(f"  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
