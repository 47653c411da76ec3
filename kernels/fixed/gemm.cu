// Portable batch-invariant inference GEMMs (NN: C [M,N] = A [M,K] B [K,N] (+ bias [N])) and matvecs.
// Tiles, stages and dtypes come from kernels/fixed/gemm.toml; the implementations live in
// mf/gemm_common.cuh (exact f32 FFMA), mf/skinny_f32.cuh (exact f32, skinny M), mf/decode_f32.cuh (exact f32,
// M = 1..16 decode) and mf/mma_sm80.cuh (tensor cores).
// The matvec is here.
#include "mf/decode_f32.cuh"
#include "mf/gemm_common.cuh"
#include "mf/mma_sm80.cuh"
#include "mf/skinny_f32.cuh"

namespace mf {

// Matvec / skinny GEMM: C [M,N] = A [M,K] B [K,N] (+ bias) for small M (decode), bandwidth-bound on B.
// A CTA owns COLS = VT * VEC columns and R rows of A (grid: x = ceil(M / R) row groups, y = ceil(N / COLS)); its VT * KSL threads split K into KSL interleaved slices
// (slice s takes k = s, s + KSL, ...), each slice accumulating in increasing k with f32 FMAs, then the KSL
// partials are summed in slice order 0..KSL-1 through shared memory. The order depends on K only: a row's
// result is the same whatever M is and whichever CTA row-group holds it. U loads of B per thread are issued
// before they are used, to keep enough bytes in flight for HBM bandwidth.
template <typename T, typename TO, int VT, int KSL, int R, int U>
struct Matvec {
  static constexpr int VEC = 16 / (int)sizeof(T), COLS = VT * VEC, THREADS = VT * KSL;

  static MF_DEVICE void run(TO* __restrict__ C, const T* __restrict__ A, const T* __restrict__ B,
                            const TO* __restrict__ bias, int M, int N, int K) {
    __shared__ float red[KSL][R][COLS];
    const int v = threadIdx.x % VT, s = threadIdx.x / VT;
    // grid x = row groups, y = column slabs: the CTAs that share a slab of B launch together, so the row
    // groups after the first read it from L2 rather than HBM (skinny M > R).
    const int nc0 = blockIdx.y * COLS, n0 = nc0 + v * VEC, r0 = blockIdx.x * R;
    if (nc0 >= N || r0 >= M) return;  // uniform per CTA
    const int rows = min(R, M - r0);
    const bool vec = (N % VEC == 0) && aligned16(B);

    float acc[R][VEC];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[r][j] = 0.f;

    for (int k = s; k < K; k += KSL * U) {
      __align__(16) T w[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // issue all U loads first
        const int kk = k + u * KSL;
        const T* p = B + (i64)kk * N + n0;
        if (vec) {
          uint4 raw = make_uint4(0u, 0u, 0u, 0u);
          if (kk < K && n0 < N) raw = __ldg(reinterpret_cast<const uint4*>(p));
          *reinterpret_cast<uint4*>(w[u]) = raw;
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) w[u][j] = (kk < K && n0 + j < N) ? p[j] : from_f32<T>(0.f);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kk = k + u * KSL;
        if (kk < K) {  // slots past K add nothing: the chain runs over k < K only
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r < rows) {
              const float x = to_f32(A[(i64)(r0 + r) * K + kk]);
#pragma unroll
              for (int j = 0; j < VEC; ++j) acc[r][j] = fmaf(x, to_f32(w[u][j]), acc[r][j]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < VEC; ++j) red[s][r][v * VEC + j] = acc[r][j];
    __syncthreads();
    for (int o = threadIdx.x; o < R * COLS; o += THREADS) {
      const int r = o / COLS, c = o % COLS, n = nc0 + c;
      if (r >= rows || n >= N) continue;
      float sum = red[0][r][c];
      for (int q = 1; q < KSL; ++q) sum += red[q][r][c];  // fixed slice order
      if (bias != nullptr) sum += to_f32(bias[n]);
      C[(i64)(r0 + r) * N + n] = from_f32<TO>(sum);
    }
  }
};

}  // namespace mf

#define MF_MATVEC_BI(NAME, T, TO, VT, KSL, R, U)                                                                 \
  extern "C" __global__ void __launch_bounds__(VT * KSL)                                                         \
      NAME(TO* __restrict__ C, const T* __restrict__ A, const T* __restrict__ B, const TO* __restrict__ bias,    \
           int M, int N, int K) {                                                                                \
    mf::Matvec<T, TO, VT, KSL, R, U>::run(C, A, B, bias, M, N, K);                                             \
  }

// Exact f32 FFMA-chain GEMM, NN layout (the qualification oracle and its faster tilings).
#define MF_GEMM_BI_EXACT_F32(NAME, BM, BN, BK, TM, TN, NBUF) \
  MF_GEMM_EXACT_F32_KERNEL(NAME, mf::Layout::NN, BM, BN, BK, TM, TN, NBUF)

// Tensor-core NN GEMM: TI inputs, TO outputs and bias, R = TF32 rounding (0 for bf16/f16).
#define MF_GEMM_BI_TC(NAME, TI, TO, BM, BN, BK, WM, WN, S, R) \
  MF_GEMM_TC_KERNEL(NAME, TI, TO, mf::Layout::NN, BM, BN, BK, WM, WN, S, R)
