// Portable tensor-core tile GEMM (mma.sync m16n8k16, bf16/f16 in, f32 accumulate) with a cp.async multi-stage
// shared-memory pipeline and ldmatrix fragment loads. Included by the Ada (sm_89) and Sm120 modules; only sm_80+ instructions, so it also builds for sm_90a (check role).
//
// Layout NN, dense row-major: C[M,N] = A[M,K] B[K,N] (+ nothing); C is T or f32 (TO).
// Batch invariance by construction: one tile shape per symbol; each C element is accumulated by one warp over
// the whole K range, k-tiles ascending and k16 steps ascending, the same instruction sequence for every row;
// tiles outside M/N/K are zero-filled in shared memory (zeros add nothing). No split-K, no atomics.
// Any M, N, K >= 0: 16-byte cp.async when the row's contiguous extent is a multiple of 8 and the base is 16-byte
// aligned, element loads otherwise; both put the same values in shared memory.
#pragma once
#include "mf/tile_common.cuh"
#include "mf/tile_pipe.cuh"

namespace mf {
namespace tile {

template <typename T> struct Mma16816;
template <> struct Mma16816<__nv_bfloat16> {
  static MF_DEVICE void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma16816<__half> {
  static MF_DEVICE void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// One k-tile of the bf16/f16 tiles (mma_nn here, mma_nn_tma in mf/tile_tma.cuh): BK / 16 k16 steps ascending; the
// warp whose tile starts at row WROW, column WCOL loads its A and B fragments with ldmatrix (x4, B transposed)
// from the stage's padded tiles at AS_ (A [BM][S::AS]) and BS_ (B [BK][S::BS]) and runs mma.sync m16n8k16 into ACC
// [MT][NT][4]. ADDR(base, e) is the shared-state-space address of element e of a tile: the cp.async tile holds
// T pointers, the TMA tile u32 addresses. Statements pasted into the caller, not a function: NVVM simplifies a
// callee on its own before inlining it, and for code that updates the accumulators inside the k-loop that
// renumbers their registers (the same instructions, other cubin bytes).
#define MF_TILE_PTR_ADDR(base, e) saddr(base + e)
#define MF_MMA_K_TILE(T, ACC, AS_, BS_, ADDR, S, BK, MT, NT, WROW, WCOL, lane)                           \
  _Pragma("unroll") for (int kk = 0; kk < BK / 16; ++kk) {                                                \
    u32 af[MT][4];                                                                                        \
    _Pragma("unroll") for (int i = 0; i < MT; ++i)                                                        \
      ldsm_x4(af[i], ADDR(AS_, (WROW + i * 16 + (lane % 16)) * S::AS + kk * 16 + (lane / 16) * 8));       \
    u32 bf[NT][2];                                                                                        \
    _Pragma("unroll") for (int j = 0; j < NT / 2; ++j) {                                                  \
      u32 r[4];                                                                                           \
      ldsm_x4_trans(r, ADDR(BS_, (kk * 16 + (lane % 16)) * S::BS + WCOL + j * 16 + (lane / 16) * 8));     \
      bf[2 * j][0] = r[0];                                                                                \
      bf[2 * j][1] = r[1];                                                                                \
      bf[2 * j + 1][0] = r[2];                                                                            \
      bf[2 * j + 1][1] = r[3];                                                                            \
    }                                                                                                     \
    _Pragma("unroll") for (int i = 0; i < MT; ++i)                                                        \
      _Pragma("unroll") for (int j = 0; j < NT; ++j) Mma16816<T>::run(ACC[i][j], af[i], bf[j][0], bf[j][1]); \
  }

// Dynamic shared memory of one instance, in bytes (the catalog's dynamic_smem expression says the same).
template <int BM, int BN, int BK, int STAGES> struct MmaSmem {
  static constexpr int AS = BK + 8, BS = BN + 8;  // padded row strides (elements): ldmatrix rows hit distinct banks
  static constexpr int A_ELEMS = BM * AS, B_ELEMS = BK * BS, STAGE_ELEMS = A_ELEMS + B_ELEMS;
  static constexpr int BYTES = STAGES * STAGE_ELEMS * 2;
};

template <typename T, typename TO, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, bool GROUPED>
MF_DEVICE void mma_nn(TO* __restrict__ C, const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) {
  using S = MmaSmem<BM, BN, BK, STAGES>;
  constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN && NT % 2 == 0, "warp tile must be 16 x 16k");
  static_assert(BK % 16 == 0 && STAGES >= 2, "BK multiple of 16, at least 2 stages");
  extern __shared__ __align__(16) unsigned char mma_smem_raw[];
  T* smem = reinterpret_cast<T*>(mma_smem_raw);

  int m0, n0;
  if (!tile_origin<BM, BN, GROUPED>(M, N, m0, n0)) return;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const bool a_vec = (K % 8 == 0) && aligned16(A);
  const bool b_vec = (N % 8 == 0) && aligned16(B);
  const int k_tiles = (K + BK - 1) / BK;

  auto load_stage = [&](int stage, int kt) {
    T* As = smem + stage * S::STAGE_ELEMS;
    T* Bs = As + S::A_ELEMS;
    const int k0 = kt * BK;
    MF_TILE_LOAD_ASYNC(T, As, A, BM, BK, S::AS, m0, k0, M, K, K, a_vec, tid, THREADS, 8, MF_CHUNK_COPY8)
    MF_TILE_LOAD_ASYNC(T, Bs, B, BK, BN, S::BS, k0, n0, K, N, N, b_vec, tid, THREADS, 8, MF_CHUNK_COPY8)
  };

  float acc[MT][NT][4];
  zero_acc(acc);

  MF_CP_ASYNC_FILL(STAGES, k_tiles, load_stage, , "unroll")
  for (int kt = 0; kt < k_tiles; ++kt) {
    MF_CP_ASYNC_NEXT(STAGES, kt, k_tiles, load_stage, )
    const T* As = smem + (kt % STAGES) * S::STAGE_ELEMS;
    const T* Bs = As + S::A_ELEMS;
    MF_MMA_K_TILE(T, acc, As, Bs, MF_TILE_PTR_ADDR, S, BK, MT, NT, wm * WTM, wn * WTN, lane);
  }
  cp_async_wait<0>();

  MF_FRAG_TILES(MT, NT, m0 + wm * WTM, n0 + wn * WTN, lane / 4, (lane % 4), MF_MMA_PAIR_OUT)
}

}  // namespace tile
}  // namespace mf

// NAME(C, A, B, M, N, K): one CTA per BM x BN tile, grid = ceil(M/BM) * ceil(N/BN).
#define MF_TILE_MMA_NN(NAME, T, TO, BM, BN, BK, WARPS_M, WARPS_N, STAGES, GROUPED) \
  extern "C" __global__ void __launch_bounds__(32 * (WARPS_M) * (WARPS_N)) NAME( \
      TO* __restrict__ C, const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    mf::tile::mma_nn<T, TO, BM, BN, BK, WARPS_M, WARPS_N, STAGES, GROUPED>(C, A, B, M, N, K); \
  }
