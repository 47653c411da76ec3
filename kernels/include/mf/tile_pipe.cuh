// Pieces the cp.async / TMA tile GEMMs share (mf/tile_mma.cuh, tile_tf32.cuh, tile_tf32_joint.cuh, tile_fma.cuh,
// tile_tma.cuh): accumulator reset, tile origins, the epilogues (the loader and the ring: mf/tile_async.cuh).
// Each is the code the headers had inline, moved here unchanged in what it computes and in what order.
#pragma once
#include "mf/tile_common.cuh"
#include "mf/tile_async.cuh"

namespace mf {

// Accumulator tiles set to +0 (every chain starts there); fully unrolled, so the arrays stay in registers.
template <int A, int B> MF_DEVICE void zero_acc(float (&acc)[A][B]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) acc[i][j] = 0.f;
}
template <int A, int B, int C> MF_DEVICE void zero_acc(float (&acc)[A][B][C]) {
#pragma unroll
  for (int i = 0; i < A; ++i) zero_acc(acc[i]);
}

namespace tile {

// Tile order of the bf16/f16 tiles (tile_mma, tile_tma): CTA blockIdx.x takes tile t = blockIdx.x in grouped
// (GROUPED: 8 row tiles walk the column tiles together) or row-major order (mf::tile::tile_coords), at (m0, n0);
// false for a CTA past the last tile.
template <int BM, int BN, bool GROUPED> MF_DEVICE bool tile_origin(int M, int N, int& m0, int& n0) {
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  if ((int)blockIdx.x >= tiles_m * tiles_n) return false;
  int tm, tn;
  tile_coords<GROUPED>(blockIdx.x, tiles_m, tiles_n, tm, tn);
  m0 = tm * BM;
  n0 = tn * BN;
  return true;
}

// Row-major tile order (tile_tf32, tile_tf32_joint, tile_fma, tile_tma): CTA blockIdx.x takes the BM x BN tile at
// (m0, n0) = (blockIdx.x / tiles_n, blockIdx.x % tiles_n) * (BM, BN); false for a CTA past the last tile.
template <int BM, int BN> MF_DEVICE bool row_major_tile(int M, int N, int& m0, int& n0) {
  const int tiles_n = (N + BN - 1) / BN, tiles_m = (M + BM - 1) / BM;
  if ((int)blockIdx.x >= tiles_m * tiles_n) return false;
  m0 = (blockIdx.x / tiles_n) * BM;
  n0 = (blockIdx.x % tiles_n) * BN;
  return true;
}

// MF_TILE_LOAD_ASYNC (mf/tile_async.cuh) as a function of runtime shape, f32 only: tile_tf32_joint.cuh's
// loader, a lambda of its own (so its addresses fold as they did when the loop was that lambda's body).
template <int THREADS>
MF_DEVICE void load_tile_async(float* dst0, const float* src, int ROWS, int COLS, int stride, int r0, int c0,
                               int rows, int cols, int ld, bool vec, int tid) {
  MF_TILE_LOAD_ASYNC(float, dst0, src, ROWS, COLS, stride, r0, c0, rows, cols, ld, vec, tid, THREADS, 4, MF_CHUNK_CP4)
}

}  // namespace tile
}  // namespace mf

// The tiles' epilogues, as statement macros like those of mf/tile_async.cuh: as functions (C a __restrict__
// parameter) they kept the sm_89 / sm_90a cubins, but the sm_120a / sm_121a TMA tiles' branches came out in another
// layout (other cubin bytes). They name the caller's C, acc, M, N (and pair, bias, BIAS where they use them).
//
// MF_FRAG_TILES: the walk over a warp's m16n8 accumulator tiles (mma.sync m16n8k16 and m16n8k8 alike): c0, c1 of
// tile (i, j) at (g, 2t + {0,1}), c2, c3 eight rows below (g = lane / 4, t = lane % 4), the warp's tile at (R0, C0)
// of C (M x N, row-major); PAIR() stores the pair acc[i][j][2h], acc[i][j][2h + 1] at (row, col), (row, col + 1).
#define MF_FRAG_TILES(MT, NT, R0, C0, g, t, PAIR)     \
  _Pragma("unroll") for (int i = 0; i < MT; ++i)      \
    _Pragma("unroll") for (int j = 0; j < NT; ++j)    \
      _Pragma("unroll") for (int h = 0; h < 2; ++h) { \
        const int row = R0 + i * 16 + g + 8 * h;      \
        const int col = C0 + j * 8 + t * 2;           \
        PAIR()                                        \
      }
// bf16/f16 tiles (tile_mma.cuh, tile_tma.cuh): T outputs, element by element inside C.
#define MF_MMA_PAIR_OUT()                                                           \
  if (row < M) {                                                                    \
    if (col < N) store_out(C + (i64)row * N + col, acc[i][j][2 * h]);               \
    if (col + 1 < N) store_out(C + (i64)row * N + col + 1, acc[i][j][2 * h + 1]);   \
  }
// TF32 tiles (tile_tf32.cuh, tile_tma.cuh; tile_tf32_joint.cuh adds its low half first): V0, V1 as one 8-byte
// float2 where `pair` allows (N even and C 8-byte aligned) and col + 1 < N, else as floats inside C.
#define MF_TF32_PAIR_STORE(V0, V1)                                  \
  float* p = C + (i64)row * N + col;                                \
  if (pair && col + 1 < N) {                                        \
    *reinterpret_cast<float2*>(p) = make_float2(V0, V1);            \
  } else {                                                          \
    if (col < N) p[0] = V0;                                         \
    if (col + 1 < N) p[1] = V1;                                     \
  }
#define MF_TF32_PAIR_OUT() \
  if (row >= M) continue;  \
  MF_TF32_PAIR_STORE(acc[i][j][2 * h], acc[i][j][2 * h + 1])

// The FFMA tiles (tile_fma.cuh, tile_tma.cuh): this thread's TM x TN outputs from (R0, C0), each the finished
// chain (+ bias[col] when BIAS); nothing outside C.
#define MF_FMA_TILE_OUT(TM, TN, R0, C0)                                                      \
  _Pragma("unroll") for (int i = 0; i < TM; ++i) {                                           \
    const int row = R0 + i;                                                                  \
    if (row >= M) continue;                                                                  \
    _Pragma("unroll") for (int j = 0; j < TN; ++j) {                                         \
      const int col = C0 + j;                                                                \
      if (col < N) C[(i64)row * N + col] = BIAS ? acc[i][j] + bias[col] : acc[i][j];         \
    }                                                                                        \
  }
