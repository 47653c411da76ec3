// TMA (cp.async.bulk.tensor) and mbarrier helpers for Hopper-class kernels (sm_90+).
// Tensor maps travel as kernel parameters passed by value (`const __grid_constant__ mf::TmaDesc`), encoded on the
// host by mamba_forge/tma.py with cuTensorMapEncodeTiled; NVRTC cannot include <cuda.h>, hence our own 128-byte type.
// Every helper takes shared-memory addresses in the shared state space (32-bit, from smem_addr).
#pragma once
#include "mf/common.cuh"

namespace mf {

struct alignas(64) TmaDesc {
  unsigned long long v[16];
};

MF_DEVICE u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MF_HAS_TMA 1

MF_DEVICE void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Make the barrier initialisation visible to the async proxy (TMA) before any copy signals it.
MF_DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

MF_DEVICE void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One 16-byte cp.async (LSU) copy into shared memory, zero-filled (no source byte read) when !ok.
MF_DEVICE void cp_async16_zfill(u32 dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
// An arrival on the barrier once this thread's earlier cp.async copies have landed (counted in its init count).
MF_DEVICE void cp_async_mbar_arrive_noinc(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// The transaction bytes of a phase that will not arrive (a box the expectation counted that was not issued whole):
// counted as arrived, so the phase completes when the bytes that do come have.
MF_DEVICE void mbar_complete_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.complete_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
MF_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase with this parity has completed (parity 1 on a fresh barrier returns at once).
// Watchdog: a wait that outlives MF_MBAR_SPIN_LIMIT polls (seconds; every legitimate wait here lasts microseconds)
// traps, so a protocol bug fails the launch with an error instead of hanging the GPU.
#ifndef MF_MBAR_SPIN_LIMIT
#define MF_MBAR_SPIN_LIMIT (1u << 26)
#endif
MF_DEVICE bool mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
MF_DEVICE void mbar_wait(u32 bar, u32 parity) {
  for (u32 polls = 0; !mbar_try_wait(bar, parity); ++polls)
    if (polls == MF_MBAR_SPIN_LIMIT) __trap();
}

// 2-D tiled TMA load of one box at coordinates (c0 = innermost, c1) into shared memory; completion is signalled
// on `bar` as transaction bytes. Out-of-bounds elements of the box are filled with zeros by the hardware.
MF_DEVICE void tma_load_2d(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// 2-D tiled TMA store of one box from shared memory; elements outside the tensor are not written. Completion is
// tracked per thread with bulk groups: commit, then wait (".read": the shared memory may be reused).
MF_DEVICE void tma_store_2d(const TmaDesc* map, u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
               ::"l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
MF_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
MF_DEVICE void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
MF_DEVICE void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Named barrier over `threads` threads (a multiple of 32); id 0 is __syncthreads.
MF_DEVICE void named_bar_sync(u32 id, u32 threads) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }

MF_DEVICE void tma_prefetch_desc(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// Ordinary shared-memory stores that TMA or wgmma then read need this fence between them.
MF_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#endif

}  // namespace mf
