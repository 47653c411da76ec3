"""Catalog launch spec -> concrete launch: buffers (dtype, shape, bytes, role, fill), scalars, grid, block,
dynamic shared memory (the input contents: fills.py). Pure NumPy: evaluated and tested on CPU.

A family's ``params`` list is the kernel's ABI in order; pointer parameters carry a shape (expressions over the
qualification dims and the instance parameters) and a role; scalars carry a value. The grid is evaluated over
the same names. ``evaluate(...)`` returns a :class:`LaunchSpec` or raises :class:`SpecError` naming the problem.
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
    symbol: str
    family: str
    dims: dict[str, int]
    env: dict[str, int]  # dims + numeric instance params + sizeof_<key>
    buffers: list[BufferSpec]
    scalars: list[ScalarSpec]
    blobs: list[BlobSpec]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int
    param_types: list[str]  # per parameter, in order: ptr/i32/.../bytes
    abi: list[tuple[int, int]]  # expected (offset, size) per parameter
    corpora: list[str]
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)  # per output name
    exact: bool = False
    aux: list[BufferSpec] = field(default_factory=list)  # qualify.aux buffers (not kernel parameters)

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


def _dtype_of(p: Param, sym: Symbol, where: str) -> str:
    token = p.dtype or ""
    if token in DTYPES:
        return token
    v = sym.params_env.get(token)
    if isinstance(v, str) and v in DTYPES:
        return v
    raise SpecError(f"{where}: parameter {p.name!r} dtype {token!r} is neither a dtype nor an instance key naming one")


def base_env(sym: Symbol, dims: dict[str, int]) -> dict[str, int]:
    env: dict[str, int] = {k: v for k, v in sym.params_env.items() if isinstance(v, int)}
    env.update({f"sizeof_{k}": DTYPES[v][1] for k, v in sym.params_env.items() if isinstance(v, str) and v in DTYPES})
    env.update(dims)
    return env


def evaluate(sym: Symbol, fam: Family, dims: dict[str, int] | None = None) -> LaunchSpec:
    """The concrete launch of `sym` at `dims` (default: the family's qualification dims)."""
    where = f"family {fam.name} (symbol {sym.name})"
    q = fam.qualify
    if q.skip:
        raise SpecError(f"{where}: skipped: {q.skip}")
    if not fam.params:
        raise SpecError(f"{where}: no params declared (the launch spec is the parameter list)")
    dims = dict(q.dims if dims is None else dims)
    env = base_env(sym, dims)

    def ev(e, what: str) -> int:
        try:
            v = expr.evaluate(e, env)
        except expr.ExprError as exc:
            raise SpecError(f"{where}: {what}: {exc}") from None
        if not isinstance(v, int) or isinstance(v, bool):
            raise SpecError(f"{where}: {what} must be an integer, got {v!r}")
        return v

    def pointer(i: int, p: Param, aux: bool) -> BufferSpec:
        kind = "aux buffer" if aux else "parameter"
        dt = _dtype_of(p, sym, where)
        if not p.shape:
            raise SpecError(f"{where}: pointer {kind} {p.name!r} has no shape")
        shape = tuple(ev(s, f"shape of {p.name!r}") for s in p.shape)
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

    buffers, scalars, blobs, types = [], [], [], []
    for i, p in enumerate(fam.params):
        types.append(p.type)
        if p.type == "ptr":
            buffers.append(pointer(i, p, aux=False))
        elif p.type == "bytes":
            blobs.append(BlobSpec(i, p.name, p.size or 0, p.align or 1))
        else:
            if p.value is None:
                raise SpecError(f"{where}: scalar parameter {p.name!r} has no value")
            if isinstance(p.value, float):
                val: int | float = p.value
            else:
                try:
                    val = expr.evaluate(p.value, env)
                except expr.ExprError as exc:
                    raise SpecError(f"{where}: value of {p.name!r}: {exc}") from None
            if p.type in ("f32", "f64"):
                val = float(val)
            elif not isinstance(val, int):
                raise SpecError(f"{where}: integer parameter {p.name!r} got {val!r}")
            else:
                lo, hi = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1),
                          "u64": (0, 2**64 - 1), "ptr": (0, 2**64 - 1)}[p.type]
                if not lo <= val <= hi:
                    raise SpecError(f"{where}: value {val} of {p.name!r} does not fit {p.type}")
            scalars.append(ScalarSpec(i, p.name, p.type, val))
    clash = {a.name for a in q.aux} & {p.name for p in fam.params}
    if clash:
        raise SpecError(f"{where}: aux buffer(s) {sorted(clash)} share a name with a kernel parameter")
    aux = [pointer(-1, a, aux=True) for a in q.aux]
    if aux and not any(b.prepared for b in buffers):
        raise SpecError(f"{where}: aux buffers need a prepared pointer param (an input without a fill, built by "
                        "qualify.prepare) through which the kernel reaches them")
    if not any(b.is_output for b in buffers + aux):
        raise SpecError(f"{where}: no output parameter (role out or inout): nothing to check")
    grid = tuple(ev(g, f"grid[{k}]") for k, g in enumerate(fam.launch.grid)) + (1,) * (3 - len(fam.launch.grid))
    if any(g < 1 for g in grid) or grid[0] > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        raise SpecError(f"{where}: grid {grid} is out of range")
    if q.batch_dim is not None and q.batch_dim not in dims:
        raise SpecError(f"{where}: batch_dim {q.batch_dim!r} is not one of the dims {sorted(dims)}")
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
        grid=grid, block=tuple(sym.block), dynamic_smem=sym.dynamic_smem, param_types=types,  # type: ignore[arg-type]
        abi=expected_abi(fam.params), corpora=list(q.corpora), tolerance=tol, exact=q.exact, aux=aux,
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
    "as_f64", "batch_axis", "batch_sizes", "evaluate", "expected_abi", "from_bytes", "leading_rows",
]
