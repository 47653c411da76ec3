"""Small typed wrappers over ``cuda.bindings.driver`` (in the spirit of cuda.core), and the namespace every
GPU caller imports: ``from mamba_forge.gpu import driver as cu``.

Here: devices and their primary contexts, modules and functions, memory, streams. Re-exported from the rest of
the layer: errors, cuInit and result checking (:mod:`mamba_forge.gpu.core`), events and graphs
(:mod:`mamba_forge.gpu.graph`), parameter packing and the one launch path (:mod:`mamba_forge.gpu.launcher`).
Callers (and tests that stand in for the GPU) reach them as ``cu.launch``, ``cu.Graph``...

Standard library + cuda-bindings only: the runtime backend imports this module too. Every failure raises
:class:`CudaError`, whose message names the call and the ``CUresult`` (e.g. ``CUDA_ERROR_ILLEGAL_ADDRESS``).
Device pointers are plain ints.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from mamba_forge.core.vocab import ComputeCapability, DeviceInfo
from mamba_forge.gpu.core import (
    STICKY_RESULTS,
    CudaError,
    bindings,
    check,
    context_synchronize,
    device_count,
    driver_version,
    init,
    result_name,
)
from mamba_forge.gpu.graph import Event, Graph
from mamba_forge.gpu.launcher import PACK_FORMATS, PackedParams, launch


class Device:
    def __init__(self, ordinal: int = 0):
        init()
        d = bindings()
        n = device_count()
        if not 0 <= ordinal < n:
            raise CudaError("cuDeviceGet", "CUDA_ERROR_INVALID_DEVICE", f"device {ordinal} of {n}")
        self.ordinal = ordinal
        self.handle = check("cuDeviceGet", d.cuDeviceGet(ordinal))
        self._ctx = None

    def attribute(self, name: str) -> int:
        d = bindings()
        attr = getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(check(f"cuDeviceGetAttribute({name})", d.cuDeviceGetAttribute(attr, self.handle)))

    def info(self) -> DeviceInfo:
        d = bindings()
        raw = check("cuDeviceGetName", d.cuDeviceGetName(256, self.handle))
        name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        try:
            uuid = bytes(check("cuDeviceGetUuid", d.cuDeviceGetUuid(self.handle)).bytes).hex()
        except (CudaError, AttributeError, TypeError):
            uuid = ""  # identity only; the qualifier does not depend on it
        return DeviceInfo(
            ordinal=self.ordinal,
            name=name,
            cc=ComputeCapability(self.attribute("COMPUTE_CAPABILITY_MAJOR"), self.attribute("COMPUTE_CAPABILITY_MINOR")),
            sm_count=self.attribute("MULTIPROCESSOR_COUNT"),
            driver_version=driver_version(),
            optin_smem=self.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            smem_per_sm=self.attribute("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
            total_memory=int(check("cuDeviceTotalMem", d.cuDeviceTotalMem(self.handle))),
            uuid=uuid,
        )

    def make_current(self) -> None:
        """Retain the primary context and make it current on this thread."""
        d = bindings()
        if self._ctx is None:
            self._ctx = check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(self.handle))
        check("cuCtxSetCurrent", d.cuCtxSetCurrent(self._ctx))

    def synchronize(self) -> None:
        check("cuCtxSynchronize", bindings().cuCtxSynchronize())


# ---- modules and functions -------------------------------------------------------------------------------


class Module:
    """A loaded cubin or PTX image (cuModuleLoadData)."""

    def __init__(self, image: bytes, *, ptx: bool = False):
        d = bindings()
        if ptx and not image.endswith(b"\0"):
            image = image + b"\0"  # the driver reads PTX as a C string
        self._image = image  # keep the bytes alive while loading
        self.handle = check("cuModuleLoadData", d.cuModuleLoadData(image))
        self._functions: dict[str, Function] = {}

    def function(self, name: str) -> Function:
        f = self._functions.get(name)
        if f is None:
            h = check(f"cuModuleGetFunction({name})", bindings().cuModuleGetFunction(self.handle, name.encode()))
            f = self._functions[name] = Function(h, name)
        return f

    def unload(self) -> None:
        if self.handle is not None:
            check("cuModuleUnload", bindings().cuModuleUnload(self.handle))
            self.handle = None


@dataclass(frozen=True)
class FunctionAttributes:
    registers: int
    static_smem: int
    local_bytes: int
    max_threads: int
    const_bytes: int
    ptx_version: int
    binary_version: int


class Function:
    def __init__(self, handle, name: str):
        self.handle, self.name = handle, name

    def attribute(self, name: str) -> int:
        d = bindings()
        attr = getattr(d.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return int(check(f"cuFuncGetAttribute({name})", d.cuFuncGetAttribute(attr, self.handle)))

    def attributes(self) -> FunctionAttributes:
        return FunctionAttributes(
            registers=self.attribute("NUM_REGS"),
            static_smem=self.attribute("SHARED_SIZE_BYTES"),
            local_bytes=self.attribute("LOCAL_SIZE_BYTES"),
            max_threads=self.attribute("MAX_THREADS_PER_BLOCK"),
            const_bytes=self.attribute("CONST_SIZE_BYTES"),
            ptx_version=self.attribute("PTX_VERSION"),
            binary_version=self.attribute("BINARY_VERSION"),
        )

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        d = bindings()
        attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes})", d.cuFuncSetAttribute(self.handle, attr, nbytes))

    def occupancy(self, threads: int, dynamic_smem: int) -> int:
        """Resident blocks per SM at this launch shape (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        return int(check(
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            bindings().cuOccupancyMaxActiveBlocksPerMultiprocessor(self.handle, threads, dynamic_smem),
        ))

    def param_layout(self, max_params: int = 4096) -> list[tuple[int, int]] | None:
        """[(offset, size)] per parameter from cuFuncGetParamInfo; None where the driver lacks it."""
        d = bindings()
        if not hasattr(d, "cuFuncGetParamInfo"):
            return None
        out: list[tuple[int, int]] = []
        for i in range(max_params):
            res, *vals = d.cuFuncGetParamInfo(self.handle, i)
            if res == d.CUresult.CUDA_ERROR_INVALID_VALUE:  # past the last parameter
                break
            if res == d.CUresult.CUDA_ERROR_NOT_SUPPORTED:
                return None
            if res != d.CUresult.CUDA_SUCCESS:
                raise CudaError(f"cuFuncGetParamInfo({self.name}, {i})", result_name(res))
            out.append((int(vals[0]), int(vals[1])))
        return out


# ---- memory -----------------------------------------------------------------------------------------------


def mem_alloc(nbytes: int) -> int:
    return int(check(f"cuMemAlloc({nbytes})", bindings().cuMemAlloc(max(1, nbytes))))


def mem_free(ptr: int) -> None:
    check("cuMemFree", bindings().cuMemFree(ptr))


def memcpy_htod(dst: int, src: bytes | bytearray | memoryview, nbytes: int | None = None) -> None:
    n = len(memoryview(src).cast("B")) if nbytes is None else nbytes
    if n:
        check("cuMemcpyHtoD", bindings().cuMemcpyHtoD(dst, src, n))


def memcpy_dtoh(src: int, nbytes: int) -> bytes:
    buf = bytearray(nbytes)
    if nbytes:
        host = (ctypes.c_char * nbytes).from_buffer(buf)
        check("cuMemcpyDtoH", bindings().cuMemcpyDtoH(ctypes.addressof(host), src, nbytes))
    return bytes(buf)


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes:
        if stream is None:
            check("cuMemcpyDtoD", bindings().cuMemcpyDtoD(dst, src, nbytes))
        else:
            check("cuMemcpyDtoDAsync", bindings().cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle))


def memset_d8(dst: int, value: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes:
        if stream is None:
            check("cuMemsetD8", bindings().cuMemsetD8(dst, value & 0xFF, nbytes))
        else:
            check("cuMemsetD8Async", bindings().cuMemsetD8Async(dst, value & 0xFF, nbytes, stream.handle))


class DeviceBuffer:
    """Owned device memory; free() is idempotent."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = mem_alloc(nbytes)

    def free(self) -> None:
        if self.ptr:
            mem_free(self.ptr)
            self.ptr = 0


# ---- streams ----------------------------------------------------------------------------------------------


class Stream:
    """A CUDA stream: created here (non-blocking, destroyed by destroy()) or borrowed from another library."""

    def __init__(self, handle=None, *, owned: bool = True):
        d = bindings()
        if handle is None:
            flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
            handle = check("cuStreamCreate", d.cuStreamCreate(flags))
        self.handle, self._owned = handle, owned

    @classmethod
    def wrap(cls, handle: int) -> Stream:
        """Borrow a stream by its raw handle (torch's ``cuda_stream``, CuPy's ``ptr``); 0 is the legacy stream."""
        if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
            raise TypeError(f"a stream handle is a non-negative int, not {handle!r}")
        return cls(bindings().CUstream(handle), owned=False)

    @classmethod
    def legacy(cls) -> Stream:
        return cls.wrap(0)

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, raw handle): how the runtime's launch() and cuda.core read a
        stream. The handle is int(CUstream); CUstream.getPtr() is the address of the binding's storage."""
        return (0, int(self.handle))

    def synchronize(self) -> None:
        check("cuStreamSynchronize", bindings().cuStreamSynchronize(self.handle))

    def query_done(self) -> bool:
        d = bindings()
        (res,) = d.cuStreamQuery(self.handle)
        if res == d.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check("cuStreamQuery", (res,))
        return True

    def destroy(self) -> None:
        if self._owned and self.handle is not None:
            check("cuStreamDestroy", bindings().cuStreamDestroy(self.handle))
            self.handle = None


__all__ = [
    "CudaError", "Device", "DeviceBuffer", "DeviceInfo", "Event", "Function", "FunctionAttributes", "Graph",
    "Module", "PACK_FORMATS", "PackedParams", "STICKY_RESULTS", "Stream", "bindings", "check",
    "context_synchronize", "device_count", "driver_version", "init", "launch", "mem_alloc", "mem_free",
    "memcpy_dtod", "memcpy_dtoh", "memcpy_htod", "memset_d8", "result_name",
]
