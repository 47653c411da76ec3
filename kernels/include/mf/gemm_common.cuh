// Portable batch-invariant GEMM building blocks: layouts, cp.async helpers, and the exact f32 FFMA tile GEMM.
//
// Contract shared by every GEMM here (dense row-major storage, no leading-dimension params):
//   NN: A [M, K], B [K, N], C [M, N] = A B        (inference; dX = dY W^T is NT, dW = X^T dY is TN)
//   TN: A [K, M], B [K, N], C [M, N] = A^T B
//   NT: A [M, K], B [N, K], C [M, N] = A B^T
//   optional bias [N] added once after the K reduction (null pointer = none).
// Batch invariance by construction: one tile configuration per symbol, the whole K reduction of an output
// element inside one CTA in a fixed order (no split-K, no stream-K, no atomics); which CTA computes a row never
// changes what it computes. Ragged M, N, K are handled with predication; 16-byte vector loads are used only
// when the contiguous dimension and the base pointer allow them, and they load exactly the values the scalar
// path loads, so the choice never changes a result bit.
#pragma once
#include "mf/common.cuh"

namespace mf {
namespace gemm {

enum Layout { NN = 0, TN = 1, NT = 2 };

MF_DEVICE u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16-byte async copy global -> shared; pred false zero-fills the 16 bytes and reads nothing.
MF_DEVICE void cp_async16(void* smem, const void* gmem, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_size)
               : "memory");
}
MF_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> MF_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

MF_DEVICE u32 dynamic_smem_bytes() {
  u32 r;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
  return r;
}

// -0.0f: the padding value for A outside K. fma(-0, +0, acc) == acc for every acc (including +0, -0, Inf, NaN),
// so padded K steps leave the fixed FFMA chain bit-identical to a plain loop over k < K.
MF_DEVICE float neg_zero() { return __int_as_float(0x80000000); }

// ------------------------------------------------------------------------------------------------------------
// Exact f32: every output element is the chain acc = 0; for k = 0..K-1: acc = fmaf(a[m,k], b[k,n], acc);
// then c = acc + bias[n]. All symbols built from this template (any tile, any buffering, any layout) give
// bit-identical results: the tile shape only decides which thread runs the chain, never its order.
//
// Tiles: BM x BN per CTA, BK deep; each thread owns TM x TN outputs (TM, TN in {4, 8}) split into 4-wide
// groups spaced so that shared-memory reads are conflict-free float4s. Shared memory holds As[k][m] and
// Bs[k][n] (row stride padded by 4 floats so transposed stores do not conflict). NBUF = 1: single buffer;
// NBUF = 2: register-staged double buffering (next tile's global loads in flight during the FFMAs).
template <int L, int BM, int BN, int BK, int TM, int TN, int NBUF>
struct ExactF32 {
  static constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;
  static constexpr int AS = BM + 4, BS = BN + 4;  // shared row strides (floats)
  static constexpr int A_VECS = BM * BK / 4, B_VECS = BK * BN / 4;
  static constexpr int A_LOADS = (A_VECS + THREADS - 1) / THREADS, B_LOADS = (B_VECS + THREADS - 1) / THREADS;
  static_assert(TM == 4 || TM == 8, "TM must be 4 or 8");
  static_assert(TN == 4 || TN == 8, "TN must be 4 or 8");
  static_assert(BM % TM == 0 && BN % TN == 0 && BK % 4 == 0, "tile must divide");
  static_assert(NBUF == 1 || NBUF == 2, "NBUF is 1 or 2");

  // One float4 of the A tile: slot v of A_VECS, read from global (or padding) into registers.
  static MF_DEVICE float4 load_a(const float* __restrict__ A, int v, int m0, int k0, int M, int K, bool vec) {
    float4 r = make_float4(neg_zero(), neg_zero(), neg_zero(), neg_zero());
    if (v >= A_VECS) return r;
    float* e = reinterpret_cast<float*>(&r);
    if (L == mf::gemm::TN) {  // A [K, M]: tile rows are k, 4 consecutive m
      const int kr = v / (BM / 4), mq = (v % (BM / 4)) * 4;
      const int k = k0 + kr, m = m0 + mq;
      if (k >= K) return r;
      const float* p = A + (i64)k * M + m;
      if (vec) {
        if (m < M) r = *reinterpret_cast<const float4*>(p);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (m + j < M) e[j] = p[j];
      }
    } else {  // A [M, K]: tile rows are m, 4 consecutive k
      const int mr = v / (BK / 4), kq = (v % (BK / 4)) * 4;
      const int m = m0 + mr, k = k0 + kq;
      if (m >= M) return r;
      const float* p = A + (i64)m * K + k;
      if (vec) {
        if (k < K) r = *reinterpret_cast<const float4*>(p);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (k + j < K) e[j] = p[j];
      }
    }
    return r;
  }

  static MF_DEVICE void store_a(float* As, int v, float4 r) {
    if (v >= A_VECS) return;
    const float* e = reinterpret_cast<const float*>(&r);
    if (L == mf::gemm::TN) {
      const int kr = v / (BM / 4), mq = (v % (BM / 4)) * 4;
      *reinterpret_cast<float4*>(As + kr * AS + mq) = r;
    } else {
      const int mr = v / (BK / 4), kq = (v % (BK / 4)) * 4;
#pragma unroll
      for (int j = 0; j < 4; ++j) As[(kq + j) * AS + mr] = e[j];
    }
  }

  static MF_DEVICE float4 load_b(const float* __restrict__ B, int v, int n0, int k0, int N, int K, bool vec) {
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
    if (v >= B_VECS) return r;
    float* e = reinterpret_cast<float*>(&r);
    if (L == NT) {  // B [N, K]: tile rows are n, 4 consecutive k
      const int nr = v / (BK / 4), kq = (v % (BK / 4)) * 4;
      const int n = n0 + nr, k = k0 + kq;
      if (n >= N) return r;
      const float* p = B + (i64)n * K + k;
      if (vec) {
        if (k < K) r = *reinterpret_cast<const float4*>(p);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (k + j < K) e[j] = p[j];
      }
    } else {  // B [K, N]: tile rows are k, 4 consecutive n
      const int kr = v / (BN / 4), nq = (v % (BN / 4)) * 4;
      const int k = k0 + kr, n = n0 + nq;
      if (k >= K) return r;
      const float* p = B + (i64)k * N + n;
      if (vec) {
        if (n < N) r = *reinterpret_cast<const float4*>(p);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (n + j < N) e[j] = p[j];
      }
    }
    return r;
  }

  static MF_DEVICE void store_b(float* Bs, int v, float4 r) {
    if (v >= B_VECS) return;
    const float* e = reinterpret_cast<const float*>(&r);
    if (L == NT) {
      const int nr = v / (BK / 4), kq = (v % (BK / 4)) * 4;
#pragma unroll
      for (int j = 0; j < 4; ++j) Bs[(kq + j) * BS + nr] = e[j];
    } else {
      const int kr = v / (BN / 4), nq = (v % (BN / 4)) * 4;
      *reinterpret_cast<float4*>(Bs + kr * BS + nq) = r;
    }
  }

  static MF_DEVICE void run(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                            const float* __restrict__ bias, int M, int N, int K) {
    __shared__ __align__(16) float As[NBUF][BK * AS];
    __shared__ __align__(16) float Bs[NBUF][BK * BS];
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    if (m0 >= M || n0 >= N) return;  // uniform per CTA
    // vector loads when the contiguous dimension keeps every float4 inside one row and 16-byte aligned
    const int a_contig = L == mf::gemm::TN ? M : K, b_contig = L == NT ? K : N;
    const bool a_vec = (a_contig % 4 == 0) && aligned16(A);
    const bool b_vec = (b_contig % 4 == 0) && aligned16(B);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    float4 ra[A_LOADS], rb[B_LOADS];
    const int ntiles = (K + BK - 1) / BK;
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) ra[i] = load_a(A, tid + i * THREADS, m0, 0, M, K, a_vec);
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) rb[i] = load_b(B, tid + i * THREADS, n0, 0, N, K, b_vec);
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) store_a(As[0], tid + i * THREADS, ra[i]);
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) store_b(Bs[0], tid + i * THREADS, rb[i]);
    __syncthreads();

    for (int t = 0; t < ntiles; ++t) {
      const int buf = NBUF == 2 ? (t & 1) : 0;
      const bool more = t + 1 < ntiles;
      if (more) {  // next tile's global loads overlap this tile's FFMAs
        const int k1 = (t + 1) * BK;
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) ra[i] = load_a(A, tid + i * THREADS, m0, k1, M, K, a_vec);
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) rb[i] = load_b(B, tid + i * THREADS, n0, k1, N, K, b_vec);
      }
      const float* as = As[buf];
      const float* bs = Bs[buf];
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        float a[TM], b[TN];
#pragma unroll
        for (int g = 0; g < TM / 4; ++g)
          *reinterpret_cast<float4*>(&a[g * 4]) = *reinterpret_cast<const float4*>(as + kk * AS + g * TY * 4 + ty * 4);
#pragma unroll
        for (int g = 0; g < TN / 4; ++g)
          *reinterpret_cast<float4*>(&b[g * 4]) = *reinterpret_cast<const float4*>(bs + kk * BS + g * TX * 4 + tx * 4);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
      if (more) {
        const int nb = NBUF == 2 ? ((t + 1) & 1) : 0;
        if (NBUF == 1) __syncthreads();  // single buffer: everyone has finished reading it
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) store_a(As[nb], tid + i * THREADS, ra[i]);
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) store_b(Bs[nb], tid + i * THREADS, rb[i]);
        __syncthreads();
      }
    }

    const bool c_vec = (N % 4 == 0) && aligned16(C);
#pragma unroll
    for (int gi = 0; gi < TM / 4; ++gi)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m0 + gi * TY * 4 + ty * 4 + i;
        if (m >= M) continue;
#pragma unroll
        for (int gj = 0; gj < TN / 4; ++gj) {
          const int n = n0 + gj * TX * 4 + tx * 4;
          float v[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            v[j] = acc[gi * 4 + i][gj * 4 + j];
            if (bias != nullptr && n + j < N) v[j] = __fadd_rn(v[j], bias[n + j]);
          }
          float* p = C + (i64)m * N + n;
          if (c_vec && n < N) {
            *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (n + j < N) p[j] = v[j];
          }
        }
      }
  }
};

}  // namespace gemm
}  // namespace mf

// extern "C" exact f32 GEMM entry point: C [M,N] = op(A) op(B) (+ bias), layout L (mf::gemm::NN/TN/NT).
#define MF_GEMM_EXACT_F32_KERNEL(NAME, L, BM, BN, BK, TM, TN, NBUF)                                               \
  extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN))                                            \
      NAME(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,                    \
           const float* __restrict__ bias, int M, int N, int K) {                                                \
    mf::gemm::ExactF32<L, BM, BN, BK, TM, TN, NBUF>::run(C, A, B, bias, M, N, K);                              \
  }
