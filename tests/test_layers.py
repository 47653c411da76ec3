"""The import direction core <- gpu <- runtime <- forge, read from the source (scripts/import_graph.py): every
import of every module, at the top level, under TYPE_CHECKING and inside functions. Core is standard library only;
the runtime reaches core, the driver layer and itself (+ torch, cuda-bindings, cryptography), never catalog, build,
qualify, report, manifest or the CLI, and `import mamba_forge.runtime` loads none of typer, rich or pydantic.
Each rule has planted violations proving the checker reports them."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = import_graph  # dataclasses resolve their module by name
_spec.loader.exec_module(import_graph)

MODULES = import_graph.module_files(ROOT)
FORGE_PACKAGES = ("catalog", "build", "qualify", "report", "cli", "manifest", "schemas", "references")


def _planted(module: str, line: str) -> list[str]:
    """The violations of one real module's source with `line` appended (an in-memory copy; the tree is untouched)."""
    path, is_init = MODULES[module]
    source = path.read_text(encoding="utf-8") + "\n" + line + "\n"
    return import_graph.violations(import_graph.edges_of(module, source, is_init, MODULES))


def test_every_import_points_down():
    edges = import_graph.graph(ROOT)
    assert import_graph.violations(edges) == []
    assert import_graph.package_cycles(edges) == []


def test_the_checker_reads_every_module_and_every_kind_of_import():
    # not vacuous: every file is scanned, and top-level, lazy and TYPE_CHECKING imports all appear as edges
    assert len(MODULES) == len(list((ROOT / "mamba_forge").rglob("*.py")))
    edges = {(e.source, e.target, e.in_function) for e in import_graph.graph(ROOT) if e.internal}
    assert ("mamba_forge.runtime.verify", "mamba_forge.core.codec", False) in edges  # top level
    assert ("mamba_forge.runtime.memo", "mamba_forge.core.cache", True) in edges  # inside a function
    assert ("mamba_forge.runtime.contract", "mamba_forge.core.schema", False) in edges  # under TYPE_CHECKING
    assert {import_graph.layer_of(m) for m in MODULES} == {"core", "gpu", "runtime", "forge"}


@pytest.mark.parametrize(("module", "line", "reported"), [
    ("mamba_forge.runtime.memo", "from mamba_forge.build import cache_admin", "mamba_forge.build.cache_admin (forge)"),
    ("mamba_forge.runtime.memo", "def f():\n    from mamba_forge.build import builder", "mamba_forge.build.builder"),
    ("mamba_forge.runtime.loader", "if TYPE_CHECKING:\n    from mamba_forge.qualify.keys import x",
     "mamba_forge.qualify.keys"),
    ("mamba_forge.runtime.gemm", "import mamba_forge.catalog.routes", "mamba_forge.catalog.routes"),
    ("mamba_forge.runtime.routes", "from ..catalog import model", "mamba_forge.catalog.model"),
    ("mamba_forge.runtime", "from .. import cli", "mamba_forge.cli"),  # a package __init__'s relative import
    ("mamba_forge.runtime.trust", "from mamba_forge import manifest", "mamba_forge.manifest"),
    ("mamba_forge.runtime.verify", "from mamba_forge.manifest.bundle import x", "mamba_forge.manifest.bundle"),
    ("mamba_forge.runtime.sources", "def f():\n    import pydantic", "third-party pydantic"),
    ("mamba_forge.runtime.tensors", "import typer", "third-party typer"),
    ("mamba_forge.runtime.families", "from rich.console import Console", "third-party rich"),
    ("mamba_forge.runtime.args", "import numpy", "third-party numpy"),
    ("mamba_forge.core.schema", "from mamba_forge.runtime import errors", "core imports mamba_forge.runtime.errors"),
    ("mamba_forge.core.cache", "def f():\n    from mamba_forge.gpu import driver", "mamba_forge.gpu.driver (gpu)"),
    ("mamba_forge.core.codec", "import tomli_w", "core imports third-party tomli_w"),
    ("mamba_forge.core.expr", "def f():\n    import cryptography", "core imports third-party cryptography"),
    ("mamba_forge.core.safety", "from ..catalog import entries", "mamba_forge.catalog.entries"),
    ("mamba_forge", "from mamba_forge import cli", "core imports mamba_forge.cli"),  # the root is core
    ("mamba_forge.gpu.driver", "from mamba_forge.runtime import errors", "gpu imports mamba_forge.runtime.errors"),
    ("mamba_forge.gpu.tma", "import torch", "gpu imports third-party torch"),
])
def test_a_planted_upward_import_is_reported(module, line, reported):
    found = _planted(module, line)
    assert len(found) == 1 and reported in found[0], found
    assert found[0].startswith(f"{module}:")


@pytest.mark.parametrize(("module", "line"), [
    ("mamba_forge.runtime.memo", "from mamba_forge.core import cache"),
    ("mamba_forge.runtime.loader", "def f():\n    from mamba_forge.gpu import tma"),
    ("mamba_forge.runtime.torch_ops", "import torch"),
    ("mamba_forge.runtime.trust", "from cryptography.exceptions import InvalidSignature"),
    ("mamba_forge.gpu.core", "from cuda.bindings import driver"),
    ("mamba_forge.gpu.driver", "from mamba_forge.core.errors import ForgeError"),
    ("mamba_forge.core.schema", "import tomllib, json\nfrom mamba_forge.core import errors\nfrom . import safety"),
    ("mamba_forge.catalog.model", "import pydantic\nfrom mamba_forge.runtime import loader"),
    ("mamba_forge.manifest.bundle", "from mamba_forge.runtime.verify import open_verified"),
    ("mamba_forge.cli.common", "import typer, rich\nfrom mamba_forge.qualify import runner"),
])
def test_an_import_pointing_down_passes(module, line):
    assert _planted(module, line) == []


def test_a_planted_import_in_a_copied_tree_fails_the_whole_graph(tmp_path):
    # the file walk, not only the parser: a copy of the package with one runtime module importing the build
    shutil.copytree(ROOT / "mamba_forge", tmp_path / "mamba_forge", ignore=shutil.ignore_patterns("__pycache__",
                    "_kernels", "_keys", "*.json"))
    memo = tmp_path / "mamba_forge" / "runtime" / "memo.py"
    memo.write_text(memo.read_text(encoding="utf-8") + "\nfrom mamba_forge.build import cache_admin  # planted\n")
    edges = import_graph.graph(tmp_path)
    found = import_graph.violations(edges)
    assert len(found) == 1 and found[0].startswith("mamba_forge.runtime.memo:"), found
    # build -> manifest (toml_io) -> runtime (bundle reads through verify) -> build: one loop, three pairs
    assert import_graph.package_cycles(edges) == [
        ("mamba_forge.build", "mamba_forge.manifest"), ("mamba_forge.build", "mamba_forge.runtime"),
        ("mamba_forge.manifest", "mamba_forge.runtime")]


def test_a_cycle_between_packages_is_reported():
    Edge = import_graph.Edge
    edges = [Edge("mamba_forge.manifest.bundle", "mamba_forge.runtime.verify", False, 1, True),
             Edge("mamba_forge.runtime.memo", "mamba_forge.build.cache", True, 2, True),
             Edge("mamba_forge.build.admit", "mamba_forge.manifest.schema", False, 3, True),
             Edge("mamba_forge.report.tables", "mamba_forge.core.schema", False, 4, True)]
    assert import_graph.package_cycles(edges) == [
        ("mamba_forge.build", "mamba_forge.manifest"), ("mamba_forge.build", "mamba_forge.runtime"),
        ("mamba_forge.manifest", "mamba_forge.runtime")]
    assert import_graph.package_cycles(edges[:1] + edges[2:]) == []


def test_the_runtime_loads_without_the_forge():
    """In a fresh interpreter: the runtime and what a load uses come without typer, rich, pydantic (or click,
    tomli_w) and without any forge module."""
    code = (
        "import sys, json\n"
        "import mamba_forge.runtime as r\n"
        "from mamba_forge.runtime import load, launch, Kernels, open_verified, trusted_keys\n"
        "from mamba_forge.runtime import contract, expressions, gemm, routes, args, streams, memo, sources\n"
        "assert expressions.literal('ceil_div(7, 2)', 'probe') == 4\n"  # the lazily imported expression language
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout)
    assert "mamba_forge.runtime.contract" in loaded and "mamba_forge.core.expr" in loaded  # the import ran
    heavy = sorted({m.split(".")[0] for m in loaded} & {"typer", "rich", "pydantic", "click", "tomli_w"})
    assert heavy == []
    forge = sorted(m for m in loaded if m.split(".")[:2] in [["mamba_forge", p] for p in FORGE_PACKAGES])
    assert forge == []


# the shared vocabularies live in core/vocab.py only: their names, or a literal spelling of the layout or dtype set
VOCABULARY = frozenset({"DTYPES", "DTYPE_SIZES", "FLOAT_DTYPES", "LAYOUTS", "LAYOUT_ENUMS", "GEMM_KEY_DTYPES",
                        "STORAGE", "GEMM_STORAGE", "ComputeCapability", "DeviceInfo"})
_LITERAL_SETS = ({"nn", "tn", "nt"}, {"f32", "f64", "bf16", "f16"}, {"f32", "tf32", "bf16", "f16"})


def vocabulary_redefined(module: str, source: str) -> list[str]:
    found = []
    for node in ast.parse(source).body:
        names, value = [], None
        if isinstance(node, ast.ClassDef):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names, value = [t.id for t in targets if isinstance(t, ast.Name)], node.value
        for name in names:
            if name in VOCABULARY:
                found.append(f"{module}:{node.lineno}: defines {name}")
        if isinstance(value, ast.Dict) and not all(isinstance(v, ast.Constant) for v in value.values):
            value = None  # a table of per-dtype data (tolerances) is not a size or name table
        if isinstance(value, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            items = value.keys if isinstance(value, ast.Dict) else value.elts
            words = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if len(words) == len(items) and words in _LITERAL_SETS:
                found.append(f"{module}:{node.lineno}: spells out {sorted(words)}")
    return found


def test_each_vocabulary_is_defined_once_in_core():
    found = [line for name, (path, _) in MODULES.items() if name != "mamba_forge.core.vocab"
             for line in vocabulary_redefined(name, path.read_text(encoding="utf-8"))]
    assert found == []
    path, _ = MODULES["mamba_forge.core.vocab"]
    assert {line.split("defines ")[1] for line in vocabulary_redefined("v", path.read_text()) if "defines" in line} \
        == VOCABULARY


@pytest.mark.parametrize(("source", "reported"), [
    ('LAYOUTS = ("nn", "tn", "nt")', "defines LAYOUTS"),
    ('GEMM_LAYOUTS = ("nn", "nt", "tn")', "spells out ['nn', 'nt', 'tn']"),
    ('KEYS: tuple[str, ...] = ("f32", "tf32", "bf16", "f16")', "spells out"),
    ('FLOATS = {"f32", "f64", "bf16", "f16"}', "spells out"),
    ('SIZES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2}', "spells out"),
    ("class DeviceInfo:\n    ordinal: int", "defines DeviceInfo"),
    ("DTYPES: dict[str, int] = {}", "defines DTYPES"),
])
def test_a_second_vocabulary_is_reported(source, reported):
    found = vocabulary_redefined("mamba_forge.runtime.gemm", MODULES["mamba_forge.runtime.gemm"][0].read_text()
                                 + "\n" + source + "\n")
    assert found and all(f.startswith("mamba_forge.runtime.gemm:") for f in found), found
    assert any(reported in f for f in found), found


def test_other_word_lists_are_not_vocabulary():
    source = ('SOFTPLUS = ("f32", "bf16", "f16")\nMODES = ("nn", "tn")\nX = ("nn", "tn", "nt", "tt")\n'
              'TOLERANCES = {"f64": (1e-12, 1e-12), "f32": (1e-5, 1e-6), "bf16": (1e-2, 1e-2), "f16": (1e-2, 1e-3)}\n')
    assert vocabulary_redefined("m", source) == []
