// Portable TF32 tensor-core tile GEMM (mma.sync m16n8k8 tf32, f32 accumulate) with a cp.async multi-stage pipeline.
// Included by the Ada TF32 and Sm120 modules; only sm_80+ instructions (also built for sm_90a, check role).
//
// Layout NN, dense row-major f32: C[M,N] = tf32(A)[M,K] tf32(B)[K,N], inputs rounded to TF32 with cvt.rna
// (round to nearest, ties away) at fragment load, f32 accumulation. Batch invariant by construction: one warp owns
// each C element for the whole K range, k-tiles and k8 steps ascending; out-of-range elements are zero-filled.
// PRODUCER = 1: one extra warp issues every global->shared copy and the compute warps only compute.
// PAIR = 1: the epilogue writes adjacent column pairs as one 8-byte store when N is even (same values).
#pragma once
#include "mf/tile_common.cuh"
#include "mf/tile_pipe.cuh"

namespace mf {
namespace tile {

MF_DEVICE u32 to_tf32_rna(float x) {
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

MF_DEVICE void mma_tf32_1688(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One k-tile of the TF32 tiles (tf32_nn here, tf32_nn_tma in mf/tile_tma.cuh) from the stage at STAGE (A [BM][S::AS]
// then B [BK][S::BS] floats): BK / 8 k8 steps ascending; the warp whose tile starts at row WROW, column WCOL reads
// its fragments (g = lane / 4, t = lane % 4), rounds them with cvt.rna and runs mma.sync m16n8k8 into ACC
// [MT][NT][4]. Statements pasted into the caller, not a function: NVVM simplifies a callee on its own before
// inlining it, and for code that updates the accumulators inside the k-loop that renumbers their registers (the
// same instructions, other cubin bytes).
#define MF_TF32_K_TILE(ACC, STAGE, S, BK, MT, NT, WROW, WCOL, g, t)                                   \
  const float* As = STAGE;                                                                            \
  const float* Bs = As + S::A_ELEMS;                                                                  \
  _Pragma("unroll") for (int kk = 0; kk < BK / 8; ++kk) {                                             \
    u32 af[MT][4];                                                                                    \
    _Pragma("unroll") for (int i = 0; i < MT; ++i) {                                                  \
      const float* a = As + (WROW + i * 16 + g) * S::AS + kk * 8 + t;                                 \
      af[i][0] = to_tf32_rna(a[0]);                                                                   \
      af[i][1] = to_tf32_rna(a[8 * S::AS]);                                                           \
      af[i][2] = to_tf32_rna(a[4]);                                                                   \
      af[i][3] = to_tf32_rna(a[8 * S::AS + 4]);                                                       \
    }                                                                                                 \
    _Pragma("unroll") for (int j = 0; j < NT; ++j) {                                                  \
      const float* b = Bs + (kk * 8 + t) * S::BS + WCOL + j * 8 + g;                                  \
      const u32 b0 = to_tf32_rna(b[0]), b1 = to_tf32_rna(b[4 * S::BS]);                               \
      _Pragma("unroll") for (int i = 0; i < MT; ++i) mma_tf32_1688(ACC[i][j], af[i], b0, b1);         \
    }                                                                                                 \
  }

template <int BM, int BN, int BK, int STAGES> struct Tf32Smem {
  static constexpr int AS = BK + 4, BS = BN + 4;  // padded strides (floats): fragment reads hit distinct banks
  static constexpr int A_ELEMS = BM * AS, B_ELEMS = BK * BS, STAGE_ELEMS = A_ELEMS + B_ELEMS;
  static constexpr int BYTES = STAGES * STAGE_ELEMS * 4;
};

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int PRODUCER, int PAIR>
MF_DEVICE void tf32_nn(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N,
                       int K) {
  using S = Tf32Smem<BM, BN, BK, STAGES>;
  constexpr int COMPUTE = 32 * WARPS_M * WARPS_N;
  constexpr int LOADERS = PRODUCER ? 32 : COMPUTE;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "warp tile must be whole m16n8 tiles");
  static_assert(BK % 8 == 0 && STAGES >= 2, "BK multiple of 8, at least 2 stages");
  extern __shared__ __align__(16) unsigned char tf32_smem_raw[];
  float* smem = reinterpret_cast<float*>(tf32_smem_raw);

  int m0, n0;
  if (!row_major_tile<BM, BN>(M, N, m0, n0)) return;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const bool loader = PRODUCER ? (warp == WARPS_M * WARPS_N) : true;
  const bool computer = PRODUCER ? !loader : true;
  const int ltid = PRODUCER ? lane : tid;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const bool a_vec = (K % 4 == 0) && aligned16(A);
  const bool b_vec = (N % 4 == 0) && aligned16(B);
  const int k_tiles = (K + BK - 1) / BK;

  auto load_stage = [&](int stage, int kt) {
    float* As = smem + stage * S::STAGE_ELEMS;
    float* Bs = As + S::A_ELEMS;
    const int k0 = kt * BK;
    MF_TILE_LOAD_ASYNC(float, As, A, BM, BK, S::AS, m0, k0, M, K, K, a_vec, ltid, LOADERS, 4, MF_CHUNK_CP4_NOOK)
    MF_TILE_LOAD_ASYNC(float, Bs, B, BK, BN, S::BS, k0, n0, K, N, N, b_vec, ltid, LOADERS, 4, MF_CHUNK_CP4_NOOK)
  };

  float acc[MT][NT][4];
  zero_acc(acc);

  MF_CP_ASYNC_FILL(STAGES, k_tiles, load_stage, loader &&, "unroll")
  const int g = lane / 4, t = lane % 4;
  for (int kt = 0; kt < k_tiles; ++kt) {
    MF_CP_ASYNC_NEXT(STAGES, kt, k_tiles, load_stage, loader &&)
    if (computer) {
      MF_TF32_K_TILE(acc, smem + (kt % STAGES) * S::STAGE_ELEMS, S, BK, MT, NT, wm * WTM, wn * WTN, g, t);
    }
  }
  cp_async_wait<0>();
  if (!computer) return;

  const bool pair = PAIR && (N % 2 == 0) && ((reinterpret_cast<u64>(C) & 7ull) == 0);
  MF_FRAG_TILES(MT, NT, m0 + wm * WTM, n0 + wn * WTN, g, t, MF_TF32_PAIR_OUT)
}

}  // namespace tile
}  // namespace mf

// NAME(C, A, B, M, N, K): one CTA per BM x BN tile (row-major tile order), grid = ceil(M/BM) * ceil(N/BN).
#define MF_TILE_TF32_NN(NAME, BM, BN, BK, WARPS_M, WARPS_N, STAGES, PRODUCER, PAIR) \
  extern "C" __global__ void __launch_bounds__(32 * (WARPS_M) * (WARPS_N) + 32 * (PRODUCER)) NAME( \
      float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K) { \
    mf::tile::tf32_nn<BM, BN, BK, WARPS_M, WARPS_N, STAGES, PRODUCER, PAIR>(C, A, B, M, N, K); \
  }
