// Portable tensor-core tile GEMM (mma.sync m16n8k16, bf16/f16 in, f32 accumulate) with a cp.async multi-stage
// shared-memory pipeline and ldmatrix fragment loads. Included by the Ada (sm_89) and Sm120 modules; only sm_80+ instructions, so it also builds for sm_90a (check role).
//
// Layout NN, dense row-major: C[M,N] = A[M,K] B[K,N] (+ nothing); C is T or f32 (TO).
// Batch invariance by construction: one tile shape per symbol; each C element is accumulated by one warp over
// the whole K range, k-tiles ascending and k16 steps ascending, the same instruction sequence for every row;
// tiles outside M/N/K are zero-filled in shared memory (zeros add nothing). No split-K, no atomics.
// Any M, N, K >= 0: 16-byte cp.async when the row's contiguous extent is a multiple of 8 and the base is 16-byte
// aligned, element loads otherwise; both put the same values in shared memory.
#pragma once
#include "mf/tile_common.cuh"

namespace mf {
namespace tile {

template <typename T> struct Mma16816;
template <> struct Mma16816<__nv_bfloat16> {
  static MF_DEVICE void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma16816<__half> {
  static MF_DEVICE void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Dynamic shared memory of one instance, in bytes (the catalog's dynamic_smem expression says the same).
template <int BM, int BN, int BK, int STAGES> struct MmaSmem {
  static constexpr int AS = BK + 8, BS = BN + 8;  // padded row strides (elements): ldmatrix rows hit distinct banks
  static constexpr int A_ELEMS = BM * AS, B_ELEMS = BK * BS, STAGE_ELEMS = A_ELEMS + B_ELEMS;
  static constexpr int BYTES = STAGES * STAGE_ELEMS * 2;
};

template <typename T, typename TO, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, bool GROUPED>
MF_DEVICE void mma_nn(TO* __restrict__ C, const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) {
  using S = MmaSmem<BM, BN, BK, STAGES>;
  constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN && NT % 2 == 0, "warp tile must be 16 x 16k");
  static_assert(BK % 16 == 0 && STAGES >= 2, "BK multiple of 16, at least 2 stages");
  extern __shared__ __align__(16) unsigned char mma_smem_raw[];
  T* smem = reinterpret_cast<T*>(mma_smem_raw);

  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  if ((int)blockIdx.x >= tiles_m * tiles_n) return;
  int tm, tn;
  tile_coords<GROUPED>(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const bool a_vec = (K % 8 == 0) && aligned16(A);
  const bool b_vec = (N % 8 == 0) && aligned16(B);
  const int k_tiles = (K + BK - 1) / BK;

  auto load_stage = [&](int stage, int kt) {
    T* As = smem + stage * S::STAGE_ELEMS;
    T* Bs = As + S::A_ELEMS;
    const int k0 = kt * BK;
    for (int c = tid; c < BM * BK / 8; c += THREADS) {
      const int r = c / (BK / 8), kc = (c % (BK / 8)) * 8;
      const int m = m0 + r, k = k0 + kc;
      T* dst = As + r * S::AS + kc;
      if (a_vec) {
        const bool ok = m < M && k < K;
        cp_async16(saddr(dst), ok ? A + (i64)m * K + k : A, ok);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) dst[j] = (m < M && k + j < K) ? A[(i64)m * K + k + j] : from_f32<T>(0.f);
      }
    }
    for (int c = tid; c < BK * BN / 8; c += THREADS) {
      const int r = c / (BN / 8), nc = (c % (BN / 8)) * 8;
      const int k = k0 + r, n = n0 + nc;
      T* dst = Bs + r * S::BS + nc;
      if (b_vec) {
        const bool ok = k < K && n < N;
        cp_async16(saddr(dst), ok ? B + (i64)k * N + n : B, ok);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) dst[j] = (k < K && n + j < N) ? B[(i64)k * N + n + j] : from_f32<T>(0.f);
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
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();  // k-tile kt has landed (this thread's copies) ...
    __syncthreads();              // ... and everyone's; the stage refilled below was consumed at kt - 1
    const int pre = kt + STAGES - 1;
    if (pre < k_tiles) load_stage(pre % STAGES, pre);
    cp_async_commit();
    const T* As = smem + (kt % STAGES) * S::STAGE_ELEMS;
    const T* Bs = As + S::A_ELEMS;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      u32 af[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
        ldsm_x4(af[i], saddr(As + (wm * WTM + i * 16 + (lane % 16)) * S::AS + kk * 16 + (lane / 16) * 8));
      u32 bf[NT][2];
#pragma unroll
      for (int j = 0; j < NT / 2; ++j) {
        u32 r[4];
        ldsm_x4_trans(r, saddr(Bs + (kk * 16 + (lane % 16)) * S::BS + wn * WTN + j * 16 + (lane / 16) * 8));
        bf[2 * j][0] = r[0];
        bf[2 * j][1] = r[1];
        bf[2 * j + 1][0] = r[2];
        bf[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) Mma16816<T>::run(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  cp_async_wait<0>();

  // Accumulator fragment: c0, c1 at (lane/4, 2*(lane%4) + {0,1}); c2, c3 eight rows below.
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * WTM + i * 16 + lane / 4 + 8 * h;
        const int col = n0 + wn * WTN + j * 8 + (lane % 4) * 2;
        if (row < M) {
          if (col < N) store_out(C + (i64)row * N + col, acc[i][j][2 * h]);
          if (col + 1 < N) store_out(C + (i64)row * N + col + 1, acc[i][j][2 * h + 1]);
        }
      }
}

}  // namespace tile
}  // namespace mf

// NAME(C, A, B, M, N, K): one CTA per BM x BN tile, grid = ceil(M/BM) * ceil(N/BN).
#define MF_TILE_MMA_NN(NAME, T, TO, BM, BN, BK, WARPS_M, WARPS_N, STAGES, GROUPED) \
  extern "C" __global__ void __launch_bounds__(32 * (WARPS_M) * (WARPS_N)) NAME( \
      TO* __restrict__ C, const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    mf::tile::mma_nn<T, TO, BM, BN, BK, WARPS_M, WARPS_N, STAGES, GROUPED>(C, A, B, M, N, K); \
  }
