// Exact f32 FFMA-chain GEMM (NN) with B streamed by cp.async: the same per-element arithmetic as every
// gemm_bi_f32_f32* symbol (mf/gemm_common.cuh ExactF32): acc = +0; for k = 0..K-1 in order: acc = fmaf(a[m,k],
// b[k,n], acc); then c = __fadd_rn(acc, bias[n]) when a bias is given. Bit-identical to them by construction: the
// fragment reads and the FFMA loop are ExactF32's own (mma_tile, same shared strides), A is staged through
// registers exactly as there (ExactF32::Tile: -0 padding past K), and B's padding past K is +0 (cp.async zero
// fill), so padded steps are fma(-0, +0, acc) == acc.
//
// What differs is only how B reaches shared memory: a STAGES-deep cp.async ring (16-byte copies when N % 4 == 0 and
// B is 16-byte aligned, else 4-byte copies: the same values) instead of register staging, so the 8x8 accumulators,
// the fragments and A's staging registers are all a thread holds; BK = 16 halves the barriers per FFMA of the BK = 8
// tiles. One __syncthreads per k-tile: it publishes the k-tile's B stage (after cp.async.wait_group) and A buffer,
// and proves the stage and buffer overwritten next were consumed.
//
// Portable: cp.async is sm_80+. Layout NN only (B [K, N] is k-major as stored, which cp.async copies untransposed).
#pragma once
#include "mf/gemm_common.cuh"

namespace mf {
namespace gemm {

// 4-byte async copy global -> shared; pred false zero-fills the 4 bytes and reads nothing.
MF_DEVICE void cp_async4_zfill(void* smem, const void* gmem, bool pred) {
  const int src_size = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_size)
               : "memory");
}

template <int BM, int BN, int BK, int TM, int TN, int STAGES>
struct ExactF32Async {
  using Base = ExactF32<Layout::NN, BM, BN, BK, TM, TN, 2>;  // the chain's tiling, fragments and FFMA loop
  static constexpr int TX = Base::TX, TY = Base::TY, THREADS = Base::THREADS, AS = Base::AS, BS = Base::BS;
  static constexpr int A_BUF = BK * AS, B_STAGE = BK * BS;  // floats: As [BK][AS] (x2), Bs [BK][BS] (x STAGES)
  static constexpr int SMEM_FLOATS = 2 * A_BUF + STAGES * B_STAGE;
  static constexpr int B_VECS = BK * BN / 4, B_LOADS = (B_VECS + THREADS - 1) / THREADS;
  static_assert(STAGES >= 2, "at least 2 B stages");
  static_assert(BS % 4 == 0, "16-byte aligned B rows in shared memory");
  static_assert(SMEM_FLOATS * 4 <= 48 * 1024, "static shared memory is limited to 48 KB");

  // B's k-tile [k0, k0 + BK) x [n0, n0 + BN) into one ring stage; zeros outside the matrix.
  static MF_DEVICE void load_b(float* bs, const float* __restrict__ B, int k0, int n0, int N, int K, bool vec, int tid) {
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int v = tid + i * THREADS;
      if (B_LOADS * THREADS > B_VECS && v >= B_VECS) break;
      const int r = v / (BN / 4), q = (v % (BN / 4)) * 4;
      const int k = k0 + r, n = n0 + q;
      float* dst = bs + r * BS + q;
      if (vec) {  // N % 4 == 0: the 4 columns are all inside or all outside
        const bool ok = k < K && n < N;
        cp_async16(dst, ok ? B + (i64)k * N + n : B, ok);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool ok = k < K && n + j < N;
          cp_async4_zfill(dst + j, ok ? B + (i64)k * N + n + j : B, ok);
        }
      }
    }
  }

  static MF_DEVICE void run(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                            const float* __restrict__ bias, int M, int N, int K) {
    __shared__ __align__(16) float smem[SMEM_FLOATS];
    if ((int)blockIdx.y * BM >= M || (int)blockIdx.x * BN >= N) return;  // uniform per CTA
    float* As = smem;
    float* Bs = smem + 2 * A_BUF;
    const int tid = threadIdx.x;
    const bool vec_a = (K % 4 == 0) && aligned16(A);  // either path loads the same values
    const bool vec_b = (N % 4 == 0) && aligned16(B);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    {
      int tx, ty;
      Base::thread_xy(tid, tx, ty);
      const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
      const int k_tiles = (K + BK - 1) / BK;
      typename Base::template Tile<false, BM> ta(A, tid, m0, M, K, K, vec_a);
      float4 ra[decltype(ta)::LOADS];
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_b(Bs + s * B_STAGE, B, s * BK, n0, N, K, vec_b, tid);
        cp_async_commit();  // one group per stage, empty or not: the wait count below stays exact
      }
      ta.load(ra, 0, K, neg_zero());
      ta.store(As, ra);
      for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();  // B's k-tile kt has landed (this thread's copies)
        __syncthreads();              // ... everyone's, and As[kt % 2]; stage (kt - 1) % STAGES is free
        const int pre = kt + STAGES - 1;
        if (pre < k_tiles) load_b(Bs + (pre % STAGES) * B_STAGE, B, pre * BK, n0, N, K, vec_b, tid);
        cp_async_commit();
        ta.next();
        ta.load(ra, (kt + 1) * BK, K, neg_zero());  // in flight during the FFMAs; reads nothing past K
        Base::mma_tile(acc, As + (kt & 1) * A_BUF + ty * 4, Bs + (kt % STAGES) * B_STAGE + tx * 4);
        ta.store(As + ((kt + 1) & 1) * A_BUF, ra);  // the other buffer: last read at kt - 1
      }
      cp_async_wait<0>();
    }

    MF_EXACT_F32_STORE(Base)
  }
};

}  // namespace gemm
}  // namespace mf

// extern "C" entry point: C [M,N] = A [M,K] B [K,N] (+ bias), exact f32; two CTAs per SM (<= 128 registers).
#define MF_GEMM_EXACT_F32_ASYNC_KERNEL(NAME, BM, BN, BK, TM, TN, STAGES)                                        \
  extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), 2)                                         \
      NAME(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,                    \
           const float* __restrict__ bias, int M, int N, int K) {                                                \
    mf::gemm::ExactF32Async<BM, BN, BK, TM, TN, STAGES>::run(C, A, B, bias, M, N, K);                          \
  }
