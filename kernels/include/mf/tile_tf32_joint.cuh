// Ada TF32-joint tile GEMMs (kernels/sm89/tf32.toml): the named variants of the portable TF32 tile
// (mf/tile_tf32.cuh: mma.sync m16n8k8 tf32, f32 accumulate, cp.async STAGES-deep pipeline, whole K per CTA with
// k-tiles and k8 steps ascending, zero-filled edges) plus the pre-RNA transpose pass. Only sm_80+ instructions
// (also built for sm_90a, check role). What is new here, and why it lives in its own header:
//   B_NK   = 1: B stored [N, K] (layout NT, C = A B^T); B's shared tile is [BN][BK + 4], read K-contiguous.
//   A_PRE  = 1: A already holds TF32 values (rounded with cvt.rna by tn_pre_rna_transpose): its bits go to the
//               mma as they are, no cvt at fragment load. (An unrounded A is then truncated by the mma.)
//   A_LDSM = 1: A fragments come from one ldmatrix.x4 per m16 tile (four 8x4-float matrices = a0..a3 of the
//               m16n8k8 tf32 fragment) instead of four scalar shared loads; the values, hence bits, are the same.
//   SPLIT  = 0: plain TF32 (x -> rna(x)).
//   SPLIT  = 1: "add-half direct": x = hi + lo, hi = rna(x), lo = rna(x - hi); per k8 step acc += lo_a hi_b,
//               acc += hi_a lo_b, acc += hi_a hi_b into one accumulator (3xTF32, lo_a lo_b dropped).
//   SPLIT  = 2: "add-half" baseline: the same three products, the two low-half terms in their own accumulator
//               that is added to the hi_a hi_b accumulator once, after the last k-tile.
// Each C element is owned by one thread for the whole K range and the per-element instruction sequence depends
// only on K, so every symbol is batch invariant and bitwise repeatable by construction. No atomics, no local
// memory: the fragment arrays are indexed by unrolled constants only.
#pragma once
#include "mf/tile_tf32.cuh"

namespace mf {
namespace tile {

MF_DEVICE u32 tf32_bits(float x) { return __float_as_uint(x); }

// a0..a3 of an m16n8k8 tf32 A fragment from a row-major [16][stride] float tile: lane l addresses row l % 8 of
// matrix l / 8 (matrix 0: rows 0-7 k 0-3, 1: rows 8-15 k 0-3, 2: rows 0-7 k 4-7, 3: rows 8-15 k 4-7); a b16
// 8x8 matrix row is 16 bytes = 4 floats, so lane (g, t) receives word t of row g of each matrix.
MF_DEVICE void ldmatrix_a_tf32(u32 (&a)[4], const float* tile, int stride, int lane) {
  const int mi = lane / 8, r = lane % 8;
  const float* p = tile + ((mi & 1) * 8 + r) * stride + (mi >> 1) * 4;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(saddr(p)));
}

template <int BM, int BN, int BK, int STAGES, int B_NK> struct JointSmem {
  static constexpr int AS = BK + 4;                 // A tile [BM][BK + 4]
  static constexpr int BS = B_NK ? BK + 4 : BN + 4;  // B tile [BN][BK + 4] (NT) or [BK][BN + 4] (NN)
  static constexpr int A_ELEMS = BM * AS, B_ELEMS = (B_NK ? BN : BK) * BS, STAGE_ELEMS = A_ELEMS + B_ELEMS;
  static constexpr int BYTES = STAGES * STAGE_ELEMS * 4;
};

// tf32_joint's epilogue pair (mf/tile_pipe.cuh MF_FRAG_TILES): SPLIT = 2 adds the low-half products' own
// accumulator once, here, before the store.
#define MF_SPLIT_PAIR_OUT()                                \
  if (row >= M) continue;                                  \
  float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];  \
  if (SPLIT == 2) {                                        \
    v0 += lo_acc[SPLIT == 2 ? i : 0][j][2 * h];            \
    v1 += lo_acc[SPLIT == 2 ? i : 0][j][2 * h + 1];        \
  }                                                        \
  MF_TF32_PAIR_STORE(v0, v1)

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int B_NK, int A_PRE, int A_LDSM, int SPLIT>
MF_DEVICE void tf32_joint(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M,
                          int N, int K) {
  using S = JointSmem<BM, BN, BK, STAGES, B_NK>;
  constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
  constexpr int ACC2 = SPLIT == 2 ? MT : 1;  // the baseline's low-half accumulators (a dummy 1 x NT otherwise)
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "warp tile must be whole m16n8 tiles");
  static_assert(BK % 8 == 0 && STAGES >= 2, "BK multiple of 8, at least 2 stages");
  static_assert(!(A_PRE && SPLIT), "a pre-rounded A has no low half");
  extern __shared__ __align__(16) unsigned char tf32_joint_smem_raw[];
  float* smem = reinterpret_cast<float*>(tf32_joint_smem_raw);

  int m0, n0;
  if (!row_major_tile<BM, BN>(M, N, m0, n0)) return;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const bool a_vec = (K % 4 == 0) && aligned16(A);
  const bool b_vec = (B_NK ? (K % 4 == 0) : (N % 4 == 0)) && aligned16(B);
  const int k_tiles = (K + BK - 1) / BK;

  // one [ROWS][COLS] tile of a row-major [rows][cols] matrix (row stride ld) into shared rows of `stride` floats
  auto load_tile = [&](float* dst0, const float* src, int ROWS, int COLS, int stride, int r0, int c0, int rows,
                       int cols, int ld, bool vec) {
    load_tile_async<THREADS>(dst0, src, ROWS, COLS, stride, r0, c0, rows, cols, ld, vec, tid);
  };
  auto load_stage = [&](int stage, int kt) {
    float* As = smem + stage * S::STAGE_ELEMS;
    float* Bs = As + S::A_ELEMS;
    const int k0 = kt * BK;
    load_tile(As, A, BM, BK, S::AS, m0, k0, M, K, K, a_vec);
    if (B_NK) {
      load_tile(Bs, B, BN, BK, S::BS, n0, k0, N, K, K, b_vec);
    } else {
      load_tile(Bs, B, BK, BN, S::BS, k0, n0, K, N, N, b_vec);
    }
  };

  float acc[MT][NT][4], lo_acc[ACC2][NT][4];
  zero_acc(acc);
  zero_acc(lo_acc);

  MF_CP_ASYNC_FILL(STAGES, k_tiles, load_stage, , "unroll")
  const int g = lane / 4, t = lane % 4;
  for (int kt = 0; kt < k_tiles; ++kt) {
    MF_CP_ASYNC_NEXT(STAGES, kt, k_tiles, load_stage, )
    const float* As = smem + (kt % STAGES) * S::STAGE_ELEMS;
    const float* Bs = As + S::A_ELEMS;
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) {
      u32 ahi[MT][4], alo[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const float* tile = As + (wm * WTM + i * 16) * S::AS + kk * 8;
        float x[4];
        if (A_LDSM) {
          u32 w[4];
          ldmatrix_a_tf32(w, tile, S::AS, lane);
#pragma unroll
          for (int e = 0; e < 4; ++e) x[e] = __uint_as_float(w[e]);
        } else {
          const float* a = tile + g * S::AS + t;
          x[0] = a[0];
          x[1] = a[8 * S::AS];
          x[2] = a[4];
          x[3] = a[8 * S::AS + 4];
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          ahi[i][e] = A_PRE ? tf32_bits(x[e]) : to_tf32_rna(x[e]);
          alo[i][e] = SPLIT ? to_tf32_rna(x[e] - __uint_as_float(ahi[i][e])) : 0u;
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int n = wn * WTN + j * 8 + g;
        const float y0 = B_NK ? Bs[n * S::BS + kk * 8 + t] : Bs[(kk * 8 + t) * S::BS + n];
        const float y1 = B_NK ? Bs[n * S::BS + kk * 8 + t + 4] : Bs[(kk * 8 + t + 4) * S::BS + n];
        const u32 b0 = to_tf32_rna(y0), b1 = to_tf32_rna(y1);
        if (SPLIT) {
          const u32 l0 = to_tf32_rna(y0 - __uint_as_float(b0)), l1 = to_tf32_rna(y1 - __uint_as_float(b1));
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            float (&small)[4] = SPLIT == 2 ? lo_acc[SPLIT == 2 ? i : 0][j] : acc[i][j];
            mma_tf32_1688(small, alo[i], b0, b1);  // lo_a hi_b
            mma_tf32_1688(small, ahi[i], l0, l1);  // hi_a lo_b
            mma_tf32_1688(acc[i][j], ahi[i], b0, b1);
          }
        } else {
#pragma unroll
          for (int i = 0; i < MT; ++i) mma_tf32_1688(acc[i][j], ahi[i], b0, b1);
        }
      }
    }
  }
  cp_async_wait<0>();

  const bool pair = (N % 2 == 0) && ((reinterpret_cast<u64>(C) & 7ull) == 0);
  MF_FRAG_TILES(MT, NT, m0 + wm * WTM, n0 + wn * WTN, g, t, MF_SPLIT_PAIR_OUT)
}

// At[M, K] = tf32_rna(A)^T for the TN operand A [K, M] (row-major): the pre-RNA pass of the TN GEMMs, so they
// read A K-major and already rounded. One 32 x 32 tile per CTA through a padded shared tile (row reads and
// writes both coalesced); every element is rounded once, with cvt.rna (ties away from zero), written as f32.
template <int TILE, int ROWS>
MF_DEVICE void tf32_rna_transpose(float* __restrict__ At, const float* __restrict__ A, int M, int K) {
  __shared__ float tile[TILE][TILE + 1];
  const int tiles_m = (M + TILE - 1) / TILE, tiles_k = (K + TILE - 1) / TILE;
  if ((int)blockIdx.x >= tiles_m * tiles_k) return;
  const int k0 = (blockIdx.x / tiles_m) * TILE, m0 = (blockIdx.x % tiles_m) * TILE;
  const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
  for (int r = ty; r < TILE; r += ROWS) {  // A rows k0 + r, columns m0 + tx
    const int k = k0 + r, m = m0 + tx;
    tile[r][tx] = (k < K && m < M) ? __uint_as_float(to_tf32_rna(A[(i64)k * M + m])) : 0.f;
  }
  __syncthreads();
  for (int r = ty; r < TILE; r += ROWS) {  // At rows m0 + r, columns k0 + tx
    const int m = m0 + r, k = k0 + tx;
    if (m < M && k < K) At[(i64)m * K + k] = tile[tx][r];
  }
}

}  // namespace tile
}  // namespace mf

// NAME(C, A, B, M, N, K): one CTA per BM x BN tile (row-major tile order), grid = ceil(M/BM) * ceil(N/BN).
#define MF_TILE_TF32_JOINT(NAME, BM, BN, BK, WARPS_M, WARPS_N, STAGES, B_NK, A_PRE, A_LDSM, SPLIT) \
  extern "C" __global__ void __launch_bounds__(32 * (WARPS_M) * (WARPS_N)) NAME( \
      float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K) { \
    mf::tile::tf32_joint<BM, BN, BK, WARPS_M, WARPS_N, STAGES, B_NK, A_PRE, A_LDSM, SPLIT>(C, A, B, M, N, K); \
  }

// NAME(At, A, M, K): grid = ceil(M/TILE) * ceil(K/TILE), TILE * ROWS threads.
#define MF_TF32_RNA_TRANSPOSE(NAME, TILE, ROWS) \
  extern "C" __global__ void __launch_bounds__((TILE) * (ROWS)) NAME(float* __restrict__ At, \
                                                                     const float* __restrict__ A, int M, int K) { \
    mf::tile::tf32_rna_transpose<TILE, ROWS>(At, A, M, K); \
  }
