"""One call for a routed GEMM: ``kernels.gemm(A, B, out=None, bias=None, layout="nn", math=None, stream=None)``.

An engine should not have to know a rung's ABI to multiply two matrices: which rung serves (the route table, by
(N, K, bias) for the class and M for the rung), which tensor maps a TMA rung reads and with which boxes (the
skinny rungs' differ from the large tiles'), that a rung's bias pointer may be null, or that an exact-f32
fallback needs casts. This module does those steps, in this order, and launches through the rung's checked
keyword contract, so nothing reaches the GPU unchecked:

1. the operands: 2-D tensors (``.shape``) that the contract's tensor rules accept (CUDA, this device, row-major
   dense; A may also be row-strided: below); their shapes fix (M, N, K) for the layout (nn: A[M,K] B[K,N]; nt:
   A[M,K] B[N,K]; tn: A[K,M] B[K,N]), C is [M,N], bias [N] in C's dtype; dtypes bf16, f16, f32
   (``math="tf32"``: f32 operands on the TF32 route);
2. the rung: :func:`mamba_forge.runtime.routes.select` through ``Kernels.gemm_route`` (``symbol=`` names one,
   the only way to reach a force rung); the rung itself serves, never a fallback of it (a fallback is another
   class: the bits would depend on what was rejected);
3. its by-value blobs: the tensor maps from the hook its signed record names (``tensor_maps``: the family's
   qualify.prepare, the one the qualifier launched it with; a function of mamba_forge.gpu.tma), at this call's
   addresses, shape and A's row stride (none for a dense A: the qualified maps, byte for byte);
4. the launch: the rung's keyword contract (runtime/contract.py) with M, N, K given, the bias pointer null when
   there is none (the GEMM ABI's "none": kernels/fixed/gemm.toml, kernels/triad/*.toml).

A row-strided A (a torch matrix whose rows are dense, stride (lda, 1) with lda > K: a column slice of a wider
row-major matrix, as x_dbl[:, :dt_rank]) is read in place for layout nn by a rung that reads A through a tensor
map: the same kernel and bits as on A.contiguous(), only tmA's row stride differs (the map keeps A's M x K
dimensions, so the TMA reads only columns [0, K) of each row: gpu/tma.py). Refused before any launch, each saying
to pass A.contiguous(): stride(1) != 1, another layout, lda < K, lda * element size not a multiple of 16 bytes,
an address not 16-byte aligned, a rung that reads A through its pointer (no tensor maps: it assumes a dense A) or
serves with casts; and an extent, (M - 1) * lda + K elements from A's first, outside A's storage. That extent is
A's bytes wherever they are checked: against C for overlap, and as the ABI pointer A (which these kernels never
dereference), handed to the contract as a dense 1-D view of it (device, dtype, null address, size, overlap).
Nothing is copied here: a caller that would rather copy than be refused asks reads_a_in_place
(Kernels.gemm_reads_a_in_place) first. Other frameworks' tensors are read as dense only.

A route served with casts (an exact-f32 class for 16-bit operands, where the device has no 16-bit class) is run
on f32 copies made by the operands' framework (torch only), then rounded into C by it. Empty products (M or N = 0)
launch nothing. A call with torch operands is remembered per Kernels by the operands' dtypes and shapes and A's
strides (with layout, math, symbol; CALL_ENTRIES, least recently used out): a repeat skips steps 1 and 2 and checks
per call C's bytes against the inputs', a strided A's address and storage, and, in step 4, everything the contract
checks per call (runtime/contract.py). Standard library only; mamba_forge.gpu.tma (cuda-bindings) is imported when
a rung takes tensor maps.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from mamba_forge.core.vocab import DTYPE_SIZES, GEMM_STORAGE, LAYOUTS
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.kernel import current_on_this_thread, on_this_thread
from mamba_forge.runtime.tensors import TORCH_DTYPE_TOKENS, TORCH_TYPES, describe, torch_dtype

if TYPE_CHECKING:
    from mamba_forge.runtime.loader import Kernel, Kernels

BIAS = "bias"  # the GEMM ABI's optional pointer (null = none)
CACHE_ENTRIES = 4096  # routes (per Kernels) and tensor maps; a full cache is emptied (decode reuses few shapes)
CALL_ENTRIES = 1024  # remembered calls per Kernels (Kernels._gemm_calls), least recently used out first


def _matrix(x, what: str) -> tuple[int, int, str]:
    """(rows, cols, dtype token) of a 2-D tensor argument; the contract checks device, density and the rest."""
    shape = getattr(x, "shape", None)
    if type(x) in TORCH_TYPES and (tok := TORCH_DTYPE_TOKENS.get(x.dtype)) is not None and len(shape) == 2 \
            and shape[0] >= 0 and shape[1] >= 0:
        return int(shape[0]), int(shape[1]), _stored(tok, what)  # the contract checks device and density
    info = describe(x, what) if shape is not None else None
    if info is None:
        raise LaunchRefused(f"{what} of type {type(x).__name__} is not a tensor (torch, __cuda_array_interface__ "
                            "or DLPack, with a .shape)")
    shape = tuple(shape)
    if len(shape) != 2 or not all(type(d) is int or hasattr(d, "__index__") for d in shape) or min(shape) < 0:
        raise LaunchRefused(f"{what} has shape {shape}; a GEMM operand is a 2-D matrix")
    return int(shape[0]), int(shape[1]), _stored(info.dtype, what)




def _span(x, dtype: str, count: int) -> tuple[int, int]:
    """[first byte, past the last) of a dense tensor of `count` elements."""
    ptr = x.data_ptr() if type(x) in TORCH_TYPES else describe(x, "tensor").ptr
    return ptr, ptr + count * DTYPE_SIZES[dtype]


def _refuse_overlap(out, ct: str, M: int, N: int, inputs) -> None:
    """C may not share a byte with an input: the kernels read A, B and bias while C is written."""
    lo, hi = _span(out, ct, M * N)
    for what, x, dtype, count in inputs:
        a, b = _span(x, dtype, count)
        if a < hi and lo < b:
            raise LaunchRefused(_overlaps(what))


def _overlaps(what: str) -> str:
    return f"out overlaps {what} in memory; C must be a buffer of its own (it is written while {what} is read)"


def _stored(tok: str, what: str) -> str:
    if tok not in GEMM_STORAGE:
        raise LaunchRefused(f"{what} is {tok}; GEMM operands are {', '.join(GEMM_STORAGE)}")
    return tok


def gemm_dims(layout: str, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int, int]:
    """(M, N, K) from the stored shapes of A and B; refuses a K that disagrees."""
    (m, ka) = a if layout in ("nn", "nt") else a[::-1]
    (kb, n) = b if layout in ("nn", "tn") else b[::-1]
    if ka != kb:
        want = {"nn": "A [M, K] and B [K, N]", "nt": "A [M, K] and B [N, K]", "tn": "A [K, M] and B [K, N]"}[layout]
        raise LaunchRefused(f"{layout.upper()} GEMM: A is {a[0]} x {a[1]} and B is {b[0]} x {b[1]}: K differs "
                            f"({ka} vs {kb}); {layout} takes {want}")
    return m, n, ka


def _is_torch(x) -> bool:
    """A torch tensor (by its type's module: torch is never imported here)."""
    return type(x).__module__.split(".")[0] == "torch"


def gemm(kernels: Kernels, A, B, out=None, *, bias=None, layout: str = "nn", math: str | None = None,
         symbol: str | None = None, stream=None):
    """C = op(A) op(B) (+ bias) through the rung the route table picks here; returns C (`out`, or a new tensor of
    A's dtype when out is None and A is a torch tensor). See the module docstring for the steps and refusals.

    Torch operands (out and bias too, where given) are remembered per Kernels by what steps 1 and 2 read of them
    (dtype and shape of each, A's strides, layout, math, symbol): a call with the same finds M, N, K, the rung, its
    layout and A's row stride there, and checks per call only what those leave out: C's bytes against A's, B's and
    bias's (the addresses), a strided A's address and storage, then the rung's keyword launch with every per-call
    check of its contract."""
    calls = getattr(kernels, "_gemm_calls", None)
    key = None
    t = type(A)
    if calls is not None and t in TORCH_TYPES and type(B) is t and (out is None or type(out) is t) \
            and (bias is None or type(bias) is t):
        key = (layout, math, symbol, A.dtype, A.shape, A.stride(), B.dtype, B.shape,
               None if out is None else out.dtype, None if out is None else out.shape,
               None if bias is None else bias.dtype, None if bias is None else bias.shape)
        try:
            hit = calls.get(key)
        except TypeError:  # a shape that does not hash (symbolic sizes): every step, every call
            hit = key = None
        if hit is not None:
            try:
                calls.move_to_end(key)
            except KeyError:  # evicted by another thread since
                pass
            kern, takes_bias, blobs, maps_of_c, M, N, K, c_bytes, a_bytes, b_bytes, bias_bytes, lda = hit
            if out is None:
                out = A.new_empty((M, N))
            lo = out.data_ptr()
            hi = lo + c_bytes
            pa = A.data_ptr()
            if pa < hi and lo < pa + a_bytes:
                raise LaunchRefused(_overlaps("A"))
            pb = B.data_ptr()
            if pb < hi and lo < pb + b_bytes:
                raise LaunchRefused(_overlaps("B"))
            kwargs = {"C": out, "A": _span_of(A, M, K, lda) if lda else A, "B": B, "M": M, "N": N, "K": K}
            null = ""
            if takes_bias:  # (a bias given to a rung without one was refused before the key was remembered)
                kwargs[BIAS] = bias
                if bias is None:
                    null = BIAS
                else:
                    p = bias.data_ptr()
                    if p < hi and lo < p + bias_bytes:
                        raise LaunchRefused(_overlaps("bias"))
            if blobs:  # _tensor_maps' cache, read with the addresses at hand
                maps = _MAPS.get((kern._maps_ident, pa, pb, lo if maps_of_c else 0, M, N, K, lda))
                kwargs.update(maps if maps is not None else _tensor_maps(kern, A, B, out, M, N, K, blobs, lda))
            kern._launch(kwargs, stream, null)
            return out
    return _gemm(kernels, key, A, B, out, bias, layout, math, symbol, stream)


def _gemm(kernels: Kernels, key, A, B, out, bias, layout: str, math, symbol, stream):
    """Every step of gemm(); a launch without casts is remembered under `key` (None: not remembered)."""
    if layout not in LAYOUTS:
        raise LaunchRefused(f"layout {layout!r} is not a GEMM layout ({', '.join(LAYOUTS)})")
    if math not in (None, "tf32"):
        raise LaunchRefused(f"math={math!r}: the one math option is 'tf32' (f32 operands, TF32 products); "
                            "None runs each dtype's own route")
    ar, ac, at = _matrix(A, "A")
    br, bc, bt = _matrix(B, "B")
    if at != bt:
        raise LaunchRefused(f"A is {at} and B is {bt}; a GEMM route takes operands of one dtype")
    if math == "tf32" and at != "f32":
        raise LaunchRefused(f"math='tf32' takes f32 operands, not {at}")
    M, N, K = gemm_dims(layout, (ar, ac), (br, bc))
    if out is None:
        if not _is_torch(A):
            raise LaunchRefused("out=None allocates C with torch; for other tensors pass out= (an M x N matrix)")
        out = A.new_empty((M, N))
    cr, cc, ct = _matrix(out, "out")
    if (cr, cc) != (M, N):
        raise LaunchRefused(f"out is {cr} x {cc}; this product is {M} x {N}")
    if bias is not None:
        shape = tuple(getattr(bias, "shape", ()))
        info = describe(bias, "bias")
        if info is None or len(shape) != 1 or int(shape[0]) != N or info.dtype != ct:
            got = f"{info.dtype} of shape {shape}" if info is not None else type(bias).__name__
            raise LaunchRefused(f"bias is {got}; it must be a vector of N = {N} {ct} elements (C's dtype)")
    if M == 0 or N == 0:
        return out
    lda = _row_stride(A, K, at, layout)  # 0: A is read as stored (dense, or checked by the contract)
    _refuse_overlap(out, ct, M, N, [("A", A, at, (M - 1) * lda + K if lda else ar * ac), ("B", B, bt, br * bc)]
                    + ([("bias", bias, ct, N)] if bias is not None else []))
    if K == 0:
        raise LaunchRefused(f"K = 0: the product is {M} x {N} zeros (+ bias) and no GEMM rung runs an empty "
                            "reduction; fill C yourself")
    a_tok = "tf32" if math == "tf32" else at
    route, kern, plan = _rung(kernels, (M, N, K, a_tok, ct, layout, bias is not None, symbol))
    if lda and not _in_place(route, kern, plan):
        why = "serves here on f32 copies of the operands" if route.cast else \
            "reads A through its pointer as a dense M x K matrix (no tensor maps)"
        raise LaunchRefused(f"A has row stride {lda} (K = {K}) and {kern.name} {why}; pass A.contiguous()")
    if not route.cast:
        _launch(kern, plan, _span_of(A, M, K, lda) if lda else A, B, out, bias, M, N, K, stream, lda)
        if key is not None:  # launched: every check that the key decides passed
            calls = kernels._gemm_calls
            size = DTYPE_SIZES
            maps_of_c = kern.symbol.tensor_maps.endswith("_tmastore")  # as _tensor_maps keys its cache
            a_elems = (M - 1) * lda + K if lda else ar * ac
            entry = (kern, plan[0], plan[1], maps_of_c, M, N, K, M * N * size[ct], a_elems * size[at],
                     br * bc * size[bt], N * size[ct], lda)
            with _lock:
                calls[key] = entry
                while len(calls) > CALL_ENTRIES:
                    calls.popitem(last=False)
        return out
    if not all(_is_torch(x) for x in (A, B, out) + (() if bias is None else (bias,))):
        raise LaunchRefused(f"{layout} {a_tok}x{a_tok}->{ct} is served here only by {route.symbol} on f32 copies "
                            "(no 16-bit rung is admitted on this device); the casts need torch tensors")
    a32, b32 = A.float(), B.float()
    c32 = out if ct == "f32" else a32.new_empty((M, N))
    bias32 = bias if bias is None or ct == "f32" else bias.float()
    _launch(kern, plan, a32, b32, c32, bias32, M, N, K, stream)
    if c32 is not out:
        out.copy_(c32)
    return out


def _row_stride(A, K: int, dtype: str, layout: str) -> int:
    """0 where A is read as stored (row-major dense; or not torch's, which the contract checks as dense); else
    A's row stride lda after the rules its shape and strides decide: rows dense (stride(1) == 1), layout nn,
    lda >= K, lda * element size a multiple of 16 bytes. The rung's rule is _in_place's, the address's _span_of's."""
    if type(A) not in TORCH_TYPES or A.is_contiguous():
        return 0
    lda, step = A.stride()
    what = f"A is not contiguous ({A.shape[0]} x {K}, strides ({lda}, {step}))"
    if step != 1:
        raise LaunchRefused(f"{what} and its rows are not dense (stride(1) != 1); pass A.contiguous()")
    if layout != "nn":
        raise LaunchRefused(f"{what}: a row-strided A is read in place for layout nn only; pass A.contiguous()")
    if lda < K:
        raise LaunchRefused(f"{what}: its row stride is below K = {K} (rows overlap); pass A.contiguous()")
    if lda * DTYPE_SIZES[dtype] % 16:
        raise LaunchRefused(f"{what}: its row stride is {lda * DTYPE_SIZES[dtype]} bytes, not a multiple of 16 "
                            "(a tensor map's rule); pass A.contiguous()")
    return lda


def _span_of(A, M: int, K: int, lda: int):
    """The per-call rules of a row-strided A, and what the rung's contract checks in its place: A's address
    16-byte aligned, and its strided extent, (M - 1) * lda + K elements from its first, inside its storage, as a
    dense 1-D view of that extent (the ABI pointer A, which these kernels never dereference: the tensor map reads
    only columns [0, K) of each row; the contract checks its device, dtype, null address, size and overlaps)."""
    span, size, ptr = (M - 1) * lda + K, A.element_size(), A.data_ptr()
    if ptr % 16:
        raise LaunchRefused(f"A at {ptr:#x} with row stride {lda}: a row-strided A must be 16-byte aligned (a "
                            "tensor map's rule); pass A.contiguous()")
    have = A.untyped_storage().nbytes() // size - A.storage_offset()
    if span > have:
        raise LaunchRefused(f"A's rows span {span} elements ((M - 1) * lda + K, lda = {lda}) but its storage holds "
                            f"{have} from its first element")
    return A.as_strided((span,), (1,))


def _in_place(route, kern: Kernel, plan: tuple) -> bool:
    """Whether a rung reads a row-strided A in place: no casts, and A read through a tensor map (its record's
    hook builds tmA, with the row stride the hook takes as tma.A_ROW_STRIDE)."""
    return not route.cast and bool(kern.symbol.tensor_maps) and "tmA" in plan[1]


def reads_a_in_place(kernels: Kernels, A, B, *, bias=None, layout: str = "nn") -> bool:
    """Whether gemm(kernels, A, B, bias=bias, layout=layout) takes this A as it lies (Kernels.gemm_reads_a_in_place):
    True for a row-major dense A (or one that is not torch's: the contract decides), and for a torch A with a row
    stride that every rule above admits at the rung serving this call; False where the caller must pass
    A.contiguous() (a copy: the caller's choice, never gemm's). Refuses nothing; gemm() does."""
    if not _is_torch(A) or A.is_contiguous():
        return True
    try:
        (M, K), at = A.shape, _stored(torch_dtype(A.dtype), "A")
        if type(A) not in TORCH_TYPES:
            describe(A, "A")  # a torch type not seen yet: tensors.TORCH_TYPES takes it
        lda = _row_stride(A, K, at, layout)
        if not lda or A.data_ptr() % 16:
            return False
        route, kern, plan = _rung(kernels, (M, int(B.shape[1]), K, at, at, layout, bias is not None, None))
    except (LaunchRefused, LookupError, ValueError):
        return False
    return _in_place(route, kern, plan)


def a_as_read(kernels: Kernels, A, B, *, bias=None, layout: str = "nn"):
    """A as gemm(kernels, A, B, ...) takes it: A itself where it is dense or read in place
    (Kernels.gemm_reads_a_in_place), else A.contiguous() (torch: the caller's one copy, the same bits). The one
    place the layer, its training forward and the mamba_forge::gemm op decide it."""
    if type(A) in TORCH_TYPES and A.is_contiguous():
        return A  # the common case, first: no route lookup
    return A if kernels.gemm_reads_a_in_place(A, B, bias=bias, layout=layout) else A.contiguous()


def _rung(kernels: Kernels, key: tuple):
    """(route, its Kernel, (takes a bias, its blob names)) for (M, N, K, a, c, layout, bias, symbol): select() once
    per key (what serves is fixed from load on, so the answer is too)."""
    cache = kernels._gemm_routes
    hit = cache.get(key)
    if hit is None:
        M, N, K, a, c, layout, bias, symbol = key
        route = kernels.gemm_route(M, N, K, a, a, c, layout, bias=bias, symbol=symbol)
        kern = kernels.function(route.symbol, follow_fallback=False)
        if kern.name != route.symbol:  # never a fallback: another class would compute other bits
            raise LaunchRefused(f"{route.symbol} is routed but {kern.name} would serve it")
        if len(cache) >= CACHE_ENTRIES:
            cache.clear()
        plan = (any(p.name == BIAS for p in kern.symbol.params), tuple(p.name for p in kern.symbol.params
                                                                        if p.kind == "blob"))
        hit = cache[key] = (route, kern, plan)
    return hit


def _launch(kern: Kernel, plan: tuple, A, B, C, bias, M: int, N: int, K: int, stream, lda: int = 0) -> None:
    takes_bias, blobs = plan
    kwargs = {"C": C, "A": A, "B": B, "M": M, "N": N, "K": K}
    null = ""
    if takes_bias:
        kwargs[BIAS] = bias
        null = BIAS if bias is None else ""
    elif bias is not None:  # select() refuses this; a named symbol= rung without a bias gets here
        raise LaunchRefused(f"{kern.name} takes no bias")
    if blobs:
        kwargs.update(_tensor_maps(kern, A, B, C, M, N, K, blobs, lda))
    kern._launch(kwargs, stream, null)


def maps_ident(symbol) -> tuple:
    """A rung's tensor maps' inputs besides addresses and shape: its hook and tile (a Kernel keeps it)."""
    return (symbol.tensor_maps, tuple(sorted(symbol.constants.items())))


def _tensor_maps(kern: Kernel, A, B, C, M: int, N: int, K: int, blobs, lda: int = 0) -> dict[str, bytes]:
    hook = kern.symbol.tensor_maps
    if not hook:
        raise LaunchRefused(f"{kern.name} takes {', '.join(blobs)} but its record names no tensor-map hook (a manifest "
                            "qualified before records carried one): re-qualify, or launch it with its own maps")
    torch_types = TORCH_TYPES
    a = A.data_ptr() if type(A) in torch_types else describe(A, "A").ptr
    b = B.data_ptr() if type(B) in torch_types else describe(B, "B").ptr
    c = C.data_ptr() if type(C) in torch_types else describe(C, "C").ptr
    # a map is a pure function of the rung (its hook and tile), the addresses and the shape: cached on those; C's
    # address only where a map describes C (the tmastore rungs), so a fresh output per call still hits. The rung is
    # its hook and tile constants, not its name: two manifests in one process may sign one name with other tiles
    ident = getattr(kern, "_maps_ident", None) or maps_ident(kern.symbol)
    kern._maps_ident = ident
    key = (ident, a, b, c if hook.endswith("_tmastore") else 0, M, N, K, lda)  # lda 0: A dense
    hit = _MAPS.get(key)
    if hit is not None:
        return hit
    from mamba_forge.gpu import tma

    ptrs = {"A": a, "B": b, "C": c}

    dims = {**kern.symbol.constants, "M": M, "N": N, "K": K}
    if lda:  # A's row stride (absent for a dense A: the maps its qualification built, byte for byte)
        dims[tma.A_ROW_STRIDE] = lda
    build_maps = tma.TENSOR_MAP_HOOKS.get(hook)
    if build_maps is None:
        raise LaunchRefused(f"{kern.name}: its record names the tensor-map hook {hook!r}, which "
                            "mamba_forge.gpu.tma does not have (a manifest from another version?)")
    if not on_this_thread(kern.ordinal):  # encoding needs the context current on this thread (kernel.py)
        current_on_this_thread(kern)
    try:
        maps = build_maps(ptrs, {}, dims)
    except tma.TmaError as exc:
        raise LaunchRefused(f"{kern.name}: {exc}") from None
    missing = [b for b in blobs if b not in maps]
    if missing:
        raise LaunchRefused(f"{kern.name}: {hook} built no {', '.join(missing)}")
    if len(_MAPS) >= CACHE_ENTRIES:
        _MAPS.clear()
    out = _MAPS[key] = {b: maps[b] for b in blobs}
    return out


_MAPS: dict[tuple, dict[str, bytes]] = {}  # ((hook, tile), addresses, M, N, K, A's row stride or 0) -> its maps
_lock = threading.Lock()  # inserts into Kernels._gemm_calls


__all__ = ["a_as_read", "gemm", "gemm_dims", "reads_a_in_place"]
