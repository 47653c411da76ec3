"""Describe a tensor argument cheaply: address, dtype token, element count, contiguity, device and owner.

Three ways in, tried per object type (the choice is cached per type):

* torch tensors, duck-typed on ``type(x).__module__`` ("torch", or "torch.*" for subclasses such as
  ``nn.Parameter``): data_ptr(), dtype, numel(), is_contiguous(), device.type/index. torch is never imported;
* ``__cuda_array_interface__`` (CuPy, Numba): typestr, shape, strides, data; the device ordinal from
  ``__dlpack_device__()`` or ``.device.id`` where the object offers one, else -1 (unknown: the caller decides);
* DLPack (JAX, anything else): the capsule is peeked at, never consumed, so the producer keeps ownership.

dtype tokens are the catalog's (f32, f16, bf16, f64, i8, u8, i32, u32, i64, u64) plus i16, u16, bool, c64,
c128 for what a catalog never names (they only appear in refusals). Standard library only.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

from mamba_forge.runtime.errors import LaunchRefused

# DLPack device types (dlpack.h)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
DL_DEVICE_KINDS = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm",
                   13: "cuda_managed"}
DEVICE_KINDS_A_KERNEL_READS = ("cuda", "cuda_managed")  # memory of one device; pinned host memory is refused
_DL_CODES = {0: "i", 1: "u", 2: "f", 4: "bf", 5: "c", 6: "bool"}  # DLDataTypeCode -> token stem
_TORCH_NAMES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int8": "i8",
                "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32", "uint32": "u32", "int64": "i64",
                "uint64": "u64", "bool": "bool", "complex64": "c64", "complex128": "c128"}
_TYPESTR_STEM = {"f": "f", "i": "i", "u": "u", "b": "bool", "c": "c"}


class TensorInfo(NamedTuple):
    ptr: int  # device address of the first element
    dtype: str  # dtype token
    numel: int
    contiguous: bool  # row-major dense (dims of extent 1 may carry any stride)
    device: str  # "cuda", "cuda_managed", "cuda_host", "cpu", ...
    ordinal: int  # device ordinal; -1 when the object does not say
    readonly: bool  # __cuda_array_interface__'s read-only flag
    owner: str  # top-level module of the object's type: "torch", "cupy", "numba", "jax", ...


def _info(*fields) -> TensorInfo:
    return tuple.__new__(TensorInfo, fields)  # skips NamedTuple's Python-level __new__


# ---- DLPack -------------------------------------------------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    # DLManagedTensor starts with a DLTensor; only the DLTensor is read
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dlpack_tensor(obj, what: str) -> tuple[object, DLTensor]:
    """(capsule, its DLTensor): keep the capsule referenced while reading the tensor; it is never consumed."""
    try:
        capsule = obj.__dlpack__()
    except Exception as exc:  # noqa: BLE001 - producers raise many types (BufferError, TypeError, RuntimeError)
        raise LaunchRefused(f"{what} could not export DLPack ({type(exc).__name__}: {exc})") from None
    if not _capsule_valid(capsule, b"dltensor"):
        raise LaunchRefused(f"{what} returned a DLPack capsule that is already consumed or not a 'dltensor'")
    return capsule, DLTensor.from_address(_capsule_get(capsule, b"dltensor"))


def _dense(shape, strides, unit: int) -> bool:
    """Row-major dense: each stride (in `unit`s) is the product of the extents after it; extent-1 dims are free."""
    if strides is None or 0 in shape:
        return True
    want = unit
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def _describe_dlpack(obj, what: str) -> TensorInfo:
    capsule, t = dlpack_tensor(obj, what)
    ndim = t.ndim
    shape = [t.shape[i] for i in range(ndim)]
    strides = [t.strides[i] for i in range(ndim)] if t.strides else None
    numel = _extent(shape, what, "DLPack")
    d = t.dtype
    stem = _DL_CODES.get(d.code, f"code{d.code}_")
    dtype = "bool" if stem == "bool" else f"{stem}{d.bits}"
    if d.lanes != 1:
        dtype += f"x{d.lanes}"
    kind = DL_DEVICE_KINDS.get(t.device.device_type, f"device type {t.device.device_type}")
    ptr = int(t.data or 0) + int(t.byte_offset)
    info = _info(ptr, dtype, numel, _dense(shape, strides, 1), kind, int(t.device.device_id), False, _owner(obj))
    del capsule  # the DLTensor was read while the capsule lived
    return info


def _extent(shape, what: str, via: str) -> int:
    """The element count of an exported shape: ints >= 0 only (a negative extent would pass as a small tensor and
    switch off the size and overlap checks)."""
    if not isinstance(shape, (tuple, list)) or any(type(n) is not int or n < 0 for n in shape):
        raise LaunchRefused(f"{what} has a malformed {via} shape {shape!r} (extents are ints >= 0)")
    numel = 1
    for n in shape:
        numel *= n
    return numel


# ---- __cuda_array_interface__ --------------------------------------------------------------------------------


def _typestr_token(ts: str) -> str:
    stem = _TYPESTR_STEM.get(ts[1:2]) if ts[:1] in "<|" else None
    if stem is None or not ts[2:].isdigit():
        return ts  # big-endian, void ("<V2" for ml_dtypes bf16) or unknown: the raw typestr, never a match
    return stem if stem == "bool" else f"{stem}{int(ts[2:]) * 8}"


def _cai_ordinal(obj) -> int:
    dd = getattr(obj, "__dlpack_device__", None)
    if dd is not None:
        try:
            return int(dd()[1])
        except Exception:  # noqa: BLE001 - an exporter that cannot say: unknown
            return -1
    dev = getattr(obj, "device", None)
    ident = getattr(dev, "id", None)
    return ident if isinstance(ident, int) else -1


def _describe_cai(obj, what: str) -> TensorInfo | None:
    try:
        cai = obj.__cuda_array_interface__
    except (AttributeError, TypeError, RuntimeError):
        return _describe_dlpack(obj, what) if hasattr(obj, "__dlpack__") else None  # torch bf16 raises TypeError
    if not isinstance(cai, dict) or "data" not in cai:
        raise LaunchRefused(f"{what} has a malformed __cuda_array_interface__ (no 'data')")
    if cai.get("mask") is not None:
        raise LaunchRefused(f"{what} is a masked array; pass the dense data")
    data = cai["data"]
    if not (isinstance(data, tuple) and len(data) == 2 and (data[0] is None or type(data[0]) is int)):
        raise LaunchRefused(f"{what} has a malformed __cuda_array_interface__ ('data' is not (address, read-only))")
    ptr, readonly = data
    shape = cai.get("shape", ())
    numel = _extent(shape, what, "__cuda_array_interface__")
    ts = cai.get("typestr", "")
    itemsize = int(ts[2:]) if ts[2:].isdigit() else 0
    dense = _dense(shape, cai.get("strides"), itemsize)
    return _info(int(ptr or 0), _typestr_token(ts), numel, dense, "cuda", _cai_ordinal(obj), bool(readonly),
                 _owner(obj))


# ---- torch ---------------------------------------------------------------------------------------------------

TORCH_DTYPE_TOKENS: dict[object, str] = {}  # torch.dtype -> token, filled on first sight (by torch_dtype)
TORCH_TYPES: set[type] = set()  # the torch tensor types seen: the keyword launch's fast path reads them directly


def torch_dtype(dt) -> str:
    """The token of a torch.dtype (cached by the dtype object)."""
    token = TORCH_DTYPE_TOKENS.get(dt)
    if token is None:
        name = str(dt).rpartition(".")[2]
        token = TORCH_DTYPE_TOKENS[dt] = _TORCH_NAMES.get(name, name)
    return token


def _describe_torch(x, what: str) -> TensorInfo:
    layout = getattr(x, "layout", None)
    if layout is not None and str(layout) != "torch.strided":  # a sparse tensor has no dense data pointer
        raise LaunchRefused(f"{what} is a {str(layout).rpartition('.')[2]} tensor; pass a dense strided one "
                            "(.to_dense())")
    token = TORCH_DTYPE_TOKENS.get(x.dtype) or torch_dtype(x.dtype)
    dev = x.device
    index = dev.index
    return _info(x.data_ptr(), token, x.numel(), x.is_contiguous(), dev.type, -1 if index is None else index,
                 False, "torch")


# ---- dispatch ------------------------------------------------------------------------------------------------


def _owner(obj) -> str:
    return type(obj).__module__.partition(".")[0]


def _not_a_tensor(obj, what: str) -> None:
    return None


def _choose(obj):
    module = type(obj).__module__
    if (module == "torch" or module.startswith("torch.")) and hasattr(obj, "data_ptr"):
        TORCH_TYPES.add(type(obj))
        return _describe_torch
    if hasattr(obj, "__cuda_array_interface__"):
        return _describe_cai
    if hasattr(obj, "__dlpack__"):
        return _describe_dlpack
    return _not_a_tensor


_describers: dict[type, object] = {}


def describe(obj, what: str = "argument") -> TensorInfo | None:
    """The TensorInfo of a tensor-like object, None for anything else (ints, floats, bytes).

    Raises LaunchRefused for a tensor-like object that cannot be read (a failing or consumed DLPack export)."""
    fn = _describers.get(type(obj))
    if fn is None:
        if isinstance(obj, (int, float, bytes, bytearray, memoryview, str)):
            return None  # Python scalars and buffers are never tensors; not cached (subclasses are many)
        fn = _describers[type(obj)] = _choose(obj)
    return fn(obj, what)


__all__ = ["DEVICE_KINDS_A_KERNEL_READS", "DLTensor", "TORCH_TYPES", "TensorInfo", "describe", "dlpack_tensor",
           "torch_dtype"]
