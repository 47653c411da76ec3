"""Catalog launch spec -> concrete launch: buffers (dtype, shape, bytes, role, fill), scalars, grid, block,
dynamic shared memory (the input contents: fills.py). Pure NumPy: evaluated and tested on CPU.

The launch itself is not evaluated here: ``evaluate(...)`` builds the record the manifest signs for the symbol
(qualify/contract.py ``runtime_symbol``), compiles it with the runtime's ``Contract`` and takes grid, block,
dynamic shared memory, every pointer's shape and every scalar's value from ``Contract.at(dims)``; the instance's
launch packs through ``Contract.bind_at``. What stays here is the harness's: fills, aux buffers (the tensors a
prepared pointer table reaches, no kernel parameter), corpora, tolerances, and the catalog checks that make a
family qualifiable. ``evaluate`` returns a :class:`LaunchSpec` or raises :class:`SpecError` naming the problem.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from mamba_forge.catalog.model import Family, Param, Symbol
from mamba_forge.core import expr
from mamba_forge.core.vocab import DTYPES, FLOAT_DTYPES
from mamba_forge.qualify.contract import runtime_symbol
from mamba_forge.runtime.args import blob_align
from mamba_forge.runtime.contract import Bound, Contract, Launch
from mamba_forge.runtime.errors import LaunchRefused

NP_DTYPES: dict[str, np.dtype] = {  # numpy has no bfloat16: ml_dtypes's
    token: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for token, (_, _, name) in DTYPES.items()
}
MAX_BUFFER_BYTES = 1 << 30  # a spec asking for more than 1 GiB in one buffer is a catalog mistake
# default tolerances per output dtype: (rtol, atol)
TOLERANCES = {"f64": (1e-12, 1e-12), "f32": (1e-5, 1e-6), "bf16": (1e-2, 1e-2), "f16": (1e-2, 1e-3)}

_FILL = re.compile(r"^(\w+)(?:\((.*)\))?$")


class SpecError(ValueError):
    """A family's launch spec cannot be evaluated; the message names the family, the field and the problem."""


@dataclass(frozen=True)
class Fill:
    kind: str  # uniform|logu|normal|positive|const|randint|iota|special
    args: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Fill:
        m = _FILL.match(text.replace(" ", ""))
        if m is None:
            raise SpecError(f"cannot parse fill {text!r}")
        kind, raw = m.group(1), m.group(2)
        args = tuple(float(a) for a in raw.split(",") if a) if raw else ()
        need = {"uniform": 2, "logu": 2, "normal": 2, "positive": 2, "randint": 2, "const": 1, "iota": 0, "special": 0}
        if kind not in need:
            raise SpecError(f"unknown fill {text!r}")
        if len(args) != need[kind]:
            raise SpecError(f"fill {text!r} takes {need[kind]} arguments")
        if kind in ("uniform", "randint") and not args[0] < args[1]:
            raise SpecError(f"fill {text!r}: the lower bound must be below the upper")
        if kind in ("logu", "positive") and not 0 < args[0] < args[1]:
            raise SpecError(f"fill {text!r}: needs 0 < lo < hi (magnitudes)")
        if kind == "normal" and not args[1] > 0:
            raise SpecError(f"fill {text!r}: sigma must be positive")
        return cls(kind, args)

    @property
    def perturbable(self) -> bool:
        """Does a corpus (logu, special) replace this fill's values? Not for integers, constants, indices."""
        return self.kind in ("uniform", "logu", "normal", "positive", "special")

    @property
    def bound(self) -> float:
        """The largest magnitude this fill produces (what 'large' means in the special corpus)."""
        if self.kind in ("uniform", "logu", "positive"):
            return max(abs(self.args[0]), abs(self.args[1]))
        if self.kind == "normal":
            return abs(self.args[0]) + 4 * self.args[1]
        return 1.0

    @property
    def signed(self) -> bool:
        if self.kind == "uniform":
            return self.args[0] < 0
        return self.kind in ("logu", "normal", "special")


@dataclass
class BufferSpec:
    index: int  # parameter position
    name: str
    dtype: str
    role: str  # in|out|inout|scratch
    shape: tuple[int, ...]
    fill: Fill | None
    aux: bool = False  # a qualify.aux buffer: allocated and checked, never passed to the kernel (index -1)
    prepared: bool = False  # initial contents come from the family's prepare hook (e.g. a pointer table)

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * DTYPES[self.dtype][1]

    @property
    def is_output(self) -> bool:
        return self.role in ("out", "inout")

    @property
    def needs_fill(self) -> bool:
        if self.prepared:
            return False
        return self.role in ("in", "inout") or (self.role == "scratch" and self.fill is not None)


@dataclass
class ScalarSpec:
    index: int
    name: str
    type: str
    value: int | float


@dataclass
class BlobSpec:
    index: int
    name: str
    size: int
    align: int


@dataclass
class LaunchSpec:
    """One concrete launch: the runtime Contract's (grid, block, shared memory, shapes, scalars: `launch`) and
    the harness's own (fills, aux buffers, corpora, tolerances)."""

    symbol: str
    family: str
    dims: dict[str, int]
    env: dict[str, int]  # dims + the contract's constants (numeric instance params, sizeof_<key>): prepare's view
    buffers: list[BufferSpec]
    scalars: list[ScalarSpec]
    blobs: list[BlobSpec]
    contract: Contract  # the runtime's, of the record the manifest signs (symbol_contract)
    launch: Launch  # contract.at(dims)
    corpora: list[str]
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)  # per output name
    exact: bool = False
    aux: list[BufferSpec] = field(default_factory=list)  # qualify.aux buffers (not kernel parameters)

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.launch.grid

    @property
    def block(self) -> tuple[int, int, int]:
        return self.launch.block

    @property
    def dynamic_smem(self) -> int:
        return self.launch.shared_mem

    @property
    def param_types(self) -> list[str]:
        """Per parameter, in order: ptr/i32/.../bytes."""
        return [p.type for p in self.contract.record.params]

    @property
    def abi(self) -> list[tuple[int, int]]:
        """(offset, size) per parameter: the record's ABI census."""
        return [(p.offset, p.size) for p in self.contract.record.params]

    def bind(self, addresses: dict[str, int], blobs: dict[str, bytes]) -> Bound:
        """The launch packed around these device addresses (every kernel pointer's) and blobs, through the contract
        (Contract.bind_at: blob sizes, null addresses and overlaps refused as an engine's bind refuses them)."""
        return self.contract.bind_at(self.launch, addresses, blobs)

    @property
    def all_buffers(self) -> list[BufferSpec]:
        """Kernel pointer params, then aux buffers: everything the harness allocates."""
        return self.buffers + self.aux

    @property
    def prepared(self) -> list[BufferSpec]:
        return [b for b in self.buffers if b.prepared]

    @property
    def outputs(self) -> list[BufferSpec]:
        return [b for b in self.all_buffers if b.is_output]

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.all_buffers)


def param_bank_base(cc: tuple[int, int] | None) -> int:
    """Where the parameters start in constant bank 0 (0x160 before Hopper, 0x210 from sm_90: measured on the
    H200, whose driver reports a 64-byte-aligned first parameter at offset 48 = 0x240 - 0x210)."""
    return 0 if cc is None else (0x210 if cc[0] >= 9 else 0x160)


def expected_abi(params: list[Param], base: int = 0) -> list[tuple[int, int]]:
    """(offset, size) per parameter under the CUDA ABI: in order, each aligned to its alignment in the
    constant bank (offsets are relative to the parameter area, which starts at `base` in the bank)."""
    out, off = [], 0
    for p in params:
        size, align = p.size_align
        off = -(-(base + off) // align) * align - base
        out.append((off, size))
        off += size
    return out


def _dtype(p: Param, sym: Symbol) -> str:
    """An aux buffer's dtype token: a dtype, or an instance key naming one (as the contract resolves a pointer's)."""
    token = p.dtype or ""
    return token if token in DTYPES else str(sym.params_env.get(token, token))


_CONTRACTS: dict[tuple, tuple[Symbol, Family, Contract]] = {}
_CONTRACT_ENTRIES = 512  # compiled contracts kept (a split check evaluates one symbol at many dims)


def symbol_contract(sym: Symbol, fam: Family, layout: list[list[int]] | None = None,
                    state_capacity: int = 0) -> Contract:
    """The runtime's compiled Contract of the record the manifest signs for `sym` (qualify/contract.py
    runtime_symbol), with `layout` as its ABI census (default: the catalog's own, expected_abi) and the module's
    compiled state capacity (0: none). Compiled once per (symbol, family, layout, capacity)."""
    census = [list(x) for x in (layout if layout is not None else expected_abi(fam.params))]
    key = (id(sym), id(fam), tuple(map(tuple, census)), state_capacity)
    hit = _CONTRACTS.get(key)
    if hit is not None and hit[0] is sym and hit[1] is fam:  # ids are not reused while the entry holds both
        return hit[2]
    c = Contract(runtime_symbol(sym, fam, census, state_capacity))
    if len(_CONTRACTS) >= _CONTRACT_ENTRIES:
        _CONTRACTS.pop(next(iter(_CONTRACTS)))
    _CONTRACTS[key] = (sym, fam, c)
    return c


def evaluate(sym: Symbol, fam: Family, dims: dict[str, int] | None = None, *, layout: list[list[int]] | None = None,
             state_capacity: int = 0) -> LaunchSpec:
    """The concrete launch of `sym` at `dims` (default: the family's qualification dims): grid, block, dynamic
    shared memory, shapes and scalar values from the runtime Contract of its signed record (symbol_contract, with
    `layout` and `state_capacity` as there); fills, aux buffers, corpora and tolerances from the catalog."""
    where = f"family {fam.name} (symbol {sym.name})"
    q = fam.qualify
    if q.skip:
        raise SpecError(f"{where}: skipped: {q.skip}")
    if not fam.params:
        raise SpecError(f"{where}: no params declared (the launch spec is the parameter list)")
    qualifying = dims is None  # at the family's own qualification dims (not a batch check's smaller ones)
    dims = dict(q.dims if dims is None else dims)
    if layout is not None and len(layout) != len(fam.params):  # the contract could place no parameter
        raise SpecError(f"{where}: the ABI census has {len(layout)} slots for {len(fam.params)} parameters")
    for p in fam.params:  # a record the manifest could not carry (its codec refuses a pointer without a shape)
        if p.type == "ptr" and not p.shape:
            raise SpecError(f"{where}: pointer parameter {p.name!r} has no shape")
    try:
        contract = symbol_contract(sym, fam, layout, state_capacity)
        launch = contract.at({d: dims[d] for d in contract.dims if d in dims})
    except LaunchRefused as exc:
        raise SpecError(f"{where}: {exc}") from None
    env = {**contract.constants, **dims}  # what prepare hooks and aux shapes see

    def buffer(i: int, p: Param, dt: str, shape: tuple, aux: bool) -> BufferSpec:
        kind = "aux buffer" if aux else "parameter"
        if dt not in DTYPES:
            raise SpecError(f"{where}: {kind} {p.name!r} dtype {p.dtype!r} is neither a dtype nor an instance key "
                            "naming one")
        if any(type(s) is not int for s in shape):
            raise SpecError(f"{where}: shape of {p.name!r} must be integers, got {shape}")
        if any(s < 1 for s in shape):
            raise SpecError(f"{where}: {kind} {p.name!r} has an empty shape {shape}")
        fill = Fill.parse(p.fill) if p.fill else None
        # an input pointer param without a fill gets its bytes from the prepare hook (e.g. a pointer table)
        prepared = not aux and p.role == "in" and fill is None and q.prepare is not None
        if p.role in ("in", "inout") and fill is None and not prepared:
            raise SpecError(f"{where}: input {kind} {p.name!r} needs a fill")
        if fill and fill.kind in ("uniform", "logu", "normal", "positive", "special") and dt not in FLOAT_DTYPES:
            raise SpecError(f"{where}: {kind} {p.name!r}: fill {p.fill!r} needs a float dtype, not {dt}")
        b = BufferSpec(i, p.name, dt, p.role, shape, fill, aux=aux, prepared=prepared)
        if b.nbytes > MAX_BUFFER_BYTES:
            raise SpecError(f"{where}: {kind} {p.name!r} needs {b.nbytes} bytes (> {MAX_BUFFER_BYTES}): shrink qualify.dims")
        return b

    def aux_shape(p: Param) -> tuple:  # aux buffers are the harness's own, not the kernel's: not in the contract
        if not p.shape:
            raise SpecError(f"{where}: pointer aux buffer {p.name!r} has no shape")
        try:
            return tuple(expr.evaluate(x, env) for x in p.shape)
        except expr.ExprError as exc:
            raise SpecError(f"{where}: shape of {p.name!r}: {exc}") from None

    buffers, scalars, blobs = [], [], []
    for i, (p, rp) in enumerate(zip(fam.params, contract.record.params, strict=True)):
        if p.type == "ptr":  # the record's dtype: the one an engine's tensors are held to
            buffers.append(buffer(i, p, rp.dtype, launch.shapes[p.name], aux=False))
        elif p.type == "bytes":
            blobs.append(BlobSpec(i, p.name, rp.size, blob_align(rp.size)))
        else:
            scalars.append(ScalarSpec(i, p.name, *launch.scalars[p.name]))
    clash = {a.name for a in q.aux} & {p.name for p in fam.params}
    if clash:
        raise SpecError(f"{where}: aux buffer(s) {sorted(clash)} share a name with a kernel parameter")
    aux = [buffer(-1, a, _dtype(a, sym), aux_shape(a), aux=True) for a in q.aux]
    if aux and not any(b.prepared for b in buffers):
        raise SpecError(f"{where}: aux buffers need a prepared pointer param (an input without a fill, built by "
                        "qualify.prepare) through which the kernel reaches them")
    if not any(b.is_output for b in buffers + aux):
        raise SpecError(f"{where}: no output parameter (role out or inout): nothing to check")
    if q.batch_dim is not None and q.batch_dim not in dims:
        raise SpecError(f"{where}: batch_dim {q.batch_dim!r} is not one of the dims {sorted(dims)}")
    if q.batch_dim is not None and qualifying and dims[q.batch_dim] < 2:  # batch_sizes would compare nothing
        raise SpecError(f"{where}: batch_dim {q.batch_dim!r} = {dims[q.batch_dim]} leaves no smaller batch to compare "
                        "against: qualify at a batch of at least 2")
    if q.reference is not None and not re.match(r"^[\w.]+:\w+$", q.reference):
        raise SpecError(f"{where}: reference {q.reference!r} must be 'package.module:function'")
    if fam.qualify.prepare is None and blobs:
        raise SpecError(f"{where}: by-value 'bytes' parameters need qualify.prepare to build them")
    tol = {}
    for b in buffers + aux:
        if b.is_output:
            rt, at = TOLERANCES.get(b.dtype, (0.0, 0.0))
            tol[b.name] = (q.rtol if q.rtol is not None else rt, q.atol if q.atol is not None else at)
    return LaunchSpec(
        symbol=sym.name, family=fam.name, dims=dims, env=env, buffers=buffers, scalars=scalars, blobs=blobs,
        contract=contract, launch=launch, corpora=list(q.corpora), tolerance=tol, exact=q.exact, aux=aux,
    )


def batch_sizes(full: int) -> list[int]:
    """Smaller values of the batch dim to compare against: one row, and an odd count near a third."""
    return sorted({v for v in (1, full // 3 + 1) if 1 <= v < full})


def batch_axis(full: BufferSpec, small: BufferSpec) -> int | None:
    """The one axis along which a buffer shrinks with the batch dim; None when its shape does not change.
    Raises SpecError when more than one axis changes (rows are then not a leading slice)."""
    if full.shape == small.shape:
        return None
    if len(full.shape) != len(small.shape):
        raise SpecError(f"parameter {full.name!r}: rank changes with the batch dim")
    axes = [k for k, (a, b) in enumerate(zip(full.shape, small.shape, strict=True)) if a != b]
    if len(axes) != 1 or small.shape[axes[0]] > full.shape[axes[0]]:
        raise SpecError(f"parameter {full.name!r}: shape {full.shape} -> {small.shape} is not a leading slice of one axis")
    return axes[0]


def leading_rows(arr: np.ndarray, full: BufferSpec, small: BufferSpec) -> np.ndarray:
    """The part of a full-size flat array that corresponds to the smaller launch (flat again)."""
    axis = batch_axis(full, small)
    if axis is None:
        return arr
    shaped = arr.reshape(full.shape)
    idx = [slice(None)] * len(full.shape)
    idx[axis] = slice(0, small.shape[axis])
    return np.ascontiguousarray(shaped[tuple(idx)]).reshape(-1)


def as_f64(arr: np.ndarray, dtype: str) -> np.ndarray:
    """What the reference sees: floats as float64, integers as integer arrays."""
    return arr.astype(np.float64) if dtype in FLOAT_DTYPES else arr.astype(np.int64)


def from_bytes(data: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(data, dtype=NP_DTYPES[dtype])


__all__ = [
    "BlobSpec", "BufferSpec", "Fill", "LaunchSpec", "ScalarSpec", "SpecError", "TOLERANCES",
    "as_f64", "batch_axis", "batch_sizes", "evaluate", "expected_abi", "from_bytes", "leading_rows", "symbol_contract",
]
