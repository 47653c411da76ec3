"""The checked keyword launch: a RuntimeSymbol's launch contract compiled once, then bound per call.

    c = contract(symbol)                                   # cached per symbol record
    b = c.bind({"y": y, "x": x}, device=0)                 # n derived from x; everything checked
    params = c.packer.pack(b.values)                       # or driver.PackedParams(b.values, b.aligns)
    driver.launch(fn, b.grid, b.block, params, smem=b.shared_mem, stream=resolve_stream(None, b.owner, b.ordinal))
    values, grid, block, smem, owner = c.args({"y": y, "x": x})   # the same checks, plain values (the loader's)

Host time: bind and args go through a memo of evaluated launches (Contract.args has the rule): what depends only
on the key (element counts, dim-carrying and derived scalars, dims) is evaluated and checked once per key; every
call still checks each tensor (framework, device, dtype, density), the caller scalars, the blobs and the addresses
(null, overlap). Anything the memo does not take (CuPy, DLPack, numpy ints) gets the full check every call.

The rules (docs/architecture.md, "Runtime loader", has them): arguments are parameter names; a scalar whose recorded
``value`` is exactly a dim's name carries that dim, and when omitted the dim is the element count of a pointer
shaped exactly ``[dim]`` (the first input, else output); a value over dims ("d_state * L") is derived, and if
given must agree; a literal value ("1e-05": the qualification value) or "" is a required argument, never a
silent default; a dim no scalar carries is an argument of its own name. Expressions see dims and constants
only, validated by mamba_forge.core.expr's parser and compiled, all together, into one function.

Refused before anything launches, naming the argument and what was expected: missing or unknown arguments;
bools; non-ints for integer scalars; integers outside their type; a given scalar disagreeing with its derived
value; pointers that are not tensors (int addresses: use the positional launch), in host memory, on another
(or unknown, unless `locate` resolves it) device, of another dtype, not row-major dense, read-only where
written, or holding fewer elements than their shape's count (at least the count, for every role: kernels touch
only ``[0, count)``); blobs not of their exact size; negative dims; grid dimensions outside 1..CUDA's limits;
expressions that cannot be evaluated; memory where an output meets another pointer's bytes, but for an output exactly
the input its record declares (``in_place_of``: an elementwise kernel; none in a record written before it).

State capacity: where ``state_capacity`` > 0 (the module was compiled with -DMF_STATE_CAP) and the dims include
``d_state``, 1 <= d_state <= state_capacity (the scan kernels return without writing above it). Every scan family
names the dim ``d_state``; the schema records no capacity-bound dim, so the name is the rule.

Dims rules: a record's ``dims_multiple_of`` {dim: m} and ``dims_at_most`` {dim: hi} (the family's catalog
``requires``: shapes its kernel returns from without writing, e.g. the scan backward's channel groups) are refused
before anything launches; a record written before them has none.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from mamba_forge.core.vocab import DTYPE_SIZES
from mamba_forge.runtime.args import INT_RANGES, blob_align, check_tensor, param_packer, scalar_value
from mamba_forge.runtime.contract_at import Bound, Launch, LaunchAt, _bound, blob_bytes
from mamba_forge.runtime.contract_memo import (  # noqa: F401  (MEMO_ENTRIES, _MISSING: re-exported)
    _BLOB,
    _DERIVED,
    _DIM_SOURCE,
    _GIVEN,
    _MISSING,
    _PTR,
    MEMO_ENTRIES,
    NULL_PAGE,
    LaunchMemo,
    _compile_quick,
    _compile_reader,
    _lock,
    null_pointer,
)
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.expressions import compile_expressions, literal
from mamba_forge.runtime.tensors import DEVICE_KINDS_A_KERNEL_READS as _READABLE
from mamba_forge.runtime.tensors import TORCH_DTYPE_TOKENS, describe
from mamba_forge.runtime.tensors import TORCH_TYPES as _TORCH_TYPES

if TYPE_CHECKING:
    from mamba_forge.core.schema import RuntimeSymbol

GRID_LIMITS = (2**31 - 1, 65535, 65535)
CAPACITY_DIM = "d_state"
_WRITES = ("out", "inout", "scratch")
# what a pointer does, in _ptr_slots: reads only; writes (out, scratch: exactly an input of its element size only
# where the output declares that input, in_place_of); updates (inout: is itself the in-place buffer, so it shares no
# byte with any other argument)
_READ, _WRITE, _UPDATE = 0, 1, 2
_READS = ("in", "inout")


class Contract(LaunchMemo, LaunchAt):
    """A symbol's launch contract, compiled: see the module docstring for the rules."""

    def __init__(self, symbol: RuntimeSymbol):  # type: ignore[valid-type]
        self.symbol = name = symbol.name
        self.record = symbol  # what it was compiled from
        self.dims = dims = tuple(symbol.dims)
        self.constants = constants = dict(symbol.constants)
        if clash := set(dims) & set(constants):
            raise LaunchRefused(f"{name}: {sorted(clash)} are both dims and constants")
        if not 1 <= len(symbol.grid) <= 3:
            raise LaunchRefused(f"{name}: the recorded grid has {len(symbol.grid)} expressions, not 1 to 3")
        params = list(symbol.params)
        self.names = tuple(p.name for p in params)
        dim_at = {d: i for i, d in enumerate(dims)}
        sources: dict[str, int] = {}  # dim -> the scalar parameter carrying it
        exprs = list(symbol.grid)
        plan, derived, pointers = [], [], []
        self.qualified_literals: dict[str, int | float] = {}
        for i, p in enumerate(params):
            what = f"{p.name} of {name}"
            if p.kind == "pointer":
                count = " * ".join(f"({s})" for s in p.shape) if len(p.shape) > 1 else p.shape[0]
                exprs.append(count)
                acts = _UPDATE if p.role == "inout" else _WRITE if p.role in _WRITES else _READ
                plan.append((p.name, _PTR, p.dtype, acts, len(pointers), what))
                pointers.append(p)
            elif p.kind == "blob":
                plan.append((p.name, _BLOB, p.type, p.size, 0, what))
            elif p.value in dim_at and p.value not in sources:
                sources[p.value] = i
                plan.append((p.name, _DIM_SOURCE, p.type, dim_at[p.value], INT_RANGES.get(p.type), what))
            elif p.value and (lit := literal(p.value, name)) is None:
                exprs.append(p.value)
                plan.append((p.name, _DERIVED, p.type, len(derived), 0, what))
                derived.append((i, p.type, p.value, what))
            else:
                if p.value:
                    self.qualified_literals[p.name] = lit
                plan.append((p.name, _GIVEN, p.type, 0, INT_RANGES.get(p.type), what))
        self._plan = tuple(plan)
        self._pointers = tuple(pointers)
        # output -> the input it may be exactly (in_place_of); the pairs both ways: the only exact aliases that bind
        self._declared = declared = {p.name: p.in_place_of for p in pointers if p.in_place_of}
        self._in_place = frozenset(declared.items()) | frozenset((i, o) for o, i in declared.items())
        # (plan slot, pointer index, reads/writes/updates, bytes per element, name) of every pointer: the memory checks
        self._ptr_slots = tuple((i, e[4], e[3], DTYPE_SIZES.get(e[2], 1), e[0]) for i, e in enumerate(plan)
                                if e[1] == _PTR)
        self._evaluate, self.source = compile_expressions(name, exprs, dims, constants)
        self._ngrid, self._derived = len(symbol.grid), tuple(derived)
        self._grid_pad = (1,) * (3 - len(symbol.grid))

        def from_pointer(d: str) -> int:  # the first input (else output) whose shape is exactly [dim]
            exact = [j for j, p in enumerate(pointers) if len(p.shape) == 1 and p.shape[0].strip() == d]
            return ([j for j in exact if pointers[j].role in _READS] or exact or [-1])[0]

        # per dim: (slot, name, takes its own keyword, pointer index it may come from or -1, argument to ask for)
        self._dim_plan = tuple((k, d, d not in sources and d not in self.names, from_pointer(d),
                                params[sources[d]].name if d in sources else d) for k, d in enumerate(dims))
        self.derivations = {d: f"argument {ask}" if j < 0 else f"argument {ask} or the element count of "
                            f"{pointers[j].name}" for _, d, _, j, ask in self._dim_plan}
        self._tensor_sized = tuple((i, e[2], e[3], e[4] or (float("-inf"), float("inf"))) for i, e in enumerate(plan)
                                   if e[1] == _DIM_SOURCE and from_pointer(dims[e[3]]) >= 0)
        self.accepted = self.names + tuple(d for _, d, own, _, _ in self._dim_plan if own)
        self._accepted_set = frozenset(self.accepted)
        self._capacity_at = dim_at.get(CAPACITY_DIM, -1) if symbol.state_capacity > 0 else -1
        # the family's dims rules: (slot, name, m) for dim % m == 0 and (slot, name, hi) for dim <= hi; a rule on a
        # name that is no dim of this contract is a malformed record
        rules = symbol.dims_multiple_of, symbol.dims_at_most
        bad = sorted((set(rules[0]) | set(rules[1])) - set(dim_at))
        if bad:
            raise LaunchRefused(f"{name}: its record's dims rules name {bad}, which are not dims of its contract")
        self._multiple_of = tuple((dim_at[d], d, int(m)) for d, m in rules[0].items())
        self._at_most = tuple((dim_at[d], d, int(hi)) for d, hi in rules[1].items())
        self.state_capacity = symbol.state_capacity
        self._aligns = tuple(blob_align(p.size) if p.kind == "blob" else 0 for p in params)
        self._block = tuple(int(b) for b in symbol.block) + (1,) * (3 - len(symbol.block))
        self._smem = int(symbol.dynamic_smem)
        self.packer = param_packer(params)
        self._types = tuple("ptr" if p.kind == "pointer" else "bytes" if p.kind == "blob" else p.type for p in params)
        fast, self._ptr_key_at = self._fast_plan()
        self._read = _compile_reader(name, fast, len(plan)) if fast is not None else None
        self._quick = _compile_quick(name, self._ptr_slots)
        self._memo: OrderedDict[tuple, tuple] = OrderedDict()

    def bind(self, kwargs: dict, device: int = 0, locate=None, null: str = "") -> Bound:
        """Check every argument against the contract and return the launch; raises LaunchRefused otherwise.

        device: the ordinal the kernels are loaded on. locate: optional callable address -> device ordinal, used
        for a tensor whose object does not say its device (a Numba array); without it such a tensor is refused.
        null: the one pointer parameter that may be None (passed as address 0): a caller that knows the kernel
        reads none there, as the GEMM rungs' optional bias (runtime/gemm.py); no dim comes from it."""
        vals, grid, block, smem, owner = self.args(kwargs, device, locate, null)
        return _bound((list(zip(self._types, vals)), self._aligns, grid, block, smem, owner, device))  # noqa: B905

    def _bind(self, kwargs: dict, device: int, locate, null: str) -> Bound:
        """The full check of every argument (bind's, without the memo)."""
        name, get = self.symbol, kwargs.get
        values: list = [None] * len(self._plan)
        dims: list = [None] * len(self.dims)
        numels = [0] * len(self._pointers)
        given_derived = [_MISSING] * len(self._derived)
        seen, owner = 0, ""
        for i, (pname, how, ptype, extra, j, what) in enumerate(self._plan):
            v = get(pname, _MISSING)
            if v is _MISSING:
                if how < _DIM_SOURCE:  # pointers, blobs, caller scalars: required
                    raise LaunchRefused(self._missing(pname, how, extra if how == _BLOB else ptype, kwargs))
                continue
            seen += 1
            if how == _PTR:
                if v is None and pname == null:
                    values[i] = ("ptr", 0)
                    numels[j] = -1  # no size to check; a dim that would come from it is asked for instead
                    continue
                if type(v) in _TORCH_TYPES and v.is_cuda and TORCH_DTYPE_TOKENS.get(v.dtype) == ptype \
                        and v.get_device() == device and v.is_contiguous():
                    if not owner:  # the torch fast path: what describe() would read, less the device object
                        owner = "torch"
                    values[i] = ("ptr", v.data_ptr())
                    numels[j] = v.numel()
                    continue
                info = describe(v, what)
                if info is None:
                    raise LaunchRefused(self._not_tensor(v, what))
                ptr, dtype, numel, dense, kind, ordinal, readonly, framework = info
                if dtype != ptype or ordinal != device or not dense or kind not in _READABLE or (readonly and extra):
                    if ordinal < 0 and locate is not None and kind == "cuda":
                        info = info._replace(ordinal=int(locate(ptr)))
                    check_tensor(info, ptype, device, extra, what)  # raises, unless `locate` placed it here
                if not owner:
                    owner = framework
                values[i] = ("ptr", ptr)
                numels[j] = numel
            elif how == _BLOB:
                values[i] = ("bytes", blob_bytes(v, extra, what))
            elif how == _DERIVED:
                given_derived[extra] = scalar_value(ptype, v, what)
            else:
                if not (type(v) is int and j is not None and j[0] <= v <= j[1]):  # j: the int range, None: float
                    v = scalar_value(ptype, v, what)
                values[i] = (ptype, v)
                if how == _DIM_SOURCE:
                    dims[extra] = v
        for k, d, own, j, ask in self._dim_plan:
            if dims[k] is None:
                v = get(d, _MISSING) if own else _MISSING
                if v is not _MISSING:
                    seen += 1
                    dims[k] = scalar_value("i64", v, f"dim {d} of {name}")
                elif j >= 0 and numels[j] >= 0:
                    dims[k] = numels[j]
                else:
                    raise LaunchRefused(self._missing(ask, -1, d, kwargs))
            if dims[k] < 0:
                raise LaunchRefused(f"{name}: dim {d} = {dims[k]} (from {self.derivations[d]}) is negative")
        if seen != len(kwargs):
            raise LaunchRefused(f"{name} takes no argument {', '.join(self._unknown(kwargs))}; "
                                f"it takes {', '.join(self.accepted)}")
        grid, out = self._geometry(dims)
        ng = self._ngrid
        for have, count in zip(numels, out[ng:]):  # noqa: B905 - out continues with the derived scalars
            if 0 <= have < count:  # have -1: the null pointer
                raise LaunchRefused(self._too_small(numels, out[ng:], dims))
        self._check_memory(values, numels, null)
        if self._derived:
            self._bind_derived(values, out[ng + len(numels):], given_derived, dims)
        for i, ptype, k, rng in self._tensor_sized:
            if values[i] is None:  # the dim came from a tensor: it must fit the scalar's own type
                v = dims[k]
                if not rng[0] <= v <= rng[1]:
                    d = self.dims[k]
                    v = scalar_value(ptype, v, f"{self._plan[i][5]} (= {d}, {self.derivations[d]})")
                values[i] = (ptype, v)
        return _bound((values, self._aligns, grid, self._block, self._smem, owner, device))

    def _geometry(self, dims: list) -> tuple[tuple, tuple]:
        """(grid, every expression's value: grid, element counts, derived scalars) at these dims, after the state
        capacity check; bind and the tensorless launch (contract_at.LaunchAt.at) both evaluate through here."""
        name = self.symbol
        if self._capacity_at >= 0 and not 1 <= dims[self._capacity_at] <= self.state_capacity:
            raise LaunchRefused(f"{name}: d_state = {dims[self._capacity_at]} (from "
                                f"{self.derivations[CAPACITY_DIM]}) must be 1..{self.state_capacity}, the state "
                                f"capacity it was built with (rebuild with --state-cap to go higher)")
        for k, d, m in self._multiple_of:  # the kernel would return without writing (catalog `requires`)
            if dims[k] % m:
                raise LaunchRefused(f"{name}: {d} = {dims[k]} (from {self.derivations[d]}) must be a multiple of "
                                    f"{m}; its kernel serves no other")
        for k, d, hi in self._at_most:
            if dims[k] > hi:
                raise LaunchRefused(f"{name}: {d} = {dims[k]} (from {self.derivations[d]}) must be at most {hi}; "
                                    f"its kernel serves no more")
        try:
            out = self._evaluate(*dims)
        except (ArithmeticError, ValueError) as exc:
            raise LaunchRefused(f"{name}: the contract cannot be evaluated at {self._at(dims)} "
                                f"({type(exc).__name__}: {exc})") from None
        grid = out[:self._ngrid] + self._grid_pad
        for g, limit in zip(grid, GRID_LIMITS):  # noqa: B905 - equal lengths
            if type(g) is not int or not 1 <= g <= limit:
                raise LaunchRefused(self._bad_grid(grid, dims))
        return grid, out

    def _check_memory(self, values: list, numels: list, null: str) -> None:
        """Before any launch: no tensor at address 0 (but the one `null` parameter), no output overlapping
        another output, and no output overlapping an input unless it is exactly the input it declares (in place)."""
        spans = []
        for i, j, writes, size, pname in self._ptr_slots:
            ptr = values[i][1]
            if ptr < NULL_PAGE:
                if ptr == 0 and pname == null:
                    continue
                raise LaunchRefused(null_pointer(pname, self.symbol, ptr))
            spans.append((ptr, ptr + max(numels[j], 0) * size, writes, pname, size))
        if len(spans) > 1:
            self._refuse_overlaps(spans)

    def _refuse_overlaps(self, spans: list) -> None:
        """spans: (start, end, reads/writes/updates, name, bytes per element) per pointer, not null. The full check's
        and the memo's (contract_memo.LaunchMemo._check_pointers) one decision."""
        spans.sort()
        for k, (a0, a1, aw, an, asz) in enumerate(spans):
            for b0, b1, bw, bn, bsz in spans[k + 1:]:
                if b0 >= a1:
                    break  # sorted by start: no later span reaches into this one
                exact = {aw, bw} == {_READ, _WRITE} and (a0, a1, asz) == (b0, b1, bsz)
                if not (aw or bw) or (exact and (an, bn) in self._in_place):
                    continue  # inputs may share memory; an output may be exactly the input it declares (in place)
                if aw and bw:
                    how = "outputs alias each other"
                elif _UPDATE in (aw, bw) and (a0, a1) == (b0, b1):
                    how = "an argument updated in place is also an input"
                elif exact:
                    out, given = (an, bn) if aw else (bn, an)
                    decl = self._declared.get(out)
                    how = (f"{out} is exactly {given}; its kernel runs in place of {decl} only" if decl else
                           f"{out} is exactly {given}, which its kernel is not declared to run in place of")
                elif (a0, a1) == (b0, b1):
                    how = "an output is an input of another element size"
                else:
                    how = "an output partially overlaps an input"
                raise LaunchRefused(f"{an} and {bn} of {self.symbol}: {how} ([{a0:#x}, {a1:#x}) and "
                                    f"[{b0:#x}, {b1:#x})); pass separate memory")

    def _bind_derived(self, values: list, out, given: list, dims) -> None:
        for k, (i, ptype, text, what) in enumerate(self._derived):
            v = scalar_value(ptype, out[k], f"{what} = {text} at {self._at(dims)}")
            if given[k] is not _MISSING and given[k] != v:
                raise LaunchRefused(f"{what} = {given[k]!r} disagrees with {text} = {v!r} at {self._at(dims)}")
            values[i] = (ptype, v)

    def _bad_grid(self, grid, dims) -> str:
        axis, g, limit = next((a, g, lim) for a, (g, lim) in enumerate(zip(grid, GRID_LIMITS, strict=True))
                              if type(g) is not int or not 1 <= g <= lim)
        return f"{self.symbol}: grid dimension {axis} = {g} at {self._at(dims)} is outside 1..{limit}"

    def _too_small(self, numels, counts, dims) -> str:
        j = next(j for j, have in enumerate(numels) if have < counts[j])
        p = self._pointers[j]
        return (f"{p.name} of {self.symbol} has {numels[j]} elements; it needs at least {counts[j]} "
                f"({' * '.join(p.shape)}) at {self._at(dims)}")

    # ---- refusal texts (the slow path) ----
    def _at(self, dims) -> str:
        return ", ".join(f"{d}={v}" for d, v in zip(self.dims, dims, strict=True))

    def _unknown(self, kwargs) -> list[str]:
        return sorted(k for k in kwargs if k not in self._accepted_set)

    def _missing(self, pname: str, how: int, detail, kwargs) -> str:
        """detail: the dtype, blob size, scalar type, or (how -1) the dim the argument gives."""
        if how == _PTR:
            want = f"a {detail} tensor"
        elif how == _BLOB:
            want = f"bytes, exactly {detail} long"
        elif how == _GIVEN:
            lit = self.qualified_literals.get(pname)
            want = f"a {detail} scalar" + (f"; qualified with {lit!r}" if lit is not None else "")
        else:
            want = f"an integer >= 0: dim {detail}"
        unknown = self._unknown(kwargs)
        also = f"; unknown argument {', '.join(unknown)}" if unknown else ""
        return f"{self.symbol}: missing argument {pname} ({want}){also}"

    def _not_tensor(self, v, what: str) -> str:
        if isinstance(v, int) and not isinstance(v, bool):
            return (f"{what} is an int address, which the keyword launch cannot check; pass the tensor, or "
                    "use the positional launch(fn, grid, block, args) to pass raw addresses")
        return f"{what} of type {type(v).__name__} is not a tensor (torch, __cuda_array_interface__ or DLPack)"



_cache: dict[int, tuple[object, Contract]] = {}


def contract(symbol: RuntimeSymbol) -> Contract:  # type: ignore[valid-type]
    """The compiled contract of a symbol record, compiled on first use (records are not hashable: keyed by id,
    holding the record so the id is not reused)."""
    hit = _cache.get(id(symbol))
    if hit is not None and hit[0] is symbol:
        return hit[1]
    c = Contract(symbol)
    with _lock:
        _cache[id(symbol)] = (symbol, c)
    return c


__all__ = ["CAPACITY_DIM", "GRID_LIMITS", "MEMO_ENTRIES", "Bound", "Contract", "Launch", "contract"]
