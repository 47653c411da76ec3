"""Helpers for GPU tests and benchmarks: build the catalog once for the attached GPU's target, load cubins with
mamba_forge.gpu.driver and launch through its one launch path (PackedParams + launch). Host data is NumPy;
bf16 travels as uint16 bit patterns.

    k = kernels()                      # builds (through the cache) once per process
    x = to_device(np_array, "bf16")    # NumPy float64/float32 -> device buffer of that dtype
    k.launch("softplus_forward_bf16", grid=(n_blocks,), block=(256,), args=(y, x, np.int64(n)))
    y_host = from_device(y, "bf16")    # -> float64 NumPy

CuPy (present on the GPU machine) is used only as an array container and allocator: device arrays with NumPy-like
ops (fill, slices, get). It never launches a kernel here; arguments reach the kernel as their device pointer
(`__cuda_array_interface__`, which torch tensors have too).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

from mamba_forge.gpu import driver as cu

_NP = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16, "f16": np.float16,
       "i32": np.int32, "i64": np.int64, "u32": np.uint32, "u8": np.uint8, "i8": np.int8, "u64": np.uint64}
_BITS = {"bf16": np.uint16}
# NumPy scalar type -> PackedParams type: kernel scalars are passed as NumPy scalars of the declared C type
_SCALARS = {np.dtype(np.int32): "i32", np.dtype(np.uint32): "u32", np.dtype(np.int64): "i64",
            np.dtype(np.uint64): "u64", np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
BLOB_ALIGN = 64  # by-value blobs (CUtensorMap wants 64; more costs nothing)


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


# ---- launching through mamba_forge.gpu ----------------------------------------------------------------------


def kernel_param(arg) -> tuple[str, object]:
    """One kernel argument as a PackedParams (type, value): a device array (a torch CUDA tensor, or anything with
    __cuda_array_interface__: CuPy) is its data pointer, a NumPy scalar its own C type, bytes a by-value blob, and a
    (type, value) pair passes as it is. Bare Python numbers are refused: their C type would be a guess."""
    if getattr(arg, "is_cuda", False) and callable(getattr(arg, "data_ptr", None)):
        return ("ptr", int(arg.data_ptr()))  # a torch CUDA tensor (its CAI refuses bf16)
    cai = getattr(arg, "__cuda_array_interface__", None)
    if cai is not None:
        return ("ptr", int(cai["data"][0]))
    if isinstance(arg, np.generic):
        typ = _SCALARS.get(arg.dtype)
        if typ is None:
            raise TypeError(f"no kernel parameter type for a NumPy {arg.dtype} scalar")
        return (typ, arg.item())
    if isinstance(arg, (bytes, bytearray)):
        return ("bytes", bytes(arg))
    if isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[0], str):
        return arg
    raise TypeError(f"kernel argument {arg!r} ({type(arg).__name__}): pass a device array, a NumPy scalar of the "
                    "parameter's C type, bytes or a (type, value) pair")


def pack(args: Sequence) -> cu.PackedParams:
    values = [kernel_param(a) for a in args]
    return cu.PackedParams(values, [BLOB_ALIGN if t == "bytes" else 0 for t, _ in values])


def as_stream(stream) -> cu.Stream | None:
    """None (the legacy default stream), a cu.Stream, a raw handle, or a CuPy/torch stream (borrowed)."""
    if stream is None or isinstance(stream, cu.Stream):
        return stream
    if isinstance(stream, int):
        return cu.Stream.wrap(stream)
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
        return cu.Stream.wrap(int(stream.__cuda_stream__()[1]))
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return cu.Stream.wrap(handle)
    raise TypeError(f"{type(stream).__name__} is not a CUDA stream")


@functools.cache
def _context() -> cu.Device:
    """The primary context of device 0, current on this thread (the one CuPy and torch use too)."""
    dev = cu.Device(0)
    dev.make_current()
    return dev


_MODULES: dict[str, cu.Module] = {}


def load_cubin(path: str | Path) -> cu.Module:
    """A built cubin loaded once per path into the primary context."""
    key = str(path)
    if key not in _MODULES:
        _context()
        _MODULES[key] = cu.Module(Path(key).read_bytes())
    return _MODULES[key]


def bind(fn: cu.Function, grid, block, args: Sequence, smem: int = 0, stream=None) -> Callable[[], None]:
    """A zero-argument launcher with the parameters packed once (benchmarks time only the launch). `stream` is
    anything as_stream takes, or a function returning one, asked at every launch (``torch.cuda.current_stream``:
    a torch graph capture switches the current stream)."""
    params = pack(args)
    if smem > 48 * 1024:
        fn.set_max_dynamic_smem(smem)
    grid, block = tuple(grid), tuple(block)
    if callable(stream):
        current = stream

        def run() -> None:
            cu.launch(fn, grid, block, params, smem=smem, stream=as_stream(current()))
    else:
        fixed = as_stream(stream)

        def run() -> None:
            cu.launch(fn, grid, block, params, smem=smem, stream=fixed)

    run.args = args  # the arrays stay alive as long as the launcher
    return run


def launch(fn: cu.Function, grid, block, args: Sequence, smem: int = 0, stream=None, sync: bool = True) -> None:
    bind(fn, grid, block, args, smem, stream)()
    if sync:
        cu.context_synchronize()


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
        self._where = {s.name: m for m, s in self.manifest.symbols() if m.target == target}

    def verdict(self, name: str):
        m = self._where[name]
        return next(s.verdict for s in m.symbols if s.name == name)

    def cubin(self, name: str) -> Path:
        mod = self._where.get(name)
        if mod is None:
            raise KeyError(f"{name} is not in the {self.target} build")
        return self.out / next(a for a in mod.artifacts if a.code == "cubin").path

    def fn(self, name: str) -> cu.Function:
        return load_cubin(self.cubin(name)).function(name)

    def bind(self, name: str, grid, block, args, smem: int = 0, stream=None) -> Callable[[], None]:
        return bind(self.fn(name), grid, block, args, smem, stream)

    def launch(self, name: str, grid, block, args, smem: int = 0, stream=None, sync: bool = True):
        launch(self.fn(name), grid, block, args, smem, stream, sync)


@functools.cache
def kernels(target: str = "sm_90a", state_cap: int = 64) -> Kernels:
    return Kernels(target, state_cap)


def torch_env(target: str = "sm_90a"):
    """(torch, Kernels, catalog, {name: (module build, symbol build)}) for tests that launch built symbols on torch
    tensors: the primary context made current by torch, the whole catalog built for `target` (once per process)."""
    import pytest

    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context is current from here on
    k = kernels(target)
    where = {s.name: (m, s) for m, s in k.manifest.symbols() if m.target == target}
    return torch, k, load_catalog(default_catalog_path()), where


def admitted_function(env, name: str, role: str | None = None):
    """(function, catalog symbol) of an admitted symbol of a torch_env build; fails the test otherwise (and when
    `role` is given and the module was built in another role)."""
    import pytest

    _, k, catalog, where = env
    if name not in where:
        pytest.fail(f"{name} is not in the {k.target} build")
    mod, sym = where[name]
    if role is not None:
        assert mod.role == role, f"{name}: built for {k.target} as {mod.role}"
    assert sym.verdict.status == "admitted", f"{name}: {sym.verdict.reason}"
    cubin = next(a for a in mod.artifacts if a.code == "cubin")
    return load_cubin(k.out / cubin.path).function(name), catalog.symbols[name]


def build_modules(kinds, *, kernels: Sequence[str] = (), target: str = "sm_90a", prefix: str = "mf-bench-",
                  on_rejected: Callable[[str], None] | None = None):
    """Build only these module kinds (with `kernels`, only those symbols) for `target`, into a fresh folder:
    (catalog, {admitted symbol: cubin path}). A module that fails to compile stops the caller (SystemExit with
    its log head); `on_rejected` hears "<symbol>: not admitted (<reason>)" for each symbol the build rejected."""
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import Catalog, default_catalog_path, load_catalog
    from mamba_forge.catalog.targets import get_target

    cat = load_catalog(default_catalog_path())
    sub = Catalog(path=cat.path, name=cat.name, modules=tuple(cat.module(k) for k in kinds))
    out = Path(tempfile.mkdtemp(prefix=prefix))
    man = build(BuildRequest(sub, [get_target(target)], out, kernels=tuple(kernels)))
    where: dict[str, Path] = {}
    for mod in man.modules:
        if mod.target != target:
            continue
        if mod.status != "compiled":
            raise SystemExit(f"{mod.kind} failed to compile:\n{mod.log_head}")
        cubin = out / next(a for a in mod.artifacts if a.code == "cubin").path
        for s in mod.symbols:
            if s.verdict.status == "admitted":
                where[s.name] = cubin
            elif on_rejected is not None:
                on_rejected(f"{s.name}: not admitted ({s.verdict.reason})")
    return cat, where


def fixed_families(*files: str):
    """The Fixed module's families declared in these catalog files (relative to kernels/, e.g. "fixed/norm.toml")
    and their symbols: ({name: Family}, [Symbol] in catalog order)."""
    import tomllib

    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    fixed = load_catalog(default_catalog_path()).module("Fixed")
    names = {f["name"] for rel in files for f in tomllib.loads((fixed.root / rel).read_text())["family"]}
    fams = {f.name: f for f in fixed.families if f.name in names}
    return fams, [s for s in fixed.symbols if s.family in fams]


def reference_outputs(family, spec, inputs) -> dict:
    """The float64 outputs of `family`'s reference (its qualify.reference, module:function) for a launch spec:
    `inputs` by buffer name (a buffer not given is NaN), the spec's scalars and dims."""
    import importlib

    import numpy as np

    from mamba_forge.qualify import spec as S

    mod, fn = family.qualify.reference.split(":")
    args = {b.name: S.as_f64(inputs[b.name], b.dtype) if b.name in inputs else np.full(b.count, np.nan)
            for b in spec.buffers}
    args.update({s.name: s.value for s in spec.scalars})
    return getattr(importlib.import_module(mod), fn)(args, dict(spec.dims))
