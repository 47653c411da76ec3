"""Kernel arguments from Python values for the positional launch path.

:func:`typed_params` types them by the symbol's Param records (name and type known):

* pointers: int addresses (unchecked: for power users) or tensors (torch, __cuda_array_interface__, DLPack)
  whose dtype must be the parameter's, in CUDA (or managed) memory of the given device, row-major dense; their
  element count is not checked here (the dims are unknown: the keyword path, runtime/contract.py, checks it);
* scalars: ints for integer types (a float or a bool is refused) within the type's range; ints or floats for
  f32/f64 (an f32 that overflows is refused);
* blobs: bytes-like objects of exactly the parameter's size.

Packing goes through :class:`mamba_forge.gpu.launcher.ParamPacker` (:func:`param_packer`).
"""

from __future__ import annotations

import numbers
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mamba_forge.runtime import tensors
from mamba_forge.runtime.errors import LaunchRefused

if TYPE_CHECKING:
    from mamba_forge.core.schema import Param

# ---- the typed path: Param records ---------------------------------------------------------------------------

INT_RANGES = {"i32": (-(1 << 31), (1 << 31) - 1), "u32": (0, (1 << 32) - 1), "i64": (-(1 << 63), (1 << 63) - 1),
              "u64": (0, (1 << 64) - 1)}
_pack_f32 = struct.Struct("<f").pack


def blob_align(size: int) -> int:
    """Alignment of a by-value blob's buffer: a CUtensorMap (128 bytes) wants 64."""
    return 64 if size >= 64 else 16



def param_packer(params: Sequence[Param]):
    """The one packer of a symbol's recorded parameters (gpu.launcher.ParamPacker, layout computed once)."""
    from mamba_forge.gpu.launcher import ParamPacker  # on first launch: the runtime's import stays light

    return ParamPacker([p.type if p.kind == "scalar" else "ptr" if p.kind == "pointer" else "bytes" for p in params],
                       [p.size if p.kind == "blob" else 0 for p in params],
                       [blob_align(p.size) if p.kind == "blob" else 0 for p in params])

def scalar_value(ptype: str, v, what: str) -> int | float:
    """v checked for a scalar parameter of type ptype (i32/u32/i64/u64/f32/f64), as the int or float to pack."""
    rng = INT_RANGES.get(ptype)
    if rng is not None:
        if type(v) is not int:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                kind = "bool" if isinstance(v, bool) else "float" if isinstance(v, numbers.Real) else type(v).__name__
                raise LaunchRefused(f"{what} is a {kind} ({v!r}); the parameter is {ptype}: pass an int")
            v = int(v)
        if not rng[0] <= v <= rng[1]:
            raise LaunchRefused(f"{what} = {v} does not fit {ptype} ({rng[0]}..{rng[1]})")
        return v
    if type(v) is not float:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            kind = "bool" if isinstance(v, bool) else type(v).__name__
            raise LaunchRefused(f"{what} is a {kind} ({v!r}); the parameter is {ptype}: pass an int or a float")
        try:
            v = float(v)
        except OverflowError:
            raise LaunchRefused(f"{what} = {v} overflows {ptype}") from None
    if ptype == "f32":
        try:
            _pack_f32(v)
        except OverflowError:
            raise LaunchRefused(f"{what} = {v} overflows the f32 parameter") from None
    return v


def check_tensor(info: tensors.TensorInfo, dtype: str, device: int | None, writes: bool, what: str) -> None:
    """The checks a tensor passes in either launch path: memory kind, device, dtype, density, writability."""
    if info.device not in tensors.DEVICE_KINDS_A_KERNEL_READS:
        raise LaunchRefused(f"{what} lives in {info.device} memory; the kernel needs CUDA device memory")
    if device is not None and info.ordinal != device:
        where = "an unknown device" if info.ordinal < 0 else f"device {info.ordinal}"
        raise LaunchRefused(f"{what} is on {where}; the kernels are loaded on device {device}")
    if info.dtype != dtype:
        raise LaunchRefused(f"{what} is {info.dtype}; the parameter is {dtype}")
    if not info.contiguous:
        raise LaunchRefused(f"{what} is not contiguous (row-major dense); pass a contiguous tensor")
    if writes and info.readonly:
        raise LaunchRefused(f"{what} is read-only but the kernel writes it")


def _what(i: int, p: Param, symbol: str) -> str:
    return f"argument {i} ({p.name}) of {symbol}"


def typed_params(params: Sequence[Param], args: Sequence, symbol: str, device: int | None = None,
                 locate=None) -> tuple[list[tuple[str, object]], list[int]]:
    """(type, value) per parameter for driver.PackedParams, and each blob's alignment, typed by Param records.

    device: the ordinal the kernels are loaded on (None: not checked). locate: optional callable address -> device
    ordinal for a tensor that does not say its device (as Contract.bind's). Refusal texts are built only on refusal."""
    if len(args) != len(params):
        raise LaunchRefused(f"{symbol} takes {len(params)} arguments, {len(args)} were given")
    values: list[tuple[str, object]] = []
    aligns = [0] * len(params)
    for i, p in enumerate(params):
        values.append(typed_one(i, p, args[i], symbol, device, locate))
        if p.kind == "blob":
            aligns[i] = blob_align(p.size)
    return values, aligns


def typed_one(i: int, p: Param, a, symbol: str, device: int | None, locate=None) -> tuple[str, object]:
    """(type, value) of argument i for parameter p, after every check; LaunchRefused naming it otherwise."""
    kind = p.kind
    if kind == "scalar":
        ptype = p.type
        rng = INT_RANGES.get(ptype)
        if not (type(a) is int and rng is not None and rng[0] <= a <= rng[1]):
            a = scalar_value(ptype, a, _what(i, p, symbol))
        return ptype, a
    if kind == "pointer":
        if type(a) is int and 0 <= a < 1 << 64:
            return "ptr", a  # a raw address: the power user's, unchecked
        if type(a) in tensors.TORCH_TYPES and a.is_cuda and tensors.TORCH_DTYPE_TOKENS.get(a.dtype) == p.dtype \
                and (device is None or a.get_device() == device) and a.is_contiguous():
            return "ptr", a.data_ptr()  # the torch fast path (no device object, no TensorInfo)
        info = tensors.describe(a, p.name)
        if info is None:
            if isinstance(a, bool):
                raise LaunchRefused(f"{_what(i, p, symbol)} is a bool, not a device pointer")
            if isinstance(a, numbers.Integral):  # numpy ints
                if not 0 <= int(a) < 1 << 64:
                    raise LaunchRefused(f"{_what(i, p, symbol)} = {int(a)} is not a 64-bit device address")
                return "ptr", int(a)
            raise LaunchRefused(f"{_what(i, p, symbol)} of type {type(a).__name__} is neither a tensor nor an "
                                "int address")
        writes = p.role in ("out", "inout", "scratch")
        if info.ordinal < 0 and locate is not None and info.device == "cuda" and device is not None:
            info = info._replace(ordinal=int(locate(info.ptr)))  # the driver says where the address lives
        if (info.dtype != p.dtype or not info.contiguous or info.device not in tensors.DEVICE_KINDS_A_KERNEL_READS
                or (device is not None and info.ordinal != device) or (writes and info.readonly)):
            check_tensor(info, p.dtype, device, writes, _what(i, p, symbol))
        return "ptr", info.ptr
    if not isinstance(a, (bytes, bytearray, memoryview)):
        raise LaunchRefused(f"{_what(i, p, symbol)} is a {type(a).__name__}; the parameter is a "
                            f"{p.size}-byte blob: pass bytes")
    data = a if type(a) is bytes else bytes(a)
    if len(data) != p.size:
        raise LaunchRefused(f"{_what(i, p, symbol)} is {len(data)} bytes; the parameter is {p.size} bytes")
    return "bytes", data


_F32_MAX = 3.4028234663852886e38
_SCALAR, _POINTER, _BLOB = range(3)


def positional_typer(params: Sequence[Param], locate=None):
    """typed_params compiled for one symbol's Params, returning the plain values (ParamPacker.fill's input):
    the common cases (an int in range, a float for f64 or within f32's range, an int address, a CUDA torch tensor
    of the right dtype, device and density, bytes of the exact size) are checked inline from a per-parameter
    plan; everything else goes through typed_one, so every check and refusal text is typed_params'."""
    params = tuple(params)
    plan = []
    for p in params:
        if p.kind == "scalar":
            lo, hi = INT_RANGES.get(p.type, (None, None))
            plan.append((_SCALAR, p.type, lo, hi, p.type == "f32"))
        elif p.kind == "pointer":
            plan.append((_POINTER, p.dtype, 0, 0, False))
        else:
            plan.append((_BLOB, "", p.size, 0, False))
    plan_t, n = tuple(zip(plan, params, strict=True)), len(params)
    torch_types, tokens = tensors.TORCH_TYPES, tensors.TORCH_DTYPE_TOKENS
    ptr_end = 1 << 64

    def typed(args: Sequence, symbol: str, device: int | None) -> list:
        if len(args) != n:
            raise LaunchRefused(f"{symbol} takes {n} arguments, {len(args)} were given")
        out = []
        append = out.append
        i = 0
        for (kind, t, lo, hi, f32), p in plan_t:
            a = args[i]
            ta = type(a)
            if kind == _POINTER:
                if ta is int:
                    if 0 <= a < ptr_end:
                        append(a)
                        i += 1
                        continue
                elif ta in torch_types and a.is_cuda and tokens.get(a.dtype) == t \
                        and (device is None or a.get_device() == device) and a.is_contiguous():
                    append(a.data_ptr())
                    i += 1
                    continue
            elif kind == _SCALAR:
                if lo is not None:
                    if ta is int and lo <= a <= hi:
                        append(a)
                        i += 1
                        continue
                elif ta is float and (not f32 or -_F32_MAX <= a <= _F32_MAX):
                    append(a)
                    i += 1
                    continue
            elif ta is bytes and len(a) == lo:
                append(a)
                i += 1
                continue
            append(typed_one(i, p, a, symbol, device, locate)[1])
            i += 1
        return out

    return typed
