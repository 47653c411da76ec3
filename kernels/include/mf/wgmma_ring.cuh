// The warp-specialised pipeline of the Hopper wgmma GEMMs (kernels/sm90a/wgmma.cu: 16-bit, wgmma_tf32.cu: TF32):
// TMA boxes into a STAGES-deep shared-memory ring guarded by full/empty mbarriers; one producer warpgroup (one
// elected thread issues the boxes, registers given back with setmaxnreg.dec) and NC consumer warpgroups issuing
// wgmma.mma_async over each stage. Persistent grid: CTA b takes tiles b, b + gridDim.x, ... in grouped order
// (GROUP_M row tiles walk the N tiles together: L2 reuse of B).
//
// The order of the arithmetic is fixed here for both families: every C tile is reduced over the whole K range in
// one CTA, k-tiles ascending, one f32 accumulator per output starting at +0, no split-K and no atomics. What the
// families differ in is the caller's: the element, the k-tile depth BK, the boxes, the wgmma instruction and the
// epilogue, given as callables (inlined; nothing here decides a bit).
#pragma once
#include "mf/common.cuh"
#include "mf/tma.cuh"
#include "mf/wgmma.cuh"

namespace mf {

#if defined(MF_HAS_WGMMA)

// S: the caller's shared-memory plan from the 1024-aligned `base`: stage s at base + s * S::STAGE_BYTES (A, then B
// at + S::A_BYTES), the 2 * STAGES barriers at S::BAR_OFFSET. Threads: 128 * (NC + 1), warpgroup 0 the producer.
//   boxes(sa, sb, fb, m0, n0, k0): the producer's TMA boxes of one k-tile (S::STAGE_BYTES, signalled on fb);
//   k_tile(acc, sa, sb, c): consumer c's wgmma batch over one stage (between fence and commit);
//   epilogue(acc, tm, tn, c, warp, lane, tid_in_wg): consumer c's rows of tile (tm, tn) out of the accumulators;
//   finish(tid_in_wg): each consumer thread, after its last tile.
// The ring's work units. WholeK: one unit per C tile, in grouped order, over the whole K range; nothing happens
// between k-tiles. A schedule gives units(tiles_m, tiles_n, k_tiles), unit(t, ...) -> (tm, tn, [kt0, kt1)) and
// between(acc, kt, kt0): what a consumer does after k-tile kt's batch was issued (the split-K schedules of
// kernels/sm90a/wgmma.cu fold their partial sums there).
template <int GROUP_M> struct WholeK {
  MF_DEVICE int units(int tiles_m, int tiles_n, int) const { return tiles_m * tiles_n; }
  MF_DEVICE void unit(int t, int tiles_m, int tiles_n, int k_tiles, int& tm, int& tn, int& kt0, int& kt1) const {
    grouped_tile_coords<GROUP_M>(t, tiles_m, tiles_n, tm, tn);
    kt0 = 0;
    kt1 = k_tiles;
  }
  template <class Acc> MF_DEVICE void between(Acc&, int, int) const {}
};

// Loads that reach the ring through the LSU (cp.async) beside the TMA boxes. NoLsu: none (the TMA writes every byte).
// A loader with THREADS > 0 gives the stage's bytes the TMA does not write (BYTES, left out of its expectation) and
// operator()(sb, fb, m0, n0, k0, tid): producer thread tid's 16-byte copies of one k-tile, then its
// cp.async.mbarrier.arrive.noinc on fb; the stage's barrier then waits for THREADS such arrivals beside the TMA's.
struct NoLsu {
  static constexpr int THREADS = 0;
  static constexpr u32 BYTES = 0;
  MF_DEVICE void operator()(u32, u32, int, int, int, int) const {}
};

template <class S, int BM, int BN, int NC, int STAGES, int BK, int GROUP_M, class Boxes, class KTile, class Epilogue,
          class Finish>
MF_DEVICE void wgmma_ring(u32 base, const TmaDesc* tmA, const TmaDesc* tmB, int M, int N, int K, const Boxes& boxes,
                          const KTile& k_tile, const Epilogue& epilogue, const Finish& finish);

template <class S, int BM, int BN, int NC, int STAGES, int BK, class Sched, class Boxes, class KTile, class Epilogue,
          class Finish, class Lsu = NoLsu>
MF_DEVICE void wgmma_ring_units(u32 base, const TmaDesc* tmA, const TmaDesc* tmB, int M, int N, int K,
                                const Sched& sched, const Boxes& boxes, const KTile& k_tile, const Epilogue& epilogue,
                                const Finish& finish, const Lsu& lsu = Lsu{}) {
  static_assert(Lsu::THREADS >= 0 && Lsu::THREADS <= 128, "the LSU copies are the producer warpgroup's");
  constexpr int MB = BM / (64 * NC);  // m64 blocks per consumer warpgroup
  static_assert(MB >= 1 && MB * 64 * NC == BM, "BM must be 64 * NC * MB");
  const u32 full_bar = base + S::BAR_OFFSET;    // STAGES barriers: "stage loaded"
  const u32 empty_bar = full_bar + STAGES * 8;  // STAGES barriers: "stage consumed"

  const int wg = threadIdx.x / 128;
  const int tid_in_wg = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    tma_prefetch_desc(tmA);
    tma_prefetch_desc(tmB);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1 + Lsu::THREADS);  // the producer's expect_tx arrival (+ the TMA bytes), and
                                                       // one per LSU copying thread (its copies landed)
      mbar_init(empty_bar + 8 * s, NC * 4);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int tiles_m = (M + BM - 1) / BM;
  const int tiles_n = (N + BN - 1) / BN;
  const int k_tiles = (K + BK - 1) / BK;
  const int num_units = sched.units(tiles_m, tiles_n, k_tiles);

  if (wg == 0) {
    // ---- producer warpgroup: one thread issues the TMA boxes; with an LSU loader, its threads copy the rest ----
    if constexpr (NC >= 2) setmaxnreg_dec<40>();  // 384 threads launch at <= 168 registers: give 128 back
    if (tid_in_wg < (Lsu::THREADS > 0 ? Lsu::THREADS : 1)) {
      int stage = 0;
      u32 phase = 0;
      for (int t = blockIdx.x; t < num_units; t += gridDim.x) {
        int tm, tn, kt0, kt1;
        sched.unit(t, tiles_m, tiles_n, k_tiles, tm, tn, kt0, kt1);
        const int m0 = tm * BM, n0 = tn * BN;
        for (int kt = kt0; kt < kt1; ++kt) {
          const int k0 = kt * BK;
          mbar_wait(empty_bar + 8 * stage, phase ^ 1u);
          const u32 fb = full_bar + 8 * stage;
          const u32 sa = base + stage * S::STAGE_BYTES;
          if (tid_in_wg == 0) {
            mbar_expect_tx(fb, (u32)S::STAGE_BYTES - Lsu::BYTES);  // zero-filled box parts count as transferred
            boxes(sa, sa + S::A_BYTES, fb, m0, n0, k0);
          }
          if constexpr (Lsu::THREADS > 0) lsu(sa + S::A_BYTES, fb, m0, n0, k0, tid_in_wg);
          if (++stage == STAGES) { stage = 0; phase ^= 1u; }
        }
      }
      if constexpr (Lsu::THREADS > 0) asm volatile("cp.async.wait_all;\n" ::: "memory");  // none left in flight
    }
    return;
  }

  // ---- consumer warpgroups: wgmma over the ring, then the epilogue straight from registers ----
  if constexpr (NC >= 2) setmaxnreg_inc<232>();  // BN/2 accumulators per m64 block per thread plus addressing
  const int c = wg - 1;  // consumer index: rows [c*MB*64, (c+1)*MB*64) of the tile
  const int warp = tid_in_wg / 32, lane = tid_in_wg % 32;
  float acc[MB][BN / 2];
  int stage = 0, prev_stage = 0;
  u32 phase = 0;
  for (int t = blockIdx.x; t < num_units; t += gridDim.x) {
    int tm, tn, kt0, kt1;
    sched.unit(t, tiles_m, tiles_n, k_tiles, tm, tn, kt0, kt1);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[mb][i] = 0.f;

    for (int kt = kt0; kt < kt1; ++kt) {
      mbar_wait(full_bar + 8 * stage, phase);
      // The LSU's copies are generic-proxy writes; wgmma reads the stage through the async proxy.
      if constexpr (Lsu::THREADS > 0) fence_proxy_async_smem();
      const u32 sa = base + stage * S::STAGE_BYTES;
      wgmma_fence();
      k_tile(acc, sa, sa + S::A_BYTES, c);
      wgmma_commit();
      // Keep this k-tile's batch in flight; the previous one has finished reading its stage: release it.
      wgmma_wait<1>();
      if (kt > kt0 && lane == 0) mbar_arrive(empty_bar + 8 * prev_stage);
      prev_stage = stage;
      if (++stage == STAGES) { stage = 0; phase ^= 1u; }
      sched.between(acc, kt, kt0);
    }
    wgmma_wait<0>();
    if (kt1 > kt0 && lane == 0) mbar_arrive(empty_bar + 8 * prev_stage);
    epilogue(acc, tm, tn, c, warp, lane, tid_in_wg);
  }
  finish(tid_in_wg);
}

template <class S, int BM, int BN, int NC, int STAGES, int BK, int GROUP_M, class Boxes, class KTile, class Epilogue,
          class Finish>
MF_DEVICE void wgmma_ring(u32 base, const TmaDesc* tmA, const TmaDesc* tmB, int M, int N, int K, const Boxes& boxes,
                          const KTile& k_tile, const Epilogue& epilogue, const Finish& finish) {
  wgmma_ring_units<S, BM, BN, NC, STAGES, BK>(base, tmA, tmB, M, N, K, WholeK<GROUP_M>(), boxes, k_tile, epilogue,
                                              finish);
}

// The epilogue's walk over consumer c's accumulators of tile (tm, tn) of C (M x N, row-major): fragment
// register i of an m64nBN accumulator holds row warp*16 + lane/4 + 8*((i/2)%2) and column (i/4)*8 + (lane%4)*2
// + i%2, so pairs (i, i+1) are adjacent columns. store(p, mb, i, col) writes the pair (acc[mb][i], acc[mb][i+1])
// at p = &C[row, col], for every pair with row < M and col < N (col + 1 may be N: store() decides).
// C arrives as a __restrict__ parameter, so the stores are scheduled knowing C aliases nothing else. The bounds
// test has two spellings (the same pairs): each family keeps the one its signed cubins were compiled from, as
// they compile to different instruction orders. SKIP = 1: a pair outside is skipped; SKIP = 0: stored inside.
template <int SKIP> struct WgPairTest {};
template <int BN, typename T, class Store>
MF_DEVICE void wgmma_row_pairs(WgPairTest<1>, T* __restrict__ C, int mb, int row_base, int n0, int lane, int M, int N,
                               Store& store) {
#pragma unroll
  for (int i = 0; i < BN / 2; i += 2) {
    const int row = row_base + 8 * ((i / 2) % 2), col = n0 + (i / 4) * 8 + (lane % 4) * 2;
    if (row >= M || col >= N) continue;
    store(C + (long long)row * N + col, mb, i, col);
  }
}
template <int BN, typename T, class Store>
MF_DEVICE void wgmma_row_pairs(WgPairTest<0>, T* __restrict__ C, int mb, int row_base,
                               int n0, int lane, int M, int N, Store& store) {
#pragma unroll
  for (int i = 0; i < BN / 2; i += 2) {
    const int row = row_base + 8 * ((i / 2) % 2), col = n0 + (i / 4) * 8 + (lane % 4) * 2;
    if (row < M && col < N) store(C + (long long)row * N + col, mb, i, col);
  }
}
template <int BM, int BN, int MB, int SKIP, typename T, class Store>
MF_DEVICE void wgmma_store_pairs(T* __restrict__ C, int tm, int tn, int c, int warp, int lane, int M, int N,
                                 Store store) {
  const int n0 = tn * BN;
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
    const int row_base = tm * BM + (c * MB + mb) * 64 + warp * 16 + lane / 4;
    wgmma_row_pairs<BN>(WgPairTest<SKIP>(), C, mb, row_base, n0, lane, M, N, store);
  }
}

#endif  // MF_HAS_WGMMA

}  // namespace mf
