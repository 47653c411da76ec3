// Portable tensor-core tile GEMM (sm_80+): mma.sync over a cp.async multi-stage shared-memory pipeline.
// Inputs bf16 / f16 (m16n8k16) or f32 with TF32 math (m16n8k8); f32 accumulate. Fragments are read from shared
// memory with plain loads following the PTX ISA fragment layouts (no ldmatrix): simple and layout-agnostic.
// Layouts and the batch-invariance contract: see mf/gemm_common.cuh. Every output tile is reduced over all of
// K inside one CTA, K tiles in increasing order, fragments in a fixed order; the tile configuration is fixed
// per symbol, so a row's result never depends on M or on which CTA computed it.
#pragma once
#include "mf/gemm_common.cuh"

namespace mf {
namespace tc {

// TF32 rounding of f32 inputs before the MMA: explicit, so the numerics are defined rather than left to how
// the hardware reads the low mantissa bits.
enum Round { ROUND_NONE = 0, TF32_TRUNC = 1, TF32_RNA = 2 };

template <int R> MF_DEVICE u32 tf32_bits(float x) {
  if (R == TF32_RNA) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
  }
  return __float_as_uint(x) & 0xffffe000u;  // TF32_TRUNC: round toward zero to 10 mantissa bits
}

MF_DEVICE u32 pack16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return (u32)__bfloat16_as_ushort(lo) | ((u32)__bfloat16_as_ushort(hi) << 16);
}
MF_DEVICE u32 pack16(__half lo, __half hi) { return (u32)__half_as_ushort(lo) | ((u32)__half_as_ushort(hi) << 16); }

// One warp-wide D = A B + D on a 16 x 8 output tile (mma.sync). 16-bit: m16n8k16, A 4 regs, B 2 regs;
// TF32: m16n8k8, A 4 regs, B 2 regs. D: d0,d1 = (row g, cols 2t, 2t+1), d2,d3 = (row g+8, same cols),
// with g = lane / 4, t = lane % 4.
MF_DEVICE void mma16816(float* d, const u32* a, const u32* b, __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
MF_DEVICE void mma16816(float* d, const u32* a, const u32* b, __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
MF_DEVICE void mma16816(float* d, const u32* a, const u32* b, float) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Store 4 consecutive outputs (one thread's share of a row) with one vector store when allowed.
MF_DEVICE void store4(float* p, const float* v, bool vec) {
  if (vec) *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else for (int j = 0; j < 4; ++j) p[j] = v[j];
}
template <typename TO> MF_DEVICE void store4(TO* p, const float* v, bool vec) {
  if (vec) {  // 4 x 16-bit = one 8-byte store
    __align__(8) TO e[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) e[j] = from_f32<TO>(v[j]);
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(e);
  } else {
    for (int j = 0; j < 4; ++j) p[j] = from_f32<TO>(v[j]);
  }
}

// TI: storage dtype of A and B (float = TF32 math, rounding R); TO: C and bias dtype. BM x BN x BK CTA tile,
// WM x WN warps (each a (BM/WM) x (BN/WN) warp tile of 16 x 8 mma tiles), S pipeline stages (>= 2).
// Dynamic shared memory: SMEM bytes, the same expression the catalog declares (checked at entry).
template <typename TI, typename TO, int L, int BM, int BN, int BK, int WM, int WN, int S, int R>
struct TileGemm {
  static constexpr int THREADS = WM * WN * 32;
  static constexpr int SZ = (int)sizeof(TI);
  static constexpr int VEC = 16 / SZ;   // elements per 16-byte chunk
  static constexpr int P = 8;           // region padding budget (elements, >= every pad below): one formula for
                                        // kernel and catalog
  static constexpr bool HALF = SZ == 2;
  static constexpr int KSTEP = HALF ? 16 : 8;
  static constexpr int WTM = BM / WM, WTN = BN / WN, FM = WTM / 16, FN = WTN / 8;
  // Row strides chosen so a warp's fragment loads hit 32 distinct banks: k-contiguous rows pad by 16 bytes,
  // m/n-contiguous rows by 16 bytes (16-bit) or 32 bytes (f32, whose lanes step 4 rows at a time).
  static constexpr int KPAD = 16 / SZ, MNPAD = 8;
  // A: NN/NT [BM][A_LD] (k contiguous); TN [BK][A_LD] (m contiguous).
  // B: NN/TN [BK][B_LD] (n contiguous); NT [BN][B_LD] (k contiguous).
  static constexpr int A_LD = L == Layout::TN ? BM + MNPAD : BK + KPAD;
  static constexpr int B_LD = L == Layout::NT ? BK + KPAD : BN + MNPAD;
  static constexpr int A_ELEMS = (BM + P) * (BK + P), B_ELEMS = (BK + P) * (BN + P);
  static constexpr int STAGE_ELEMS = A_ELEMS + B_ELEMS;
  static constexpr int C_LD = BN + 4;
  static constexpr int PIPE_BYTES = S * STAGE_ELEMS * SZ, C_BYTES = BM * C_LD * 4;
  static constexpr int SMEM = PIPE_BYTES > C_BYTES ? PIPE_BYTES : C_BYTES;
  static_assert(S >= 2, "the cp.async pipeline needs at least 2 stages");
  static_assert(BM % (16 * WM) == 0 && BN % (8 * WN) == 0 && BK % KSTEP == 0 && BK % VEC == 0, "tile must divide");
  static_assert(BM % VEC == 0 && BN % VEC == 0, "16-byte chunks must tile the rows");
  static_assert(L == Layout::TN ? BK * A_LD <= A_ELEMS : BM * A_LD <= A_ELEMS, "A region too small");
  static_assert(L == Layout::NT ? BN * B_LD <= B_ELEMS : BK * B_LD <= B_ELEMS, "B region too small");
  static_assert((A_ELEMS * SZ) % 16 == 0 && (A_LD * SZ) % 16 == 0 && (B_LD * SZ) % 16 == 0, "16-byte rows");

  // Copy a ROWS x COLS tile of a dense row-major global matrix (rows_total x ld) starting at (row0, col0) into
  // shared memory with row stride SLD. Out-of-range elements become zero.
  template <int ROWS, int COLS, int SLD>
  static MF_DEVICE void load_tile(TI* s, const TI* __restrict__ g, int row0, int col0, int rows_total, int ld,
                                  bool vec) {
    if (vec) {  // ld % VEC == 0 and a 16-byte aligned base: every chunk is wholly in or out of range
      constexpr int CPR = COLS / VEC, CHUNKS = ROWS * CPR;
#pragma unroll
      for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {
        const int r = c / CPR, q = (c % CPR) * VEC;
        const int gr = row0 + r, gc = col0 + q;
        const bool in = gr < rows_total && gc < ld;
        const TI* src = in ? g + (i64)gr * ld + gc : g;
        gemm::cp_async16(s + r * SLD + q, src, in);
      }
    } else {
      for (int e = threadIdx.x; e < ROWS * COLS; e += THREADS) {
        const int r = e / COLS, q = e % COLS;
        const int gr = row0 + r, gc = col0 + q;
        s[r * SLD + q] = (gr < rows_total && gc < ld) ? g[(i64)gr * ld + gc] : from_f32<TI>(0.f);
      }
    }
  }

  static MF_DEVICE void load_stage(TI* st, const TI* __restrict__ A, const TI* __restrict__ B, int m0, int n0,
                                   int k0, int M, int N, int K, bool a_vec, bool b_vec) {
    TI* as = st;
    TI* bs = st + A_ELEMS;
    if (L == Layout::TN) load_tile<BK, BM, A_LD>(as, A, k0, m0, K, M, a_vec);  // A [K, M]
    else load_tile<BM, BK, A_LD>(as, A, m0, k0, M, K, a_vec);                // A [M, K]
    if (L == Layout::NT) load_tile<BN, BK, B_LD>(bs, B, n0, k0, N, K, b_vec);  // B [N, K]
    else load_tile<BK, BN, B_LD>(bs, B, k0, n0, K, N, b_vec);                // B [K, N]
  }

  // Element accessors on a stage: A(m, k) and B(k, n) in tile coordinates.
  static MF_DEVICE TI a_at(const TI* as, int m, int k) { return L == Layout::TN ? as[k * A_LD + m] : as[m * A_LD + k]; }
  static MF_DEVICE TI b_at(const TI* bs, int k, int n) { return L == Layout::NT ? bs[n * B_LD + k] : bs[k * B_LD + n]; }
  // Two k-consecutive 16-bit elements packed low = k, high = k + 1 (one 32-bit load when k is contiguous).
  static MF_DEVICE u32 a_pair(const TI* as, int m, int k) {
    if (L != Layout::TN) return *reinterpret_cast<const u32*>(as + m * A_LD + k);
    return pack16(as[k * A_LD + m], as[(k + 1) * A_LD + m]);
  }
  static MF_DEVICE u32 b_pair(const TI* bs, int k, int n) {
    if (L == Layout::NT) return *reinterpret_cast<const u32*>(bs + n * B_LD + k);
    return pack16(bs[k * B_LD + n], bs[(k + 1) * B_LD + n]);
  }

  // Fragments for one KSTEP at k = kk (PTX ISA mma.m16n8k16 / m16n8k8 layouts; g = lane / 4, t = lane % 4).
  static MF_DEVICE void frag_a(u32* a, const TI* as, int m, int kk, int g, int t) {
    if constexpr (HALF) {
      a[0] = a_pair(as, m + g, kk + 2 * t);
      a[1] = a_pair(as, m + g + 8, kk + 2 * t);
      a[2] = a_pair(as, m + g, kk + 2 * t + 8);
      a[3] = a_pair(as, m + g + 8, kk + 2 * t + 8);
    } else {
      a[0] = tf32_bits<R>(to_f32(a_at(as, m + g, kk + t)));
      a[1] = tf32_bits<R>(to_f32(a_at(as, m + g + 8, kk + t)));
      a[2] = tf32_bits<R>(to_f32(a_at(as, m + g, kk + t + 4)));
      a[3] = tf32_bits<R>(to_f32(a_at(as, m + g + 8, kk + t + 4)));
    }
  }
  static MF_DEVICE void frag_b(u32* b, const TI* bs, int n, int kk, int g, int t) {
    if constexpr (HALF) {
      b[0] = b_pair(bs, kk + 2 * t, n + g);
      b[1] = b_pair(bs, kk + 2 * t + 8, n + g);
    } else {
      b[0] = tf32_bits<R>(to_f32(b_at(bs, kk + t, n + g)));
      b[1] = tf32_bits<R>(to_f32(b_at(bs, kk + t + 4, n + g)));
    }
  }

  static MF_DEVICE void run(TO* __restrict__ C, const TI* __restrict__ A, const TI* __restrict__ B,
                            const TO* __restrict__ bias, int M, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    if (gemm::dynamic_smem_bytes() < (u32)SMEM) __trap();  // launched with less than the catalog declares
    TI* smem = reinterpret_cast<TI*>(smem_raw);
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    if (m0 >= M || n0 >= N) return;  // uniform per CTA
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / WN, wn = warp % WN;
    const int g = lane / 4, t = lane % 4;
    const int a_contig = L == Layout::TN ? M : K, b_contig = L == Layout::NT ? K : N;
    const bool a_vec = (a_contig % VEC == 0) && aligned16(A);
    const bool b_vec = (b_contig % VEC == 0) && aligned16(B);

    float acc[FM][FN][4];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const int ktiles = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (s < ktiles) load_stage(smem + s * STAGE_ELEMS, A, B, m0, n0, s * BK, M, N, K, a_vec, b_vec);
      gemm::cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
      gemm::cp_async_wait<S - 2>();
      __syncthreads();  // stage kt has landed for all threads; everyone is done with stage kt-1
      const int pf = kt + S - 1;
      if (pf < ktiles) load_stage(smem + (pf % S) * STAGE_ELEMS, A, B, m0, n0, pf * BK, M, N, K, a_vec, b_vec);
      gemm::cp_async_commit();
      const TI* as = smem + (kt % S) * STAGE_ELEMS;
      const TI* bs = as + A_ELEMS;
#pragma unroll
      for (int kk = 0; kk < BK; kk += KSTEP) {
        u32 fa[FM][4], fb[FN][2];
#pragma unroll
        for (int i = 0; i < FM; ++i) frag_a(fa[i], as, wm * WTM + i * 16, kk, g, t);
#pragma unroll
        for (int j = 0; j < FN; ++j) frag_b(fb[j], bs, wn * WTN + j * 8, kk, g, t);
#pragma unroll
        for (int i = 0; i < FM; ++i)
#pragma unroll
          for (int j = 0; j < FN; ++j) mma16816(acc[i][j], fa[i], fb[j], TI());
      }
    }
    gemm::cp_async_wait<0>();
    __syncthreads();  // the pipeline buffers are reused for the C tile

    float* cs = reinterpret_cast<float*>(smem_raw);
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        const int r = wm * WTM + i * 16 + g, c = wn * WTN + j * 8 + 2 * t;
        *reinterpret_cast<float2*>(cs + r * C_LD + c) = make_float2(acc[i][j][0], acc[i][j][1]);
        *reinterpret_cast<float2*>(cs + (r + 8) * C_LD + c) = make_float2(acc[i][j][2], acc[i][j][3]);
      }
    __syncthreads();

    // Coalesced write-out, 4 consecutive columns per thread; bias added once, after the whole K reduction.
    const bool c_vec = (N % 4 == 0) && ((reinterpret_cast<u64>(C) & (4 * sizeof(TO) - 1)) == 0);
    for (int q = threadIdx.x; q < BM * BN / 4; q += THREADS) {
      const int r = q / (BN / 4), c = (q % (BN / 4)) * 4;
      const int m = m0 + r, n = n0 + c;
      if (m >= M || n >= N) continue;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = cs[r * C_LD + c + j];
        if (bias != nullptr && n + j < N) v[j] = __fadd_rn(v[j], to_f32(bias[n + j]));
      }
      TO* p = C + (i64)m * N + n;
      if (n + 3 < N) {
        store4(p, v, c_vec);
      } else {
        for (int j = 0; j < 4 && n + j < N; ++j) p[j] = from_f32<TO>(v[j]);
      }
    }
  }
};

}  // namespace tc
}  // namespace mf

// extern "C" tensor-core GEMM entry point: C [M,N] (TO) = op(A) op(B) (+ bias) with A, B of TI.
#define MF_GEMM_TC_KERNEL(NAME, TI, TO, L, BM, BN, BK, WM, WN, S, R)                                              \
  extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                     \
      NAME(TO* __restrict__ C, const TI* __restrict__ A, const TI* __restrict__ B, const TO* __restrict__ bias, \
           int M, int N, int K) {                                                                                \
    mf::tc::TileGemm<TI, TO, L, BM, BN, BK, WM, WN, S, R>::run(C, A, B, bias, M, N, K);                        \
  }
