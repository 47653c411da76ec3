"""The base of the driver layer: the cuda-bindings module, result checking, errors and cuInit.

Standard library only at import time; ``cuda.bindings.driver`` is imported on the first call that needs it (it
costs tens of milliseconds, and the runtime loader must import fast on machines that never touch a GPU).
"""

from __future__ import annotations

import functools


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
def bindings():
    """The ``cuda.bindings.driver`` module, imported on first use."""
    from cuda.bindings import driver

    return driver


def result_name(res) -> str:
    return getattr(res, "name", str(res))


def check(call: str, ret):
    """Unpack a driver call's (CUresult, values...) tuple; raise CudaError naming the result on failure."""
    d = bindings()
    res, *rest = ret if isinstance(ret, tuple) else (ret,)
    if res != d.CUresult.CUDA_SUCCESS:
        raise CudaError(call, result_name(res))
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
        ret = bindings().cuInit(0)
    except Exception as exc:  # noqa: BLE001 - no libcuda: the binding raises instead of returning a code
        raise CudaError("cuInit", "CUDA_ERROR_NO_DEVICE", f"driver library not loadable: {exc}") from None
    check("cuInit", ret)
    _initialized = True


def device_count() -> int:
    init()
    return int(check("cuDeviceGetCount", bindings().cuDeviceGetCount()))


def driver_version() -> int:
    init()
    return int(check("cuDriverGetVersion", bindings().cuDriverGetVersion()))


def context_synchronize() -> None:
    """Wait for all work of the current context, the legacy stream's copies included."""
    check("cuCtxSynchronize", bindings().cuCtxSynchronize())
