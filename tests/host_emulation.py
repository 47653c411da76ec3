"""Host emulation of CUDA kernels for CPU tests: a kernel source compiled by g++ against a mock of the CUDA subset
it uses (the mock, with WarpCtx, my_warp(), g_warps and g_block_bar, comes from the caller), run one block at a time
with one std::thread per CUDA thread. It proves index arithmetic, reduction orders and store coverage on the CPU,
not timing or the real warp hardware. Skips the test without g++ -std=c++20 and <barrier>."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

def cuda_mock(what: str, *, warp_fields: str = "", shared: str = "", includes: Sequence[str] = ()) -> str:
    """The start of a host mock of the CUDA subset (force-included before the kernel source): the standard
    headers, threadIdx/blockIdx/blockDim/gridDim, WarpCtx (its barrier plus `warp_fields`), g_warps, g_block_bar,
    my_warp(), the qualifier macros (`__shared__` expands to `shared`: "static" where a kernel declares static
    shared arrays), float4/uint4. The caller appends the intrinsics its kernels use."""
    heads = ["barrier", "cmath", "cstdint", "cstring", "algorithm", "memory", "thread", "vector", *includes]
    return "\n".join([
        f"// CUDA subset for the host emulation of {what} (force-included before everything).",
        "#pragma once",
        *(f"#include <{h}>" for h in dict.fromkeys(heads)),
        "using std::min; using std::max;",
        "struct dim3_ { unsigned x = 1, y = 1, z = 1; };",
        "inline thread_local dim3_ threadIdx, blockIdx;",
        "inline dim3_ blockDim, gridDim;",
        f"struct WarpCtx {{ std::barrier<>* bar; {warp_fields} }};",
        "inline WarpCtx* g_warps = nullptr;",
        "inline std::barrier<>* g_block_bar = nullptr;",
        "#define __device__", "#define __host__", "#define __global__", "#define __forceinline__ inline",
        "#define __launch_bounds__(...)", "#define __restrict__", f"#define __shared__ {shared}",
        "#define __align__(n) __attribute__((aligned(n)))",
        "struct uint4 { unsigned x, y, z, w; };",
        "struct float2 { float x, y; };",
        "struct float4 { float x, y, z, w; };",
        "inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }",
        "inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }",
        "inline int tid_linear() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }",
        "inline WarpCtx& my_warp() { return g_warps[tid_linear() >> 5]; }",
        "",
    ])


# launch(kernel, grid, block, args): every thread of a block runs the kernel; MF_EMU_THREAD_START (the mock may
# define it) runs first in each thread.
LAUNCH_CPP = r"""
#ifndef MF_EMU_THREAD_START
#define MF_EMU_THREAD_START
#endif
template <class... A, size_t... I> void call_(void (*k)(A...), void** args, std::index_sequence<I...>) {
  k(*reinterpret_cast<A*>(args[I])...);
}
template <class... A> void launch(void (*k)(A...), const int* g, const int* b, void** args) {
  gridDim = {unsigned(g[0]), unsigned(g[1]), unsigned(g[2])};
  blockDim = {unsigned(b[0]), unsigned(b[1]), unsigned(b[2])};
  int nt = b[0] * b[1] * b[2], nw = (nt + 31) / 32;
  for (int bz = 0; bz < g[2]; ++bz) for (int by = 0; by < g[1]; ++by) for (int bx = 0; bx < g[0]; ++bx) {
    std::vector<std::unique_ptr<std::barrier<>>> bars;
    std::vector<WarpCtx> warps(nw);
    for (int w = 0; w < nw; ++w) { bars.emplace_back(new std::barrier<>(32)); warps[w].bar = bars.back().get(); }
    std::barrier<> block_bar(nt);
    g_warps = warps.data(); g_block_bar = &block_bar;
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t) th.emplace_back([&, t] {
      threadIdx = {unsigned(t % b[0]), unsigned((t / b[0]) % b[1]), unsigned(t / (b[0] * b[1]))};
      blockIdx = {unsigned(bx), unsigned(by), unsigned(bz)};
      MF_EMU_THREAD_START
      call_(k, args, std::index_sequence_for<A...>{});
      // a thread that returned early must keep serving its warp's and block's barriers: drop out of them
      my_warp().bar->arrive_and_drop();
      g_block_bar->arrive_and_drop();
    });
    for (auto& x : th) x.join();
  }
}
"""


def entries_cpp(names: Sequence[str]) -> str:
    """`extern "C" int run(name, grid, block, args)`: launches the named kernel; 1 for a name it does not hold."""
    calls = " ".join(f"ENTRY({n})" for n in names)
    return ('#define ENTRY(N) if (!std::strcmp(name, #N)) { launch(N, g, b, args); return 0; }\n'
            'extern "C" int run(const char* name, const int* g, const int* b, void** args) {\n'
            f"  {calls}\n  return 1;\n}}\n")


def generated_wrappers(names: Sequence[str]) -> str:
    """The named built-in symbols' entry points as the build composes them (mamba_forge/catalog/wrappers.py: the
    generated extern "C" wrappers), the text NVRTC compiles: here g++ compiles it against the mock."""
    from mamba_forge.catalog import wrappers
    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    cat = load_catalog(default_catalog_path())
    syms = [cat.symbols[name] for name in names]
    return "\n".join(wrappers.entry_point(cat.module(s.module).family(s.family), s) or "" for s in syms) + "\n"


def compile_emulator(folder: Path, files: Mapping[str, str], source: str, flags: Sequence[str]) -> ctypes.CDLL:
    """g++ -std=c++20 the emulation `source` (with `files` written under `folder` first, relative paths) into a
    shared library; skips without g++ or <barrier>, fails the test with the compiler's message otherwise."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ for the host emulation")
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    (folder / "emu.cpp").write_text(source)
    cmd = [gxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", *flags, f"-I{ROOT / 'kernels/include'}",
           "-o", str(folder / "emu.so"), str(folder / "emu.cpp")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        if "barrier" in r.stderr and "No such file" in r.stderr:
            pytest.skip("g++ without C++20 <barrier>")
        raise AssertionError(r.stderr[-4000:])
    return ctypes.CDLL(str(folder / "emu.so"))


def run_spec(lib, sp, arrays) -> dict:
    """Launch the emulated kernel of launch spec `sp` (mamba_forge.qualify.spec.LaunchSpec) on f32 copies of
    `arrays` (by parameter name; a buffer not given starts as NaN), its scalars by value, through `run`. Returns
    every buffer after the launch, flat."""
    import numpy as np

    bufs, keep = {}, []
    args = (ctypes.c_void_p * (len(sp.buffers) + len(sp.scalars)))()
    for b in sp.buffers:
        a = arrays.get(b.name)
        bufs[b.name] = np.full(b.count, np.nan, np.float32) if a is None else np.array(a, np.float32).ravel().copy()
        assert bufs[b.name].size >= b.count, (sp.symbol, b.name, bufs[b.name].size, b.count)
        ptr = ctypes.c_void_p(bufs[b.name].ctypes.data)
        keep.append(ptr)
        args[b.index] = ctypes.cast(ctypes.pointer(ptr), ctypes.c_void_p)
    ctype = {"i32": ctypes.c_int32, "i64": ctypes.c_int64}
    for s in sp.scalars:
        v = ctype[s.type](s.value)
        keep.append(v)
        args[s.index] = ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
    rc = lib.run(sp.symbol.encode(), (ctypes.c_int * 3)(*sp.grid), (ctypes.c_int * 3)(*sp.block), args)
    assert rc == 0, f"{sp.symbol} is not in the emulator"
    return bufs
