// Exact f32 tile GEMM on FFMA, included by the Ada exact-f32 and Sm120 modules (sm_80+ instructions only).
//
// Every output element is the chain acc = 0; for k = 0..K-1 ascending: acc = fmaf(A[m,k], B[k,n], acc); then,
// with a bias, c = acc + bias[n]. The tile shape, thread count and pipeline depth only decide which thread runs
// the chain, never its order, so every symbol built here gives the same bits (and matches a plain loop).
// The k loop stops at K exactly (no padded steps). Layout NN, dense row-major f32, any M, N, K >= 0.
// Loads: element-wise cp.async (4 bytes, zero-fill outside the matrices) into STAGES shared-memory buffers;
// A is stored transposed (As[k][m]) so each thread reads its TM rows as float4s.
#pragma once
#include "mf/tile_common.cuh"
#include "mf/tile_pipe.cuh"

namespace mf {
namespace tile {

template <int BM, int BN, int BK, int STAGES> struct FmaSmem {
  static constexpr int AS = BM + 4, BS = BN + 4;
  static constexpr int STAGE_ELEMS = BK * AS + BK * BS;
  static constexpr int BYTES = STAGES * STAGE_ELEMS * 4;
};

// The thread tile of the FFMA tiles (fma_nn here, fma_nn_tma in mf/tile_tma.cuh): each of THREADS threads owns TM
// rows x TN columns of the BM x BN tile (TN = 8 where a thread has >= 32 outputs, else 4), TX threads across a
// tile row. Enumerators, not static data members: those would each be a symbol in the cubin.
template <int BM, int BN, int THREADS> struct FmaThreadTile {
  enum : int { PER_THREAD = BM * BN / THREADS, TN = PER_THREAD >= 32 ? 8 : 4, TM = PER_THREAD / TN, TX = BN / TN };
  static_assert(TM * TN * THREADS == BM * BN && TM % 4 == 0 && TX * TN == BN, "thread tile must be 4k x {4,8}");
  static_assert((THREADS / TX) * TM == BM && THREADS % TX == 0, "threads must tile the rows exactly");
};

template <int BM, int BN, int BK, int THREADS, int STAGES, int BIAS, int KUNROLL>
MF_DEVICE void fma_nn(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                      const float* __restrict__ bias, int M, int N, int K) {
  using S = FmaSmem<BM, BN, BK, STAGES>;
  using TT = FmaThreadTile<BM, BN, THREADS>;
  constexpr int TN = TT::TN, TM = TT::TM, TX = TT::TX;
  extern __shared__ __align__(16) unsigned char fma_smem_raw[];
  float* smem = reinterpret_cast<float*>(fma_smem_raw);

  int m0, n0;
  if (!row_major_tile<BM, BN>(M, N, m0, n0)) return;
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  const int k_tiles = (K + BK - 1) / BK;

  auto load_stage = [&](int stage, int kt) {
    float* As = smem + stage * S::STAGE_ELEMS;
    float* Bs = As + BK * S::AS;
    const int k0 = kt * BK;
    for (int c = tid; c < BM * BK; c += THREADS) {  // consecutive threads read consecutive k of one row of A
      const int r = c / BK, kk = c % BK, m = m0 + r, k = k0 + kk;
      const bool ok = m < M && k < K;
      cp_async4(saddr(As + kk * S::AS + r), ok ? A + (i64)m * K + k : A, ok);
    }
    for (int c = tid; c < BK * BN; c += THREADS) {
      const int kk = c / BN, cn = c % BN, k = k0 + kk, n = n0 + cn;
      const bool ok = k < K && n < N;
      cp_async4(saddr(Bs + kk * S::BS + cn), ok ? B + (i64)k * N + n : B, ok);
    }
  };

  float acc[TM][TN];
  zero_acc(acc);

  auto step = [&](const float* As, const float* Bs, int kk) {
    float a[TM], b[TN];
#pragma unroll
    for (int i = 0; i < TM; i += 4) *reinterpret_cast<float4*>(a + i) = *reinterpret_cast<const float4*>(As + kk * S::AS + ty * TM + i);
#pragma unroll
    for (int j = 0; j < TN; j += 4) *reinterpret_cast<float4*>(b + j) = *reinterpret_cast<const float4*>(Bs + kk * S::BS + tx * TN + j);
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (STAGES == 1) {
      load_stage(0, kt);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    } else {
      cp_async_wait<(STAGES >= 2 ? STAGES - 2 : 0)>();
      __syncthreads();
      const int pre = kt + STAGES - 1;
      if (pre < k_tiles) load_stage(pre % STAGES, pre);
      cp_async_commit();
    }
    const float* As = smem + (kt % STAGES) * S::STAGE_ELEMS;
    const float* Bs = As + BK * S::AS;
    const int kmax = min(BK, K - kt * BK);  // the chain stops at K: no padded fma steps
    if (kmax == BK) {
#pragma unroll KUNROLL
      for (int kk = 0; kk < BK; ++kk) step(As, Bs, kk);
    } else {
      for (int kk = 0; kk < kmax; ++kk) step(As, Bs, kk);
    }
    if (STAGES == 1) __syncthreads();  // the single buffer is refilled next iteration
  }
  cp_async_wait<0>();

  MF_FMA_TILE_OUT(TM, TN, m0 + ty * TM, n0 + tx * TN)
}

}  // namespace tile
}  // namespace mf

// NAME(C, A, B, M, N, K) or, with BIAS = 1, NAME(C, A, B, bias, M, N, K); grid = ceil(M/BM) * ceil(N/BN).
#define MF_TILE_FMA_NN(NAME, BM, BN, BK, THREADS, STAGES, KUNROLL) \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME( \
      float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K) { \
    mf::tile::fma_nn<BM, BN, BK, THREADS, STAGES, 0, KUNROLL>(C, A, B, nullptr, M, N, K); \
  }
#define MF_TILE_FMA_BIAS_NN(NAME, BM, BN, BK, THREADS, STAGES, KUNROLL) \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(float* __restrict__ C, const float* __restrict__ A, \
      const float* __restrict__ B, const float* __restrict__ bias, int M, int N, int K) { \
    mf::tile::fma_nn<BM, BN, BK, THREADS, STAGES, 1, KUNROLL>(C, A, B, bias, M, N, K); \
  }
