// wgmma.mma_async m64nNk8 with TF32 operands (f32 storage), f32 accumulators: the wrappers of the TF32 wgmma GEMM
// (kernels/sm90a/wgmma_tf32.cu). Kept apart from mf/wgmma.cuh (the 16-bit k16 wrappers) because the TF32 form
// differs in kind: K is 8 per instruction, and there are no transpose immediates -- PTX allows only K-major A and
// B in shared memory for .tf32, so both operands are read K-major (rows of 32 f32 = one 128-byte swizzle row).
//
// Rounding contract: the instruction reads the f32 bit patterns from shared memory and uses their TF32 part (sign,
// exponent, top 10 mantissa bits); the low 13 mantissa bits are ignored, i.e. inputs are TRUNCATED to TF32 (toward
// zero), not rounded with cvt.rna as the mma.sync rungs of mf/tile_tf32.cuh do. Rounding in shared memory would
// cost a read-modify-write pass over every stage; truncation is the documented contract of these rungs instead
// (tests/gpu/test_gemm_tf32_wgmma.py pins it on the device with inputs whose truncation and rounding differ).
//
// scale-d is the predicate true (d += A B), as in mf/wgmma.cuh: accumulators are zeroed by the caller, so every
// output starts at +0.
// The "memory" clobber keeps the compiler from moving shared-memory accesses across the asynchronous instruction.
#pragma once
#include "mf/common.cuh"
#include "mf/wgmma.cuh"

namespace mf {

#if defined(MF_HAS_WGMMA)

// d += A(64x8) * B(8xN), both K-major. N-dispatch: one call site for every tile width, WgmmaTf32<N>::run.
template <int N> struct WgmmaTf32;
#define MF_WGMMA_TF32(N, R, DA, DB, SC) \
  template <> struct WgmmaTf32<N> { \
    static MF_DEVICE void run(float (&d)[R], u64 da, u64 db) { \
      asm volatile(MF_WGMMA_TEXT("m64n" #N "k8.f32.tf32.tf32", R, DA, DB, SC, "") \
                   : MF_WG_ACC##R(0) : "l"(da), "l"(db), "r"(1) : "memory"); \
    } \
  };
MF_WGMMA_TF32(64, 32, 32, 33, 34)
MF_WGMMA_TF32(128, 64, 64, 65, 66)
MF_WGMMA_TF32(256, 128, 128, 129, 130)
#undef MF_WGMMA_TF32

#endif  // MF_HAS_WGMMA

}  // namespace mf
