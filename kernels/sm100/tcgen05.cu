// Blackwell datacenter (sm_100a) batch-invariant GEMM on the 5th-generation tensor core (tcgen05), build-only here:
// no sm_100 GPU is reachable, so this is compiled and statically admitted, never run by our qualifier.
//
// NN, row-major: C[M,N] = A[M,K] B[K,N], bf16/f16 in, f32 accumulate in tensor memory, C rounded to T.
// One 128x128 tile per CTA (grouped tile order), 128 threads. Thread 0 streams 64-deep k-tiles of A and B with TMA
// (128-byte swizzle, 64x64 boxes, the same tensor maps as the Hopper rung: mamba_forge/tma.py) into a 4-stage
// ring and issues tcgen05.mma (M=128, N=128, K=16) into a 128-column TMEM accumulator; tcgen05.commit releases each
// stage when its MMAs are done. Then every warp reads its 32 TMEM lanes (rows) with tcgen05.ld and stores them.
// Batch invariance by construction: one tile shape, the whole K range in one CTA in ascending order, the same MMA
// sequence for every tile; TMA zero-fills outside the matrices. Needs K % 8 == 0 and N % 8 == 0 (host-checked).
#include "mf/common.cuh"
#include "mf/tma.cuh"

namespace mf {
namespace sm100 {

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 4, BOX = 64;
constexpr u32 BOX_BYTES = BOX * BOX * 2;
constexpr u32 A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr u32 TMEM_COLS = 128;  // f32 accumulator: 128 lanes (rows) x 128 columns

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM100_ALL)
#define MF_HAS_TCGEN05 1

// Shared-memory matrix descriptor (tcgen05 format): start >> 4 (bits 0-13), LBO >> 4 (16-29), SBO >> 4 (32-45),
// fixed 0b001 at bits 46-48, base offset 0, layout bits 61-63: 2 = 128-byte swizzle.
MF_DEVICE u64 umma_desc_sw128(u32 addr, u32 lbo, u32 sbo) {
  u64 d = (u64)((addr & 0x3FFFF) >> 4);
  d |= (u64)((lbo & 0x3FFFF) >> 4) << 16;
  d |= (u64)((sbo & 0x3FFFF) >> 4) << 32;
  d |= 1ull << 46;
  d |= 2ull << 61;
  return d;
}

// Instruction descriptor, kind::f16: D f32 (bits 4-5 = 1), A/B type (7-9, 10-12: f16 0, bf16 1), A K-major (bit 15 =
// 0), B N-major (bit 16 = 1), N >> 3 at bits 17-22, M >> 4 at bits 24-28.
template <typename T> struct UmmaType;
template <> struct UmmaType<__half> { static constexpr u32 code = 0; };
template <> struct UmmaType<__nv_bfloat16> { static constexpr u32 code = 1; };
template <typename T> __host__ __device__ constexpr u32 umma_idesc() {
  constexpr u32 ab = UmmaType<T>::code;
  return (1u << 4) | (ab << 7) | (ab << 10) | (0u << 15) | (1u << 16) | ((u32)(BN >> 3) << 17) | ((u32)(BM >> 4) << 24);
}

MF_DEVICE void umma_f16(u32 d_tmem, u64 a, u64 b, u32 idesc, u32 accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
      "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n" ::"r"(d_tmem),
      "l"(a), "l"(b), "r"(idesc), "r"(accumulate)
      : "memory");
}
// Arrive on `bar` once every tcgen05.mma issued so far by this thread has completed.
MF_DEVICE void umma_commit(u32 bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(bar) : "memory");
}
MF_DEVICE void tmem_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory"); }
MF_DEVICE void tmem_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory"); }

// 32 consecutive f32 columns of this thread's TMEM lane.
MF_DEVICE void tmem_ld32(u32 taddr, u32 (&r)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]),
        "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15]), "=r"(r[16]),
        "=r"(r[17]), "=r"(r[18]), "=r"(r[19]), "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]),
        "=r"(r[25]), "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]), "=r"(r[31])
      : "r"(taddr));
  asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory");
}

template <typename T>
MF_DEVICE void gemm_tcgen05_nn(const TmaDesc* tmA, const TmaDesc* tmB, T* __restrict__ C, int M, int N, int K) {
  extern __shared__ unsigned char umma_smem_raw[];
  const u32 base = (smem_addr(umma_smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  const u32 full_bar = base + STAGES * STAGE_BYTES;
  const u32 empty_bar = full_bar + 8 * STAGES;
  const u32 done_bar = empty_bar + 8 * STAGES;
  const u32 tmem_slot = done_bar + 8;  // tcgen05.alloc writes the TMEM base address here

  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  if ((int)blockIdx.x >= tiles_m * tiles_n) return;
  int tm, tn;
  grouped_tile_coords<8>(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k_tiles = (K + BK - 1) / BK;

  if (warp == 0) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n" ::"r"(tmem_slot), "r"(TMEM_COLS)
                 : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, 1);
    }
    mbar_init(done_bar, 1);
    mbar_init_fence();
  }
  tmem_fence_before();
  __syncthreads();
  tmem_fence_after();
  u32 tmem_base;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(tmem_base) : "r"(tmem_slot) : "memory");

  if (threadIdx.x == 0 && k_tiles > 0) {
    auto load = [&](int stage, int kt) {
      const u32 fb = full_bar + 8 * stage, sa = base + stage * STAGE_BYTES, sb = sa + A_BYTES;
      mbar_expect_tx(fb, STAGE_BYTES);
#pragma unroll
      for (int j = 0; j < BM / BOX; ++j) tma_load_2d(sa + j * BOX_BYTES, tmA, fb, kt * BK, m0 + j * BOX);  // A: M x K
#pragma unroll
      for (int j = 0; j < BN / BOX; ++j) tma_load_2d(sb + j * BOX_BYTES, tmB, fb, n0 + j * BOX, kt * BK);  // B: K x N
    };
    for (int s = 0; s < STAGES && s < k_tiles; ++s) load(s, s);
    constexpr u32 idesc = umma_idesc<T>();
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(full_bar + 8 * s, (kt / STAGES) & 1);
      tmem_fence_after();
      const u32 sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const u64 da = umma_desc_sw128(sa + kk * 32, 16, 1024);            // K-major A: +32 B per k16
        const u64 db = umma_desc_sw128(sb + kk * 2048, BOX_BYTES, 1024);   // N-major B: +16 rows per k16
        umma_f16(tmem_base, da, db, idesc, (kt > 0 || kk > 0) ? 1u : 0u);
      }
      umma_commit(empty_bar + 8 * s);  // stage s is free once these MMAs complete
      // Refill the stage of the previous k-tile (its MMAs were queued earlier) with k-tile kt - 1 + STAGES.
      if (kt >= 1 && kt - 1 + STAGES < k_tiles) {
        const int ps = (kt - 1) % STAGES;
        mbar_wait(empty_bar + 8 * ps, ((kt - 1) / STAGES) & 1);
        load(ps, kt - 1 + STAGES);
      }
    }
    umma_commit(done_bar);  // the accumulator is final once every MMA has completed
  }
  __syncwarp();  // warp 0 reconverges before the warp-wide tcgen05.ld below

  // Epilogue: warp w owns TMEM lanes (= tile rows) 32w..32w+31; each thread stores its row, 32 columns at a time.
  if (k_tiles > 0) mbar_wait(done_bar, 0);
  tmem_fence_after();
  const int row = m0 + warp * 32 + lane;
#pragma unroll 1
  for (int c0 = 0; c0 < BN; c0 += 32) {
    u32 r[32];
    if (k_tiles > 0) {
      tmem_ld32(tmem_base + ((u32)(warp * 32) << 16) + (u32)c0, r);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) r[i] = 0u;  // K == 0: C = 0
    }
    if (row < M) {
#pragma unroll
      for (int g = 0; g < 4; ++g) {  // 8 columns = one 16-byte store; N % 8 == 0 so a group is all in or all out
        const int col = n0 + c0 + g * 8;
        if (col < N) {
          uint4 v;
          v.x = pack2<T>(__uint_as_float(r[g * 8 + 0]), __uint_as_float(r[g * 8 + 1]));
          v.y = pack2<T>(__uint_as_float(r[g * 8 + 2]), __uint_as_float(r[g * 8 + 3]));
          v.z = pack2<T>(__uint_as_float(r[g * 8 + 4]), __uint_as_float(r[g * 8 + 5]));
          v.w = pack2<T>(__uint_as_float(r[g * 8 + 6]), __uint_as_float(r[g * 8 + 7]));
          *reinterpret_cast<uint4*>(C + (i64)row * N + col) = v;
        }
      }
    }
  }
  tmem_fence_before();
  __syncthreads();
  if (warp == 0) {
    tmem_fence_after();
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(tmem_base), "r"(TMEM_COLS) : "memory");
  }
}

#endif  // sm_100a

}  // namespace sm100
}  // namespace mf

// NAME(tmA, tmB, C, A, B, M, N, K): the tensor maps address A (M x K) and B (K x N); the raw pointers stay in the
// ABI for the qualifier. grid = ceil(M/128) * ceil(N/128), 128 threads.
#if defined(MF_HAS_TCGEN05)
#define MF_GEMM_TCGEN05(NAME, T) \
  extern "C" __global__ void __launch_bounds__(128, 1) NAME( \
      const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, T* __restrict__ C, \
      const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K) { \
    (void)A; (void)B; \
    mf::sm100::gemm_tcgen05_nn<T>(&tmA, &tmB, C, M, N, K); \
  }
#else
#define MF_GEMM_TCGEN05(NAME, T) \
  extern "C" __global__ void NAME(const __grid_constant__ mf::TmaDesc tmA, const __grid_constant__ mf::TmaDesc tmB, \
                                  T* C, const T* A, const T* B, int M, int N, int K) { \
    __trap(); /* tcgen05 needs the sm_100a target */ \
  }
#endif
