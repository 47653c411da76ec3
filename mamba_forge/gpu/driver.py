"""Small typed wrappers over ``cuda.bindings.driver`` (in the spirit of cuda.core): device, context, modules,
functions, memory, streams, events, graphs and launches with packed parameters.

Standard library + cuda-bindings only: the runtime loader imports this module too. Every failure raises
:class:`CudaError`, whose message names the call and the ``CUresult`` (e.g. ``CUDA_ERROR_ILLEGAL_ADDRESS``).
Device pointers are plain ints.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass


class CudaError(RuntimeError):
    """A driver call failed. `result` is the CUresult name (e.g. CUDA_ERROR_ILLEGAL_ADDRESS)."""

    def __init__(self, call: str, result: str, detail: str = ""):
        self.call, self.result = call, result
        super().__init__(f"{call} failed with {result}" + (f" ({detail})" if detail else ""))


# Results after which the context is unusable: the process must exit and a fresh one continue.
STICKY_RESULTS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_TRAP", "CUDA_ERROR_CONTEXT_IS_DESTROYED",
})


@functools.lru_cache(maxsize=1)
def _drv():
    from cuda.bindings import driver

    return driver


def _name(res) -> str:
    return getattr(res, "name", str(res))


def check(call: str, ret):
    """Unpack a driver call's (CUresult, values...) tuple; raise CudaError naming the result on failure."""
    d = _drv()
    res, *rest = ret if isinstance(ret, tuple) else (ret,)
    if res != d.CUresult.CUDA_SUCCESS:
        raise CudaError(call, _name(res))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


_initialized = False


def init() -> None:
    """cuInit once per process. Without libcuda the binding raises: that becomes a CudaError too."""
    global _initialized
    if _initialized:
        return
    try:
        ret = _drv().cuInit(0)
    except Exception as exc:  # noqa: BLE001 - no libcuda: the binding raises instead of returning a code
        raise CudaError("cuInit", "CUDA_ERROR_NO_DEVICE", f"driver library not loadable: {exc}") from None
    check("cuInit", ret)
    _initialized = True


def device_count() -> int:
    init()
    return int(check("cuDeviceGetCount", _drv().cuDeviceGetCount()))


def driver_version() -> int:
    init()
    return int(check("cuDriverGetVersion", _drv().cuDriverGetVersion()))


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    cc: tuple[int, int]
    sm_count: int
    driver_version: int
    optin_smem: int  # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    smem_per_sm: int
    total_memory: int
    uuid: str

    @property
    def cc_text(self) -> str:
        return f"{self.cc[0]}.{self.cc[1]}"


class Device:
    def __init__(self, ordinal: int = 0):
        init()
        d = _drv()
        n = device_count()
        if not 0 <= ordinal < n:
            raise CudaError("cuDeviceGet", "CUDA_ERROR_INVALID_DEVICE", f"device {ordinal} of {n}")
        self.ordinal = ordinal
        self.handle = check("cuDeviceGet", d.cuDeviceGet(ordinal))
        self._ctx = None

    def attribute(self, name: str) -> int:
        d = _drv()
        attr = getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(check(f"cuDeviceGetAttribute({name})", d.cuDeviceGetAttribute(attr, self.handle)))

    def info(self) -> DeviceInfo:
        d = _drv()
        raw = check("cuDeviceGetName", d.cuDeviceGetName(256, self.handle))
        name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        try:
            uuid = bytes(check("cuDeviceGetUuid", d.cuDeviceGetUuid(self.handle)).bytes).hex()
        except (CudaError, AttributeError, TypeError):
            uuid = ""  # identity only; the qualifier does not depend on it
        return DeviceInfo(
            ordinal=self.ordinal,
            name=name,
            cc=(self.attribute("COMPUTE_CAPABILITY_MAJOR"), self.attribute("COMPUTE_CAPABILITY_MINOR")),
            sm_count=self.attribute("MULTIPROCESSOR_COUNT"),
            driver_version=driver_version(),
            optin_smem=self.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            smem_per_sm=self.attribute("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
            total_memory=int(check("cuDeviceTotalMem", d.cuDeviceTotalMem(self.handle))),
            uuid=uuid,
        )

    def make_current(self) -> None:
        """Retain the primary context and make it current on this thread."""
        d = _drv()
        if self._ctx is None:
            self._ctx = check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(self.handle))
        check("cuCtxSetCurrent", d.cuCtxSetCurrent(self._ctx))

    def synchronize(self) -> None:
        check("cuCtxSynchronize", _drv().cuCtxSynchronize())


# ---- modules and functions -------------------------------------------------------------------------------


class Module:
    """A loaded cubin or PTX image (cuModuleLoadData)."""

    def __init__(self, image: bytes, *, ptx: bool = False):
        d = _drv()
        if ptx and not image.endswith(b"\0"):
            image = image + b"\0"  # the driver reads PTX as a C string
        self._image = image  # keep the bytes alive while loading
        self.handle = check("cuModuleLoadData", d.cuModuleLoadData(image))
        self._functions: dict[str, Function] = {}

    def function(self, name: str) -> Function:
        f = self._functions.get(name)
        if f is None:
            h = check(f"cuModuleGetFunction({name})", _drv().cuModuleGetFunction(self.handle, name.encode()))
            f = self._functions[name] = Function(h, name)
        return f

    def unload(self) -> None:
        if self.handle is not None:
            check("cuModuleUnload", _drv().cuModuleUnload(self.handle))
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
        d = _drv()
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
        d = _drv()
        attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes})", d.cuFuncSetAttribute(self.handle, attr, nbytes))

    def occupancy(self, threads: int, dynamic_smem: int) -> int:
        """Resident blocks per SM at this launch shape (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        return int(check(
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            _drv().cuOccupancyMaxActiveBlocksPerMultiprocessor(self.handle, threads, dynamic_smem),
        ))

    def param_layout(self, max_params: int = 4096) -> list[tuple[int, int]] | None:
        """[(offset, size)] per parameter from cuFuncGetParamInfo; None where the driver lacks it."""
        d = _drv()
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
                raise CudaError(f"cuFuncGetParamInfo({self.name}, {i})", _name(res))
            out.append((int(vals[0]), int(vals[1])))
        return out


# ---- memory -----------------------------------------------------------------------------------------------


def context_synchronize() -> None:
    """Wait for all work of the current context, the legacy stream's copies included."""
    check("cuCtxSynchronize", _drv().cuCtxSynchronize())


def mem_alloc(nbytes: int) -> int:
    return int(check(f"cuMemAlloc({nbytes})", _drv().cuMemAlloc(max(1, nbytes))))


def mem_free(ptr: int) -> None:
    check("cuMemFree", _drv().cuMemFree(ptr))


def memcpy_htod(dst: int, src: bytes | bytearray | memoryview, nbytes: int | None = None) -> None:
    n = len(memoryview(src).cast("B")) if nbytes is None else nbytes
    if n:
        check("cuMemcpyHtoD", _drv().cuMemcpyHtoD(dst, src, n))


def memcpy_dtoh(src: int, nbytes: int) -> bytes:
    buf = bytearray(nbytes)
    if nbytes:
        host = (ctypes.c_char * nbytes).from_buffer(buf)
        check("cuMemcpyDtoH", _drv().cuMemcpyDtoH(ctypes.addressof(host), src, nbytes))
    return bytes(buf)


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes:
        if stream is None:
            check("cuMemcpyDtoD", _drv().cuMemcpyDtoD(dst, src, nbytes))
        else:
            check("cuMemcpyDtoDAsync", _drv().cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle))


def memset_d8(dst: int, value: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes:
        if stream is None:
            check("cuMemsetD8", _drv().cuMemsetD8(dst, value & 0xFF, nbytes))
        else:
            check("cuMemsetD8Async", _drv().cuMemsetD8Async(dst, value & 0xFF, nbytes, stream.handle))


class DeviceBuffer:
    """Owned device memory; free() is idempotent."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = mem_alloc(nbytes)

    def free(self) -> None:
        if self.ptr:
            mem_free(self.ptr)
            self.ptr = 0


# ---- streams, events, graphs ------------------------------------------------------------------------------


class Stream:
    def __init__(self, handle=None, *, owned: bool = True):
        d = _drv()
        if handle is None:
            flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
            handle = check("cuStreamCreate", d.cuStreamCreate(flags))
        self.handle, self._owned = handle, owned

    @classmethod
    def legacy(cls) -> Stream:
        return cls(_drv().CUstream(0), owned=False)

    def synchronize(self) -> None:
        check("cuStreamSynchronize", _drv().cuStreamSynchronize(self.handle))

    def query_done(self) -> bool:
        d = _drv()
        (res,) = d.cuStreamQuery(self.handle)
        if res == d.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check("cuStreamQuery", (res,))
        return True

    def destroy(self) -> None:
        if self._owned and self.handle is not None:
            check("cuStreamDestroy", _drv().cuStreamDestroy(self.handle))
            self.handle = None


class Event:
    def __init__(self, timing: bool = True):
        d = _drv()
        flags = int(d.CUevent_flags.CU_EVENT_DEFAULT if timing else d.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.handle = check("cuEventCreate", d.cuEventCreate(flags))

    def record(self, stream: Stream) -> None:
        check("cuEventRecord", _drv().cuEventRecord(self.handle, stream.handle))

    def synchronize(self) -> None:
        check("cuEventSynchronize", _drv().cuEventSynchronize(self.handle))

    def elapsed_ms(self, later: Event) -> float:
        return float(check("cuEventElapsedTime", _drv().cuEventElapsedTime(self.handle, later.handle)))

    def destroy(self) -> None:
        if self.handle is not None:
            check("cuEventDestroy", _drv().cuEventDestroy(self.handle))
            self.handle = None


class Graph:
    """A stream capture, instantiated for replay."""

    def __init__(self, graph, exec_):
        self.graph, self.exec = graph, exec_

    @classmethod
    def capture(cls, stream: Stream, body) -> Graph:
        d = _drv()
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check("cuStreamBeginCapture", d.cuStreamBeginCapture(stream.handle, mode))
        try:
            body()
        finally:
            graph = check("cuStreamEndCapture", d.cuStreamEndCapture(stream.handle))
        exec_ = check("cuGraphInstantiate", d.cuGraphInstantiate(graph, 0))
        return cls(graph, exec_)

    def launch(self, stream: Stream) -> None:
        check("cuGraphLaunch", _drv().cuGraphLaunch(self.exec, stream.handle))

    def destroy(self) -> None:
        d = _drv()
        if self.exec is not None:
            check("cuGraphExecDestroy", d.cuGraphExecDestroy(self.exec))
            self.exec = None
        if self.graph is not None:
            check("cuGraphDestroy", d.cuGraphDestroy(self.graph))
            self.graph = None


# ---- parameter packing and launch -------------------------------------------------------------------------

# scalar type -> struct format (little-endian), for packing by-value parameters
PACK_FORMATS = {"ptr": "<Q", "i32": "<i", "u32": "<I", "i64": "<q", "u64": "<Q", "f32": "<f", "f64": "<d"}


class PackedParams:
    """Kernel parameters as the driver wants them: a void*[] whose entries point at each value's bytes.

    Each value lives in its own ctypes buffer aligned to 16 bytes (by-value blobs such as a CUtensorMap need
    64: those buffers are over-allocated and offset). Keep the object alive until the launch is enqueued.
    """

    def __init__(self, values: Sequence[tuple[str, object]], blob_align: Sequence[int] | None = None):
        self._bufs = []
        n = len(values)
        self._array = (ctypes.c_void_p * max(1, n))()
        for i, (typ, val) in enumerate(values):
            if typ == "bytes":
                data = bytes(val)  # type: ignore[arg-type]
                align = (blob_align[i] if blob_align else 0) or 16
            else:
                fmt = PACK_FORMATS[typ]
                data = struct.pack(fmt, val)
                align = 16
            raw = ctypes.create_string_buffer(len(data) + align)
            base = ctypes.addressof(raw)
            at = (base + align - 1) // align * align
            ctypes.memmove(at, data, len(data))
            self._bufs.append(raw)
            self._array[i] = at

    @property
    def address(self) -> int:
        return ctypes.addressof(self._array)


def launch(
    fn: Function,
    grid: Sequence[int],
    block: Sequence[int],
    params: PackedParams,
    *,
    smem: int = 0,
    stream: Stream | None = None,
) -> None:
    g = list(grid) + [1] * (3 - len(grid))
    b = list(block) + [1] * (3 - len(block))
    h = stream.handle if stream is not None else _drv().CUstream(0)
    check(
        f"cuLaunchKernel({fn.name})",
        _drv().cuLaunchKernel(fn.handle, g[0], g[1], g[2], b[0], b[1], b[2], smem, h, params.address, 0),
    )


__all__ = [
    "CudaError", "Device", "context_synchronize", "DeviceBuffer", "DeviceInfo", "Event", "Function", "FunctionAttributes", "Graph",
    "Module", "PackedParams", "STICKY_RESULTS", "Stream", "check", "device_count", "driver_version", "init",
    "launch", "mem_alloc", "mem_free", "memcpy_dtod", "memcpy_dtoh", "memcpy_htod", "memset_d8",
]
