"""Fixtures for the runtime, bundle, report and reproducibility tests (CPU): a tiny catalog built with the real
NVRTC path, a qualified manifest made from that build (as the qualifier would write it for an H200), real
Ed25519 signatures, and a fake GPU backend that records what the loader hands the driver.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import tomli_w

from mamba_forge.core.vocab import DeviceInfo
from mamba_forge.runtime import signing
from mamba_forge.runtime.errors import DriverError

H200 = DeviceInfo(ordinal=0, name="NVIDIA H200", cc=(9, 0), sm_count=132, driver_version=13000)

TINY_CU = r"""// A tiny module for the runtime tests: a scale kernel per dtype and three copy rungs.
#include "tiny.cuh"

namespace tiny {
template <typename T> __device__ __forceinline__ void scale(T* __restrict__ y, const T* __restrict__ x, float a,
                                                             long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = from_f32<T>(a * to_f32(x[i]));
}
template <typename T> __device__ __forceinline__ void copy(T* __restrict__ y, const T* __restrict__ x, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = x[i];
}
}  // namespace tiny

#define TINY_SCALE(NAME, T) \
  extern "C" __global__ void __launch_bounds__(128) NAME(T* __restrict__ y, const T* __restrict__ x, float a, long long n) { \
    tiny::scale<T>(y, x, a, n); \
  }
// GEMM ABIs (kernels/fixed/gemm.toml, kernels/sm90a/wgmma.toml) for runtime/gemm.py's tests: never launched
#define TINY_GEMM(NAME, T) \
  extern "C" __global__ void __launch_bounds__(128) NAME(T* __restrict__ C, const T* __restrict__ A, \
      const T* __restrict__ B, const T* __restrict__ bias, int M, int N, int K) { \
    if (threadIdx.x == 0 && M > 0 && N > 0) C[0] = bias ? bias[0] : tiny::from_f32<T>(tiny::to_f32(A[0]) * tiny::to_f32(B[0]) + K); \
  }
#define TINY_GEMM_TMA(NAME, T) \
  extern "C" __global__ void __launch_bounds__(128) NAME(const __grid_constant__ tiny::Blob128 tmA, \
      const __grid_constant__ tiny::Blob128 tmB, T* __restrict__ C, const T* __restrict__ A, \
      const T* __restrict__ B, int M, int N, int K) { \
    if (threadIdx.x == 0 && M > 0) C[0] = tiny::from_f32<T>((float)(tmA.b[0] + tmB.b[0] + N + K) + tiny::to_f32(A[0])); \
  }
// programmatic dependent launch: waits for the grid before it (sm_90+) before it reads (the pdl tests)
#define TINY_PDL_COPY(NAME, T) \
  extern "C" __global__ void __launch_bounds__(128) NAME(T* __restrict__ y, const T* __restrict__ x, long long n) { \
    TINY_PDL_WAIT; \
    tiny::copy<T>(y, x, n); \
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TINY_PDL_WAIT asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define TINY_PDL_WAIT
#endif
#define TINY_COPY(NAME, T) \
  extern "C" __global__ void __launch_bounds__(128) NAME(T* __restrict__ y, const T* __restrict__ x, long long n) { \
    tiny::copy<T>(y, x, n); \
  }
"""

TINY_CUH = r"""#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
namespace tiny {
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
struct alignas(64) Blob128 { unsigned char b[128]; };  // a CUtensorMap's size and alignment
}  // namespace tiny
"""

# the (y, x, n) copy ABI's parameters and qualification dims, shared by every copy family below
_COPY_PARAMS = """params = [
  { name = "y", type = "ptr", dtype = "T", role = "out", shape = ["n"] },
  { name = "x", type = "ptr", dtype = "T", shape = ["n"] },
  { name = "n", type = "i64", value = "n" },
]
qualify = { dims = { n = 4096 } }
"""


def _copy_family(name: str, extra: str = "", grid: str = "ceil_div(n, 128)") -> str:
    """A TINY_COPY family in bf16 and f16; `extra`: lines after its variants (a fallback, instances)."""
    return (f'\n[[family]]\nname = "{name}"\ninstantiate = "TINY_COPY"\nvariants = ["bf16", "f16"]\n{extra}'
            f'launch = {{ block = 128, grid = ["{grid}"] }}\n' + _COPY_PARAMS)


TINY_TOML = """
[[family]]
name = "scale"
instantiate = "TINY_SCALE"
bare = "f32"
variants = ["f32", "bf16", "f16"]
launch = { block = 128, grid = ["ceil_div(n, 128)"] }
params = [
  { name = "y", type = "ptr", dtype = "T", role = "out", shape = ["n"] },
  { name = "x", type = "ptr", dtype = "T", shape = ["n"] },
  { name = "a", type = "f32", value = 2 },
  { name = "n", type = "i64", value = "n" },
]
qualify = { dims = { n = 4096 } }
""" + _copy_family("fast_copy", 'fallback = ["mid_copy_{dtype}", "slow_copy_{dtype}"]\n') \
    + _copy_family("mid_copy") + _copy_family("slow_copy")

CATALOG_TOML = """
[catalog]
schema = 1
name = "tiny"

[[module]]
kind = "Tiny"
mandatory = true
arch = ["sm_80+"]
sources = ["tiny.cu"]
families = ["tiny.toml"]
"""

# the fixture's verdicts: the fallback chain fast -> mid -> slow, and a chain with nothing admitted
REJECTED = {
    "fast_copy_bf16": ("correctness", "fast_copy_bf16: max error 3.2e-02 over 1048576 elements exceeds rtol 1.6e-02"),
    "mid_copy_bf16": ("registers", "mid_copy_bf16: 96 registers at 128 threads exceed the cap of 64"),
    "fast_copy_f16": ("repeat", "fast_copy_f16: run 3 of 5 differs from run 1 in 17 bytes"),
    "mid_copy_f16": ("fault", "mid_copy_f16: CUDA_ERROR_ILLEGAL_ADDRESS at the qualification shape"),
    "slow_copy_f16": ("timeout", "slow_copy_f16: did not finish within 10 s"),
}


# a multi-tile family (two instances per dtype), for the tile-selection tests
TILED_TOML = _copy_family("tiled_copy", 'instances = [{ W = 1 }, { W = 2 }]\nsymbol = "{name}_w{W}_{dtype}"\n',
                          "ceil_div(n, 128 * W)")


# GEMM rungs for runtime/gemm.py's tests: an exact-f32-like ABI with the optional bias (f32 and bf16, bf16 out),
# and TMA rungs named as the skinny family (tile constants BN, blobs tmA/tmB) and as a family no map rule covers
_TMA_PARAMS = """params = [
  { name = "tmA", type = "bytes", size = 128, align = 64 },
  { name = "tmB", type = "bytes", size = 128, align = 64 },
  { name = "C", type = "ptr", dtype = "T", role = "out", shape = ["M * N"] },
  { name = "A", type = "ptr", dtype = "T", shape = ["M * K"] },
  { name = "B", type = "ptr", dtype = "T", shape = ["K * N"] },
  { name = "M", type = "i32", value = "M" },
  { name = "N", type = "i32", value = "N" },
  { name = "K", type = "i32", value = "K" },
]
"""  # the wgmma GEMM ABI (kernels/sm90a/wgmma.toml), shared by both TMA families below
GEMM_TOML = """
[[family]]
name = "tiny_gemm"
instantiate = "TINY_GEMM"
variants = ["f32", "bf16"]
launch = { block = 128, grid = ["ceil_div(N, 64)", "ceil_div(M, 64)"] }
params = [
  { name = "C", type = "ptr", dtype = "T", role = "out", shape = ["M * N"] },
  { name = "A", type = "ptr", dtype = "T", shape = ["M * K"] },
  { name = "B", type = "ptr", dtype = "T", shape = ["K * N"] },
  { name = "bias", type = "ptr", dtype = "T", shape = ["N"] },
  { name = "M", type = "i32", value = "M" },
  { name = "N", type = "i32", value = "N" },
  { name = "K", type = "i32", value = "K" },
]
qualify = { dims = { M = 64, N = 64, K = 64 } }

[[family]]
name = "gemm_bi_nn_sm90a_wgmma_skinny"
instantiate = "TINY_GEMM_TMA"
variants = ["bf16"]
instances = [{ BM = 64, BN = 32 }, { BM = 64, BN = 64 }]
symbol = "{name}_m{BM}n{BN}_{dtype}"
args = ["T"]
launch = { block = 128, grid = ["min(ceil_div(M, BM) * ceil_div(N, BN), 132)"] }
""" + _TMA_PARAMS + """qualify = { dims = { M = 64, N = 64, K = 64 }, prepare = "mamba_forge.gpu.tma:prepare_gemm_nn_skinny" }

[[family]]
name = "tiny_tma_unmapped"
instantiate = "TINY_GEMM_TMA"
variants = ["bf16"]
launch = { block = 128, grid = ["ceil_div(N, 64)"] }
""" + _TMA_PARAMS + """qualify = { dims = { M = 64, N = 64, K = 64 } }
"""


def write_tiny_catalog(root: Path, extra_families: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "include").mkdir(exist_ok=True)
    (root / "include" / "tiny.cuh").write_text(TINY_CUH)
    (root / "tiny.cu").write_text(TINY_CU)
    (root / "tiny.toml").write_text(TINY_TOML + extra_families)
    (root / "catalog.toml").write_text(CATALOG_TOML)
    return root / "catalog.toml"


def build_tiny(catalog: Path, out: Path, cache: Path, target: str = "sm_90a"):
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import load_catalog
    from mamba_forge.catalog.targets import get_target

    req = BuildRequest(load_catalog(catalog), [get_target(target)], out, jobs=1, cache_location=cache)
    manifest = build(req)
    assert all(m.status == "compiled" for m in manifest.modules), [m.log_head for m in manifest.modules]
    return manifest


def qualified_body(build_manifest, catalog: Path, *, device: DeviceInfo = H200, rejected=None,
                   created: str = "2026-11-29T19:00:00Z", expires: str = "2099-11-29T19:00:00Z") -> dict:
    """A qualified manifest body (manifest_version 2, plain data) as docs/architecture.md lays it out, from a real
    build; each symbol's launch contract as the qualifier fills it."""
    from mamba_forge.catalog.model import load_catalog
    from mamba_forge.core.codec import to_dict
    from mamba_forge.qualify.contract import contract

    rejected = REJECTED if rejected is None else rejected
    cat = load_catalog(catalog)
    artifacts, symbols = [], []
    for m in build_manifest.modules:
        for a in m.artifacts:
            artifacts.append({"module": m.kind, "target": m.target, "role": m.role, "path": a.path, "code": a.code,
                              "size": a.size, "sha256": a.sha256})
        for s in m.symbols:
            check, reason = rejected.get(s.name, ("", ""))
            r = s.resources
            launch = contract(cat.symbols[s.name], cat.module(m.kind), r.param_layout, build_manifest.state_capacity)
            symbols.append({
                "name": s.name, "module": m.kind, "target": m.target, "family": s.family, "dtype": s.dtype,
                "status": "rejected" if reason else "admitted", "reason": reason, "check": check,
                "fallback": list(cat.symbols[s.name].fallback), "block": list(s.block),
                "dynamic_smem": s.dynamic_smem, **launch, "params": [to_dict(p) for p in launch["params"]],
                "resources": {"registers": r.registers, "static_smem": r.static_smem, "local_bytes": r.stack_frame,
                              "max_threads": r.max_threads, "blocks_per_sm": 8},
                "checks": [{"name": "repeat", "passed": not reason, "digest": hashlib.sha256(s.name.encode()).hexdigest(),
                            "detail": "5 runs"}],
            })
    return {
        "schema_version": 1, "kind": "qualified", "manifest_version": 2, "created": created, "expires": expires,
        "tool_version": "0.1.0", "level": "quick", "qualification_seconds": 1.5, "development_key": False,
        "state_capacity": build_manifest.state_capacity,
        "toolchain": {"nvrtc_version": build_manifest.toolchain.nvrtc_version,
                      "source_sha256": {f"{m.kind}/{m.target}": m.source_sha256 for m in build_manifest.modules}},
        "device": {"name": device.name, "cc": device.cc_text, "sm_count": device.sm_count,
                   "driver_version": device.driver_version, "count": 1},
        "artifacts": artifacts, "symbols": symbols,
    }


def sign_body(body: dict, private, *, development_key: bool | None = None) -> bytes:
    dev = body.get("development_key", False) if development_key is None else development_key
    return signing.sign(tomli_w.dumps(body).encode(), private, development_key=dev)


def write_with_runtime_table(body: dict, private, manifest: Path) -> bytes:
    """Sign as the qualifier does: the manifest at `manifest`, its runtime table beside it. Returns the document."""
    from mamba_forge.core.codec import from_dict
    from mamba_forge.core.schema import QualifiedManifest
    from mamba_forge.manifest.qualified import sign_with_runtime_table
    from mamba_forge.runtime.sources import runtime_table_path

    doc, table = sign_with_runtime_table(from_dict(QualifiedManifest, body), private)
    runtime_table_path(manifest).write_bytes(table)
    manifest.write_bytes(doc)
    return doc


def tiny_qualified(root: Path, extra_families: str = "", *, build_manifest: bool = False):
    """The tiny catalog (plus extra_families) built for sm_90a into root/build (with its build manifest.toml written
    there, as the CLI writes it, when `build_manifest`), a fresh release key pair in root/keys and the qualified body,
    not yet signed: SimpleNamespace(root, cat, bm, build, priv, pub, kid, key_path, body)."""
    from types import SimpleNamespace

    cat = write_tiny_catalog(root / "cat", extra_families)
    bm = build_tiny(cat, root / "build", root / "cache")
    if build_manifest:
        from mamba_forge.manifest.toml_io import write

        write(root / "build" / "manifest.toml", bm)
    priv, pub, kid = keypair(root / "keys", "release")
    return SimpleNamespace(root=root, cat=cat, bm=bm, build=root / "build", priv=priv, pub=pub, kid=kid,
                           key_path=root / "keys" / "release.key", body=qualified_body(bm, cat))


def signed_tiny(root: Path, extra_families: str = "", routes: list | None = None, *, build_manifest: bool = False,
                table: bool = True, manifest: str = "build/h200.toml"):
    """tiny_qualified's build (build_manifest: as there), its body (with `routes` as its route table when given)
    signed into root/<manifest> (`manifest`, its bytes `doc`): as the qualifier writes it, its runtime table beside,
    or with table=False the signed body alone."""
    t = tiny_qualified(root, extra_families, build_manifest=build_manifest)
    if routes is not None:
        t.body["routes"] = routes
    t.manifest = root / manifest
    t.manifest.parent.mkdir(parents=True, exist_ok=True)
    if table:
        t.doc = write_with_runtime_table(t.body, t.priv, t.manifest)
    else:
        t.doc = sign_body(t.body, t.priv)
        t.manifest.write_bytes(t.doc)
    return t


def keypair(folder: Path, name: str):
    priv_path, pub_path, kid = signing.write_keypair(folder, name)
    return signing.parse_private(priv_path.read_bytes()), pub_path, kid


@dataclass
class FakeModule:
    image: bytes


@dataclass
class FakeBackend:
    """Stands in for the GPU: same calls as runtime.backend.CudaBackend, recording what the loader does."""

    info: DeviceInfo = H200
    loaded: list[str] = field(default_factory=list)  # sha256 of each image handed to load_module
    smem: dict[str, int] = field(default_factory=dict)
    launches: list[dict] = field(default_factory=list)
    activated: list[int] = field(default_factory=list)

    def device_info(self, ordinal: int) -> DeviceInfo:
        return replace(self.info, ordinal=ordinal)

    def activate(self, ordinal: int) -> None:
        self.activated.append(ordinal)

    def load_module(self, image: bytes) -> FakeModule:
        self.loaded.append(hashlib.sha256(image).hexdigest())
        return FakeModule(image)

    def get_function(self, module: FakeModule, name: str) -> str:
        if name.encode() + b"\0" not in module.image:  # the cubin's string table holds every entry name
            raise DriverError(f"cuModuleGetFunction({name}) failed with CUDA_ERROR_NOT_FOUND")
        return name

    def set_max_dynamic_smem(self, fn: str, nbytes: int) -> None:
        self.smem[fn] = nbytes

    def launch(self, fn, grid, block, params, shared_mem, stream, pdl: bool = False) -> None:
        """params: packed once by the loader (launcher.Packed); read the bytes back as the driver would."""
        layout = params.layout
        n = len(layout.types)
        arr = (ctypes.c_void_p * max(1, n)).from_address(params.address)
        raw = [ctypes.string_at(arr[i], layout.sizes[i]) for i in range(n)]
        values = [(t, r if t == "bytes" else struct.unpack("<" + CODES[t], r)[0])
                  for t, r in zip(layout.types, raw, strict=True)]
        self.launches.append({"fn": fn, "grid": grid, "block": block, "shared_mem": shared_mem, "stream": stream,
                              "values": values, "raw": raw, "aligns": [arr[i] % 64 for i in range(n)], "pdl": pdl})


CODES = {"ptr": "Q", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}
