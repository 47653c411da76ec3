"""Kernel arguments from Python values, typed by the symbol's recorded parameter layout ([offset, size] each).

* device pointers: ints, objects with ``__cuda_array_interface__`` (CuPy, Numba, torch except bf16) or
  ``__dlpack__`` (torch, CuPy, JAX); host memory is refused;
* scalars: Python or NumPy ints and floats, typed by the parameter's size (4 bytes: i32/u32/f32, 8 bytes:
  i64/u64/f64); a value that does not fit is refused;
* by-value blobs (e.g. a 128-byte CUtensorMap): bytes-like objects of exactly the parameter's size.

Packing goes through :class:`mamba_forge.gpu.driver.PackedParams`.
"""

from __future__ import annotations

import ctypes
import numbers
import struct
from collections.abc import Sequence

from mamba_forge.runtime.errors import LaunchRefused

# DLPack device types (dlpack.h): memory a kernel can read
_DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 2, 3, 13
_DL_NAMES = {1: "host (CPU)", 2: "CUDA", 3: "CUDA pinned host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 10: "ROCm",
             13: "CUDA managed"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    # DLManagedTensor starts with a DLTensor; only the fields up to byte_offset are read
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
        ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64),
    ]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_pointer(obj, what: str) -> int:
    """Peek at a DLPack capsule without consuming it: the producer keeps ownership of the memory."""
    try:
        capsule = obj.__dlpack__()
    except Exception as exc:  # noqa: BLE001 - producers raise many types (BufferError, TypeError, RuntimeError)
        raise LaunchRefused(f"{what} could not export DLPack ({type(exc).__name__}: {exc})") from None
    if not _capsule_valid(capsule, b"dltensor"):
        raise LaunchRefused(f"{what} returned a DLPack capsule that is already consumed or not a 'dltensor'")
    t = _DLTensor.from_address(_capsule_get(capsule, b"dltensor"))
    kind = t.device.device_type
    if kind not in (_DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED):
        raise LaunchRefused(f"{what} lives in {_DL_NAMES.get(kind, f'device type {kind}')} memory, not CUDA memory")
    return int(t.data or 0) + int(t.byte_offset)


def device_pointer(obj, what: str = "argument") -> int:
    """A device address from an int, a __cuda_array_interface__ object or a DLPack producer."""
    if isinstance(obj, bool):
        raise LaunchRefused(f"{what} is a bool, not a device pointer")
    if isinstance(obj, numbers.Integral):
        v = int(obj)
        if not 0 <= v < 1 << 64:
            raise LaunchRefused(f"{what} = {v} is not a 64-bit device address")
        return v
    try:
        cai = obj.__cuda_array_interface__
    except (AttributeError, TypeError, RuntimeError):
        cai = None  # torch raises TypeError for bf16 tensors: fall through to DLPack
    if isinstance(cai, dict) and "data" in cai:
        return int(cai["data"][0])
    if hasattr(obj, "__dlpack__"):
        return _dlpack_pointer(obj, what)
    raise LaunchRefused(
        f"{what} of type {type(obj).__name__} is neither an int address, a __cuda_array_interface__ object nor DLPack"
    )


def _is_array_like(obj) -> bool:
    return hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__")


def typed_values(layout: Sequence[Sequence[int]], args: Sequence, symbol: str) -> tuple[list[tuple[str, object]], list[int]]:
    """(type, value) per parameter for driver.PackedParams, and each by-value blob's alignment."""
    if len(args) != len(layout):
        raise LaunchRefused(f"{symbol} takes {len(layout)} arguments, {len(args)} were given")
    values: list[tuple[str, object]] = []
    aligns: list[int] = []
    for i, ((offset, size), a) in enumerate(zip(layout, args, strict=True)):
        what = f"argument {i} of {symbol}"
        aligns.append(0)
        if isinstance(a, (bytes, bytearray, memoryview)):
            data = bytes(a)
            if len(data) != size:
                raise LaunchRefused(f"{what} is {len(data)} bytes; the parameter is {size} bytes")
            values.append(("bytes", data))
            aligns[-1] = 64 if size >= 64 else 16  # a CUtensorMap (128 bytes) wants 64-byte alignment
            continue
        if _is_array_like(a):
            if size != 8:
                raise LaunchRefused(f"{what} is an array but the parameter is {size} bytes, not a pointer")
            values.append(("ptr", device_pointer(a, what)))
            continue
        if isinstance(a, bool):
            raise LaunchRefused(f"{what} is a bool; pass 0 or 1 explicitly")
        if isinstance(a, numbers.Integral):
            v = int(a)
            if size == 4:
                if not -(1 << 31) <= v < 1 << 32:
                    raise LaunchRefused(f"{what} = {v} does not fit the 4-byte parameter")
                values.append(("i32" if v < 0 else "u32", v))
            elif size == 8:
                if not -(1 << 63) <= v < 1 << 64:
                    raise LaunchRefused(f"{what} = {v} does not fit the 8-byte parameter")
                values.append(("i64" if v < 0 else "u64", v))
            else:
                raise LaunchRefused(f"{what} is an integer but the parameter is {size} bytes")
            continue
        if isinstance(a, numbers.Real):
            v = float(a)
            if size == 4:
                try:
                    struct.pack("<f", v)
                except OverflowError:
                    raise LaunchRefused(f"{what} = {v} overflows the f32 parameter") from None
                values.append(("f32", v))
            elif size == 8:
                values.append(("f64", v))
            else:
                raise LaunchRefused(f"{what} is a float but the parameter is {size} bytes")
            continue
        raise LaunchRefused(f"{what} of type {type(a).__name__} cannot be passed (offset {offset}, {size} bytes)")
    return values, aligns
