"""Helpers for GPU tests and benchmarks: build the catalog once for the attached GPU's target and launch
symbols through CuPy (present on the GPU machine). Host data is NumPy; bf16 travels as uint16 bit patterns.

    k = kernels()                      # builds (through the cache) once per process
    x = to_device(np_array, "bf16")    # NumPy float64/float32 -> device buffer of that dtype
    k.launch("softplus_forward_bf16", grid=(n_blocks,), block=(256,), args=(y, x, np.int64(n)))
    y_host = from_device(y, "bf16")    # -> float64 NumPy
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

_NP = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16, "f16": np.float16,
       "i32": np.int32, "i64": np.int64, "u32": np.uint32, "u8": np.uint8, "i8": np.int8, "u64": np.uint64}
_BITS = {"bf16": np.uint16}


def np_dtype(token: str):
    return _NP[token]


def round_to(x: np.ndarray, token: str) -> np.ndarray:
    """Host values rounded to `token` and back to float64 (what the kernel will see)."""
    return np.asarray(x).astype(_NP[token]).astype(np.float64)


def to_device(x: np.ndarray, token: str):
    import cupy as cp

    arr = np.ascontiguousarray(np.asarray(x).astype(_NP[token]))
    if token in _BITS:
        arr = arr.view(_BITS[token])
    return cp.asarray(arr)


def empty_device(n: int | tuple, token: str, poison: bool = True):
    """A device buffer pre-filled with NaN bit patterns (0xFF bytes) so unwritten elements show."""
    import cupy as cp

    host_dtype = _BITS.get(token, _NP[token])
    buf = cp.empty(n, dtype=host_dtype)
    if poison:
        buf.view(cp.uint8).fill(0xFF)
    return buf


def from_device(buf, token: str) -> np.ndarray:
    host = buf.get()
    if token in _BITS:
        host = host.view(_NP[token])
    return host.astype(np.float64) if token not in ("i32", "i64", "u32", "u8", "i8", "u64") else host


def bits(buf) -> bytes:
    """The exact output bytes (for bitwise comparisons)."""
    return buf.get().tobytes()


@functools.cache
def _build(target: str, state_cap: int):
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog
    from mamba_forge.catalog.targets import get_target

    out = Path(tempfile.mkdtemp(prefix=f"mf-gpu-{target}-"))
    manifest = build(BuildRequest(load_catalog(default_catalog_path()), [get_target(target)], out, state_capacity=state_cap))
    return out, manifest


class Kernels:
    def __init__(self, target: str = "sm_90a", state_cap: int = 64):
        self.out, self.manifest = _build(target, state_cap)
        self.target = target
        self._modules: dict[str, object] = {}
        self._where = {s.name: m for m, s in self.manifest.symbols() if m.target == target}

    def verdict(self, name: str):
        m = self._where[name]
        return next(s.verdict for s in m.symbols if s.name == name)

    def fn(self, name: str):
        import cupy as cp

        mod = self._where.get(name)
        if mod is None:
            raise KeyError(f"{name} is not in the {self.target} build")
        cubin = next(a for a in mod.artifacts if a.code == "cubin")
        if cubin.path not in self._modules:
            self._modules[cubin.path] = cp.RawModule(path=str(self.out / cubin.path))
        return self._modules[cubin.path].get_function(name)

    def launch(self, name: str, grid, block, args, smem: int = 0, stream=None, sync: bool = True):
        import cupy as cp

        f = self.fn(name)
        if smem > 48 * 1024:
            f.max_dynamic_shared_size_bytes = smem
        f(tuple(grid), tuple(block), tuple(args), shared_mem=smem, stream=stream)
        if sync:
            cp.cuda.runtime.deviceSynchronize()


@functools.cache
def kernels(target: str = "sm_90a", state_cap: int = 64) -> Kernels:
    return Kernels(target, state_cap)
