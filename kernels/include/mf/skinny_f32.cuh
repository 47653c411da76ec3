// Exact f32 skinny-M GEMM (decode: M = 1..256), NN layout, dense row-major: C [M,N] = A [M,K] B [K,N] (+ bias [N]).
//
// Same arithmetic as every gemm_bi_f32_f32* symbol (mf/gemm_common.cuh ExactF32, mf/tile_fma.cuh): per output one
// FFMA chain acc = +0; for k = 0..K-1 ascending: acc = fmaf(A[m,k], B[k,n], acc); then, with a bias,
// c = __fadd_rn(acc, bias[n]). The chain stops at K exactly (the K tail runs a scalar loop over k < K only; the
// zero-filled shared-memory slots past K are never read), so it is the literal chain, which the padded chains of
// the other tilings (A = -0, B = +0 steps: fma(-0, +0, acc) == acc) also equal. No split-K: the whole K of an
// output is one thread's chain, whatever M is and whichever CTA holds the row.
//
// Shape: a CTA owns BN columns and MC rows (grid x = ceil(M / MC) row chunks, y = ceil(N / BN) column stripes: the
// chunks sharing a stripe of B launch together, so chunks after the first read it from L2). It streams the stripe
// (and its MC rows of A) through a STAGES-deep cp.async ring of BK-deep k-tiles: every thread issues loads, so
// ~(STAGES - 1) * BK * BN * 4 bytes of B are in flight per CTA (the bandwidth-bound decode case).
// Threads: TX = BN / 4 across the columns (4 adjacent columns each, one float4 of B per k), TY = THREADS / TX
// down the rows; a thread's rows are ty, ty + TY, ... (TM of them), so at small M the valid rows spread over the
// thread rows and a thread runs only its valid rows (dispatch on the count NR: no dead FFMAs at M = 1).
// Shared memory per stage: As [MC][BK + 4] (row-major, float4 reads along k; +4 keeps the rows of one warp in
// distinct banks) and Bs [BK][BN].
#pragma once
#include "mf/common.cuh"
#include "mf/tile_async.cuh"
#include "mf/tile_common.cuh"

namespace mf {
namespace skinny {

template <int BN, int BK, int MC, int STAGES, int THREADS>
struct F32 {
  static constexpr int TN = 4, TX = BN / TN, TY = THREADS / TX, TM = MC / TY;
  static constexpr int AS = BK + 4;
  static constexpr int A_ELEMS = MC * AS, B_ELEMS = BK * BN, STAGE = A_ELEMS + B_ELEMS;
  static constexpr int SMEM_BYTES = STAGES * STAGE * 4;
  static_assert(BN % TN == 0 && THREADS % TX == 0 && TM >= 1 && TM * TY == MC, "threads must tile MC x BN");
  static_assert(BK % 4 == 0 && THREADS % 32 == 0 && STAGES >= 2, "whole float4s, whole warps, a ring");

  // The chains of NR rows (ty + TY*i, i < NR) x 4 columns over the kmax (<= BK) k of one stage, k ascending.
  template <int NR>
  static MF_DEVICE void stage_fma(float (&acc)[TM][TN], const float* As, const float* Bs, int ty, int tx, int kmax) {
    if (kmax == BK) {
#pragma unroll 2
      for (int kq = 0; kq < BK; kq += 4) {
        float4 a[NR], b[4];
#pragma unroll
        for (int i = 0; i < NR; ++i) a[i] = *reinterpret_cast<const float4*>(As + (ty + TY * i) * AS + kq);
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const float4*>(Bs + (kq + j) * BN + tx * TN);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int i = 0; i < NR; ++i) {
            const float av = kk == 0 ? a[i].x : kk == 1 ? a[i].y : kk == 2 ? a[i].z : a[i].w;
            acc[i][0] = fmaf(av, b[kk].x, acc[i][0]);
            acc[i][1] = fmaf(av, b[kk].y, acc[i][1]);
            acc[i][2] = fmaf(av, b[kk].z, acc[i][2]);
            acc[i][3] = fmaf(av, b[kk].w, acc[i][3]);
          }
        }
      }
    } else {  // the K tail: k < K only
      for (int kk = 0; kk < kmax; ++kk) {
        const float4 b = *reinterpret_cast<const float4*>(Bs + kk * BN + tx * TN);
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          const float av = As[(ty + TY * i) * AS + kk];
          acc[i][0] = fmaf(av, b.x, acc[i][0]);
          acc[i][1] = fmaf(av, b.y, acc[i][1]);
          acc[i][2] = fmaf(av, b.z, acc[i][2]);
          acc[i][3] = fmaf(av, b.w, acc[i][3]);
        }
      }
    }
  }

  template <int NR>
  static MF_DEVICE void dispatch(int nr, float (&acc)[TM][TN], const float* As, const float* Bs, int ty, int tx,
                                 int kmax) {
    if constexpr (NR >= 1) {
      if (nr == NR) stage_fma<NR>(acc, As, Bs, ty, tx, kmax);
      else dispatch<NR - 1>(nr, acc, As, Bs, ty, tx, kmax);
    }
  }

  static MF_DEVICE void run(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                            const float* __restrict__ bias, int M, int N, int K) {
    using namespace tile;  // the cp.async helpers that mf/tile_async.cuh's statements name
    extern __shared__ __align__(16) unsigned char skinny_smem_raw[];
    float* smem = reinterpret_cast<float*>(skinny_smem_raw);
    const int r0 = blockIdx.x * MC, n0 = blockIdx.y * BN;
    if (r0 >= M || n0 >= N) return;  // uniform per CTA
    const int rows = min(MC, M - r0);
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const int nr = rows > ty ? min(TM, (rows - ty + TY - 1) / TY) : 0;  // this thread's valid rows
    // 16-byte copies when every float4 lies all inside or all outside the matrix; else 4-byte copies of the
    // same elements (the same values either way)
    const bool a_vec = (K % 4 == 0) && aligned16(A), b_vec = (N % 4 == 0) && aligned16(B);
    const int k_tiles = (K + BK - 1) / BK;

    auto load_stage = [&](int s, int kt) {
      float* As = smem + s * STAGE;
      float* Bs = As + A_ELEMS;
      const int k0 = kt * BK;
      MF_ROWS_LOAD_ASYNC(As, AS, A, r0, rows, K, k0, BK, a_vec, tid, THREADS)  // only the rows inside M
      for (int c = tid; c < BK * (BN / 4); c += THREADS) {
        const int kk = c / (BN / 4), q = (c % (BN / 4)) * 4, k = k0 + kk, n = n0 + q;
        const float* src = B + (i64)k * N + n;
        if (b_vec) {
          const bool ok = k < K && n < N;
          tile::cp_async16(tile::saddr(Bs + kk * BN + q), ok ? src : B, ok);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const bool ok = k < K && n + j < N;
            tile::cp_async4(tile::saddr(Bs + kk * BN + q + j), ok ? src + j : B, ok);
          }
        }
      }
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    MF_CP_ASYNC_FILL(STAGES, k_tiles, load_stage, , "unroll")
    for (int kt = 0; kt < k_tiles; ++kt) {
      MF_CP_ASYNC_NEXT(STAGES, kt, k_tiles, load_stage, )
      const float* As = smem + (kt % STAGES) * STAGE;
      dispatch<TM>(nr, acc, As, As + A_ELEMS, ty, tx, min(BK, K - kt * BK));
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < TM; ++i) {
      if (i >= nr) break;
      const int m = r0 + ty + TY * i;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int n = n0 + tx * TN + j;
        if (n >= N) continue;
        float v = acc[i][j];
        if (bias != nullptr) v = __fadd_rn(v, bias[n]);
        C[(i64)m * N + n] = v;
      }
    }
  }
};

}  // namespace skinny
}  // namespace mf

// NAME(C, A, B, bias, M, N, K), the gemm_bi_f32_f32 ABI; grid (ceil(M / MC), ceil(N / BN)), THREADS threads,
// dynamic shared memory STAGES * (MC * (BK + 4) + BK * BN) * 4 bytes.
#define MF_GEMM_BI_F32_SKINNY(NAME, BN, BK, MC, STAGES, THREADS)                                                  \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                       \
      NAME(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,                    \
           const float* __restrict__ bias, int M, int N, int K) {                                                \
    mf::skinny::F32<BN, BK, MC, STAGES, THREADS>::run(C, A, B, bias, M, N, K);                                 \
  }
