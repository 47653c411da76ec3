"""The catalog's entries: the declarative schema of a kernel catalog (pydantic models, validated on load) and
the expanded records the build consumes (`Symbol`, `ModuleSpec`, `Catalog`: catalog/expanded.py, still named here).

A catalog is a root TOML file (``kernels/catalog.toml``) that declares module kinds; each module kind is one
NVRTC program composed from its sources, and lists family files (``[[family]]`` tables) that declare its
symbols. A family is one templated implementation; :mod:`mamba_forge.catalog.model` loads the files and expands
every family into symbols:

* dtype variants: ``variants = ["f32", "bf16", "f16"]`` gives ``<name>_f32``, ``<name>_bf16``, ...;
  ``bare = "f32"`` also exports ``<name>`` itself with that dtype;
* tile instantiations: ``instances = [{BM = 128, BN = 64}, ...]`` with ``symbol = "..._m{BM}n{BN}"``;
  variants x instances is the cartesian product.

Each symbol's entry point is appended to the composed source: the ``extern "C"`` wrapper generated from the
family's params and bounds, calling its ``body`` (:mod:`mamba_forge.catalog.wrappers`), or a call of the family's
instantiation macro, ``MACRO(symbol, args...)``; so the export set follows from the catalog.
Sizes (block, grid, dynamic shared memory, shapes) are integer expressions (see :mod:`mamba_forge.core.expr`).
"""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mamba_forge.catalog.split_rules import Split
from mamba_forge.catalog.targets import validate_gate
from mamba_forge.core.errors import ForgeError
from mamba_forge.core.vocab import DTYPES, LAYOUTS

SCHEMA_VERSION = 1

# GEMM layout names: family files name a layout by the instance key L, never its number, and any other value is
# refused when the catalog loads (dtype tokens and layout names: core/vocab.py)
LAYOUT_KEY = "L"
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
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Policy(_Model):
    """Resource policy for a symbol: what static and live admission hold it to."""

    max_regs: int = Field(255, ge=1, le=255)  # register cap per thread
    max_stack: int = Field(0, ge=0)  # allowed stack frame bytes
    max_spill: int = Field(0, ge=0)  # allowed spill store + load bytes
    min_blocks_per_sm: int = Field(1, ge=1)  # occupancy at the declared launch shape
    # "deterministic": the PTX of the symbol may hold no atom.*, red.*, local memory or call (mamba_forge/build/
    # cubin.py ORDER_TOKENS), which also catches integer-ticket reductions whose result depends on arrival order
    static_tokens: Literal["any", "deterministic"] = "any"


class PolicyOverride(_Model):
    max_regs: int | None = Field(None, ge=1, le=255)
    max_stack: int | None = Field(None, ge=0)
    max_spill: int | None = Field(None, ge=0)
    min_blocks_per_sm: int | None = Field(None, ge=1)
    static_tokens: Literal["any", "deterministic"] | None = None

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
    # the C type a generated wrapper (catalog/wrappers.py) declares: a pointer's element where the dtype only sizes
    # it (a record: mf::AdamWTensorDesc), a by-value blob's type (mf::TmaDesc)
    ctype: str | None = None
    # an output's input it may be exactly (in place: the same memory), where its kernel reads element i of that input
    # only in the thread that writes element i of this output, before writing it; every other exact alias is refused
    in_place_of: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Param:
        if self.type == "ptr":
            if self.dtype is None:
                raise ValueError(f"pointer parameter {self.name!r} needs a dtype")
        elif self.type == "bytes":
            if not self.size or not self.align:
                raise ValueError(f"bytes parameter {self.name!r} needs size and align")
        elif self.shape or self.role != "in" or self.ctype is not None:
            raise ValueError(f"scalar parameter {self.name!r} takes neither shape, role nor ctype")
        if self.fill is not None and not FILL_SPEC.match(self.fill):
            raise ValueError(f"parameter {self.name!r}: unknown fill {self.fill!r}")
        if self.in_place_of is not None and (self.type != "ptr" or self.role != "out"):
            raise ValueError(f"parameter {self.name!r}: only an output (type ptr, role out) may be in_place_of an input")
        return self

    @property
    def size_align(self) -> tuple[int, int]:
        if self.type == "bytes":
            return self.size or 0, self.align or 1
        return SCALAR_TYPES[self.type]


class Requires(_Model):
    """Dims a family's kernels serve only under conditions their grid and shapes cannot express (a kernel would
    return without writing otherwise): `multiple_of` {dim: m} (dim % m == 0), `at_most` {dim: hi} (dim <= hi). The
    qualified manifest carries them, and the runtime's checked launch refuses a launch outside them."""

    multiple_of: dict[str, int] = Field(default_factory=dict)
    at_most: dict[str, int] = Field(default_factory=dict)

    @field_validator("multiple_of", "at_most")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        for k, x in v.items():
            if not 1 <= x <= 1 << 40:
                raise ValueError(f"{k} = {x}: a dims rule's bound must be 1..2**40")
        return v

    def problem(self, dims) -> str | None:
        """What `dims` (name -> value) breaks, in words; None when they keep every rule."""
        for k, m in self.multiple_of.items():
            if dims[k] % m:
                return f"{k} = {dims[k]} is not a multiple of {m}"
        for k, hi in self.at_most.items():
            if dims[k] > hi:
                return f"{k} = {dims[k]} is above {hi}"
        return None


class Launch(_Model):
    block: Expr | list[Expr] = 256  # threads per block (x or [x, y, z]); expression over instance params
    dynamic_smem: Expr = 0  # bytes of dynamic shared memory; expression over instance params
    grid: list[Expr] = Field(default_factory=lambda: [1])  # expressions over qualification dims
    # programmatic dependent launch (sm_90+): launched with the programmatic-serialization attribute when its grid
    # has at most this many blocks (0: never), so its launch overlaps the grid before; the kernel must call
    # mf::pdl_wait() before its first global access (the build rejects one whose PTX never waits). An expression
    # over instance params (the kernel may take the same param, to wait only where it may be launched early);
    # 0 to 2^31-1, checked per symbol
    pdl_max_blocks: Expr = 0

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: list[Expr]) -> list[Expr]:
        if not 1 <= len(v) <= 3:
            raise ValueError("grid takes 1 to 3 expressions")
        return v

    @field_validator("block")
    @classmethod
    def _block(cls, v: Expr | list[Expr]) -> Expr | list[Expr]:
        if isinstance(v, list) and not 1 <= len(v) <= 3:
            raise ValueError(f"block takes 1 to 3 dims (x, y, z), got {len(v)}")
        return v


MAX_TOLERANCE = 1.0  # qualify.rtol and atol: above this a tolerance checks nothing worth a signature


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

    @field_validator("rtol", "atol")
    @classmethod
    def _tolerance(cls, v: float | None) -> float | None:
        # NaN or infinity would make every comparison pass (err > nan is False): refused, as is a meaningless size
        if v is not None and not (0.0 <= v <= MAX_TOLERANCE):
            raise ValueError(f"a tolerance must be a finite number in [0, {MAX_TOLERANCE:g}], got {v!r}")
        return v

    @model_validator(mode="after")
    def _check_aux(self) -> QualifySpec:
        seen = set()
        for a in self.aux:
            if a.type != "ptr":
                raise ValueError(f"aux buffer {a.name!r} must have type ptr, not {a.type}")
            if a.name in seen or a.in_place_of is not None:
                raise ValueError(f"aux buffer {a.name!r} is declared twice or in_place_of (the kernel never takes it)")
            seen.add(a.name)
        return self


# build/cubin.py PLACEMENT_REGISTERS (a test holds them equal; the catalog does not import the build)
ACKNOWLEDGEABLE = ("smid", "nsmid", "warpid", "nwarpid", "clock", "clock_hi", "clock64", "globaltimer",
                   "globaltimer_lo", "globaltimer_hi")


class Family(_Model):
    """One templated implementation and the symbols the catalog instantiates from it."""

    name: str
    instantiate: str | None = None  # macro in the sources; None: the sources define the symbols literally
    variants: list[str] = Field(default_factory=list)  # dtype tokens
    bare: str | None = None  # also export <name> with this dtype
    instances: list[dict[str, int | str]] = Field(default_factory=list)
    symbol: str | None = None  # name template, e.g. "{name}_m{BM}n{BN}_{dtype}"
    args: list[str] | None = None  # macro arguments after the symbol; default ["T"] with variants
    # instead of a macro: the __device__ __forceinline__ function the generated extern "C" wrapper calls with every
    # param in order, e.g. "mf::ssm_scan_tokens<T>", and that wrapper's __launch_bounds__: [] (none), [threads] or
    # [threads, min_blocks], min_blocks possibly by arch ({"sm_80+" = 1, "sm_90+" = 2}); catalog/wrappers.py
    body: str | None = None
    bounds: list[Expr | dict[str, int]] | None = None
    deterministic: bool | None = None  # default: the module's
    fallback: list[str] = Field(default_factory=list)  # symbol templates to fall back to, in order
    contract: str | None = None  # one line: what it computes, layouts, what it writes
    launch: Launch = Field(default_factory=Launch)
    requires: Requires = Field(default_factory=Requires)  # dims rules the launch contract cannot express otherwise
    policy: PolicyOverride = Field(default_factory=PolicyOverride)
    params: list[Param] = Field(default_factory=list)
    qualify: QualifySpec = Field(default_factory=QualifySpec)
    # placement-dependent special registers the family reads on purpose, each with why its bits do not depend
    # on it ({smid = "rotation of a commutative pairwise tree"}): the build records a note, not a warning
    acknowledge: dict[str, str] = Field(default_factory=dict)
    # {dim, batch, sequence, carried, chunks}: the launches give the same bits however a sequence is cut into calls
    # (rules and syntax: catalog/split_rules.py; proven by the qualifier's split check, qualify/split.py)
    split: Split | None = None

    @model_validator(mode="after")
    def _check(self) -> Family:
        if not SYMBOL_NAME.match(self.name):
            raise ValueError(f"family name {self.name!r} is not a C identifier")
        for reg, why in self.acknowledge.items():
            if reg not in ACKNOWLEDGEABLE:
                raise ValueError(f"acknowledge.{reg}: not a placement-dependent register (known: {', '.join(ACKNOWLEDGEABLE)})")
            if not why.strip() or len(why) > 200:
                raise ValueError(f"acknowledge.{reg}: give the reason in 1 to 200 characters")
        for dt in self.variants + ([self.bare] if self.bare else []):
            if dt not in DTYPES:
                raise ValueError(f"unknown dtype {dt!r} (known: {', '.join(DTYPES)})")
        if self.instances and self.symbol is None:
            raise ValueError("a family with instances needs a symbol name template")
        for template in ([self.symbol] if self.symbol else []) + self.fallback:
            problem = template_problem(template)
            if problem:
                raise ValueError(f"name template {template!r}: {problem}")
        for inst in self.instances:
            if LAYOUT_KEY in inst and inst[LAYOUT_KEY] not in LAYOUTS:
                raise ValueError(f"unknown layout {LAYOUT_KEY} = {inst[LAYOUT_KEY]!r} (known: {', '.join(LAYOUTS)})")
        seen = set()
        for p in self.params:
            if p.name in seen:
                raise ValueError(f"parameter {p.name!r} is declared twice")
            seen.add(p.name)
        self._check_in_place()
        return self

    def _check_in_place(self) -> None:
        """in_place_of names an input (ptr, role in) of this family of the output's dtype and shape; each input once."""
        by_name, claimed = {p.name: p for p in self.params}, {}
        for p in (p for p in self.params if p.in_place_of is not None):
            q, what = by_name.get(p.in_place_of), f"parameter {p.name!r}: in_place_of {p.in_place_of!r}"
            if q is None or q.type != "ptr" or q.role != "in":
                raise ValueError(f"{what} names no input (type ptr, role in) of this family")
            if q.dtype != p.dtype or [str(x) for x in q.shape] != [str(x) for x in p.shape]:
                raise ValueError(f"{what}: in place takes the output's dtype and shape ({p.dtype} {p.shape}); "
                                 f"{q.name} is {q.dtype} {q.shape}")
            if q.name in claimed:
                raise ValueError(f"{what}: output {claimed[q.name]!r} already runs in place of it; at most one may")
            claimed[q.name] = p.name


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
    routes: list[str] = Field(default_factory=list, max_length=16)  # GEMM route files (catalog/routes.py)
    route_tuning: list[str] = Field(default_factory=list, max_length=16)  # rung tuning (catalog/route_tuning.py)


class RootFile(_Model):
    catalog: CatalogHeader
    defaults: Defaults = Field(default_factory=Defaults)
    module: list[Module]


class FamilyFile(_Model):
    family: list[Family]


_EXPANDED = ("Catalog", "ModuleSpec", "Symbol")  # the expanded records: catalog/expanded.py


def __getattr__(name: str):
    """entries.Symbol, entries.ModuleSpec, entries.Catalog: the expanded records moved to catalog/expanded.py
    (which imports this module, so they resolve on first use rather than at import)."""
    if name in _EXPANDED:
        from mamba_forge.catalog import expanded

        return getattr(expanded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
