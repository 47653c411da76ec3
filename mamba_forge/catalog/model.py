"""The kernel catalog: the single, declarative source of truth, validated by pydantic.

A catalog is a root TOML file (``kernels/catalog.toml``) that declares module kinds; each module kind is one
NVRTC program composed from its sources, and lists family files (``[[family]]`` tables) that declare its
symbols. A family is one templated implementation; the catalog expands it into symbols:

* dtype variants: ``variants = ["f32", "bf16", "f16"]`` gives ``<name>_f32``, ``<name>_bf16``, ...;
  ``bare = "f32"`` also exports ``<name>`` itself with that dtype;
* tile instantiations: ``instances = [{BM = 128, BN = 64}, ...]`` with ``symbol = "..._m{BM}n{BN}"``;
  variants x instances is the cartesian product.

Each symbol is emitted by the family's instantiation macro, ``MACRO(symbol, args...)``, appended to the
composed source, so the export set follows from the catalog and nothing is copied by hand.
Sizes (block, grid, dynamic shared memory, shapes) are integer expressions (see :mod:`mamba_forge.catalog.expr`).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import string
import tomllib
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mamba_forge.catalog import expr
from mamba_forge.catalog.targets import TARGETS, Target, gate_admits, validate_gate
from mamba_forge.errors import CatalogError, ForgeError
from mamba_forge.safety import MAX_CATALOG_BYTES, PathRefused, parse_toml, read_bounded

SCHEMA_VERSION = 1

# dtype tokens -> (C type, size in bytes, numpy name)
DTYPES: dict[str, tuple[str, int, str]] = {
    "f32": ("float", 4, "float32"),
    "f64": ("double", 8, "float64"),
    "bf16": ("__nv_bfloat16", 2, "bfloat16"),
    "f16": ("__half", 2, "float16"),
    "i8": ("int8_t", 1, "int8"),
    "u8": ("uint8_t", 1, "uint8"),
    "i32": ("int", 4, "int32"),
    "u32": ("unsigned int", 4, "uint32"),
    "i64": ("long long", 8, "int64"),
    "u64": ("unsigned long long", 8, "uint64"),
}
# scalar parameter types -> (size, alignment)
SCALAR_TYPES: dict[str, tuple[int, int]] = {
    "i32": (4, 4), "u32": (4, 4), "i64": (8, 8), "u64": (8, 8), "f32": (4, 4), "f64": (8, 8), "ptr": (8, 8),
}
SYMBOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FILL_SPEC = re.compile(
    r"^(uniform|logu|normal|const|randint|iota|special|positive)(\(\s*[-+0-9.eEinfa, ]*\))?$"
)
STATE_CAP_MIN, STATE_CAP_MAX, STATE_CAP_DEFAULT = 16, 256, 64


def state_capacity(d_state: int) -> int:
    """The compiled state capacity for a d_state: rounded up to a multiple of 16, in 16..256."""
    if isinstance(d_state, bool) or not isinstance(d_state, int):
        raise ForgeError(f"d_state must be an integer, got {d_state!r}")
    if d_state <= 0:
        raise ForgeError(f"d_state must be at least 1, got {d_state}", hint="pass --state-cap 16..256")
    if d_state > STATE_CAP_MAX:
        raise ForgeError(
            f"d_state {d_state} is above the largest supported state capacity {STATE_CAP_MAX}",
            hint="pass --state-cap 16..256",
        )
    return -(-d_state // 16) * 16


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Policy(_Model):
    """Resource policy for a symbol: what static and live admission hold it to."""

    max_regs: int = Field(255, ge=1, le=255)  # register cap per thread
    max_stack: int = Field(0, ge=0)  # allowed stack frame bytes
    max_spill: int = Field(0, ge=0)  # allowed spill store + load bytes
    min_blocks_per_sm: int = Field(1, ge=1)  # occupancy at the declared launch shape


class PolicyOverride(_Model):
    max_regs: int | None = Field(None, ge=1, le=255)
    max_stack: int | None = Field(None, ge=0)
    max_spill: int | None = Field(None, ge=0)
    min_blocks_per_sm: int | None = Field(None, ge=1)

    def apply(self, base: Policy) -> Policy:
        return base.model_copy(update=self.model_dump(exclude_none=True))


Expr = int | str


class Param(_Model):
    """One kernel parameter: its ABI (type -> size, alignment) and its launch-spec role."""

    name: str
    type: Literal["ptr", "i32", "u32", "i64", "u64", "f32", "f64", "bytes"]
    dtype: str | None = None  # ptr element type: a dtype token or an instance key naming one ("T")
    role: Literal["in", "out", "inout", "scratch"] = "in"
    shape: list[Expr] = Field(default_factory=list)  # element-count expressions over dims
    fill: str | None = None  # input distribution, e.g. "uniform(-1,1)", "logu(1e-3,1e3)", "const(0)"
    value: Expr | float | None = None  # scalar value: expression over dims, or a float literal
    size: int | None = None  # "bytes" params: by-value blob size (e.g. CUtensorMap: 128)
    align: int | None = None  # "bytes" params: alignment (CUtensorMap: 64)

    @model_validator(mode="after")
    def _check(self) -> Param:
        if self.type == "ptr":
            if self.dtype is None:
                raise ValueError(f"pointer parameter {self.name!r} needs a dtype")
        elif self.type == "bytes":
            if not self.size or not self.align:
                raise ValueError(f"bytes parameter {self.name!r} needs size and align")
        elif self.shape or self.role != "in":
            raise ValueError(f"scalar parameter {self.name!r} takes neither shape nor role")
        if self.fill is not None and not FILL_SPEC.match(self.fill):
            raise ValueError(f"parameter {self.name!r}: unknown fill {self.fill!r}")
        return self

    @property
    def size_align(self) -> tuple[int, int]:
        if self.type == "bytes":
            return self.size or 0, self.align or 1
        return SCALAR_TYPES[self.type]


class Launch(_Model):
    block: Expr | list[Expr] = 256  # threads per block (x or [x, y, z]); expression over instance params
    dynamic_smem: Expr = 0  # bytes of dynamic shared memory; expression over instance params
    grid: list[Expr] = Field(default_factory=lambda: [1])  # expressions over qualification dims

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: list[Expr]) -> list[Expr]:
        if not 1 <= len(v) <= 3:
            raise ValueError("grid takes 1 to 3 expressions")
        return v


class QualifySpec(_Model):
    """How the qualifier launches and checks a family's symbols (see mamba_forge.qualify)."""

    dims: dict[str, int] = Field(default_factory=dict)  # qualification shape
    reference: str | None = None  # "package.module:function" float64 reference
    batch_dim: str | None = None  # a dim along which rows are independent: batch-invariance is checked
    exact: bool = False  # output must equal the reference bit for bit (exact oracles)
    rtol: float | None = None  # tolerance overrides (defaults per dtype)
    atol: float | None = None
    corpora: list[Literal["uniform", "logu", "special"]] = Field(
        default_factory=lambda: ["uniform", "logu", "special"]
    )
    skip: str | None = None  # why this family is not launched by the generic harness (then it must say)
    nonfinite: bool = False  # the "special" corpus may also hold inf/nan (the family's math propagates them)
    timeout_s: float | None = None  # per-launch time limit override for the qualifier (default: the run's)
    # "pkg.mod:function" building by-value "bytes" params (e.g. TMA tensor maps) from the device pointers:
    # prepare(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]
    # It may also return the initial contents of an input pointer param declared without a fill (e.g. a table
    # of device pointers into the aux buffers); the harness writes them before every launch.
    prepare: str | None = None
    # extra device buffers the harness allocates, fills, poisons, checks and digests like pointer params but
    # never passes to the kernel (it reaches them through a prepared pointer table); pointer Params only
    aux: list[Param] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_aux(self) -> QualifySpec:
        seen = set()
        for a in self.aux:
            if a.type != "ptr":
                raise ValueError(f"aux buffer {a.name!r} must have type ptr, not {a.type}")
            if a.name in seen:
                raise ValueError(f"aux buffer {a.name!r} is declared twice")
            seen.add(a.name)
        return self


class Family(_Model):
    """One templated implementation and the symbols the catalog instantiates from it."""

    name: str
    instantiate: str | None = None  # macro in the sources; None: the sources define the symbols literally
    variants: list[str] = Field(default_factory=list)  # dtype tokens
    bare: str | None = None  # also export <name> with this dtype
    instances: list[dict[str, int | str]] = Field(default_factory=list)
    symbol: str | None = None  # name template, e.g. "{name}_m{BM}n{BN}_{dtype}"
    args: list[str] | None = None  # macro arguments after the symbol; default ["T"] with variants
    deterministic: bool | None = None  # default: the module's
    fallback: list[str] = Field(default_factory=list)  # symbol templates to fall back to, in order
    contract: str | None = None  # one line: what it computes, layouts, what it writes
    launch: Launch = Field(default_factory=Launch)
    policy: PolicyOverride = Field(default_factory=PolicyOverride)
    params: list[Param] = Field(default_factory=list)
    qualify: QualifySpec = Field(default_factory=QualifySpec)

    @model_validator(mode="after")
    def _check(self) -> Family:
        if not SYMBOL_NAME.match(self.name):
            raise ValueError(f"family name {self.name!r} is not a C identifier")
        for dt in self.variants + ([self.bare] if self.bare else []):
            if dt not in DTYPES:
                raise ValueError(f"unknown dtype {dt!r} (known: {', '.join(DTYPES)})")
        if self.instances and self.symbol is None:
            raise ValueError("a family with instances needs a symbol name template")
        for template in ([self.symbol] if self.symbol else []) + self.fallback:
            problem = template_problem(template)
            if problem:
                raise ValueError(f"name template {template!r}: {problem}")
        seen = set()
        for p in self.params:
            if p.name in seen:
                raise ValueError(f"parameter {p.name!r} is declared twice")
            seen.add(p.name)
        return self


def template_problem(template: str) -> str | None:
    """Name templates take plain ``{key}`` fields only: no format spec, conversion, index or attribute (a spec
    such as ``{name:>999999999}`` would make formatting allocate without bound)."""
    if len(template) > 256:
        return f"{len(template)} characters long; the limit is 256"
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        return str(exc)
    for _, key, spec, conversion in fields:
        if key is None:
            continue
        if not SYMBOL_NAME.match(key) or spec or conversion:
            shown = "{" + key + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            return f"field {shown} is not a plain {{key}}"
    return None


class Module(_Model):
    """One module kind: one NVRTC program per target."""

    kind: str
    mandatory: bool = False
    arch: list[str]  # gates: "sm_80+", "sm_90a", ...
    check_arch: list[str] = Field(default_factory=list)  # also built there, to check arithmetic only
    build_only: list[str] = Field(default_factory=list)  # targets no qualifier here can run: "built only"
    sources: list[str]
    include: list[str] = Field(default_factory=lambda: ["include"])  # header folders, relative to catalog
    state_capacity: bool = False  # pass -DMF_STATE_CAP=<cap> (only where the kernels need it)
    deterministic: bool = True
    options: list[str] = Field(default_factory=list)
    policy: PolicyOverride = Field(default_factory=PolicyOverride)
    families: list[str] = Field(default_factory=list)  # family files, relative to the catalog

    @field_validator("arch", "check_arch", "build_only")
    @classmethod
    def _gates(cls, v: list[str]) -> list[str]:
        for g in v:
            validate_gate(g)
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if not SYMBOL_NAME.match(v):
            raise ValueError(f"module kind {v!r} must be an identifier")
        return v


class Defaults(_Model):
    options: list[str] = Field(default_factory=list)
    policy: Policy = Field(default_factory=Policy)


class CatalogHeader(_Model):
    schema_: int = Field(alias="schema")
    name: str = "catalog"


class RootFile(_Model):
    catalog: CatalogHeader
    defaults: Defaults = Field(default_factory=Defaults)
    module: list[Module]


class FamilyFile(_Model):
    family: list[Family]


# ----------------------------------------------------------------------------------------------------------
# Expanded records: what the build and the qualifier consume.


class Symbol(_Model):
    """One exported kernel, fully expanded."""

    name: str
    module: str
    family: str
    dtype: str | None  # the variant dtype, where the family has variants
    params_env: dict[str, int | str]  # instance parameters (tile sizes, dtype keys)
    macro_args: list[str]
    block: tuple[int, int, int]
    dynamic_smem: int
    policy: Policy
    deterministic: bool
    fallback: list[str]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


class ModuleSpec(BaseModel):
    """A module with its families loaded and expanded, ready to compose and build."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    module: Module
    root: Path  # catalog folder: sources and headers resolve relative to it
    families: tuple[Family, ...]
    symbols: tuple[Symbol, ...]
    options: tuple[str, ...]  # defaults + module options (before target and state capacity)

    @property
    def kind(self) -> str:
        return self.module.kind

    def targets(self, wanted: list[Target]) -> list[tuple[Target, str]]:
        """(target, role) pairs this module builds for among `wanted`: role 'qualify' or 'check'."""
        out = []
        for t in wanted:
            if any(gate_admits(g, t) for g in self.module.arch):
                out.append((t, "qualify"))
            elif any(gate_admits(g, t) for g in self.module.check_arch):
                out.append((t, "check"))
        return out

    def built_only(self, target: Target) -> bool:
        return any(gate_admits(g, target) for g in self.module.build_only)

    def family(self, name: str) -> Family:
        return next(f for f in self.families if f.name == name)


class Catalog(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    path: Path
    name: str
    modules: tuple[ModuleSpec, ...]

    @cached_property
    def symbols(self) -> dict[str, Symbol]:
        return {s.name: s for m in self.modules for s in m.symbols}

    def module(self, kind: str) -> ModuleSpec:
        for m in self.modules:
            if m.kind == kind:
                return m
        raise ForgeError(f"no module kind {kind!r} in {self.path}", hint=f"known: {[m.kind for m in self.modules]}")

    def digest(self) -> str:
        """sha256 over the catalog's own files (root and family files)."""
        h = hashlib.sha256()
        for p in [self.path] + sorted({self.path.parent / f for m in self.modules for f in m.module.families}):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
        return h.hexdigest()


def _fmt_loc(loc: tuple[Any, ...], data: Any) -> str:
    """Name the entry a pydantic error points at: 'module[2] (kind=Fixed).families' etc."""
    parts, node = [], data
    for item in loc:
        if isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node):
            node = node[item]
            label = ""
            if isinstance(node, dict):
                for key in ("kind", "name"):
                    if key in node:
                        label = f" ({key}={node[key]})"
                        break
            parts[-1] = f"{parts[-1]}[{item}]{label}" if parts else f"[{item}]{label}"
        else:
            parts.append(str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return ".".join(parts) or "(top level)"


def _validate(model: type[BaseModel], data: Any, path: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise CatalogError(f"{path}: {_fmt_loc(err['loc'], data)}: {msg}{more}") from None


def _read_toml(path: Path) -> dict[str, Any]:
    if not (path.exists() or path.is_symlink()):
        raise CatalogError(f"catalog file not found: {path}", hint="pass --catalog PATH to an existing catalog")
    if path.is_dir():
        raise CatalogError(f"{path} is a folder, not a catalog file", hint="pass the catalog's .toml file")
    try:
        return parse_toml(read_bounded(path, MAX_CATALOG_BYTES, what="catalog file").decode("utf-8"), what=str(path))
    except PathRefused as exc:
        raise CatalogError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise CatalogError(f"{path}: not UTF-8 text") from None


def _expand_family(fam: Family, module: Module, policy: Policy, where: str) -> list[Symbol]:
    dtypes: list[tuple[str | None, str | None]] = [(d, None) for d in fam.variants]  # (dtype, name override)
    if fam.bare:
        dtypes.insert(0, (fam.bare, fam.name))
    if not dtypes:
        dtypes = [(None, None)]
    instances = fam.instances or [{}]
    if fam.symbol is not None:
        template = fam.symbol
    elif fam.variants:
        template = "{name}_{dtype}"
    else:
        template = "{name}"
    args = fam.args if fam.args is not None else (["T"] if dtypes[0][0] is not None else [])
    fam_policy = fam.policy.apply(module.policy.apply(policy))
    out = []
    for (dtype, override), inst in itertools.product(dtypes, instances):
        env: dict[str, int | str] = dict(inst)
        if dtype is not None:
            env.setdefault("T", dtype)
        fmt = {"name": fam.name, "dtype": dtype or "", **env}
        try:
            name = override if override and not fam.instances else template.format(**fmt)
        except (KeyError, IndexError) as exc:
            raise CatalogError(f"{where}: symbol template {template!r} names unknown key {exc}") from None
        if not SYMBOL_NAME.match(name):
            raise CatalogError(f"{where}: symbol {name!r} is not a C identifier")
        macro_args = []
        for a in args:
            if a not in env:
                raise CatalogError(f"{where}: macro argument {a!r} is not an instance key (have {sorted(env)})")
            v = env[a]
            macro_args.append(DTYPES[v][0] if isinstance(v, str) and v in DTYPES else str(v))
        num_env = {k: v for k, v in env.items() if isinstance(v, int)}
        num_env.update({f"sizeof_{k}": DTYPES[v][1] for k, v in env.items() if isinstance(v, str) and v in DTYPES})
        try:
            blk = fam.launch.block if isinstance(fam.launch.block, list) else [fam.launch.block]
            block = tuple(int(expr.evaluate(b, num_env)) for b in blk) + (1,) * (3 - len(blk))
            smem = int(expr.evaluate(fam.launch.dynamic_smem, num_env))
        except expr.ExprError as exc:
            raise CatalogError(f"{where}: symbol {name}: {exc}") from None
        if not all(b >= 1 for b in block):
            raise CatalogError(f"{where}: symbol {name}: block {block} must be positive")
        _check_launch_expressions(fam, num_env, f"{where}: symbol {name}")
        fallback = [f.format(**fmt) for f in fam.fallback]
        out.append(
            Symbol(
                name=name,
                module=module.kind,
                family=fam.name,
                dtype=dtype,
                params_env=env,
                macro_args=macro_args,
                block=block,  # type: ignore[arg-type]
                dynamic_smem=smem,
                policy=fam_policy,
                deterministic=module.deterministic if fam.deterministic is None else fam.deterministic,
                fallback=fallback,
            )
        )
    return out


def _check_launch_expressions(fam: Family, num_env: dict[str, int], where: str) -> None:
    """Grid, shape and scalar-value expressions parse within the language's bounds and name only the
    qualification dims, the instance's integers and sizeof_*: a bad one is a catalog error at load, not a
    failure on the GPU later. Skipped families (no launch spec yet) are exempt from the name rule."""
    known = set(num_env) | set(fam.qualify.dims)
    exprs = [("grid", g) for g in fam.launch.grid]
    for prm in fam.params:
        exprs += [(f"shape of {prm.name!r}", e) for e in prm.shape]
        if isinstance(prm.value, str):
            exprs.append((f"value of {prm.name!r}", prm.value))
    env = {**num_env, **fam.qualify.dims}
    for what, e in exprs:
        try:
            unknown = expr.names(e) - known
            if not unknown and not fam.qualify.skip:
                expr.evaluate(e, env)  # at the qualification dims: zero divisors, overflow, log2(0)...
        except expr.ExprError as exc:
            raise CatalogError(f"{where}: {what}: {exc}") from None
        if unknown and not fam.qualify.skip:
            raise CatalogError(f"{where}: {what} {e!r} names {sorted(unknown)}, which are neither qualification "
                               f"dims nor instance parameters (known: {sorted(known)})")


def load_catalog(path: str | Path) -> Catalog:
    """Load, validate and expand a catalog. Any problem raises one CatalogError naming file, entry and problem."""
    path = Path(path).expanduser().resolve()
    if path.is_dir():
        path = path / "catalog.toml"
    root_data = _read_toml(path)
    root: RootFile = _validate(RootFile, root_data, path)
    if root.catalog.schema_ != SCHEMA_VERSION:
        raise CatalogError(f"{path}: catalog.schema is {root.catalog.schema_}; this tool reads schema {SCHEMA_VERSION}")
    base = path.parent
    modules, seen_kinds, seen_symbols = [], set(), {}
    for mi, mod in enumerate(root.module):
        where = f"{path}: module[{mi}] (kind={mod.kind})"
        if mod.kind in seen_kinds:
            raise CatalogError(f"{where}: module kind declared twice")
        seen_kinds.add(mod.kind)
        for rel in mod.sources:
            if not (base / rel).is_file():
                raise CatalogError(f"{where}: source {rel!r} not found under {base}")
        for rel in mod.include:
            if not (base / rel).is_dir():
                raise CatalogError(f"{where}: include folder {rel!r} not found under {base}")
        families: list[Family] = []
        symbols: list[Symbol] = []
        for rel in mod.families:
            fpath = base / rel
            fdata = _read_toml(fpath)
            ff: FamilyFile = _validate(FamilyFile, fdata, fpath)
            for fi, fam in enumerate(ff.family):
                fwhere = f"{fpath}: family[{fi}] (name={fam.name})"
                if any(f.name == fam.name for f in families):
                    raise CatalogError(f"{fwhere}: family declared twice in module {mod.kind}")
                families.append(fam)
                for sym in _expand_family(fam, mod, root.defaults.policy, fwhere):
                    if sym.name in seen_symbols:
                        raise CatalogError(f"{fwhere}: symbol {sym.name} already declared by {seen_symbols[sym.name]}")
                    seen_symbols[sym.name] = fwhere
                    symbols.append(sym)
        modules.append(
            ModuleSpec(
                module=mod,
                root=base,
                families=tuple(families),
                symbols=tuple(symbols),
                options=tuple(root.defaults.options) + tuple(mod.options),
            )
        )
    return Catalog(path=path, name=root.catalog.name, modules=tuple(modules))


def default_catalog_path() -> Path:
    """The built-in catalog: kernels/catalog.toml beside the package (a source checkout or editable install)."""
    return Path(__file__).resolve().parents[2] / "kernels" / "catalog.toml"


def iter_targets(names: list[str] | None) -> Iterator[Target]:
    from mamba_forge.catalog.targets import DEFAULT_TARGETS, get_target

    for n in names or DEFAULT_TARGETS:
        yield get_target(n)


__all__ = [
    "Catalog", "DTYPES", "Family", "Module", "ModuleSpec", "Param", "Policy", "Symbol", "TARGETS",
    "load_catalog", "state_capacity", "default_catalog_path",
]
