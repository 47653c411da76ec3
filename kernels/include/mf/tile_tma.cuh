// TMA-fed tile GEMMs of the CC 12.x module (kernels/sm120: sm_120a, sm_121a; also built for sm_90a, check role).
// The math is that of the portable cp.async tiles (mf/tile_mma.cuh, mf/tile_tf32.cuh, mf/tile_fma.cuh): the same
// mma.sync / FFMA instructions per output element, the same K order, accumulators from 0, so a symbol here gives
// the bits of the cp.async tile of the same template. Only the global -> shared copies differ:
//
//  * one thread issues cp.async.bulk.tensor.2d (TMA) boxes of A and B into a STAGES-deep shared-memory ring; each
//    stage has a "full" mbarrier (count 1: the issuer's arrive.expect_tx, completed by the boxes' bytes); every
//    computing thread waits on it, then the CTA barrier at the top of each k-tile says the stage refilled next
//    (consumed one k-tile ago) is free, as in the cp.async ring;
//  * boxes are unswizzled and one 16-byte chunk wider than the tile along their contiguous dimension, so a box
//    row lands at the cp.async tiles' padded shared-memory stride (A: BM rows x (BK + pad), B: BK rows x (BN + pad))
//    and the fragment loads keep their bank-spread addressing; the extra chunk holds neighbouring (or zero-filled)
//    elements that the math never reads;
//  * the hardware zero-fills the parts of a box outside the matrix, so ragged M, N and K tiles need no special
//    path. Tensor maps need 16-byte aligned bases and row strides (16-bit: K % 8 == 0 and N % 8 == 0; f32:
//    K % 4 == 0 and N % 4 == 0), checked by the host (mamba_forge/gpu/tma.py, padded_tile_maps).
// Tensor maps are kernel parameters by value (const __grid_constant__ mf::TmaDesc), as for the wgmma GEMMs.
#pragma once
#include "mf/tile_mma.cuh"
#include "mf/tile_tf32.cuh"
#include "mf/tile_fma.cuh"
#include "mf/tma.cuh"

#if defined(MF_HAS_TMA)
namespace mf {
namespace tile {

// 2-D tiled TMA load into this CTA's shared memory (the .shared::cta destination form, PTX ISA 8.6): ptxas for
// sm_120a / sm_121a gives the .shared::cluster form of mf::tma_load_2d an 8-byte stack frame, this one none.
// Out-of-bounds box elements are zero-filled; completion is signalled on `bar` as transaction bytes.
MF_DEVICE void tma_load_2d_cta(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Ring layout from a 128-byte aligned base (TMA destinations are 128-byte aligned): STAGES stages of
// [A box | B box], then STAGES 8-byte "full" mbarriers. The catalog's dynamic_smem adds 128 bytes of slack.
template <int A_BYTES, int STAGE_BYTES, int STAGES> struct TmaRing {
  static_assert(A_BYTES % 128 == 0 && STAGE_BYTES % 128 == 0, "every box starts 128-byte aligned");
  static constexpr int BAR_OFFSET = STAGES * STAGE_BYTES;
  static constexpr int TOTAL = BAR_OFFSET + 8 * STAGES + 128;
  u32 base, bars;

  MF_DEVICE explicit TmaRing(const void* raw) {
    base = (smem_addr(raw) + 127u) & ~127u;
    bars = base + BAR_OFFSET;
  }
  // The ring as floats (generic address): the 128-byte aligned base inside the dynamic shared array `raw`.
  MF_DEVICE const float* floats(const unsigned char* raw) const {
    return reinterpret_cast<const float*>(raw + (base - smem_addr(raw)));
  }
  MF_DEVICE u32 a(int stage) const { return base + stage * STAGE_BYTES; }
  MF_DEVICE u32 b(int stage) const { return base + stage * STAGE_BYTES + A_BYTES; }
  MF_DEVICE u32 full(int stage) const { return bars + 8 * stage; }

  // One thread: the barriers, visible to the async proxy before the first copy signals them. All threads call
  // this (it ends with the CTA barrier).
  MF_DEVICE void init(bool leader, const TmaDesc* tmA, const TmaDesc* tmB) const {
    if (leader) {
      tma_prefetch_desc(tmA);
      tma_prefetch_desc(tmB);
      for (int s = 0; s < STAGES; ++s) mbar_init(full(s), 1);
      mbar_init_fence();
    }
    __syncthreads();
  }
  // The issuing thread: k-tile kt into `stage`. A is M x K (box at k0, m0), B is K x N (box at n0, k0).
  MF_DEVICE void issue(int stage, int kt, int BK, int m0, int n0, const TmaDesc* tmA, const TmaDesc* tmB) const {
    const u32 bar = full(stage);
    mbar_expect_tx(bar, (u32)(STAGE_BYTES));
    tma_load_2d_cta(a(stage), tmA, bar, kt * BK, m0);
    tma_load_2d_cta(b(stage), tmB, bar, n0, kt * BK);
  }
  // k-tile kt is in shared memory (its stage's use number kt / STAGES gives the phase parity).
  MF_DEVICE void wait(int kt) const { mbar_wait(full(kt % STAGES), (u32)((kt / STAGES) & 1)); }
};

// ---- bf16/f16 mma.sync m16n8k16 (arithmetic of mma_nn in mf/tile_mma.cuh) ----
// The ring's tiles are u32 shared addresses: element e of a 16-bit tile is 2 bytes * e in.
#define MF_TMA_U32_ADDR(base, e) base + 2u * (e)
template <typename T, typename TO, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, bool GROUPED>
MF_DEVICE void mma_nn_tma(TO* __restrict__ C, const TmaDesc* tmA, const TmaDesc* tmB, int M, int N, int K) {
  using S = MmaSmem<BM, BN, BK, STAGES>;
  using Ring = TmaRing<S::A_ELEMS * 2, S::STAGE_ELEMS * 2, STAGES>;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN && NT % 2 == 0, "warp tile must be 16 x 16k");
  static_assert(BK % 16 == 0 && STAGES >= 2, "BK multiple of 16, at least 2 stages");
  static_assert(S::AS <= 256 && S::BS <= 256 && BM <= 256 && BK <= 256, "TMA box sides are at most 256");
  extern __shared__ __align__(128) unsigned char mma_tma_smem_raw[];
  const Ring ring(mma_tma_smem_raw);

  int m0, n0;
  if (!tile_origin<BM, BN, GROUPED>(M, N, m0, n0)) return;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int k_tiles = (K + BK - 1) / BK;
  ring.init(tid == 0, tmA, tmB);

  float acc[MT][NT][4];
  zero_acc(acc);

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
      if (s < k_tiles) ring.issue(s, s, BK, m0, n0, tmA, tmB);
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ring.wait(kt);    // k-tile kt has landed ...
    __syncthreads();  // ... and the stage refilled below was consumed at kt - 1 by every warp
    const int pre = kt + STAGES - 1;
    if (tid == 0 && pre < k_tiles) ring.issue(pre % STAGES, pre, BK, m0, n0, tmA, tmB);
    const u32 As = ring.a(kt % STAGES), Bs = ring.b(kt % STAGES);
    MF_MMA_K_TILE(T, acc, As, Bs, MF_TMA_U32_ADDR, S, BK, MT, NT, wm * WTM, wn * WTN, lane);
  }

  MF_FRAG_TILES(MT, NT, m0 + wm * WTM, n0 + wn * WTN, lane / 4, (lane % 4), MF_MMA_PAIR_OUT)
}

// ---- TF32 mma.sync m16n8k8 (arithmetic of tf32_nn in mf/tile_tf32.cuh) ----
// PRODUCER = 1: lane 0 of a fifth warp issues the boxes and that warp computes nothing.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int PRODUCER, int PAIR>
MF_DEVICE void tf32_nn_tma(float* __restrict__ C, const TmaDesc* tmA, const TmaDesc* tmB, int M, int N, int K) {
  using S = Tf32Smem<BM, BN, BK, STAGES>;
  using Ring = TmaRing<S::A_ELEMS * 4, S::STAGE_ELEMS * 4, STAGES>;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "warp tile must be whole m16n8 tiles");
  static_assert(BK % 8 == 0 && STAGES >= 2, "BK multiple of 8, at least 2 stages");
  static_assert(S::AS <= 256 && S::BS <= 256 && BM <= 256 && BK <= 256, "TMA box sides are at most 256");
  extern __shared__ __align__(128) unsigned char tf32_tma_smem_raw[];
  const Ring ring(tf32_tma_smem_raw);
  const float* smem = ring.floats(tf32_tma_smem_raw);

  int m0, n0;
  if (!row_major_tile<BM, BN>(M, N, m0, n0)) return;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const bool computer = PRODUCER ? (warp < WARPS_M * WARPS_N) : true;
  const bool issuer = PRODUCER ? (warp == WARPS_M * WARPS_N && lane == 0) : (tid == 0);
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int k_tiles = (K + BK - 1) / BK;
  ring.init(issuer, tmA, tmB);

  float acc[MT][NT][4];
  zero_acc(acc);

  if (issuer) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
      if (s < k_tiles) ring.issue(s, s, BK, m0, n0, tmA, tmB);
  }
  const int g = lane / 4, t = lane % 4;
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (computer) ring.wait(kt);
    __syncthreads();  // the stage refilled next was consumed at kt - 1
    const int pre = kt + STAGES - 1;
    if (issuer && pre < k_tiles) ring.issue(pre % STAGES, pre, BK, m0, n0, tmA, tmB);
    if (computer) {
      MF_TF32_K_TILE(acc, smem + (kt % STAGES) * S::STAGE_ELEMS, S, BK, MT, NT, wm * WTM, wn * WTN, g, t);
    }
  }
  if (!computer) return;

  const bool pair = PAIR && (N % 2 == 0) && ((reinterpret_cast<u64>(C) & 7ull) == 0);
  MF_FRAG_TILES(MT, NT, m0 + wm * WTM, n0 + wn * WTN, g, t, MF_TF32_PAIR_OUT)
}

// ---- exact f32 FFMA chain (the chain of fma_nn in mf/tile_fma.cuh) ----
// TMA cannot transpose, so A stays M x K in shared memory (As[m][k], stride BK + 4 floats) where the cp.async
// tile stores it transposed: a thread reads its TM rows four k at a time as float4s and runs the k steps of the
// four in ascending order, so every output is still acc = fmaf(A[m,k], B[k,n], acc) for k = 0..K-1 exactly.
template <int BM, int BN, int BK> struct FmaTmaSmem {
  static constexpr int AK = BK + 4, BS = BN + 4;  // A: BM rows of AK floats; B: BK rows of BS floats
  static constexpr int A_ELEMS = BM * AK, STAGE_ELEMS = A_ELEMS + BK * BS;
};

template <int BM, int BN, int BK, int THREADS, int STAGES, int BIAS, int KUNROLL>
MF_DEVICE void fma_nn_tma(float* __restrict__ C, const TmaDesc* tmA, const TmaDesc* tmB,
                          const float* __restrict__ bias, int M, int N, int K) {
  using S = FmaTmaSmem<BM, BN, BK>;
  using Ring = TmaRing<S::A_ELEMS * 4, S::STAGE_ELEMS * 4, STAGES>;
  using TT = FmaThreadTile<BM, BN, THREADS>;
  constexpr int TN = TT::TN, TM = TT::TM, TX = TT::TX;
  static_assert(BK % 4 == 0 && KUNROLL % 4 == 0 && STAGES >= 2, "k in groups of four, at least 2 stages");
  static_assert(S::AK <= 256 && S::BS <= 256 && BM <= 256 && BK <= 256, "TMA box sides are at most 256");
  extern __shared__ __align__(128) unsigned char fma_tma_smem_raw[];
  const Ring ring(fma_tma_smem_raw);
  const float* smem = ring.floats(fma_tma_smem_raw);

  int m0, n0;
  if (!row_major_tile<BM, BN>(M, N, m0, n0)) return;
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  const int k_tiles = (K + BK - 1) / BK;
  ring.init(tid == 0, tmA, tmB);

  float acc[TM][TN];
  zero_acc(acc);

  auto b_row = [&](const float* Bs, int kk, float (&b)[TN]) {
#pragma unroll
    for (int j = 0; j < TN; j += 4) *reinterpret_cast<float4*>(b + j) = *reinterpret_cast<const float4*>(Bs + kk * S::BS + tx * TN + j);
  };
  auto step4 = [&](const float* As, const float* Bs, int kk) {  // k = kk .. kk + 3, ascending
    float4 a4[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) a4[i] = *reinterpret_cast<const float4*>(As + (ty * TM + i) * S::AK + kk);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float b[TN];
      b_row(Bs, kk + q, b);
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const float a = q == 0 ? a4[i].x : q == 1 ? a4[i].y : q == 2 ? a4[i].z : a4[i].w;
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a, b[j], acc[i][j]);
      }
    }
  };
  auto step1 = [&](const float* As, const float* Bs, int kk) {
    float b[TN];
    b_row(Bs, kk, b);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const float a = As[(ty * TM + i) * S::AK + kk];
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a, b[j], acc[i][j]);
    }
  };

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
      if (s < k_tiles) ring.issue(s, s, BK, m0, n0, tmA, tmB);
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ring.wait(kt);
    __syncthreads();  // the stage refilled next was consumed at kt - 1
    const int pre = kt + STAGES - 1;
    if (tid == 0 && pre < k_tiles) ring.issue(pre % STAGES, pre, BK, m0, n0, tmA, tmB);
    const float* As = smem + (kt % STAGES) * S::STAGE_ELEMS;
    const float* Bs = As + S::A_ELEMS;
    const int kmax = min(BK, K - kt * BK);  // the chain stops at K: no padded fma steps
    if (kmax == BK) {
#pragma unroll (KUNROLL / 4)
      for (int kk = 0; kk < BK; kk += 4) step4(As, Bs, kk);
    } else {
      for (int kk = 0; kk < kmax; ++kk) step1(As, Bs, kk);
    }
  }

  MF_FMA_TILE_OUT(TM, TN, m0 + ty * TM, n0 + tx * TN)
}

}  // namespace tile
}  // namespace mf
#endif  // MF_HAS_TMA

// ABI of every symbol here: (tmA, tmB, C, A, B, [bias,] M, N, K), as the wgmma GEMMs: the tensor maps address A and
// B; the raw pointers stay in the ABI for the qualifier (fills, guards). One CTA per BM x BN tile,
// grid = ceil(M/BM) * ceil(N/BN).
#define MF_TILE_MMA_NN_TMA(NAME, T, TO, BM, BN, BK, WARPS_M, WARPS_N, STAGES, GROUPED) \
  extern "C" __global__ void __launch_bounds__(32 * (WARPS_M) * (WARPS_N)) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, TO* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; \
    mf::tile::mma_nn_tma<T, TO, BM, BN, BK, WARPS_M, WARPS_N, STAGES, GROUPED>(C, &tmA, &tmB, M, N, K); \
  }
#define MF_TILE_TF32_NN_TMA(NAME, BM, BN, BK, WARPS_M, WARPS_N, STAGES, PRODUCER, PAIR) \
  extern "C" __global__ void __launch_bounds__(32 * (WARPS_M) * (WARPS_N) + 32 * (PRODUCER)) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, float* __restrict__ C, \
      const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; \
    mf::tile::tf32_nn_tma<BM, BN, BK, WARPS_M, WARPS_N, STAGES, PRODUCER, PAIR>(C, &tmA, &tmB, M, N, K); \
  }
#define MF_TILE_FMA_NN_TMA(NAME, BM, BN, BK, THREADS, STAGES, KUNROLL) \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, float* __restrict__ C, \
      const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; \
    mf::tile::fma_nn_tma<BM, BN, BK, THREADS, STAGES, 0, KUNROLL>(C, &tmA, &tmB, nullptr, M, N, K); \
  }
#define MF_TILE_FMA_BIAS_NN_TMA(NAME, BM, BN, BK, THREADS, STAGES, KUNROLL) \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, float* __restrict__ C, \
      const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias, int M, int N, int K) { \
    (void)A; (void)B; \
    mf::tile::fma_nn_tma<BM, BN, BK, THREADS, STAGES, 1, KUNROLL>(C, &tmA, &tmB, bias, M, N, K); \
  }
