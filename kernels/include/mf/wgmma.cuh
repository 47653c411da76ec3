// Hopper warpgroup MMA (wgmma.mma_async) helpers: shared-memory matrix descriptors and the m64nNk16 bf16/f16
// instructions with f32 accumulators. Arch-specific: only the sm_90a target assembles them.
//
// Shared-memory layouts used with 128-byte swizzle (what a TMA box of 64 16-bit elements x R rows writes):
// rows of 128 bytes, row r at byte r*128, 8-row (1024-byte) swizzle atoms, atom bases 1024-byte aligned.
//  * K-major operand (K contiguous): R rows = M (or N) indices. SBO = 1024 (next 8 rows); LBO unused (1).
//    The k-th 16-element slice starts 32*k bytes into the row.
//  * MN-major operand (M or N contiguous): chunks of 64 MN-indices x BK k-rows, chunk j at j*LBO;
//    SBO = 1024 (next 8 k-rows), LBO = chunk stride. The k-th 16-row slice starts 16*128*k bytes in.
#pragma once
#include "mf/common.cuh"

namespace mf {

// Matrix descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4 (16-29), stride byte offset >> 4
// (32-45), base offset 0 (atoms are aligned to their size), layout type bits 62-63 (SWIZZLE: 1 = 128-byte,
// 2 = 64-byte).
template <int SWIZZLE> MF_DEVICE u64 wgmma_desc(u32 smem_byte_addr, u32 lbo_bytes, u32 sbo_bytes) {
  u64 d = 0;
  d |= (u64)((smem_byte_addr & 0x3FFFF) >> 4);
  d |= (u64)((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= (u64)((sbo_bytes & 0x3FFFF) >> 4) << 32;
  d |= (u64)SWIZZLE << 62;
  return d;
}

// 128-byte swizzle (the layouts above; atom bases 1024-byte aligned).
MF_DEVICE u64 wgmma_desc_sw128(u32 smem_byte_addr, u32 lbo_bytes, u32 sbo_bytes) {
  return wgmma_desc<1>(smem_byte_addr, lbo_bytes, sbo_bytes);
}

// 64-byte swizzle: what a TMA box of 32 16-bit elements x R rows with CU_TENSOR_MAP_SWIZZLE_64B writes: rows of
// 64 bytes, 8-row (512-byte) swizzle atoms, atom bases 512-byte aligned. Used for an MN-major operand only 32 wide
// (one atom across MN: LBO unused): SBO = 512 (next 8 k-rows), and the k-th 16-row slice starts 16*64*k bytes in.
MF_DEVICE u64 wgmma_desc_sw64(u32 smem_byte_addr, u32 lbo_bytes, u32 sbo_bytes) {
  return wgmma_desc<2>(smem_byte_addr, lbo_bytes, sbo_bytes);
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MF_HAS_WGMMA 1

MF_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MF_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> MF_DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Warp-specialised register budgets (needs __launch_bounds__(threads, 1)).
template <int R> MF_DEVICE void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> MF_DEVICE void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }

// Operand lists of the wgmma wrappers: R f32 accumulators d[0..R-1] are the asm's outputs %0 .. %R-1 (PTX names
// every one). MF_WG_REGS<R> is their text, MF_WG_ACC<R>(0) their constraints.
#define MF_WG_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define MF_WG_REGS32 MF_WG_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MF_WG_REGS40 MF_WG_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define MF_WG_REGS64 MF_WG_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MF_WG_REGS128 MF_WG_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MF_WG_ACC4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MF_WG_ACC16(i) MF_WG_ACC4(i), MF_WG_ACC4(i + 4), MF_WG_ACC4(i + 8), MF_WG_ACC4(i + 12)
#define MF_WG_ACC32(i) MF_WG_ACC16(i), MF_WG_ACC16(i + 16)
#define MF_WG_ACC40(i) MF_WG_ACC32(i), MF_WG_ACC4(i + 32), MF_WG_ACC4(i + 36)
#define MF_WG_ACC64(i) MF_WG_ACC32(i), MF_WG_ACC32(i + 32)
#define MF_WG_ACC128(i) MF_WG_ACC64(i), MF_WG_ACC64(i + 64)

// The text of one wgmma.mma_async (SHAPE: e.g. m64n64k16.f32.bf16.bf16) on the R accumulators, descriptors %DA and
// %DB (= %R, %R+1), scale-d predicate from %SC (= %R+2, an "r"(1): d += A B); TAIL: the operands after the scale
// immediates (the 16-bit forms' transpose immediates, none for TF32).
#define MF_WGMMA_TEXT(SHAPE, R, DA, DB, SC, TAIL) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #SC ", 0;\n" \
  "wgmma.mma_async.sync.aligned." SHAPE " {" MF_WG_REGS##R "}, %" #DA ", %" #DB ", p, 1, 1" TAIL ";\n}\n"

// d += A(64x16) * B(16xN) with T = bf16 or f16 (DT: its PTX name); TA/TB: 1 = operand is MN-major (transposed),
// 0 = K-major (immediates %ITA, %ITB). One call site for every dtype and width: Wgmma<T, N, TA, TB>::run.
template <typename T, int N, int TA, int TB> struct Wgmma;
#define MF_WGMMA_K16(T, DT, N, R, DA, DB, SC, ITA, ITB) \
  template <int TA, int TB> struct Wgmma<T, N, TA, TB> { \
    static MF_DEVICE void run(float (&d)[R], u64 da, u64 db) { \
      asm volatile(MF_WGMMA_TEXT("m64n" #N "k16.f32." DT "." DT, R, DA, DB, SC, ", %" #ITA ", %" #ITB) \
                   : MF_WG_ACC##R(0) : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB)); \
    } \
  };
MF_WGMMA_K16(__nv_bfloat16, "bf16", 32, 16, 16, 17, 18, 19, 20)
MF_WGMMA_K16(__half, "f16", 32, 16, 16, 17, 18, 19, 20)
MF_WGMMA_K16(__nv_bfloat16, "bf16", 64, 32, 32, 33, 34, 35, 36)
MF_WGMMA_K16(__half, "f16", 64, 32, 32, 33, 34, 35, 36)
MF_WGMMA_K16(__nv_bfloat16, "bf16", 80, 40, 40, 41, 42, 43, 44)
MF_WGMMA_K16(__half, "f16", 80, 40, 40, 41, 42, 43, 44)
MF_WGMMA_K16(__nv_bfloat16, "bf16", 128, 64, 64, 65, 66, 67, 68)
MF_WGMMA_K16(__nv_bfloat16, "bf16", 256, 128, 128, 129, 130, 131, 132)
MF_WGMMA_K16(__half, "f16", 128, 64, 64, 65, 66, 67, 68)
MF_WGMMA_K16(__half, "f16", 256, 128, 128, 129, 130, 131, 132)
#undef MF_WGMMA_K16
#endif

}  // namespace mf
