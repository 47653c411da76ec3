// Portable batch-invariant GEMM building blocks: layout contract (mf/layout.cuh), cp.async helpers, and the exact f32 FFMA tile GEMM.
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
#include "mf/layout.cuh"

namespace mf {
namespace gemm {

MF_DEVICE u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16-byte async copy global -> shared; pred false zero-fills the 16 bytes and reads nothing.
MF_DEVICE void cp_async16(void* smem, const void* gmem, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_size)
               : "memory");
}
MF_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> MF_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// One 16-byte shared-memory read the compiler cannot split, narrow or merge. NVRTC 13.0's optimiser rewrites
// the FFMA loop's plain float4 reads at random (an extra ld.shared.v2 or a masked ld.shared.f32 in some compiles,
// depending on the process's address layout: scripts/repro_loop.py), which ptxas does not always absorb, so
// the same source gave two cubins. An asm read leaves it nothing to rewrite. "memory": never moved across the
// barriers and stores that fill the buffer.
MF_DEVICE float4 lds128(const float* p) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(smem_u32(p))
               : "memory");
  return v;
}

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
// groups spaced TY*4 rows / TX*4 columns apart (64 for a 128-wide tile), so every fragment is one float4 read.
// Shared memory holds As[k][m] (A transposed, k-major) and Bs[k][n], row stride padded by 4 floats so the
// transposed scalar stores do not conflict (BK = 8; 2-way at BK = 16). Warps are 8 (n) x 4 (m) threads: per k a warp reads 4 distinct
// float4 of A (64 B) and 8 of B (128 B), one shared-memory wavefront each.
// NBUF = 1: single buffer (two barriers per K tile); NBUF = 2: double buffer with the next tile's global loads
// in registers while the FFMAs run (one barrier per K tile). Global loads are predicated float4s when both
// operands allow 16-byte vectors (contiguous dimension % 4 == 0 and 16-byte aligned base); otherwise a scalar
// path (picked by a uniform branch inside the one main loop) loads exactly the same values. Padding outside the problem: A = -0, B = +0, and
// fma(-0, +0, acc) == acc for every acc (+0, -0, Inf, NaN), so K-tail steps leave the chain unchanged.
// The epilogue of every exact-f32 chain tiling (ExactF32::run, ExactF32Async::run): this thread's TM x TN outputs
// (X: the ExactF32 instance, whose thread map it uses), + bias[n] once after the whole chain, stored as float4s
// where N and C allow. Indices from the special registers anew (the main loop's are not kept live). Statements
// pasted into run(), not a function: NVVM simplifies a callee on its own before inlining it, and that renumbers
// the registers of the FFMA tile's main loop (the same instructions, other cubin bytes).
#define MF_EXACT_F32_STORE(X)                                                                          \
  int tx, ty;                                                                                          \
  X::thread_xy(X::sreg_tid(), tx, ty);                                                                 \
  const int m0 = X::sreg_ctaid_y() * BM, n0 = X::sreg_ctaid_x() * BN;                                  \
  const bool c_vec = (N % 4 == 0) && aligned16(C);                                                     \
  _Pragma("unroll") for (int gi = 0; gi < TM / 4; ++gi)                                                \
    _Pragma("unroll") for (int i = 0; i < 4; ++i) {                                                    \
      const int m = m0 + gi * X::TY * 4 + ty * 4 + i;                                                  \
      if (m >= M) continue;                                                                            \
      _Pragma("unroll") for (int gj = 0; gj < TN / 4; ++gj) {                                          \
        const int n = n0 + gj * X::TX * 4 + tx * 4;                                                    \
        float v[4];                                                                                    \
        _Pragma("unroll") for (int j = 0; j < 4; ++j) {                                                \
          v[j] = acc[gi * 4 + i][gj * 4 + j];                                                          \
          if (bias != nullptr && n + j < N) v[j] = __fadd_rn(v[j], bias[n + j]);                       \
        }                                                                                              \
        float* p = C + (i64)m * N + n;                                                                 \
        if (c_vec && n < N) {                                                                          \
          *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);                         \
        } else {                                                                                       \
          _Pragma("unroll") for (int j = 0; j < 4; ++j)                                                \
            if (n + j < N) p[j] = v[j];                                                                \
        }                                                                                              \
      }                                                                                                \
    }

template <int L, int BM, int BN, int BK, int TM, int TN, int NBUF>
struct ExactF32 {
  static constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;
  static constexpr int AS = BM + 4, BS = BN + 4;  // shared row strides (floats)
  static constexpr bool WARP_8X4 = (TX % 8 == 0) && (TY % 4 == 0);
  static_assert(TM == 4 || TM == 8, "TM must be 4 or 8");
  static_assert(TN == 4 || TN == 8, "TN must be 4 or 8");
  static_assert(BM % TM == 0 && BN % TN == 0 && BK % 4 == 0, "tile must divide");
  static_assert(BM % 4 == 0 && BN % 4 == 0 && THREADS % 32 == 0, "whole float4s and whole warps");
  static_assert(NBUF == 1 || NBUF == 2, "NBUF is 1 or 2");
  static_assert(NBUF * BK * (BM + BN + 8) * 4 <= 48 * 1024, "static shared memory is limited to 48 KB");

  // One operand tile (EXT x BK floats: EXT = BM for A, BN for B) moved global -> registers -> shared as
  // float4 slots. KMAJOR: global rows are k, each holding EXT contiguous floats of the tile (row length M or N);
  // stored as one float4. Otherwise global rows are m (or n), each holding BK contiguous k (row length
  // K); stored transposed as 4 scalars. Pointers advance by one K tile per call to next().
  template <bool KMAJOR, int EXT>
  struct Tile {
    static constexpr int VECS = EXT * BK / 4, LOADS = (VECS + THREADS - 1) / THREADS;
    static constexpr int PER_ROW = KMAJOR ? EXT / 4 : BK / 4;  // float4 slots per global row of the tile
    const float* p[LOADS];
    int kpos[LOADS];  // k of the slot (KMAJOR) or of its first element, relative to the tile's k0
    int soff[LOADS];  // shared-memory offset of the slot's first element
    bool live[LOADS];  // slot exists and its row (KMAJOR: its column group) lies inside the problem
    int ext_left[LOADS];  // elements of the float4 inside the problem along the contiguous dimension (KMAJOR)
    i64 step;  // floats to advance per K tile
    bool vec;  // 16-byte loads (uniform per launch)

    MF_DEVICE Tile(const float* __restrict__ base, int tid, int e0, int ext_n, int K, int stride, bool vec_)
        : vec(vec_) {
      // e0: the tile's first m (or n); ext_n: M (or N); stride: the global row length (KMAJOR: ext_n, else K)
      step = KMAJOR ? (i64)BK * stride : (i64)BK;
#pragma unroll
      for (int i = 0; i < LOADS; ++i) {
        const int v = tid + i * THREADS;
        const int r = v / PER_ROW, q = (v % PER_ROW) * 4;
        if (KMAJOR) {  // r = k in the tile, q = first of 4 consecutive m (or n)
          const int e = e0 + q;
          live[i] = v < VECS && e < ext_n;
          ext_left[i] = ext_n - e;
          kpos[i] = r;
          soff[i] = r * (EXT + 4) + q;
          p[i] = base + (live[i] ? (i64)r * stride + e : 0);
        } else {  // r = m (or n) in the tile, q = first of 4 consecutive k
          const int e = e0 + r;
          live[i] = v < VECS && e < ext_n;
          ext_left[i] = 4;
          kpos[i] = q;
          soff[i] = q * (EXT + 4) + r;
          p[i] = base + (live[i] ? (i64)e * stride + q : 0);
        }
      }
    }

    // Registers for the K tile starting at k0 (pad outside the problem). No memory access when k0 >= K.
    MF_DEVICE void load(float4 (&reg)[LOADS], int k0, int K, float pad) const {
#pragma unroll
      for (int i = 0; i < LOADS; ++i) {
        float4 r = make_float4(pad, pad, pad, pad);
        const int k = k0 + kpos[i];
        if (vec) {  // KMAJOR: the 4 floats share k and lie all inside or all outside (ext_n % 4 == 0);
                    // otherwise they share a row and K % 4 == 0 puts them all inside or all outside
          if (live[i] && k < K) r = __ldg(reinterpret_cast<const float4*>(p[i]));
        } else {
          float* e = reinterpret_cast<float*>(&r);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const bool in = KMAJOR ? (live[i] && k < K && j < ext_left[i]) : (live[i] && k + j < K);
            if (in) e[j] = __ldg(p[i] + j);
          }
        }
        reg[i] = r;
      }
    }

    MF_DEVICE void next() {
#pragma unroll
      for (int i = 0; i < LOADS; ++i) p[i] += step;
    }

    MF_DEVICE void store(float* s, const float4 (&reg)[LOADS]) const {
#pragma unroll
      for (int i = 0; i < LOADS; ++i) {
        if (LOADS * THREADS > VECS && threadIdx.x + i * THREADS >= VECS) continue;  // only when VECS is not a multiple of THREADS
        if (KMAJOR) {
          *reinterpret_cast<float4*>(s + soff[i]) = reg[i];
        } else {
          s[soff[i]] = reg[i].x;
          s[soff[i] + (EXT + 4)] = reg[i].y;
          s[soff[i] + 2 * (EXT + 4)] = reg[i].z;
          s[soff[i] + 3 * (EXT + 4)] = reg[i].w;
        }
      }
    }
  };

  // BK steps of the outer-product update from one shared buffer; k ascending, so each chain stays in order.
  static MF_DEVICE void mma_tile(float (&acc)[TM][TN], const float* as, const float* bs) {
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
#pragma unroll
      for (int g = 0; g < TM / 4; ++g)
        *reinterpret_cast<float4*>(&a[g * 4]) = lds128(as + kk * AS + g * TY * 4);
#pragma unroll
      for (int g = 0; g < TN / 4; ++g)
        *reinterpret_cast<float4*>(&b[g * 4]) = lds128(bs + kk * BS + g * TX * 4);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }

  // Shared memory per buffer: As [BK][AS] then Bs [BK][BS].
  static constexpr int STAGE = BK * (AS + BS);

  static MF_DEVICE void mainloop(float (&acc)[TM][TN], float* smem, const float* __restrict__ A,
                                 const float* __restrict__ B, int M, int N, int K, int m0, int n0, int tx, int ty, bool vec) {
    const int tid = threadIdx.x;
    Tile<L == Layout::TN, BM> ta(A, tid, m0, M, K, L == Layout::TN ? M : K, vec);
    Tile<L != Layout::NT, BN> tb(B, tid, n0, N, K, L == Layout::NT ? K : N, vec);
    float4 ra[decltype(ta)::LOADS], rb[decltype(tb)::LOADS];
    ta.load(ra, 0, K, neg_zero());
    tb.load(rb, 0, K, 0.f);
    ta.store(smem, ra);
    tb.store(smem + BK * AS, rb);
    __syncthreads();
    int cur = 0;  // offset of the buffer being read (floats)
    for (int k0 = 0; k0 < K; k0 += BK) {
      const int nxt = NBUF == 2 ? STAGE - cur : 0;
      // the next tile's global loads are in flight during the FFMAs (predicated off past K: the last
      // iteration reads nothing and fills a buffer nobody reads, keeping the loop free of branches)
      ta.next();
      tb.next();
      ta.load(ra, k0 + BK, K, neg_zero());
      tb.load(rb, k0 + BK, K, 0.f);
      mma_tile(acc, smem + cur + ty * 4, smem + cur + BK * AS + tx * 4);
      if (NBUF == 1) __syncthreads();  // single buffer: everyone has finished reading it
      ta.store(smem + nxt, ra);
      tb.store(smem + nxt + BK * AS, rb);
      __syncthreads();
      cur = nxt;
    }
  }

  // This thread's fragment coordinates: warps of 8 (n) x 4 (m) threads tiled over the CTA.
  static MF_DEVICE void thread_xy(int tid, int& tx, int& ty) {
    if (WARP_8X4) {
      const int w = tid / 32, lane = tid % 32;
      tx = (w % (TX / 8)) * 8 + lane % 8;
      ty = (w / (TX / 8)) * 4 + lane / 8;
    } else {
      tx = tid % TX;
      ty = tid / TX;
    }
  }

  // Special registers read anew (volatile): the epilogue recomputes its indices instead of keeping them live
  // across the main loop, which leaves the registers to the accumulators and fragments.
  static MF_DEVICE int sreg_tid() { int r; asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r)); return r; }
  static MF_DEVICE int sreg_ctaid_x() { int r; asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r)); return r; }
  static MF_DEVICE int sreg_ctaid_y() { int r; asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(r)); return r; }

  static MF_DEVICE void run(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                            const float* __restrict__ bias, int M, int N, int K) {
    __shared__ __align__(16) float smem[NBUF * STAGE];
    if ((int)blockIdx.y * BM >= M || (int)blockIdx.x * BN >= N) return;  // uniform per CTA
    // vector loads when the contiguous dimension keeps every float4 inside one row and 16-byte aligned
    const int a_contig = L == Layout::TN ? M : K, b_contig = L == Layout::NT ? K : N;
    const bool vec = (a_contig % 4 == 0) && aligned16(A) && (b_contig % 4 == 0) && aligned16(B);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    {
      int tx, ty;
      thread_xy(threadIdx.x, tx, ty);
      const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
      mainloop(acc, smem, A, B, M, N, K, m0, n0, tx, ty, vec);
    }

    MF_EXACT_F32_STORE(ExactF32)
  }
};

}  // namespace gemm
}  // namespace mf

// extern "C" exact f32 GEMM entry point: C [M,N] = op(A) op(B) (+ bias), layout L (mf::Layout::NN/TN/NT).
// 8x8 outputs per thread need <= 128 registers for two 256-thread CTAs per SM (latency hiding across barriers).
#define MF_GEMM_EXACT_F32_KERNEL(NAME, L, BM, BN, BK, TM, TN, NBUF)                                               \
  extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), (TM) * (TN) >= 64 ? 2 : 1)                 \
      NAME(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,                    \
           const float* __restrict__ bias, int M, int N, int K) {                                                \
    mf::gemm::ExactF32<L, BM, BN, BK, TM, TN, NBUF>::run(C, A, B, bias, M, N, K);                              \
  }
