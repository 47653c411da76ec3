"""The runtime's GPU backend: the five operations the loader needs, on mamba_forge.gpu's public API.

The loader talks to a backend object only (device_info, activate, load_module, get_function,
set_max_dynamic_smem, launch of packed parameters, and optionally pointer_device: where an address lives), so tests substitute a fake (tests/runtime_support.py). The driver layer is
imported when a CudaBackend is made, not when the runtime is imported: a process that only verifies manifests
never pays for it. Every driver failure becomes a DriverError naming the call and the CUresult.
"""

from __future__ import annotations

from mamba_forge.core.vocab import DeviceInfo
from mamba_forge.runtime.errors import DriverError


class CudaBackend:
    """The GPU, through mamba_forge.gpu.driver. Tests substitute an object with the same methods."""

    def __init__(self):
        from mamba_forge.gpu import driver as cuda

        self.cuda = cuda
        self._devices: dict[int, object] = {}
        self._streams: dict[int, object] = {}  # raw handle -> borrowed driver.Stream

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.cuda.CudaError as exc:
            raise DriverError(str(exc)) from None

    def _device(self, ordinal: int):
        if ordinal not in self._devices:
            self._devices[ordinal] = self._call(self.cuda.Device, ordinal)
        return self._devices[ordinal]

    def device_info(self, ordinal: int) -> DeviceInfo:
        return self._call(self._device(ordinal).info)

    def activate(self, ordinal: int) -> None:
        self._call(self._device(ordinal).make_current)

    def load_module(self, image: bytes):
        return self._call(self.cuda.Module, image)

    def get_function(self, module, name: str):
        return self._call(module.function, name)

    def set_max_dynamic_smem(self, fn, nbytes: int) -> None:
        self._call(fn.set_max_dynamic_smem, nbytes)

    def pointer_device(self, ptr: int) -> int:
        """The device ordinal of the memory at a device address (cuPointerGetAttribute DEVICE_ORDINAL): how an
        array that exposes only __cuda_array_interface__, without saying its device (Numba), is located; -1 when
        the driver does not know the address (host memory, a freed or foreign pointer)."""
        from mamba_forge.gpu import core

        d = core.bindings()
        try:
            return int(core.check("cuPointerGetAttribute(DEVICE_ORDINAL)", d.cuPointerGetAttribute(
                d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d.CUdeviceptr(int(ptr)))))
        except self.cuda.CudaError:
            return -1

    def launch(self, fn, grid, block, params, shared_mem: int, stream: int, pdl: bool = False) -> None:
        """Launch on the raw stream handle; params: packed once by the caller (anything with ``.address``, the
        void** kernelParams: launcher.Packed or PackedParams), kept referenced until this returns. pdl: with
        programmatic dependent launch (Kernel.pdl_max_blocks decides)."""
        s = self._streams.get(stream)
        if s is None:
            if len(self._streams) >= 64:  # bounded: handles of destroyed streams do not pile up
                self._streams.clear()
            s = self._streams[stream] = self.cuda.Stream.wrap(stream)
        try:
            self.cuda.launch(fn, grid, block, params, smem=shared_mem, stream=s, pdl=pdl)
        except self.cuda.CudaError as exc:
            raise DriverError(str(exc)) from None
