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

  const int tiles_n = (N + BN - 1) / BN, tiles_m = (M + BM - 1) / BM;
  if ((int)blockIdx.x >= tiles_m * tiles_n) return;
  const int m0 = (blockIdx.x / tiles_n) * BM, n0 = (blockIdx.x % tiles_n) * BN;
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
    for (int c = ltid; c < BM * BK / 4; c += LOADERS) {
      const int r = c / (BK / 4), kc = (c % (BK / 4)) * 4;
      const int m = m0 + r, k = k0 + kc;
      float* dst = As + r * S::AS + kc;
      if (a_vec) {
        const bool ok = m < M && k < K;
        cp_async16(saddr(dst), ok ? A + (i64)m * K + k : A, ok);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) cp_async4(saddr(dst + j), (m < M && k + j < K) ? A + (i64)m * K + k + j : A, m < M && k + j < K);
      }
    }
    for (int c = ltid; c < BK * BN / 4; c += LOADERS) {
      const int r = c / (BN / 4), nc = (c % (BN / 4)) * 4;
      const int k = k0 + r, n = n0 + nc;
      float* dst = Bs + r * S::BS + nc;
      if (b_vec) {
        const bool ok = k < K && n < N;
        cp_async16(saddr(dst), ok ? B + (i64)k * N + n : B, ok);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) cp_async4(saddr(dst + j), (k < K && n + j < N) ? B + (i64)k * N + n + j : B, k < K && n + j < N);
      }
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (loader && s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  const int g = lane / 4, t = lane % 4;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // k-tile kt is in shared memory; the stage refilled next was consumed at kt - 1
    const int pre = kt + STAGES - 1;
    if (loader && pre < k_tiles) load_stage(pre % STAGES, pre);
    cp_async_commit();
    if (computer) {
      const float* As = smem + (kt % STAGES) * S::STAGE_ELEMS;
      const float* Bs = As + S::A_ELEMS;
#pragma unroll
      for (int kk = 0; kk < BK / 8; ++kk) {
        u32 af[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const float* a = As + (wm * WTM + i * 16 + g) * S::AS + kk * 8 + t;
          af[i][0] = to_tf32_rna(a[0]);
          af[i][1] = to_tf32_rna(a[8 * S::AS]);
          af[i][2] = to_tf32_rna(a[4]);
          af[i][3] = to_tf32_rna(a[8 * S::AS + 4]);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float* b = Bs + (kk * 8 + t) * S::BS + wn * WTN + j * 8 + g;
          const u32 b0 = to_tf32_rna(b[0]), b1 = to_tf32_rna(b[4 * S::BS]);
#pragma unroll
          for (int i = 0; i < MT; ++i) mma_tf32_1688(acc[i][j], af[i], b0, b1);
        }
      }
    }
  }
  cp_async_wait<0>();
  if (!computer) return;

  const bool pair = PAIR && (N % 2 == 0) && ((reinterpret_cast<u64>(C) & 7ull) == 0);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * WTM + i * 16 + g + 8 * h;
        const int col = n0 + wn * WTN + j * 8 + t * 2;
        if (row >= M) continue;
        float* p = C + (i64)row * N + col;
        if (pair && col + 1 < N) {
          *reinterpret_cast<float2*>(p) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else {
          if (col < N) p[0] = acc[i][j][2 * h];
          if (col + 1 < N) p[1] = acc[i][j][2 * h + 1];
        }
      }
}

}  // namespace tile
}  // namespace mf

// NAME(C, A, B, M, N, K): one CTA per BM x BN tile (row-major tile order), grid = ceil(M/BM) * ceil(N/BN).
#define MF_TILE_TF32_NN(NAME, BM, BN, BK, WARPS_M, WARPS_N, STAGES, PRODUCER, PAIR) \
  extern "C" __global__ void __launch_bounds__(32 * (WARPS_M) * (WARPS_N) + 32 * (PRODUCER)) NAME( \
      float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K) { \
    mf::tile::tf32_nn<BM, BN, BK, WARPS_M, WARPS_N, STAGES, PRODUCER, PAIR>(C, A, B, M, N, K); \
  }
