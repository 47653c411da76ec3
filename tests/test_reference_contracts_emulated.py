"""Host emulation of the gradient-norm kernels under the reference library's contracts (kernels/fixed/optim.cu:
the fixed 512 f64 partials, the one-thread ascending fold, the stripe + vector region and our span lists).

optim.cu and the real mf/common.cuh and mf/elementwise.cuh are compiled by g++ against a prelude that emulates
the CUDA subset they use (one std::thread per CUDA thread, std::barrier for warp shuffles and block barriers),
launched with the catalog's parameter order and compared with the float64 references and with the host's
sequential fold. It checks indexing, chunking, the region walk, the vector/scalar load split and the fold order
on the CPU, not timing or the real warp hardware (tests/gpu/test_reference_contracts.py does, on the GPU).
Skips without g++ -std=c++20.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import numpy as np
import pytest
from host_emulation import LAUNCH_CPP, compile_emulator, cuda_mock, entries_cpp, generated_wrappers

from mamba_forge.references import optim as ro

ROOT = Path(__file__).resolve().parent.parent

_PRELUDE = cuda_mock("kernels/fixed/optim.cu", warp_fields="double vals[2][32];", shared="static") + r"""
// One barrier per exchange: the two value banks alternate, and a lane can only write a bank again after every
// lane has passed the next exchange's barrier, i.e. finished reading it.
inline thread_local int t_bank = 0;
#define MF_EMU_THREAD_START t_bank = 0;  // each emulated thread starts on bank 0
inline double exchange(double v, int src) {
  WarpCtx& w = my_warp(); int lane = tid_linear() & 31;
  double* bank = w.vals[t_bank]; t_bank ^= 1;
  bank[lane] = v; w.bar->arrive_and_wait();
  return (src >= 0 && src < 32) ? bank[src] : v;
}
inline float __shfl_xor_sync(unsigned, float v, int o) { return (float)exchange(v, (tid_linear() & 31) ^ o); }
inline double __shfl_xor_sync(unsigned, double v, int o) { return exchange(v, (tid_linear() & 31) ^ o); }
inline bool __any_sync(unsigned, bool p) {
  WarpCtx& w = my_warp(); int lane = tid_linear() & 31;
  double* bank = w.vals[t_bank]; t_bank ^= 1;
  bank[lane] = p ? 1.0 : 0.0; w.bar->arrive_and_wait();
  bool any = false; for (int i = 0; i < 32; ++i) any |= bank[i] != 0.0;
  return any;
}
inline void __syncwarp() { my_warp().bar->arrive_and_wait(); }
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void __threadfence() {}
template <class T> T __ldcg(const T* p) { return *p; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
"""

# bf16/f16 only have to compile here (the emulated kernels are f32): minimal stand-ins.
_BF16 = r"""#pragma once
struct __nv_bfloat16 { unsigned short x; };
struct __nv_bfloat162 { __nv_bfloat16 a, b; };
inline float __bfloat162float(__nv_bfloat16 h) { unsigned u = (unsigned)h.x << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { unsigned u; std::memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return {(unsigned short)(u >> 16)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
"""
_FP16 = r"""#pragma once
struct __half { unsigned short x; };
struct __half2 { __half a, b; };
inline float __half2float(__half) { return 0.f; }
inline __half __float2half_rn(float) { return {0}; }
inline __half2 __floats2half2_rn(float, float) { return {}; }
"""

_EMU_NAMES = ["grad_sumsq_partial_f32", "grad_region_sumsq_partial_f32", "grad_spans_sumsq_partial_f32",
              "grad_clip_coef_f32", "grad_region_scale_dev_f32", "grad_spans_scale_dev_f32"]



def compile_fixed(folder: Path, kernel_file: str, names: list[str]):
    """g++ the Fixed module's `kernel_file` (kernels/fixed/...) with the catalog's generated wrappers of `names` (the
    text NVRTC compiles) and the launcher, against this file's prelude and 16-bit stand-ins."""
    source = "#include KERNEL_CU\n" + generated_wrappers(names) + LAUNCH_CPP + entries_cpp(names)
    return compile_emulator(folder, {"prelude.h": _PRELUDE, "cuda_bf16.h": _BF16, "cuda_fp16.h": _FP16}, source,
                            ["-include", str(folder / "prelude.h"), f"-I{folder}",
                             f'-DKERNEL_CU="{ROOT / "kernels/fixed" / kernel_file}"'])


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return compile_fixed(tmp_path_factory.mktemp("optim-emu"), "optim.cu", _EMU_NAMES)


def launch(lib, name: str, grid: int, block: int, *args) -> None:
    """Arguments in the kernel's order: NumPy arrays (passed as their data pointer, or (array, element offset)),
    NumPy scalars of the parameter's C type."""
    keep, argv = [], (ctypes.c_void_p * len(args))()
    for i, a in enumerate(args):
        if isinstance(a, tuple):  # (array, element offset): a pointer into the array
            arr, off = a
            v = ctypes.c_void_p(arr.ctypes.data + off * arr.itemsize)
        elif isinstance(a, np.ndarray):
            v = ctypes.c_void_p(a.ctypes.data)
        else:
            v = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
                 np.dtype(np.float32): ctypes.c_float}[np.asarray(a).dtype](a.item())
        keep.append(v)
        argv[i] = ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
    assert lib.run(name.encode(), (ctypes.c_int * 3)(grid, 1, 1), (ctypes.c_int * 3)(block, 1, 1), argv) == 0


def _partials() -> np.ndarray:
    return np.full(ro.GRAD_PARTIALS, np.nan)  # poisoned: every partial must be stored


@pytest.mark.slow  # about 35 s per emulated launch: 512 virtual blocks of 256 OS threads
def test_flat_partials_wrap_the_fixed_grid_and_ignore_the_launched_grid(emu):
    rng = np.random.default_rng(31)
    n = 4 * ro.GRAD_PARTIALS * ro.GRAD_BLOCK + 4 * 300 + 3  # wraps around the 512 virtual blocks, ragged tail
    g = rng.uniform(-1, 1, n + 1).astype(np.float32)
    first = _partials()
    launch(emu, "grad_sumsq_partial_f32", 2, 256, first, g, np.int64(n))
    assert np.isfinite(first).all()
    np.testing.assert_allclose(first, ro.sumsq_partials(g[:n].astype(np.float64)), rtol=1e-12)
    # another launched grid and a misaligned arena (scalar loads instead of float4s): the same bits
    shifted = np.empty(n + 1, np.float32)
    shifted[1:] = g[:n]
    mis = _partials()
    launch(emu, "grad_sumsq_partial_f32", 5, 256, mis, (shifted, 1), np.int64(n))
    assert mis.tobytes() == first.tobytes(), "the partials depend on the launched grid or the alignment"


GEO = {"stripe_off": 5, "rows": 37, "cols": 33, "ld": 101, "vec_off": 15_000, "vec_len": 5_020}  # 9 past n


def _region_args(geo):
    return (np.int64(geo["stripe_off"]), np.int32(geo["rows"]), np.int32(geo["cols"]), np.int64(geo["ld"]),
            np.int64(geo["vec_off"]), np.int64(geo["vec_len"]))


@pytest.mark.slow  # about 35 s per emulated launch: 512 virtual blocks of 256 OS threads
def test_region_partials_are_the_stripe_then_the_vector(emu):
    rng = np.random.default_rng(32)
    n = 20_011
    g = np.full(n + 64, np.nan, np.float32)  # NaN past n: a read there would poison a partial
    g[:n] = rng.uniform(-1, 1, n)
    addr = ro.region_addresses(n, *GEO.values())
    want = ro.sumsq_partials(ro.region_values(g[:n], addr))
    got = _partials()
    launch(emu, "grad_region_sumsq_partial_f32", 3, 256, got, g, np.int64(n), *_region_args(GEO))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    # the same region of an arena one float further on: every load takes the other path, the bits stay
    g2 = np.full(n + 65, np.nan, np.float32)
    g2[1:n + 1] = g[:n]
    mis = _partials()
    launch(emu, "grad_region_sumsq_partial_f32", 1, 256, mis, (g2, 1), np.int64(n), *_region_args(GEO))
    assert mis.tobytes() == got.tobytes()
    # negative control: the comparison sees a wrong stripe stride
    wrong = ro.sumsq_partials(ro.region_values(g[:n], ro.region_addresses(n, *{**GEO, "ld": 102}.values())))
    assert not np.allclose(got, wrong, rtol=1e-9)


def test_region_scale_touches_exactly_the_region(emu):
    rng = np.random.default_rng(33)
    n = 20_011
    g0 = np.full(n + 64, np.nan, np.float32)
    g0[:n] = rng.uniform(-1, 1, n)
    for base in (0, 1):
        g = np.full(n + 65, np.nan, np.float32)
        g[base:base + n] = g0[:n]
        coef = np.array([0.37], np.float32)
        launch(emu, "grad_region_scale_dev_f32", 3, 256, (g, base), np.int64(n), *_region_args(GEO), coef)
        addr = ro.region_addresses(n, *GEO.values())
        inside = addr[addr < n]
        want = g0[:n].copy()
        want[inside] = want[inside] * np.float32(0.37)
        assert g[base:base + n].tobytes() == want.tobytes()
        assert np.isnan(g[base + n:]).all() and (base == 0 or np.isnan(g[0]))


@pytest.mark.slow  # about 35 s per emulated launch: 512 virtual blocks of 256 OS threads
def test_spans_partials_and_scale(emu):
    rng = np.random.default_rng(34)
    n = 50_003
    g = rng.uniform(-1, 1, n).astype(np.float32)
    offsets = np.array([-10, 1_001, 30_000, 49_990], np.int64)
    lengths = np.array([20, 20_000, 3, 100], np.int64)
    got = _partials()
    launch(emu, "grad_spans_sumsq_partial_f32", 2, 256, got, g, np.int64(n), offsets, lengths, np.int32(4))
    np.testing.assert_allclose(got, ro.spans_sumsq_partials(g.astype(np.float64), offsets, lengths), rtol=1e-12,
                               atol=1e-300)
    gs = g.copy()
    launch(emu, "grad_spans_scale_dev_f32", 4, 256, gs, np.int64(n), offsets, lengths, np.int32(4),
           np.array([0.5], np.float32))
    want = g.copy()
    for lo, hi in ro.span_bounds(offsets, lengths, n):
        want[lo:hi] = want[lo:hi] * np.float32(0.5)
    assert gs.tobytes() == want.tobytes()


def _host_chain(parts, max_norm, eps):
    total = 0.0
    for v in parts.tolist():
        total += v
    nrm = math.sqrt(total)
    c = float(np.float32(max_norm)) / (nrm + float(np.float32(eps)))
    return np.float32(1.0 if c > 1.0 else c), np.float32(nrm)


@pytest.mark.parametrize("count", [512, 777])
def test_clip_coef_is_the_ascending_chain(emu, count):
    rng = np.random.default_rng(35 + count)
    parts = np.exp(rng.uniform(np.log(1e-6), np.log(1e2), count))
    for max_norm in (0.5, 1e9):
        coef, norm = np.full(1, np.nan, np.float32), np.full(1, np.nan, np.float32)
        launch(emu, "grad_clip_coef_f32", 1, 256, coef, norm, parts, np.int32(count), np.float32(max_norm),
               np.float32(1e-6))
        wc, wn = _host_chain(parts, max_norm, 1e-6)
        assert norm[0].tobytes() == wn.tobytes() and coef[0].tobytes() == wc.tobytes()


def test_clip_coef_negative_control_a_tree_fold_differs(emu):
    parts = np.array([2.0**60] + [3.0] * 510 + [-(2.0**60)])
    assert float(np.sum(parts)) == 1152.0  # a pairwise fold keeps the threes; the chain absorbs them
    coef, norm = np.full(1, np.nan, np.float32), np.full(1, np.nan, np.float32)
    launch(emu, "grad_clip_coef_f32", 1, 256, coef, norm, parts, np.int32(512), np.float32(1.0), np.float32(1e-6))
    assert norm[0] == 0.0 and coef[0] == 1.0
