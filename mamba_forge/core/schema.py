"""One typed schema for every manifest: the build manifest, the qualified manifest (with each symbol's launch
contract), the release index and the runtime table the loader reads. Standard library only (the runtime loader
imports it): plain dataclasses whose field order is the on-disk order. Plain dicts <-> records: codec.py. The build
manifest's records are defined in schema_build.py and the `record` decorator in record.py; both are re-exported here.

Field types are the codec's whole validation language: int, float, str, bool, list[X], dict[str, X], X | None,
Literal[...] and nested records; every record is keyword-constructed (kw_only). A record may add a
``_check(self) -> str | None`` rule, run after its fields convert (it names the problem; the codec, the path).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from pathlib import PurePosixPath
from typing import Literal

from mamba_forge.core.errors import printable
from mamba_forge.core.record import _finish, record
from mamba_forge.core.schema_build import (  # noqa: F401  (re-exported: the build manifest's records)
    BUILD_SCHEMA,
    Artifact,
    BuildManifest,
    ModuleBuild,
    Resources,
    SymbolBuild,
    Toolchain,
    Verdict,
)

QUALIFIED_SCHEMA = 1  # qualified manifest and index schema_version
MANIFEST_VERSION = 2  # qualified body layout: 2 = per-symbol launch contract, params as tables
INDEX_VERSION = 1
RUNTIME_KEYS = ("runtime_table_sha256", "runtime_table_size")  # the body's top-level keys binding the table
RESERVED_PATHS = ("manifest.toml", "runtime.json")  # a bundle's own files: never an artifact path

ParamType = Literal["ptr", "i32", "u32", "i64", "u64", "f32", "f64", "bytes"]
_KIND_OF = {"ptr": "pointer", "bytes": "blob"}  # every other type is a scalar


class SchemaError(ValueError):
    """A plain document does not fit its record: one line, ``<where>: <path>: <problem>``."""

    def __init__(self, where: str, path: str, problem: str):
        self.where, self.path, self.problem = where, path, problem
        shown = printable(where, limit=400)  # a file name may hold control characters
        super().__init__(f"{shown}: {path}: {problem}" if path else f"{shown}: {problem}")

    def __reduce__(self):
        return SchemaError, (self.where, self.path, self.problem)


MAX_DRIVER_VERSION = 1_000_000  # cuDriverGetVersion: 13000 = CUDA 13.0; a million would be CUDA 1000


def _driver_problem(version: int) -> str | None:
    if not 0 <= version <= MAX_DRIVER_VERSION:
        return f"driver_version {version} is not a CUDA driver version (0..{MAX_DRIVER_VERSION}, 13000 = CUDA 13.0)"
    return None


def _bad_relpath(path: str) -> str | None:
    p = PurePosixPath(path)
    if (not path or "\\" in path or p.is_absolute() or ".." in p.parts or str(p) != path
            or path in RESERVED_PATHS):
        return f"unsafe path {path!r} (must be relative, normalised, no '..')"
    return None




# ---- qualified manifest (manifests/<name>.toml, signed) -------------------------------------------------------


@record
class QToolchain:
    nvrtc_version: str
    library: dict[str, str] = field(default_factory=dict)
    header_sha256: dict[str, str] = field(default_factory=dict)
    base_options: list[str] = field(default_factory=list)
    source_sha256: dict[str, str] = field(default_factory=dict)  # "Module/target" -> composed program digest


@record
class QDevice:
    name: str
    cc: str
    sm_count: int
    driver_version: int
    count: int = 1  # GPUs of this model compared (--device all)

    def _check(self) -> str | None:
        return _driver_problem(self.driver_version)


@record
class QArtifact:
    module: str
    target: str
    role: Literal["qualify", "check"]
    path: str  # relative to the build folder (a bundle's root)
    code: Literal["cubin", "ptx"]
    size: int
    sha256: str

    def _check(self) -> str | None:
        return _bad_relpath(self.path)


@record
class QResources:
    registers: int
    static_smem: int
    local_bytes: int
    max_threads: int
    blocks_per_sm: int


@record
class QCheck:
    name: str  # correctness/repeat/batch/stream/neighbour/address/graph/sanitize/...
    passed: bool
    digest: str = ""
    detail: str = ""


@record
class Param:
    """One kernel parameter of the launch contract: the catalog's declaration, resolved, plus its ABI slot.
    Expressions (shape, value) are over the symbol's dims and constants; a float literal value is its repr."""

    name: str
    kind: Literal["pointer", "scalar", "blob"]  # follows from type: ptr -> pointer, bytes -> blob
    type: ParamType
    dtype: str = ""  # pointers: the resolved element dtype token ("bf16"); "" otherwise
    role: Literal["in", "out", "inout", "scratch", ""] = ""  # pointers and blobs; "" for scalars
    # an output's input it may be exactly (in place; the catalog's in_place_of); None (left out): no exact alias, as
    # for every parameter of a manifest written before it
    in_place_of: str | None = None
    shape: list[str] = field(default_factory=list)  # pointers: element-count expressions
    value: str = ""  # scalars: the catalog's value expression (or float literal); "" when the caller gives it
    offset: int  # the ABI census: offset and size in the parameter area
    size: int

    def _check(self) -> str | None:
        kind = _KIND_OF.get(self.type, "scalar")
        if self.kind != kind:
            return f"parameter {self.name!r} of type {self.type} is a {kind}, not a {self.kind}"
        if kind == "pointer" and not (self.dtype and self.role and self.shape):
            return f"pointer parameter {self.name!r} needs a dtype, a role and a shape"
        if kind == "scalar" and (self.dtype or self.role or self.shape):
            return f"scalar parameter {self.name!r} takes neither dtype, role nor shape"
        if kind == "blob" and (self.dtype or self.shape or self.size < 1):
            return f"blob parameter {self.name!r} takes a size and neither dtype nor shape"
        if self.offset < 0 or self.size < 0:
            return f"parameter {self.name!r} has a negative offset or size"
        if self.in_place_of is not None and (kind != "pointer" or self.role != "out"):
            return f"parameter {self.name!r}: only an output (pointer, role out) may be in_place_of an input"
        return None


class _SymbolMethods:
    """Shared by QSymbol and its projection RuntimeSymbol."""

    def params_layout(self) -> list[list[int]]:
        """The ABI census as manifest_version 1 wrote it: [offset, size] per parameter."""
        return [[p.offset, p.size] for p in self.params]  # type: ignore[attr-defined]

    def _check(self) -> str | None:
        if pairs := [p for p in self.params if p.in_place_of is not None]:  # type: ignore[attr-defined]
            ins = {p.name: p for p in self.params if p.role == "in"}  # type: ignore[attr-defined]
            for p in pairs:
                q = ins.pop(p.in_place_of, None)  # once: no two outputs in place of one input
                if q is None or q.kind != "pointer" or (q.dtype, q.shape) != (p.dtype, p.shape):
                    return (f"symbol {self.name}: {p.name}.in_place_of {p.in_place_of!r} names no input (pointer, "  # type: ignore[attr-defined]
                            "role in) of its dtype and shape that no other output names")
        pdl = self.pdl_max_blocks  # type: ignore[attr-defined]
        if not 0 <= pdl <= 2**31 - 1:
            return f"symbol {self.name}: pdl_max_blocks {pdl} is not 0 (never) to 2^31-1 blocks"  # type: ignore[attr-defined]
        hook = self.tensor_maps  # type: ignore[attr-defined]
        if hook and not TENSOR_MAP_HOOK.fullmatch(hook):
            return (f"symbol {self.name}: tensor_maps {hook!r} is not a tensor-map hook name "  # type: ignore[attr-defined]
                    "(prepare_<lowercase words>, a function of mamba_forge.gpu.tma)")
        return None


# A symbol's tensor-map hook: a function name in mamba_forge.gpu.tma (the runtime also checks that module has it)
TENSOR_MAP_HOOK = re.compile(r"prepare_[a-z0-9_]{1,64}")


@record
class QSymbol(_SymbolMethods):
    name: str
    module: str
    target: str
    family: str
    dtype: str = ""
    status: Literal["admitted", "rejected", "checked", "built-only"]
    reason: str = ""
    check: str = ""
    fallback: list[str] = field(default_factory=list)
    block: list[int] = field(default_factory=lambda: [1, 1, 1])
    grid: list[str] = field(default_factory=list)  # 1 to 3 expressions over dims and constants
    dynamic_smem: int = 0
    dynamic_smem_expr: str = ""  # the catalog's expression (over instance parameters), for the record
    dims: list[str] = field(default_factory=list)  # the dims the caller supplies to the contract's expressions
    constants: dict[str, int] = field(default_factory=dict)  # fixed names the expressions use (BM, sizeof_T)
    state_capacity: int = 0  # compiled state capacity where the module takes one; 0 when not
    # the family's dims rules (catalog `requires`): dim % m == 0, dim <= hi; empty in manifests written before them
    dims_multiple_of: dict[str, int] = field(default_factory=dict)
    dims_at_most: dict[str, int] = field(default_factory=dict)
    params: list[Param] = field(default_factory=list)
    # the mamba_forge.gpu.tma hook that builds its by-value tensor maps (the family's qualify.prepare), "" for none:
    # the one place an engine learns it, so it cannot disagree with what was qualified
    tensor_maps: str = ""
    # programmatic dependent launch (the family's catalog launch.pdl_max_blocks): the runtime launches a grid of at
    # most this many blocks with the programmatic-serialization attribute on sm_90+; 0 (and manifests written
    # before it): never
    pdl_max_blocks: int = 0
    deterministic: bool = True
    seed: int | None = None  # the random seed of the inputs
    resources: QResources | None = None
    checks: list[QCheck] = field(default_factory=list)


@record
class QRung:
    """One admitted rung of a GEMM route (kernels/routes.toml, mamba_forge/catalog/routes.py): what the runtime's
    selector needs to choose it without the catalog."""

    symbol: str
    eq_class: str = ""  # its equivalence class; "" for a force rung
    mode: Literal["auto", "force"] = "auto"
    m_min: int = 1
    m_max: int = 0  # 0: unbounded
    needs: dict[str, int] = field(default_factory=dict)  # dim (m, n, k) -> the multiple it needs
    bias: bool = False  # takes a bias pointer
    n_min: int = 1  # the class's region: the N and K it serves (max 0: unbounded); never M
    n_max: int = 0
    k_min: int = 1
    k_max: int = 0


@record
class QTune:
    """One rule of a route's tuning table (kernels/route_tuning.toml, mamba_forge/catalog/route_tuning.py): within
    class `eq_class`, at an (N, K, M) inside these ranges (max 0: unbounded), the selector takes `symbol` first."""

    eq_class: str
    symbol: str
    n_min: int = 1
    n_max: int = 0
    k_min: int = 1
    k_max: int = 0
    m_min: int = 1
    m_max: int = 0

    def _check(self) -> str | None:
        for dim in ("n", "k", "m"):
            lo, hi = getattr(self, f"{dim}_min"), getattr(self, f"{dim}_max")
            if lo < 1 or hi < 0 or (hi and hi < lo):
                return f"tuning rule for {self.symbol}: {dim} = [{lo}, {hi}] is not a range"
        return None


@record
class QRoute:
    layout: str
    a: str
    b: str
    c: str
    symbols: list[str]  # the admitted rungs' symbols, in order (auto rungs class by class, then force rungs)
    rungs: list[QRung] = field(default_factory=list)
    # the key's tuning rules whose rungs this manifest holds; None (left out of the manifest, so a manifest signed
    # before tuning existed projects to the same runtime table) when there are none
    tuning: list[QTune] | None = None


class _ManifestMethods:
    """Shared by QualifiedManifest and its projection RuntimeTable."""

    def symbol(self, name: str, target: str | None = None) -> QSymbol:
        for s in self.symbols:
            if s.name == name and (target is None or s.target == target):
                return s
        raise KeyError(name)

    def _check(self) -> str | None:
        seen: set[str] = set()
        for a in self.artifacts:
            if a.path in seen:
                return f"artifact {a.path} is named twice"
            seen.add(a.path)
        return None


@record
class QualifiedManifest(_ManifestMethods):
    schema_version: Literal[1] = QUALIFIED_SCHEMA
    kind: Literal["qualified"] = "qualified"
    manifest_version: Literal[2] = MANIFEST_VERSION
    created: str
    expires: str
    tool_version: str
    level: Literal["quick", "full"]
    qualification_seconds: float
    development_key: bool = False
    sanitizer: Literal["ran", "not-found", "off"] = "off"  # whether the compute-sanitizer passes ran
    catalog: str = ""
    catalog_sha256: str = ""
    state_capacity: int = 64
    runtime_table_sha256: str | None = None  # bind the runtime table to the signed body
    runtime_table_size: int | None = None
    toolchain: QToolchain
    device: QDevice
    artifacts: list[QArtifact] = field(default_factory=list)
    symbols: list[QSymbol] = field(default_factory=list)
    routes: list[QRoute] = field(default_factory=list)


# ---- release index (kind = "index") ---------------------------------------------------------------------------


@record
class IndexEntry:
    path: str  # relative to the index's folder
    sha256: str
    size: int
    device_name: str
    cc: str
    sm_count: int
    driver_version: int = 0
    level: Literal["quick", "full", ""] = ""
    key_id: str = ""

    def _check(self) -> str | None:
        return _bad_relpath(self.path) or _driver_problem(self.driver_version)


@record
class ReleaseIndex:
    schema_version: Literal[1] = QUALIFIED_SCHEMA
    kind: Literal["index"] = "index"
    manifest_version: Literal[1] = INDEX_VERSION
    created: str
    expires: str
    tool_version: str
    development_key: bool = False
    entries: list[IndexEntry]


# ---- the runtime table: the qualified body without toolchain, table binding and per-symbol checks ------------


def _project(cls: type, name: str, drop: tuple[str, ...], retype: dict | None = None, bases: tuple = ()) -> type:
    """A record class with `cls`'s fields, defaults and order, less `drop`, some fields retyped."""
    # the annotations stay text (this module's `from __future__ import annotations`): the codec resolves them
    fields = [(f.name, (retype or {}).get(f.name, f.type),
               field(default=f.default, default_factory=f.default_factory))
              for f in dataclasses.fields(cls) if f.name not in drop]
    out = dataclasses.make_dataclass(name, fields, bases=bases, kw_only=True, init=False, repr=False, eq=False,
                                     namespace={"__doc__": f"{name}: the runtime table's projection of {cls.__name__}."})
    out.__module__ = __name__
    return _finish(out)


RuntimeSymbol = _project(QSymbol, "RuntimeSymbol", ("checks",), bases=(_SymbolMethods,))
RuntimeTable = _project(QualifiedManifest, "RuntimeTable", ("toolchain", *RUNTIME_KEYS),
                        {"symbols": "list[RuntimeSymbol]"}, bases=(_ManifestMethods,))
_SYMBOL_KEYS = tuple(f.name for f in dataclasses.fields(RuntimeSymbol))
_TABLE_KEYS = tuple(f.name for f in dataclasses.fields(RuntimeTable) if f.name != "symbols")


def runtime_table(m: QualifiedManifest) -> RuntimeTable:  # type: ignore[valid-type]
    """The projection of a qualified manifest that the loader reads (records shared, not copied)."""
    syms = [RuntimeSymbol(**{k: getattr(s, k) for k in _SYMBOL_KEYS}) for s in m.symbols]
    return RuntimeTable(**{k: getattr(m, k) for k in _TABLE_KEYS}, symbols=syms)


def param_kind(type_: str) -> str:
    """'pointer', 'scalar' or 'blob' for a catalog parameter type."""
    return _KIND_OF.get(type_, "scalar")


__all__ = [
    "BUILD_SCHEMA", "INDEX_VERSION", "MANIFEST_VERSION", "QUALIFIED_SCHEMA", "RUNTIME_KEYS",
    "Artifact", "BuildManifest", "IndexEntry", "ModuleBuild", "Param", "QArtifact", "QCheck", "QDevice",
    "QResources", "QRoute", "QRung", "QSymbol", "QToolchain", "QTune", "QualifiedManifest", "ReleaseIndex",
    "Resources", "RuntimeSymbol", "RuntimeTable", "SchemaError", "SymbolBuild", "Toolchain", "Verdict", "param_kind",
    "runtime_table",
]
