// Exact f32 decode GEMM (routed at M = 1..16; any M is served, MC rows per CTA), NN layout, dense row-major: C [M,N] = A [M,K] B [K,N] (+ bias [N]).
//
// Same arithmetic as every gemm_bi_f32_f32* symbol (mf/gemm_common.cuh ExactF32, mf/skinny_f32.cuh): per output
// ONE FFMA chain acc = +0; for k = 0..K-1 ascending: acc = fmaf(A[m,k], B[k,n], acc); then, with a bias,
// c = __fadd_rn(acc, bias[n]). The chain stops at K exactly (the K tail runs a scalar loop over k < K only; the
// zero-filled shared-memory slots past K are never read). No split-K: one thread runs an output's whole chain,
// whatever M is and whichever CTA holds the row, so a row's bits never depend on M.
//
// The floor (H200: 132 SMs, ~4.1 TB/s device copy; M = 1, N = K = 8192): B is 8192 * 8192 * 4 = 268 MB, read
// once: 65.5 us at copy bandwidth (85% of it: 77 us). The chains: 8192 of 8192 dependent FFMAs, 8192 / 132 = 62
// per SM; at 4 cycles of FFMA latency a chain takes 32768 cycles, ~17 us at 1.98 GHz, far under the byte
// floor. So one column per thread is enough arithmetic parallelism and the kernel is only about keeping bytes
// in flight: Little's law, ~4.1 TB/s * ~0.7 us of loaded latency = ~3 MB device-wide, >= ~24 KB per SM.
//
// Shape: a CTA owns BN columns and MC rows (grid x = ceil(M / MC) row chunks, y = ceil(N / BN) column stripes:
// the chunks sharing a stripe launch together, so chunks after the first read it from L2). TX = BN threads
// across the columns (one column each, so a warp's B reads are 32 consecutive floats: no bank conflicts) and
// TY = THREADS / BN down the rows; a thread's rows are ty, ty + TY, ... (TM = MC / TY of them) and it runs only
// its valid rows (dispatch on their count NR: at M = 1 only the ty = 0 warps do FFMAs, the others only copy).
// TX is a multiple of 32, so ty is warp-uniform and A's reads are broadcasts (As [MC][BK], no padding needed).
// The K x BN stripe of B (and the MC rows of A) streams through a STAGES-deep cp.async ring of BK-deep k-tiles,
// every thread issuing 16-byte copies (4-byte copies of the same elements when N or K % 4 != 0 or a pointer is
// not 16-byte aligned): (STAGES - 1) * BK * BN * 4 bytes of B in flight per CTA. One __syncthreads per k-tile.
// Per k a thread reads one float of B (reused by its NR chains) and, per 4 k, one float4 of A per row; the stage
// loop is fully unrolled so the LDS are issued ahead of the FFMAs that consume them (latency off the chain).
//
// The instances (kernels/fixed/gemm.toml gemm_bi_exact_f32_decode; BK = 64, MC = 8, 128 threads): n64 = 128 CTAs
// at N = 8192, one per SM, 8 stages (144 KB of shared memory), 112 KB of B in flight per SM; n32 = 256 CTAs, two
// per SM, 9 stages (90 KB each, within the 99 KB of sm_86/89/120 too), 64 KB in flight per CTA, 128 KB per SM.
// At M = 1, per 64-k stage, a computing warp spends ~300 cycles (64 dependent FFMAs and the copies it issues)
// against ~1000 cycles for the SM's share of HBM bandwidth to deliver the stage: the ring stays full.
#pragma once
#include "mf/common.cuh"
#include "mf/tile_async.cuh"
#include "mf/tile_common.cuh"

namespace mf {
namespace decode {

template <int BN, int BK, int MC, int STAGES, int THREADS>
struct F32 {
  static constexpr int TX = BN, TY = THREADS / TX, TM = MC / TY;
  static constexpr int A_ELEMS = MC * BK, B_ELEMS = BK * BN, STAGE = A_ELEMS + B_ELEMS;
  static constexpr int SMEM_BYTES = STAGES * STAGE * 4;
  static constexpr int BQ = BN / 4, B_VECS = BK * BQ, B_LOADS = B_VECS / THREADS, B_RSTEP = THREADS / BQ;
  static_assert(BN % 32 == 0 && THREADS % BN == 0 && TM >= 1 && TM * TY == MC, "threads must tile MC x BN");
  static_assert(B_VECS % THREADS == 0, "a stage of B is whole 16-byte copies per thread");
  static_assert(BK % 4 == 0 && STAGES >= 2, "whole float4s of A, a ring");

  // The chains of NR rows (ty + TY*i, i < NR) of column tx over the kmax (<= BK) k of one stage, k ascending.
  template <int NR>
  static MF_DEVICE void stage_fma(float (&acc)[TM], const float* As, const float* Bs, int kmax) {
    if (kmax == BK) {
#pragma unroll
      for (int kq = 0; kq < BK; kq += 4) {
        float4 a[NR];
        float b[4];
#pragma unroll
        for (int i = 0; i < NR; ++i) a[i] = *reinterpret_cast<const float4*>(As + TY * i * BK + kq);
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = Bs[(kq + j) * BN];
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          acc[i] = fmaf(a[i].x, b[0], acc[i]);
          acc[i] = fmaf(a[i].y, b[1], acc[i]);
          acc[i] = fmaf(a[i].z, b[2], acc[i]);
          acc[i] = fmaf(a[i].w, b[3], acc[i]);
        }
      }
    } else {  // the K tail: k < K only
      for (int kk = 0; kk < kmax; ++kk) {
        const float b = Bs[kk * BN];
#pragma unroll
        for (int i = 0; i < NR; ++i) acc[i] = fmaf(As[TY * i * BK + kk], b, acc[i]);
      }
    }
  }

  template <int NR>
  static MF_DEVICE void dispatch(int nr, float (&acc)[TM], const float* As, const float* Bs, int kmax) {
    if constexpr (NR >= 1) {
      if (nr == NR) stage_fma<NR>(acc, As, Bs, kmax);
      else dispatch<NR - 1>(nr, acc, As, Bs, kmax);
    }
  }

  static MF_DEVICE void run(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                            const float* __restrict__ bias, int M, int N, int K) {
    using namespace tile;  // the cp.async helpers that mf/tile_async.cuh's statements name
    extern __shared__ __align__(16) unsigned char decode_smem_raw[];
    float* smem = reinterpret_cast<float*>(decode_smem_raw);
    const int r0 = blockIdx.x * MC, n0 = blockIdx.y * BN;
    if (r0 >= M || n0 >= N) return;  // uniform per CTA
    const int rows = min(MC, M - r0);
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const int nr = rows > ty ? min(TM, (rows - ty + TY - 1) / TY) : 0;  // this thread's valid rows
    const bool a_vec = (K % 4 == 0) && aligned16(A), b_vec = (N % 4 == 0) && aligned16(B);
    const int k_tiles = (K + BK - 1) / BK;
    // this thread's B copies: rows bk0 + i * B_RSTEP of a k-tile, columns n0 + bq .. + 3
    const int bk0 = tid / BQ, bq = (tid % BQ) * 4, bn = n0 + bq;

    auto load_stage = [&](int s, int kt) {
      float* As = smem + s * STAGE;
      float* Bs = As + A_ELEMS;
      const int k0 = kt * BK;
      MF_ROWS_LOAD_ASYNC(As, BK, A, r0, rows, K, k0, BK, a_vec, tid, THREADS)  // only the rows inside M
#pragma unroll
      for (int i = 0; i < B_LOADS; ++i) {
        const int kk = bk0 + i * B_RSTEP, k = k0 + kk;
        const float* src = B + (i64)k * N + bn;
        const u32 dst = tile::saddr(Bs + kk * BN + bq);
        if (b_vec) {
          const bool ok = k < K && bn < N;
          tile::cp_async16(dst, ok ? src : B, ok);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const bool ok = k < K && bn + j < N;
            tile::cp_async4(dst + 4 * j, ok ? src + j : B, ok);
          }
        }
      }
    };

    float acc[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) acc[i] = 0.f;

    // the fill as a loop, not unrolled: one copy of load_stage's code, not STAGES
    MF_CP_ASYNC_FILL(STAGES, k_tiles, load_stage, , "unroll 1")
    for (int kt = 0; kt < k_tiles; ++kt) {
      MF_CP_ASYNC_NEXT(STAGES, kt, k_tiles, load_stage, )
      const float* As = smem + (kt % STAGES) * STAGE;
      dispatch<TM>(nr, acc, As + ty * BK, As + A_ELEMS + tx, min(BK, K - kt * BK));
    }
    cp_async_wait<0>();

    const int n = n0 + tx;
    if (n >= N) return;
    const float bv = bias != nullptr ? bias[n] : 0.f;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      if (i >= nr) break;
      float v = acc[i];
      if (bias != nullptr) v = __fadd_rn(v, bv);
      C[(i64)(r0 + ty + TY * i) * N + n] = v;
    }
  }
};

}  // namespace decode
}  // namespace mf

// NAME(C, A, B, bias, M, N, K), the gemm_bi_f32_f32 ABI; grid (ceil(M / MC), ceil(N / BN)), THREADS threads,
// dynamic shared memory STAGES * (MC + BN) * BK * 4 bytes; MINB resident CTAs per SM asked of the compiler.
#define MF_GEMM_BI_F32_DECODE(NAME, BN, BK, MC, STAGES, THREADS, MINB)                                          \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                                    \
      NAME(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,                    \
           const float* __restrict__ bias, int M, int N, int K) {                                                \
    mf::decode::F32<BN, BK, MC, STAGES, THREADS>::run(C, A, B, bias, M, N, K);                                 \
  }
