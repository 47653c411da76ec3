"""The driver layer on CPU (no libcuda here): parameter packing as the driver reads it, its refusals, stream
handles, the launch path's argument checks, errors naming the CUDA result, the runtime backend on the public
API, and the GPU tests' argument conversion (tests/gpu_support.py)."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from mamba_forge.core.vocab import ComputeCapability, DeviceInfo
from mamba_forge.gpu import driver as cu
from mamba_forge.runtime.backend import CudaBackend
from mamba_forge.runtime.errors import DriverError


def _read(params: cu.PackedParams, sizes: list[int]) -> list[bytes]:
    arr = (ctypes.c_void_p * len(sizes)).from_address(params.address)
    return [ctypes.string_at(arr[i], n) for i, n in enumerate(sizes)]


def _addresses(params: cu.PackedParams, n: int) -> list[int]:
    return list((ctypes.c_void_p * n).from_address(params.address))


def test_every_scalar_type_packs_little_endian_16_aligned():
    values = [("ptr", 0x7F0000001000), ("i32", -3), ("u32", 0xFFFFFFFF), ("i64", -(1 << 40)), ("u64", 1 << 63),
              ("f32", 1.5), ("f64", -2.25)]
    pp = cu.PackedParams(values)
    assert len(pp) == 7
    want = [struct.pack(cu.PACK_FORMATS[t], v) for t, v in values]
    assert _read(pp, [len(w) for w in want]) == want
    assert all(a % 16 == 0 for a in _addresses(pp, 7))


def test_blobs_take_their_alignment_and_default_to_16():
    blob = bytes(range(48))
    pp = cu.PackedParams([("bytes", blob), ("bytes", bytearray(blob[:8])), ("i32", 1)], [128, 0, 0])
    a = _addresses(pp, 3)
    assert a[0] % 128 == 0 and a[1] % 16 == 0
    assert _read(pp, [48, 8]) == [blob, blob[:8]]


def test_no_parameters_is_a_valid_array():
    assert cu.PackedParams([]).address != 0


@pytest.mark.parametrize(
    ("values", "aligns", "error", "match"),
    [
        ([("i128", 1)], None, ValueError, "unknown type 'i128'"),
        ([("i32", 1 << 31)], None, ValueError, "does not fit i32"),
        ([("u32", -1)], None, ValueError, "does not fit u32"),
        ([("f32", "x")], None, ValueError, "does not fit f32"),
        ([("bytes", 5)], None, TypeError, "takes bytes, not int"),
        ([("bytes", b"\0" * 8)], [48], ValueError, "not a power of two"),
        ([("i32", 1), ("i32", 2)], [0], ValueError, "1 alignments for 2 parameters"),
    ],
)
def test_packing_refusals(values, aligns, error, match):
    with pytest.raises(error, match=match):
        cu.PackedParams(values, aligns)


def test_launch_refuses_a_shape_before_the_driver():
    fn = cu.Function(handle=None, name="k")
    with pytest.raises(ValueError, match="grid must have 1 to 3 dimensions"):
        cu.launch(fn, (1, 1, 1, 1), (32,), cu.PackedParams([]))
    with pytest.raises(ValueError, match="block must have 1 to 3 dimensions"):
        cu.launch(fn, (1,), (), cu.PackedParams([]))


def test_borrowed_streams_keep_their_handle():
    s = cu.Stream.wrap(0x5150)
    assert s.__cuda_stream__() == (0, 0x5150) and int(s.handle) == 0x5150
    assert cu.Stream.legacy().__cuda_stream__() == (0, 0)
    s.destroy()  # borrowed: nothing to destroy, the handle stays
    assert int(s.handle) == 0x5150
    for bad in (-1, True, "0", 1.0):
        with pytest.raises(TypeError, match="non-negative int"):
            cu.Stream.wrap(bad)


def test_no_driver_is_a_cuda_error_naming_the_result():
    try:
        cu.device_count()
    except cu.CudaError as exc:
        assert exc.call == "cuInit" and exc.result == "CUDA_ERROR_NO_DEVICE" and "cuInit failed with" in str(exc)
    else:
        pytest.skip("a CUDA driver is present")


def test_check_names_the_failing_result():
    d = cu.bindings()
    assert cu.check("cuX", (d.CUresult.CUDA_SUCCESS, 7)) == 7
    assert cu.check("cuX", (d.CUresult.CUDA_SUCCESS,)) is None
    with pytest.raises(cu.CudaError, match=r"cuModuleGetFunction\(k\) failed with CUDA_ERROR_NOT_FOUND"):
        cu.check("cuModuleGetFunction(k)", (d.CUresult.CUDA_ERROR_NOT_FOUND,))


# ---- the runtime backend on the public API -----------------------------------------------------------------


class _Device:
    def __init__(self, ordinal):
        if ordinal:
            raise cu.CudaError("cuDeviceGet", "CUDA_ERROR_INVALID_DEVICE", f"device {ordinal} of 1")
        self.current = False

    def info(self):
        return cu.DeviceInfo(0, "NVIDIA H200", (9, 0), 132, 13000, 232448, 233472, 1 << 37, "")

    def make_current(self):
        self.current = True


def test_backend_translates_devices_launches_and_errors(monkeypatch):
    launched = []

    def fake_launch(fn, grid, block, params, *, smem=0, stream=None, pdl=False):
        launched.append((fn, grid, block, _read(params, [8, 4, 128]), _addresses(params, 3)[2] % 64, smem,
                         stream.__cuda_stream__(), pdl))
        if smem > 1024:
            raise cu.CudaError("cuLaunchKernel(k)", "CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(cu, "Device", _Device)
    monkeypatch.setattr(cu, "launch", fake_launch)
    b = CudaBackend()
    info = b.device_info(0)  # the driver layer's record itself: one DeviceInfo for the qualifier and the loader
    assert info == DeviceInfo(0, "NVIDIA H200", ComputeCapability(9, 0), 132, 13000, 232448, 233472, 1 << 37, "")
    assert info.cc == (9, 0) and (info.cc.major, info.cc.text, info.cc.number, info.cc_text) == (9, "9.0", 90, "9.0")
    b.activate(0)
    with pytest.raises(DriverError, match="CUDA_ERROR_INVALID_DEVICE"):
        b.device_info(1)
    blob = bytes(range(128))
    values = [("ptr", 0x1000), ("i32", 7), ("bytes", blob)]
    b.launch("k", (2, 1, 1), (128, 1, 1), cu.PackedParams(values, [0, 0, 64]), 512, 0x77)  # packed once, by the caller
    assert launched[-1] == ("k", (2, 1, 1), (128, 1, 1), [struct.pack("<Q", 0x1000), struct.pack("<i", 7), blob], 0,
                            512, (0, 0x77), False)
    b.launch("k", (2, 1, 1), (128, 1, 1), cu.PackedParams(values, [0, 0, 64]), 512, 0x77, pdl=True)
    assert launched[-1][-1] is True  # programmatic dependent launch reaches the driver layer
    with pytest.raises(DriverError, match=r"cuLaunchKernel\(k\) failed with CUDA_ERROR_INVALID_VALUE"):
        b.launch("k", (1, 1, 1), (128, 1, 1), cu.PackedParams(values, [0, 0, 64]), 4096, 0)


# ---- the GPU tests' argument conversion ----------------------------------------------------------------------


class _DeviceArray:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (4,), "typestr": "<f4", "version": 3}


def test_gpu_support_converts_arguments():
    import gpu_support as G

    got = [G.kernel_param(a) for a in (_DeviceArray(0x7F00), np.int32(-1), np.uint32(5), np.int64(1 << 40),
                                       np.uint64(0), np.float32(0.5), np.float64(2.0), b"\x01" * 4, ("i32", 9))]
    assert got == [("ptr", 0x7F00), ("i32", -1), ("u32", 5), ("i64", 1 << 40), ("u64", 0), ("f32", 0.5),
                   ("f64", 2.0), ("bytes", b"\x01" * 4), ("i32", 9)]
    class TorchCudaTensor:
        is_cuda = True

        def data_ptr(self):
            return 0x7F10

    class TorchHostTensor(TorchCudaTensor):
        is_cuda = False

    assert G.kernel_param(TorchCudaTensor()) == ("ptr", 0x7F10)
    for bad, match in ((TorchHostTensor(), "pass a device array"), (3, "pass a device array"), (1.0, "pass a device array"), (np.int8(1), "NumPy int8"),
                       (np.zeros(2), "pass a device array")):
        with pytest.raises(TypeError, match=match):
            G.kernel_param(bad)
    pp = G.pack([b"\x02" * 128, np.int32(3)])
    assert _addresses(pp, 2)[0] % 64 == 0 and _read(pp, [128, 4]) == [b"\x02" * 128, struct.pack("<i", 3)]


def test_gpu_support_reads_streams():
    import gpu_support as G

    class TorchLike:
        cuda_stream = 0x11

    class CupyLike:
        ptr = 0x22

    own = cu.Stream.wrap(0x33)
    assert G.as_stream(None) is None and G.as_stream(own) is own
    assert [G.as_stream(s).__cuda_stream__()[1] for s in (TorchLike(), CupyLike(), 0x44)] == [0x11, 0x22, 0x44]
    with pytest.raises(TypeError, match="is not a CUDA stream"):
        G.as_stream(object())
