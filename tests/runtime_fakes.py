"""Fake tensors and launch-contract records for the runtime contract tests and the launch-overhead benchmark (CPU).

FakeTorchTensor mimics a torch tensor (its class's __module__ is "torch"), FakeCAI a CuPy/Numba array
(__cuda_array_interface__), FakeDLPack a DLPack producer whose capsule points at a real DLTensor. The records
are RuntimeSymbols shaped like the catalog families they are named after (kernels/fixed/*.toml, sm90a/wgmma.toml).
"""

from __future__ import annotations

import ctypes
import functools
import itertools

from mamba_forge.core.schema import Param, RuntimeSymbol
from mamba_forge.runtime.tensors import DLDataType, DLDevice, DLTensor

TORCH_NAMES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i32": "int32",
               "i64": "int64", "u8": "uint8", "i8": "int8", "u32": "uint32", "u64": "uint64"}
SIZES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "u8": 1, "i8": 1, "u32": 4, "u64": 8}
_addresses = itertools.count(0x7F00_0000_0000, 1 << 36)  # 64 GiB apart: fakes never overlap


class FakeDType:
    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


TORCH_DTYPES = {tok: FakeDType(name) for tok, name in TORCH_NAMES.items()}


class FakeDevice:
    def __init__(self, type_: str, index: int | None):
        self.type, self.index = type_, index


class FakeTorchTensor:
    def __init__(self, numel: int, dtype: str = "f32", *, device: tuple[str, int | None] = ("cuda", 0),
                 contiguous: bool = True, ptr: int | None = None):
        self._numel, self.dtype, self.device = numel, TORCH_DTYPES[dtype], FakeDevice(*device)
        self._contiguous, self._ptr = contiguous, next(_addresses) if ptr is None else ptr
        self.is_cuda = device[0] == "cuda"
        self._strides: tuple[int, ...] | None = None  # None: dense (a non-contiguous one: column-gapped)
        self._storage: int | None = None  # elements of storage from the first element (None: exactly the extent)

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return self._numel

    def is_contiguous(self) -> bool:
        return self._contiguous

    def get_device(self) -> int:
        return self.device.index if self.is_cuda else -1

    # ---- what runtime/gemm.py asks of a torch tensor beyond the contract's checks: shape, allocation, casts ----
    @classmethod
    def matrix(cls, *shape: int, dtype: str = "f32", strides: tuple[int, ...] | None = None,
               storage: int | None = None, **kw) -> FakeTorchTensor:
        """A tensor of this shape; strides (elements) make a view of a wider buffer (contiguous as torch says: every
        dim of extent > 1 dense), storage the elements its storage holds from the first element (None: its extent)."""
        t = cls(int(np_prod(shape)), dtype, **kw)
        t.shape = tuple(shape)
        if strides is not None:
            t._strides = tuple(strides)
            want, dense = 1, True
            for n, s in zip(reversed(t.shape), reversed(t._strides), strict=True):
                dense = dense and (n == 1 or s == want)
                want *= n
            t._contiguous = dense
        t._storage = storage
        return t

    # ---- strides and storage: what runtime/gemm.py reads of a row-strided A ----
    def stride(self) -> tuple[int, ...]:
        if self._strides is None:  # remembered: kernels.gemm reads A's strides every call (its key)
            self._strides = self._strides_of_shape()
        return self._strides

    def _strides_of_shape(self) -> tuple[int, ...]:
        out, want = [], 1
        for n in reversed(self.shape):
            out.append(want)
            want *= n
        out.reverse()
        if not self._contiguous and len(out) == 2:
            return (2 * self.shape[1], 2)  # contiguous=False alone: every other element of a wider row
        return tuple(out)

    def storage_offset(self) -> int:
        return 0  # the fake's address is its first element's

    def element_size(self) -> int:
        return SIZES[self.token]

    def untyped_storage(self):
        extent = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride(), strict=True)) if self._numel else 0
        elements = extent if self._storage is None else self._storage
        return _FakeStorage(elements * SIZES[self.token])

    def as_strided(self, size, stride) -> FakeTorchTensor:
        self._log("as_strided", tuple(size), tuple(stride))
        t = FakeTorchTensor.matrix(*size, dtype=self.token, ptr=self._ptr,
                                   device=(self.device.type, self.device.index))
        t._storage = self.untyped_storage().nbytes() // SIZES[self.token]
        return t

    shape: tuple[int, ...] = ()
    ops: list | None = None  # the torch calls runtime/gemm.py made on this tensor (new_empty, float, copy_)

    def _log(self, *op) -> None:
        if self.ops is None:
            self.ops = []
        self.ops.append(op)

    def new_empty(self, shape) -> FakeTorchTensor:
        self._log("new_empty", tuple(shape), self.token)
        return FakeTorchTensor.matrix(*shape, dtype=self.token)

    def float(self) -> FakeTorchTensor:
        self._log("float")
        return FakeTorchTensor.matrix(*self.shape, dtype="f32")

    def copy_(self, src) -> FakeTorchTensor:
        self._log("copy_", src)
        return self

    @property
    def token(self) -> str:
        return next(k for k, v in TORCH_DTYPES.items() if v is self.dtype)


class _FakeStorage:
    def __init__(self, nbytes: int):
        self._nbytes = nbytes

    def nbytes(self) -> int:
        return self._nbytes


def np_prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


FakeTorchTensor.__module__ = "torch"


class FakeCAI:
    """A CuPy-like array (device.id), or with cupy=False a Numba-like one that does not say its device."""

    def __init__(self, shape, typestr: str = "<f4", *, strides=None, readonly: bool = False, device: int = 0,
                 cupy: bool = True, ptr: int | None = None):
        self.ptr = next(_addresses) if ptr is None else ptr
        self.__cuda_array_interface__ = {"data": (self.ptr, readonly), "shape": tuple(shape), "typestr": typestr,
                                         "strides": strides, "version": 3}
        self.shape = tuple(shape)
        if cupy:
            self.device = FakeDevice("cuda", device)
            self.device.id = device


FakeCAI.__module__ = "cupy._core.core"

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR, _USED = b"dltensor", b"used_dltensor"  # capsule names must outlive the capsules
DL_CODES = {"f": 2, "i": 0, "u": 1, "bf": 4}


class FakeDLPack:
    """A DLPack producer: __dlpack__ returns a capsule naming a DLTensor this object owns (no deleter)."""

    def __init__(self, shape, dtype: str = "f32", *, device_type: int = 2, device_id: int = 0, strides=None,
                 consumed: bool = False, byte_offset: int = 0):
        stem = dtype.rstrip("0123456789")
        self._shape = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        self._strides = (ctypes.c_int64 * len(strides))(*strides) if strides else None
        self.ptr = next(_addresses)
        self._t = DLTensor(
            data=self.ptr, device=DLDevice(device_type, device_id), ndim=len(shape),
            dtype=DLDataType(DL_CODES[stem], int(dtype[len(stem):]), 1),
            shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
            strides=ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if strides else None,
            byte_offset=byte_offset,
        )
        self._name, self._device = (_USED if consumed else _DLTENSOR), (device_type, device_id)

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self._t), self._name, None)

    def __dlpack_device__(self):
        return self._device


FakeDLPack.__module__ = "jax._src.array"


# ---- records shaped like the catalog's families ----------------------------------------------------------------

_SCALAR_SIZES = {"i32": 4, "u32": 4, "i64": 8, "u64": 8, "f32": 4, "f64": 8, "ptr": 8}


def params(*specs: dict) -> list[Param]:
    """Param records from catalog-like dicts, with a packed ABI census (offset, size)."""
    out, offset = [], 0
    for s in specs:
        t = s["type"]
        kind = "pointer" if t == "ptr" else "blob" if t == "bytes" else "scalar"
        size = s["size"] if kind == "blob" else _SCALAR_SIZES[t]
        offset = -(-offset // min(size, 64)) * min(size, 64)
        out.append(Param(name=s["name"], kind=kind, type=t, dtype=s.get("dtype", ""),
                         role=s.get("role", "in") if kind != "scalar" else "", in_place_of=s.get("in_place_of"),
                         shape=list(s.get("shape", [])), value=str(s.get("value", "")), offset=offset, size=size))
        offset += size
    return out


def symbol(name: str, family: str, dtype: str, ps: list[Param], grid: list[str], dims: list[str], *,
           block=(256, 1, 1), constants: dict | None = None, state_capacity: int = 64, dynamic_smem: int = 0,
           tensor_maps: str = ""):
    return RuntimeSymbol(name=name, module="Fixed", target="sm_90a", family=family, dtype=dtype, status="admitted",
                         block=list(block), grid=grid, dynamic_smem=dynamic_smem, dims=dims,
                         constants=dict(constants or {}), state_capacity=state_capacity, params=ps,
                         tensor_maps=tensor_maps)


def softplus(dtype: str = "f32", in_place: bool = True):
    """softplus_forward as the catalog declares it: y may be exactly x (in_place_of); in_place=False: undeclared."""
    return symbol(f"softplus_forward_{dtype}", "softplus_forward", dtype, params(
        {"name": "y", "type": "ptr", "dtype": dtype, "role": "out", "shape": ["n"],
         **({"in_place_of": "x"} if in_place else {})},
        {"name": "x", "type": "ptr", "dtype": dtype, "shape": ["n"]},
        {"name": "n", "type": "i64", "value": "n"},
    ), ["min(ceil_div(n, 2048), 4096)"], ["n"], constants={"sizeof_T": SIZES[dtype]})


def two_outputs():
    """Two outputs and one input of n f32 elements each: the record of the pointer-overlap tests."""
    return symbol("split_f32", "split", "f32", params(
        {"name": "a", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["n"]},
        {"name": "b", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["n"]},
        {"name": "x", "type": "ptr", "dtype": "f32", "shape": ["n"]},
        {"name": "n", "type": "i64", "value": "n"},
    ), ["ceil_div(n, 256)"], ["n"])


def conv1d(dtype: str = "bf16"):
    return symbol(f"conv1d_burnin_forward_nosave_tiled_{dtype}", "conv1d_burnin_forward_nosave_tiled", dtype, params(
        {"name": "out", "type": "ptr", "dtype": dtype, "role": "out", "shape": ["batch*d*L"]},
        {"name": "x", "type": "ptr", "dtype": dtype, "shape": ["batch*d*L"]},
        {"name": "weight", "type": "ptr", "dtype": "f32", "shape": ["d*width"]},
        {"name": "bias", "type": "ptr", "dtype": "f32", "shape": ["d"]},
        {"name": "batch", "type": "i64", "value": "batch"},
        {"name": "d", "type": "i64", "value": "d"},
        {"name": "L", "type": "i64", "value": "L"},
        {"name": "width", "type": "i32", "value": "width"},
    ), ["batch*d*ceil_div(L, 8192 // sizeof_T)"], ["L", "batch", "d", "width"], block=(128, 1, 1),
        constants={"sizeof_T": SIZES[dtype]})


def ssm_step(dtype: str = "f32", state_capacity: int = 64):
    return symbol(f"ssm_step_forward_fused_{dtype}", "ssm_step_forward_fused", dtype, params(
        {"name": "out", "type": "ptr", "dtype": dtype, "role": "out", "shape": ["batch * d_inner"]},
        {"name": "state", "type": "ptr", "dtype": "f32", "role": "inout", "shape": ["batch * d_inner * d_state"]},
        {"name": "u", "type": "ptr", "dtype": dtype, "shape": ["batch * d_inner"]},
        {"name": "dt", "type": "ptr", "dtype": dtype, "shape": ["batch * d_inner"]},
        {"name": "dt_bias", "type": "ptr", "dtype": "f32", "shape": ["d_inner"]},
        {"name": "A_log", "type": "ptr", "dtype": "f32", "shape": ["d_inner * d_state"]},
        {"name": "x_dbl", "type": "ptr", "dtype": dtype, "shape": ["batch * (dt_rank + 2 * d_state)"]},
        {"name": "Dp", "type": "ptr", "dtype": "f32", "shape": ["d_inner"]},
        {"name": "z", "type": "ptr", "dtype": dtype, "shape": ["batch * d_inner"]},
        {"name": "batch", "type": "i32", "value": "batch"},
        {"name": "d_inner", "type": "i32", "value": "d_inner"},
        {"name": "d_state", "type": "i32", "value": "d_state"},
        {"name": "dt_rank", "type": "i32", "value": "dt_rank"},
        {"name": "x_dbl_stride", "type": "i32", "value": "dt_rank + 2 * d_state"},
    ), ["ceil_div(batch * d_inner * 4, 128)"], ["batch", "d_inner", "d_state", "dt_rank"], block=(128, 1, 1),
        constants={"sizeof_T": SIZES[dtype]}, state_capacity=state_capacity)


def reduce_bc_tmajor(dtype: str = "f32"):
    """ssm_reduce_d_BC_groups_tmajor, the catalog's record: a 3-D grid; d_state carried by a scalar, L too."""
    return catalog_record(f"ssm_reduce_d_BC_groups_tmajor_{dtype}")


def reduce_bc(dtype: str = "f32"):
    """ssm_reduce_d_BC_groups, the catalog's record: d_state and L carried by no scalar (dim-only arguments),
    nl = d_state * L derived."""
    return catalog_record(f"ssm_reduce_d_BC_groups_{dtype}")


def rmsnorm(dtype: str = "bf16"):
    """rmsnorm_forward: eps is a literal (the qualification value): a required caller argument."""
    return symbol(f"rmsnorm_forward_{dtype}", "rmsnorm_forward", dtype, params(
        {"name": "y", "type": "ptr", "dtype": dtype, "role": "out", "shape": ["rows*dim"]},
        {"name": "rstd", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["rows"]},
        {"name": "x", "type": "ptr", "dtype": dtype, "shape": ["rows*dim"]},
        {"name": "w", "type": "ptr", "dtype": "f32", "shape": ["dim"]},
        {"name": "rows", "type": "i64", "value": "rows"},
        {"name": "dim", "type": "i64", "value": "dim"},
        {"name": "eps", "type": "f32", "value": repr(1e-5)},
    ), ["min(rows, 65535)"], ["dim", "rows"])


def gemm_wgmma(dtype: str = "bf16"):
    """gemm_bi_nn_sm90a_wgmma_wg1: two 128-byte CUtensorMap blobs, then the raw pointers and M, N, K."""
    return symbol(f"gemm_bi_nn_sm90a_wgmma_wg1_{dtype}", "gemm_bi_nn_sm90a_wgmma_wg1", dtype, params(
        {"name": "tmA", "type": "bytes", "size": 128},
        {"name": "tmB", "type": "bytes", "size": 128},
        {"name": "C", "type": "ptr", "dtype": dtype, "role": "out", "shape": ["M * N"]},
        {"name": "A", "type": "ptr", "dtype": dtype, "shape": ["M * K"]},
        {"name": "B", "type": "ptr", "dtype": dtype, "shape": ["K * N"]},
        {"name": "M", "type": "i32", "value": "M"},
        {"name": "N", "type": "i32", "value": "N"},
        {"name": "K", "type": "i32", "value": "K"},
    ), ["min(ceil_div(M, BM) * ceil_div(N, BN), 132)"], ["K", "M", "N"], block=(256, 1, 1),
        constants={"BM": 128, "BN": 128, "NC": 1, "STAGES": 5, "TMASTORE": 0, "sizeof_T": 2}, state_capacity=0,
        dynamic_smem=5 * 256 * 128 + 16 * 5 + 1024, tensor_maps="prepare_gemm_nn")


def typed_scalars():
    """Every scalar type once, caller-given (as optim families' lr/step), plus one pointer sized by n."""
    return symbol("typed_scalars_f32", "typed_scalars", "f32", params(
        {"name": "p", "type": "ptr", "dtype": "f32", "role": "inout", "shape": ["n"]},
        {"name": "a", "type": "i32"}, {"name": "b", "type": "u32"}, {"name": "c", "type": "i64"},
        {"name": "d", "type": "u64"}, {"name": "lr", "type": "f32", "value": "0.001"}, {"name": "f", "type": "f64"},
        {"name": "step", "type": "i32", "value": "10"}, {"name": "n", "type": "i64", "value": "n"},
    ), ["ceil_div(n, 256)"], ["n"], state_capacity=0)


def catalog_records():
    """(RuntimeSymbol, qualification dims) for every catalog symbol: the record the qualifier launches through and
    the manifest signs (qualify/contract.py runtime_symbol), at the catalog's own ABI layout and a state capacity
    of 64 where the module takes one."""
    cat = _catalog()
    for cs in cat.symbols.values():
        yield catalog_record(cs.name), dict(cat.module(cs.module).family(cs.family).qualify.dims)


def catalog_record(name: str):
    """catalog_records' record of the catalog symbol `name`."""
    from mamba_forge.qualify.contract import runtime_symbol
    from mamba_forge.qualify.spec import expected_abi

    cat = _catalog()
    cs = cat.symbols[name]
    spec = cat.module(cs.module)
    fam = spec.family(cs.family)
    return runtime_symbol(cs, fam, [list(x) for x in expected_abi(fam.params)], 64 if spec.module.state_capacity else 0)


@functools.cache
def _catalog():
    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    return load_catalog(default_catalog_path())
