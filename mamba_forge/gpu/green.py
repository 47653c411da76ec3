"""Green contexts (a stream whose kernels run on a subset of the SMs; driver API, CUDA >= 12.4) and mapped host
memory (a flag the host writes while a kernel spins on it). Used by the qualifier's placement check.

    part = green.partition(device, 16)     # GreenPartition(sm_count=16, stream=...), or raises GreenUnavailable
    flag = green.MappedInts(2)             # .host[i] on the host, .device_ptr for a kernel
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from mamba_forge.gpu.core import CudaError, bindings, check, driver_version

GREEN_MIN_DRIVER = 12040  # cuGreenCtxCreate and cuGreenCtxStreamCreate: CUDA 12.4


class GreenUnavailable(Exception):
    """No green context here (old driver or bindings, or the driver refused the split); the reason says which."""


@dataclass
class GreenPartition:
    sm_count: int  # the SMs the driver actually gave (a split rounds the request to its granularity)
    requested: int
    green_ctx: object
    context: object  # cuCtxFromGreenCtx: pushed current while work is enqueued on `stream`
    stream: object  # a mamba_forge.gpu.driver.Stream (not owned: destroyed by close())

    def push(self) -> None:
        check("cuCtxPushCurrent(green)", bindings().cuCtxPushCurrent(self.context))

    def pop(self) -> None:
        check("cuCtxPopCurrent(green)", bindings().cuCtxPopCurrent())

    def close(self) -> None:
        d = bindings()
        if self.stream is not None:
            d.cuStreamDestroy(self.stream.handle)  # best effort at teardown
            self.stream = None
        if self.green_ctx is not None:
            d.cuGreenCtxDestroy(self.green_ctx)
            self.green_ctx = None


def partition(device_handle, sm_count: int) -> GreenPartition:
    """A green context holding at least `sm_count` SMs of the device (one group of cuDevSmResourceSplitByCount)
    and a non-blocking stream in it. Raises GreenUnavailable with the reason where that cannot be had."""
    from mamba_forge.gpu.driver import Stream

    d = bindings()
    if not hasattr(d, "cuGreenCtxCreate") or not hasattr(d, "cuDevSmResourceSplitByCount"):
        raise GreenUnavailable("the cuda-bindings here lack cuGreenCtxCreate")
    drv = driver_version()
    if drv < GREEN_MIN_DRIVER:
        raise GreenUnavailable(f"driver {drv} < {GREEN_MIN_DRIVER} (green contexts need CUDA 12.4)")
    try:
        whole = check("cuDeviceGetDevResource(SM)",
                      d.cuDeviceGetDevResource(device_handle, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        if sm_count >= int(whole.sm.smCount):
            raise GreenUnavailable(f"{sm_count} SMs requested of {int(whole.sm.smCount)}")
        groups, made, _remainder = check(f"cuDevSmResourceSplitByCount({sm_count})",
                                         d.cuDevSmResourceSplitByCount(1, whole, 0, sm_count))
        if int(made) < 1:
            raise GreenUnavailable(f"the driver made no group of {sm_count} SMs")
        group = groups[0]
        desc = check("cuDevResourceGenerateDesc", d.cuDevResourceGenerateDesc([group], 1))
        gctx = check("cuGreenCtxCreate",
                     d.cuGreenCtxCreate(desc, device_handle, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
        try:
            context = check("cuCtxFromGreenCtx", d.cuCtxFromGreenCtx(gctx))
            flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
            handle = check("cuGreenCtxStreamCreate", d.cuGreenCtxStreamCreate(gctx, flags, 0))
        except BaseException:
            d.cuGreenCtxDestroy(gctx)
            raise
    except CudaError as exc:
        raise GreenUnavailable(str(exc)) from None
    return GreenPartition(int(group.sm.smCount), sm_count, gctx, context, Stream(handle, owned=False))


class MappedInts:
    """`n` int32 in page-locked host memory mapped into the device: the host reads and writes them through
    `host` while a kernel polls or bumps them through `device_ptr` (volatile accesses, system-scope fences)."""

    def __init__(self, n: int):
        d = bindings()
        self.n = n
        flags = d.CU_MEMHOSTALLOC_DEVICEMAP if hasattr(d, "CU_MEMHOSTALLOC_DEVICEMAP") else 0x02
        self._ptr = int(check(f"cuMemHostAlloc({4 * n})", d.cuMemHostAlloc(4 * n, flags)))
        self.host = (ctypes.c_int32 * n).from_address(self._ptr)
        for i in range(n):
            self.host[i] = 0
        self.device_ptr = int(check("cuMemHostGetDevicePointer", d.cuMemHostGetDevicePointer(self._ptr, 0)))

    def free(self) -> None:
        if self._ptr:
            check("cuMemFreeHost", bindings().cuMemFreeHost(self._ptr))
            self._ptr = 0


__all__ = ["GREEN_MIN_DRIVER", "GreenPartition", "GreenUnavailable", "MappedInts", "partition"]
