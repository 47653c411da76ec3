// Hopper batch-invariant TF32 GEMM, layout NT: C[M,N] = A[M,K] @ B[N,K]^T, f32 storage, TF32 math, f32 output.
// (B[N,K] is torch Linear's weight layout: Y = X W^T.) wgmma with .tf32 operands reads both A and B K-major from
// shared memory (PTX has no transpose for .tf32), which is exactly how NT stores them, so TMA copies 32 (k) x 64
// (rows) boxes of f32 with 128-byte swizzle straight into the operand layout: one box row = 32 f32 = 128 bytes.
//
// Structure: the warp-specialised ring of mf/wgmma_ring.cuh, as kernels/sm90a/wgmma.cu (a STAGES-deep TMA ring
// guarded by full/empty mbarriers, one producer warpgroup, NC consumer warpgroups, persistent grouped grid); what
// is this file's own is the element, BK, the boxes, the instruction (wgmma.mma_async m64nBNk8 .f32.tf32.tf32) and
// the epilogue (C stored from registers).
//
// Arithmetic contract (batch invariance by construction): one f32 accumulator per output starting at +0; k-tiles
// of 32 in ascending order over ceil(K/32) tiles, inside each the four k8 slices ascending, each one wgmma step;
// the whole K range in one CTA (no split-K, no atomics); the K tail, and rows/columns past M and N, are TMA zero
// fill (+0 bits: zeros add exactly). Inputs are truncated to TF32 by the instruction (mf/wgmma_tf32.cuh). Which CTA
// or register computes an element never changes what is added to it, so a row's bits do not depend on M.
//
// NN (B[K,N] row-major) is not served here: tf32 wgmma cannot read an N-major B. A caller with a K x N weight
// stores it transposed once ([N,K], as torch Linear does) and calls this NT rung; the NN tf32 route keeps its
// mma.sync rungs.
//
// Host rules (mamba_forge/gpu/tma.py gemm_tensor_maps_tf32): K % 4 == 0 (16-byte global row strides of A and B),
// 16-byte aligned bases; any M, N >= 1 (C is stored with 8-byte pairs only where N is even).
#include "mf/common.cuh"
#include "mf/tma.cuh"
#include "mf/wgmma.cuh"
#include "mf/wgmma_ring.cuh"
#include "mf/wgmma_tf32.cuh"

namespace mf {

constexpr int TF_BK = 32;        // k elements per stage: one 128-byte swizzle row of f32
constexpr int TF_BOX_ROWS = 64;  // every TMA box is 32 (k) x 64 rows of f32 = 8 KB
constexpr int TF_GROUP_M = 8;    // grouped tile order: 8 row tiles walk the N tiles together (L2 reuse of B)

template <int BM, int BN, int STAGES>
struct Tf32WgSmem {
  static constexpr int A_BYTES = BM * TF_BK * 4;
  static constexpr int B_BYTES = BN * TF_BK * 4;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int BAR_OFFSET = STAGES * STAGE_BYTES;
  // dynamic smem asked for: ring + 2*STAGES 8-byte barriers + 1024 bytes to align the base to 1024.
  static constexpr int TOTAL = BAR_OFFSET + 2 * STAGES * 8 + 1024;
};

#if defined(MF_HAS_WGMMA)

template <int BM, int BN, int NC, int STAGES>
MF_DEVICE void gemm_wgmma_tf32_nt(const TmaDesc* tmA, const TmaDesc* tmB, float* __restrict__ C, int M, int N, int K) {
  using S = Tf32WgSmem<BM, BN, STAGES>;
  constexpr int MB = BM / (64 * NC);  // m64 blocks per consumer warpgroup
  static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma N is 64, 128 or 256 here");
  static_assert(BM % TF_BOX_ROWS == 0 && BN % TF_BOX_ROWS == 0, "tiles are whole TMA boxes");
  constexpr u32 BOX_BYTES = TF_BOX_ROWS * TF_BK * 4;

  extern __shared__ unsigned char tf_smem_raw[];
  const u32 base = (smem_addr(tf_smem_raw) + 1023u) & ~1023u;  // 128-byte swizzle atoms need 1024 alignment

  const bool pair = (N % 2) == 0;  // (row * N + col) even for every even col: 8-byte aligned float2 stores
  auto boxes = [&](u32 sa, u32 sb, u32 fb, int m0, int n0, int k0) {
#pragma unroll
    for (int j = 0; j < BM / TF_BOX_ROWS; ++j) tma_load_2d(sa + j * BOX_BYTES, tmA, fb, k0, m0 + j * TF_BOX_ROWS);
#pragma unroll
    for (int j = 0; j < BN / TF_BOX_ROWS; ++j) tma_load_2d(sb + j * BOX_BYTES, tmB, fb, k0, n0 + j * TF_BOX_ROWS);
  };
  auto k_tile = [&](float (&acc)[MB][BN / 2], u32 sa, u32 sb, int c) {
#pragma unroll
    for (int kk = 0; kk < TF_BK / 8; ++kk) {
      // Both operands K-major: rows of 128 B (32 f32), 8-row atoms 1024 B apart (SBO), the k8 slice 32 B in
      // (the swizzle is applied by the hardware to the full address, as TMA wrote it). LBO is unused here.
      const u64 db = wgmma_desc_sw128(sb + kk * 32, 16, 1024);
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        const u32 a_blk = sa + (c * MB + mb) * BOX_BYTES;  // 64 rows of the tile = one 8 KB box
        const u64 da = wgmma_desc_sw128(a_blk + kk * 32, 16, 1024);
        WgmmaTf32<BN>::run(acc[mb], da, db);
      }
    }
  };
  auto epilogue = [&](float (&acc)[MB][BN / 2], int tm, int tn, int c, int warp, int lane, int) {
    wgmma_store_pairs<BM, BN, MB, 1>(C, tm, tn, c, warp, lane, M, N, [&](float* p, int mb, int i, int col) {
      if (pair) {  // N even and col even: col + 1 < N too
        *reinterpret_cast<float2*>(p) = make_float2(acc[mb][i], acc[mb][i + 1]);
      } else {
        p[0] = acc[mb][i];
        if (col + 1 < N) p[1] = acc[mb][i + 1];
      }
    });
  };
  wgmma_ring<S, BM, BN, NC, STAGES, TF_BK, TF_GROUP_M>(base, tmA, tmB, M, N, K, boxes, k_tile, epilogue, [](int) {});
}

#endif  // MF_HAS_WGMMA

}  // namespace mf

// One symbol per tile. Threads: 128 per consumer warpgroup + one producer warpgroup; one CTA per SM (setmaxnreg
// requires __launch_bounds__(threads, 1)). A and B stay in the ABI for the qualifier; the tensor maps address them.
#define MF_GEMM_WGMMA_TF32_NT(NAME, BM, BN, NC, STAGES) \
  extern "C" __global__ void __launch_bounds__(128 * ((NC) + 1), 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, float* __restrict__ C, \
      const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; \
    mf::gemm_wgmma_tf32_nt<BM, BN, NC, STAGES>(&tmA, &tmB, C, M, N, K); \
  }
