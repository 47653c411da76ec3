"""Host emulation of the exact-f32 decode GEMM rungs (mf/decode_f32.cuh: gemm_bi_f32_f32_decode_*).

The real mf/decode_f32.cuh and mf/common.cuh are compiled by g++ against a prelude that emulates the CUDA subset
they use (tests/host_emulation.py: one std::thread per CUDA thread, std::barrier for __syncthreads) and a stand-in
for mf/tile_common.cuh's cp.async helpers. The copies either land at issue, or as late as the ring allows (at the
cp.async.wait_group that needs them: a read of a stage before its wait, or a wait count one too small, then reads
stale data), and each copy is checked: its global source inside A or B, its shared destination inside the
catalog's dynamic shared memory, 16-byte copies 16-byte aligned at both ends, and no copy left in flight when a
thread ends. Launched with the catalog's block, grid and dynamic shared memory, the outputs are compared bit for
bit with the host FFMA chain (mamba_forge.references.gemm.chain_f32) at M = 1..17 (one and several row chunks),
on the 16-byte and 4-byte copy paths (aligned and odd N, K, misaligned pointers), with a K tail and a ring that
wraps, and with a -0 chain that a read of the zero-filled slots past K would turn into +0. It checks indexing,
the ring protocol and store coverage on the CPU, not timing (tests/gpu/test_gemm_skinny.py does, on the GPU).
Skips without g++ -std=c++20.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from host_emulation import LAUNCH_CPP, compile_emulator, cuda_mock, entries_cpp

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.core import expr
from mamba_forge.references import gemm as R

CAT = load_catalog(default_catalog_path())
NAMES = sorted(n for n, s in CAT.symbols.items() if s.family == "gemm_bi_exact_f32_decode")
GUARD = 16  # NaN elements after C that no launch may touch
SMEM_CAP = 256 * 1024

_PRELUDE = cuda_mock("mf/decode_f32.cuh", includes=["math.h", "atomic", "deque", "utility"]) + r"""
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int) { std::abort(); return v; }  // unused by the decode kernel
inline double __shfl_xor_sync(unsigned, double v, int) { std::abort(); return v; }
inline float __fadd_rn(float a, float b) { return a + b; }  // SSE: one correctly rounded f32 add

// the cp.async stand-in's state (mf/tile_common.cuh below)
struct CpOp { unsigned char* dst; const unsigned char* src; int bytes; bool read; };
inline unsigned char* g_smem = nullptr;
inline long g_smem_bytes = 0;
inline int g_mode = 0;  // 0: a copy lands at issue; 1: at the wait_group that needs it
inline int g_slack = 0;  // negative control: every wait_group leaves this many more groups in flight
inline std::vector<std::pair<const unsigned char*, long>> g_ranges;  // where copies may read
inline std::atomic<int> g_bad{0};  // 1: read outside A/B, 2: write outside smem, 4: misaligned, 8: left in flight
inline thread_local std::vector<CpOp> t_open;
inline thread_local std::deque<std::vector<CpOp>> t_groups;
inline thread_local int t_pending = 0;
struct PendingCheck { ~PendingCheck() { if (t_pending) g_bad |= 8; } };
inline thread_local PendingCheck t_check;
#define MF_EMU_THREAD_START { (void)&t_check; t_pending = 0; t_open.clear(); t_groups.clear(); }
inline void cp_land(const CpOp& o) {
  if (o.read) std::memcpy(o.dst, o.src, o.bytes); else std::memset(o.dst, 0, o.bytes);
  --t_pending;
}
"""

_TILE_COMMON = r"""// stand-in for mf/tile_common.cuh: the cp.async helpers mf/decode_f32.cuh uses, checked, landing by g_mode
#pragma once
#include "mf/common.cuh"
namespace mf {
namespace tile {
inline u32 saddr(const void* p) { return (u32)(reinterpret_cast<const unsigned char*>(p) - g_smem); }
inline void cp_issue(u32 dst, const void* src, int bytes, bool pred) {
  const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
  bool inside = false;
  for (auto& r : g_ranges) inside |= s >= r.first && s + bytes <= r.first + r.second;
  if (pred && !inside) g_bad |= 1;
  if ((long)dst + bytes > g_smem_bytes) g_bad |= 2;
  if (bytes == 16 && ((dst & 15u) || (reinterpret_cast<uintptr_t>(src) & 15u))) g_bad |= 4;
  if ((g_bad & 3) != 0) return;
  CpOp o{g_smem + dst, s, bytes, pred};
  ++t_pending;
  if (g_mode == 0) cp_land(o); else t_open.push_back(o);
}
inline void cp_async16(u32 dst, const void* src, bool pred) { cp_issue(dst, src, 16, pred); }
inline void cp_async4(u32 dst, const void* src, bool pred) { cp_issue(dst, src, 4, pred); }
inline void cp_async_commit() { t_groups.push_back(std::move(t_open)); t_open.clear(); }
template <int N> inline void cp_async_wait() {
  while ((int)t_groups.size() > N + g_slack) {
    for (auto& o : t_groups.front()) cp_land(o);
    t_groups.pop_front();
  }
}
}  // namespace tile
}  // namespace mf
"""

_STUBS = {
    "cuda_bf16.h": "#pragma once\nstruct __nv_bfloat16 { unsigned short x; };\n"
                   "struct __nv_bfloat162 { __nv_bfloat16 a, b; };\n"
                   "inline float __bfloat162float(__nv_bfloat16) { return 0.f; }\n"
                   "inline __nv_bfloat16 __float2bfloat16_rn(float) { return {0}; }\n"
                   "inline __nv_bfloat162 __floats2bfloat162_rn(float, float) { return {}; }\n",
    "cuda_fp16.h": "#pragma once\nstruct __half { unsigned short x; };\nstruct __half2 { __half a, b; };\n"
                   "inline float __half2float(__half) { return 0.f; }\n"
                   "inline __half __float2half_rn(float) { return {0}; }\n"
                   "inline __half2 __floats2half2_rn(float, float) { return {}; }\n",
}


def _emu_cpp() -> str:
    inst = "\n".join(f"MF_GEMM_BI_F32_DECODE({n}, {', '.join(CAT.symbols[n].macro_args)})" for n in NAMES)
    return (
        '#include "mf/decode_f32.cuh"\n'
        f"namespace mf {{ namespace decode {{ alignas(16) unsigned char decode_smem_raw[{SMEM_CAP}]; }} }}\n"
        "static struct SmemBase { SmemBase() { g_smem = mf::decode::decode_smem_raw; } } smem_base_;\n"
        f"{inst}\n"
        'extern "C" void emu_reset(int mode, long smem, int slack) { g_mode = mode; g_smem_bytes = smem; '
        "g_slack = slack; g_ranges.clear(); g_bad = 0; std::memset(g_smem, 0x7f, sizeof(mf::decode::decode_smem_raw)); }\n"
        'extern "C" void emu_range(const void* p, long bytes) { g_ranges.push_back({(const unsigned char*)p, '
        "bytes}); }\n"
        'extern "C" int emu_bad() { return g_bad; }\n'
    ) + LAUNCH_CPP + entries_cpp(NAMES)


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode-emu")
    lib = compile_emulator(d, {"prelude.h": _PRELUDE, "mf/tile_common.cuh": _TILE_COMMON, **_STUBS}, _emu_cpp(),
                           ["-include", str(d / "prelude.h"), f"-I{d}", "-fno-strict-aliasing", "-Wno-unknown-pragmas"])
    lib.emu_reset.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int]
    lib.emu_range.argtypes = [ctypes.c_void_p, ctypes.c_long]
    return lib


def _grid(sym, m: int, n: int, k: int) -> tuple[int, int, int]:
    fam = CAT.module(sym.module).family(sym.family)
    env = {k_: v for k_, v in sym.params_env.items() if isinstance(v, int)}
    env.update({"M": m, "N": n, "K": k})
    g = [int(expr.evaluate(e, env)) for e in fam.launch.grid]
    return tuple(g + [1] * (3 - len(g)))  # type: ignore[return-value]


def run(lib, name: str, a2: np.ndarray, b2: np.ndarray, bias: np.ndarray | None, mode: int, offset: int = 0,
        slack: int = 0):
    """One launch of `name` on A [M, K], B [K, N] (float32; `offset` elements into their buffers, so offset 1
    misaligns them); returns C [M, N], checked for stores outside it and for copy faults. `slack`: the negative
    control's wrong wait count."""
    sym = CAT.symbols[name]
    m, k = a2.shape
    n = b2.shape[1]
    A = np.zeros(m * k + offset, np.float32)
    A[offset:] = a2.reshape(-1)
    B = np.zeros(k * n + offset, np.float32)
    B[offset:] = b2.reshape(-1)
    C = np.full(m * n + GUARD, np.nan, np.float32)
    lib.emu_reset(mode, sym.dynamic_smem, slack)
    lib.emu_range(A.ctypes.data + 4 * offset, 4 * m * k)
    lib.emu_range(B.ctypes.data + 4 * offset, 4 * k * n)
    ptrs = [ctypes.c_void_p(C.ctypes.data), ctypes.c_void_p(A.ctypes.data + 4 * offset),
            ctypes.c_void_p(B.ctypes.data + 4 * offset),
            ctypes.c_void_p(bias.ctypes.data if bias is not None else None)]
    keep = ptrs + [ctypes.c_int32(m), ctypes.c_int32(n), ctypes.c_int32(k)]
    argv = (ctypes.c_void_p * len(keep))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in keep])
    grid = (ctypes.c_int * 3)(*_grid(sym, m, n, k))
    assert lib.run(name.encode(), grid, (ctypes.c_int * 3)(*sym.block), argv) == 0
    bad = lib.emu_bad()
    assert bad == 0, f"{name} M={m} N={n} K={k}: copy fault mask {bad} (1 read outside A/B, 2 write outside the " \
                     "dynamic smem, 4 misaligned 16-byte copy, 8 copies in flight at exit)"
    assert np.isnan(C[m * n:]).all(), f"{name}: stored past C"
    return C[: m * n].reshape(m, n)


def _rand(rng, shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def _same(got, want) -> bool:
    return np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("mode", [0, 1], ids=["land-at-issue", "land-at-wait"])
@pytest.mark.parametrize("name", NAMES)
def test_decode_rows_are_the_chain(emu, name, mode):
    # (N, K): 16-byte copies with a K tail and a ring that wraps twice; 4-byte copies (odd N and K) with fewer
    # k-tiles than the ring has stages
    rng = np.random.default_rng(41 + mode)
    for n, k in [(72, 1092), (37, 203)]:
        b2 = _rand(rng, (k, n))
        for m in (1, 3, 8, 9, 17):
            a2 = _rand(rng, (m, k))
            bias = _rand(rng, n) if m % 2 else None
            got = run(emu, name, a2, b2, bias, mode)
            assert _same(got, R.chain_f32(a2, b2, bias)), f"{name} M={m} N={n} K={k}: not the chain"


@pytest.mark.parametrize("name", NAMES)
def test_misaligned_pointers_and_tiny_shapes_give_the_same_bits(emu, name):
    rng = np.random.default_rng(43)
    m, n, k = 2, 40, 132
    a2, b2, bias = _rand(rng, (m, k)), _rand(rng, (k, n)), _rand(rng, n)
    aligned = run(emu, name, a2, b2, bias, 1)
    assert _same(aligned, R.chain_f32(a2, b2, bias))
    assert _same(run(emu, name, a2, b2, bias, 1, offset=1), aligned), f"{name}: the 4-byte copy path differs"
    for m, n, k in [(1, 1, 1), (5, 3, 2), (1, 33, 64)]:
        a2, b2, bias = _rand(rng, (m, k)), _rand(rng, (k, n)), _rand(rng, n)
        assert _same(run(emu, name, a2, b2, bias, 1), R.chain_f32(a2, b2, bias)), f"{name} {m}x{n}x{k}"


@pytest.mark.parametrize("name", NAMES)
def test_a_negative_zero_chain_stays_negative_zero_through_the_k_tail(emu, name):
    """Every product underflows to -0, so every chain is -0 (fma(-tiny, tiny, -0) = -0); a step over a zero-filled
    slot past K (fma(+0, +0, -0) = +0) would flip it. Negative control: the chain with one +0 step appended."""
    m, n, k = 3, 40, 70
    a2 = np.full((m, k), -1e-30, np.float32)
    b2 = np.full((k, n), 1e-30, np.float32)
    want = R.chain_f32(a2, b2)
    assert (want.view(np.uint32) == 0x80000000).all()
    padded = R.chain_f32(np.pad(a2, ((0, 0), (0, 1))), np.pad(b2, ((0, 1), (0, 0))))
    assert not _same(padded, want)
    for mode in (0, 1):
        assert _same(run(emu, name, a2, b2, None, mode), want), f"{name}: a -0 chain changed sign"


def test_the_emulation_sees_a_wrong_wait_count(emu):
    """Negative control for the land-at-wait mode: every cp.async.wait_group told to leave one group more in flight
    than the kernel asks (a ring that waits one stage too few) makes the kernel read stages whose copies have not
    landed, and the comparison sees it."""
    name = NAMES[0]
    rng = np.random.default_rng(44)
    a2, b2 = _rand(rng, (1, 1092)), _rand(rng, (1092, 64))
    assert _same(run(emu, name, a2, b2, None, 1), R.chain_f32(a2, b2, None))
    with pytest.raises(AssertionError, match="copy fault mask 8|not the chain"):
        got = run(emu, name, a2, b2, None, 1, slack=1)
        assert _same(got, R.chain_f32(a2, b2, None)), "not the chain"
