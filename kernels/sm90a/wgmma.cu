// Hopper batch-invariant GEMM: TMA (128-byte swizzle) into a STAGES-deep shared-memory ring guarded by full/empty
// mbarriers, one producer warpgroup (one elected thread issues the TMA boxes, registers given back with
// setmaxnreg.dec) and NC consumer warpgroups issuing wgmma.mma_async m64nBNk16 with f32 accumulators.
// Persistent grid: CTA b takes tiles b, b + gridDim.x, ... in a grouped order (GROUP_M row tiles share B in L2).
// The ring is mf/wgmma_ring.cuh (shared with the TF32 rungs, wgmma_tf32.cu); the boxes, the k16 steps and the
// epilogues are this file's.
//
// Batch invariance by construction: one tile shape per symbol; every C tile is reduced over the whole K range in
// one CTA, k-tiles in ascending order, four k16 steps per k-tile in ascending order, the same wgmma instruction
// sequence whatever M, N or the CTA that runs it. No split-K, no atomics. TMA zero-fills rows/columns outside the
// matrices, so ragged M, N and K need no different code path (zeros add exactly).
//
// Skinny-M rungs (gemm_bi_nn_sm90a_wgmma_skinny_m{BM}n{BN}_s{STAGES}: decode, M = 1..256): the same template with
// a small tile (BM = 64 or 128, BN = 32, 64 or 128) so that splitting N alone fills the GPU, and a deep ring (8-18
// stages, ~192 KB) so that enough weight bytes are in flight per SM. Why a row of C has exactly the bits of the
// m64n256k16 reference rung (gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4), whatever M and whichever rung serves it:
//  * an output element C[m,n] depends only on row m of A, column n of B and the accumulation sequence; the tile
//    shape decides which CTA / warpgroup / accumulator register holds it, never what is added to it;
//  * the sequence is the same: one f32 accumulator starting at +0, k-tiles of 64 ascending over ceil(K/64) tiles,
//    inside each the four k16 slices ascending, each slice one wgmma.mma_async m64nNk16 .f32.{bf16,f16} step
//    (d = A[m, k16] . B[k16, n] + d), the same K-tail zero fill (TMA, +0 bits) in the same slices; no split-K;
//  * the final rounding is the same cvt.rn to T (pack2) of the f32 accumulator;
//  * what differs is only the instruction's N (32/64/128 vs 256) and the B operand's shared-memory swizzle (64 B
//    for BN = 32). Both select which columns one instruction covers; the assumption (proved on the GPU by
//    tests/gpu/test_gemm_skinny.py and the qualifier's route-equivalence check, not by this argument) is that the
//    tensor core's per-element k16 dot product and accumulate do not depend on the instruction's N.
//
// Layouts (all matrices row-major, 16-bit elements; C = op(A) * op(B), C is M x N with row stride N):
//   NN: A is M x K, B is K x N      (forward: Y = X W)
//   NT: A is M x K, B is N x K      (dX = dY W^T)
//   TN: A is K x M, B is K x N      (dW = X^T dY)
// Every tensor map (mamba_forge/tma.py) describes one row-major matrix with a 64 x 64 box and 128-byte swizzle.
// Alignment the TMA needs (global row strides are multiples of 16 bytes): the contiguous extent of A and B and
// N (C's rows are stored as 4-byte pairs) must be multiples of 8: NN needs K % 8 == 0 and N % 8 == 0; NT needs
// K % 8 and N % 8; TN needs M % 8 and N % 8. The host (mamba_forge/tma.py) refuses anything else.
#include "mf/common.cuh"
#include "mf/layout.cuh"
#include "mf/tma.cuh"
#include "mf/wgmma.cuh"
#include "mf/wgmma_ring.cuh"

namespace mf {

constexpr int WG_BK = 64;         // k elements per stage: one 128-byte swizzle row of 16-bit elements
constexpr int WG_BOX = 64;        // every TMA box is 64 x 64 elements = 8 KB
constexpr int WG_GROUP_M = 8;     // grouped tile order: 8 row tiles walk the N tiles together (L2 reuse)

constexpr int WG_SPLIT_PAD = 8;    // floats of padding per row of a split-K partial tile (rows 8 banks apart)

// C_BYTES: the area after the ring: TMASTORE's C tile staged as 64x64 swizzled 16-bit boxes, or a cluster split-K
// rung's f32 partial tile (BM rows of BN + WG_SPLIT_PAD floats), else none.
template <int BM, int BN, int STAGES, int C_BYTES_>
struct WgSmem {
  static constexpr int A_BYTES = BM * WG_BK * 2;
  static constexpr int B_BYTES = BN * WG_BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int C_OFFSET = STAGES * STAGE_BYTES;
  static constexpr int C_BYTES = C_BYTES_;
  static constexpr int BAR_OFFSET = C_OFFSET + C_BYTES;
  // dynamic smem asked for: ring + C area + 2*STAGES 8-byte barriers + 1024 bytes to align the base to 1024.
  static constexpr int TOTAL = BAR_OFFSET + 2 * STAGES * 8 + 1024;
};

// ---- split-K (the wgmma-k16-split8 class of kernels/routes.toml) ----
// The K range is cut into SPLIT parts of kper = max(1, ceil(k_tiles / SPLIT)) k-tiles of 64 (part s: k-tiles
// [s*kper, min((s+1)*kper, k_tiles)), empty past the end). Each part is reduced like the whole-K rungs (one f32
// accumulator from +0, k-tiles ascending, four k16 steps ascending); then C = rn(((p0 + p1) + p2) ... + p_{SPLIT-1})
// in f32, an empty part adding +0. The cut depends on K and SPLIT only, never on M or on where a part runs, so a
// row's bits are the same at every M and in both rungs of the class:
//  * cluster rungs (CLUSTER = 1, decode): one CTA per (tile, part), the SPLIT CTAs of a tile one thread block
//    cluster (__cluster_dims__). Each stores its partial tile in its shared memory; after a cluster barrier, CTA
//    r sums rows [r*BM/SPLIT, (r+1)*BM/SPLIT) of the tile over parts 0..SPLIT-1 in order, reading its peers'
//    partials through distributed shared memory, and stores them. No workspace, no atomics, one launch;
//  * the in-CTA rung (CLUSTER = 0, prefill): one persistent CTA per tile over the whole K range, which folds each
//    part's accumulators into a running total as the part's last k-tile completes (total = p0, then total += p).

#if defined(MF_HAS_WGMMA)

template <int SPLIT> MF_DEVICE int split_k_part(int k_tiles) {
  const int q = (k_tiles + SPLIT - 1) / SPLIT;
  return q > 0 ? q : 1;
}

template <int GROUP_M, int SPLIT> struct SplitCluster {
  int kper;
  MF_DEVICE int units(int tiles_m, int tiles_n, int) const { return tiles_m * tiles_n * SPLIT; }
  MF_DEVICE void unit(int t, int tiles_m, int tiles_n, int k_tiles, int& tm, int& tn, int& kt0, int& kt1) const {
    grouped_tile_coords<GROUP_M>(t / SPLIT, tiles_m, tiles_n, tm, tn);
    kt0 = min((t % SPLIT) * kper, k_tiles);  // the part: the CTA's rank in its cluster (1-D grid, 1-D clusters)
    kt1 = min(kt0 + kper, k_tiles);
  }
  template <class Acc> MF_DEVICE void between(Acc&, int, int) const {}
};

// The in-CTA rung folds part q (= kt / kper) into the running total when the part's last k-tile completes: the
// pipeline drains there (wgmma_wait<0>), as the part's accumulators are final only then. (Two alternating
// accumulator sets would let the next part run during the fold, but ptxas then serialises every wgmma.)
// The schedule: one unit a tile over the whole K range; a part ends with k-tile kt when kt + 1 is a multiple of
// kper or the last k-tile.
template <int GROUP_M> struct SplitInCta {
  int kper, k_tiles;
  MF_DEVICE int units(int tiles_m, int tiles_n, int) const { return tiles_m * tiles_n; }
  MF_DEVICE void unit(int t, int tiles_m, int tiles_n, int k_tiles_, int& tm, int& tn, int& kt0, int& kt1) const {
    grouped_tile_coords<GROUP_M>(t, tiles_m, tiles_n, tm, tn);
    kt0 = 0;
    kt1 = k_tiles_;
  }
  MF_DEVICE bool part_ends(int kt) const { return (kt + 1) % kper == 0 || kt + 1 == k_tiles; }
};

MF_DEVICE float lds_f32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
MF_DEVICE void sts_f32(u32 addr, float v) { asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory"); }

// The fold (after k-tile kt's batch was issued: at a part's last k-tile, wait for it and fold the part into the
// total), value for value: total = p0, then total = total + p. TS = 0 (the m128n128 and m64n128 rungs): the whole
// total in registers. TS > 0 (the smt rung on a 128 x 256 tile, two consumer warpgroups m64n256k16 each, as the
// whole-K class's fastest rung: 128 accumulators a thread leave no room for another 128): the last TS values of each
// m64 block's fragment in shared memory, each consumer thread's own words (value-major: a warp's 32 accesses hit 32
// banks; no other thread reads them, so no barrier), the rest in registers.
template <int GROUP_M, int MB, int R, int TS = 0, int NT = 0> struct SplitFold : SplitInCta<GROUP_M> {
  static_assert(TS >= 0 && TS < R, "some of the total in registers, TS values a thread in shared memory");
  float (&total)[MB][R - TS];
  u32 tsm;  // the shared-memory total: MB * TS values a consumer thread, NT consumer threads
  // the shared word of value i (>= R - TS) of m64 block mb for this consumer thread
  MF_DEVICE u32 word(int mb, int i) const { return tsm + ((mb * TS + i - (R - TS)) * NT + (threadIdx.x - 128)) * 4; }
  MF_DEVICE void between(float (&acc)[MB][R], int kt, int) const {
    if (!this->part_ends(kt)) return;
    wgmma_wait<0>();
    const bool first = kt < this->kper;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i < R - TS) {
          float& t = total[mb][i < R - TS ? i : 0];
          t = first ? acc[mb][i] : t + acc[mb][i];
        } else {
          const u32 a = word(mb, i);
          sts_f32(a, first ? acc[mb][i] : lds_f32(a) + acc[mb][i]);
        }
        acc[mb][i] = 0.f;
      }
  }
};

MF_DEVICE void cluster_sync_all() {  // every thread of every CTA of the cluster; release / acquire at cluster scope
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
MF_DEVICE float2 ld_peer_f32x2(u32 local_addr, u32 rank) {  // the same shared address in cluster CTA `rank`
  u32 remote;
  float2 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}

// LSU_B (the NN skinny rungs with a 128-byte B box, BN >= 64): the last LSU_B of a k-tile's 64-column B boxes come
// through cp.async, 16 bytes a copy from the producer warpgroup's 128 threads, written where the TMA would write
// them (the 128-byte swizzle: 16-byte chunk c of row r at r * 128 + ((c ^ r % 8) * 16) from the 1024-aligned box)
// with the TMA's zero fill past K and N (a copy of 0 source bytes: N % 8 == 0, so a chunk is wholly in or out).
// Why: an SM's TMA issues about one box row (<= 128 bytes) per 3.4-3.8 ns whatever its width (H200, 2026-12-04:
// scripts/probe_gemm_sm_rate.py), ~36 GB/s of B an SM; at M = 1 a CTA streams nothing but B, so a tile with two
// 64-column boxes a k-tile runs at half the rate it would with the second box on the LSU beside the TMA. The bytes
// in shared memory are the TMA's, so the arithmetic and the bits are those of the TMA-only rung.
template <typename T, int BOX0, int NBOX> struct LsuB {
  static constexpr int THREADS = 128;
  static constexpr u32 BYTES = NBOX * WG_BOX * WG_BOX * 2;
  static constexpr int PIECES = NBOX * WG_BOX * 8;  // 16-byte copies a k-tile: 64 rows x 8 chunks per box
  static_assert(PIECES % THREADS == 0, "whole copies per thread");
  const T* __restrict__ B;
  int N, K;
  MF_DEVICE void operator()(u32 sb, u32 fb, int, int n0, int k0, int tid) const {
#pragma unroll
    for (int i = 0; i < PIECES / THREADS; ++i) {
      const int p = tid + i * THREADS;  // consecutive threads: consecutive 16-byte chunks of a row (coalesced)
      const int box = BOX0 + p / (WG_BOX * 8), r = (p / 8) % WG_BOX, c = p % 8;
      const int gk = k0 + r, gn = n0 + box * WG_BOX + c * 8;
      const bool ok = gk < K && gn < N;
      const u32 dst = sb + box * (WG_BOX * WG_BOX * 2) + r * 128 + ((c ^ (r & 7)) << 4);
      const T* src = ok ? B + (long long)gk * N + gn : B;
      cp_async16_zfill(dst, src, ok);
    }
    cp_async_mbar_arrive_noinc(fb);
  }
};

// The rows of A's box at M < 64 for a SHORT_A rung: M rounded up to 8 (mamba_forge/gpu/tma.py skinny_a_box_rows,
// which builds the map, computes the same); a whole 64-row box from M = 64 on.
MF_DEVICE int short_a_rows(int M) { return M >= WG_BOX ? WG_BOX : (M + 7) / 8 * 8; }

// SPLIT = 1: the whole-K rungs. SPLIT > 1: split-K (above), CLUSTER = 1 in clusters of SPLIT CTAs, else in-CTA.
// SHORT_A (NN, BM = 64: the decode rungs): A's tensor map has a box of short_a_rows(M) rows, so at M < 64 a stage's
// TMA writes that many rows of A instead of 64 rows mostly of zero fill (on the H200 an SM's TMA writes ~50 GB/s
// into shared memory whatever the tile: at M = 1 the zero fill was a third to two thirds of it). The rows past M hold
// whatever shared memory held; wgmma reads them into accumulator rows >= M, which are never stored, and a row's
// result depends on its own row of A only, so the bits of every stored row are those of the 64-row box.
template <typename T, int BM, int BN, int NC, int STAGES, int LAYOUT, int TMASTORE, int SPLIT = 1, int CLUSTER = 0,
          bool SHORT_A = false, int LSU_B = 0, int TS = 0>
MF_DEVICE void gemm_wgmma_ws(const TmaDesc* tmA, const TmaDesc* tmB, const TmaDesc* tmC, T* __restrict__ C, int M,
                             int N, int K, const T* __restrict__ B = nullptr) {
  constexpr int PS = BN + WG_SPLIT_PAD;  // row stride (floats) of a cluster rung's partial tile
  constexpr int MB = BM / (64 * NC);  // m64 blocks per consumer warpgroup
  // TS > 0: an in-CTA split rung keeping TS of each m64 block's BN / 2 running totals a thread in shared memory
  static_assert(TS == 0 || (SPLIT > 1 && !CLUSTER && TS < BN / 2), "a shared-memory total: in-CTA split rungs");
  using S = WgSmem<BM, BN, STAGES, TMASTORE ? BM * BN * 2 : CLUSTER ? BM * PS * 4 : NC * 128 * MB * TS * 4>;
  static_assert(SPLIT >= 1 && SPLIT <= 8, "a split is at most a portable cluster (8 CTAs)");
  static_assert(SPLIT == 1 || (LAYOUT == Layout::NN && !TMASTORE), "split-K rungs are NN, C stored from registers");
  static_assert(!CLUSTER || (SPLIT > 1 && NC == 1 && BM % SPLIT == 0),
                "a cluster rung has one consumer warpgroup (every thread joins the reduction at full registers)");
  static_assert(BN == 32 || BN == 64 || BN == 128 || BN == 256, "wgmma N is 32, 64, 128 or 256 here");
  static_assert(BM % WG_BOX == 0 && (BN % WG_BOX == 0 || BN == 32), "tiles are whole TMA boxes");
  static_assert(BN >= 64 || (LAYOUT == Layout::NN && !TMASTORE), "BN = 32 (64-byte swizzled B box) is NN only");
  static_assert(!SHORT_A || (LAYOUT == Layout::NN && BM == WG_BOX), "a short A box: NN, one m64 row block a tile");
  static_assert(LSU_B == 0 || (LAYOUT == Layout::NN && SPLIT == 1 && BN >= 64 && LSU_B <= BN / 64),
                "B boxes on the LSU: NN whole-K rungs with 64-column B boxes");
  constexpr int TA = LAYOUT == Layout::TN ? 1 : 0;  // A is M-major (transposed) in TN
  constexpr int TB = LAYOUT == Layout::NT ? 0 : 1;  // B is N-major in NN and TN, K-major in NT
  constexpr u32 BOX_BYTES = WG_BOX * WG_BOX * 2;
  // B boxes: 64 x 64 (128-byte swizzle) for BN >= 64; for BN = 32 one 32 (n) x 64 (k) box, 64-byte swizzle.
  constexpr int B_BOX_N = BN < WG_BOX ? BN : WG_BOX;
  constexpr int B_BOXES = BN / B_BOX_N;

  extern __shared__ unsigned char wg_smem_raw[];
  const u32 base = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;  // 128-byte swizzle atoms need 1024 alignment

  // SHORT_A: the A box's bytes the stage's expectation (a whole box) counts but the TMA will not write
  const u32 a_short_bytes = SHORT_A ? (u32)(WG_BOX - short_a_rows(M)) * (WG_BK * 2) : 0u;
  auto boxes = [&](u32 sa, u32 sb, u32 fb, int m0, int n0, int k0) {
    if constexpr (SHORT_A) {
      if (a_short_bytes) mbar_complete_tx(fb, a_short_bytes);
    }
#pragma unroll
    for (int j = 0; j < BM / WG_BOX; ++j) {
      if (LAYOUT == Layout::TN) tma_load_2d(sa + j * BOX_BYTES, tmA, fb, m0 + j * WG_BOX, k0);  // A is K x M
      else tma_load_2d(sa + j * BOX_BYTES, tmA, fb, k0, m0 + j * WG_BOX);                      // A is M x K
    }
#pragma unroll
    for (int j = 0; j < B_BOXES - LSU_B; ++j) {  // the last LSU_B boxes: LsuB
      if (LAYOUT == Layout::NT) tma_load_2d(sb + j * BOX_BYTES, tmB, fb, k0, n0 + j * WG_BOX);  // B is N x K
      else tma_load_2d(sb + j * BOX_BYTES, tmB, fb, n0 + j * B_BOX_N, k0);                     // B is K x N
    }
  };
  auto k_tile = [&](float (&acc)[MB][BN / 2], u32 sa, u32 sb, int c) {
#pragma unroll
    for (int kk = 0; kk < WG_BK / 16; ++kk) {
      // B: NT is K-major (rows of 128 B over n, step 32 B per k16); NN/TN are N-major (64-column chunks 8 KB
      // apart, step 16 rows = 2048 B per k16).
      // BN = 32: one 64-byte-swizzled N-major box, rows of 64 B, step 16 rows = 1024 B per k16.
      const u64 db = BN == 32 ? wgmma_desc_sw64(sb + kk * 1024, 16, 512)
                     : TB     ? wgmma_desc_sw128(sb + kk * 2048, BOX_BYTES, 1024)
                              : wgmma_desc_sw128(sb + kk * 32, 16, 1024);
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        const u32 a_blk = sa + (c * MB + mb) * BOX_BYTES;  // 64 rows of the tile = one 8 KB box in both majors
        const u64 da = TA ? wgmma_desc_sw128(a_blk + kk * 2048, BOX_BYTES, 1024) : wgmma_desc_sw128(a_blk + kk * 32, 16, 1024);
        Wgmma<T, BN, TA, TB>::run(acc[mb], da, db);
      }
    }
  };
  const int k_tiles = (K + WG_BK - 1) / WG_BK;
  const int kper = split_k_part<SPLIT>(k_tiles);
  float total[MB][SPLIT > 1 && !CLUSTER ? BN / 2 - TS : 1];  // the in-CTA split-K rung's running sum over parts
  auto epilogue = [&](float (&acc)[MB][BN / 2], int tm, int tn, int c, int warp, int lane, int tid_in_wg) {
    if constexpr (CLUSTER) {
      // This part's partial tile into this CTA's shared memory (f32 pairs), summed over the cluster below.
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < BN / 2; i += 2) {  // the register -> (row, column) map of mf::wgmma_store_pairs
          const int r = (c * MB + mb) * 64 + warp * 16 + lane / 4 + 8 * ((i / 2) % 2);
          const int col = (i / 4) * 8 + (lane % 4) * 2;
          const u32 addr = base + S::C_OFFSET + (r * PS + col) * 4;
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(acc[mb][i]), "f"(acc[mb][i + 1])
                       : "memory");
        }
    } else if constexpr (SPLIT > 1 && TS > 0) {
      // As below, each value from where SplitFold keeps it.
      const int parts = (k_tiles + kper - 1) / kper;
      const SplitFold<WG_GROUP_M, MB, BN / 2, TS, NC * 128> at{{kper, k_tiles}, total, base + S::C_OFFSET};
      auto final_total = [&](int mb, int i) {
        float v = i < BN / 2 - TS ? total[mb][i < BN / 2 - TS ? i : 0] : lds_f32(at.word(mb, i));
        if (parts == 0) v = 0.f;
        for (int f = max(parts, 1); f < SPLIT; ++f) v = v + 0.f;
        return v;
      };
      wgmma_store_pairs<BM, BN, MB, 0>(C, tm, tn, c, warp, lane, M, N, [&](T* p, int mb, int i, int) {
        *reinterpret_cast<u32*>(p) = pack2<T>(final_total(mb, i), final_total(mb, i + 1));
      });
    } else if constexpr (SPLIT > 1) {
      // The parts after the last non-empty one are empty: each adds +0 (k_tiles = 0: every part is, total = +0).
      const int parts = (k_tiles + kper - 1) / kper;
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          if (parts == 0) total[mb][i] = 0.f;
          for (int f = max(parts, 1); f < SPLIT; ++f) total[mb][i] = total[mb][i] + 0.f;
        }
      wgmma_store_pairs<BM, BN, MB, 0>(C, tm, tn, c, warp, lane, M, N, [&](T* p, int mb, int i, int) {
        *reinterpret_cast<u32*>(p) = pack2<T>(total[mb][i], total[mb][i + 1]);
      });
    } else if constexpr (TMASTORE) {
      // Stage the tile in shared memory as 64x64 boxes in the 128-byte swizzled layout (16-byte chunk index XOR
      // row % 8: a warp's eight rows land in distinct banks), then one thread stores the boxes with TMA, which
      // clips rows >= M and columns >= N. The staging area is reused only after the previous stores read it.
      const int n0 = tn * BN;
      if (tid_in_wg == 0) bulk_wait_read_all();
      named_bar_sync(1 + c, 128);
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
#pragma unroll
        for (int i = 0; i < BN / 2; i += 2) {  // the register -> (row, column) map of mf::wgmma_store_pairs
          const int r = warp * 16 + lane / 4 + 8 * ((i / 2) % 2);  // row within the 64-row block
          const int col = (i / 4) * 8 + (lane % 4) * 2;           // column within the tile
          const int box = (c * MB + mb) * (BN / WG_BOX) + col / WG_BOX;
          const int cc = col % WG_BOX;
          const u32 addr = base + S::C_OFFSET + box * BOX_BYTES + r * 128 + ((((cc * 2) / 16) ^ (r % 8)) * 16) + (cc * 2) % 16;
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(pack2<T>(acc[mb][i], acc[mb][i + 1])) : "memory");
        }
      }
      fence_proxy_async_smem();  // the generic-proxy stores above are read by the TMA (async proxy) next
      named_bar_sync(1 + c, 128);
      if (tid_in_wg == 0) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
          for (int j = 0; j < BN / WG_BOX; ++j)
            tma_store_2d(tmC, base + S::C_OFFSET + ((c * MB + mb) * (BN / WG_BOX) + j) * BOX_BYTES, n0 + j * WG_BOX,
                         tm * BM + (c * MB + mb) * 64);
        bulk_commit();
      }
    } else {
      wgmma_store_pairs<BM, BN, MB, 0>(C, tm, tn, c, warp, lane, M, N, [&](T* p, int mb, int i, int) {
        // N % 8 == 0 (host-checked), so col < N implies col + 1 < N: one 4-byte word
        *reinterpret_cast<u32*>(p) = pack2<T>(acc[mb][i], acc[mb][i + 1]);
      });
    }
  };
  auto finish = [&](int tid_in_wg) {
    if constexpr (TMASTORE) {
      if (tid_in_wg == 0) bulk_wait_all();  // the last tile's stores finish before the CTA (and its smem) retires
    }
  };
  if constexpr (SPLIT == 1 && LSU_B > 0) {
    wgmma_ring_units<S, BM, BN, NC, STAGES, WG_BK>(base, tmA, tmB, M, N, K, WholeK<WG_GROUP_M>(), boxes, k_tile,
                                                   epilogue, finish, LsuB<T, B_BOXES - LSU_B, LSU_B>{B, N, K});
  } else if constexpr (SPLIT == 1) {
    wgmma_ring<S, BM, BN, NC, STAGES, WG_BK, WG_GROUP_M>(base, tmA, tmB, M, N, K, boxes, k_tile, epilogue, finish);
  } else if constexpr (!CLUSTER) {
    const SplitFold<WG_GROUP_M, MB, BN / 2, TS, NC * 128> sched{{kper, k_tiles}, total, base + S::C_OFFSET};
    wgmma_ring_units<S, BM, BN, NC, STAGES, WG_BK>(base, tmA, tmB, M, N, K, sched, boxes, k_tile, epilogue, finish);
  } else {
    wgmma_ring_units<S, BM, BN, NC, STAGES, WG_BK>(base, tmA, tmB, M, N, K, SplitCluster<WG_GROUP_M, SPLIT>{kper},
                                                   boxes, k_tile, epilogue, finish);
    // Every thread of the cluster (the producer warpgroup too): the partials are in place; then CTA `rank` sums
    // its rows of the tile over the parts in order 0..SPLIT-1 and stores them; then nobody leaves while a peer
    // may still read its shared memory.
    cluster_sync_all();
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int tile = blockIdx.x / SPLIT, rank = blockIdx.x % SPLIT;
    if (tile < tiles_m * tiles_n) {
      int tm, tn;
      grouped_tile_coords<WG_GROUP_M>(tile, tiles_m, tiles_n, tm, tn);
      constexpr int RB = BM / SPLIT;  // rows this CTA sums
      for (int p = threadIdx.x; p < RB * BN / 2; p += blockDim.x) {
        const int r = rank * RB + p / (BN / 2), col = (p % (BN / 2)) * 2;
        const int row = tm * BM + r, gcol = tn * BN + col;
        if (row >= M || gcol >= N) continue;  // N % 8 == 0: gcol < N implies gcol + 1 < N
        const u32 addr = base + S::C_OFFSET + (r * PS + col) * 4;
        float2 sum = ld_peer_f32x2(addr, 0);
#pragma unroll
        for (int s = 1; s < SPLIT; ++s) {
          const float2 v = ld_peer_f32x2(addr, s);
          sum.x = sum.x + v.x;
          sum.y = sum.y + v.y;
        }
        *reinterpret_cast<u32*>(C + (long long)row * N + gcol) = pack2<T>(sum.x, sum.y);
      }
    }
    cluster_sync_all();
  }
}

// ---- the 80-column skinny rung (decode): a 64-column B box on the TMA, 16 columns on the LSU ----
// in_proj at d_model 2560 (N 10240) is 128 tiles of 80 columns, one per SM, where 64- or 128-column tiles leave
// 28 SMs with twice the bytes of the rest (an SM streams ~36 GB/s of B however it loads: the TMA, the LSU or both).
// Shared memory per stage: A's box, then B as two 64-column 128-byte-swizzled boxes of which the TMA writes the first
// and the LSU the first 16 columns of the second (chunks 0 and 1 of each 128-byte row, at the swizzled positions);
// one wgmma m64n80k16 per k16 step reads columns 0..79 across the two (the n128 rungs' descriptor, N = 80). The rest
// of the second box is never written nor read. Per-element arithmetic as every rung of the class.
template <typename T> struct LsuTail16 {
  static constexpr int THREADS = 128;                  // one 16-byte copy each: 64 rows x 2 chunks
  static constexpr u32 BYTES = WG_BOX * WG_BOX * 2;    // the second box: left out of the TMA's expectation
  const T* __restrict__ B;
  int N, K;
  MF_DEVICE void operator()(u32 sb, u32 fb, int, int n0, int k0, int tid) const {
    const int r = tid / 2, c = tid % 2;
    const int gk = k0 + r, gn = n0 + WG_BOX + c * 8;
    const bool ok = gk < K && gn < N;
    const u32 dst = sb + WG_BOX * WG_BOX * 2 + r * 128 + ((c ^ (r & 7)) << 4);
    const T* src = ok ? B + (long long)gk * N + gn : B;
    cp_async16_zfill(dst, src, ok);
    cp_async_mbar_arrive_noinc(fb);
  }
};

template <typename T, int STAGES>
MF_DEVICE void gemm_wgmma_skinny80(const TmaDesc* tmA, const TmaDesc* tmB, T* __restrict__ C, int M, int N, int K,
                                   const T* __restrict__ B) {
  constexpr int BM = 64, BN = 80;
  using S = WgSmem<BM, 2 * WG_BOX, STAGES, 0>;
  constexpr u32 BOX_BYTES = WG_BOX * WG_BOX * 2;
  extern __shared__ unsigned char wg_smem_raw[];
  const u32 base = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;
  const u32 a_short_bytes = (u32)(WG_BOX - short_a_rows(M)) * (WG_BK * 2);  // SHORT_A, as gemm_wgmma_ws
  auto boxes = [&](u32 sa, u32 sb, u32 fb, int m0, int n0, int k0) {
    if (a_short_bytes) mbar_complete_tx(fb, a_short_bytes);
    tma_load_2d(sa, tmA, fb, k0, m0);
    tma_load_2d(sb, tmB, fb, n0, k0);
  };
  auto k_tile = [&](float (&acc)[1][BN / 2], u32 sa, u32 sb, int) {
#pragma unroll
    for (int kk = 0; kk < WG_BK / 16; ++kk)
      Wgmma<T, BN, 0, 1>::run(acc[0], wgmma_desc_sw128(sa + kk * 32, 16, 1024),
                              wgmma_desc_sw128(sb + kk * 2048, BOX_BYTES, 1024));
  };
  auto epilogue = [&](float (&acc)[1][BN / 2], int tm, int tn, int c, int warp, int lane, int) {
    wgmma_store_pairs<BM, BN, 1, 0>(C, tm, tn, c, warp, lane, M, N, [&](T* p, int mb, int i, int) {
      *reinterpret_cast<u32*>(p) = pack2<T>(acc[mb][i], acc[mb][i + 1]);
    });
  };
  auto finish = [](int) {};
  wgmma_ring_units<S, BM, BN, 1, STAGES, WG_BK>(base, tmA, tmB, M, N, K, WholeK<WG_GROUP_M>(), boxes, k_tile,
                                                epilogue, finish, LsuTail16<T>{B, N, K});
}

// ---- the pair rung of the split class (prefill) ----
// Two consumer warpgroups take a tile's parts in turn: consumer c runs parts c, c + 2, ..., each over its own ring
// of RS stages fed by producer warp c, so one consumer's drain at the end of a part (its accumulators are final only
// after wgmma_wait<0>) overlaps the other's part, where the in-CTA rung's tensor cores idle at every part. Each
// consumer holds the whole BM x BN tile (MB = BM / 64 blocks of m64). The running total lives in shared memory F in
// each thread's fragment order (thread t of either consumer holds the same (row, column)s). Part 0 stores p0 there;
// part p loads it and adds, acc = F + acc = rn(total + p_p), bit for bit the in-CTA rung's fold, then stores it or,
// at the last non-empty part, adds +0 for each empty part after it and stores C.
// Hand-offs: mbarrier hand[c] (count 128) is consumer c's: each of its 128 threads arrives (release) after its F
// stores (or, for "F is free", its F loads), and every thread of the other consumer waits on it (acquire, by
// parity) before touching F. With bar.arrive / bar.sync (and before that a release/acquire counter) in its place,
// compute-sanitizer's racecheck reported the first F load after the hand-off as a race; with the mbarriers it
// reports nothing (H200, full qualification). Part p - 1 gives to part p; when a tile's last part is consumer 1's, it also gives
// "F is free" to the next tile's part 0. Each give is taken before the same barrier is given again (the giver
// first takes the hand-off that follows the taker's), so a barrier never completes two phases ahead of its wait.
template <typename T, int BM, int BN, int RS, int SPLIT>
MF_DEVICE void gemm_wgmma_split_pair(const TmaDesc* tmA, const TmaDesc* tmB, T* __restrict__ C, int M, int N, int K) {
  constexpr int MB = BM / 64, R = BN / 2;
  constexpr u32 BOX_BYTES = WG_BOX * WG_BOX * 2;
  constexpr int A_BYTES = BM * WG_BK * 2, B_BYTES = BN * WG_BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
  constexpr int F_OFFSET = 2 * RS * STAGE_BYTES;     // two rings, then F (BM * BN floats), then barriers
  constexpr int BAR_OFFSET = F_OFFSET + BM * BN * 4;  // ring c: full[RS], empty[RS] at + 16 * RS * c; hand[2] after
  static_assert(SPLIT >= 2 && SPLIT <= 8, "a split of 2..8 parts");
  static_assert(BM % 64 == 0 && (BN == 64 || BN == 128 || BN == 256), "m64 blocks, one 128-byte-swizzled B box per 64 columns");
  static_assert((MB * R) % 4 == 0, "F moves float4s");

  extern __shared__ unsigned char wg_smem_raw[];
  const u32 base = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    tma_prefetch_desc(tmA);
    tma_prefetch_desc(tmB);
    for (int s = 0; s < 2 * RS; ++s) {
      const u32 ring = base + BAR_OFFSET + 16 * RS * (s / RS);
      mbar_init(ring + 8 * (s % RS), 1);        // full: the producer's expect_tx arrival (+ the TMA bytes)
      mbar_init(ring + 8 * (RS + s % RS), 4);   // empty: one arrival per warp of the ring's consumer
    }
    for (int c = 0; c < 2; ++c) mbar_init(base + BAR_OFFSET + 32 * RS + 8 * c, 128);  // hand[c]: consumer c's threads
    mbar_init_fence();
  }
  __syncthreads();

  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, units = tiles_m * tiles_n;
  const int k_tiles = (K + WG_BK - 1) / WG_BK;
  const int kper = split_k_part<SPLIT>(k_tiles);
  const int parts = (k_tiles + kper - 1) / kper;  // the non-empty parts (0 when K == 0)

  if (wg == 0) {
    // ---- producer warps 0 and 1: ring c gets the k-tiles of parts c, c + 2, ... of every tile, in order ----
    setmaxnreg_dec<40>();
    const int c = tid / 32;
    if (c < 2 && tid % 32 == 0) {
      const u32 full = base + BAR_OFFSET + 16 * RS * c, empty = full + 8 * RS;
      int stage = 0;
      u32 phase = 0;
      for (int t = blockIdx.x; t < units; t += gridDim.x) {
        int tm, tn;
        grouped_tile_coords<WG_GROUP_M>(t, tiles_m, tiles_n, tm, tn);
        for (int p = c; p < parts; p += 2) {
          for (int kt = p * kper; kt < min((p + 1) * kper, k_tiles); ++kt) {
            mbar_wait(empty + 8 * stage, phase ^ 1u);
            const u32 fb = full + 8 * stage;
            mbar_expect_tx(fb, (u32)STAGE_BYTES);
            const u32 sa = base + (c * RS + stage) * STAGE_BYTES, sb = sa + A_BYTES;
#pragma unroll
            for (int j = 0; j < MB; ++j) tma_load_2d(sa + j * BOX_BYTES, tmA, fb, kt * WG_BK, tm * BM + j * WG_BOX);
#pragma unroll
            for (int j = 0; j < BN / WG_BOX; ++j) tma_load_2d(sb + j * BOX_BYTES, tmB, fb, tn * BN + j * WG_BOX, kt * WG_BK);
            if (++stage == RS) { stage = 0; phase ^= 1u; }
          }
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<232>();
  const int c = wg - 1, warp = tid / 32, lane = tid % 32;
  const u32 full = base + BAR_OFFSET + 16 * RS * c, empty = full + 8 * RS;
  const u32 fslot = base + F_OFFSET + tid * 16;  // this thread's float4 j of F at fslot + j * 128 * 16
  const u32 hand = base + BAR_OFFSET + 32 * RS;
  u32 take_phase = 0;  // the parity of the next phase of hand[1 - c] this consumer waits for
  auto give = [&]() { mbar_arrive(hand + 8 * c); };
  auto take = [&]() {
    mbar_wait(hand + 8 * (1 - c), take_phase);
    take_phase ^= 1u;
  };
  float acc[MB][R];
  int stage = 0, prev = 0;
  u32 phase = 0;
  for (int t = blockIdx.x; t < units; t += gridDim.x) {
    int tm, tn;
    grouped_tile_coords<WG_GROUP_M>(t, tiles_m, tiles_n, tm, tn);
    for (int p = c; p < max(parts, 1); p += 2) {  // consumer 0 takes a K == 0 tile (C = +0)
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < R; ++i) acc[mb][i] = 0.f;
      const int kt0 = p * kper, kt1 = min(kt0 + kper, k_tiles);
      for (int kt = kt0; kt < kt1; ++kt) {
        mbar_wait(full + 8 * stage, phase);
        const u32 sa = base + (c * RS + stage) * STAGE_BYTES, sb = sa + A_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk) {
          const u64 db = wgmma_desc_sw128(sb + kk * 2048, BOX_BYTES, 1024);
#pragma unroll
          for (int mb = 0; mb < MB; ++mb)
            Wgmma<T, BN, 0, 1>::run(acc[mb], wgmma_desc_sw128(sa + mb * BOX_BYTES + kk * 32, 16, 1024), db);
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > kt0 && lane == 0) mbar_arrive(empty + 8 * prev);
        prev = stage;
        if (++stage == RS) { stage = 0; phase ^= 1u; }
      }
      wgmma_wait<0>();
      if (kt1 > kt0 && lane == 0) mbar_arrive(empty + 8 * prev);
      bool last = parts <= 1;
      if (!last) {
        if (p == 0) {
          if (t != (int)blockIdx.x && parts % 2 == 0) take();  // the previous tile's last part (consumer 1) read F
        } else {
          take();  // F holds total_{p-1}
#pragma unroll
          for (int j = 0; j < MB * R / 4; ++j) {
            float4 f;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(f.x), "=f"(f.y), "=f"(f.z), "=f"(f.w) : "r"(fslot + j * 128 * 16) : "memory");
            const int mb = (4 * j) / R, i = (4 * j) % R;
            acc[mb][i] = f.x + acc[mb][i];
            acc[mb][i + 1] = f.y + acc[mb][i + 1];
            acc[mb][i + 2] = f.z + acc[mb][i + 2];
            acc[mb][i + 3] = f.w + acc[mb][i + 3];
          }
          last = p == parts - 1;
        }
        if (!last) {
#pragma unroll
          for (int j = 0; j < MB * R / 4; ++j) {
            const int mb = (4 * j) / R, i = (4 * j) % R;
            asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(fslot + j * 128 * 16), "f"(acc[mb][i]),
                         "f"(acc[mb][i + 1]), "f"(acc[mb][i + 2]), "f"(acc[mb][i + 3]) : "memory");
          }
        }
        if (!last) give();  // F holds total_p
        else if (c == 1 && t + (int)gridDim.x < units) give();  // F is free for the next tile's part 0
      }
      if (last) {
        for (int f = max(parts, 1); f < SPLIT; ++f)  // each empty part adds +0
#pragma unroll
          for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int i = 0; i < R; ++i) acc[mb][i] = acc[mb][i] + 0.f;
        wgmma_store_pairs<BM, BN, MB, 0>(C, tm, tn, 0, warp, lane, M, N, [&](T* ptr, int mb, int i, int) {
          *reinterpret_cast<u32*>(ptr) = pack2<T>(acc[mb][i], acc[mb][i + 1]);
        });
      }
    }
  }
}

#endif  // MF_HAS_WGMMA

}  // namespace mf

// One symbol per (layout, tile, dtype). Threads: 128 per consumer warpgroup + one producer warpgroup; one CTA per
// SM (setmaxnreg requires __launch_bounds__(threads, 1)). TMASTORE = 1 symbols take a third tensor map, for C.
// The _PDL forms (the decode rungs, behind the kernel before them on the stream): mf::pdl_enter<PDL_BLOCKS> first,
// so every thread waits for that grid before the first TMA load or C store (the catalog's pdl_max_blocks).
// SHORT_A = 1 (the NN decode rungs of one m64 row block): A's box is short_a_rows(M) rows (the tensor map's, built by
// mamba_forge/gpu/tma.py prepare_gemm_nn_skinny from the instance's SHORT_A).
#define MF_GEMM_WGMMA_PDL(NAME, T, LAYOUT, BM, BN, NC, STAGES, PDL_BLOCKS, SHORT_A) \
  extern "C" __global__ void __launch_bounds__(128 * ((NC) + 1), 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, T* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; /* the tensor maps address A and B; the pointers are in the ABI for the qualifier */ \
    mf::pdl_enter<PDL_BLOCKS>(); \
    mf::gemm_wgmma_ws<T, BM, BN, NC, STAGES, LAYOUT, 0, 1, 0, (SHORT_A) != 0>(&tmA, &tmB, nullptr, C, M, N, K); \
  }
#define MF_GEMM_WGMMA(NAME, T, LAYOUT, BM, BN, NC, STAGES) MF_GEMM_WGMMA_PDL(NAME, T, LAYOUT, BM, BN, NC, STAGES, 0, 0)
// The skinny rungs with LSU_B of each k-tile's B boxes copied by the producer warpgroup's LSU (LsuB): B is read
// through its pointer too, so B must be the dense K x N matrix the tensor map describes.
#define MF_GEMM_WGMMA_LSU(NAME, T, LAYOUT, BM, BN, NC, STAGES, PDL_BLOCKS, SHORT_A, LSU_B) \
  extern "C" __global__ void __launch_bounds__(128 * ((NC) + 1), 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, T* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    (void)A; /* the tensor map addresses A; the pointer is in the ABI for the qualifier */ \
    mf::pdl_enter<PDL_BLOCKS>(); \
    mf::gemm_wgmma_ws<T, BM, BN, NC, STAGES, LAYOUT, 0, 1, 0, (SHORT_A) != 0, LSU_B>(&tmA, &tmB, nullptr, C, M, N, K, \
                                                                                   B); \
  }
// Split-K rungs (NN): SPLIT parts; CLUSTER = 1 launches clusters of SPLIT CTAs along x (compile-time cluster
// dimensions: an ordinary launch whose grid is a multiple of SPLIT).
#define MF_GEMM_WGMMA_SPLITK_PDL(NAME, T, LAYOUT, BM, BN, NC, STAGES, SPLIT, CLUSTER, PDL_BLOCKS, SHORT_A) \
  extern "C" __global__ void __launch_bounds__(128 * ((NC) + 1), 1) MF_WG_CLUSTER_##CLUSTER(SPLIT) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, T* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; /* the tensor maps address A and B; the pointers are in the ABI for the qualifier */ \
    mf::pdl_enter<PDL_BLOCKS>(); \
    mf::gemm_wgmma_ws<T, BM, BN, NC, STAGES, LAYOUT, 0, SPLIT, CLUSTER, (SHORT_A) != 0>(&tmA, &tmB, nullptr, C, M, N, \
                                                                                       K); \
  }
#define MF_GEMM_WGMMA_SPLITK(NAME, T, LAYOUT, BM, BN, NC, STAGES, SPLIT, CLUSTER) \
  MF_GEMM_WGMMA_SPLITK_PDL(NAME, T, LAYOUT, BM, BN, NC, STAGES, SPLIT, CLUSTER, 0, 0)
// The in-CTA split rungs with TS of each thread's running totals in shared memory (SplitFold): 2 consumers.
#define MF_GEMM_WGMMA_SPLITK_SMT(NAME, T, LAYOUT, BM, BN, STAGES, SPLIT, TS) \
  extern "C" __global__ void __launch_bounds__(384, 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, T* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; /* the tensor maps address A and B; the pointers are in the ABI for the qualifier */ \
    mf::gemm_wgmma_ws<T, BM, BN, 2, STAGES, LAYOUT, 0, SPLIT, 0, false, 0, TS>(&tmA, &tmB, nullptr, C, M, N, K); \
  }
// The pair rungs of the split class: 2 consumer warpgroups taking the parts in turn, two rings of RS stages.
#define MF_GEMM_WGMMA_SPLITK_PAIR(NAME, T, LAYOUT, BM, BN, RS, SPLIT) \
  extern "C" __global__ void __launch_bounds__(384, 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, T* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    static_assert(LAYOUT == mf::Layout::NN, "the pair rungs are NN"); \
    (void)A; (void)B; /* the tensor maps address A and B; the pointers are in the ABI for the qualifier */ \
    mf::gemm_wgmma_split_pair<T, BM, BN, RS, SPLIT>(&tmA, &tmB, C, M, N, K); \
  }
// The 80-column skinny rung (gemm_wgmma_skinny80): NN, BM 64, one consumer warpgroup, SHORT_A; B read through its
// pointer as well as its tensor map.
#define MF_GEMM_WGMMA_SKINNY80(NAME, T, LAYOUT, STAGES, PDL_BLOCKS) \
  extern "C" __global__ void __launch_bounds__(256, 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, T* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    static_assert(LAYOUT == mf::Layout::NN, "the 80-column rung is NN"); \
    (void)A; /* the tensor map addresses A; the pointer is in the ABI for the qualifier */ \
    mf::pdl_enter<PDL_BLOCKS>(); \
    mf::gemm_wgmma_skinny80<T, STAGES>(&tmA, &tmB, C, M, N, K, B); \
  }
#define MF_WG_CLUSTER_0(SPLIT)
#define MF_WG_CLUSTER_1(SPLIT) __cluster_dims__(SPLIT, 1, 1)
#define MF_GEMM_WGMMA_TMASTORE(NAME, T, LAYOUT, BM, BN, NC, STAGES) \
  extern "C" __global__ void __launch_bounds__(128 * ((NC) + 1), 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, \
      const __grid_constant__ mf::TmaDesc tmC, T* __restrict__ C, const T* __restrict__ A, const T* __restrict__ B, \
      int M, int N, int K) { \
    (void)A; (void)B; (void)C; /* written and read through the tensor maps; pointers kept for the qualifier */ \
    mf::gemm_wgmma_ws<T, BM, BN, NC, STAGES, LAYOUT, 1>(&tmA, &tmB, &tmC, C, M, N, K); \
  }
